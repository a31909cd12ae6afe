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

from unthrottle.cgroups import Cgroup, CgroupError, Layout
from unthrottle_lab.isolation import orphaned

WORKER_SCRIPT = Path(__file__).with_name("worker.py")
_PR_SET_PDEATHSIG = 1
NEIGHBOUR_PREFIX = "unthrottle-lab-neighbour-"


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
        kill_and_reap(self.procs)
        for proc in self.procs:
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


def pin_apart(pids: list[int]) -> bool:
    """Pin each process to a CPU of its own, the last CPUs first; True when done.

    Only two or more, and no more than there are CPUs; otherwise nothing is pinned
    (False) and the scheduler places them: a single worker has no sibling to share a CPU
    with, and stays free to leave a CPU that other work wakes on. The other threads a run
    asks for are pinned from the first CPU up (``OtherThreads``).
    """
    cpus = sorted(os.sched_getaffinity(0), reverse=True)
    if not 2 <= len(pids) <= len(cpus):
        return False
    for pid, cpu in zip(pids, cpus, strict=False):
        os.sched_setaffinity(pid, {cpu})
    return True


def pin_beside(pids: list[int], pinned: list[int]) -> bool:
    """Pin each of ``pids`` (a sidecar's workers) on the CPU the task model places it on,
    after ``pinned`` (the run's workers, pinned apart by :func:`pin_apart`): thread
    ``len(pinned) + i`` of the pod on CPU ``(len(pinned) + i) % cpus`` of the model's, where
    ``cpus`` is the most the pod's threads can use. True when done."""
    cpus = sorted(os.sched_getaffinity(0), reverse=True)[: len(pinned) + len(pids)]
    for i, pid in enumerate(pids):
        os.sched_setaffinity(pid, {cpus[(len(pinned) + i) % len(cpus)]})
    return bool(pids)


def kill_and_reap(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGKILL every process still running, by PID, then wait for each."""
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
    for proc in procs:
        proc.wait()


class OtherThreads:
    """Busy processes beside a run, outside its cgroup: the other load a run asks for.

    Each spins in pure Python (no syscalls) until killed, as a CPU-bound neighbour on a
    node does, pinned to one CPU in turn (the first to CPU 0, the next to CPU 1, …): left
    free, the scheduler put two of them on one CPU and the run's thread alone on the
    other for a whole run, and nothing was contended.

    Each lives in a cgroup of its own (``unthrottle-lab-neighbour-PID-N``, default
    weight), as a neighbouring container does on a node, so a core is shared evenly
    between it and the run's cgroup, as the model shares it. Left in the lab's own
    cgroup they were scheduled by whatever groups the machine makes there: with
    ``sched_autogroup_enabled`` the two of them shared one session's weight, and a
    run's thread at 0.6 CPU got its 0.6 (throttled in every period) on one machine and
    exactly half a core (never throttled) on another of the same kind.

    They start before the run and are killed by PID and reaped after it, and their
    cgroups removed; they die with the lab if it is killed. They are this process's
    children, so ``isolate`` keeps them at their priority: it keeps out the machine's
    load, not the load the scenario asked for.
    """

    def __init__(self, count: int, layout: Layout) -> None:
        self.count = count
        self.layout = layout
        self.procs: list[subprocess.Popen[bytes]] = []
        self.cgroups: list[Cgroup] = []

    def __enter__(self) -> OtherThreads:
        if not self.count:
            return self
        try:
            self._reclaim_stale()
            spin = [sys.executable, "-I", "-S", "-c", "while True: pass"]
            cpus = sorted(os.sched_getaffinity(0))
            for index in range(self.count):
                cgroup = Cgroup(self.layout, f"{NEIGHBOUR_PREFIX}{os.getpid()}-{index}")
                cgroup.create()
                self.cgroups.append(cgroup)
                proc = subprocess.Popen(
                    spin,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    preexec_fn=_die_with_parent,  # noqa: PLW1509 - the lab starts no threads
                )
                self.procs.append(proc)
                os.sched_setaffinity(proc.pid, {cpus[index % len(cpus)]})
                cgroup.add_process(proc.pid)
        except BaseException:
            self.close()
            raise
        return self

    def _reclaim_stale(self) -> None:
        """Remove the neighbours' cgroups of a lab that was killed (theirs died with it)."""
        for stale in orphaned(self.layout.cpu_root, NEIGHBOUR_PREFIX):
            with contextlib.suppress(CgroupError):
                Cgroup(self.layout, stale.name).remove(timeout_s=1.0)

    @property
    def pids(self) -> list[int]:
        """The busy processes' PIDs."""
        return [proc.pid for proc in self.procs]

    def close(self) -> None:
        """Kill every busy process by PID, reap it and remove its cgroup; safe to call twice."""
        kill_and_reap(self.procs)
        self.procs = []
        for cgroup in self.cgroups:
            cgroup.remove()
        self.cgroups = []

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
