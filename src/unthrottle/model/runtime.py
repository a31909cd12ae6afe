"""What runs in a container, as far as processor counts go: read from a Deployment's
containers (:mod:`unthrottle.kube.workloads`), used by the engine to size GOMAXPROCS or a
JVM's processor count."""

from __future__ import annotations

from enum import StrEnum


class Runtime(StrEnum):
    """What runs in the container, as far as processor counts go."""

    GO = "go"
    JVM = "jvm"
    OTHER = "other"
    UNKNOWN = "unknown"
