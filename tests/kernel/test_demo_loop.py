"""`make demo`'s whole loop on a real control plane and a real node (both its own, started by
the demo), with unthrottle installed as a user installs it: the image built from the
Dockerfile, the chart installed by Helm's Go SDK, the agent and the operator running as the
chart's pods. Deployments of the workload image scheduled onto the node, the kubelet's
cgroups (the pod-level quota too), the agent pod naming them and writing the burst,
Prometheus finding the pods and the kubelet's cAdvisor through the API server, the operator
pod in Recommend then Apply mode with ``apply.method: InPlace``: the running pods resized by
the real kubelet, no pod restarted, the operator's own verdict; then ``helm uninstall``
leaves nothing of the release. The figures are the kernel's counters of the cgroups the
kubelet made. Root only (slow: about 3 minutes, a minute more when the image is built)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from prom import requires_prometheus
from support.paths import ROOT

sys.path.insert(0, str(ROOT / "demo"))
from measuring import SPREAD

pytestmark = [pytest.mark.kernel, pytest.mark.slow, requires_prometheus]


def waited(figures: dict[str, Any]) -> tuple[float, float]:
    """Where a container's threads waited over a measurement of the demo, seconds: on its
    quotas (its cgroup's and its pod's throttled time), and behind other processes (the
    agent's count of its wait, the schedstat run delay, less that)."""
    assert figures["agent_wait_s"] is not None, ("the agent's wait was not scraped", figures)
    on_quota = figures["throttled_s"] + figures["pod_throttled_s"]
    return on_quota, max(0.0, figures["agent_wait_s"] - on_quota)


def test_the_demo_resizes_real_pods_and_reports_what_the_kernel_measured(
    tmp_path: Path,
) -> None:
    out = tmp_path / "demo.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "demo" / "loop.py")],
        # the logs (kubelet, containerd, control plane, the agent's and the operator's pods)
        # and the policy kept
        env={**os.environ, "UNTHROTTLE_DEMO_JSON": str(out),
             "UNTHROTTLE_DEMO_LOGS": str(tmp_path / "logs")},
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    kept = f"\n(logs kept in {tmp_path / 'logs'})"
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:] + kept
    # the closing line says what is real and what is not
    assert re.search(r"real: kube-apiserver, etcd, controller-manager, scheduler and a "
                     r"kubelet v1\.\d+\.\d+ with containerd, runc and kube-proxy; the chart "
                     r"installed by Helm's Go SDK, the agent and the operator as its pods",
                     done.stdout)  # fmt: skip
    assert "Not real: one node" in done.stdout
    assert "fake nodes" not in done.stdout and "stand-in" not in done.stdout
    assert "0 pods restarted: same pod UID, container ID and cgroup" in done.stdout
    # a user's own commands are shown, and the chart's pods as kubectl shows them
    assert "helm install unthrottle charts/unthrottle -n unthrottle" in done.stdout
    assert "--set operator.apply.inPlace.enabled=true" in done.stdout
    assert "$ kubectl get pods -n unthrottle" in done.stdout
    doc = json.loads(out.read_text())
    chart = doc["chart"]
    # both of the chart's pods were Running and Ready on the real node once installed
    pods = {p["component"]: p for p in chart["pods"]}
    assert set(pods) == {"agent", "operator"}, chart["pods"]
    for pod in pods.values():
        assert (pod["ready"], pod["phase"]) == ("1/1", "Running"), pod
        assert pod["restarts"] == 0, pod
    # the operator pod wrote the policy's status: its log shows the reconcile of shop/demo
    # and no process of the host did it (the demo starts none)
    logs = tmp_path / "logs"
    (operator_log,) = logs.glob(f"pods-{pods['operator']['name']}.log")
    assert "policy shop/demo:" in operator_log.read_text(), operator_log
    assert list(logs.glob(f"pods-{pods['agent']['name']}.log")), sorted(logs.iterdir())
    assert doc["status_managers"], doc["status_managers"]
    # helm uninstall left nothing of the release (its manifest's objects, anything labelled
    # with its instance)
    assert chart["left"] == [], chart["left"]
    cgroup_root = Path(doc["cgroup_root"])
    for name, figures in doc["workloads"].items():
        before, after = figures["before"], figures["after"]
        # resized in place by the kubelet: the same pod and container, never restarted,
        # its new limit in the container's cgroup and in the pod's (the sum of its limits)
        same = ("pod", "uid", "container_id")
        assert [after[k] for k in same] == [before[k] for k in same], figures
        assert before["restarts"] == after["restarts"] == 0, figures
        assert before["kernel"]["quota_us"] == before["limit_millicores"] * 100, figures
        assert after["kernel"]["quota_us"] == after["limit_millicores"] * 100, figures
        assert after["kernel"]["pod_quota_us"] == after["kernel"]["quota_us"], figures
        # the agent wrote the burst the operator's annotation asks for
        assert after["kernel"]["burst_us"] == after["burst_us"], figures
        # the agent named the kubelet's container; cAdvisor's series join on the same names
        assert f"shop/{after['pod']}/app" in doc["named"], (after["pod"], doc["named"])
        assert f"{after['pod']}/app" in doc["cadvisor"], doc["cadvisor"]
        # where the measured figures (the container's or the pod cgroup's) miss the target,
        # the demo says so
        missed = max(after["throttle_ratio"], after["pod_throttle_ratio"]) > doc["target"]
        said = [m for m in doc["misses"] if m.startswith(f"{name}: its")]
        assert missed == bool(said), doc["misses"]
        # what a reviewer read before Apply, the expected range in the policy's status,
        # holds what the kernel then counted, within the demo's stated spread (issue 41)
        span = figures["expected_throttle_ratio_range"]
        assert span is not None, (name, doc["recommended"])
        low, high = span
        assert low - SPREAD <= after["throttle_ratio"] <= high + SPREAD, (name, span, after)
        assert not [m for m in doc["misses"] if m.startswith(f"{name}: the operator expected")]
        # whether resized or left, the kernel's counters of its container and of its pod
        # cgroup meet the target after the operator's Apply run (README: "0 % after")
        assert after["throttle_ratio"] <= doc["target"], (name, after, doc["misses"])
        assert after["pod_throttle_ratio"] <= doc["target"], (name, after, doc["misses"])
        if name in doc["left"]:
            # left as it is by Apply mode: the documented case of a node busy with other
            # work (docs/recommend.md, "Busy nodes"), held to what the demo measured, not
            # to the operator's word alone: today its threads waited behind other processes
            # longer than on its quotas (the agent's wait less the container's and the pod's
            # throttled time), and the kernel did not throttle it past the target (above)
            left = doc["left"][name]
            assert left["state"] == "UpToDate", left
            assert left["throttle_ratio"] <= doc["target"], left
            assert any("the node is oversubscribed" in r for r in left["reasons"]), left
            assert after["limit_millicores"] == before["limit_millicores"], name
            on_quota, behind_others = waited(before)
            why = f"behind others {behind_others:.1f} s, on its quotas {on_quota:.1f} s"
            assert behind_others > on_quota, (name, why, before)
            continue
        # throttled today (in the container's counters), and so given more: the operator's
        # own verdict on its canary is that it applied (a rollback is a miss)
        assert before["throttle_ratio"] > doc["target"], (name, figures)
        assert after["limit_millicores"] > before["limit_millicores"], name
        assert doc["verdicts"][name]["verdict"] == "Applied", doc["verdicts"]
    # the demo resizes at least one running pod (the pool is throttled at 600m even beside
    # a CPU hog)
    assert len(doc["left"]) < len(doc["workloads"]), doc["left"]
    report = Path(doc["report"]).read_text()
    assert report.count("<svg") >= 1 and "pool" in report and "batch" in report
    # nothing left behind: no node cgroup, no process, no folder
    assert not Path(doc["folder"]).exists()
    assert not [pid for pid in doc["pids"] if Path(f"/proc/{pid}").exists()], doc["pids"]
    assert not cgroup_root.exists()
