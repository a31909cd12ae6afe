"""What test_metrics_evidence.py shares with other test modules: constants, helpers and
fixtures (and the tests another module runs again), so that no test module imports
another."""

from __future__ import annotations

HOUR = 3600
STEP = 15
GONE = "api-7d9f-q8wzt"
"""An api pod that lived the first half hour (a name as the ReplicaSet controller makes)."""


def series(lines: list[str], name: str, labels: str, rate: float, now: int,
           start: int = 0, stop: int = HOUR) -> None:  # fmt: skip
    """A counter growing at ``rate`` per second between ``start`` and ``stop`` (seconds ago)."""
    for ago in range(HOUR, -1, -STEP):
        if HOUR - start >= ago >= HOUR - stop:
            lines.append(f"{name}{{{labels}}} {rate * (HOUR - ago - start)} {now - ago}")


def gauge(lines: list[str], name: str, labels: str, value: float, now: int,
          stop: int = HOUR) -> None:  # fmt: skip
    """A gauge from an hour ago until ``stop`` seconds into the hour."""
    for ago in range(HOUR, HOUR - stop - 1, -STEP):
        lines.append(f"{name}{{{labels}}} {value} {now - ago}")


LEVELS = ("0.1", "0.25", "0.5", "1", "2", "4", "8")
OVERS = ("0", "0.25", "0.5", "1", "2")
API_BACKLOG = {(level, over): 0 for level in LEVELS for over in OVERS}
API_BACKLOG.update({(level, over): 10 for level in ("0.1", "0.25") for over in OVERS})
API_BACKLOG.update({("0.5", "0"): 4, ("0.5", "0.25"): 3, ("0.5", "0.5"): 2, ("0.5", "1"): 1})
API_BACKLOG[("1", "0")] = 1
"""Windows per second whose backlog above a level (cores) passed a threshold (quotas)."""


def history(now: int) -> str:
    lines: list[str] = []
    gauge(lines, "kube_replicaset_owner", 'namespace="shop",replicaset="api-7d9f",'
          'owner_kind="Deployment",owner_name="api"', 1, now)  # fmt: skip
    gauge(lines, "kube_replicaset_owner", 'namespace="shop",replicaset="batch-1",'
          'owner_kind="Deployment",owner_name="batch"', 1, now)  # fmt: skip
    gauge(lines, "kube_replicaset_owner", 'namespace="shop",replicaset="idle-1",'
          'owner_kind="Deployment",owner_name="idle"', 1, now)  # fmt: skip
    pods = {"api-7d9f-a": "api-7d9f", "api-7d9f-b": "api-7d9f", GONE: "api-7d9f",
            "batch-1-x": "batch-1", "idle-1-y": "idle-1"}  # fmt: skip
    for pod, rs in pods.items():  # GONE was deleted half-way: its series stop there
        gauge(lines, "kube_pod_owner", f'namespace="shop",pod="{pod}",owner_kind="ReplicaSet",'
              f'owner_name="{rs}"', 1, now, stop=HOUR // 2 if pod == GONE else HOUR)  # fmt: skip
    resources = [
        ("api-7d9f-a", "api", 0.5, 0.25),
        ("api-7d9f-b", "api", 0.5, 0.25),
        ("batch-1-x", "main", 2, 1),
        ("idle-1-y", "web", 1, 0.1),
    ]
    for pod, container, limit, request in resources:
        for metric, value in (("limits", limit), ("requests", request)):
            gauge(lines, f"kube_pod_container_resource_{metric}",
                  f'namespace="shop",pod="{pod}",container="{container}",resource="cpu"',
                  value, now)  # fmt: skip
    # api: three pods, "c" only in the first half hour (churn); 10 periods/s, half throttled
    for pod, stop in (("api-7d9f-a", HOUR), ("api-7d9f-b", HOUR), (GONE, HOUR // 2)):
        labels = f'namespace="shop",pod="{pod}",container="api"'
        series(lines, "container_cpu_usage_seconds_total", labels, 0.45, now, stop=stop)
        series(lines, "container_cpu_cfs_periods_total", labels, 10, now, stop=stop)
        series(lines, "container_cpu_cfs_throttled_periods_total", labels, 5, now, stop=stop)
        series(lines, "container_cpu_cfs_throttled_seconds_total", labels, 0.3, now, stop=stop)
        # the agent: per 10 windows/s, 7 under 0.25 core, 2 under 0.5, 1 around 1.1 cores
        cumulative = {"0.25": 7, "0.5": 9, "1.0": 9, "1.25": 10, "+Inf": 10}
        for le, per_s in cumulative.items():
            series(lines, "unthrottle_cpu_demand_cores_bucket", f'{labels},le="{le}"', per_s, now,
                   stop=stop)  # fmt: skip
        # … and its backlog: the 1.1-core window stands apart, the bucket refills after it
        for (level, over), per_s in API_BACKLOG.items():
            series(lines, "unthrottle_cpu_demand_backlog_windows_total",
                   f'{labels},level="{level}",over="{over}"', per_s, now, stop=stop)  # fmt: skip
        series(lines, "unthrottle_cpu_active_windows_total", labels, 10, now, stop=stop)
    # batch: cAdvisor only, steady 1.8 cores, hardly throttled
    labels = 'namespace="shop",pod="batch-1-x",container="main"'
    series(lines, "container_cpu_usage_seconds_total", labels, 1.8, now)
    series(lines, "container_cpu_cfs_periods_total", labels, 10, now)
    series(lines, "container_cpu_cfs_throttled_periods_total", labels, 0.1, now)
    # a bare pod (no owner) and the pause container are not Deployment containers
    series(lines, "container_cpu_cfs_periods_total", 'namespace="shop",pod="bare",container="x"',
           10, now)  # fmt: skip
    series(lines, "container_cpu_cfs_periods_total",
           'namespace="shop",pod="api-7d9f-a",container="POD"', 10, now)  # fmt: skip
    return "\n".join(lines) + "\n"
