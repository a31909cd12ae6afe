"""The kustomize report, added as a Component to an overlay of the original manifests and
built with the real ``kubectl kustomize``: exactly the recommended fields change."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from kube import Kube
from prom import requires_prometheus
from shop import deployment
from support.report_model import (
    SHOP,
    shop_scan,
)
from unthrottle.recommend import Recommendation, Runtime
from unthrottle.report import Report, render_kustomize
from unthrottle.report.model import ReportError
from unthrottle.scan import ContainerResult, ScanResult, WorkloadResult
from unthrottle.units import format_cpu
from unthrottle_lab.kube import ControlPlane, ensure_built


def _kubectl() -> str:
    """The control plane's kubectl (make controlplane builds it): the machine's may be
    absent or of another release; ``kubectl kustomize`` needs no server."""
    return str(ensure_built().path("kubectl"))


BURST = "unthrottle.io/cpu-burst"
Flat = dict[str, Any]


def _flatten(value: Any, path: str = "") -> Flat:
    """Leaf paths → values; list items named by their ``name`` when they have one."""
    if isinstance(value, dict):
        out: Flat = {}
        for key, item in value.items():
            out |= _flatten(item, f"{path}.{key}" if path else key)
        return out
    if isinstance(value, list):
        out = {}
        for i, item in enumerate(value):
            tag = item.get("name", i) if isinstance(item, dict) else i
            out |= _flatten(item, f"{path}[{tag}]")
        return out
    return {path: value}


def _diff(before: Any, after: Any) -> dict[str, tuple[Any, Any]]:
    a, b = _flatten(before), _flatten(after)
    return {k: (a.get(k), b.get(k)) for k in a.keys() | b.keys() if a.get(k) != b.get(k)}


def _build(folder: Path) -> dict[str, Any]:
    out = subprocess.run([_kubectl(), "kustomize", str(folder)], capture_output=True, text=True,
                         timeout=60, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return {d["metadata"]["name"]: d for d in yaml.safe_load_all(out.stdout) if d}


def _overlay(root: Path, manifests: list[dict[str, Any]], component: dict[str, str], *,
             namespace: str | None) -> tuple[dict[str, Any], dict[str, Any]]:  # fmt: skip
    """(Deployments built without the component, with it)."""
    (root / "base").mkdir()
    (root / "base" / "deployments.yaml").write_text(yaml.safe_dump_all(manifests))
    (root / "base" / "kustomization.yaml").write_text("resources: [deployments.yaml]\n")
    (root / "unthrottle").mkdir()
    for name, text in component.items():
        (root / "unthrottle" / name).write_text(text)
    head = f"namespace: {namespace}\n" if namespace else ""
    for name, extra in (("plain", ""), ("patched", "components: [../unthrottle]\n")):
        (root / name).mkdir()
        (root / name / "kustomization.yaml").write_text(f"{head}resources: [../base]\n{extra}")
    return _build(root / "plain"), _build(root / "patched")


def _expected(report: Report) -> dict[str, dict[str, Any]]:
    """Deployment → the leaf paths the recommendation changes, and their new values."""
    out: dict[str, dict[str, Any]] = {}
    for w in report.workloads:
        want: dict[str, Any] = {}
        for c in w.containers:
            change = c.change()
            where = f"spec.template.spec.containers[{c.name}]"
            if change.limit:
                want[f"{where}.resources.limits.cpu"] = format_cpu(change.limit[1])
            if change.gomaxprocs:
                want[f"{where}.env[GOMAXPROCS].value"] = str(change.gomaxprocs[1])
        out[w.deployment] = want
    return out


@pytest.fixture(scope="module")
def shop(
    tmp_path_factory: pytest.TempPathFactory, control_plane: ControlPlane
) -> Iterator[ScanResult]:
    with shop_scan(tmp_path_factory.mktemp("shop"), Kube(control_plane)) as found:
        yield found


@requires_prometheus
@pytest.mark.parametrize("namespaced", [True, False],
                         ids=["manifests name their namespace",
                              "the overlay sets the namespace"])  # fmt: skip
def test_the_shop_changes_exactly_as_recommended(shop: ScanResult, tmp_path: Path,
                                                 namespaced: bool) -> None:  # fmt: skip
    report = Report.from_scan(shop, window="12h")
    namespace = shop.workloads[0].namespace  # the shop's, fresh on the control plane
    manifests = [deployment(replace(w, namespace=namespace)) for w in SHOP]
    if not namespaced:
        for m in manifests:
            del m["metadata"]["namespace"]
    plain, patched = _overlay(tmp_path, manifests, render_kustomize(report),
                              namespace=None if namespaced else namespace)  # fmt: skip
    expected = _expected(report)
    for name, before in plain.items():
        diff = _diff(before, patched[name])
        w = next(w for w in report.workloads if w.deployment == name)
        rec = w.containers[0].recommendation
        want = dict(expected[name])
        if rec is not None and rec.burst_us:
            want[f"spec.template.metadata.annotations.{BURST}"] = f"{rec.burst_us // 1000}ms"
        assert {k: new for k, (_, new) in diff.items()} == want, name
    assert plain["cron"] == patched["cron"]  # no evidence: untouched
    assert patched["api"]["spec"]["template"]["spec"]["containers"][0]["env"][0] == {
        "name": "GOMAXPROCS", "value": "2"}  # fmt: skip


def _rec(limit: int, burst_us: int, gomaxprocs: int | None = None) -> Recommendation:
    return Recommendation(limit, burst_us, 100_000, gomaxprocs, None, 0.01, 0.2, 0.9,
                          ["a reason"])  # fmt: skip


def _c(name: str, limit: int, burst_us: int, rec: Recommendation | None, *,
       gomaxprocs: int | None = None, managed: bool = True) -> ContainerResult:  # fmt: skip
    return ContainerResult(name, limit, limit // 2, burst_us, gomaxprocs, Runtime.GO, "period",
                           2, 0.2, {"p50_millicores": 100, "p99_millicores": 900,
                                    "max_millicores": 1000}, rec, managed)  # fmt: skip


MANIFESTS = [
    {"apiVersion": "apps/v1", "kind": "Deployment",
     "metadata": {"name": "web.v2", "namespace": "front", "labels": {"app": "web"}},
     "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}}, "template": {
         "metadata": {"labels": {"app": "web"},
                      "annotations": {"koordinator.sh/cpuBurst": '{"cpuBurstPercent": 100}',
                                      "prometheus.io/scrape": "true"}},
         "spec": {"containers": [
             {"name": "app", "image": "web:2", "env": [
                 {"name": "GOMAXPROCS",
                  "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
                 {"name": "LOG", "value": "info"}],
              "resources": {"limits": {"cpu": "500m", "memory": "1Gi"},
                            "requests": {"cpu": "250m", "memory": "1Gi"}}},
             {"name": "proxy", "image": "envoy:1",
              "resources": {"limits": {"cpu": "200m"}}},
             {"name": "logger", "image": "fluent:1"}]}}}},
    {"apiVersion": "apps/v1", "kind": "Deployment",
     "metadata": {"name": "steady", "namespace": "front"},
     "spec": {"selector": {"matchLabels": {"app": "steady"}}, "template": {
         "metadata": {"labels": {"app": "steady"}},
         "spec": {"containers": [{"name": "app", "image": "steady:1",
                                  "resources": {"limits": {"cpu": "1"}}}]}}}},
]  # fmt: skip
"""Hand-written manifests: three containers (GOMAXPROCS from the limit, a burst from
Koordinator's annotation, a container the policy leaves out), and one already right."""


def test_several_containers_are_matched_by_name_and_nothing_else_moves(tmp_path: Path) -> None:
    web = WorkloadResult("front", "web.v2", (
        _c("app", 500, 0, _rec(900, 30_000, gomaxprocs=1)),
        _c("proxy", 200, 5_000, _rec(200, 5_000)),  # stays as it is
        _c("logger", 100, 0, None, managed=False),
    ))  # fmt: skip
    steady = WorkloadResult("front", "steady", (_c("app", 1000, 0, _rec(1000, 0)),))
    report = Report.from_scan(ScanResult(1_796_000_000, 86_400, 0.05, (web, steady)))
    files = render_kustomize(report)
    assert set(files) == {"kustomization.yaml", "front--web.v2.yaml"}  # steady: no patch
    plain, patched = _overlay(tmp_path, MANIFESTS, files, namespace=None)
    assert plain["steady"] == patched["steady"]
    assert {k: new for k, (_, new) in _diff(plain["web.v2"], patched["web.v2"]).items()} == {
        "spec.template.spec.containers[app].resources.limits.cpu": "900m",
        "spec.template.spec.containers[app].env[GOMAXPROCS].value": "1",
        "spec.template.spec.containers[app].env[GOMAXPROCS].valueFrom.resourceFieldRef"
        ".resource": None,  # the explicit value replaces the one taken from the limit
        f"spec.template.metadata.annotations.{BURST}": "app=30ms,proxy=5ms",
    }


def test_a_report_with_nothing_to_change_builds_to_the_same_manifests(tmp_path: Path) -> None:
    steady = WorkloadResult("front", "steady", (_c("app", 1000, 0, _rec(1000, 0)),))
    files = render_kustomize(Report.from_scan(ScanResult(1_796_000_000, 86_400, 0.05,
                                                         (steady,))))  # fmt: skip
    assert set(files) == {"kustomization.yaml"}
    plain, patched = _overlay(tmp_path, MANIFESTS, files, namespace=None)
    assert plain == patched


def test_a_name_no_patch_could_match_is_refused() -> None:
    odd = WorkloadResult("front", "Web_2", (_c("app", 500, 0, _rec(900, 0)),))
    with pytest.raises(ReportError, match="not a Kubernetes name"):
        render_kustomize(Report.from_scan(ScanResult(1_796_000_000, 86_400, 0.05, (odd,))))


def test_names_that_meet_at_the_separator_get_files_of_their_own() -> None:
    one = WorkloadResult("a--b", "c", (_c("app", 500, 0, _rec(900, 0)),))
    two = WorkloadResult("a", "b--c", (_c("app", 500, 0, _rec(800, 0)),))
    files = render_kustomize(Report.from_scan(ScanResult(1_796_000_000, 86_400, 0.05,
                                                         (one, two))))  # fmt: skip
    component = yaml.safe_load(files["kustomization.yaml"])
    paths = [p["path"] for p in component["patches"]]
    assert len(set(paths)) == 2 and set(paths) <= set(files)
    patches = [yaml.safe_load(files[p]) for p in paths]
    limits = {p["metadata"]["namespace"]: p["spec"]["template"]["spec"]["containers"][0][
        "resources"]["limits"]["cpu"] for p in patches}  # fmt: skip
    assert limits == {"a--b": "900m", "a": "800m"}
