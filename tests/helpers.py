"""Small helpers for tests that start processes."""

from __future__ import annotations

from pathlib import Path


def worker_pids() -> set[int]:
    """PIDs of every lab worker process running now (found by command line)."""
    found = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if b"unthrottle/lab/worker.py" in cmdline:
            found.add(int(proc.name))
    return found
