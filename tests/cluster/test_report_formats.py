"""Each format of a real scan names every Deployment and container and carries the figures
that matter, with the JSON format's numbers; what came from the cluster stays inert.
Structure, not byte snapshots."""

from __future__ import annotations

import csv
import html
import io
import json
import re
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from typing import Any

import pytest
import yaml

from kube import Kube
from prom import requires_prometheus
from report_size import synthetic
from support.report_model import (
    shop_scan,
    with_xss,
)
from unthrottle.report import FORMATS, RenderOptions, Report, render
from unthrottle.report import units as u
from unthrottle.report.page import SCRIPT_HASH
from unthrottle.scan import ScanResult
from unthrottle.units import format_cpu
from unthrottle_lab.kube import ControlPlane


@pytest.fixture(scope="module")
def result(
    tmp_path_factory: pytest.TempPathFactory, control_plane: ControlPlane
) -> Iterator[ScanResult]:
    with shop_scan(tmp_path_factory.mktemp("shop"), Kube(control_plane)) as found:
        yield found


def _ns(result: ScanResult) -> str:
    """The shop's namespace on the control plane (``shop-xxxxxx``, fresh for this module)."""
    return result.workloads[0].namespace


@pytest.fixture(scope="module")
def doc(result: ScanResult) -> dict[str, Any]:
    """The JSON format's document: the reference every other format must agree with."""
    report = Report.from_scan(result, window="12h", prometheus="http://prom:9090")
    return json.loads(str(render(report, "json")))


def _text(fmt: str, result: ScanResult, **options: Any) -> str:
    out = render(Report.from_scan(result, window="12h", prometheus="http://prom:9090"), fmt,
                 RenderOptions(**options))  # fmt: skip
    assert isinstance(out, str)
    return out


def _containers(doc: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(w, c) for w in doc["workloads"] for c in w["containers"]]


def _added(doc: dict[str, Any]) -> tuple[int, int]:
    """CPU limit added and freed, summed from the JSON by hand."""
    deltas = [c["recommendation"]["limit_millicores"] - c["current"]["limit_millicores"]
              for _, c in _containers(doc) if c["recommendation"]]  # fmt: skip
    return sum(d for d in deltas if d > 0), -sum(d for d in deltas if d < 0)


# ------------------------------------------------------------------------ Markdown


def _md_rows(text: str) -> dict[tuple[str, str], list[str]]:
    """The recommendations table: (Deployment, container) → cells (pipes unescaped)."""
    section = text.split("## Recommendations", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        if line.startswith("| shop-") or line.startswith("| team-"):
            cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            rows[(cells[0].split(" (")[0], cells[1])] = cells
    return rows


@requires_prometheus
class TestMarkdown:
    def test_every_deployment_and_container_is_named(self, result: ScanResult,
                                                     doc: dict[str, Any]) -> None:  # fmt: skip
        text = _text("markdown", result)
        rows = _md_rows(text)
        for w, c in _containers(doc):
            key = f"{w['namespace']}/{w['deployment']}"
            if c["recommendation"] is not None:
                assert (key, c["name"]) in rows
            else:  # listed apart, with why
                without = text.split("## Without evidence", 1)[1]
                assert f"| {key} | {c['name']} | no CPU series in the window" in without

    def test_figures_are_the_jsons(self, result: ScanResult, doc: dict[str, Any]) -> None:
        rows = _md_rows(_text("markdown", result))
        for w, c in _containers(doc):
            rec = c["recommendation"]
            if rec is None:
                continue
            cells = rows[(f"{w['namespace']}/{w['deployment']}", c["name"])]
            throttled, expected, limit, burst, procs, demand, confidence = cells[2:9]
            assert throttled.strip("*") == f"{c['throttle_ratio'] * 100:.1f} %"
            assert expected == f"{rec['expected_throttle_ratio'] * 100:.1f} %"
            assert limit.split(" → ")[-1] == _recommended(rec)
            assert limit.split(" → ")[0] == format_cpu(c["current"]["limit_millicores"])
            assert burst.split(" → ")[-1] == u.burst(rec["burst_us"])
            if rec["gomaxprocs"] is not None:
                assert procs.split(" → ")[-1] == str(rec["gomaxprocs"])
            d = c["demand"]
            assert demand == " / ".join(format_cpu(d[k]) for k in (
                "p50_millicores", "p99_millicores", "max_millicores"))  # fmt: skip
            assert confidence == f"{rec['confidence']:.2f}"

    def test_the_summary_says_what_is_throttled_and_what_it_costs(
        self, result: ScanResult, doc: dict[str, Any]
    ) -> None:
        text = _text("markdown", result)
        summary = text.split("## Summary", 1)[1].split("## Recommendations", 1)[0]
        added, freed = _added(doc)
        over = sum(1 for _, c in _containers(doc) if (c["throttle_ratio"] or 0) > doc["target"])
        assert f"**{over} over the target**" in summary
        assert f"**{u.signed_cpu(added)} added**" in summary
        assert f"**{u.cpu(freed)} freed**" in summary
        assert "Worst offenders" in summary and f"{_ns(result)}/checkout · app" in summary
        assert "window 12h" in text and "Prometheus http://prom:9090" in text

    def test_every_reason_is_there(self, result: ScanResult, doc: dict[str, Any]) -> None:
        text = _text("markdown", result)
        for _, c in _containers(doc):
            for reason in (c["recommendation"] or {}).get("reasons", []):
                assert html.escape(reason, quote=False).replace("_", "\\_") in text

    def test_cluster_text_cannot_open_a_tag_a_link_or_a_cell(self, result: ScanResult) -> None:
        text = render(Report.from_scan(with_xss(result)), "markdown")
        assert isinstance(text, str)
        assert "<script" not in text and "&lt;script&gt;" in text
        table = text.split("## Recommendations", 1)[1].split("### Why", 1)[0]
        for line in table.splitlines():
            if line.startswith(f"| {_ns(result)}/"):
                assert len(re.split(r"(?<!\\)\|", line)) == 13  # 11 cells, no more

    def test_the_operators_call_keeps_its_signature(self, result: ScanResult) -> None:
        from unthrottle.report import markdown

        text = markdown(result, title="unthrottle: policy shop/pay",
                        states={"checkout": "Recommended"}, max_workloads=2)  # fmt: skip
        assert text.startswith("# unthrottle: policy shop/pay")
        assert f"{_ns(result)}/checkout (Recommended)" in text
        assert "… and 2 more Deployments" in text


# ------------------------------------------------------------------------ HTML


class _Page(HTMLParser):
    """The containers table's cells (text, data-sort), every tag's name, the plots."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[tuple[str, str]]] = []
        self.tags: list[tuple[str, dict[str, str]]] = []
        self._in_table = False
        self._cell: list[str] | None = None
        self._sort = ""
        self.figures: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.tags.append((tag, a))
        if tag == "table" and a.get("id") == "containers":
            self._in_table = True
        elif self._in_table and tag == "tr":
            self.rows.append([])
        elif self._in_table and tag == "td":
            self._cell, self._sort = [], a.get("data-sort", "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._in_table = False
        elif tag == "td" and self._cell is not None:
            self.rows[-1].append(("".join(self._cell).strip(), self._sort))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def _recommended(rec: dict[str, Any]) -> str:
    """``690m``, or ``690m (400m–690m)`` for a limit made from throttled data."""
    top = format_cpu(rec["limit_millicores"])
    low = rec.get("lower_limit_millicores")
    return top if low is None else f"{top} ({format_cpu(low)}–{top})"


@requires_prometheus
def test_the_shop_has_a_limit_made_from_throttled_data(doc: dict[str, Any]) -> None:
    """So the range's rendering above is exercised: checkout is throttled past the target."""
    ranged = [c for _, c in _containers(doc) if (c["recommendation"] or {}).get(
        "lower_limit_millicores")]  # fmt: skip
    assert ranged and all(
        c["recommendation"]["lower_limit_millicores"] < c["recommendation"]["limit_millicores"]
        and c["throttle_ratio"] > doc["target"]
        for c in ranged
    )


def _page(text: str) -> _Page:
    page = _Page()
    page.feed(text)
    return page


@requires_prometheus
class TestHtml:
    def test_every_container_has_a_row_with_the_jsons_numbers(
        self, result: ScanResult, doc: dict[str, Any]
    ) -> None:
        page = _page(_text("html", result))
        rows = {(r[1][1], r[2][1]): r for r in page.rows if r}
        for w, c in _containers(doc):
            rec = c["recommendation"]
            if rec is None:
                continue
            r = rows[(f"{w['namespace']}/{w['deployment']}", c["name"])]
            assert float(r[3][1]) == pytest.approx(c["throttle_ratio"], rel=1e-5)
            assert float(r[4][1]) == pytest.approx(rec["expected_throttle_ratio"], rel=1e-5)
            limit = r[5][0].split(" → ")
            assert limit[0] == format_cpu(c["current"]["limit_millicores"])
            assert limit[-1] == _recommended(rec)
            assert int(r[5][1]) == rec["limit_millicores"]
            assert int(r[6][1]) == rec["burst_us"]
            assert r[8][0] == " / ".join(format_cpu(c["demand"][k]) for k in (
                "p50_millicores", "p99_millicores", "max_millicores"))  # fmt: skip
            assert int(r[8][1]) == c["demand"]["p99_millicores"]
            assert r[9][0] == f"{rec['confidence']:.2f}"
        assert [int(r[0][1]) for r in page.rows if r] == list(range(1, len(rows) + 1))

    def test_summary_plots_and_the_ones_without_evidence(
        self, result: ScanResult, doc: dict[str, Any]
    ) -> None:
        text = _text("html", result)
        added, freed = _added(doc)
        assert f"<dt>CPU limit added</dt><dd>{u.signed_cpu(added)}</dd>" in text
        assert f"<dt>CPU limit freed</dt><dd>{u.cpu(freed)}</dd>" in text
        over = [c for _, c in _containers(doc) if (c["throttle_ratio"] or 0) > doc["target"]]
        svgs = re.findall(r"<svg\b[^>]*>", text)
        assert len(svgs) == len(over) >= 2
        for tag in svgs:
            assert 'role="img"' in tag and "aria-labelledby" in tag
        assert text.count("<desc id=") == len(over)
        without = text.split('id="without"', 1)[1]
        assert f"{_ns(result)}/cron" in without and "no CPU series in the window" in without

    def test_the_page_is_self_contained(self, result: ScanResult) -> None:
        text = _text("html", result)
        assert not re.search(r"""\b(src|href)\s*=\s*["']?(https?:|//)""", text)
        assert "@import" not in text and "url(http" not in text
        policy = html.unescape(re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"',
                                         text).group(1))  # type: ignore[union-attr]  # fmt: skip
        assert f"script-src '{SCRIPT_HASH}'" in policy and "default-src 'none'" in policy
        page = _page(text)
        assert all(a.get("scope") == "col" for tag, a in page.tags if tag == "th")

    def test_cluster_text_is_escaped(self, result: ScanResult) -> None:
        text = str(render(Report.from_scan(with_xss(result)), "html"))
        assert text.count("<script") == 1  # the page's own
        assert "&lt;script&gt;window.__xss" in text
        assert "<title>" in text


class TestHtmlPlots:
    def test_only_the_most_harmed_fifty_get_plots(self) -> None:
        report = Report.from_scan(synthetic(120, 2), window="7d")
        over = report.over_target()
        assert len(over) > 50
        text = str(render(report, "html"))
        assert len(re.findall(r"<svg\b", text)) == 50
        assert f"Plots for the 50 most harmed of {len(over)} containers" in text
        first = over[0]
        assert f"{first[0].key} · {first[1].name}</h3>" in text.split('id="plots"', 1)[1][:2000]

    def test_a_report_without_histograms_plots_the_demand_quantiles(self) -> None:
        doc = Report.from_scan(synthetic(4, 1), window="7d").to_json()
        for w in doc["workloads"]:
            for c in w["containers"]:
                c["histogram"] = []
        text = str(render(Report.from_json(doc), "html"))
        assert re.search(r"<svg\b", text) and "p99" in text

    def test_the_throttle_ratio_over_the_window_is_drawn_when_the_series_has_it(self) -> None:
        doc = Report.from_scan(synthetic(8, 1), window="7d").to_json()
        c = doc["workloads"][0]["containers"][0]
        assert c["throttle_ratio"] > doc["target"]  # the most harmed first: it has plots
        c["throttle_series"] = [{"t": 1_796_000_000 - 3600 * (24 - i), "ratio": 0.01 * i}
                                for i in range(25)]  # fmt: skip
        text = str(render(Report.from_json(doc), "html"))
        assert text.count("over the window</title>") == 1
        over = len(Report.from_json(doc).over_target())
        assert len(re.findall(r"<svg\b", text)) == over + 1  # one demand plot each, one series


# ------------------------------------------------------------------------ JSON, kustomize


@requires_prometheus
class TestOthers:
    def test_json_reads_back_as_the_same_report(self, result: ScanResult) -> None:
        report = Report.from_scan(result, window="12h")
        assert Report.from_json(json.loads(str(render(report, "json")))) == report
        assert Report.from_json(yaml.safe_load(str(render(report, "yaml")))) == report

    def test_kustomize_patches_each_deployment_that_changes_with_the_jsons_values(
        self, result: ScanResult, doc: dict[str, Any]
    ) -> None:
        files = render(Report.from_scan(result, window="12h"), "kustomize")
        assert isinstance(files, dict)
        component = yaml.safe_load(files["kustomization.yaml"])
        assert component["kind"] == "Component"
        assert component["apiVersion"] == "kustomize.config.k8s.io/v1alpha1"
        patched = {p["path"] for p in component["patches"]}
        assert patched == set(files) - {"kustomization.yaml"}
        for w in doc["workloads"]:
            name = f"{w['namespace']}--{w['deployment']}.yaml"
            if w["deployment"] == "cron":
                assert name not in files  # nothing to change: no patch
                continue
            patch = yaml.safe_load(files[name])
            (c,) = w["containers"]
            rec = c["recommendation"]
            entry = patch["spec"]["template"]["spec"]["containers"][0]
            assert entry["name"] == c["name"]
            assert entry["resources"]["limits"]["cpu"] == format_cpu(rec["limit_millicores"])
            annotations = patch["spec"]["template"]["metadata"]["annotations"]
            assert annotations["unthrottle.io/cpu-burst"] == f"{rec['burst_us'] // 1000}ms"
            if w["deployment"] == "api":
                assert entry["env"] == [{"name": "GOMAXPROCS", "value": str(rec["gomaxprocs"]),
                                         "valueFrom": None}]  # fmt: skip
            else:
                assert "env" not in entry


def _csv(report: Report) -> list[list[str]]:
    return list(csv.reader(io.StringIO(str(render(report, "csv")))))


class TestRegistry:
    def test_every_format_renders_an_empty_report_as_one_with_nothing_in_it(self) -> None:
        doc = {"generated_at": "2026-12-01T00:00:00Z", "window": "7d", "target": 0.05,
               "workloads": []}  # fmt: skip
        empty = Report.from_json(doc)
        assert set(FORMATS) == {"table", "json", "yaml", "csv", "markdown", "html", "kustomize"}
        assert json.loads(str(render(empty, "json"))) == doc
        assert yaml.safe_load(str(render(empty, "yaml"))) == doc
        # the same columns as a report with rows: a script reading them by name reads both
        full = _csv(Report.from_scan(synthetic(1, 1), window="7d"))
        assert _csv(empty) == [full[0]]
        assert len(full[0]) == 18
        assert full[0][:5] == ["namespace", "kind", "name", "deployment", "container"]
        table = str(render(empty, "table")).splitlines()
        assert table[0].strip() == "unthrottle recommend: window 7d, target 0.05"
        assert "recommended limit" in table[2] and len(table) == 5  # header, no row
        markdown = str(render(empty, "markdown"))
        assert "> window 7d ending 2026-12-01T00:00:00Z · target 5 % of periods" in markdown
        assert "- **0 Deployments**, 0 containers: **0 over the target**" in markdown
        page = str(render(empty, "html"))
        assert "<div><dt>Deployments</dt><dd>0</dd></div>" in page
        assert '<section aria-labelledby="recommendations"' not in page and "<svg" not in page
        files = render(empty, "kustomize")
        assert isinstance(files, dict) and set(files) == {"kustomization.yaml"}
        component = yaml.safe_load(files["kustomization.yaml"])
        assert component["kind"] == "Component" and component["patches"] == []

    def test_a_thousand_deployments_render_in_seconds_at_a_usable_size(self) -> None:
        report = Report.from_scan(synthetic(1000, 2), window="7d")
        for fmt, seconds, megabytes in (("markdown", 3, 2), ("html", 20, 5)):
            started = time.perf_counter()
            text = render(report, fmt)
            took = time.perf_counter() - started
            assert isinstance(text, str)
            assert took < seconds, f"{fmt} took {took:.1f} s"
            assert len(text.encode()) < megabytes * 2**20
            assert "team-39/app-0999" in text or "app-0999" in text


def test_markdown_reads_top_to_bottom() -> None:
    text = str(render(Report.from_scan(synthetic(20, 2), window="7d"), "markdown"))
    heads = (
        "# unthrottle recommend",
        "## Summary",
        "## Recommendations",
        "### Why",
        "## Without evidence",
    )
    order = [text.index(h) for h in heads]
    assert order == sorted(order)
