"""What test_report_html.py shares with other test modules: constants, helpers and
fixtures (and the tests another module runs again), so that no test module imports
another."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from missing import MISSING

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "build" / "test-artifacts"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update",
         "--disable-sync"]  # fmt: skip

try:
    from playwright.sync_api import BrowserContext, Page, Route, sync_playwright
except ImportError:  # pragma: no cover - the test extra installs it
    sync_playwright = None  # type: ignore[assignment]

requires_browser = pytest.mark.skipif(
    sync_playwright is None or not Path(CHROMIUM).exists(),
    reason=f"{MISSING} chromium is not installed (make browser installs Debian's as root) "
    "or playwright is missing",
)


@dataclass
class Visit:
    """What the browser saw while the page was open."""

    page: Page
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrowserContext]:
    profile = tmp_path_factory.mktemp("chromium-profile")  # fresh: no state, no sync
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, headless=True, args=FLAGS,
            viewport={"width": 1280, "height": 900},
        )  # fmt: skip
        try:
            yield context
        finally:
            context.close()


def _open(browser: BrowserContext, path: Path) -> Iterator[Visit]:
    page = browser.new_page()
    visit = Visit(page)

    def route(r: Route) -> None:
        visit.requests.append(r.request.url)
        if r.request.url == path.as_uri():
            r.continue_()
        else:
            r.abort()  # nothing else may load: recorded above, and failed here

    page.route("**/*", route)
    page.on("console", lambda m: visit.errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: visit.errors.append(str(e)))
    page.goto(path.as_uri(), wait_until="load")
    yield visit
    page.close()


def _luminance(rgb: tuple[float, ...]) -> float:
    def channel(c: float) -> float:
        c /= 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (channel(c) for c in rgb[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def _contrast(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    hi, lo = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


DRAWN_PATHS = "s => Array.from(s.querySelectorAll('path')).filter(p => (p.getAttribute('d') || '').trim()).length"  # noqa: E501
LABELS = "s => s.getAttribute('aria-labelledby').split(' ').map(id => document.getElementById(id).textContent)"  # noqa: E501
COLOURS = """(selector) => {
  const rgb = (s) => s.match(/[\\d.]+/g).map(Number);
  return Array.from(document.querySelectorAll(selector)).slice(0, 5).map((el) => {
    let bg = el;
    while (bg && rgb(getComputedStyle(bg).backgroundColor)[3] === 0) bg = bg.parentElement;
    return [rgb(getComputedStyle(el).color),
            bg ? rgb(getComputedStyle(bg).backgroundColor) : [255, 255, 255]];
  });
}"""
