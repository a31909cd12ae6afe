"""PromQL built from parts, with every label value escaped: a namespace or pod name
can never change what a query means.

PromQL string literals follow Go's rules: in a double-quoted string a backslash
escapes, so ``\\``, ``"`` and newlines are escaped. A regex matcher (``=~``)
takes an RE2 regular expression, fully anchored, so a value used there is
first escaped as a regex, then as a string.

Queries are batched: one query per metric for a whole set of namespaces,
grouped by namespace, pod and container. Never one query per workload.
"""

from __future__ import annotations

from collections.abc import Iterable

_RE2_SPECIAL = set("\\.+*?()|[]{}^$")


def string(value: str) -> str:
    """A PromQL string literal holding exactly ``value``."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def regex_literal(value: str) -> str:
    """``value`` as an RE2 pattern matching exactly itself."""
    return "".join(f"\\{c}" if c in _RE2_SPECIAL else c for c in value)


def equals(label: str, value: str) -> str:
    """``label="value"``."""
    return f"{label}={string(value)}"


def any_of(label: str, values: Iterable[str]) -> str:
    """``label=~"a|b|c"``, each value matched literally."""
    items = sorted(set(values))
    if not items:
        raise ValueError(f"{label}: at least one value is needed")
    return f"{label}=~{string('|'.join(regex_literal(v) for v in items))}"


def selector(metric: str, *matchers: str) -> str:
    """``metric{m1,m2,…}``."""
    return f"{metric}{{{','.join(matchers)}}}"


BY_CONTAINER = "namespace, pod, container"
BY_BACKLOG = f"{BY_CONTAINER}, level, over"
BACKLOG_COUNTER = "unthrottle_cpu_demand_backlog_windows_total"
"""The agent's count of windows whose backlog above a level passed a threshold
(:mod:`unthrottle.cfs.backlog`): the order of the windows, which the histogram loses."""
ACTIVE_COUNTER = "unthrottle_cpu_active_windows_total"
"""The agent's count of windows with demand: the backlog's denominator."""
CONTAINERS = ('container!=""', 'container!="POD"')
"""cAdvisor's pod-level series have ``container=""`` (or ``POD``, the pause container)."""
WITH_PODS = ('container!="POD"',)
"""Containers and their pods' own cgroups: the evidence's counters read both in one query.

On a real kubelet (cgroupfs or systemd driver, containerd) cAdvisor's ``container=""``
series of a pod are two cgroups told apart only by ``id``: the pod cgroup's and the pause
container's. ``sum by (namespace, pod, container)`` adds them, which is right for the CFS
counters: cAdvisor exports those only for a cgroup with a quota (``Quota != 0``), and the
pause container has none, so they are the pod cgroup's alone. The agent exports the pod
cgroup as ``container=""`` too. A pod whose containers all have limits gets the sum of them
as its own quota; docker-shim's ``POD`` pause container stays out.
"""


def namespaces_matcher(namespaces: Iterable[str]) -> str:
    """These namespaces, or every namespace when none is given."""
    items = list(namespaces)
    return any_of("namespace", items) if items else 'namespace!=""'


AGENT_COUNTERS = {
    "container_cpu_usage_seconds_total": "unthrottle_cpu_usage_seconds_total",
    "container_cpu_cfs_periods_total": "unthrottle_cpu_cfs_periods_total",
    "container_cpu_cfs_throttled_periods_total": "unthrottle_cpu_cfs_throttled_periods_total",
    "container_cpu_cfs_throttled_seconds_total": "unthrottle_cpu_cfs_throttled_seconds_total",
}
"""cAdvisor's counters and the agent's copies of the same ``cpu.stat`` fields."""
WAIT_COUNTER = "unthrottle_cpu_wait_seconds_total"
"""The agent's count of the time a container's threads waited for a CPU (throttled, or
behind other processes); cAdvisor has none."""
PRESSURE_COUNTER = "container_pressure_cpu_waiting_seconds_total"
"""The kubelet's PSI (``/metrics/cadvisor``, GA in Kubernetes 1.36, KEP-4205; cgroup v2
only): wall time in which at least one of the container's threads waited for a CPU
(``cpu.pressure`` "some"), throttled or behind other processes. Wall time, not thread
time: two threads waiting at once count once, so it is a lower bound of the agent's wait."""
SOURCE = "source"
"""The label a series riding along in another's query carries (``psi``, ``burst``): ``or``
keeps both sides' series since their label sets differ, and the answer tells them apart."""
PRESSURE_SOURCE = (SOURCE, "psi")
"""The PSI series ride along in the wait query."""
BURST_SOURCE = (SOURCE, "burst")
"""cAdvisor's burst counters (cAdvisor #3795, exported for every cgroup with a quota: 0
where no burst is set or it was never used), or the agent's copies, ride along in the
periods and throttled-time queries."""
BURST_COUNTERS = {
    "periods": ("container_cpu_cfs_burst_periods_total", "unthrottle_cpu_cfs_bursts_total"),
    "throttled_seconds": ("container_cpu_cfs_burst_seconds_total",
                          "unthrottle_cpu_cfs_burst_seconds_total"),
}  # fmt: skip
"""Query name → cAdvisor's burst counter and the agent's: periods that used a burst, and the
CPU time used above the quota."""
PERIOD_GAUGE = "unthrottle_cpu_cfs_period_seconds"
"""The agent's gauge of each container's CFS period (the node's kubelet
``--cpu-cfs-quota-period``); cAdvisor exports none."""


def duration(window_s: int) -> str:
    """Seconds as a PromQL range (``86400s``): the window is parsed once, at the edge."""
    if window_s < 1:
        raise ValueError(f"a range of {window_s} s is not positive")
    return f"{int(window_s)}s"


def counter_queries(namespaces: Iterable[str], window_s: int) -> dict[str, str]:
    """One query per CPU counter for every container of these namespaces, over ``window``.

    cAdvisor's series are preferred; where a container has none (a cluster that
    scrapes only the agent), the agent's copy fills in, in the same query
    (``or`` keeps the left side's series and adds the right side's others).
    """
    return _counters((namespaces_matcher(namespaces), *CONTAINERS), duration(window_s))


def evidence_counter_queries(namespaces: Iterable[str], window: str) -> dict[str, str]:
    """The evidence's counters over ``window`` (a PromQL range) for the containers of these
    namespaces and their pods' own cgroups (``container=""``), with the kubelet's PSI
    beside the agent's wait and the burst counters beside the periods and throttled time:
    the same five queries as :func:`counter_queries`, widened."""
    return _counters((namespaces_matcher(namespaces), *WITH_PODS), window, ride_along=True)


def pod_counter_queries(namespace: str, pod: str, window_s: int) -> dict[str, str]:
    """:func:`counter_queries` for one pod's containers and its own cgroup (``container=""``,
    the pod's quota): an in-place canary's counters (:func:`canary_ratios`)."""
    matchers = (equals("namespace", namespace), equals("pod", pod), *WITH_PODS)
    return _counters(matchers, duration(window_s))


BURST_GAUGE = "unthrottle_cpu_cfs_burst_seconds"
"""The agent's gauge of the burst it reads back from each container's cgroup."""


def pod_burst_query(namespace: str, pod: str) -> str:
    """The burst each container of one pod has in its cgroup now, seconds (agent's gauge)."""
    matchers = (equals("namespace", namespace), equals("pod", pod), *CONTAINERS)
    return f"max by (container) ({selector(BURST_GAUGE, *matchers)})"


def _counters(
    matchers: tuple[str, ...], window: str, *, ride_along: bool = False
) -> dict[str, str]:
    def increase(metric: str) -> str:
        return f"sum by ({BY_CONTAINER}) (increase({selector(metric, *matchers)}[{window}]))"

    names = ("usage_seconds", "periods", "throttled_periods", "throttled_seconds")
    found = {
        name: f"{increase(cadvisor)} or {increase(agent)}"
        for name, (cadvisor, agent) in zip(names, AGENT_COUNTERS.items(), strict=True)
    }
    found["wait_seconds"] = increase(WAIT_COUNTER)  # the agent's alone
    if not ride_along:
        return found

    def labelled(promql: str, source: tuple[str, str]) -> str:
        return f'label_replace({promql}, "{source[0]}", "{source[1]}", "", "")'

    # the kubelet's PSI and the burst counters ride along, labelled: no query of their own
    found["wait_seconds"] += f" or {labelled(increase(PRESSURE_COUNTER), PRESSURE_SOURCE)}"
    for name, (cadvisor, agent) in BURST_COUNTERS.items():
        either = f"({increase(cadvisor)} or {increase(agent)})"
        found[name] += f" or {labelled(either, BURST_SOURCE)}"
    return found


_DURATION = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}


def seconds(window: str) -> int | None:
    """A PromQL-style duration with one unit (``7d``, ``90m``) in seconds; None if it is not."""
    number, unit = window[:-1], window[-1:]
    if not number.isdigit() or unit not in _DURATION:
        return None
    return int(number) * _DURATION[unit]


RULE_INTERVAL = "5m"
RECORDED = {
    "usage_seconds": "namespace_pod_container:cpu_usage_seconds:increase5m",
    "periods": "namespace_pod_container:cpu_cfs_periods:increase5m",
    "throttled_periods": "namespace_pod_container:cpu_cfs_throttled_periods:increase5m",
    "throttled_seconds": "namespace_pod_container:cpu_cfs_throttled_seconds:increase5m",
    "wait_seconds": "namespace_pod_container:unthrottle_cpu_wait_seconds:increase5m",
    "histogram": "namespace_pod_container:unthrottle_cpu_demand_cores_bucket:increase5m",
    "backlog": "namespace_pod_container:unthrottle_cpu_demand_backlog_windows:increase5m",
}
"""Series unthrottle's recording rules write: each sample is the increase over the 5 minutes
before it, so a window's total is their ``sum_over_time``."""


def recording_rules() -> dict[str, object]:
    """A Prometheus rule file (as data) recording what ``recommend`` reads, every 5 minutes.

    On a big cluster a week of raw 30 s samples is billions of points; these rules
    make it 2,016 per series. ``unthrottle prometheus-rules`` prints it as YAML.
    """
    rules = [
        {"record": RECORDED[name], "expr": expr}
        for name, expr in _counters(WITH_PODS, RULE_INTERVAL, ride_along=True).items()
    ]
    bucket = selector("unthrottle_cpu_demand_cores_bucket", 'container!=""')
    rules.append({
        "record": RECORDED["histogram"],
        "expr": f"sum by ({BY_CONTAINER}, le) (increase({bucket}[{RULE_INTERVAL}]))",
    })  # fmt: skip
    backlog = selector(BACKLOG_COUNTER, 'container!=""')
    active = selector(ACTIVE_COUNTER, 'container!=""')
    rules.append({
        "record": RECORDED["backlog"],
        "expr": f"sum by ({BY_BACKLOG}) (increase({backlog}[{RULE_INTERVAL}])) "
                f"or sum by ({BY_CONTAINER}) (increase({active}[{RULE_INTERVAL}]))",
    })  # fmt: skip
    return {"groups": [{"name": "unthrottle", "interval": RULE_INTERVAL, "rules": rules}]}


def recorded_by(name: str) -> str:
    """The labels a recorded series is summed by: its container's, and the histogram's
    ``le``, the backlog's ``level`` and ``over``, or the counters' ``source`` (the series
    that ride along in them)."""
    if name == "histogram":
        return f"{BY_CONTAINER}, le"
    if name == "backlog":
        return BY_BACKLOG
    return f"{BY_CONTAINER}, {SOURCE}"


def recorded_query(name: str, namespaces: Iterable[str], window_s: int) -> str:
    """A window's total from a recorded series, per container (and ``le``)."""
    by_labels = recorded_by(name)
    ns = namespaces_matcher(namespaces)
    return (f"sum by ({by_labels}) "
            f"(sum_over_time({selector(RECORDED[name], ns)}[{duration(window_s)}]))")  # fmt: skip
