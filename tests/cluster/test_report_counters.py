"""Reports on day one: a real Prometheus holding only cAdvisor's counters (no
``unthrottle_*`` series at all) still gives every throttled container its pictures, read
in a handful of batched queries whatever the number of plotted containers.

The history (:func:`counters`): cAdvisor's four CPU counters per pod, a sample every
30 s, throttling and usage swinging over a 2-hour cycle; optionally kube-state-metrics'
owner and limit series (for ``--no-cluster``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest

from kube import Kube
from prom import PrometheusServer, requires_prometheus
from shop import deploy
from support.report_counters import (
    LINE,
    MANY,
    SCREENSHOT,
    SHOP,
    STROKES,
    Day1,
    counters,
    plot_sections,
    pods_of,
)
from support.report_html import (
    DRAWN_PATHS,
    LABELS,
    BrowserContext,
    _contrast,
    _open,
    requires_browser,
)
from unthrottle.evidence.plots import step_for
from unthrottle.metrics.source import PrometheusConfig, PrometheusSource
from unthrottle.report import Report, render_html
from unthrottle.scan import ScanRequest, assess, gather, plotted, select, with_series
from unthrottle_lab.kube import ControlPlane

pytestmark = requires_prometheus


@pytest.fixture(scope="module")
def day1(tmp_path_factory: pytest.TempPathFactory, control_plane: ControlPlane) -> Iterator[Day1]:
    folder = tmp_path_factory.mktemp("day1")
    kube = Kube(control_plane)
    placed = deploy(kube, SHOP)
    end = int(time.time()) // 60 * 60
    try:
        with PrometheusServer(
            folder, openmetrics=counters([pods_of(w, end) for w in placed])
        ) as prom:
            yield Day1(placed, prom.url, kube.kubeconfig(folder / "kubeconfig"), folder)
    finally:
        kube.delete("v1/namespaces", None, placed[0].namespace)


class TestRecommendOnCountersOnly:
    def test_prometheus_holds_no_agent_series(self, day1: Day1) -> None:
        source = PrometheusSource(PrometheusConfig(day1.url))
        assert source.instant('count({__name__=~"unthrottle_.*"})') == []
        assert source.instant("count(container_cpu_cfs_periods_total)")[0].value == 10

    def test_every_throttled_container_has_plots_with_a_drawn_line(self, day1: Day1) -> None:
        html, _ = day1.recommend("html")
        (day1.folder / "day1.html").write_text(html)
        sections = plot_sections(html)
        throttled = {f"{w.namespace}/{w.name} · app" for w in day1.placed if w.share > 0}
        assert set(sections) == throttled
        for name, svgs in sections.items():
            assert len(svgs) >= 2, name  # throttling over the window, and CPU used
            assert all(LINE.search(svg) for svg in svgs), name
            assert all("<desc" in svg for svg in svgs), name
        assert "sub-second bursts" in html  # on the plot: why the limit sits above the line

    def test_the_usage_plot_draws_todays_and_the_recommended_limit(self, day1: Day1) -> None:
        html, _ = day1.recommend("html")
        checkout = plot_sections(html)[f"{day1.placed[0].namespace}/checkout · app"]
        usage = next(svg for svg in checkout if "CPU used" in svg)
        assert "today&#x27;s limit 0.5 cores" in usage or "today's limit 0.5 cores" in usage
        assert "recommended" in usage

    def test_plots_cost_three_range_queries_and_other_formats_none(self, day1: Day1) -> None:
        _, plain = day1.recommend("markdown")
        _, drawn = day1.recommend("html")
        assert plain.get("/api/v1/query_range", 0) == 0
        assert drawn["/api/v1/query_range"] == 3
        assert drawn["/api/v1/query"] == plain["/api/v1/query"]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    end = int(time.time()) // 60 * 60
    history = counters([pods_of(w, end, 3 * 3600) for w in MANY], owners=True)
    with PrometheusServer(tmp_path_factory.mktemp("fleet"), openmetrics=history) as prom:
        yield prom.url


def test_fifty_plotted_containers_cost_three_queries_and_all_are_drawn(fleet: str) -> None:
    source = PrometheusSource(PrometheusConfig(fleet))
    request = ScanRequest(window_s=3 * 3600, now=time.time(), namespaces=("fleet",))
    selection = select(request, None, source)
    found, problems = gather(request, source, selection)
    result = assess(request, selection, found, problems=problems)
    assert len(plotted(result)) == 50 < sum(1 for w in result.workloads
                                              if w.harm(result.target) > 0)  # fmt: skip
    sent = source.queries
    drawn = with_series(result, source)
    assert source.queries - sent == 3
    with_series_count = sum(1 for w in drawn.workloads for c in w.containers if c.series)
    assert with_series_count == 50
    started = time.perf_counter()
    html = render_html(Report.from_scan(drawn, window="3h"))
    took = time.perf_counter() - started
    sections = plot_sections(html)
    assert len(sections) == 50
    assert all(len(svgs) >= 2 and all(LINE.search(s) for s in svgs) for svgs in sections.values())
    print(f"50 plotted from counters: {len(html) / 1e6:.2f} MB HTML in {took:.1f} s")


def test_the_step_fits_the_window() -> None:
    assert step_for(3600) == 300  # five samples a step at the slowest scrape
    assert step_for(6 * 3600) == 300
    assert step_for(7 * 86_400) == 3600  # 168 points
    assert all(w // step_for(w) <= 240 for w in (3600, 86_400, 7 * 86_400, 30 * 86_400))


@requires_browser
def test_the_counters_only_page_in_a_real_browser(
    day1: Day1,
    browser: BrowserContext,
) -> None:
    html, _ = day1.recommend("html")
    path = day1.folder / "browser.html"
    path.write_text(html)
    for visit in _open(browser, path):
        page = visit.page
        page.wait_for_timeout(300)
        assert visit.errors == []
        assert len(visit.requests) == 1 and visit.requests[0].startswith("file://")
        svgs = page.locator("figure svg")
        assert svgs.count() >= 6
        for i in range(svgs.count()):
            svg = svgs.nth(i)
            assert svg.get_attribute("role") == "img"
            assert svg.evaluate(DRAWN_PATHS) > 3
            assert all(len(t) > 20 for t in svg.evaluate(LABELS))  # title and description
        colours = {tuple(float(x) for x in re.findall(r"[\d.]+", s)[:3])
                   for s in page.evaluate(STROKES)}  # fmt: skip
        drawn = {c for c in colours if c not in {(255.0, 255.0, 255.0), (221.0, 221.0, 221.0)}}
        assert len(drawn) >= 4  # the data lines' and limits' colours (the light grid is not data)
        for colour in drawn:
            assert _contrast(colour, (255, 255, 255)) >= 4.5, colour
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        page.evaluate("document.querySelectorAll('details').forEach(d => { d.open = false; })")
        page.locator("#c1").scroll_into_view_if_needed()
        page.locator("#c1").screenshot(path=str(SCREENSHOT))
        assert SCREENSHOT.stat().st_size > 10_000
