"""cgroup CPU access: find the hierarchies, read and write bandwidth, read cpu.stat.

Shared by the lab and the node agent. Supports cgroup v2, cgroup v1 with
``cpu,cpuacct`` mounted together, and v1 with them apart.
"""

from unthrottle.cgroups.errors import CgroupError
from unthrottle.cgroups.files import Cgroup, CpuStat
from unthrottle.cgroups.layout import Layout, Version, detect_layout, parse_mountinfo

__all__ = [
    "Cgroup",
    "CgroupError",
    "CpuStat",
    "Layout",
    "Version",
    "detect_layout",
    "parse_mountinfo",
]
