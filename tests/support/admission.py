"""What test_admission.py shares with other test modules: constants, helpers and
fixtures (and the tests another module runs again), so that no test module imports
another."""

from __future__ import annotations

import base64
import copy
import shutil
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
from support.chart import (
    only,
    render,
)
from unthrottle.kube.patching import RECORD_ANNOTATION, ContainerChange, Record, Settings
from unthrottle.model.burst import BURST_ANNOTATION
from unthrottle.units import parse_cpu
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
    for hook in config["webhooks"]:  # a Deployment's pods, a StatefulSet's or DaemonSet's
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


def looked_up(hook: Webhook, placed: Placed) -> bool:
    """The operator was asked about a pod of ``placed`` (it read its ReplicaSet)."""
    ns = placed.kube.namespace
    return bool(hook.proxy.requests("GET", f"/namespaces/{ns}/replicasets/{placed.rs_name}$"))


# --- 1. new pods of the record's ReplicaSet get its settings -------------------------------


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


# --- 3. the API failing or stalling: the pod is created, unchanged, and the log says why ------

API_FAULTS = {"api-error": (500, 0.0), "api-stalls": (None, 10.0)}


# --- 4. the operator hung or gone: pods are created at once, or after the 2 s timeout --------
