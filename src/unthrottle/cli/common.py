"""What every command shares: errors and notes for people on stderr, and the Kubernetes
API (loading a kubeconfig, telling what went wrong with a call)."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer
import yaml
from rich.console import Console
from rich.text import Text

from unthrottle.cli.collection import fewer_collections
from unthrottle.cli.text import hide, plain

err = Console(stderr=True, highlight=False, emoji=False, soft_wrap=True)
"""stderr: one line per message (no wrapping), never markup from user text."""

KUBE_RETRIES = 2
"""Retries of a Kubernetes API call whose connection failed; one that timed out waiting
for an answer is not retried (it took its whole timeout once, and would again)."""


def fail(message: str, code: int) -> typer.Exit:
    """Print ``error: message`` on stderr; the Exit to raise with ``code``."""
    err.print(Text.assemble(("error:", "bold red"), " ", plain(message)))
    return typer.Exit(code)


def run_guarded(app: typer.Typer) -> None:
    """Run a console script's app. A bug ends in one line, not a traceback (which may show
    a secret); ``UNTHROTTLE_DEBUG=1`` shows the traceback. ``unthrottle`` and the
    laboratory's ``unthrottle-lab`` both end this way."""
    fewer_collections()
    try:
        app()
    except Exception as error:
        if os.environ.get("UNTHROTTLE_DEBUG") == "1":
            raise
        fail(f"internal error ({type(error).__name__}: {plain(error, one_line=True)}); "
             "UNTHROTTLE_DEBUG=1 shows where", 1)  # fmt: skip
        sys.exit(1)


def note(message: str) -> None:
    """Print ``note: message`` on stderr."""
    err.print(Text("note: " + plain(message)))


_CREDENTIAL_KEY = re.compile(r"token|pass|key|secret|cred|value", re.I)


def _credentials(node: Any, secret: bool = False) -> Iterator[str]:
    """The credentials below a kubeconfig's ``users[].user``: every string under a key
    such as ``token``, ``password``, ``client-key-data``, ``client-secret``, or an exec
    plugin's environment ``value``."""
    if isinstance(node, str) and secret:
        yield node
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from _credentials(value, secret or bool(_CREDENTIAL_KEY.search(str(key))))
    elif isinstance(node, list):
        for value in node:
            yield from _credentials(value, secret)


def _check_kubeconfig(path: Path, where: str, hint: str) -> None:
    """The file is there and is a kubeconfig; its credentials are never printed."""
    if path.is_dir():
        raise fail(f"{where}: {path} is a directory, not a kubeconfig{hint}", 2)
    try:
        doc = yaml.safe_load(path.read_bytes())
    except OSError as error:
        raise fail(f"{where}: cannot read {path}: {error.strerror}{hint}", 2) from None
    except yaml.YAMLError as error:  # its message may quote the file: say only where
        mark = getattr(error, "problem_mark", None)
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise fail(f"{where}: {path} is not YAML{at}, so not a kubeconfig{hint}", 2) from None
    if not isinstance(doc, dict) or not (doc.get("clusters") or doc.get("contexts")):
        raise fail(f"{where}: {path} is not a kubeconfig (it has no clusters or contexts){hint}",
                   2)  # fmt: skip
    for user in doc.get("users") or []:
        if isinstance(user, dict):
            hide(*_credentials(user.get("user")))


def _kubeconfig_files(kubeconfig: Path | None, hint: str) -> tuple[list[Path], str]:
    """The files the kubeconfig is read from, and how to name them in a message."""
    if kubeconfig is not None:
        if not kubeconfig.exists():
            raise fail(f"--kubeconfig: {kubeconfig} not found{hint}", 2)
        return [kubeconfig], "--kubeconfig"
    listed = os.environ.get("KUBECONFIG", "")
    if listed:
        paths = [Path(p).expanduser() for p in listed.split(os.pathsep) if p]
        there = [p for p in paths if p.exists()]
        if not there:
            raise fail(f"$KUBECONFIG: {listed} not found{hint}", 2)
        return there, "$KUBECONFIG"
    default = Path("~/.kube/config").expanduser()
    if not default.exists():
        raise fail(f"no kubeconfig: not in a pod, $KUBECONFIG is unset and {default} "
                   f"does not exist{hint}", 2)  # fmt: skip
    return [default], str(default)


def load_kube_config(kubeconfig: Path | None, *, hint: str = "") -> None:
    """In-cluster when there and no file is named, else the kubeconfig; exit 2 if it fails.

    ``hint`` ends every message (``"; or run with --no-cluster"``). Afterwards, a call
    whose connection failed is retried :data:`KUBE_RETRIES` times, one that timed out is
    not.
    """
    from kubernetes import client, config

    where = "--kubeconfig"
    try:
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            where = "in-cluster config"
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        else:
            files, where = _kubeconfig_files(kubeconfig, hint)
            for path in files:
                _check_kubeconfig(path, where, hint)
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=str(kubeconfig) if kubeconfig else None
            )
    except typer.Exit:
        raise
    except Exception as error:
        raise fail(f"{where}: cannot load it ({error}){hint}", 2) from None
    from urllib3.util.retry import Retry

    configuration = client.Configuration.get_default_copy()
    configuration.retries = Retry(total=KUBE_RETRIES, read=0, backoff_factor=0.5)
    client.Configuration.set_default(configuration)


def kube_server() -> str:
    """The API server the loaded configuration talks to."""
    from kubernetes import client

    return str(client.Configuration.get_default_copy().host)


def describe_kube_error(error: BaseException, timeout_s: float | None = None) -> str:
    """What went wrong with a Kubernetes API call, in a few words, without its body."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import (
        MaxRetryError,
        NameResolutionError,
        NewConnectionError,
        ReadTimeoutError,
        SSLError,
    )

    server = kube_server()
    if isinstance(error, ApiException):
        why = {401: ": the credentials were refused", 403: ": forbidden for this user"}
        return f"the API server at {server} answered HTTP {error.status} {error.reason or ''}" + (
            why.get(error.status or 0, "")
        )
    reason = error.reason if isinstance(error, MaxRetryError) and error.reason else error
    if isinstance(reason, ReadTimeoutError):
        within = f" within {timeout_s:g} s" if timeout_s else ""
        return f"the API server at {server} did not answer{within} (read timeout)"
    if isinstance(reason, SSLError):
        return f"TLS to the API server at {server} failed ({reason})"
    if isinstance(reason, NameResolutionError):
        return f"the API server's host in {server} is not known (DNS)"
    if isinstance(reason, NewConnectionError):
        refused = "refused" in str(reason)
        return f"the API server at {server} is unreachable" + (
            ": connection refused" if refused else ""
        )
    return f"the API server at {server}: {type(reason).__name__}: {reason}"
