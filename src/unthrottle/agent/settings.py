"""The node agent's knobs, in one place, each with its unit and the reason for its default.

Checked when built: a setting that cannot work (a peak window shorter than one
sampling window) raises :class:`InvalidAgentSettings` naming the field, so a
front-end can name its own option.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_PERIOD_NS = 1_000_000
MAX_PERIOD_NS = 60_000_000_000


class InvalidAgentSettings(ValueError):
    """A setting that cannot work; ``field`` is the settings field at fault."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def _s(value: float) -> str:
    return f"{value * 1000:g} ms" if value < 1 else f"{value:g} s"


@dataclass(frozen=True, slots=True)
class AgentSettings:
    """How the agent samples, discovers and talks to the API. Passed in, never global."""

    period_ns: int = 100_000_000
    """Sampling window, ns. 100 ms is the kubelet's CFS period: a window is about a period,
    the grain at which throttling happens (docs/agent.md)."""
    peak_window_s: float = 60.0
    """The peak gauge is the largest window of this much history, s: a trailing maximum,
    so that every scraper of an HA pair sees the same peak. At least one window."""
    refresh_s: float = 5.0
    """How often cgroups are discovered again and the pod list is taken, s. Runs on a
    thread of its own: a slow API never delays a sampling window."""
    settings_s: float = 30.0
    """How often quota, period and burst are read again, s (an in-place resize shows up
    within this)."""
    api_timeout_s: float = 10.0
    """Every Kubernetes API call gives up after this long, s (connect and read): a hung
    list must end, or discovery and the burst writer wait with it."""
    skip_idle_subtrees: bool = True
    """Read a cgroup's files only when the usage of the cgroup above it moved. Usage is
    hierarchical, so a pod whose usage did not move has no container that ran: on a
    kubelet's tree most pods are idle in any 100 ms, and cost one read for all their
    containers (docs/benchmarks.md §5)."""
    stop_within_s: float = 0.5
    """The sampling thread notices a stop within this long (or a period, if shorter), s.
    Between windows it sleeps, which costs about half the CPU of waiting on an event
    (59 against 120 µs per wake-up on a VM, docs/benchmarks.md §5), and checks for a
    stop after each sleep of at most this long."""
    measure_wait: bool = True
    """Read the run delay of the threads of each container that ran in a window, and count
    the wait beyond its throttled time in its demand: on a busy node a thread also waits
    behind other processes, and that wait is neither usage nor throttled time (Linux
    schedstat; docs/agent.md "Wait"). It costs a ``pread`` per thread of the containers
    that ran, and one open file per thread (docs/benchmarks.md §5)."""
    threads_s: float = 5.0
    """How often the thread list of a container that runs is re-read, s (when it next
    runs after this long). A thread that began since the last list is counted whole, from
    its start; one that lives shorter than this may be missed. Re-reading costs a read
    of the cgroup's ``tasks`` file and a ``stat``, about 40 times a thread's ``pread``
    in the agent's window (docs/benchmarks.md §5), so it is as rare as discovery."""
    stall_periods: int = 5
    """``/healthz`` fails when no window was taken for this many periods (the sampling
    thread is stuck or starved)."""

    def __post_init__(self) -> None:
        if not MIN_PERIOD_NS <= self.period_ns <= MAX_PERIOD_NS:
            raise InvalidAgentSettings(
                "period_ns", f"{_s(self.period_ns / 1e9)} is outside 1 ms-60 s"
            )
        if self.peak_window_s * 1e9 < self.period_ns:
            raise InvalidAgentSettings(
                "peak_window_s",
                f"{_s(self.peak_window_s)} is shorter than the sampling period "
                f"({_s(self.period_ns / 1e9)}): the peak must cover at least one window",
            )
        for name in ("refresh_s", "settings_s", "api_timeout_s", "stop_within_s", "threads_s"):
            value = getattr(self, name)
            if not value > 0 or value == float("inf"):
                raise InvalidAgentSettings(name, f"{value!r} is not a positive duration")
        if self.stall_periods < 1:
            raise InvalidAgentSettings("stall_periods", "must be at least 1")

    @property
    def keep(self) -> int:
        """Windows in the trailing peak window."""
        return max(1, round(self.peak_window_s * 1e9 / self.period_ns))
