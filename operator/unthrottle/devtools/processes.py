"""Ending a process this tool started, by PID: SIGTERM, then SIGKILL if it lingers."""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any

__all__ = ["stop"]


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
