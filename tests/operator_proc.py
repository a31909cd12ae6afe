"""`unthrottle operator` as a user runs it: a subprocess, pointed at the tests' real
control plane by KUBECONFIG, logging to a file, ended by PID (SIGTERM, or SIGKILL to test
a crash)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from types import TracebackType

from unthrottle_lab.children import stop

UNTHROTTLE = Path(sys.executable).with_name("unthrottle")


class OperatorProcess:
    """Start with ``with``; :meth:`kill` ends it at once, as a crash would."""

    def __init__(self, kubeconfig: Path, prometheus: str, log: Path, *extra: str) -> None:
        self.command = [str(UNTHROTTLE), "operator", "--prometheus", prometheus, "--standalone",
                        "--log-format", "text", *extra]  # fmt: skip
        self.env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> OperatorProcess:
        with self.log.open("a") as out:
            self.proc = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT,
                                         env=self.env)  # fmt: skip
        return self

    def kill(self) -> None:
        """SIGKILL: no handler runs, nothing is cleaned up."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        if self.proc is not None:
            stop(self.proc, timeout_s=20)

    def tail(self) -> str:
        return self.log.read_text()[-4000:] if self.log.exists() else ""
