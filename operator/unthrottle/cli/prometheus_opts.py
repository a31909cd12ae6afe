"""The Prometheus options every command that reads Prometheus shares, and their checks."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from unthrottle.cli.common import err, fail
from unthrottle.metrics.source import PrometheusConfig

BearerTokenFile = Annotated[Path | None, typer.Option(help="Re-read when it changes.")]
CaBundle = Annotated[Path | None, typer.Option(help="CA certificates for TLS.")]
Insecure = Annotated[bool, typer.Option(help="Skip TLS verification.")]
Header = Annotated[
    list[str] | None, typer.Option(help="Extra header NAME=VALUE (repeat), e.g. X-Scope-OrgID.")
]
Timeout = Annotated[float, typer.Option(help="Seconds per query.")]
BearerToken = Annotated[
    str | None,
    typer.Option(
        envvar="UNTHROTTLE_PROMETHEUS_TOKEN",
        show_default=False,
        help="Bearer token (better from the environment than the command line).",
    ),
]
BasicAuth = Annotated[
    str | None,
    typer.Option(
        envvar="UNTHROTTLE_PROMETHEUS_BASIC_AUTH",
        show_default=False,
        help="USER:PASSWORD (better from the environment).",
    ),
]
Retries = Annotated[int, typer.Option(help="Retries on errors and 429/5xx, backing off.")]


def prometheus_config(url: str, *, bearer_token: str | None, bearer_token_file: Path | None,
                      basic_auth: str | None, ca_bundle: Path | None, insecure: bool,
                      header: list[str] | None, timeout: float,
                      retries: int) -> PrometheusConfig:  # fmt: skip
    """The options as a config; a bad one exits 2 naming the flag."""
    if insecure:
        err.print("note: --insecure: the Prometheus server's certificate is not checked",
                  highlight=False)  # fmt: skip
    auth = None
    if basic_auth is not None:
        user, sep, password = basic_auth.partition(":")
        if not sep or not user:
            raise fail("--basic-auth: expected USER:PASSWORD", 2)
        auth = (user, password)
    if retries < 0:
        raise fail("--retries: must be 0 or more", 2)
    headers = {}
    for pair in header or []:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise fail(f"--header: {pair!r} is not NAME=VALUE", 2)
        headers[name] = value
    return PrometheusConfig(
        url=url, bearer_token=bearer_token, bearer_token_file=bearer_token_file,
        basic_auth=auth, ca_bundle=ca_bundle, insecure=insecure, headers=headers,
        timeout_s=timeout, retries=retries,
    )  # fmt: skip
