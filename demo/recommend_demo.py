"""The `unthrottle recommend` demo: a day of a small shop's history in a real Prometheus.

    .venv/bin/python demo/recommend_demo.py [--format json …]   (run by `make demo`)

Extra arguments go to `unthrottle recommend`.

Four Deployments with known demand, 100 ms window by window, as the agent would
have seen it, plus cAdvisor's counters and kube-state-metrics' owners, limits
and requests, one sample a minute for a day. promtool backfills them into a
Prometheus started here on 127.0.0.1 (Debian's, installed by `make demo` as
root); `unthrottle recommend --no-cluster` reads them back like a user would,
and Prometheus is stopped by PID. Expect:

- checkout: quiet, then a 1.2-core burst in one window in ten, under 500m:
  throttled in 10 % of periods, and a p99 window near 1.3 cores;
- catalog: a steady 0.6 core under 1 CPU: fine already, a smaller limit does;
- search: a 0.9-core burst in 3 % of windows under 800m;
- cron: idle, no evidence, no recommendation.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from cluster_query import BOUNDS, backlog_rates, cdf  # noqa: E402
from unthrottle.agent.sampling import BUCKETS_CORES  # noqa: E402
from unthrottle_lab.prometheus import PrometheusServer  # noqa: E402

DAY, STEP = 86_400, 60
SHOP = {  # deployment: (base cores, burst share, burst cores, limit cores, pods)
    "checkout": (0.1, 0.10, 1.2, 0.5, 3),
    "catalog": (0.3, 0.0, 0.0, 1.0, 2),
    "search": (0.2, 0.03, 0.9, 0.8, 2),
    "cron": (0.0, 0.0, 0.0, 0.25, 1),
}


def history(end: int) -> str:
    """OpenMetrics text for the shop, one sample a minute until ``end``."""
    lines: list[str] = []
    times = range(end - DAY, end + 1, STEP)

    def emit(name: str, labels: str, value_at: object) -> None:
        assert callable(value_at)
        lines.extend(f"{name}{{{labels}}} {value_at(t - end + DAY):.10g} {t}" for t in times)

    for deploy, (base, share, burst, limit, pods) in SHOP.items():
        rs = f"{deploy}-7c9d8f"
        emit("kube_replicaset_owner", f'namespace="shop",replicaset="{rs}",'
             f'owner_kind="Deployment",owner_name="{deploy}"', lambda _: 1)  # fmt: skip
        for p in range(pods):
            pod = f"{rs}-{'bcdfg'[p]}2x4k"
            labels = f'namespace="shop",pod="{pod}",container="{deploy}"'
            emit("kube_pod_owner", f'namespace="shop",pod="{pod}",owner_kind="ReplicaSet",'
                 f'owner_name="{rs}"', lambda _: 1)  # fmt: skip
            for metric, value in (("limits", limit), ("requests", limit / 2)):
                emit(f"kube_pod_container_resource_{metric}", f'{labels},resource="cpu"',
                     lambda _, v=value: v)  # fmt: skip
            if base == 0:
                continue  # cron: no CPU at all, so no cgroup activity to count
            throttled = 1 - cdf(base, share, burst, limit)
            mean = (1 - share) * base + share * burst
            for metric, rate in (("usage_seconds", min(mean, limit)), ("cfs_periods", 10.0),
                                 ("cfs_throttled_periods", 10 * throttled),
                                 ("cfs_throttled_seconds", 10 * throttled * 0.05)):  # fmt: skip
                emit(f"container_cpu_{metric}_total", labels, lambda s, r=rate: r * s)
            for le, bound in zip(BOUNDS, (*BUCKETS_CORES, math.inf), strict=True):
                rate = 10 * cdf(base, share, burst, bound)
                emit("unthrottle_cpu_demand_cores_bucket", f'{labels},le="{le}"',
                     lambda s, r=rate: r * s)  # fmt: skip
            for name, extra, rate in backlog_rates(base, share, burst):  # a current agent's
                emit(name, f"{labels},{extra}" if extra else labels, lambda s, r=rate: r * s)
    return "\n".join(lines) + "\n"


def main() -> int:
    if shutil.which("prometheus") is None or shutil.which("promtool") is None:
        print("recommend demo skipped: prometheus is not installed (make demo installs it as root)")
        return 0
    with tempfile.TemporaryDirectory(prefix="unthrottle-demo-") as folder:
        end = int(time.time()) // STEP * STEP
        with PrometheusServer(Path(folder), openmetrics=history(end)) as prom:
            print(f"\nunthrottle recommend on a day of a small shop's history ({prom.url}):\n")
            args = ["--prometheus", prom.url, "--no-cluster", "--window", "1d", *sys.argv[1:]]
            command = [str(Path(sys.executable).with_name("unthrottle")), "recommend", *args]
            print("$ unthrottle recommend --prometheus URL --no-cluster --window 1d", flush=True)
            return subprocess.run(command, check=False).returncode


if __name__ == "__main__":
    raise SystemExit(main())
