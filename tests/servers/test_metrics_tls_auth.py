"""TLS and basic auth against a real Prometheus (its --web.config.file): HTTPS with a certificate
from a CA of the test's own, and Prometheus's own password check."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from prom import PrometheusServer, requires_prometheus
from unthrottle.metrics.source import MetricsError, PrometheusConfig, PrometheusSource

pytestmark = requires_prometheus


def test_the_ca_bundle_makes_the_server_trusted(https: tuple[str, Path]) -> None:
    url, ca = https
    assert url.startswith("https://")
    answer = PrometheusSource(PrometheusConfig(url, ca_bundle=ca)).instant("vector(1)")
    assert [s.value for s in answer] == [1.0]


def test_an_unknown_ca_is_refused_and_the_error_says_what_to_pass(
    https: tuple[str, Path],
) -> None:
    url, _ = https
    with pytest.raises(MetricsError, match="check --ca-bundle"):
        PrometheusSource(PrometheusConfig(url, retries=0)).instant("vector(1)")


def test_insecure_skips_verification(https: tuple[str, Path]) -> None:
    url, _ = https
    answer = PrometheusSource(PrometheusConfig(url, insecure=True)).instant("vector(1)")
    assert [s.value for s in answer] == [1.0]


def test_the_cli_takes_the_ca_bundle(https: tuple[str, Path]) -> None:
    url, ca = https
    command = [str(Path(sys.executable).with_name("unthrottle")), "recommend", "--prometheus",
               url, "--no-cluster", "--namespace", "shop", "--ca-bundle", str(ca)]  # fmt: skip
    out = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    # an empty Prometheus: past TLS, there are simply no Deployments
    assert out.returncode == 1, out.stderr
    assert "no Deployments, StatefulSets or DaemonSets found in shop" in out.stderr


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Prometheus that asks for basic auth: user ``ops``, password ``pa:ss word``."""
    import bcrypt

    hashed = bcrypt.hashpw(b"pa:ss word", bcrypt.gensalt(rounds=4)).decode()
    with PrometheusServer(tmp_path_factory.mktemp("auth"), users={"ops": hashed}) as prom:
        yield prom.url


def test_basic_auth_is_accepted_and_a_wrong_password_is_named(guarded: str) -> None:
    good = PrometheusSource(PrometheusConfig(guarded, basic_auth=("ops", "pa:ss word")))
    assert [s.value for s in good.instant("vector(1)")] == [1.0]
    bad = PrometheusSource(PrometheusConfig(guarded, basic_auth=("ops", "nope"), retries=0))
    with pytest.raises(MetricsError, match="refused the credentials"):
        bad.instant("vector(1)")
