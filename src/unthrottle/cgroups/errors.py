"""Errors from cgroup files that say which file and why, in words a person can act on."""

from __future__ import annotations

import errno
from pathlib import Path


class CgroupError(RuntimeError):
    """A cgroup operation failed; the message names the file and the reason."""

    def __init__(self, path: Path | str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = Path(path)
        self.reason = reason


_BURST_FILES = {"cpu.max.burst", "cpu.cfs_burst_us"}


def explain(path: Path, err: OSError, *, writing: str | None = None) -> CgroupError:
    """Turn an OSError on a cgroup file into a CgroupError with the reason spelled out."""
    code = err.errno
    if code in (errno.EACCES, errno.EPERM, errno.EROFS):
        reason = "permission denied (cgroup files are writable by root only; run as root)"
    elif code == errno.ENOENT and path.name in _BURST_FILES:
        reason = "kernel too old for CPU burst (needs Linux 5.14 or later)"
    elif code == errno.ENOENT:
        reason = "no such file (the cgroup does not exist, or the controller is not enabled)"
    elif code == errno.EINVAL and writing is not None:
        reason = f"the kernel refused {writing!r} (EINVAL)"
    elif code == errno.EBUSY:
        reason = "cgroup busy (it still has processes or child cgroups)"
    elif code == errno.ESRCH:
        reason = "no such process"
    else:
        reason = err.strerror or str(err)
    return CgroupError(path, reason)
