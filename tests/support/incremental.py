"""What test_incremental.py shares with other test modules: constants, helpers and
fixtures (and the tests another module runs again), so that no test module imports
another."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from unthrottle.evidence.containers import ContainerEvidence, Slot, WorkloadKey
from unthrottle.model.owners import Owners

HOUR = 3600
DAY = 86_400
COUNTERS = ("usage_s", "periods", "throttled_periods", "throttled_s")
API = WorkloadKey("shop", "api", "api")
BATCH = WorkloadKey("shop", "batch", "main")
WEB = WorkloadKey("ops", "web", "web")
IDLE = WorkloadKey("ops", "idle", "web")
EARLY = WorkloadKey("ops", "early", "job")
GONE = "api-7d9f-q8wzt"
"""An api pod that lived the first third of the history."""


def counter(lines: list[str], name: str, labels: str, rate: float, times: range) -> None:
    """A counter growing at ``rate`` per second from the first of ``times``."""
    lines.extend(f"{name}{{{labels}}} {rate * (t - times[0]):.6f} {t}" for t in times)


def gauge(lines: list[str], name: str, labels: str, value: float, times: range) -> None:
    lines.extend(f"{name}{{{labels}}} {value} {t}" for t in times)


def container(lines: list[str], labels: str, times: range, *, usage: float, throttled: float,
              histogram: Mapping[str, float] | None, agent_only: bool = False) -> None:  # fmt: skip
    """A container's four counters (10 periods/s) and, if given, the agent's histogram
    (windows per second at or under each ``le``)."""
    prefix = "unthrottle" if agent_only else "container"
    counter(lines, f"{prefix}_cpu_usage_seconds_total", labels, usage, times)
    counter(lines, f"{prefix}_cpu_cfs_periods_total", labels, 10, times)
    counter(lines, f"{prefix}_cpu_cfs_throttled_periods_total", labels, 10 * throttled, times)
    counter(lines, f"{prefix}_cpu_cfs_throttled_seconds_total", labels, throttled / 2, times)
    for le, per_s in (histogram or {}).items():
        counter(lines, "unthrottle_cpu_demand_cores_bucket", f'{labels},le="{le}"', per_s, times)


def history(start: int, end: int, step: int, early: tuple[int, int] | None = None) -> str:
    """Deployments in two namespaces from ``start`` to ``end``, a sample every ``step`` s:

    - shop/api: two pods all along, a third (GONE) for the first third; throttled half
      the time under 500m, the histogram says one window in ten wants ~1.1 cores;
    - shop/batch: cAdvisor only, steady 1.8 cores under 2;
    - ops/web: the agent only, mostly 0.2 core, one window in ten up to 0.75 core;
    - ops/idle: limits and requests, no CPU at all;
    - ops/early: a job whose one pod ran during ``early`` (start, end) only.
    """
    lines: list[str] = []
    every = range(start, end + 1, step)
    pods = {
        "shop": {"api-7d9f-a": ("api-7d9f", "api"), "api-7d9f-b": ("api-7d9f", "api"),
                 GONE: ("api-7d9f", "api"), "batch-1-xk9z2": ("batch-1", "batch")},
        "ops": {"web-5c-m2x7q": ("web-5c", "web"), "idle-1-h4b8n": ("idle-1", "idle")},
    }  # fmt: skip
    third = range(start, start + (end - start) // 3 + 1, step)
    for ns, owned in pods.items():
        for pod, (rs, deploy) in owned.items():
            gauge(lines, "kube_replicaset_owner", f'namespace="{ns}",replicaset="{rs}",'
                  f'owner_kind="Deployment",owner_name="{deploy}"', 1, every)  # fmt: skip
            gauge(lines, "kube_pod_owner", f'namespace="{ns}",pod="{pod}",owner_kind="ReplicaSet",'
                  f'owner_name="{rs}"', 1, third if pod == GONE else every)  # fmt: skip
    settings = [("shop", "api-7d9f-a", "api", 0.5, 0.25), ("shop", "api-7d9f-b", "api", 0.5, 0.25),
                ("shop", "batch-1-xk9z2", "main", 2, 1), ("ops", "web-5c-m2x7q", "web", 1, 0.5),
                ("ops", "idle-1-h4b8n", "web", 1, 0.1)]  # fmt: skip
    for ns, pod, name, limit, request in settings:
        for metric, value in (("limits", limit), ("requests", request)):
            gauge(lines, f"kube_pod_container_resource_{metric}",
                  f'namespace="{ns}",pod="{pod}",container="{name}",resource="cpu"', value,
                  every)  # fmt: skip
    api = {"0.25": 7, "0.5": 9, "1.0": 9, "1.25": 10, "+Inf": 10}
    for pod in ("api-7d9f-a", "api-7d9f-b", GONE):
        lived = third if pod == GONE else every
        container(lines, f'namespace="shop",pod="{pod}",container="api"', lived, usage=0.45,
                  throttled=0.5, histogram=api)  # fmt: skip
    container(lines, 'namespace="shop",pod="batch-1-xk9z2",container="main"', every,
              usage=1.8, throttled=0.01, histogram=None)  # fmt: skip
    web = {"0.1": 2, "0.2": 9, "0.5": 9.5, "0.75": 10, "1.0": 10, "+Inf": 10}
    container(lines, 'namespace="ops",pod="web-5c-m2x7q",container="web"', every, usage=0.2,
              throttled=0.0, histogram=web, agent_only=True)  # fmt: skip
    if early is not None:
        ran = range(early[0], early[1] + 1, step)
        gauge(lines, "kube_replicaset_owner", 'namespace="ops",replicaset="early-1",'
              'owner_kind="Deployment",owner_name="early"', 1, ran)  # fmt: skip
        gauge(lines, "kube_pod_owner", 'namespace="ops",pod="early-1-q7z2k",'
              'owner_kind="ReplicaSet",owner_name="early-1"', 1, ran)  # fmt: skip
        job = 'namespace="ops",pod="early-1-q7z2k",container="job"'
        gauge(lines, "kube_pod_container_resource_limits", f'{job},resource="cpu"', 1, ran)
        container(lines, job, ran, usage=0.9, throttled=0.2,
                  histogram={"0.5": 2, "1.0": 8, "+Inf": 10})  # fmt: skip
    return "\n".join(lines) + "\n"


def summed(slots: list[Slot]) -> dict[WorkloadKey, ContainerEvidence]:
    """The slots' increases added up per container (settings from the last slot)."""
    out: dict[WorkloadKey, ContainerEvidence] = {}
    for slot in slots:
        for key, item in slot.evidence.items():
            total = out.setdefault(key, ContainerEvidence(key))
            total.pods |= item.pods
            for name in COUNTERS:
                setattr(total, name, getattr(total, name) + getattr(item, name))
            for le, count in item.buckets.items():
                total.buckets[le] = total.buckets.get(le, 0.0) + count
            total.limit_millicores = item.limit_millicores
            total.request_millicores = item.request_millicores
    return out


Found = dict[WorkloadKey, ContainerEvidence]


def assert_same_evidence(got: Found, want: Found, rel: float = 0.01) -> None:
    """Counters and buckets within ``rel`` (``increase`` extrapolates at range edges)."""
    assert set(got) == set(want)
    for key, item in want.items():
        other = got[key]
        assert other.pods == item.pods, key
        assert (other.limit_millicores, other.request_millicores) == (
            item.limit_millicores, item.request_millicores), key  # fmt: skip
        for name in COUNTERS:
            assert getattr(other, name) == pytest.approx(getattr(item, name), rel=rel), (key, name)
        assert set(other.buckets) == set(item.buckets), key
        for le, count in item.buckets.items():
            assert other.buckets[le] == pytest.approx(count, rel=rel), (key, le)


def owners_known() -> Owners:
    """What the Kubernetes API would say of the pods (GONE is known by its name)."""
    owners = Owners(pods={("shop", "api-7d9f-a"): "api", ("shop", "api-7d9f-b"): "api"})
    owners.replicasets.update({("shop", "api-7d9f"): "api", ("shop", "batch-1"): "batch",
                               ("ops", "web-5c"): "web", ("ops", "idle-1"): "idle"})  # fmt: skip
    return owners
