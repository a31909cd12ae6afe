"""What every command shares: errors for people on stderr, and loading a kubeconfig."""

from __future__ import annotations

import os
from pathlib import Path

import typer
from rich.console import Console

err = Console(stderr=True)


def fail(message: str, code: int) -> typer.Exit:
    """Print ``error: message`` on stderr; the Exit to raise with ``code``."""
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def load_kube_config(kubeconfig: Path | None, *, hint: str = "") -> None:
    """In-cluster when there and no file is named, else the kubeconfig; exit 2 if it fails."""
    from kubernetes import config

    try:
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        else:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=str(kubeconfig) if kubeconfig else None
            )
    except Exception as error:
        raise fail(f"--kubeconfig: cannot load it ({error}){hint}", 2) from None
