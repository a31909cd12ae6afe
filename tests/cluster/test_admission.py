"""The InPlace admission webhook on the real control plane: pods that an InPlace change's
ReplicaSet creates later get the applied CPU limits as they are created, and no pod is
ever held back or changed otherwise.

The operator runs as a user runs it (``unthrottle operator --webhook … --webhook-tls-dir
…``, a subprocess) with a CA and serving certificate for 127.0.0.1 (the control plane's
own PKI code); the MutatingWebhookConfiguration is the one the chart renders (Helm's own
engine), only its ``clientConfig`` pointed at that address with this test's CA. So the
rules, selectors, failurePolicy and timeout are the chart's, applied by the real
kube-apiserver to pods the real ReplicaSet controller creates. The module's operator
reads the API through a recording, fault-injecting proxy (``FaultProxy``): what it looked
up, and an API that fails or stalls. Records are written as Apply's InPlace method
writes them (a ``Record``).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kube import Kube, fresh_name
from kube_faults import FaultProxy
from support.admission import (
    AFTER_M,
    API_FAULTS,
    BURST,
    DEPLOYMENTS,
    LEFT_ALONE,
    REQUEST_M,
    TIMEOUT_S,
    WEBHOOKS,
    Placed,
    Tls,
    Webhook,
    _but_token,
    _log_lines,
    as_templated,
    burst,
    chart_configuration,
    configured,
    container,
    cpu,
    inplace_record,
    looked_up,
    place,
    until_mutating,
    webhook_operator,
)
from unthrottle_lab.kube import ControlPlane


@pytest.fixture(scope="module")
def webhook(control_plane: ControlPlane, throttlepolicy_crd: None, tls: Tls,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Webhook]:  # fmt: skip
    kube, elsewhere = (Kube(control_plane, fresh_name(p)) for p in ("inplace", "elsewhere"))
    for k in (kube, elsewhere):
        k.create_namespace(k.namespace)
    tmp = tmp_path_factory.mktemp("webhook")
    try:
        with FaultProxy(kube) as proxy:
            kubeconfig = proxy.kubeconfig(tmp / "kubeconfig")
            with (
                webhook_operator(kubeconfig, tls, tmp / "operator.log",
                                 [kube.namespace, elsewhere.namespace]) as (operator, port),
                configured(kube, chart_configuration([kube.namespace], port, tls)),
            ):  # fmt: skip
                until_mutating(kube)
                yield Webhook(kube, elsewhere, proxy, operator)
    finally:
        for k in (kube, elsewhere):
            k.delete("v1/namespaces", None, k.namespace)


@pytest.mark.parametrize("guaranteed", [False, True], ids=["burstable", "guaranteed"])
def test_a_scaled_up_pod_gets_the_applied_limit_and_burst_and_nothing_else_changes(
    webhook: Webhook, guaranteed: bool
) -> None:
    placed = place(webhook.kube, fresh_name("api"), guaranteed=guaranteed)
    placed.write_record(inplace_record(placed.rs_name).to_annotation())
    template = placed.deployment()["spec"]["template"]
    old = {p["metadata"]["name"]: p for p in placed.pods()}

    (new,), took = placed.scale(3)

    assert cpu(new) == AFTER_M and burst(new) == BURST
    if guaranteed:  # its request rises with its limit: still Guaranteed, as it was
        assert cpu(new, kind="requests") == AFTER_M
        assert new["status"]["qosClass"] == "Guaranteed"
    else:
        assert cpu(new, kind="requests") == REQUEST_M
        assert new["status"]["qosClass"] == "Burstable"
    ran = next(iter(old.values()))
    assert _but_token(container(new, "log")) == _but_token(container(ran, "log"))  # unrecorded
    changed = _but_token(container(new, "app"))
    changed["resources"] = container(ran, "app")["resources"]
    assert changed == _but_token(container(ran, "app"))  # only its resources differ
    for pod in placed.pods():  # the pods that ran before are as they were
        if pod["metadata"]["name"] in old:
            assert as_templated(pod) and pod["spec"] == old[pod["metadata"]["name"]]["spec"]
    assert placed.deployment()["spec"]["template"] == template  # no rollout
    assert "given the CPU limits of policy pay" in webhook.operator.tail()
    print(f"scale-up with the webhook: {took:.2f} s")


@pytest.mark.parametrize(("record", "logged"), LEFT_ALONE.values(), ids=LEFT_ALONE.keys())
def test_a_record_that_does_not_admit_leaves_new_pods_as_templated(
    webhook: Webhook, record: Any, logged: str | None
) -> None:
    placed = place(webhook.kube, fresh_name("api"))
    written = record(placed.rs_name)
    placed.write_record(written if isinstance(written, str) else written.to_annotation())
    (new,), _ = placed.scale(3)
    assert as_templated(new)
    assert looked_up(webhook, placed)  # asked, and it said no
    lines = _log_lines(webhook.operator, placed.rs_name, "allowed unchanged")
    assert [logged in line for line in lines] == ([True] if logged else [])


def test_pods_of_the_next_replicaset_are_left_alone(webhook: Webhook) -> None:
    """The team deploys (the template changes): the record still names the old
    ReplicaSet, so the new one's pods keep what the new template says."""
    placed = place(webhook.kube, fresh_name("api"))
    placed.write_record(inplace_record(placed.rs_name).to_annotation())
    deploy = {"spec": {"template": {"metadata": {"labels": {"release": "2"}}}}}
    webhook.kube.patch(DEPLOYMENTS, webhook.kube.namespace, placed.name, deploy)
    rolled = webhook.kube.rolled_out(webhook.kube.namespace, placed.name)
    following = Placed(webhook.kube, placed.name, webhook.kube.replicaset_of(rolled))
    assert following.rs_name != placed.rs_name
    pods = following.pods()
    assert len(pods) == 2 and all(as_templated(p) for p in pods)
    assert looked_up(webhook, following)


def test_a_namespace_outside_watch_namespaces_is_never_sent_to_the_webhook(
    webhook: Webhook,
) -> None:
    """Both namespaces are the operator's, and both Deployments carry a record that
    admits their pods: only the chart's namespaceSelector keeps the second one out."""
    inside = place(webhook.kube, fresh_name("api"))
    outside = place(webhook.elsewhere, fresh_name("api"))
    for placed in (inside, outside):
        placed.write_record(inplace_record(placed.rs_name).to_annotation())
    (changed,), _ = inside.scale(3)
    (unchanged,), _ = outside.scale(3)
    assert cpu(changed) == AFTER_M
    assert as_templated(unchanged) and not looked_up(webhook, outside)


@pytest.mark.parametrize(("status", "delay"), API_FAULTS.values(), ids=API_FAULTS.keys())
def test_when_the_lookup_fails_the_pod_is_created_unchanged_with_one_log_line(
    webhook: Webhook, status: int | None, delay: float
) -> None:
    placed = place(webhook.kube, fresh_name("api"))
    placed.write_record(inplace_record(placed.rs_name).to_annotation())
    webhook.proxy.fail_next("GET", f"/replicasets/{placed.rs_name}$", status, delay=delay)
    (new,), took = placed.scale(3)
    assert as_templated(new)
    # the operator answered itself, within its budget (1.5 s), before the server's timeout
    (line,) = _log_lines(webhook.operator, placed.rs_name, "allowed unchanged")
    assert ("HTTP 500" if status else "timed out") in line and "HTTPHeaderDict" not in line
    assert took < TIMEOUT_S + 1
    print(f"{'API error' if status else 'API stalled'}: pod created after {took:.2f} s")


def test_a_hung_or_killed_operator_never_holds_pods_back(
    kube: Kube, control_plane: ControlPlane, throttlepolicy_crd: None, tls: Tls, tmp_path: Path
) -> None:
    with (
        webhook_operator(control_plane.kubeconfig, tls, tmp_path / "operator.log",
                         [kube.namespace]) as (operator, port),
        configured(kube, chart_configuration([kube.namespace], port, tls)) as config,
    ):  # fmt: skip
        until_mutating(kube)
        placed = place(kube, "api", replicas=1)
        placed.write_record(inplace_record(placed.rs_name).to_annotation())
        (served,), _ = placed.scale(2)
        assert operator.proc is not None
        os.kill(operator.proc.pid, signal.SIGSTOP)  # hung: connections accepted, no answer
        try:
            (held,), hung_s = placed.scale(3)
        finally:
            operator.kill()  # SIGKILL: gone, its port closed
        gone, gone_s = placed.scale(6)
        on_server = kube.get(WEBHOOKS, None, config["metadata"]["name"])
    assert cpu(served) == AFTER_M  # the webhook was in use until then
    assert as_templated(held) and len(gone) == 3 and all(as_templated(p) for p in gone)
    assert TIMEOUT_S - 0.5 < hung_s < TIMEOUT_S + 2  # held for the chart's 2 s, no longer
    assert gone_s < TIMEOUT_S  # refused at once: three pods without waiting for a timeout
    assert on_server is not None
    for hook in on_server["webhooks"]:  # a Deployment's pods, a StatefulSet's or DaemonSet's
        assert hook["failurePolicy"] == "Ignore" and hook["timeoutSeconds"] == TIMEOUT_S
    print(f"operator hung: 1 pod in {hung_s:.2f} s; operator killed: 3 pods in {gone_s:.2f} s")
