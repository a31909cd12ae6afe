"""Where the CPU controller lives: cgroup v2, or v1 with cpu and cpuacct together or apart.

Detected from ``/proc/self/mountinfo`` (parsed as text, so fixtures can stand in
for any host). A v1 ``cpu`` hierarchy wins over a v2 mount: on a hybrid host
the CPU controller is bound to v1 and the unified tree has none.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from unthrottle.cgroups.errors import CgroupError

MOUNTINFO = Path("/proc/self/mountinfo")


class Version(StrEnum):
    """How the CPU controllers are mounted."""

    V2 = "v2"
    V1_JOINT = "v1 (cpu,cpuacct together)"
    V1_SPLIT = "v1 (cpu and cpuacct apart)"


@dataclass(frozen=True, slots=True)
class Layout:
    """The mount points of the hierarchies that hold CPU bandwidth and usage."""

    version: Version
    cpu_root: Path
    """Mount point of the hierarchy with ``cpu`` (v2: the unified mount)."""
    cpuacct_root: Path
    """Mount point of the hierarchy with usage (v1 ``cpuacct``; equal to ``cpu_root`` otherwise)."""

    @property
    def roots(self) -> tuple[Path, ...]:
        """Every distinct hierarchy a cgroup must be created in."""
        if self.cpuacct_root == self.cpu_root:
            return (self.cpu_root,)
        return (self.cpu_root, self.cpuacct_root)


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as octal (\040 …).
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 4 <= len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str, *, v2_controllers: str | None = None) -> Layout:
    """Find the CPU hierarchies in a mountinfo text.

    ``v2_controllers`` is the content of the unified root's ``cgroup.controllers``
    (needed only when no v1 ``cpu`` hierarchy exists).
    """
    cpu: Path | None = None
    cpuacct: Path | None = None
    unified: Path | None = None
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields = left.split()
        rest = right.split()
        if len(fields) < 5 or len(rest) < 3:
            continue
        fstype, superopts = rest[0], rest[2]
        mountpoint = Path(_unescape(fields[4]))
        if fstype == "cgroup2":
            unified = unified or mountpoint
        elif fstype == "cgroup":
            options = set(superopts.split(","))
            if "cpu" in options and cpu is None:
                cpu = mountpoint
            if "cpuacct" in options and cpuacct is None:
                cpuacct = mountpoint
    if cpu is not None:
        if cpuacct is None:
            raise CgroupError(cpu, "the cpuacct controller is not mounted (CPU usage unreadable)")
        version = Version.V1_JOINT if cpu == cpuacct else Version.V1_SPLIT
        return Layout(version, cpu, cpuacct)
    if unified is not None:
        if v2_controllers is not None and "cpu" not in v2_controllers.split():
            raise CgroupError(
                unified / "cgroup.controllers",
                "the cpu controller is not available in cgroup v2 "
                "(bound to a v1 hierarchy, or disabled)",
            )
        return Layout(Version.V2, unified, unified)
    raise CgroupError(MOUNTINFO, "the cpu controller is not mounted (neither cgroup v1 nor v2)")


def detect_layout(mountinfo: Path = MOUNTINFO) -> Layout:
    """The layout of this host (or of a fixture tree's mountinfo)."""
    try:
        text = mountinfo.read_text()
    except OSError as err:
        raise CgroupError(mountinfo, f"cannot read: {err.strerror}") from None
    layout = parse_mountinfo(text)
    if layout.version is Version.V2:
        controllers = layout.cpu_root / "cgroup.controllers"
        try:
            layout = parse_mountinfo(text, v2_controllers=controllers.read_text())
        except OSError as err:
            raise CgroupError(controllers, f"cannot read: {err.strerror}") from None
    return layout
