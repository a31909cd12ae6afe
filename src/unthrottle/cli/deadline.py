"""An overall deadline for a command that waits on servers (``recommend --deadline``).

Every call has its own timeout, but a command makes many, some retried, some in threads:
only a deadline on the whole bounds the wait. When it passes, the command says what it
was waiting for and ends the process at once: a thread stuck in a socket read cannot be
stopped any other way, and nothing is lost, since output is written only after the
deadline is cancelled (and atomically).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from types import TracebackType

from unthrottle.cli.common import err, fail


class Deadline:
    """Started with ``with``; :meth:`step` says what the command is doing now."""

    def __init__(self, seconds: float, text: str) -> None:
        self.seconds = seconds
        self.text = text
        self.doing = "starting"
        self.before_exit: Callable[[], None] | None = None
        """Called first when the deadline passes (a progress display stops, cleanly)."""
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def step(self, doing: str) -> None:
        """What the command waits on from now (``reading Deployments from …``)."""
        self.doing = doing

    def cancel(self) -> None:
        """The work is done: from here the command only writes its output."""
        self._timer.cancel()

    def _expire(self) -> None:
        if self.before_exit is not None:
            self.before_exit()
        err.show_cursor(True)  # a progress display hides it
        fail(f"--deadline {self.text}: gave up after {self.seconds:g} s while {self.doing} "
             "(raise --deadline, or check that server)", 1)  # fmt: skip
        err.file.flush()
        os._exit(1)

    def __enter__(self) -> Deadline:
        self._timer.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        self.cancel()
