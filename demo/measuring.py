"""`make demo`'s pods and what is measured of them: where the kubelet put each pod's cgroups,
their ``cpu.stat`` over a window (the container's and the pod's own), the p99 its passes
logged, the agent's count of its wait, and the before / after table (demo/loop.py runs
the steps)."""

from __future__ import annotations

import json
import re
import statistics
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from unthrottle.model.burst import burst_specs, spec_for
from unthrottle.units import format_cpu, parse_cpu
from unthrottle_lab.kube import RealNode

NS = "shop"
CONTAINER = "app"
TARGET = 0.05
PERIOD_US = 100_000
"""The kubelet's CFS period (its ``cpuCFSQuotaPeriod`` default)."""
MEASURE_S = 30
"""How long each side of the table is measured: both pods at once."""
SPREAD = 0.2
"""How far outside the expected range a measured ratio may fall before the demo calls the
operator's estimate wrong (points of ratio): a 30 s measurement is 300 periods."""


def say(step: str) -> None:
    print(f"\n==> {step}", flush=True)


# -- the pods ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pod:
    """A running pod as the API server reports it, and where its kubelet put it."""

    name: str
    uid: str
    qos: str
    container_id: str
    restarts: int
    limit_millicores: int
    burst_us: int
    """The burst its annotation asks for, at its limit (what the agent should write)."""

    @classmethod
    def of(cls, obj: dict[str, Any]) -> Pod:
        meta, spec, status = obj["metadata"], obj["spec"], obj["status"]
        (cs,) = [cs for cs in status["containerStatuses"] if cs["name"] == CONTAINER]
        (container,) = [c for c in spec["containers"] if c["name"] == CONTAINER]
        limit = parse_cpu(container["resources"]["limits"]["cpu"])
        asked = spec_for(burst_specs(meta.get("annotations") or {}), CONTAINER)
        burst, _ = asked.resolve(max(limit * PERIOD_US // 1000, 1000)) if asked else (0, False)
        return cls(meta["name"], meta["uid"], status["qosClass"],
                   cs["containerID"].partition("://")[2], int(cs.get("restartCount") or 0),
                   limit, burst)  # fmt: skip

    def cgroup(self, node: RealNode) -> str:
        """The pod's cgroup as the kubelet's cgroupfs driver names it, below the node's root."""
        qos = {"Guaranteed": "", "Burstable": "burstable/", "BestEffort": "besteffort/"}
        return f"{node.cgroup_parent}/kubepods/{qos[self.qos]}pod{self.uid}"

    def container_cgroup(self, node: RealNode) -> str:
        return f"{self.cgroup(node)}/{self.container_id}"


# -- Prometheus ---------------------------------------------------------------------------


def named_by_agent(prometheus_url: str) -> list[str]:
    """``namespace/pod/container`` of every container series the agent exported."""
    return sorted("/".join(r["metric"][k] for k in ("namespace", "pod", "container"))
                  for r in query(prometheus_url, 'group by (namespace, pod, container) ('
                                 'last_over_time(unthrottle_cpu_cfs_periods_total'
                                 '{container!=""}[10m]))'))  # fmt: skip


def agent_wait(prometheus_url: str, pods: dict[str, Pod]) -> dict[str, float | None]:
    """The time each container's threads waited for a CPU over the last ``MEASURE_S``, as
    the agent counts it (throttled, or behind other processes: its schedstat run delay,
    which unthrottle counts into the demand; cAdvisor has no such counter)."""
    found = {r["metric"]["pod"]: float(r["value"][1]) for r in query(
        prometheus_url, f"increase(unthrottle_cpu_wait_seconds_total{{namespace=\"{NS}\","
        f"container=\"{CONTAINER}\"}}[{MEASURE_S}s])")}  # fmt: skip
    return {name: found.get(pod.name) for name, pod in pods.items()}


def query(prometheus_url: str, promql: str) -> list[dict[str, Any]]:
    url = f"{prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=10) as reply:
        return list(json.loads(reply.read())["data"]["result"])


# -- measuring, from the kernel's counters ----------------------------------------------------


@dataclass(frozen=True)
class Measured:
    """One pod over one window: its container cgroup's and its pod cgroup's ``cpu.stat``
    deltas, what the kernel holds now (quota, burst), and its passes' p99 (its log)."""

    container: Any
    pod: Any
    quota_us: int | None
    burst_us: int
    pod_quota_us: int | None
    pod_burst_us: int
    p99_ms: list[float]

    def row(self) -> dict[str, Any]:
        def ratio(stat: Any) -> float:
            return stat.nr_throttled / stat.nr_periods if stat.nr_periods else 0.0

        return {"throttle_ratio": ratio(self.container),
                "throttled_s": self.container.throttled_us / 1e6,
                "usage_s": self.container.usage_us / 1e6,
                "pod_throttle_ratio": ratio(self.pod),
                "pod_throttled_s": self.pod.throttled_us / 1e6,
                "kernel": {"quota_us": self.quota_us, "burst_us": self.burst_us,
                           "pod_quota_us": self.pod_quota_us, "pod_burst_us": self.pod_burst_us},
                "p99_ms": statistics.median(self.p99_ms) if self.p99_ms else None,
                "passes": len(self.p99_ms)}  # fmt: skip


_CRI_LINE = re.compile(r"^(\S+) stdout \w (.*)$")
_P99 = re.compile(r"\bp99 ([\d.]+) ms")


def passes_p99(node: RealNode, pod: Pod, since: float, until: float) -> list[float]:
    """The p99 of each pass the pod's workload logged between ``since`` and ``until`` (the
    kubelet's log file of its container, in the CRI format)."""
    folder = node.folder / "pod-logs" / f"{NS}_{pod.name}_{pod.uid}" / CONTAINER
    out = []
    for path in sorted(folder.glob("*.log")):
        for line in path.read_text(errors="replace").splitlines():
            found = _CRI_LINE.match(line)
            p99 = _P99.search(found.group(2)) if found else None
            if found is None or p99 is None:
                continue
            stamp = found.group(1).rstrip("Z")
            at = datetime.fromisoformat(stamp[:26] + "+00:00").timestamp()
            if since <= at <= until:
                out.append(float(p99.group(1)))
    return out


def measure(layout: Any, node: RealNode, pods: dict[str, Pod], label: str) -> dict[str, Measured]:
    """Every pod at once, for ``MEASURE_S``, from its cgroups' counters as the kubelet made
    them (nothing here writes a cgroup)."""
    from unthrottle.cgroups import Cgroup

    print(f"  {label}: {MEASURE_S} s of the kernel's counters, both pods at once …", flush=True)
    cgroups = {name: (Cgroup(layout, pod.container_cgroup(node)), Cgroup(layout, pod.cgroup(node)))
               for name, pod in pods.items()}  # fmt: skip
    start = {name: (c.read_stat(), p.read_stat()) for name, (c, p) in cgroups.items()}
    since = time.time()
    time.sleep(MEASURE_S)
    until = time.time()
    out = {}
    for name, (own, whole) in cgroups.items():
        bw, pod_bw = own.read_bandwidth(), whole.read_bandwidth()
        out[name] = Measured(own.read_stat() - start[name][0], whole.read_stat() - start[name][1],
                             bw.quota_us, bw.burst_us, pod_bw.quota_us, pod_bw.burst_us,
                             passes_p99(node, pods[name], since, until))  # fmt: skip
    return out


# -- the table -----------------------------------------------------------------------------


def table(rows: Sequence[tuple[str, ...]], header: tuple[str, ...]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))


def settings(m: Measured) -> str:
    """The container's limit and burst as its cgroup holds them."""
    quota = format_cpu(round((m.quota_us or 0) * 1000 / PERIOD_US)) if m.quota_us else "none"
    return f"{quota} / {m.burst_us / 1000:g} ms"


def expectations(recommended: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """The operator's expected throttle ratio per Deployment, as a range (beside the same
    neighbours, if the node goes quiet: ``expectedThrottleRatioRange``; a point is a range
    of one), from the policy's status."""
    out = {}
    for w in recommended.get("workloads", []):
        for c in w["containers"]:
            span = c.get("expectedThrottleRatioRange")
            point = c.get("expectedThrottleRatio")
            if span is not None:
                out[w["deployment"]] = (float(span[0]), float(span[1]))
            elif point is not None:
                out[w["deployment"]] = (float(point), float(point))
    return out


def expected_cell(span: tuple[float, float] | None) -> str:
    """``0.0–99.7 %``, ``2.0 %``, or a dash."""
    if span is None:
        return "–"
    low, high = span
    return f"{high * 100:.1f} %" if low == high else f"{low * 100:.1f}–{high * 100:.1f} %"


def compare(today: dict[str, Pod], now: dict[str, Pod], before: dict[str, Measured],
            after: dict[str, Measured],
            waits: tuple[dict[str, float | None], dict[str, float | None]],
            expected: dict[str, tuple[float, float]] | None = None,
            ) -> dict[str, Any]:  # fmt: skip
    """The before / after table, and its figures for the JSON; the unthrottle row shows the
    operator's expected range beside the measured ratio."""
    expected = expected or {}
    say("8. before and after, from the kernel's counters of the cgroups the kubelet made "
        f"({MEASURE_S} s each, both pods at once)")  # fmt: skip
    rows, results = [], {}
    for name, old in today.items():
        results[name] = {"expected_throttle_ratio_range": expected.get(name)}
        for label, pod, m in (("today", old, before[name]),
                              ("unthrottle", now[name], after[name])):  # fmt: skip
            fig = m.row()
            p99 = f"{fig['p99_ms']:.1f} ms" if fig["p99_ms"] is not None else "–"
            guess = expected_cell(expected.get(name)) if label != "today" else ""
            rows.append((name if label == "today" else "", label, pod.name, str(pod.restarts),
                         settings(m), f"{fig['throttle_ratio'] * 100:.1f} %", guess,
                         f"{fig['pod_throttle_ratio'] * 100:.0f} % / "
                         f"{fig['pod_throttled_s']:.1f} s", p99))  # fmt: skip
            waited = waits[0 if label == "today" else 1].get(name)
            results[name]["before" if label == "today" else "after"] = fig | {
                "agent_wait_s": waited,
                "pod": pod.name, "uid": pod.uid, "container_id": pod.container_id,
                "restarts": pod.restarts, "limit_millicores": pod.limit_millicores,
                "burst_us": pod.burst_us}  # fmt: skip
    table(rows, ("workload", "settings", "pod", "restarts", "limit / burst",
                 "throttled periods", "expected", "pod cgroup throttled",
                 "p99 (median pass)"))  # fmt: skip
    same = [n for n in today if (now[n].uid, now[n].container_id) ==
            (today[n].uid, today[n].container_id) and now[n].restarts == 0]  # fmt: skip
    if len(same) == len(today):
        print("  0 pods restarted: same pod UID, container ID and cgroup")
    else:
        print(f"  restarted or replaced: {', '.join(n for n in today if n not in same)}")
    return results


def honest(results: dict[str, Any], recommended: dict[str, Any]) -> list[str]:
    """What the measurement says about the recommendation, where it missed the target or the
    operator's own expectation."""
    expected = expectations(recommended)
    out = []
    for name, figures in results.items():
        after = figures["after"]
        if after["throttle_ratio"] > TARGET:
            out.append(f"{name}: its container is still throttled in "
                       f"{after['throttle_ratio'] * 100:.0f} % of periods, over the "
                       f"{TARGET * 100:.0f} % target")  # fmt: skip
        if after["pod_throttle_ratio"] > TARGET:
            out.append(f"{name}: its pod cgroup's own quota (the kubelet's, the sum of the "
                       f"limits) throttled {after['pod_throttle_ratio'] * 100:.0f} % of its "
                       f"periods, {after['pod_throttled_s']:.1f} s, which the container's "
                       "counters (cAdvisor's and the agent's, unthrottle's evidence) do not "
                       "show (README, \"Limits\"; issue 28)")  # fmt: skip
        span = expected.get(name)
        measured = after["throttle_ratio"]
        if span is not None and not span[0] - SPREAD <= measured <= span[1] + SPREAD:
            out.append(f"{name}: the operator expected {expected_cell(span)} of periods "
                       f"throttled at {format_cpu(after['limit_millicores'])}, the kernel "
                       f"counted {after['throttle_ratio'] * 100:.1f} %: its estimate of the "
                       "demand was wrong here" + waited(figures["before"]))  # fmt: skip
    return out


def waited(fig: dict[str, Any]) -> str:
    """What the agent counted of the container's wait, beside the CPU time it used."""
    if fig.get("agent_wait_s") is None:
        return ""
    return (f" (before the resize its threads waited {fig['agent_wait_s']:.1f} s for a CPU "
            f"in {MEASURE_S} s, throttled or behind other processes, as the agent counts it, "
            f"and used {fig['usage_s']:.1f} s)")  # fmt: skip


def cadvisor_containers(prometheus_url: str) -> list[str]:
    """``pod/container`` of cAdvisor's CPU series in ``shop`` (``container=""``: the pod's
    own cgroup and its pause container, told apart only by ``id``)."""
    return sorted(
        f"{r['metric'].get('pod')}/{r['metric'].get('container', '')}"
        for r in query(
            prometheus_url,
            "group by (pod, container) (last_over_time("
            f'container_cpu_cfs_periods_total{{namespace="{NS}"}}[10m]))',
        )
    )
