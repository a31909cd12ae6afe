"""What test_thanos.py needs: test_recommend_cli's hour of history dealt over Prometheus
servers (shards or replicas), Thanos Query in front of them, and what ``unthrottle
recommend`` and the scan pipeline make of either."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests

from missing import MISSING
from prom import PrometheusServer
from support.recommend_cli import cli
from unthrottle.metrics.source import PrometheusConfig, PrometheusSource
from unthrottle.model.owners import KINDS
from unthrottle.scan import ScanRequest, ScanResult, scan
from unthrottle_lab.kube.build import BuildError
from unthrottle_lab.kube.thanos_build import ensure_thanos_built
from unthrottle_lab.thanos import ThanosQuery

HOUR = 3600
_POD = re.compile(r'[{,]pod="([^"]*)"')


@pytest.fixture(scope="module")
def thanos_binary() -> Path:
    """``thanos`` from its Go module (``make controlplane`` builds it; built here when the
    cache has none, about 7 minutes from cold)."""
    try:
        return ensure_thanos_built()
    except BuildError as error:
        pytest.skip(f"{MISSING} thanos, built from its Go module: {error}")


def split(openmetrics: str, shards: int = 2) -> list[str]:
    """The history's series dealt to ``shards`` servers in turn, by pod: every series of a
    pod on one server, as a Prometheus sharded by scrape target (hashmod) keeps them; a
    series without a pod (kube-state-metrics' ReplicaSets and Deployments) by itself. In
    the order they first appear: an api pod on each of two shards."""
    order: dict[str, int] = {}
    dealt: list[list[str]] = [[] for _ in range(shards)]
    for line in openmetrics.splitlines():
        if not line or line.startswith("#"):
            continue
        found = _POD.search(line)
        key = found.group(1) if found else line[: line.rfind("}") + 1]
        dealt[order.setdefault(key, len(order) % shards)].append(line)
    return ["\n".join(lines) + "\n" for lines in dealt]


@contextmanager
def thanos_over(
    binary: Path,
    folder: Path,
    histories: Sequence[str],
    labels: Sequence[dict[str, str]],
    **query: Any,
) -> Iterator[ThanosQuery]:
    """A Prometheus for each history, each with its external labels, a sidecar beside each
    and Thanos Query over them (``query``: :class:`ThanosQuery`'s options); every process
    ended by PID on the way out."""
    with ExitStack() as stack:
        servers = []
        for k, (history, named) in enumerate(zip(histories, labels, strict=True)):
            (place := folder / f"prometheus-{k}").mkdir(parents=True)
            servers.append(stack.enter_context(
                PrometheusServer(place, openmetrics=history, external_labels=named)))  # fmt: skip
        yield stack.enter_context(ThanosQuery(binary, servers, folder / "thanos", **query))


def report(url: str, *extra: str) -> dict[str, Any]:
    """``unthrottle recommend --format json`` over the hour, as a user runs it."""
    out = cli("--prometheus", url, "--no-cluster", "--namespace", "shop", "--window", "1h",
              "--format", "json", *extra)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


def what_a_user_sees(doc: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Each container of a report, in its order: what it recommends and from what."""
    return [
        (w["deployment"], c["name"], c["evidence"], c["current"], c["demand"],
         c["throttle_ratio"], c["recommendation"] and {
             k: c["recommendation"][k] for k in ("limit_millicores", "burst_us", "gomaxprocs")})
        for w in doc["workloads"] for c in w["containers"]
    ]  # fmt: skip


def scanned(url: str, end: float) -> tuple[ScanResult, int]:
    """The scan pipeline (``recommend``'s and the operator's) over the hour ending at
    ``end``, kube-state-metrics as the cluster, and the queries it sent."""
    source = PrometheusSource(PrometheusConfig(url, retries=0))
    request = ScanRequest(window_s=HOUR, now=end, namespaces=("shop",), kinds=KINDS)
    return scan(request, source, None), source.queries


def limits(result: ScanResult) -> dict[tuple[str, str], tuple[Any, ...]]:
    """Each container's evidence and recommended limit and burst."""
    return {
        (w.deployment, c.name): (
            c.evidence, c.pods, None if c.recommendation is None else (
                c.recommendation.limit_millicores, c.recommendation.burst_us))
        for w in result.workloads for c in w.containers
    }  # fmt: skip


def wait_until(ready: Any, timeout_s: float) -> float:
    """Seconds until ``ready()`` was true (polled every 0.2 s); fails after ``timeout_s``."""
    began = time.monotonic()
    while not ready():
        assert time.monotonic() - began < timeout_s, f"not within {timeout_s:g} s"
        time.sleep(0.2)
    return time.monotonic() - began


def warnings_of(url: str, promql: str) -> list[str]:
    """The ``warnings`` Thanos Query puts beside an instant query's data, as it answers by
    default (partial responses allowed): what unthrottle does not read."""
    reply = requests.get(f"{url}/api/v1/query", params={"query": promql}, timeout=10)
    reply.raise_for_status()
    return list(reply.json().get("warnings") or [])


def series_count(url: str, promql: str) -> int:
    """How many series the querier answers ``promql`` with, as unthrottle asks."""
    return len(PrometheusSource(PrometheusConfig(url, retries=0)).instant(promql))
