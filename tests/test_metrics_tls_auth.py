"""TLS and basic auth against a real Prometheus (its --web.config.file): HTTPS with a certificate
from a CA of the test's own, and Prometheus's own password check."""

from __future__ import annotations

import datetime
import ipaddress
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from prom import PrometheusServer, requires_prometheus
from unthrottle.metrics.source import MetricsError, PrometheusConfig, PrometheusSource

pytestmark = requires_prometheus


def _cert(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name,
          signer: ec.EllipticCurvePrivateKey, *, ca: bool) -> x509.Certificate:  # fmt: skip
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
        builder = builder.add_extension(san, critical=False)
    return builder.sign(signer, hashes.SHA256())


@pytest.fixture(scope="module")
def https(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A Prometheus on https://127.0.0.1, and the CA bundle that vouches for it."""
    folder = tmp_path_factory.mktemp("tls")
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "unthrottle test CA")])
    ca = _cert("unthrottle test CA", ca_key, ca_name, ca_key, ca=True)
    server = _cert("127.0.0.1", key, ca_name, ca_key, ca=False)
    paths = {name: folder / name for name in ("ca.pem", "server.pem", "server.key")}
    paths["ca.pem"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["server.pem"].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths["server.key"].write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))  # fmt: skip
    with PrometheusServer(folder, tls=(paths["server.pem"], paths["server.key"])) as prom:
        yield prom.url, paths["ca.pem"]


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
    assert out.returncode == 1 and "no Deployments found in shop" in out.stderr, out.stderr


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
