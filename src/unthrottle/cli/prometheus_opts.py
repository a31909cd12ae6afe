"""The Prometheus options every command that reads Prometheus shares, and their checks.

:func:`prometheus_config` is the one place they are checked: the URL, the credentials,
the headers, the CA bundle, the timeout and the retries, each refused with a message
naming its flag (or its environment variable), never quoting a secret. Every secret is
handed to :func:`unthrottle.cli.text.hide` first, so no output can show it.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Annotated

import typer

from unthrottle.cli.common import fail, note
from unthrottle.cli.text import hide
from unthrottle.metrics.source import (
    MAX_RETRIES,
    MAX_TIMEOUT_S,
    PrometheusConfig,
    PrometheusConfigError,
    is_secret_header,
    strip_token,
    token_problem,
)

TOKEN_ENV = "UNTHROTTLE_PROMETHEUS_TOKEN"
BASIC_AUTH_ENV = "UNTHROTTLE_PROMETHEUS_BASIC_AUTH"

BearerTokenFile = Annotated[
    Path | None, typer.Option(help="Re-read when it changes; a trailing newline is dropped.")
]
CaBundle = Annotated[Path | None, typer.Option(help="CA certificates (PEM) for https://.")]
Insecure = Annotated[bool, typer.Option(help="Skip TLS verification.")]
Header = Annotated[
    list[str] | None, typer.Option(help="Extra header NAME=VALUE (repeat), e.g. X-Scope-OrgID.")
]
Timeout = Annotated[
    float,
    typer.Option(
        help=f"Seconds to connect and to wait for each answer (at most {MAX_TIMEOUT_S:g})."
    ),
]
BearerToken = Annotated[
    str | None,
    typer.Option(
        envvar=TOKEN_ENV,
        show_default=False,
        help="Bearer token (better from the environment than the command line).",
    ),
]
BasicAuth = Annotated[
    str | None,
    typer.Option(
        envvar=BASIC_AUTH_ENV,
        show_default=False,
        help="USER:PASSWORD (better from the environment).",
    ),
]
Retries = Annotated[
    int,
    typer.Option(
        help=f"Retries (0-{MAX_RETRIES}) on refused connections and 429/5xx, backing off."
    ),
]

_FLAGS = {
    "url": "--prometheus",
    "bearer_token": "--bearer-token",
    "basic_auth": "--basic-auth",
    "headers": "--header",
    "timeout_s": "--timeout",
    "retries": "--retries",
}


def _flag(field: str, context: typer.Context | None) -> str:
    """The flag a config field came from, with its environment variable if it came so."""
    flag = _FLAGS.get(field, field)
    env = {"bearer_token": TOKEN_ENV, "basic_auth": BASIC_AUTH_ENV}.get(field)
    if env and context is not None:
        source = context.get_parameter_source(field)
        if source is not None and source.name == "ENVIRONMENT":
            return f"{flag} (from ${env})"
    return flag


def _token(value: str | None, path: Path | None) -> str | None:
    """The token given on the command line or in the environment, a trailing newline
    dropped; the token file is checked to be readable and to hold a token."""
    if value is not None and path is not None:
        raise fail("--bearer-token and --bearer-token-file: give one or the other", 2)
    if path is not None:
        try:
            problem = token_problem(strip_token(path.read_text(errors="replace")))
        except OSError as error:
            raise fail(f"--bearer-token-file: cannot read {path}: {error.strerror}", 2) from None
        if problem is not None:
            raise fail(f"--bearer-token-file: {path} {problem}", 2)
    return strip_token(value) if value is not None else None


def _ca_bundle(path: Path | None, url: str, insecure: bool) -> None:
    if path is None:
        return
    if insecure:
        raise fail("--ca-bundle and --insecure: give one or the other", 2)
    if not url.lower().startswith("https://"):
        raise fail("--ca-bundle: only https:// uses it, and --prometheus is not https://", 2)
    if not path.exists():
        raise fail(f"--ca-bundle: {path} not found", 2)
    if not path.is_file():
        raise fail(f"--ca-bundle: {path} is not a file of PEM certificates", 2)
    try:
        ssl.create_default_context(cafile=str(path))
    except (ssl.SSLError, OSError, ValueError):
        raise fail(f"--ca-bundle: {path} holds no PEM certificate", 2) from None


def prometheus_config(url: str, *, bearer_token: str | None, bearer_token_file: Path | None,
                      basic_auth: str | None, ca_bundle: Path | None, insecure: bool,
                      header: list[str] | None, timeout: float, retries: int,
                      context: typer.Context | None = None) -> PrometheusConfig:  # fmt: skip
    """The options as a config; a bad one exits 2 naming the flag (and the environment
    variable, when ``context`` says the value came from there)."""
    named = (pair.partition("=") for pair in header or [])
    hide(bearer_token, basic_auth, *(value for name, _, value in named if is_secret_header(name)))
    if basic_auth is not None:
        hide(basic_auth.partition(":")[2])
    token = _token(bearer_token, bearer_token_file)
    auth = None
    if basic_auth is not None:
        user, sep, password = basic_auth.partition(":")
        if not sep or not user:
            raise fail(f"{_flag('basic_auth', context)}: expected USER:PASSWORD", 2)
        auth = (user, password.removesuffix("\n").removesuffix("\r"))
    headers = {}
    for pair in header or []:
        name, sep, value = pair.partition("=")
        if not sep or not name:  # the text is not quoted: it may be a credential
            raise fail("--header: expected NAME=VALUE, e.g. X-Scope-OrgID=team-a", 2)
        if name in headers:
            raise fail(f"--header: {name!r} is given twice", 2)
        headers[name] = value
    _ca_bundle(ca_bundle, url, insecure)
    try:
        config = PrometheusConfig(
            url=url, bearer_token=token, bearer_token_file=bearer_token_file,
            basic_auth=auth, ca_bundle=ca_bundle, insecure=insecure, headers=headers,
            timeout_s=timeout, retries=retries,
        )  # fmt: skip
    except PrometheusConfigError as error:
        raise fail(f"{_flag(error.field, context)}: {error.reason}", 2) from None
    if insecure:
        if config.url.startswith("http://"):
            note("--insecure: --prometheus is http://, so there is no certificate to check")
        else:
            note("--insecure: the Prometheus server's certificate is not checked")
    return config
