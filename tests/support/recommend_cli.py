"""What test_recommend_cli.py shares with other test modules: constants, helpers and
fixtures (and the tests another module runs again), so that no test module imports
another."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from kube import Kube, fresh_name
from prom import PrometheusServer, requires_prometheus
from support.metrics_evidence import (
    GONE,
    history,
)
from unthrottle_lab.kube import ControlPlane

UNTHROTTLE = Path(sys.executable).with_name("unthrottle")
DEPLOYMENTS = "apps/v1/deployments"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(UNTHROTTLE), "recommend", *args], capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with PrometheusServer(tmp_path_factory.mktemp("prom"), openmetrics=cli_history()) as prom:
        yield prom.url


def cli_history() -> str:
    """The hour these tests read (test_victoria_cli.py serves it from VictoriaMetrics)."""
    extra = "\n".join(  # a namespace with cAdvisor only: no agent there
        f'container_cpu_cfs_periods_total{{namespace="other",pod="w-1-a",container="w"}} '
        f"{i * 150} {int(time.time()) - 3600 + i * 15}"
        for i in range(240)
    )
    owners = "\n".join(
        f'kube_pod_owner{{namespace="other",pod="w-1-a",owner_kind="ReplicaSet",'
        f'owner_name="w-1"}} 1 {int(time.time()) - 3600 + i * 15}\n'
        f'kube_replicaset_owner{{namespace="other",replicaset="w-1",owner_kind="Deployment",'
        f'owner_name="w"}} 1 {int(time.time()) - 3600 + i * 15}'
        for i in range(240)
    )
    silent = "\n".join(  # a Deployment with owners and limits, but no CPU counters at all
        f'kube_pod_owner{{namespace="silent",pod="s-1-a",owner_kind="ReplicaSet",'
        f'owner_name="s-1"}} 1 {int(time.time()) - 3600 + i * 15}\n'
        f'kube_replicaset_owner{{namespace="silent",replicaset="s-1",owner_kind="Deployment",'
        f'owner_name="s"}} 1 {int(time.time()) - 3600 + i * 15}\n'
        f'kube_pod_container_resource_limits{{namespace="silent",pod="s-1-a",container="s",'
        f'resource="cpu"}} 1 {int(time.time()) - 3600 + i * 15}'
        for i in range(240)
    )
    labels = "\n".join(  # kube-state-metrics with --metric-labels-allowlist=deployments=[tier]
        f'kube_deployment_labels{{namespace="shop",deployment="{deploy}",label_tier="{tier}"}} '
        f"1 {int(time.time()) - 3600 + i * 15}"
        for i in range(240)
        for deploy, tier in (("api", "front"), ("batch", "back"), ("idle", "front"))
    )
    return history(int(time.time())) + "\n".join((extra, owners, silent, labels)) + "\n"


@requires_prometheus
def test_json_has_every_workload_most_harmful_first(prometheus: str) -> None:
    out = cli("--prometheus", prometheus, "--no-cluster", "--namespace", "shop",
              "--window", "1h", "--format", "json")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "querying" not in out.stderr  # no progress display when stderr is not a terminal
    doc = json.loads(out.stdout)
    assert set(doc) >= {"generated_at", "window", "target", "workloads"}
    names = [w["deployment"] for w in doc["workloads"]]
    assert names[0] == "api" and set(names) == {"api", "batch", "idle"}
    api = doc["workloads"][0]["containers"][0]
    assert set(api) >= {"name", "current", "throttle_ratio", "evidence", "recommendation"}
    assert api["evidence"] == "period" and api["current"]["limit_millicores"] == 500
    # the agent's windows: 7 in 10 under 0.25 core, 2 under 0.5, 1 in (1, 1.25]
    assert api["demand"]["p50_millicores"] == pytest.approx(250 * 5 / 7, abs=2)
    assert 1000 < api["demand"]["p99_millicores"] <= 1250
    assert api["demand"]["max_millicores"] == 1250
    rec = api["recommendation"]
    assert set(rec) >= {"limit_millicores", "burst_us", "gomaxprocs", "expected_throttle_ratio",
                        "confidence", "reasons"}  # fmt: skip
    assert rec["limit_millicores"] > 500 and rec["expected_throttle_ratio"] <= 0.05
    idle = next(w for w in doc["workloads"] if w["deployment"] == "idle")["containers"][0]
    assert idle["evidence"] == "none" and idle["recommendation"] is None


@requires_prometheus
def test_yaml_and_csv_carry_the_same_workloads(prometheus: str, tmp_path: Path) -> None:
    base = ["--prometheus", prometheus, "--no-cluster", "--namespace", "shop", "--window", "1h"]
    as_yaml = yaml.safe_load(cli(*base, "--format", "yaml").stdout)
    assert {w["deployment"] for w in as_yaml["workloads"]} == {"api", "batch", "idle"}
    target = tmp_path / "out.csv"
    assert cli(*base, "--format", "csv", "--output", str(target)).returncode == 0
    rows = list(csv.DictReader(io.StringIO(target.read_text())))
    assert {r["deployment"] for r in rows} == {"api", "batch", "idle"}
    api = next(r for r in rows if r["deployment"] == "api")
    assert api["current_limit"] == "500m" and api["demand_p99_max"].endswith("/ 1250m")
    # the whole chain of reasons, and its last step as the one-line reason
    assert "headroom" in api["reasons"] and api["reason"] == api["reasons"].split(" | ")[-1]
    table = cli(*base).stdout
    assert "api" in table and "recommended limit" in table and "demand p99 / max" in table


@requires_prometheus
def test_without_agent_series_it_falls_back_to_counters_and_says_so(prometheus: str) -> None:
    out = cli("--prometheus", prometheus, "--no-cluster", "--namespace", "other",
              "--window", "1h", "--format", "json")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "no unthrottle agent series" in out.stderr
    container = json.loads(out.stdout)["workloads"][0]["containers"][0]
    assert container["evidence"] == "counters"


@requires_prometheus
def test_deployments_without_cpu_counters_name_the_missing_scrapes(prometheus: str) -> None:
    out = cli("--prometheus", prometheus, "--no-cluster", "--namespace", "silent", "--window", "1h")
    assert out.returncode == 1
    assert "no CPU counters for the Deployments in silent" in out.stderr
    assert "/metrics/cadvisor" in out.stderr and "agent" in out.stderr


@dataclass(frozen=True)
class ClusterShop:
    """The shop's api, batch and fresh Deployments on the real control plane, and the hour of
    history of test_metrics_evidence with its pods named as the real controllers named
    them: api's two live pods and one gone (found by its ReplicaSet's name), batch's one;
    ``idle`` has series but is no Deployment here."""

    namespace: str
    kubeconfig: Path
    url: str

    def recommend(self, *args: str) -> subprocess.CompletedProcess[str]:
        return cli("--prometheus", self.url, "--kubeconfig", str(self.kubeconfig),
                   "--namespace", self.namespace, "--window", "1h", *args)  # fmt: skip


def _renamed(text: str, names: dict[str, str]) -> str:
    """``text`` with each quoted label value ``"old"`` written ``"new"``."""
    pattern = re.compile("|".join(re.escape(f'"{old}"') for old in names))
    return pattern.sub(lambda m: f'"{names[m.group(0)[1:-1]]}"', text)


@pytest.fixture(scope="module")
def cluster_shop(
    control_plane: ControlPlane, history_server: type[PrometheusServer],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ClusterShop]:  # fmt: skip
    kube = Kube(control_plane)
    ns = fresh_name("shop")
    kube.create_namespace(ns)
    api = {"name": "api", "resources": {"limits": {"cpu": "500m"}, "requests": {"cpu": "250m"}},
           "env": [{"name": "GOMAXPROCS", "value": "8"}]}  # fmt: skip
    # a burst asked in the pod template: today's setting, as the agent writes it
    burst = {"unthrottle.io/cpu-burst": "api=20ms"}
    kube.create(DEPLOYMENTS, workload(ns, "api", [api], replicas=2, labels={"tier": "front"},
                                      annotations=burst))  # fmt: skip
    kube.create(DEPLOYMENTS, workload(ns, "batch", [{"name": "main", "resources": {
        "limits": {"cpu": "2"}}}], labels={"tier": "back"}))  # fmt: skip
    kube.create(DEPLOYMENTS, workload(ns, "fresh", [{"name": "web"}]))
    names = {"shop": ns}
    for deploy, old_rs, old_pods in (("api", "api-7d9f", ["api-7d9f-a", "api-7d9f-b"]),
                                     ("batch", "batch-1", ["batch-1-x"])):  # fmt: skip
        rs = kube.replicaset_of(kube.rolled_out(ns, deploy))
        names[old_rs] = rs["metadata"]["name"]
        live = sorted(p["metadata"]["name"] for p in kube.pods_of(rs))
        names.update(zip(old_pods, live, strict=True))
    names[GONE] = f"{names['api-7d9f']}-{GONE.rsplit('-', 1)[1]}"  # its pod is gone
    kube.rolled_out(ns, "fresh")
    folder = tmp_path_factory.mktemp("cluster")
    with history_server(folder, openmetrics=_renamed(history(int(time.time())), names)) as server:
        yield ClusterShop(ns, kube.kubeconfig(folder / "kubeconfig"), server.url)
    kube.delete("v1/namespaces", None, ns)


def workload(namespace: str, name: str, containers: list[dict[str, Any]], *, replicas: int = 1,
             labels: dict[str, str] | None = None,
             annotations: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """A Deployment as the API server takes it (a selector, an image per container)."""
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"namespace": namespace, "name": name, "labels": labels or {}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}, "annotations": annotations or {}},
                "spec": {"containers": [{"image": f"registry.example/{c['name']}:1", **c}
                                        for c in containers]},
            },
        },
    }  # fmt: skip


@requires_prometheus
def test_cluster_mode_takes_deployments_and_gomaxprocs_from_the_api(
    cluster_shop: ClusterShop,
) -> None:
    out = cluster_shop.recommend("--format", "json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    # the API is the source of truth: "fresh" has no series yet, "idle" is not a Deployment here
    assert {w["deployment"] for w in doc["workloads"]} == {"api", "batch", "fresh"}
    assert {w["namespace"] for w in doc["workloads"]} == {cluster_shop.namespace}
    api = next(w for w in doc["workloads"] if w["deployment"] == "api")["containers"][0]
    assert api["pods"] == 3  # the two live pods and the gone one
    assert api["current"] == {"limit_millicores": 500, "request_millicores": 250,
                              "burst_us": 20_000, "gomaxprocs": 8}  # fmt: skip
    rec = api["recommendation"]
    assert rec["gomaxprocs"] == max(2, -(-rec["limit_millicores"] // 1000))
    assert any("keep the explicit value in step" in r for r in rec["reasons"])
    assert any("turns off Go ≥ 1.25's own sizing" in r for r in rec["reasons"])
    fresh = next(w for w in doc["workloads"] if w["deployment"] == "fresh")["containers"][0]
    assert fresh["evidence"] == "none" and fresh["recommendation"] is None


@requires_prometheus
def test_a_selector_chooses_deployments_from_kube_state_metrics_labels(prometheus: str) -> None:
    out = cli("--prometheus", prometheus, "--no-cluster", "--namespace", "shop",
              "--window", "1h", "--format", "json", "-l", "tier in (front),tier!=back")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert {w["deployment"] for w in json.loads(out.stdout)["workloads"]} == {"api", "idle"}
    # no kube_deployment_labels for "other": say what kube-state-metrics must be allowed
    out = cli("--prometheus", prometheus, "--no-cluster", "--namespace", "other", "-l", "tier")
    assert out.returncode == 1
    assert "--metric-labels-allowlist=deployments" in out.stderr
    out = cli("--prometheus", prometheus, "--no-cluster", "--namespace", "shop", "-l", "tier=nope")
    assert out.returncode == 1
    assert ("no Deployments, StatefulSets or DaemonSets found in shop matching 'tier=nope'"
            in out.stderr)  # fmt: skip


@requires_prometheus
def test_top_keeps_the_most_harmful_and_says_how_many_were_left_out(prometheus: str) -> None:
    out = cli("--prometheus", prometheus, "--no-cluster", "--namespace", "shop",
              "--window", "1h", "--format", "json", "--top", "1")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert [w["deployment"] for w in json.loads(out.stdout)["workloads"]] == ["api"]
    assert "the 1 most harmful of 3 Deployments" in out.stderr
