"""The HTML report in a real headless browser: Debian's chromium (installed by ``make
browser``), driven by Playwright pointed at that binary — nothing downloads a browser.

No console errors, no request leaves the file, every plot's SVG is drawn, script from the
cluster stays inert, the table sorts, the page prints; a screenshot is kept in
``build/test-artifacts/`` (not committed).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kube import Kube
from prom import requires_prometheus
from report_size import synthetic
from support.report_model import (
    shop_scan,
    with_xss,
)
from unthrottle.report import Report, render_html
from unthrottle_lab.kube import ControlPlane

try:
    from playwright.sync_api import BrowserContext, sync_playwright
except ImportError:  # pragma: no cover - the test extra installs it
    sync_playwright = None  # type: ignore[assignment]
from support.report_html import (
    ARTIFACTS,
    COLOURS,
    DRAWN_PATHS,
    LABELS,
    BrowserContext,
    Visit,
    _contrast,
    _open,
    requires_browser,
)

pytestmark = requires_browser


@pytest.fixture(scope="module")
def shop_page(browser: BrowserContext, tmp_path_factory: pytest.TempPathFactory,
              control_plane: ControlPlane) -> Iterator[tuple[Visit, Report]]:  # fmt: skip
    folder = tmp_path_factory.mktemp("html")
    with shop_scan(folder, Kube(control_plane)) as result:
        report = Report.from_scan(result, window="12h", prometheus="http://prometheus:9090")
        odd = Report.from_scan(with_xss(result), window="12h")
    path = folder / "report.html"
    path.write_text(render_html(report))
    (folder / "odd.html").write_text(render_html(odd))
    yield from ((v, report) for v in _open(browser, path))


@pytest.fixture(scope="module")
def big_page(browser: BrowserContext, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
    tuple[Visit, Report]
]:  # fmt: skip
    report = Report.from_scan(synthetic(80, 2), window="7d")
    path = tmp_path_factory.mktemp("html") / "big.html"
    path.write_text(render_html(report))
    yield from ((v, report) for v in _open(browser, path))


@requires_prometheus
class TestShopPage:
    def test_no_console_error_and_no_request_leaves_the_file(
        self, shop_page: tuple[Visit, Report]
    ) -> None:
        visit, _ = shop_page
        visit.page.wait_for_timeout(300)  # late loads and errors would show by now
        assert visit.errors == []
        assert len(visit.requests) == 1 and visit.requests[0].startswith("file://")

    def test_script_from_the_cluster_is_inert_text(
        self, shop_page: tuple[Visit, Report], browser: BrowserContext
    ) -> None:
        path = Path(shop_page[0].page.url.removeprefix("file://")).with_name("odd.html")
        for visit in _open(browser, path):
            page = visit.page
            assert page.evaluate("typeof window.__xss") == "undefined"
            assert page.locator("script").count() == 1  # the page's own
            assert "<script>window.__xss" in page.locator("#containers").inner_text()
            assert (
                "<script>window.__xss"
                in page.locator("section[aria-labelledby=plots]").inner_text()
            )
            assert visit.errors == [] and len(visit.requests) == 1

    def test_every_plot_is_drawn_with_a_title_and_a_text_alternative(
        self, shop_page: tuple[Visit, Report]
    ) -> None:
        visit, report = shop_page
        plots = visit.page.locator("figure svg")
        assert plots.count() == len(report.over_target()) >= 2
        for i in range(plots.count()):
            svg = plots.nth(i)
            assert svg.get_attribute("role") == "img"
            assert svg.evaluate(DRAWN_PATHS) > 5
            assert svg.bounding_box()["height"] > 100  # type: ignore[index]
            labels = svg.evaluate(LABELS)
            assert len(labels) == 2 and all(len(t) > 20 for t in labels)

    def test_the_table_sorts_by_a_column_and_back_by_harm(
        self, shop_page: tuple[Visit, Report]
    ) -> None:
        page = shop_page[0].page
        col = 3  # throttled

        def column(i: int) -> list[float]:
            keys = f"rows => rows.map(r => r.cells[{i}].dataset.sort)"
            return [float(x) for x in page.eval_on_selector_all("#containers tbody tr", keys)]

        page.locator("#containers thead th").nth(col).locator("button").click()
        assert column(col) == sorted(column(col), reverse=True)
        page.locator("#containers thead th").nth(col).locator("button").click()
        assert column(col) == sorted(column(col))
        page.locator("#containers thead th").nth(0).locator("button").click()
        page.locator("#containers thead th").nth(0).locator("button").click()
        assert column(0) == sorted(column(0))  # rank: most harmful first again

    def test_text_has_enough_contrast(self, shop_page: tuple[Visit, Report]) -> None:
        page = shop_page[0].page
        for selector in ("body", ".provenance", ".note", "td", "th", "a", ".bad", "figcaption",
                         "tr.over td", "details summary"):  # fmt: skip
            for fg, bg in page.evaluate(COLOURS, selector):
                assert _contrast(tuple(fg), tuple(bg)) >= 4.5, selector

    def test_it_prints(self, shop_page: tuple[Visit, Report]) -> None:
        page = shop_page[0].page
        page.emulate_media(media="print")
        try:
            assert page.pdf(format="A4")[:4] == b"%PDF"
            assert page.evaluate("Array.from(document.querySelectorAll('details'))"
                                 ".every(d => d.open)")  # fmt: skip
        finally:
            page.emulate_media(media="screen")

    def test_a_screenshot_is_kept_as_a_test_artifact(self, shop_page: tuple[Visit, Report]) -> None:
        page = shop_page[0].page
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.evaluate("document.querySelectorAll('details').forEach(d => { d.open = false; })")
        page.evaluate("window.scrollTo(0, 0)")
        page.screenshot(path=str(ARTIFACTS / "report.png"))
        page.screenshot(path=str(ARTIFACTS / "report-full.png"), full_page=True)
        assert (ARTIFACTS / "report.png").stat().st_size > 10_000
        print(f"screenshots: {ARTIFACTS}/report.png, report-full.png")


class TestBigPage:
    def test_fifty_plots_all_drawn_without_an_error(self, big_page: tuple[Visit, Report]) -> None:
        visit, report = big_page
        assert len(report.over_target()) > 50
        drawn = visit.page.eval_on_selector_all("figure svg", f"svgs => svgs.map({DRAWN_PATHS})")
        assert len(drawn) == 50 and min(drawn) > 5
        ids: Any = visit.page.evaluate(
            "Array.from(document.querySelectorAll('[id]')).map(e => e.id)")  # fmt: skip
        assert len(ids) == len(set(ids))  # plots' ids do not collide
        assert visit.errors == [] and len(visit.requests) == 1
