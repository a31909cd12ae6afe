"""The chart on the real control plane: Helm's own install (helm-python-sdk binds Helm's Go
SDK) with its CRDs, every object through the real API server's validation and admission,
the real controllers making the pods on kwok's nodes; and its RBAC put to the test by the
real `unthrottle operator`, running on its ServiceAccount's token and nothing else.

The module has a control plane of its own: the chart is cluster-scoped software (CRDs,
ClusterRoles, a PriorityClass) and its default operator watches every namespace, which
would reconcile the policies of other test modules' operators in a shared one.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from chart_on_cluster import (
    CHART,
    Access,
    access_of,
    allowed_for,
    helm_config,
    kubectl,
    self_allowed,
    self_rules,
    with_image,
)
from kube import Kube, fresh_name
from kube_faults import FaultProxy
from missing import MISSING as NOT_INSTALLED
from operator_proc import UNTHROTTLE
from prom import PrometheusServer, requires_prometheus
from shop import HEALTHY, THROTTLED, deploy, openmetrics
from support.chart import (
    PROMETHEUS_AUTH,
    documented_rbac,
)
from support.chart_rbac import PRIVILEGED, ChartRbac, chart_rbac
from unthrottle.units import parse_cpu
from unthrottle_lab.children import stop
from unthrottle_lab.kube import (
    BuildError,
    ControlPlane,
    ensure_built,
)

POLICIES = "unthrottle.io/v1alpha1/throttlepolicies"
DEPLOYMENTS = "apps/v1/deployments"
RECORD = "unthrottle.io/last-applied"
DEADLINE_S = 90.0


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """This module's own control plane (see the module's docstring); ``kube`` uses it."""
    try:
        binaries = ensure_built()
    except BuildError as error:
        pytest.skip(f"{NOT_INSTALLED} the control plane cannot be built: {error}")
    with ControlPlane(tmp_path_factory.mktemp("chart-plane"), binaries=binaries) as plane:
        yield plane


@pytest.fixture(scope="module")
def chart_crds(control_plane: ControlPlane) -> None:
    """The chart's crds/, applied as docs/install.md says for an upgrade, and Established
    (a release installed by Helm brings them too; these tests apply only its RBAC)."""
    names = control_plane.install_crds(CHART / "crds", server_side=True)
    assert {n.split("/")[-1] for n in names} == {c["metadata"]["name"] for c in _chart_crds()}


def _nodes(kube: Kube) -> set[str]:
    return {n["metadata"]["name"] for n in kube.list("v1/nodes")}


def _namespace(kube: Kube, prefix: str) -> str:
    """A fresh namespace that must exist before the install (operator.watchNamespaces)."""
    name = fresh_name(prefix)
    kube.create_namespace(name)
    return name


# --- 1. helm install, for real ----------------------------------------------------------

INSTALLS: dict[str, Callable[[Kube], dict[str, Any]]] = {
    "defaults": lambda kube: {},
    "apply-and-peering-in-a-given-namespace-burst-off": lambda kube: {
        "operator": {"replicas": 2, "apply": {"enabled": True},
                     "watchNamespaces": [_namespace(kube, "shop")]},
        "agent": {"burst": {"enabled": False}},
    },
    "prometheus-auth-and-the-clusters-priority-class": lambda kube: {
        "prometheus": PROMETHEUS_AUTH,
        "agent": {"priorityClass": {"create": False},
                  "priorityClassName": "system-node-critical"},
    },
}  # fmt: skip


@dataclass
class Installed:
    release: str
    namespace: str
    values: dict[str, Any]
    objects: list[dict[str, Any]]
    seconds: float

    def named(self, kind: str) -> str:
        (name,) = [o["metadata"]["name"] for o in self.objects if o["kind"] == kind]
        return str(name)


@contextmanager
def installed(kube: Kube, values: dict[str, Any], *, wait: bool = True) -> Iterator[Installed]:
    """``helm install`` of the chart into the test's namespace (uninstalled after)."""
    release = fresh_name("ut")
    with helm_config(kube, kube.namespace) as helm:
        started = time.monotonic()
        try:
            summary = helm.install(CHART, release, with_image(values), namespace=kube.namespace,
                                   wait="watcher" if wait else None, timeout=180)  # fmt: skip
            seconds = time.monotonic() - started
            assert summary["status"] == "deployed", summary
            objects = [d for d in yaml.safe_load_all(summary["manifest"]) if d]
            yield Installed(release, kube.namespace, values, objects, seconds)
        finally:
            helm.uninstall(release, wait="watcher", timeout=120, ignore_not_found=True)


def _established(kube: Kube, name: str) -> bool:
    crd = kube.get("apiextensions.k8s.io/v1/customresourcedefinitions", None, name) or {}
    return any(c["type"] == "Established" and c["status"] == "True"
               for c in (crd.get("status") or {}).get("conditions", []))  # fmt: skip


def _chart_crds() -> list[dict[str, Any]]:
    return [doc for path in sorted((CHART / "crds").glob("*.yaml"))
            for doc in yaml.safe_load_all(path.read_text()) if doc]  # fmt: skip


def _on_the_server(kube: Kube, objects: list[dict[str, Any]]) -> list[str]:
    """``kind/name`` of each of ``objects`` that the server has."""
    out = kubectl(kube, "get", "--ignore-not-found", "-o", "name", "-f", "-",
                  stdin=yaml.safe_dump_all(objects))  # fmt: skip
    return out.split()


def _pods_running_on_fake_nodes(kube: Kube, pods: list[dict[str, Any]], account: str) -> None:
    nodes = _nodes(kube)
    for pod in pods:
        assert pod["status"]["phase"] == "Running", pod["status"]
        assert pod["spec"]["nodeName"] in nodes
        assert pod["spec"]["serviceAccountName"] == account


@pytest.mark.parametrize("make_values", INSTALLS.values(), ids=INSTALLS.keys())
def test_helm_installs_the_chart_the_controllers_run_it_and_uninstall_removes_it(
    kube: Kube, make_values: Callable[[Kube], dict[str, Any]]
) -> None:
    kube.create_namespace(kube.namespace, PRIVILEGED)
    values = make_values(kube)
    with installed(kube, values) as release:
        print(f"helm install took {release.seconds:.1f} s")  # the report's timing
        # every object Helm sent is there, and passes the server's strict field validation
        # (unknown or duplicate fields refused, not only warned about)
        assert len(_on_the_server(kube, release.objects)) == len(release.objects)
        kubectl(kube, "apply", "--server-side", "--dry-run=server", "--validate=strict",
                "--force-conflicts", "--field-manager=strict-check", "-f", "-",
                stdin=yaml.safe_dump_all(release.objects))  # fmt: skip
        # the CRDs came with it (crds/): Established, each version's schema kept as written
        for crd in _chart_crds():
            name = crd["metadata"]["name"]
            assert _established(kube, name), name
            served = kube.get("apiextensions.k8s.io/v1/customresourcedefinitions", None, name)
            assert served is not None and served["spec"]["versions"] == crd["spec"]["versions"]
        # the real Deployment controller made the operator's pods, kwok runs them
        operator = release.named("Deployment")
        rolled = kube.rolled_out(release.namespace, operator)
        pods = kube.pods_of(kube.replicaset_of(rolled))
        assert len(pods) == values.get("operator", {}).get("replicas", 1)
        _pods_running_on_fake_nodes(kube, pods, operator)
        # …and the DaemonSet controller an agent on every node
        agent = release.named("DaemonSet")
        nodes = _nodes(kube)
        kube.until("the agent on every node",
                   lambda: kube.get("apps/v1/daemonsets", release.namespace, agent),
                   lambda d: d is not None and d["status"]["numberReady"] == len(nodes)
                   == d["status"]["desiredNumberScheduled"])  # fmt: skip
        agents = kube.list("v1/pods", release.namespace,
                           selector="app.kubernetes.io/component=agent")  # fmt: skip
        assert {p["spec"]["nodeName"] for p in agents} == nodes
        _pods_running_on_fake_nodes(kube, agents, agent)
        # the host's cgroupfs as the server keeps it: read-only unless burst writing is on
        served = kube.get("apps/v1/daemonsets", release.namespace, agent) or {}
        (mount,) = [m for m in served["spec"]["template"]["spec"]["containers"][0]
                    ["volumeMounts"] if m["name"] == "cgroup"]  # fmt: skip
        writes = values.get("agent", {}).get("burst", {}).get("enabled", False)
        assert mount.get("readOnly", False) is not writes, mount
    # helm uninstall: every object of the release is gone; the CRDs stay (docs/install.md)
    kube.until("the release's objects gone", lambda: _on_the_server(kube, release.objects),
               lambda left: left == [])  # fmt: skip
    for crd in _chart_crds():
        assert _established(kube, crd["metadata"]["name"])
    for namespace in values.get("operator", {}).get("watchNamespaces", []):
        kube.delete("v1/namespaces", None, namespace)


POD_SECURITY = {  # the violations, in the admission's words
    "baseline": ['hostPath volumes (volume "cgroup")'],
    "restricted": ['volume "cgroup" uses restricted volume type "hostPath"',
                   "runAsNonRoot != true", "runAsUser=0"],
}  # fmt: skip


@pytest.mark.parametrize(("level", "violations"), POD_SECURITY.items(), ids=POD_SECURITY.keys())
def test_pod_security_admits_the_operator_and_refuses_the_agent_as_the_docs_say(
    kube: Kube, level: str, violations: list[str]
) -> None:
    """docs/install.md: the agent needs a namespace whose Pod Security level is privileged
    (hostPath; root); the operator alone meets ``restricted``."""
    kube.create_namespace(kube.namespace, {"pod-security.kubernetes.io/enforce": level})
    with installed(kube, {}, wait=False) as release:
        operator = release.named("Deployment")
        rolled = kube.rolled_out(release.namespace, operator)
        _pods_running_on_fake_nodes(kube, kube.pods_of(kube.replicaset_of(rolled)), operator)
        agent = release.named("DaemonSet")

        def refusals() -> list[str]:
            events = kube.list("v1/events", release.namespace)
            return [
                e["message"]
                for e in events
                if e["involvedObject"]["name"] == agent and e["reason"] == "FailedCreate"
            ]

        messages = kube.until("the agent's pods refused", refusals, lambda m: m != [])
        assert f'violates PodSecurity "{level}:latest"' in messages[0]
        for violation in violations:
            assert violation in messages[0]
        assert kube.list("v1/pods", release.namespace,
                         selector="app.kubernetes.io/component=agent") == []  # fmt: skip


# --- 2. RBAC, for real: the operator on its ServiceAccount's token ------------------------


APPLY_ONLY = {("apps", "deployments", "patch"), ("autoscaling.k8s.io", "verticalpodautoscalers",
                                                  "get"),
              ("autoscaling.k8s.io", "verticalpodautoscalers", "list")}  # fmt: skip
CLUSTER_SCOPED = {"customresourcedefinitions", "namespaces", "clusterkopfpeerings"}


RBAC_SHAPES = {  # (Apply, given namespaces): the chart refuses Apply in every namespace
    "recommend-every-namespace": (False, False),
    "recommend-given-namespaces": (False, True),
    "apply-given-namespaces": (True, True),
}


@pytest.mark.parametrize(("apply_enabled", "namespaced"), RBAC_SHAPES.values(),
                         ids=RBAC_SHAPES.keys())  # fmt: skip
def test_the_server_grants_exactly_the_documented_rbac(
    kube: Kube, apply_enabled: bool, namespaced: bool
) -> None:
    """docs/operator.md's table, row by row, asked of the real authorizer for the
    operator's ServiceAccount: what applies is allowed, what does not is denied."""
    watched = _namespace(kube, "shop")
    elsewhere = _namespace(kube, "other")
    operator: dict[str, Any] = {"apply": {"enabled": apply_enabled,
                                          "inPlace": {"enabled": apply_enabled}}}  # fmt: skip
    if namespaced:
        operator["watchNamespaces"] = [watched]
    with chart_rbac(kube, {"operator": operator}) as rbac:
        wrong = []
        for rules, why in documented_rbac():
            applies = ("Apply mode" not in why or apply_enabled) and (
                "given namespaces" not in why or namespaced)  # fmt: skip
            for group, resource, verb in sorted(rules):
                base, _, sub = resource.partition("/")
                places = [""] if base in CLUSTER_SCOPED else [watched, elsewhere]
                for place in places:
                    expect = applies and not (namespaced and place == elsewhere)
                    access = Access(verb, group, base, sub, place)
                    allowed, reason = allowed_for(kube, rbac.user(), access)
                    if allowed != expect:
                        wrong.append(f"{access}: {'allowed' if allowed else 'denied'} ({reason})")
        assert wrong == []
    for namespace in (watched, elsewhere):
        kube.delete("v1/namespaces", None, namespace)


SECRET_VERBS = ("get", "list", "watch")


@pytest.mark.parametrize("apply_enabled", [True, False], ids=["apply-enabled", "apply-disabled"])
def test_no_service_account_of_the_chart_may_read_secrets(
    kube: Kube, tmp_path: Path, apply_enabled: bool
) -> None:
    operator: dict[str, Any] = {"apply": {"enabled": apply_enabled,
                                          "inPlace": {"enabled": apply_enabled}}}  # fmt: skip
    if apply_enabled:  # Apply needs given namespaces (the chart refuses it without)
        operator["watchNamespaces"] = [_namespace(kube, "shop")]
    values = {"operator": operator}
    with chart_rbac(kube, values) as rbac:
        for role in rbac.objects:
            if role["kind"] in ("ClusterRole", "Role"):
                for rule in role["rules"]:
                    assert "secrets" not in rule["resources"]
                    assert "*" not in rule["resources"] + rule["verbs"] + rule["apiGroups"]
        for component in ("operator", "agent"):
            token_client = kube.api_client(kube.kubeconfig(
                tmp_path / f"{component}.kubeconfig", token=rbac.token(component)))  # fmt: skip
            for place in ("", rbac.namespace, "default", "kube-system",
                          *operator.get("watchNamespaces", [])):  # fmt: skip
                for verb in SECRET_VERBS:
                    access = Access(verb, "", "secrets", "", place)
                    assert allowed_for(kube, rbac.user(component), access)[0] is False, access
                    assert self_allowed(token_client, access) is False, access
            # the server's own list of what the token may do: no Secrets, no wildcard
            for rule in self_rules(token_client, rbac.namespace):
                assert "secrets" not in rule["resources"] and "*" not in rule["resources"], rule
                assert "*" not in rule["verbs"], rule


@dataclass
class OperatorRun:
    """The operator running with the chart's RBAC, and the shop it looks after."""

    kube: Kube
    rbac: ChartRbac
    proxy: FaultProxy
    log: Path
    shop: str
    stage: str

    def policy(self, namespace: str, name: str, spec: dict[str, Any]) -> None:
        self.kube.create(POLICIES, {"apiVersion": "unthrottle.io/v1alpha1",
                                    "kind": "ThrottlePolicy",
                                    "metadata": {"namespace": namespace, "name": name},
                                    "spec": spec})  # fmt: skip

    def until(self, what: str, read: Callable[[], Any], check: Callable[[Any], bool]) -> Any:
        try:
            return self.kube.until(what, read, check, timeout_s=DEADLINE_S)
        except AssertionError as error:
            tail = self.log.read_text()[-5000:]
            raise AssertionError(f"{error}\noperator log:\n{tail}") from None

    def status_when(self, namespace: str, name: str,
                    check: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:  # fmt: skip
        def status() -> dict[str, Any]:
            return (self.kube.get(POLICIES, namespace, name) or {}).get("status") or {}

        return dict(self.until(f"status of {namespace}/{name}", status, check))

    def events(self, namespace: str, name: str) -> list[dict[str, Any]]:
        return [e for e in self.kube.list("v1/events", namespace)
                if e["involvedObject"].get("name") == name]  # fmt: skip

    def accesses(self) -> set[Access]:
        """What the operator asked the API server for, as RBAC sees each request."""
        found = (access_of(r.method, r.path, r.params) for r in self.proxy.requests())
        return {a for a in found if a is not None}


@contextmanager
def running(command: list[str], kubeconfig: Path, log: Path) -> Iterator[None]:
    """The chart's command line run here: the real `unthrottle` on PATH, the kubeconfig in
    KUBECONFIG (as a pod's service account would be), POD_ID as the downward API gives."""
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "POD_ID": fresh_name("operator"),
           "PATH": f"{UNTHROTTLE.parent}{os.pathsep}{os.environ['PATH']}"}  # fmt: skip
    with log.open("a") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        yield
    finally:
        stop(proc, timeout_s=20)


@contextmanager
def operator_on_its_token(kube: Kube, tmp_path: Path,
                          operator_values: Callable[[str, str], dict[str, Any]],
                          ) -> Iterator[OperatorRun]:  # fmt: skip
    """A shop (``shop``: checkout and catalog; ``stage``: a checkout of its own) with a day
    of history in a real Prometheus; the chart's RBAC for ``operator_values(shop, stage)``;
    the operator started with the chart's own arguments and a kubeconfig holding only its
    ServiceAccount's token (through a recording proxy, which forwards the token)."""
    placed = deploy(
        kube,
        [
            THROTTLED,
            HEALTHY,
            replace(THROTTLED, namespace="stage"),
            replace(THROTTLED, namespace="stage", **IN_PLACE),
        ],
    )
    shop, stage = placed[0].namespace, placed[2].namespace
    end = int(time.time()) // 60 * 60
    with (
        chart_rbac(kube, {"operator": operator_values(shop, stage)}) as rbac,
        FaultProxy(kube) as proxy,
        PrometheusServer(tmp_path, openmetrics=openmetrics(placed, end)) as prom,
    ):
        kubeconfig = kube.kubeconfig(tmp_path / "kubeconfig", token=rbac.token(), server=proxy.url)
        log = tmp_path / "operator.log"
        run = OperatorRun(kube, rbac, proxy, log, shop, stage)
        with running(rbac.command(prom.url), kubeconfig, log):
            try:
                yield run
            finally:  # policies first, while the operator runs (Kopf's finalizer)
                for namespace in (shop, stage):
                    for policy in kube.list(POLICIES, namespace):
                        kube.delete(POLICIES, namespace, policy["metadata"]["name"])
                with suppress(AssertionError):
                    kube.until("policies gone", lambda: [
                        p for n in (shop, stage) for p in kube.list(POLICIES, n)],
                        lambda left: left == [], timeout_s=30)  # fmt: skip
    for namespace in (shop, stage):
        kube.delete("v1/namespaces", None, namespace)


def _workload(status: dict[str, Any], name: str) -> dict[str, Any]:
    return next(w for w in status["workloads"] if w["deployment"] == name)


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == kind)


RECOMMEND = {"selector": {"matchLabels": {"team": "pay"}}, "window": "12h"}
APPLY = {**RECOMMEND, "mode": "Apply", "apply": {"verifyFor": "1m", "cooldown": "0s"}}
IN_PLACE: dict[str, Any] = {"name": "api", "labels": {"team": "ops"}}
"""A second throttled Deployment of ``stage``, for an InPlace policy of its own."""
APPLY_IN_PLACE = {
    "selector": {"matchLabels": {"team": "ops"}},
    "window": "12h",
    "mode": "Apply",
    "apply": {"method": "InPlace", "verifyFor": "1m"},
}


def _recommends_with_status_events_and_report(run: OperatorRun) -> None:
    status = run.status_when(run.shop, "pay", lambda s: s["summary"]["deployments"] == 2)
    assert _condition(status, "Ready")["status"] == "True"
    assert _workload(status, "checkout")["state"] == "Recommended"
    run.until("the Recommended event", lambda: run.events(run.shop, "pay"),
              lambda events: any(e["reason"] == "Recommended" for e in events))  # fmt: skip
    report = run.kube.get("v1/configmaps", run.shop, "pay-report")
    assert report is not None and "checkout" in report["data"]["report.md"]
    assert run.kube.get("v1/configmaps", run.shop, "pay-evidence") is not None  # checkpoint


def _asked_and_refused(run: OperatorRun) -> tuple[set[Access], dict[Access, str]]:
    """What the operator asked for, and those of it the server's RBAC denies (with the
    authorizer's reason)."""
    asked = run.accesses()
    refused = {}
    for access in sorted(asked):
        allowed, why = allowed_for(run.kube, run.rbac.user(), access)
        if not allowed:
            refused[access] = why
    return asked, refused


@requires_prometheus
def test_with_apply_enabled_every_call_of_the_operator_is_allowed_and_apply_patches(
    kube: Kube, tmp_path: Path, chart_crds: None
) -> None:
    """Apply on, in the namespaces it must name (RoleBindings there): every call allowed,
    and nothing it could patch in kube-system."""

    def values(shop: str, stage: str) -> dict[str, Any]:
        return {"apply": {"enabled": True, "inPlace": {"enabled": True}},
                "watchNamespaces": [shop, stage]}  # fmt: skip

    with operator_on_its_token(kube, tmp_path, values) as run:
        run.policy(run.shop, "pay", RECOMMEND)
        run.policy(run.stage, "pay", APPLY)
        _recommends_with_status_events_and_report(run)
        patched = run.until("the Apply policy's patch",
                            lambda: run.kube.get(DEPLOYMENTS, run.stage, "checkout"),
                            lambda d: RECORD in d["metadata"].get("annotations", {}))  # fmt: skip
        (app,) = patched["spec"]["template"]["spec"]["containers"]
        assert parse_cpu(app["resources"]["limits"]["cpu"]) > 500
        run.until("the Applied event on the Deployment",
                  lambda: run.events(run.stage, "checkout"),
                  lambda events: any(e["reason"] == "Applied" for e in events))  # fmt: skip
        status = run.status_when(run.stage, "pay", lambda s: _workload(s, "checkout")["state"]
                                 in ("Verifying", "Applied"))  # fmt: skip
        assert _condition(status, "Degraded")["status"] == "False"
        # InPlace: the canary of `api` resized through pods/resize, on the chart's RBAC. Its
        # pods are kwok's, whose node reports no resources: the API server itself refuses
        # the resize ("Pod running on node without support for resize") and InPlace rolls
        # back. So the pods patch of the final burst (made once a kubelet reports a resize
        # done) does not come in this run: the test after this one makes both on the real
        # node, on the chart's RBAC.
        kube.patch(DEPLOYMENTS, run.stage, "api", {"spec": {"template": {"metadata": {
            "annotations": {"unthrottle.io/cpu-burst": "app=1ms"}}}}})  # fmt: skip
        kube.rolled_out(run.stage, "api")
        run.policy(run.stage, "ops", APPLY_IN_PLACE)
        resized = run.until("the canary's resize sent and refused by the server",
                            lambda: run.kube.get(DEPLOYMENTS, run.stage, "api"),
                            lambda d: "without support for resize" in d["metadata"].get(
                                "annotations", {}).get(RECORD, ""))  # fmt: skip
        assert '"method":"InPlace"' in resized["metadata"]["annotations"][RECORD]
        # the refusal ends InPlace's change in one reconcile: a policy edit brings the
        # second, which replaces the policy's report (configmaps update, a write granted)
        run.kube.patch(POLICIES, run.stage, "ops", {"spec": {"window": "11h"}})
        run.until("the report replaced", run.accesses,
                  lambda asked: any(a.resource == "configmaps" and a.verb == "update"
                                    for a in asked))  # fmt: skip
        asked, refused = _asked_and_refused(run)
        for write in sorted({a for a in asked if a.verb not in ("get", "list", "watch")}):
            there = replace(write, namespace="kube-system")
            assert allowed_for(kube, run.rbac.user(), there)[0] is False, there
    assert refused == {}
    # not yet in this run: the pods patch (above); and the templates of StatefulSets and
    # DaemonSets, which no policy here covers (its shop is Deployments; their Apply is in
    # tests/cluster/test_apply_kinds.py)
    later = {("", "pods", "patch"), ("apps", "statefulsets", "patch"),
             ("apps", "daemonsets", "patch")}  # fmt: skip
    used = _least_privilege(run, asked, not_yet=frozenset(later))
    assert {("apps", "deployments", "patch"), ("", "pods/resize", "patch")} <= used


REPLACE_CONFIGMAPS = ("", "configmaps", "update")
"""A ConfigMap is created first (after a get finds none) and replaced only from the second
write on: a run of one reconcile does not replace its report or checkpoint yet."""


def _least_privilege(run: OperatorRun, asked: set[Access], *,
                     not_yet: frozenset[tuple[str, str, str]] = frozenset(),
                     ) -> set[tuple[str, str, str]]:  # fmt: skip
    """What the operator used, (group, resource, verb); every write the chart grants must be
    among them (a write granted and never made would be more than the operator needs),
    but for ``not_yet``: writes this run is too short to need."""
    used = {(a.group, f"{a.resource}/{a.subresource}" if a.subresource else a.resource, a.verb)
            for a in asked}  # fmt: skip
    writes = {rule for rule in run.rbac.granted() if rule[2] not in ("get", "list", "watch")}
    assert writes - used - not_yet == set()
    print("reads granted and not made in this run:", sorted(run.rbac.granted() - used))
    return used


@requires_prometheus
@pytest.mark.parametrize("namespaced", [False, True], ids=["every-namespace", "given-namespaces"])
def test_with_peering_the_operator_keeps_alive_in_the_peering_object_on_the_charts_rbac(
    kube: Kube, tmp_path: Path, chart_crds: None, namespaced: bool
) -> None:
    """More than one replica: the chart's shell line with a random priority, Kopf peering
    through the release's ClusterKopfPeering (or a KopfPeering in each watched namespace),
    on the peering rows the chart adds."""
    peering = fresh_name("unthrottle")

    def values(shop: str, stage: str) -> dict[str, Any]:
        given = {"watchNamespaces": [shop, stage]} if namespaced else {}
        return {"replicas": 2, "peering": {"name": peering}, **given}

    with operator_on_its_token(kube, tmp_path, values) as run:
        run.policy(run.shop, "pay", RECOMMEND)
        _recommends_with_status_events_and_report(run)
        kind = "kopfpeerings" if namespaced else "clusterkopfpeerings"
        run.until("a keep-alive in the peering object",
                  lambda: run.kube.get(f"kopf.dev/v1/{kind}", run.shop, peering),
                  lambda p: bool(p["status"]))  # fmt: skip
        asked, refused = _asked_and_refused(run)
    assert refused == {}
    # one reconcile: the report and checkpoint are created, not yet replaced (the Apply
    # test's reconciles replace them, and use every write the chart grants)
    used = _least_privilege(run, asked, not_yet=frozenset({REPLACE_CONFIGMAPS}))
    assert ("kopf.dev", kind, "patch") in used


@requires_prometheus
def test_with_apply_disabled_an_apply_policy_names_the_missing_permission_without_a_loop(
    kube: Kube, tmp_path: Path, chart_crds: None
) -> None:
    """Given namespaces (RoleBindings) and Apply off: Recommend works as ever; an Apply
    policy does not patch, says which permission it lacks, and is not retried in a loop."""
    with operator_on_its_token(kube, tmp_path, lambda shop, stage: {
            "apply": {"enabled": False}, "watchNamespaces": [shop, stage]}) as run:  # fmt: skip
        before = run.kube.get(DEPLOYMENTS, run.stage, "checkout")
        run.policy(run.shop, "pay", RECOMMEND)
        run.policy(run.stage, "pay", APPLY)
        _recommends_with_status_events_and_report(run)
        status = run.status_when(run.stage, "pay", lambda s: any(
            MISSING.search(m) for m in _messages(s, "checkout")))  # fmt: skip
        # in one line, the server's words, no HTTP headers; not taken for an internal error
        for message in _messages(status, "checkout"):
            assert "\n" not in message and "HTTPHeaderDict" not in message, message
        assert _condition(status, "Degraded").get("reason") != "InternalError", status
        # no error loop: a fault is retried after 10 s; a settled policy waits its interval
        patches = len(run.proxy.requests("PATCH", r"/deployments/checkout$"))
        time.sleep(15)
        assert len(run.proxy.requests("PATCH", r"/deployments/checkout$")) == patches
        again = run.kube.get(POLICIES, run.stage, "pay")
        assert again is not None and again["status"]["lastRun"] == status["lastRun"]
        assert run.kube.get(DEPLOYMENTS, run.stage, "checkout") == before
        _, refused = _asked_and_refused(run)
    # what was refused is Apply mode's, which this chart does not grant, and nothing else
    assert {(a.group, a.resource, a.verb) for a in refused} <= APPLY_ONLY, refused


# A permission the chart withholds without Apply mode, named: its verb and its resource (the
# API server says `cannot patch resource "deployments" in API group "apps"`).
MISSING = re.compile(r"\b(patch|list)\b.*\b(deployments|verticalpodautoscalers)\b")


def _messages(status: dict[str, Any], deployment: str) -> list[str]:
    """Where a policy says why a Deployment was not changed: its workload's message, or a
    Degraded condition."""
    out = [str(w.get("message") or "") for w in status.get("workloads") or []
           if w["deployment"] == deployment]  # fmt: skip
    out += [c["message"] for c in status.get("conditions") or []
            if c["type"] == "Degraded" and c["status"] == "True"]  # fmt: skip
    return out


# --- 3. docs/install.md, "What each component can read and write", row by row --------------

INSTALL_MD = CHART.parent.parent / "docs" / "install.md"
SHAPES = {  # the table's "with" column → the chart's operator values
    "Recommend": lambda watched: {},
    "Apply": lambda watched: {"apply": {"enabled": True}, "watchNamespaces": [watched]},
    "Apply InPlace": lambda watched: {
        "apply": {"enabled": True, "inPlace": {"enabled": True}},
        "watchNamespaces": [watched],
    },
}


@dataclass(frozen=True)
class Statement:
    """One row of the table: a component may (or, with ``no``, may not) do each verb on
    each resource, in a kind of place, in the chart's shapes named."""

    component: str
    verbs: tuple[tuple[str, bool], ...]
    resources: tuple[str, ...]
    where: str
    shapes: tuple[str, ...]


def documented_access() -> list[Statement]:
    section = INSTALL_MD.read_text().split("## 3. What each component can read and write", 1)
    assert len(section) == 2, "docs/install.md has no section 'What each component can…'"
    rows = []
    for line in section[1].split("\n## ", 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or cells[0] not in ("operator", "agent"):
            continue
        verbs = tuple((v.removeprefix("no ").strip(), not v.startswith("no "))
                      for v in (x.strip() for x in cells[1].split(",")))  # fmt: skip
        resources = tuple(re.findall(r"`([^`]+)`", cells[2]))
        shapes = tuple(x.strip() for x in cells[4].split(","))
        assert resources and set(shapes) <= set(SHAPES), line
        rows.append(Statement(cells[0], verbs, resources, cells[3], shapes))
    assert len(rows) >= 10, "the table of docs/install.md was not found"
    return rows


def _places(where: str, watched: str, other: str, release: str) -> list[str]:
    return {"watched namespaces": [watched], "other namespaces": [other],
            "kube-system": ["kube-system"],
            "every namespace": [watched, other, "kube-system", release]}[where]  # fmt: skip


@pytest.mark.parametrize("shape", SHAPES)
def test_every_statement_of_the_install_guide_on_reads_and_writes_is_the_authorizers(
    kube: Kube, shape: str
) -> None:
    """docs/install.md says what each component can read and write; the real API server's
    authorizer answers each of those statements, verb by verb, for the chart's RBAC."""
    watched, other = _namespace(kube, "shop"), _namespace(kube, "other")
    wrong = []
    with chart_rbac(kube, {"operator": SHAPES[shape](watched)}) as rbac:
        for row in documented_access():
            if shape not in row.shapes:
                continue
            for token in row.resources:
                base, _, sub = token.partition("/")
                resource, _, group = base.partition(".")
                for place in _places(row.where, watched, other, rbac.namespace):
                    for verb, expected in row.verbs:
                        access = Access(verb, group, resource, sub, place)
                        allowed, why = allowed_for(kube, rbac.user(row.component), access)
                        if allowed is not expected:
                            said = "allowed" if allowed else "denied"
                            wrong.append(f"{row.component} {access}: {said} ({why})")
    assert wrong == []
    for namespace in (watched, other):
        kube.delete("v1/namespaces", None, namespace)


def test_helm_refuses_apply_without_watched_namespaces_naming_the_reason(kube: Kube) -> None:
    """Apply cluster-wide would let any policy patch kube-system: the install is refused,
    before anything reaches the server, with the values to set."""
    import helm_python as helm

    kube.create_namespace(kube.namespace, PRIVILEGED)
    for operator, reason in (
        ({"apply": {"enabled": True}}, "operator.apply.enabled needs operator.watchNamespaces"),
        ({"apply": {"enabled": True}, "watchNamespaces": ["kube-system"]},
         "Apply mode is never granted in kube-system"),
    ):  # fmt: skip
        with (
            pytest.raises(helm.HelmError, match=re.escape(reason)),
            installed(kube, {"operator": operator}, wait=False),
        ):
            pass
        assert kube.list("apps/v1/deployments", kube.namespace) == []
