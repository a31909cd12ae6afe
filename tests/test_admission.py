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

import base64
import copy
import os
import shutil
import signal
import socket
import ssl
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from kube import Kube, fresh_name, path_of
from kube_faults import FaultProxy
from operator_proc import OperatorProcess
from test_chart import only, render
from unthrottle.kube.patching import RECORD_ANNOTATION, ContainerChange, Record, Settings
from unthrottle.model.burst import BURST_ANNOTATION
from unthrottle.units import parse_cpu
from unthrottle_lab.kube import ControlPlane
from unthrottle_lab.kube.pki import make_pki
from unthrottle_lab.prometheus import free_port

DEPLOYMENTS = "apps/v1/deployments"
WEBHOOKS = "admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
PROMETHEUS = "http://127.0.0.1:9"  # never asked: no ThrottlePolicy exists in these tests
BEFORE_M, AFTER_M, REQUEST_M, SIDECAR_M = 500, 900, 250, 100
BURST = "app=20ms"
TIMEOUT_S = 2  # the chart's timeoutSeconds


# --- the operator, and the chart's configuration pointed at it -----------------------------


@dataclass
class Tls:
    """The test's CA, and a folder holding the serving certificate for 127.0.0.1."""

    ca: bytes
    folder: Path


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    pki = make_pki(tmp_path_factory.mktemp("pki"), service_ip="127.0.0.1")
    folder = tmp_path_factory.mktemp("webhook-tls")
    cert, key = pki.server  # for 127.0.0.1 and localhost, signed by pki.ca
    shutil.copy(cert, folder / "tls.crt")
    shutil.copy(key, folder / "tls.key")
    return Tls(pki.ca.read_bytes(), folder)


def _serving(port: int, tls: Tls) -> bool:
    """The webhook answers TLS on 127.0.0.1:port with a certificate of the test's CA."""
    context = ssl.create_default_context(cadata=tls.ca.decode())
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=1) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1"),
        ):
            return True
    except OSError:
        return False


@contextmanager
def webhook_operator(kubeconfig: Path, tls: Tls, log: Path, namespaces: list[str], *,
                     prometheus: str = PROMETHEUS,
                     ) -> Iterator[tuple[OperatorProcess, int]]:  # fmt: skip
    """``unthrottle operator`` watching ``namespaces``, its webhook on 127.0.0.1:port."""
    port = free_port()
    watch = [arg for ns in namespaces for arg in ("--namespace", ns)]
    with OperatorProcess(kubeconfig, prometheus, log, *watch, "--webhook", f"127.0.0.1:{port}",
                         "--webhook-tls-dir", str(tls.folder)) as operator:  # fmt: skip
        deadline = time.monotonic() + 60
        while not _serving(port, tls):
            assert operator.proc is not None and operator.proc.poll() is None, operator.tail()
            assert time.monotonic() < deadline, f"no webhook after 60 s:\n{operator.tail()}"
            time.sleep(0.2)
        yield operator, port


def chart_configuration(watch: list[str], port: int, tls: Tls) -> dict[str, Any]:
    """The chart's MutatingWebhookConfiguration (Apply with InPlace on, ``watch`` as
    operator.watchNamespaces), its Service reference swapped for 127.0.0.1:port and its
    caBundle for the test's CA; named afresh."""
    values = {"operator": {"apply": {"enabled": True, "inPlace": {"enabled": True}},
                           "watchNamespaces": watch},
              "agent": {"enabled": False}}  # fmt: skip
    config = copy.deepcopy(only(render(values), "MutatingWebhookConfiguration"))
    config["metadata"]["name"] = fresh_name("unthrottle-inplace-test")
    (hook,) = config["webhooks"]
    path = hook["clientConfig"]["service"]["path"]
    hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}",
                            "caBundle": base64.b64encode(tls.ca).decode()}  # fmt: skip
    return dict(config)


@contextmanager
def configured(kube: Kube, config: dict[str, Any]) -> Iterator[dict[str, Any]]:
    created = kube.create(WEBHOOKS, config)
    try:
        yield created
    finally:
        kube.delete(WEBHOOKS, None, config["metadata"]["name"])


# --- a Deployment, its record, its pods --------------------------------------------------


def app(namespace: str, name: str, *, replicas: int = 2, guaranteed: bool = False) -> dict:
    """``app`` (CPU limit 500m) and a sidecar (100m); Burstable (``app`` requests 250m) or
    Guaranteed (every request equal to its limit, memory too)."""

    def resources(cpu_m: int, request_m: int) -> dict[str, Any]:
        if guaranteed:
            return {"limits": {"cpu": f"{cpu_m}m", "memory": "64Mi"},
                    "requests": {"cpu": f"{cpu_m}m", "memory": "64Mi"}}  # fmt: skip
        return {"limits": {"cpu": f"{cpu_m}m"}, "requests": {"cpu": f"{request_m}m"}}

    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"namespace": namespace, "name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [
                    {"name": "app", "image": "registry.example/shop:1",
                     "resources": resources(BEFORE_M, REQUEST_M)},
                    {"name": "log", "image": "registry.example/log:1",
                     "resources": resources(SIDECAR_M, SIDECAR_M)},
                ]},
            },
        },
    }  # fmt: skip


def inplace_record(replicaset: str) -> Record:
    """What Apply's InPlace method records once its canary passed: ``app`` 500m → 900m
    with a 20 ms burst, on ``replicaset``'s pods."""
    now = time.time()
    change = ContainerChange("app", before=Settings(BEFORE_M, 0, None),
                             after=Settings(AFTER_M, 20_000, None), ratio_before=0.3,
                             expected_ratio=0.01)  # fmt: skip
    return Record(policy="pay", policy_uid="5e0c7c4e-0000-4000-8000-000000000001",
                  policy_generation=1, at=now - 120, containers=(change,),
                  burst_key=BURST_ANNOTATION, burst_before=None, burst_after=BURST,
                  burst_map_absent=True, method="InPlace", replicaset=replicaset,
                  canary=f"{replicaset}-canary", canary_done_at=now - 100,
                  canary_verified_at=now - 10)  # fmt: skip


@dataclass
class Placed:
    kube: Kube
    name: str
    replicaset: dict[str, Any]

    @property
    def rs_name(self) -> str:
        return str(self.replicaset["metadata"]["name"])

    def deployment(self) -> dict[str, Any]:
        found = self.kube.get(DEPLOYMENTS, self.kube.namespace, self.name)
        assert found is not None
        return found

    def pods(self) -> list[dict[str, Any]]:
        return self.kube.pods_of(self.replicaset)

    def write_record(self, text: str) -> None:
        self.kube.patch(DEPLOYMENTS, self.kube.namespace, self.name,
                        {"metadata": {"annotations": {RECORD_ANNOTATION: text}}})  # fmt: skip

    def scale(self, replicas: int) -> tuple[list[dict[str, Any]], float]:
        """Scale to ``replicas``: (the new pods, seconds until they all existed)."""
        before = {p["metadata"]["name"] for p in self.pods()}
        started = time.monotonic()
        self.kube.patch(DEPLOYMENTS, self.kube.namespace, self.name,
                        {"spec": {"replicas": replicas}})  # fmt: skip
        pods = self.kube.until(f"{replicas} pods of {self.rs_name}", self.pods,
                               lambda found: len(found) == replicas, timeout_s=30)  # fmt: skip
        took = time.monotonic() - started
        return [p for p in pods if p["metadata"]["name"] not in before], took


def place(kube: Kube, name: str, **kwargs: Any) -> Placed:
    kube.create(DEPLOYMENTS, app(kube.namespace, name, **kwargs))
    rolled = kube.rolled_out(kube.namespace, name)
    return Placed(kube, name, kube.replicaset_of(rolled))


def container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in pod["spec"]["containers"] if c["name"] == name)


def cpu(pod: dict[str, Any], name: str = "app", kind: str = "limits") -> int:
    return parse_cpu(container(pod, name)["resources"][kind]["cpu"])


def _but_token(c: dict[str, Any]) -> dict[str, Any]:
    """A container without its service-account token mount (each pod has its own)."""
    return {k: v for k, v in c.items() if k != "volumeMounts"}


def burst(pod: dict[str, Any]) -> str | None:
    return (pod["metadata"].get("annotations") or {}).get(BURST_ANNOTATION)


def as_templated(pod: dict[str, Any]) -> bool:
    """The pod has its template's settings: nothing of the record's."""
    return cpu(pod) == BEFORE_M and cpu(pod, "log") == SIDECAR_M and burst(pod) is None


def admitted(placed: Placed) -> dict[str, Any]:
    """A pod of the placed ReplicaSet as admission leaves it: a server-side dry run of its
    creation (nothing is stored; the ReplicaSet controller never sees it)."""
    rs = placed.replicaset
    pod = copy.deepcopy(rs["spec"]["template"])
    pod["metadata"].update(generateName=f"{placed.rs_name}-", namespace=placed.kube.namespace,
                           ownerReferences=[{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                             "name": placed.rs_name,
                                             "uid": rs["metadata"]["uid"], "controller": True,
                                             "blockOwnerDeletion": True}])  # fmt: skip
    body = {"apiVersion": "v1", "kind": "Pod", **pod}
    return dict(placed.kube.call("POST", path_of("v1/pods", placed.kube.namespace), body,
                                 query={"dryRun": "All"}))  # fmt: skip


def until_mutating(kube: Kube) -> None:
    """Wait until the API server calls the new configuration (it learns of it through an
    informer): a probe Deployment's dry-run pod comes back with the record's limit."""
    probe = place(kube, fresh_name("probe"), replicas=1)
    probe.write_record(inplace_record(probe.rs_name).to_annotation())
    kube.until("the webhook configuration in use", lambda: admitted(probe),
               lambda pod: cpu(pod) == AFTER_M, timeout_s=30)  # fmt: skip
    kube.delete(DEPLOYMENTS, kube.namespace, probe.name)


# --- the module's operator: watching two namespaces, the chart's webhook on one ---------------


@dataclass
class Webhook:
    kube: Kube
    """Namespace the configuration covers (operator.watchNamespaces)."""
    elsewhere: Kube
    """Watched by the operator too, but not in the chart's watchNamespaces."""
    proxy: FaultProxy
    operator: OperatorProcess


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


def looked_up(hook: Webhook, placed: Placed) -> bool:
    """The operator was asked about a pod of ``placed`` (it read its ReplicaSet)."""
    ns = placed.kube.namespace
    return bool(hook.proxy.requests("GET", f"/namespaces/{ns}/replicasets/{placed.rs_name}$"))


# --- 1. new pods of the record's ReplicaSet get its settings -------------------------------


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


# --- 2. …and no other pod is changed -----------------------------------------------------

LEFT_ALONE = {
    "in-its-canary-phase": (lambda rs: replace(inplace_record(rs), canary_verified_at=None),
                            None),
    "rolled-back": (lambda rs: replace(inplace_record(rs), verdict="RolledBack",
                                       verdict_at=time.time()), None),
    "a-rollout-record": (lambda rs: replace(inplace_record(rs), method="Rollout",
                                            replicaset=None), None),
    "unreadable": (lambda rs: '{"version": 1, "policy": "pay"',
                   "unthrottle.io/last-applied: cannot be read"),
    # a limit below the pod's request: the API server would refuse the pod it made
    "limit-below-the-request": (lambda rs: _lowered(inplace_record(rs), REQUEST_M - 50),
                                "more than the limit"),
}  # fmt: skip


def _lowered(record: Record, limit_m: int) -> Record:
    (change,) = record.containers
    return replace(record, containers=(replace(change, after=Settings(limit_m, 0, None)),))


def _log_lines(operator: OperatorProcess, *words: str) -> list[str]:
    return [line for line in operator.log.read_text().splitlines()
            if all(w in line for w in words)]  # fmt: skip


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


# --- 3. the API failing or stalling: the pod is created, unchanged, and the log says why ------

API_FAULTS = {"api-error": (500, 0.0), "api-stalls": (None, 10.0)}


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


# --- 4. the operator hung or gone: pods are created at once, or after the 2 s timeout --------


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
    (hook,) = on_server["webhooks"]
    assert hook["failurePolicy"] == "Ignore" and hook["timeoutSeconds"] == TIMEOUT_S
    print(f"operator hung: 1 pod in {hung_s:.2f} s; operator killed: 3 pods in {gone_s:.2f} s")
