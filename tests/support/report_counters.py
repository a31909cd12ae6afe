"""What test_report_counters.py shares with other test modules: constants, helpers and
fixtures (and the tests another module runs again), so that no test module imports
another."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import requests

from shop import Workload

UNTHROTTLE = Path(sys.executable).with_name("unthrottle")
HOURS_6 = 6 * 3600
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "img" / "report-counters.png"
"""The README's picture of a counters-only report (rewritten by the browser test)."""

STEP = 30


@dataclass(frozen=True)
class Pods:
    """Pods of one Deployment container over a span, throttled ``factor`` × as usual."""

    workload: Workload
    names: tuple[str, ...]
    start: int
    end: int
    factor: float = 1.0


def _wave(t: int) -> float:
    return 1 + 0.6 * math.sin(2 * math.pi * t / 7200)


def counters(spans: list[Pods], *, owners: bool = False) -> str:
    """OpenMetrics text (without ``# EOF``)."""
    lines: list[str] = []
    for span in spans:
        w = span.workload
        throttled = min(0.9, w.throttled_share() * span.factor)
        mean = min((1 - w.share) * w.base + w.share * w.burst, w.limit)
        for pod in span.names:
            labels = f'namespace="{w.namespace}",pod="{pod}",container="{w.container}"'
            total = {"usage_seconds": 0.0, "cfs_periods": 0.0, "cfs_throttled_periods": 0.0,
                     "cfs_throttled_seconds": 0.0}  # fmt: skip
            for t in range(span.start, span.end + 1, STEP):
                wave = _wave(t)
                total["usage_seconds"] += min(mean * wave, w.limit) * STEP
                total["cfs_periods"] += 10 * STEP
                total["cfs_throttled_periods"] += min(1.0, throttled * wave) * 10 * STEP
                total["cfs_throttled_seconds"] += throttled * wave * STEP / 2
                lines += [f"container_cpu_{m}_total{{{labels}}} {v:.6f} {t}"
                          for m, v in total.items()]  # fmt: skip
                if owners:
                    rs = pod.rsplit("-", 1)[0]
                    lines += [
                        f'kube_pod_owner{{namespace="{w.namespace}",pod="{pod}",'
                        f'owner_kind="ReplicaSet",owner_name="{rs}"}} 1 {t}',
                        f'kube_replicaset_owner{{namespace="{w.namespace}",replicaset="{rs}",'
                        f'owner_kind="Deployment",owner_name="{w.name}"}} 1 {t}',
                        f'kube_pod_container_resource_limits{{{labels},resource="cpu"}} '
                        f"{w.limit} {t}",
                        f'kube_pod_container_resource_requests{{{labels},resource="cpu"}} '
                        f"{w.limit / 2} {t}",
                    ]  # fmt: skip
    return _sorted(lines)


def _sorted(lines: list[str]) -> str:
    """One series' samples together, in time order (promtool wants each series' samples
    ascending; series may interleave)."""
    by_series: dict[str, list[str]] = {}
    for line in lines:
        by_series.setdefault(line.rsplit(" ", 2)[0], []).append(line)
    out = []
    for series_lines in by_series.values():
        seen: set[str] = set()
        for line in series_lines:
            stamp = line.rsplit(" ", 1)[1]
            if stamp not in seen:  # the owner series repeat per pod: once per time
                seen.add(stamp)
                out.append(line)
    return "\n".join(out) + "\n"


def pods_of(w: Workload, end: int, span: int = HOURS_6) -> Pods:
    return Pods(w, tuple(w.pod_names()), end - span, end)


SHOP = [
    Workload("day1", "checkout", 0.1, 0.10, 1.2, 0.5, 3),
    Workload("day1", "search", 0.2, 0.06, 1.5, 0.6, 2),
    Workload("day1", "cart", 0.1, 0.20, 0.9, 0.4, 2),
    Workload("day1", "catalog", 0.3, 0.0, 0.0, 1.0, 2),
    Workload("day1", "static", 0.05, 0.0, 0.0, 0.5, 1),
]
"""Three throttled (10-30 % of periods), two never."""

SVG = re.compile(r"<svg\b.*?</svg>", re.S)
LINE = re.compile(r'<path d="M [^"]*L [^"]*"')
"""A drawn line: a path that moves, then draws at least one segment."""


def plot_sections(html: str) -> dict[str, list[str]]:
    """``namespace/deployment · container`` → the SVGs of its plot section."""
    out = {}
    for m in re.finditer(r'<section id="c\d+"[^>]*>\s*<h3[^>]*>(.*?)</h3>(.*?)</section>', html,
                         re.S):  # fmt: skip
        out[m.group(1).replace("&middot;", "·")] = SVG.findall(m.group(2))
    return out


def http_queries(url: str) -> dict[str, float]:
    """Prometheus's own count of the queries it answered, by API handler."""
    text = requests.get(url + "/metrics", timeout=10).text
    found = re.findall(r'prometheus_http_requests_total\{code="200",'
                       r'handler="(/api/v1/query[a-z_]*)"\} (\S+)', text)  # fmt: skip
    return {handler: float(v) for handler, v in found}


@dataclass
class Day1:
    placed: list[Workload]
    url: str
    kubeconfig: Path
    folder: Path

    def recommend(self, fmt: str, *more: str) -> tuple[str, dict[str, float]]:
        """``unthrottle recommend --format FMT`` as a user runs it; its output, and the
        queries Prometheus answered for it."""
        before = http_queries(self.url)
        out = subprocess.run(
            [str(UNTHROTTLE), "recommend", "--prometheus", self.url, "--namespace",
             self.placed[0].namespace, "--window", "6h", "--format", fmt, *more],
            capture_output=True, text=True, timeout=180, check=False,
            env={**os.environ, "KUBECONFIG": str(self.kubeconfig)},
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        after = http_queries(self.url)
        return out.stdout, {k: after.get(k, 0) - before.get(k, 0) for k in after}


# -- fifty plotted containers, no cluster: the batch stays a handful ----------------------

MANY = [Workload("fleet", f"svc-{i:03d}", 0.1, 0.04 + 0.002 * i, 1.2, 0.5, 1) for i in range(64)]


# -- in the real browser ------------------------------------------------------------------

STROKES = """() => Array.from(document.querySelectorAll('figure svg g[id*="line2d"] path')).map(
  p => getComputedStyle(p).stroke).filter(s => s && s !== 'none')"""
