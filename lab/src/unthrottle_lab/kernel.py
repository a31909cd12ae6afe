"""Facts about the running kernel that the lab reports beside its figures."""

from __future__ import annotations

import contextlib
import gzip
import os
import re
from pathlib import Path

_HZ = re.compile(rb"^CONFIG_HZ=(\d+)$", re.MULTILINE)


def kernel_hz(
    config_gz: Path = Path("/proc/config.gz"), boot_dir: Path = Path("/boot")
) -> int | None:
    """CONFIG_HZ from /proc/config.gz or /boot/config-RELEASE; None when neither is readable."""
    candidates: list[bytes] = []
    with contextlib.suppress(OSError):
        candidates.append(gzip.decompress(config_gz.read_bytes()))
    with contextlib.suppress(OSError):
        candidates.append((boot_dir / f"config-{os.uname().release}").read_bytes())
    for text in candidates:
        match = _HZ.search(text)
        if match:
            return int(match.group(1))
    return None
