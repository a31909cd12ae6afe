"""The Helm chart (charts/unthrottle), rendered and linted by Helm's own engine.

helm-python-sdk binds Helm's Go SDK (v4) through ctypes, so no helm binary is needed: the
templates, the values schema and the lint are Helm's, not an imitation. Every configuration
below is rendered for Kubernetes 1.30, and each object is checked against that version's
schemas (kubernetes-validate, strict: unknown fields fail); Kopf's peering objects against
the CRDs the chart ships. The rendered arguments are parsed by the real `unthrottle` CLI,
the RBAC is compared with docs/operator.md's table, and the PrometheusRule with
`unthrottle prometheus-rules`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml

from chart_on_cluster import IMAGE, with_image
from missing import MISSING
from support.chart import (
    BAD_VALUES,
    CHART,
    CONFIGURATIONS,
    CONFLICTS,
    KUBE_VERSION,
    MONITORING_KINDS,
    OPERATOR_ROLES,
    PEERING_VERBS,
    PROMETHEUS_AUTH,
    RBAC_CASES,
    REAL_RUNS,
    UNTHROTTLE,
    cgroup_mount,
    chart,
    container,
    crd_objects,
    documented_rbac,
    granted,
    millicores,
    only,
    operator_argv,
    parse,
    render,
    render_files,
    run_shell_line,
)
from support.paths import ROOT


@pytest.mark.parametrize("values", CONFIGURATIONS.values(), ids=CONFIGURATIONS.keys())
def test_every_configuration_renders_to_objects_valid_for_kubernetes(values: dict) -> None:
    objects = render(values)
    assert objects
    peering_crds = {c["spec"]["names"]["kind"]: c for c in crd_objects()}
    for obj in objects:
        kind = obj["kind"]
        if kind in MONITORING_KINDS:
            continue  # no schema offline; their content is checked below
        if obj["apiVersion"] == "kopf.dev/v1":
            schema = peering_crds[kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
            jsonschema.validate(obj, schema)
            namespaced = peering_crds[kind]["spec"]["scope"] == "Namespaced"
            assert ("namespace" in obj["metadata"]) == namespaced
            continue
        try:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            where = ".".join(str(p) for p in error.path)
            pytest.fail(f"{kind} {obj['metadata']['name']}: {where}: {error.message}")


@pytest.mark.parametrize("values", CONFIGURATIONS.values(), ids=CONFIGURATIONS.keys())
def test_every_configuration_passes_helm_lint_strictly(values: dict) -> None:
    report = helm.lint(CHART, with_image(values), strict=True, kube_version=f"v{KUBE_VERSION}")
    assert report["errors"] == []
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # warnings and errors
    assert problems == []
    assert {m["error"] for m in report["messages"]} <= {"icon is recommended"}


def test_the_crds_are_valid_for_kubernetes_and_the_policy_crd_is_the_generated_one() -> None:
    assert (CHART / "crds" / "throttlepolicy.yaml").read_bytes() == (
        ROOT / "crds" / "throttlepolicy.yaml"
    ).read_bytes(), "copy crds/throttlepolicy.yaml into charts/unthrottle/crds/"
    for crd in crd_objects():
        kubernetes_validate.validate(crd, KUBE_VERSION, strict=True)
    names = {c["metadata"]["name"] for c in crd_objects()}
    assert names == {"throttlepolicies.unthrottle.io", "clusterkopfpeerings.kopf.dev",
                     "kopfpeerings.kopf.dev"}  # fmt: skip


def test_the_chart_version_follows_the_project_and_the_image_defaults_to_it() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart().metadata["appVersion"] == project["version"]
    for kind in ("Deployment", "DaemonSet"):
        assert container(render(), kind)["image"] == (
            f"{IMAGE['repository']}:{project['version']}")  # fmt: skip
    # no repository given: refused with how to build and push one, never a made-up image
    with pytest.raises(helm.HelmRenderError, match=r"image\.repository is not set: there is no"):
        render({"image": {"repository": ""}})
    pinned = CONFIGURATIONS["existing-priority-class-and-digest"]
    assert container(render(pinned), "DaemonSet")["image"] == (
        "registry.example/unthrottle@sha256:" + "ab" * 32
    )


@pytest.mark.parametrize(("values", "where", "why"), BAD_VALUES.values(), ids=BAD_VALUES.keys())
def test_the_schema_refuses_a_bad_value_naming_it(values: dict, where: str, why: str) -> None:
    with pytest.raises(helm.HelmValuesError) as refused:
        chart().validate_schema(values)
    assert f"at '{where}'" in str(refused.value) and why in str(refused.value)
    with pytest.raises(helm.HelmValuesError, match=re.escape(where)):
        render(values)  # an install renders, and is refused the same way


def test_the_default_values_meet_the_schema() -> None:
    chart().validate_schema(None)
    chart().validate_schema(chart().values)


@pytest.mark.parametrize(("values", "message"), CONFLICTS.values(), ids=CONFLICTS.keys())
def test_contradictory_values_stop_the_render_with_the_fix(values: dict, message: str) -> None:
    with pytest.raises(helm.HelmRenderError, match=re.escape(message)):
        render(values)


@pytest.mark.parametrize("values", REAL_RUNS.values(), ids=REAL_RUNS.keys())
def test_the_real_commands_accept_every_rendered_option(values: dict, tmp_path: Path) -> None:
    """The containers' command lines, run for real: each command checks all its options
    before it loads a kubeconfig, so failing on the (absent) kubeconfig means every
    option was accepted — types, ranges and the checks in the commands' bodies."""
    objects = render(values)
    env = {**os.environ, "KUBECONFIG": str(tmp_path / "absent"), "HOME": str(tmp_path),
           "NODE_NAME": "node-1", "PATH": f"{UNTHROTTLE.parent}:{os.environ['PATH']}"}  # fmt: skip
    env.pop("KUBERNETES_SERVICE_HOST", None)
    agent = container(objects, "DaemonSet")
    for command in (operator_argv(objects), ["unthrottle", *agent["args"]]):
        # The peering line runs in sh, with the real unthrottle on PATH.
        argv = ["sh", *command[1:]] if command[0] == "/bin/sh" else command
        out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120,
                             check=False)  # fmt: skip
        assert "kubeconfig" in out.stderr.lower(), out.stderr  # the rendered args pass none


def test_the_operator_runs_standalone_with_a_liveness_probe_and_its_metrics() -> None:
    objects = render()
    deployment = only(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}  # Kopf's advice
    argv = operator_argv(objects)
    assert argv[:2] == ["unthrottle", "operator"]
    params = parse("operator", argv[2:])
    assert params["standalone"] and params["all_namespaces"] and params["peering"] is None
    assert params["prometheus"] == "http://prometheus-operated.monitoring.svc:9090"
    assert params["cfs_period"] == "100ms"  # the kubelet's default, where no agent says
    c = container(objects, "Deployment")
    probe = c["livenessProbe"]["httpGet"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert params["liveness"] == f"0.0.0.0:{ports['liveness']}" and probe["path"] == "/healthz"
    assert params["metrics"] == f"0.0.0.0:{ports['metrics']}"
    assert "cpu" not in c["resources"]["limits"]  # the operator is not throttled by its chart


def test_the_kubelets_cfs_period_reaches_the_operator_as_its_own_setting() -> None:
    params = parse("operator", operator_argv(render({"operator": {"cfsPeriod": "50ms"}}))[2:])
    assert params["cfs_period"] == "50ms"


@pytest.mark.parametrize("namespaces", [[], ["shop", "pay"]], ids=["cluster-wide", "namespaced"])
def test_more_replicas_peer_through_kopf_each_with_its_own_priority(
    namespaces: list[str], tmp_path: Path
) -> None:
    objects = render({"operator": {"replicas": 2, "watchNamespaces": namespaces}})
    assert only(objects, "Deployment")["spec"]["strategy"]["type"] == "RollingUpdate"
    runs = [run_shell_line(operator_argv(objects), tmp_path) for _ in range(3)]
    priorities = set()
    for argv in runs:
        params = parse(argv[0], argv[1:])
        assert params["peering"] == "unthrottle" and not params["standalone"]
        assert list(params["namespace"] or ()) == namespaces
        priorities.add(params["priority"])
    assert len(priorities) == 3  # Kopf pauses every replica that meets its own priority
    peerings = [o for o in objects if o["apiVersion"] == "kopf.dev/v1"]
    if namespaces:
        assert {(o["kind"], o["metadata"]["namespace"]) for o in peerings} == {
            ("KopfPeering", ns) for ns in namespaces
        }
    else:
        assert [o["kind"] for o in peerings] == ["ClusterKopfPeering"]
    assert {o["metadata"]["name"] for o in peerings} == {"unthrottle"}
    assert not [o for o in render() if o["apiVersion"] == "kopf.dev/v1"]  # one replica: none


def test_prometheus_auth_reaches_the_operator_from_secrets_it_cannot_read_itself() -> None:
    objects = render({"prometheus": PROMETHEUS_AUTH})
    c = container(objects, "Deployment")
    params = parse("operator", c["args"][1:])
    assert params["prometheus"] == PROMETHEUS_AUTH["url"]
    assert params["insecure"] and params["header"] == ["X-Scope-OrgID=tenant-a"]
    assert params["timeout"] == 10 and params["retries"] == 5
    assert params["ca_bundle"] == Path("/etc/unthrottle/prometheus-ca/ca.pem")
    env = {e["name"]: e.get("valueFrom", {}).get("secretKeyRef") for e in c["env"]}
    assert env["UNTHROTTLE_PROMETHEUS_TOKEN"] == {"name": "prometheus-token", "key": "token"}
    assert env["UNTHROTTLE_PROMETHEUS_BASIC_AUTH"] == {"name": "prometheus-basic", "key": "auth"}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in only(objects, "Deployment")["spec"]["template"]["spec"]
               ["volumes"]}  # fmt: skip
    assert volumes[mounts["/etc/unthrottle/prometheus-ca"]]["secret"] == {
        "secretName": "prometheus-ca"
    }
    token_file = render(CONFIGURATIONS["token-file-and-ca-configmap"])
    params = parse("operator", container(token_file, "Deployment")["args"][1:])
    token = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
    assert params["bearer_token_file"] == token
    assert params["ca_bundle"] == Path("/etc/unthrottle/prometheus-ca/service-ca.crt")


def test_the_operator_is_non_root_read_only_without_privilege_or_capabilities() -> None:
    pod = only(render(), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    c = pod["containers"][0]["securityContext"]
    assert c["readOnlyRootFilesystem"] is True and c["allowPrivilegeEscalation"] is False
    assert c["privileged"] is False and c["capabilities"] == {"drop": ["ALL"]}
    mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert "/tmp" in mounts  # the only writable place (an emptyDir)


@pytest.mark.parametrize(("values", "apply", "namespaced"), RBAC_CASES.values(),
                         ids=RBAC_CASES.keys())  # fmt: skip
def test_the_operator_gets_exactly_the_documented_rbac(
    values: dict, apply: bool, namespaced: bool
) -> None:
    """The table's rows, each where its reason says (Apply mode, given namespaces); Kopf's
    peering rules, which the table does not list, only with more than one replica."""
    peering = values.get("operator", {}).get("replicas", 1) > 1
    expected = set()
    for rules, why in documented_rbac():
        if "Apply mode" in why and not apply:
            continue
        in_place = values.get("operator", {}).get("apply", {}).get("inPlace", {}).get("enabled")
        if "with InPlace only" in why and not in_place:
            continue
        if "given namespaces" in why and not namespaced:
            continue
        if "peering" in why.lower() and not peering:
            continue
        expected |= rules
    if peering and not any(group == "kopf.dev" for group, _, _ in expected):
        kind = "kopfpeerings" if namespaced else "clusterkopfpeerings"
        expected |= {("kopf.dev", kind, verb) for verb in PEERING_VERBS}
    assert granted(render(values), OPERATOR_ROLES) == expected


def test_the_rbac_grants_no_secrets_no_wildcards_and_no_cluster_wide_write_if_namespaced() -> None:
    for values in CONFIGURATIONS.values():
        for role in render(values):
            if role["kind"] in ("ClusterRole", "Role"):
                for rule in role["rules"]:
                    assert "secrets" not in rule["resources"]
                    assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"]
    objects = render(CONFIGURATIONS["every-feature"])
    cluster_bound = {b["roleRef"]["name"] for b in objects if b["kind"] == "ClusterRoleBinding"}
    writes = {r for r in granted(objects, cluster_bound) if r[2] not in ("get", "list", "watch")}
    assert writes == set()
    bindings = [b for b in objects if b["kind"] == "RoleBinding"]
    assert [(b["metadata"]["namespace"], b["roleRef"]["name"]) for b in bindings] == [
        ("shop", "unthrottle-operator")
    ]
    # The only writes to objects that are not the operator's own are Apply's: the pod
    # templates of Deployments, StatefulSets and DaemonSets (Rollout), and with InPlace,
    # running pods' resize and burst annotation.
    rollout = {("apps", kind, "patch") for kind in ("deployments", "statefulsets", "daemonsets")}
    foreign = rollout | {("", "pods/resize", "patch"), ("", "pods", "patch")}
    own = {"throttlepolicies", "throttlepolicies/status", "events", "configmaps",
           "clusterkopfpeerings", "kopfpeerings"}  # fmt: skip
    # With Apply (which needs given namespaces), nothing is written through a cluster-wide
    # binding: every write rule is bound in the watched namespaces only.
    applying = render(CONFIGURATIONS["apply-mode"])
    cluster_bound = {b["roleRef"]["name"] for b in applying if b["kind"] == "ClusterRoleBinding"}
    assert not {r for r in granted(applying, cluster_bound) if r[2] not in ("get", "list", "watch")}
    for values, allowed in (({}, set()), (CONFIGURATIONS["apply-mode"], rollout),
                            (CONFIGURATIONS["apply-in-place"], foreign)):  # fmt: skip
        writes = {r for r in granted(render(values), OPERATOR_ROLES)
                  if r[2] not in ("get", "list", "watch") and r[1] not in own}  # fmt: skip
        assert writes == allowed


def test_the_agent_may_only_list_and_watch_pods() -> None:
    assert granted(render(), {"unthrottle-agent"}) == {("", "pods", "list"), ("", "pods", "watch")}


def test_by_default_the_agent_only_measures_with_the_hosts_cgroupfs_read_only() -> None:
    objects = render()
    mount, volume = cgroup_mount(objects)
    assert volume["hostPath"] == {"path": "/sys/fs/cgroup", "type": "Directory"}
    # The agent finds cgroup mounts in its own /proc/self/mountinfo: the host's must be
    # mounted where the container's own view was, not beside it.
    assert mount["mountPath"] == "/sys/fs/cgroup"
    assert mount["readOnly"] is True and mount["recursiveReadOnly"] == "IfPossible"
    args = parse("agent", container(objects, "DaemonSet")["args"][1:])
    assert args["burst"] is False and not args["burst_namespace"]
    # Before Kubernetes 1.30 there is no recursiveReadOnly: a plain read-only mount, valid.
    older = render(kube_version="1.29.0")
    mount, _ = cgroup_mount(older)
    assert mount["readOnly"] is True and "recursiveReadOnly" not in mount
    kubernetes_validate.validate(only(older, "DaemonSet"), "1.29.0", strict=True)


def test_burst_writing_is_opt_in_for_named_namespaces_and_only_then_mounts_read_write() -> None:
    on = render(CONFIGURATIONS["burst-writing-on"])
    mount, _ = cgroup_mount(on)
    assert mount["readOnly"] is False and "recursiveReadOnly" not in mount
    args = parse("agent", container(on, "DaemonSet")["args"][1:])
    assert args["burst"] is True and args["burst_node_threshold"] == 0.5
    assert args["burst_namespace"] == ["shop", "*"] and args["burst_koordinator"] is True
    notes = render_files(CONFIGURATIONS["burst-writing-on"])["unthrottle/templates/NOTES.txt"]
    assert "read-write" in notes and "shop, *" in notes
    assert "writes nothing" in render_files()["unthrottle/templates/NOTES.txt"]


def test_the_agent_is_root_without_privilege_and_without_any_capability() -> None:
    pod = only(render(), "DaemonSet")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    # the node's PID namespace, for the wait counter (a cgroup's tasks list only the threads
    # the reader's namespace sees); never its network or IPC
    assert pod["hostPID"] is True
    for host in ("hostNetwork", "hostIPC"):
        assert not pod.get(host)
    c = pod["containers"][0]
    assert c["securityContext"]["privileged"] is False
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}  # nothing added back
    assert [v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v] == [
        "/sys/fs/cgroup"  # no host /proc: its own /proc/self/mountinfo and /proc/stat do
    ]


def test_the_agent_runs_on_every_node_named_by_the_downward_api() -> None:
    objects = render()
    pod = only(objects, "DaemonSet")["spec"]["template"]["spec"]
    assert {"operator": "Exists"} in pod["tolerations"]
    assert pod["priorityClassName"] == only(objects, "PriorityClass")["metadata"]["name"]
    assert 0 < only(objects, "PriorityClass")["value"] < 1_000_000_000  # below system classes
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    args = parse("agent", pod["containers"][0]["args"][1:])
    assert not args["standalone"] and args["period"] == "100ms"
    probe = pod["containers"][0]["livenessProbe"]["httpGet"]
    assert probe["path"] == "/healthz" and args["listen"] == "0.0.0.0:9717"


def test_the_agents_cpu_is_sized_from_its_measured_cost_and_never_throttles_it() -> None:
    resources = container(render(), "DaemonSet")["resources"]
    request = millicores(resources["requests"]["cpu"])
    limit = millicores(resources["limits"]["cpu"])
    # docs/benchmarks.md §5: 1.43–1.63 % of a core sampling 200 containers every 100 ms,
    # with 10 of them running; the request covers every one of them running
    # (bench/results/agent-sizing.json, one thread each), not the 16-thread case.
    sizing = json.loads((ROOT / "bench/results/agent-sizing.json").read_text())["runs"]
    (all_running,) = [r["millicores"] for r in sizing if r["threads_per_container"] == 1]
    assert all_running <= request <= 2 * all_running
    # A scrape, a pod list, a discovery walk and a sampling pass can fall in one 100 ms
    # period: the quota per period (limit/1000 × 100 ms) leaves tens of ms for them.
    assert limit / 1000 * 100 >= 25
    assert resources["requests"]["memory"] and resources["limits"]["memory"]


def test_both_metrics_endpoints_have_a_service_selecting_their_pods() -> None:
    objects = render()
    for kind, service in (("Deployment", "unthrottle-operator-metrics"),
                          ("DaemonSet", "unthrottle-agent-metrics")):  # fmt: skip
        svc = only(objects, "Service", service)["spec"]
        labels = only(objects, kind)["spec"]["template"]["metadata"]["labels"]
        assert svc["selector"].items() <= labels.items()
        (port,) = svc["ports"]
        assert port["targetPort"] in {p["name"] for p in container(objects, kind)["ports"]}


@pytest.mark.parametrize("kind", ["ServiceMonitor", "PodMonitor"])
def test_monitors_scrape_both_and_keep_the_agents_workload_labels(kind: str) -> None:
    key = kind[0].lower() + kind[1:]
    objects = render({"monitoring": {key: {"enabled": True, "labels": {"release": "kps"}}}})
    monitors = {m["metadata"]["name"]: m for m in objects if m["kind"] == kind}
    assert set(monitors) == {"unthrottle-operator", "unthrottle-agent"}
    for name, workload in (("unthrottle-operator", "Deployment"),
                           ("unthrottle-agent", "DaemonSet")):  # fmt: skip
        spec = monitors[name]["spec"]
        assert monitors[name]["metadata"]["labels"]["release"] == "kps"
        assert spec["namespaceSelector"] == {"matchNames": ["unthrottle"]}
        (endpoint,) = spec["endpoints" if kind == "ServiceMonitor" else "podMetricsEndpoints"]
        assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
        selector = spec["selector"]["matchLabels"]
        if kind == "ServiceMonitor":
            target = only(objects, "Service", f"{name}-metrics")["metadata"]["labels"]
        else:
            target = only(objects, workload)["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= target.items()
        # The agent's series carry the workload's namespace/pod/container: kept as scraped.
        assert endpoint.get("honorLabels", False) is (workload == "DaemonSet")


def test_the_prometheus_rule_carries_the_rules_of_unthrottle_prometheus_rules(
    tmp_path: Path,
) -> None:
    printed = subprocess.run([str(UNTHROTTLE), "prometheus-rules"], capture_output=True,
                             text=True, check=True).stdout  # fmt: skip
    assert (CHART / "files" / "recording-rules.yaml").read_text() == printed, (
        "regenerate: unthrottle prometheus-rules > charts/unthrottle/files/recording-rules.yaml"
    )
    rule = only(render({"monitoring": {"prometheusRule": {"enabled": True}}}), "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(printed)


@pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason=f"{MISSING} promtool is not installed (make prometheus installs Debian's as root)",
)
def test_promtool_accepts_the_prometheus_rule_the_chart_renders(tmp_path: Path) -> None:
    rule = only(render({"monitoring": {"prometheusRule": {"enabled": True}}}), "PrometheusRule")
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(rule["spec"]))
    out = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True,
                         text=True, check=False)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 1" in out.stdout or "SUCCESS" in out.stdout, out.stdout


def test_without_the_prometheus_operators_crds_none_of_its_objects_render_and_notes_say_so() -> (
    None
):
    values = {"monitoring": {"serviceMonitor": {"enabled": True},
                             "prometheusRule": {"enabled": True}}}  # fmt: skip
    files = render_files(values, api_versions=())
    kinds = {o["kind"] for o in render(values, api_versions=())}
    assert not kinds & MONITORING_KINDS
    notes = files["unthrottle/templates/NOTES.txt"]
    assert "monitoring.serviceMonitor.enabled is true, but this cluster has no ServiceMonitor" in (
        notes
    )
    assert "monitoring.prometheusRule.enabled is true" in notes
    assert "WARNING" not in render_files(values)["unthrottle/templates/NOTES.txt"]


def test_the_notes_say_what_to_do_next() -> None:
    notes = render_files()["unthrottle/templates/NOTES.txt"]
    assert "kubectl apply -f -" in notes and "kind: ThrottlePolicy" in notes  # apply a policy
    assert "kubectl describe tpol checkout" in notes  # read its status
    assert "checkout-report" in notes and "unthrottle report checkout" in notes  # its report
    assert "Apply mode is off" in notes
    namespaced = render_files({"operator": {"watchNamespaces": ["pay"]}})
    assert "namespace: pay" in namespaced["unthrottle/templates/NOTES.txt"]


def test_the_operator_is_ready_only_once_kopf_serves_its_probe() -> None:
    c = container(render(), "Deployment")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "liveness"}
    liveness = parse("operator", c["args"][1:])["liveness"]
    assert liveness.endswith(f":{ports['liveness']}")  # the port Kopf's probe listens on


def test_more_replicas_get_a_disruption_budget_and_spread_one_does_not() -> None:
    one = render()
    assert [o for o in one if o["kind"] == "PodDisruptionBudget"] == []
    assert "topologySpreadConstraints" not in only(one, "Deployment")["spec"]["template"]["spec"]
    three = render({"operator": {"replicas": 3}})
    pdb = only(three, "PodDisruptionBudget")
    pod = only(three, "Deployment")["spec"]["template"]
    assert pdb["spec"]["maxUnavailable"] == 1  # a drain leaves a standby to take over
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    spread = pod["spec"]["topologySpreadConstraints"]
    assert {s["topologyKey"] for s in spread} == {"topology.kubernetes.io/zone",
                                                 "kubernetes.io/hostname"}  # fmt: skip
    assert {s["whenUnsatisfiable"] for s in spread} == {"ScheduleAnyway"}  # never held back
    kubernetes_validate.validate(pdb, KUBE_VERSION, strict=True)


def test_the_agents_priority_class_preempts_unless_told_never() -> None:
    assert only(render(), "PriorityClass")["preemptionPolicy"] == "PreemptLowerPriority"
    never = render({"agent": {"priorityClass": {"preemptionPolicy": "Never"}}})
    assert only(never, "PriorityClass")["preemptionPolicy"] == "Never"


@pytest.mark.parametrize("kind", ["serviceMonitor", "podMonitor"])
def test_a_monitor_replaces_the_scrape_annotations_so_nothing_is_scraped_twice(kind: str) -> None:
    def annotated(objects: list[dict[str, Any]]) -> set[str]:
        return {o["kind"] for o in objects if o["kind"] in ("Deployment", "DaemonSet")
                and "prometheus.io/scrape" in (o["spec"]["template"]["metadata"].get(
                    "annotations") or {})}  # fmt: skip

    assert annotated(render()) == {"Deployment", "DaemonSet"}
    values = {"monitoring": {kind: {"enabled": True}}}
    assert annotated(render(values)) == set()
    # no Prometheus operator to render the monitor: the annotations stay, the only way in
    assert annotated(render(values, api_versions=())) == {"Deployment", "DaemonSet"}
