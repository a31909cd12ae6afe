"""`unthrottle recommend` and the scan pipeline through Thanos Query, as users who shard or
replicate Prometheus run them: test_recommend_cli's hour dealt over two Prometheus servers
(a sidecar beside each, Thanos built from its Go module), over two replicas, and with one
store gone. docs/thanos.md has the figures."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from prom import PrometheusServer, requires_prometheus
from support.recommend_cli import cli, cli_history
from support.thanos import (
    limits,
    report,
    scanned,
    series_count,
    split,
    thanos_over,
    wait_until,
    warnings_of,
    what_a_user_sees,
)
from unthrottle.metrics.source import PrometheusConfig, PrometheusSource
from unthrottle_lab.thanos import ThanosQuery

pytestmark = requires_prometheus
SHARDS = [{"shard": "a"}, {"shard": "b"}]
REPLICAS = [{"replica": "0"}, {"replica": "1"}]


@pytest.fixture(scope="module")
def hour() -> tuple[str, float]:
    """test_recommend_cli's hour, and when it ends."""
    return cli_history(), time.time()


@pytest.fixture(scope="module")
def single(hour: tuple[str, float], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One Prometheus holding the whole hour: what the querier is compared with."""
    with PrometheusServer(tmp_path_factory.mktemp("single"), openmetrics=hour[0]) as prom:
        yield prom.url


@pytest.fixture(scope="module")
def shards(thanos_binary: Path, hour: tuple[str, float],
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThanosQuery]:  # fmt: skip
    """Thanos Query over two Prometheus servers, each holding half the pods' series."""
    with thanos_over(thanos_binary, tmp_path_factory.mktemp("shards"), split(hour[0]),
                     SHARDS) as query:  # fmt: skip
        yield query


def test_the_api_pods_live_on_both_shards(shards: ThanosQuery, hour: tuple[str, float]) -> None:
    # api's evidence is a sum over pods whose series are on different servers; the querier
    # names each series' server by its external label
    source = PrometheusSource(PrometheusConfig(shards.url, retries=0))
    pods = source.instant(
        'count by (shard) (last_over_time(container_cpu_cfs_periods_total{container="api"}[1h]))',
        at=hour[1],
    )
    assert {s.labels["shard"]: s.value for s in pods} == {"a": 1, "b": 2}


def test_the_report_through_the_querier_is_the_single_server_s(
    single: str, shards: ThanosQuery
) -> None:
    assert what_a_user_sees(report(shards.url)) == what_a_user_sees(report(single))


def test_the_scan_sends_as_many_queries_and_sizes_alike(
    single: str, shards: ThanosQuery, hour: tuple[str, float]
) -> None:
    ours, sent = scanned(shards.url, hour[1])
    theirs, expected = scanned(single, hour[1])
    assert sent == expected
    assert limits(ours) == limits(theirs)
    assert any(c.recommendation for w in ours.workloads for c in w.containers)


PERIODS = 'container_cpu_cfs_periods_total{namespace="shop"}'


@pytest.mark.parametrize("replica_labels", [("replica",), ()],
                         ids=["deduplicated", "without --query.replica-label"])  # fmt: skip
def test_two_replicas_give_the_single_server_s_report(
    thanos_binary: Path, hour: tuple[str, float], single: str, tmp_path: Path,
    replica_labels: tuple[str, ...],
) -> None:  # fmt: skip
    with thanos_over(thanos_binary, tmp_path, [hour[0], hour[0]], REPLICAS,
                     replica_labels=replica_labels) as query:  # fmt: skip
        seen = what_a_user_sees(report(query.url))
        ours, sent = scanned(query.url, hour[1])
        copies = series_count(query.url, PERIODS) / series_count(single, PERIODS)
    theirs, expected = scanned(single, hour[1])
    assert seen == what_a_user_sees(report(single))
    assert (sent, limits(ours)) == (expected, limits(theirs))
    # without the replica label every series comes twice, and every sum doubles: the
    # throttle ratio and the histogram's quantiles are ratios, so the report cannot tell
    assert copies == (1 if replica_labels else 2)


def _recommend(url: str) -> tuple[int, str, list[str]]:
    out = cli("--prometheus", url, "--no-cluster", "--namespace", "shop", "--window", "1h",
              "--format", "json")  # fmt: skip
    names = [w["deployment"] for w in json.loads(out.stdout)["workloads"]] if out.stdout else []
    return out.returncode, out.stderr, names


def test_a_store_gone_fails_the_report_until_the_querier_drops_it_then_half_is_silent(
    thanos_binary: Path, hour: tuple[str, float], tmp_path: Path
) -> None:
    with thanos_over(thanos_binary, tmp_path, split(hour[0]), SHARDS) as query:
        assert _recommend(query.url)[::2] == (0, ["api", "batch", "idle"])
        query.sidecars[1].stop()
        # unthrottle asks partial_response=false: Thanos refuses rather than answer half
        code, stderr, _ = _recommend(query.url)
        assert code == 1 and 'fetch series for {shard="b"}' in stderr, stderr
        # … until its endpoint check drops the store: then it is not asked, and not missed
        dropped_s = wait_until(lambda: not warnings_of(query.url, PERIODS), timeout_s=60)
        code, stderr, names = _recommend(query.url)
    assert (code, names) == (0, ["api"]), stderr  # batch's and idle's owners were on shard b
    assert not stderr.strip()  # nothing says that two Deployments' evidence is missing
    print(f"the querier dropped the stopped store after {dropped_s:.1f} s")


def test_with_strict_endpoints_a_store_gone_fails_every_report(
    thanos_binary: Path, hour: tuple[str, float], tmp_path: Path
) -> None:
    with thanos_over(thanos_binary, tmp_path, split(hour[0]), SHARDS, strict=True) as query:
        query.sidecars[1].stop()
        first = _recommend(query.url)
        time.sleep(12)  # past two of the querier's endpoint checks (every 5 s)
        later = _recommend(query.url)
        still_warned = bool(warnings_of(query.url, PERIODS))
    for code, stderr, _ in (first, later):
        assert code == 1 and "Prometheus refused a query" in stderr, stderr
    assert still_warned  # Thanos's own default (partial responses) would answer with half
