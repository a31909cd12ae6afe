"""PromQL built safely, and a Prometheus client that says what went wrong."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from prom import PrometheusServer, free_port, requires_prometheus
from support.metrics_source import (
    HOSTILE,
    _Recorder,
    history,
)
from unthrottle.metrics.promql import any_of, counter_queries, equals, regex_literal, string
from unthrottle.metrics.source import MetricsError, PrometheusConfig, PrometheusSource


class TestEscaping:
    def test_a_string_literal_escapes_quotes_backslashes_and_newlines(self) -> None:
        assert string('a"b\\c\nd') == '"a\\"b\\\\c\\nd"'

    def test_a_regex_literal_matches_only_itself(self) -> None:
        import re

        for value in [*HOSTILE, "plain-name_1"]:
            assert re.fullmatch(regex_literal(value), value)
            assert not re.fullmatch(regex_literal(value), value + "x")
        assert regex_literal(".*") == "\\.\\*"

    def test_no_namespaces_is_refused(self) -> None:
        with pytest.raises(ValueError, match="namespace: at least one"):
            any_of("namespace", [])

    def test_queries_are_batched_one_per_metric(self) -> None:
        queries = counter_queries(["a", "b", "c"], 7 * 86_400)
        assert len(queries) == 5  # usage, periods, throttled periods and time, the wait
        assert all('namespace=~"a|b|c"' in q and 'container!="POD"' in q for q in queries.values())


@requires_prometheus
def test_hostile_names_select_only_their_own_series_on_a_real_prometheus(tmp_path: Path) -> None:
    now = int(time.time())
    with PrometheusServer(tmp_path, openmetrics=history(now)) as prom:
        source = PrometheusSource(PrometheusConfig(prom.url))
        for ns in HOSTILE:
            query = counter_queries([ns], 3600)["periods"]
            samples = source.instant(query, at=now)
            assert [s.labels["namespace"] for s in samples] == [ns], (ns, query, samples)
            assert samples[0].labels["container"] == "c"  # the POD series is dropped
        both = source.instant(counter_queries(["shop", "a|b"], 3600)["periods"], at=now)
        assert sorted(s.labels["namespace"] for s in both) == ["a|b", "shop"]
        assert source.queries == len(HOSTILE) + 1
        # ".*" as a value is a name, not a pattern: the namespace literally called ".*" has
        # two series (its container and POD), where the pattern would match all 12
        literal = source.instant(f"count({{{equals('namespace', '.*')}}})", at=now)
        assert [s.value for s in literal] == [2.0]


def test_an_unreachable_prometheus_is_named_in_the_error() -> None:
    port = free_port()
    source = PrometheusSource(PrometheusConfig(f"http://127.0.0.1:{port}", retries=0))
    with pytest.raises(MetricsError, match=f"unreachable at http://127.0.0.1:{port}"):
        source.instant("up")


@pytest.fixture
def recorder() -> tuple[str, type[_Recorder]]:
    handler = type("Recorder", (_Recorder,), {"seen": [], "paths": [], "status": 200})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


def test_a_rotated_token_file_is_read_again_and_headers_reach_the_server(
    recorder: tuple[str, type[_Recorder]], tmp_path: Path
) -> None:
    url, handler = recorder
    token = tmp_path / "token"
    token.write_text("first\n")
    source = PrometheusSource(PrometheusConfig(url, bearer_token_file=token,
                                               headers={"X-Scope-OrgID": "team-a"}))  # fmt: skip
    assert source.instant("up")[0].labels == {"job": "x"}
    token.write_text("second-and-longer\n")
    source.instant("up")
    assert [h["Authorization"] for h in handler.seen] == [
        "Bearer first",
        "Bearer second-and-longer",
    ]
    assert all(h["X-Scope-OrgID"] == "team-a" for h in handler.seen)


def test_every_query_asks_for_a_whole_answer_or_none(
    recorder: tuple[str, type[_Recorder]],
) -> None:
    # Thanos Query answers by default from the stores it reached, their loss a warning
    # beside the data, and a recommendation from half the pods sizes for half the demand
    # (docs/thanos.md): partial_response=false turns that into an error
    url, handler = recorder
    source = PrometheusSource(PrometheusConfig(url))
    source.instant("up")
    source.range("up", 0, 60, 15)
    asked = [parse_qs(urlsplit(path).query) for path in handler.paths]
    assert [urlsplit(path).path for path in handler.paths] == [
        "/api/v1/query",
        "/api/v1/query_range",
    ]
    assert [query["partial_response"] for query in asked] == [["false"], ["false"]]


def test_refused_credentials_say_so(recorder: tuple[str, type[_Recorder]]) -> None:
    url, handler = recorder
    handler.status = 401
    source = PrometheusSource(PrometheusConfig(url, bearer_token="wrong", retries=0))
    with pytest.raises(MetricsError, match="refused the credentials"):
        source.instant("up")


def test_the_cli_sends_the_token_and_basic_auth_from_the_environment(
    recorder: tuple[str, type[_Recorder]],
) -> None:
    url, handler = recorder
    command = [str(Path(sys.executable).with_name("unthrottle")), "recommend", "--prometheus",
               url, "--no-cluster", "--namespace", "shop"]  # fmt: skip
    for env, expected in (
        ({"UNTHROTTLE_PROMETHEUS_TOKEN": "s3cret"}, "Bearer s3cret"),
        ({"UNTHROTTLE_PROMETHEUS_BASIC_AUTH": "ops:pa:ss"},
         "Basic " + base64.b64encode(b"ops:pa:ss").decode()),
    ):  # fmt: skip
        handler.seen.clear()
        out = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False,
                             env={**os.environ, **env})  # fmt: skip
        # it got past authentication
        assert "no Deployments, StatefulSets or DaemonSets found in shop" in out.stderr
        assert handler.seen and {h["Authorization"] for h in handler.seen} == {expected}
