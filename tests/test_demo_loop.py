"""`make demo`'s whole loop on the real kernel and a real control plane (its own, started by
the demo): Deployments rolled out onto a fake node, each pod's cgroups made as a kubelet makes
them, the agent naming them through the API and writing the burst, Prometheus, the operator
in Recommend then Apply mode with ``apply.method: InPlace``: the running pods resized, their
quota rewritten in the same cgroups, no pod restarted. It ends with throttling at or under
the policy's target, measured in the same pod's container cgroup. Root only (slow)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from prom import requires_prometheus

pytestmark = [pytest.mark.kernel, pytest.mark.slow, requires_prometheus]


def test_the_demo_ends_with_throttling_at_or_under_the_target(tmp_path: Path) -> None:
    out = tmp_path / "demo.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "demo" / "loop.py")],
        env={**os.environ, "UNTHROTTLE_DEMO_JSON": str(out)},
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "fake nodes (kwok) stood in for kubelets" in done.stdout
    assert re.search(r"real control plane: kube-apiserver, etcd, controller-manager, "
                     r"scheduler v1\.\d+\.\d+", done.stdout)  # fmt: skip
    assert "0 pods restarted: same pod UID, container ID and cgroup" in done.stdout
    doc = json.loads(out.read_text())
    for name, figures in doc["workloads"].items():
        before, after = figures["before"], figures["after"]
        # resized in place: the same pod, the same container in the same cgroup, never
        # restarted, with its limit raised, in the pod and in the kernel
        same = ("pod", "uid", "container_id", "cgroup")
        assert [after[k] for k in same] == [before[k] for k in same], figures
        assert before["restarts"] == after["restarts"] == 0, figures
        assert after["limit_millicores"] >= before["limit_millicores"], name
        assert after["kernel"]["cpus"] * 1000 == pytest.approx(after["limit_millicores"])
        assert after["kernel"].get("burst_ms", 0) * 1000 == pytest.approx(after["burst_us"])
        assert after["throttle_ratio"] <= doc["target"], (name, figures)
        # the agent named the pod's cgroup through the API: its name reached Prometheus
        assert f"shop/{after['pod']}/app" in doc["named"], (after["pod"], doc["named"])
    report = Path(doc["report"]).read_text()
    assert report.count("<svg") >= 1 and "pool" in report and "batch" in report
    # nothing left behind: no demo cgroup, no agent, no control plane
    assert not Path(doc["folder"]).exists()
    assert not [pid for pid in doc["pids"] if Path(f"/proc/{pid}").exists()], doc["pids"]
    assert not list(Path("/sys/fs/cgroup").glob("*/unthrottle-demo-*"))
    assert not list(Path("/sys/fs/cgroup").glob("unthrottle-demo-*"))
    # Throttled today, and so given more. The demo measures with the machine's other
    # processes at idle priority: beside a hog, without that, the bursts came slower and
    # could stay under the limit.
    for name, figures in doc["workloads"].items():
        before, after = figures["before"], figures["after"]
        assert before["throttle_ratio"] > doc["target"], name  # throttled today
        assert after["limit_millicores"] > before["limit_millicores"], name
