"""Processes for the tests and the benchmarks: ending one this tool started, by PID
(SIGTERM, then SIGKILL if it lingers), and CPU hogs as another program's would be."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

__all__ = ["foreign_hogs", "stop"]


def stop(proc: subprocess.Popen[Any], *, timeout_s: float = 15.0) -> None:
    """End ``proc`` (a no-op once it has ended): SIGTERM, and SIGKILL after ``timeout_s``."""
    if proc.poll() is not None:
        return
    os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


@contextlib.contextmanager
def foreign_hogs(count: int) -> Iterator[list[int]]:
    """``count`` busy CPU hogs that are not this process's descendants (started through a
    shell that exits at once, so they are reparented), as another program's would be;
    their PIDs, each killed by PID afterwards."""
    spin = f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 </dev/null"
    out = subprocess.run(["sh", "-c", f"{spin} & echo $!\n" * count], capture_output=True,
                         text=True, check=True, timeout=10)  # fmt: skip
    pids = [int(p) for p in out.stdout.split()]
    try:
        yield pids
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
