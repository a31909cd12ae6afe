"""Worker processes of a lab run: started, talked to, and always ended by PID."""

from __future__ import annotations

import contextlib
import ctypes
import os
import selectors
import signal
import subprocess
import sys
from pathlib import Path
from types import TracebackType

WORKER_SCRIPT = Path(__file__).with_name("worker.py")
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    # If the lab is killed outright (SIGKILL), its workers must not live on.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class LabError(RuntimeError):
    """A lab run could not go on (a worker died or answered nonsense)."""


class Workers:
    """A pool of worker processes, each reached by a pipe; a context manager that kills them."""

    def __init__(self, count: int) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        # select(2), not the default epoll: epoll's timeout is whole milliseconds, rounded
        # up, so an open pool's dispatcher woke 0.88 ms after an arrival at the median and
        # every latency carried it (the model, rightly, not). select's is microseconds.
        self.selector = selectors.SelectSelector()
        try:
            for _ in range(count):
                proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", str(WORKER_SCRIPT)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    preexec_fn=_die_with_parent,  # noqa: PLW1509 - the lab starts no threads
                )
                self.procs.append(proc)
            for index in range(count):
                words = self.read(index)
                if words[:1] != ["ready"]:
                    raise LabError(f"worker {index} did not start: {words}")
            for index, proc in enumerate(self.procs):
                assert proc.stdout is not None
                self.selector.register(proc.stdout, selectors.EVENT_READ, index)
        except BaseException:
            self.close()
            raise

    @property
    def pids(self) -> list[int]:
        """The workers' process IDs."""
        return [p.pid for p in self.procs]

    def send(self, index: int, line: str) -> None:
        """Send one command line to worker ``index``."""
        stdin = self.procs[index].stdin
        assert stdin is not None
        try:
            stdin.write(line.encode() + b"\n")
            stdin.flush()
        except BrokenPipeError:
            raise LabError(f"worker {index} (pid {self.procs[index].pid}) died") from None

    def read(self, index: int) -> list[str]:
        """Read one reply line from worker ``index`` (blocking), split into words."""
        stdout = self.procs[index].stdout
        assert stdout is not None
        line = stdout.readline()
        if not line:
            code = self.procs[index].poll()
            raise LabError(f"worker {index} (pid {self.procs[index].pid}) died (exit {code})")
        return line.decode().split()

    def ready(self, timeout_s: float | None) -> list[int]:
        """Workers with a reply waiting, after at most ``timeout_s``."""
        return [key.data for key, _ in self.selector.select(timeout_s)]

    def close(self) -> None:
        """Kill every worker by PID and reap it; safe to call twice."""
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
        for proc in self.procs:
            proc.wait()
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()
        self.selector.close()

    def __enter__(self) -> Workers:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
