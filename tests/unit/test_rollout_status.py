"""When a rollout is done, for each kind, as ``kubectl rollout status`` says it
(k8s.io/kubectl's polymorphichelpers/rollout_status.go, v0.36): the cases it tells apart."""

from __future__ import annotations

from typing import Any

import pytest

from unthrottle.operator.gates import on_delete, rollout

PARTITION_2 = {"type": "RollingUpdate", "rollingUpdate": {"partition": 2}}


def sts(replicas: int = 3, *, generation: int = 2, observed: int = 2, ready: int = 3,
        updated: int = 3, strategy: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    return {"kind": "StatefulSet", "metadata": {"generation": generation},
            "spec": {"replicas": replicas, "updateStrategy": strategy or {
                "type": "RollingUpdate", "rollingUpdate": {"partition": 0}}},
            "status": {"observedGeneration": observed, "readyReplicas": ready,
                       "updatedReplicas": updated}}  # fmt: skip


def ds(*, generation: int = 2, observed: int = 2, desired: int = 3, updated: int = 3,
       available: int = 3, strategy: str = "RollingUpdate") -> dict[str, Any]:  # fmt: skip
    return {"kind": "DaemonSet", "metadata": {"generation": generation},
            "spec": {"updateStrategy": {"type": strategy}},
            "status": {"observedGeneration": observed, "desiredNumberScheduled": desired,
                       "updatedNumberScheduled": updated,
                       "numberAvailable": available}}  # fmt: skip


@pytest.mark.parametrize(
    ("obj", "state"),
    [
        (sts(), "done"),
        (sts(observed=1), "progressing"),  # the spec change not observed yet
        (sts(ready=2), "progressing"),  # a replica not ready
        (sts(updated=2), "progressing"),  # one pod still at the old revision
        (sts(updated=1, strategy=PARTITION_2), "done"),  # ordinal 2 alone is updated
        (sts(updated=0, strategy=PARTITION_2), "progressing"),
        (sts(updated=0, strategy={"type": "OnDelete"}), "progressing"),  # the team's restarts
        (sts(updated=3, strategy={"type": "OnDelete"}), "done"),
        (ds(), "done"),
        (ds(observed=1), "progressing"),
        (ds(updated=2), "progressing"),  # a node's pod not updated yet
        (ds(available=2), "progressing"),  # updated, not available yet
    ],
    ids=[
        "sts-done",
        "sts-unobserved",
        "sts-unready",
        "sts-one-old",
        "sts-partition-done",
        "sts-partition-waiting",
        "sts-ondelete-waiting",
        "sts-ondelete-done",
        "ds-done",
        "ds-unobserved",
        "ds-one-old",
        "ds-unavailable",
    ],
)
def test_rollout_done_as_kubectl_says_it(obj: dict[str, Any], state: str) -> None:
    assert rollout(obj) == state


def test_on_delete_is_a_statefulsets_or_daemonsets_strategy() -> None:
    assert on_delete(sts(strategy={"type": "OnDelete"})) and on_delete(ds(strategy="OnDelete"))
    assert not on_delete(sts()) and not on_delete(ds())
    assert not on_delete({"kind": "Deployment", "spec": {"updateStrategy": {"type": "OnDelete"}}})
