"""`unthrottle report` and `unthrottle recommend --format markdown|html|kustomize` as a user
runs them: the report ConfigMap read from the real Kubernetes API server, recommendations
from a real Prometheus."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kube import Kube, fresh_name
from kube_faults import FaultProxy
from prom import requires_prometheus
from report_size import synthetic
from unthrottle.report import Report
from unthrottle.report.kustomize import MARKER
from unthrottle_lab.kube import ControlPlane

UNTHROTTLE = Path(sys.executable).with_name("unthrottle")
POLICIES = "unthrottle.io/v1alpha1/throttlepolicies"


def run(*args: str, kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)} if kubeconfig else dict(os.environ)
    return subprocess.run([str(UNTHROTTLE), *args], capture_output=True, text=True, timeout=120,
                          check=False, env=env)  # fmt: skip


def operator_document(deployments: int, *, shown: int | None = None,
                      namespace: str = "shop") -> dict[str, Any]:  # fmt: skip
    """``report.json`` as the operator writes it: the scan's JSON, the policy, a state per
    Deployment, and ``truncated`` when cut to fit."""
    doc = synthetic(deployments, 2).to_json("7d")
    doc["policy"] = {"namespace": namespace, "name": "pay"}
    for w in doc["workloads"]:
        w["state"] = "Recommended" if w["containers"][0]["recommendation"] else "NoData"
    if shown is not None:
        doc["truncated"] = {"shown": shown, "left_out": len(doc["workloads"]) - shown}
        doc["workloads"] = doc["workloads"][:shown]
    return doc


def _configmap(namespace: str, name: str, data: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"namespace": namespace, "name": name,
                         "labels": {"app.kubernetes.io/managed-by": "unthrottle"}},
            "data": data}  # fmt: skip


def _policy(namespace: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "unthrottle.io/v1alpha1", "kind": "ThrottlePolicy",
            "metadata": {"namespace": namespace, "name": name}, "spec": {}}  # fmt: skip


class Cluster:
    """The policies and their report ConfigMaps on the control plane, in ``namespace``; a
    kubeconfig whose context names it; pay's document."""

    def __init__(self, kube: Kube, kubeconfig: Path, namespace: str,
                 doc: dict[str, Any]) -> None:  # fmt: skip
        self.kube, self.kubeconfig, self.namespace, self.doc = kube, kubeconfig, namespace, doc

    def report(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``unthrottle report ARGS -n NAMESPACE``."""
        return run("report", *args, "-n", self.namespace, kubeconfig=self.kubeconfig)


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, control_plane: ControlPlane,
    throttlepolicy_crd: None,
) -> Iterator[Cluster]:  # fmt: skip
    kube = Kube(control_plane)
    ns = fresh_name("shop")
    kube.create_namespace(ns)
    doc = operator_document(24, namespace=ns)
    for name in ("pay", "web", "new", "odd"):
        kube.create(POLICIES, _policy(ns, name))
    kube.create("v1/configmaps", _configmap(ns, "pay-report", {
        "report.json": json.dumps(doc, indent=1), "report.md": "# unthrottle"}))  # fmt: skip
    kube.create("v1/configmaps", _configmap(ns, "web-report", {
        "report.json": json.dumps(operator_document(40, shown=10, namespace=ns))}))  # fmt: skip
    kube.create("v1/configmaps", _configmap(ns, "odd-report", {"report.json": '{"window": 3}'}))
    folder = tmp_path_factory.mktemp("kube")
    yield Cluster(kube, kube.kubeconfig(folder / "kubeconfig", namespace=ns), ns, doc)
    kube.delete("v1/namespaces", None, ns)


class TestReportCommand:
    def test_markdown_by_default_names_every_deployment(self, cluster: Cluster) -> None:
        out = cluster.report("pay")
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith(f"# unthrottle: policy {cluster.namespace}/pay")
        for w in cluster.doc["workloads"]:
            assert f"{w['namespace']}/{w['deployment']}" in out.stdout
        assert "(Recommended)" in out.stdout and f"policy {cluster.namespace}/pay" in out.stdout

    def test_the_namespace_defaults_to_the_contexts(self, cluster: Cluster) -> None:
        out = run("report", "pay", "--format", "json", kubeconfig=cluster.kubeconfig)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == cluster.doc  # the ConfigMap's document, unchanged

    def test_html_is_written_where_asked(self, cluster: Cluster, tmp_path: Path) -> None:
        target = tmp_path / "pay.html"
        out = cluster.report("pay", "--format", "html", "--output", str(target))
        assert out.returncode == 0, out.stderr and out.stdout == ""
        text = target.read_text()
        over = len(Report.from_json(cluster.doc).over_target())
        assert len(re.findall(r"<svg\b", text)) == over > 0
        assert f"<title>unthrottle: policy {cluster.namespace}/pay</title>" in text

    def test_kustomize_writes_a_component_and_replaces_only_its_own_files(
        self, cluster: Cluster, tmp_path: Path
    ) -> None:
        folder = tmp_path / "unthrottle"
        folder.mkdir()
        (folder / "shop--gone.yaml").write_text(f"{MARKER}\n# an earlier run's patch\n")
        (folder / "notes.yaml").write_text("# the team's own file\n")
        out = cluster.report("pay", "--format", "kustomize", "--output", str(folder))
        assert out.returncode == 0, out.stderr
        component = yaml.safe_load((folder / "kustomization.yaml").read_text())
        assert component["kind"] == "Component"
        assert {p["path"] for p in component["patches"]} | {"kustomization.yaml", "notes.yaml"} == {
            p.name for p in folder.iterdir()}  # fmt: skip
        assert "wrote" in out.stderr

    def test_a_truncated_report_says_so(self, cluster: Cluster) -> None:
        out = cluster.report("web")
        assert out.returncode == 0, out.stderr
        assert "the report holds the 10 most harmful Deployments; 30 more" in out.stderr
        assert "… and 30 more Deployments, left out for size" in out.stdout

    @pytest.mark.parametrize(
        ("args", "code", "message"),
        [
            (["new"], 1, "ThrottlePolicy {ns}/new has no report yet"),
            (["nope"], 1, "no ThrottlePolicy {ns}/nope"),
            (["odd"], 1, "report.json: not an unthrottle report"),
            (["pay", "--format", "kustomize"], 2, "--output DIR"),
            (["pay", "--format", "pdf"], 2, "--format: 'pdf' is not one of"),
        ],
        ids=["a policy without a report yet", "no such policy", "not a report",
             "kustomize needs a directory", "an unknown format"],
    )  # fmt: skip
    def test_problems_are_named_for_people(
        self, cluster: Cluster, args: list[str], code: int, message: str
    ) -> None:
        out = cluster.report(*args)
        assert out.returncode == code
        assert message.format(ns=cluster.namespace) in " ".join(out.stderr.split())

    def test_an_api_server_that_fails_is_named_not_a_traceback(
        self, cluster: Cluster, tmp_path: Path
    ) -> None:
        with FaultProxy(cluster.kube) as proxy:
            proxy.fail_next("GET", r"/configmaps/pay-report$", 500, count=10)
            out = run("report", "pay", "-n", cluster.namespace,
                      kubeconfig=proxy.kubeconfig(tmp_path / "kubeconfig"))  # fmt: skip
            assert proxy.requests("GET", r"/configmaps/pay-report$")
        assert out.returncode == 1
        assert f"cannot read ConfigMap {cluster.namespace}/pay-report" in out.stderr
        assert "500" in out.stderr and "Traceback" not in out.stderr


@requires_prometheus
class TestRecommendFormats:
    def _base(self, url: str) -> list[str]:
        return ["recommend", "--prometheus", url, "--no-cluster", "--namespace", "shop",
                "--window", "1h"]  # fmt: skip

    def test_markdown_html_and_kustomize_name_the_same_deployments(
        self,
        prometheus: str,
        tmp_path: Path,
    ) -> None:
        md = run(*self._base(prometheus), "--format", "markdown")
        assert md.returncode == 0, md.stderr
        assert all(f"shop/{d}" in md.stdout for d in ("api", "batch", "idle"))
        assert f"Prometheus {prometheus}" in md.stdout
        page = tmp_path / "r.html"
        html = run(*self._base(prometheus), "--format", "html", "--output", str(page))
        assert html.returncode == 0, html.stderr
        assert all(f"shop/{d}" in page.read_text() for d in ("api", "batch", "idle"))
        assert re.search(r"<svg\b", page.read_text())
        folder = tmp_path / "k"
        kz = run(*self._base(prometheus), "--format", "kustomize", "--output", str(folder))
        assert kz.returncode == 0, kz.stderr
        assert (folder / "kustomization.yaml").exists() and (folder / "shop--api.yaml").exists()
        as_json = json.loads(run(*self._base(prometheus), "--format", "json").stdout)
        api = yaml.safe_load((folder / "shop--api.yaml").read_text())
        rec = as_json["workloads"][0]["containers"][0]["recommendation"]
        assert api["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] == (
            f"{rec['limit_millicores']}m")  # fmt: skip

    def test_what_the_scan_noted_is_in_the_report(self, prometheus: str) -> None:
        base = ["recommend", "--prometheus", prometheus, "--no-cluster", "--namespace", "other",
                "--window", "1h"]  # fmt: skip
        md = run(*base, "--format", "markdown")
        assert md.returncode == 0, md.stderr
        assert "> note: no unthrottle agent series" in md.stdout
        assert "no unthrottle agent series" in json.loads(run(*base, "--format", "json").stdout)[
            "notes"][0]  # fmt: skip

    def test_top_notes_what_it_left_out_in_every_format(self, prometheus: str) -> None:
        out = run(*self._base(prometheus), "--top", "1", "--format", "json")
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        assert len(doc["workloads"]) == 1 and doc["truncated"] == {"shown": 1, "left_out": 2}
        md = run(*self._base(prometheus), "--top", "1", "--format", "markdown").stdout
        assert "… and 2 more Deployments" in md


def test_kustomize_without_a_directory_fails_before_any_query() -> None:
    out = run("recommend", "--prometheus", "http://127.0.0.1:1", "--no-cluster", "--format",
              "kustomize")  # fmt: skip
    assert out.returncode == 2 and "--output DIR" in out.stderr
