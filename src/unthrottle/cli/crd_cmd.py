"""``unthrottle crd``: the ThrottlePolicy CRD, generated from the model."""

from __future__ import annotations

import typer

from unthrottle.model.crd import crd_yaml


def crd_command() -> None:
    """Print the ThrottlePolicy CustomResourceDefinition (YAML), generated from the model.

    The committed crds/throttlepolicy.yaml is this output; regenerate it with
    `unthrottle crd > crds/throttlepolicy.yaml`.
    """
    typer.echo(crd_yaml(), nl=False)
