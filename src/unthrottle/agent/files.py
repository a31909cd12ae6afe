"""How many files the agent may keep open, and raising that to what the node allows.

The agent keeps files open on purpose: each cgroup's counters, and each thread's
``/proc/<tid>/schedstat`` while it measures the wait (``cgroups/waits.py``): one file per
thread of every container that ran. A node's containers often hold thousands of threads.

Its container gets the runtime's limit. containerd's CRI plugin drops the spec's default
(1024) and lets a container inherit containerd's own; containerd 2.x's systemd unit no
longer sets ``LimitNOFILE=infinity``, so that is systemd's default, 1024 soft and 524,288
hard. At a soft limit of 1,024, 200 containers of 16 threads each ran the agent out of
files (bench/agent_sizing.py). Go programs raise their soft limit to the hard one at start
(Go ≥ 1.19); the agent does the same (:func:`raise_soft_limit`), and where it still runs
out, the cgroups it can open are sampled and the rest are tried again at the next
discovery (``agent/sampling.py``), each said once in the log.
"""

from __future__ import annotations

import errno
import resource

OUT_OF_FILES = frozenset({errno.EMFILE, errno.ENFILE})
"""The errnos of a process (EMFILE) or the node (ENFILE) out of file descriptors."""


def raise_soft_limit() -> tuple[int, int, int]:
    """Set the soft RLIMIT_NOFILE to the hard one; (soft before, soft now, hard).

    An unlimited hard limit is left as it is: the soft one is raised to what the kernel
    allows a process (``fs.nr_open``) only when the hard limit says so explicitly.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard in (resource.RLIM_INFINITY, soft):
        return soft, soft, hard
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return soft, hard, hard
