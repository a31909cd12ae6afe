"""How many queries ``unthrottle recommend`` sends, counted by a real Prometheus.

    .venv/bin/python bench/recommend_queries.py --save bench/results/recommend-queries.json

Runs the real command twice against a real Prometheus (empty: the count of queries
does not depend on the data) and reads Prometheus's own request counters
(``prometheus_http_requests_total`` on its ``/metrics``) before and after each:

- ``recommend --no-cluster``: owners from kube-state-metrics, so two queries more;
- ``recommend`` with a kubeconfig for the real control plane of docs/benchmarks.md §12:
  owners and Deployments from the Kubernetes API.

Either way one small query first asks whether unthrottle's recording rules cover the
window (``--history auto``, the default); ``--history raw`` skips it.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from unthrottle_lab.kube import ControlPlane, ensure_built
from unthrottle_lab.prometheus import PrometheusServer

UNTHROTTLE = Path(sys.executable).with_name("unthrottle")
HANDLERS = ("/api/v1/query", "/api/v1/query_range")


def requests(url: str) -> dict[str, int]:
    """Prometheus's own count of API requests, per handler."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    counts = dict.fromkeys(HANDLERS, 0)
    for line in text.splitlines():
        found = re.match(r"prometheus_http_requests_total\{(.*)\} (\S+)", line)
        if found:
            handler = re.search(r'handler="([^"]*)"', found.group(1))
            if handler and handler.group(1) in counts:
                counts[handler.group(1)] += int(float(found.group(2)))
    return counts


def count(url: str, argv: list[str]) -> dict[str, Any]:
    before = requests(url)
    done = subprocess.run(
        [str(UNTHROTTLE), "recommend", "--prometheus", url, *argv],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    after = requests(url)
    sent = {h: after[h] - before[h] for h in HANDLERS}
    return {
        "argv": ["recommend", *("KUBECONFIG" if a.endswith("kubeconfig") else a for a in argv)],
        "exit": done.returncode,
        "said": (done.stderr.strip().splitlines() or [""])[-1],
        "instant_queries": sent["/api/v1/query"],
        "range_queries": sent["/api/v1/query_range"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save", type=Path, help="write the counts to this JSON file")
    args = parser.parse_args()
    result: dict[str, Any] = {"measured": time.strftime("%Y-%m-%d"),
                              "command": "bench/recommend_queries.py"}  # fmt: skip
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        (folder / "prometheus").mkdir()
        with PrometheusServer(folder / "prometheus") as prometheus:
            result["prometheus"] = prometheus.url.rsplit(":", 1)[0]
            result["no_cluster"] = count(prometheus.url, ["--no-cluster", "--window", "1h"])
            result["no_cluster_raw_history"] = count(
                prometheus.url, ["--no-cluster", "--window", "1h", "--history", "raw"]
            )
            (folder / "kube").mkdir()
            plane = ControlPlane(folder / "kube", binaries=ensure_built())
            try:
                plane.start()
                result["control_plane"] = plane.version
                result["with_cluster"] = count(
                    prometheus.url, ["--kubeconfig", str(plane.kubeconfig), "--window", "1h"]
                )
            finally:
                plane.stop()
    print(json.dumps(result, indent=1))
    if args.save:
        args.save.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
