"""`make demo`'s recommend part shows what its known demand implies (a real Prometheus)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from prom import requires_prometheus

DEMO = Path(__file__).resolve().parents[2] / "demo" / "recommend_demo.py"


@requires_prometheus
def test_the_recommend_demo_sizes_the_shop_as_its_demand_implies() -> None:
    out = subprocess.run([sys.executable, str(DEMO), "--format", "json"], capture_output=True,
                         text=True, timeout=120, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout[out.stdout.index("\n{") :])
    shop = {w["deployment"]: w["containers"][0] for w in doc["workloads"]}
    assert next(iter(shop)) == "checkout"  # the most harmful first
    checkout, catalog, search, cron = (shop[n] for n in ("checkout", "catalog", "search", "cron"))
    # a 1.2-core burst in one window in ten, under 500m: throttled 10 %, sized above 500m
    assert abs(checkout["throttle_ratio"] - 0.10) < 0.01
    assert 1200 <= checkout["demand"]["p99_millicores"] <= 1500
    rec = checkout["recommendation"]
    assert rec["limit_millicores"] > 500 and rec["expected_throttle_ratio"] <= 0.05
    # steady 0.6 core under 1 CPU: not throttled, and a smaller limit (one step) will do
    assert catalog["throttle_ratio"] == 0 and catalog["recommendation"]["limit_millicores"] < 1000
    assert abs(search["throttle_ratio"] - 0.03) < 0.01
    assert cron["evidence"] == "none" and cron["recommendation"] is None
