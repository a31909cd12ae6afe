"""`unthrottle report` and `unthrottle recommend --format markdown|html|kustomize` as a user
runs them: the report ConfigMap read from the Kubernetes API (the emulator, over HTTP),
recommendations from a real Prometheus."""

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

from kube_emulator import KubeEmulator
from prom import requires_prometheus
from test_recommend_cli import prometheus  # noqa: F401 (a fixture: a real Prometheus)
from test_report_model import synthetic
from unthrottle.report import Report
from unthrottle.report.kustomize import MARKER

UNTHROTTLE = Path(sys.executable).with_name("unthrottle")
POLICIES = "unthrottle.io/v1alpha1/throttlepolicies"


def run(*args: str, kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)} if kubeconfig else dict(os.environ)
    return subprocess.run([str(UNTHROTTLE), *args], capture_output=True, text=True, timeout=120,
                          check=False, env=env)  # fmt: skip


def operator_document(deployments: int, *, shown: int | None = None) -> dict[str, Any]:
    """``report.json`` as the operator writes it: the scan's JSON, the policy, a state per
    Deployment, and ``truncated`` when cut to fit."""
    doc = synthetic(deployments, 2).to_json("7d")
    doc["policy"] = {"namespace": "shop", "name": "pay"}
    for w in doc["workloads"]:
        w["state"] = "Recommended" if w["containers"][0]["recommendation"] else "NoData"
    if shown is not None:
        doc["truncated"] = {"shown": shown, "left_out": len(doc["workloads"]) - shown}
        doc["workloads"] = doc["workloads"][:shown]
    return doc


def _configmap(name: str, data: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"namespace": "shop", "name": name,
                         "labels": {"app.kubernetes.io/managed-by": "unthrottle"}},
            "data": data}  # fmt: skip


def _policy(name: str) -> dict[str, Any]:
    return {"apiVersion": "unthrottle.io/v1alpha1", "kind": "ThrottlePolicy",
            "metadata": {"namespace": "shop", "name": name}, "spec": {}}  # fmt: skip


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Any]]]:
    """The emulator with policies and their report ConfigMaps; (kubeconfig, pay's doc)."""
    folder = tmp_path_factory.mktemp("kube")
    doc = operator_document(24)
    with KubeEmulator() as kube:
        for name in ("pay", "web", "new", "odd"):
            kube.create(POLICIES, _policy(name))
        kube.put("v1/configmaps", _configmap("pay-report", {
            "report.json": json.dumps(doc, indent=1), "report.md": "# unthrottle"}))  # fmt: skip
        kube.put("v1/configmaps", _configmap("web-report", {
            "report.json": json.dumps(operator_document(40, shown=10))}))  # fmt: skip
        kube.put("v1/configmaps", _configmap("odd-report", {"report.json": '{"window": 3}'}))
        yield kube.kubeconfig(folder / "kubeconfig", namespace="shop"), doc


class TestReportCommand:
    def test_markdown_by_default_names_every_deployment(
        self, cluster: tuple[Path, dict[str, Any]]
    ) -> None:
        kubeconfig, doc = cluster
        out = run("report", "pay", "-n", "shop", kubeconfig=kubeconfig)
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("# unthrottle: policy shop/pay")
        for w in doc["workloads"]:
            assert f"{w['namespace']}/{w['deployment']}" in out.stdout
        assert "(Recommended)" in out.stdout and "policy shop/pay" in out.stdout

    def test_the_namespace_defaults_to_the_contexts(
        self, cluster: tuple[Path, dict[str, Any]]
    ) -> None:
        out = run("report", "pay", "--format", "json", kubeconfig=cluster[0])
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == cluster[1]  # the ConfigMap's document, unchanged

    def test_html_is_written_where_asked(self, cluster: tuple[Path, dict[str, Any]],
                                         tmp_path: Path) -> None:  # fmt: skip
        target = tmp_path / "pay.html"
        out = run("report", "pay", "-n", "shop", "--format", "html", "--output", str(target),
                  kubeconfig=cluster[0])  # fmt: skip
        assert out.returncode == 0, out.stderr and out.stdout == ""
        text = target.read_text()
        over = len(Report.from_json(cluster[1]).over_target())
        assert len(re.findall(r"<svg\b", text)) == over > 0
        assert "<title>unthrottle: policy shop/pay</title>" in text

    def test_kustomize_writes_a_component_and_replaces_only_its_own_files(
        self, cluster: tuple[Path, dict[str, Any]], tmp_path: Path
    ) -> None:
        folder = tmp_path / "unthrottle"
        folder.mkdir()
        (folder / "shop--gone.yaml").write_text(f"{MARKER}\n# an earlier run's patch\n")
        (folder / "notes.yaml").write_text("# the team's own file\n")
        out = run("report", "pay", "-n", "shop", "--format", "kustomize", "--output",
                  str(folder), kubeconfig=cluster[0])  # fmt: skip
        assert out.returncode == 0, out.stderr
        component = yaml.safe_load((folder / "kustomization.yaml").read_text())
        assert component["kind"] == "Component"
        assert {p["path"] for p in component["patches"]} | {"kustomization.yaml", "notes.yaml"} == {
            p.name for p in folder.iterdir()}  # fmt: skip
        assert "wrote" in out.stderr

    def test_a_truncated_report_says_so(self, cluster: tuple[Path, dict[str, Any]]) -> None:
        out = run("report", "web", "-n", "shop", kubeconfig=cluster[0])
        assert out.returncode == 0, out.stderr
        assert "the report holds the 10 most harmful Deployments; 30 more" in out.stderr
        assert "… and 30 more Deployments, left out for size" in out.stdout

    @pytest.mark.parametrize(
        ("args", "code", "message"),
        [
            (["new"], 1, "ThrottlePolicy shop/new has no report yet"),
            (["nope"], 1, "no ThrottlePolicy shop/nope"),
            (["odd"], 1, "report.json: not an unthrottle report"),
            (["pay", "--format", "kustomize"], 2, "--output DIR"),
            (["pay", "--format", "pdf"], 2, "--format: 'pdf' is not one of"),
        ],
        ids=["a policy without a report yet", "no such policy", "not a report",
             "kustomize needs a directory", "an unknown format"],
    )  # fmt: skip
    def test_problems_are_named_for_people(
        self, cluster: tuple[Path, dict[str, Any]], args: list[str], code: int, message: str
    ) -> None:
        out = run("report", *args, "-n", "shop", kubeconfig=cluster[0])
        assert out.returncode == code
        assert message in " ".join(out.stderr.split())


@requires_prometheus
class TestRecommendFormats:
    def _base(self, url: str) -> list[str]:
        return ["recommend", "--prometheus", url, "--no-cluster", "--namespace", "shop",
                "--window", "1h"]  # fmt: skip

    def test_markdown_html_and_kustomize_name_the_same_deployments(
        self,
        prometheus: str,  # noqa: F811 (the fixture)
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

    def test_what_the_scan_noted_is_in_the_report(self, prometheus: str) -> None:  # noqa: F811
        base = ["recommend", "--prometheus", prometheus, "--no-cluster", "--namespace", "other",
                "--window", "1h"]  # fmt: skip
        md = run(*base, "--format", "markdown")
        assert md.returncode == 0, md.stderr
        assert "> note: no unthrottle agent series" in md.stdout
        assert "no unthrottle agent series" in json.loads(run(*base, "--format", "json").stdout)[
            "notes"][0]  # fmt: skip

    def test_top_notes_what_it_left_out_in_every_format(self, prometheus: str) -> None:  # noqa: F811
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
