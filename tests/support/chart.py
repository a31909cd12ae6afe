"""What test_chart.py shares with other test modules: constants, helpers and
fixtures (and the tests another module runs again), so that no test module imports
another."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import helm_python as helm
import typer
import yaml

from chart_on_cluster import with_image
from support.paths import ROOT
from unthrottle.cli.main import app

CHART = ROOT / "charts" / "unthrottle"
KUBE_VERSION = "1.30.0"
RELEASE = {"name": "unthrottle", "namespace": "unthrottle"}
UNTHROTTLE = Path(sys.executable).with_name("unthrottle")
# The Prometheus operator's kinds, as a cluster with its CRDs reports them (helm template's
# --api-versions): the chart renders them only where they are served.
MONITORING_APIS = [
    "monitoring.coreos.com/v1",
    "monitoring.coreos.com/v1/ServiceMonitor",
    "monitoring.coreos.com/v1/PodMonitor",
    "monitoring.coreos.com/v1/PrometheusRule",
]
MONITORING_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}

PROMETHEUS_AUTH = {
    "url": "https://thanos-querier.openshift-monitoring.svc:9091/prefix",
    "timeout": 10,
    "retries": 5,
    "insecure": True,
    "headers": {"X-Scope-OrgID": "tenant-a"},
    "bearerTokenSecret": {"name": "prometheus-token", "key": "token"},
    "basicAuthSecret": {"name": "prometheus-basic", "key": "auth"},
    "caBundle": {"configMap": "", "secret": "prometheus-ca", "key": "ca.pem"},
}
CONFIGURATIONS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "apply-mode": {"operator": {"apply": {"enabled": True}, "watchNamespaces": ["shop"]}},
    "apply-in-place": {"operator": {"apply": {"enabled": True, "inPlace": {"enabled": True}},
                                    "watchNamespaces": ["shop"]}},
    "two-replicas-peering-cluster-wide": {"operator": {"replicas": 2}},
    "two-replicas-peering-in-namespaces": {
        "operator": {"replicas": 2, "watchNamespaces": ["shop", "pay"]}
    },
    "given-namespaces": {"operator": {"watchNamespaces": ["shop"]}},
    "burst-writing-on": {"agent": {"burst": {"enabled": True, "namespaces": ["shop", "*"],
                                              "koordinator": True}}},
    "service-monitors": {"monitoring": {"serviceMonitor": {"enabled": True}}},
    "pod-monitors": {"monitoring": {"podMonitor": {"enabled": True}}},
    "prometheus-rule": {"monitoring": {"prometheusRule": {"enabled": True}}},
    "prometheus-auth": {"prometheus": PROMETHEUS_AUTH},
    "token-file-and-ca-configmap": {
        "prometheus": {
            "bearerTokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token",
            "caBundle": {"configMap": "service-ca", "secret": "", "key": "service-ca.crt"},
        }
    },
    "operator-only": {"agent": {"enabled": False}},
    "agent-only": {"operator": {"enabled": False}},
    "existing-priority-class-and-digest": {
        "agent": {"priorityClass": {"create": False}, "priorityClassName": "system-node-critical"},
        "image": {"repository": "registry.example/unthrottle", "digest": "sha256:" + "ab" * 32},
    },
    "every-feature": {
        "operator": {"replicas": 3, "apply": {"enabled": True}, "watchNamespaces": ["shop"],
                     "debug": True, "logFormat": "text"},
        "agent": {"burst": {"enabled": False}, "kubepodsParent": "kubelet.slice",
                  "seLinuxOptions": {"type": "spc_t"}},
        "monitoring": {"serviceMonitor": {"enabled": True, "labels": {"release": "kps"}},
                       "prometheusRule": {"enabled": True, "labels": {"release": "kps"}}},
        "prometheus": PROMETHEUS_AUTH,
        "commonLabels": {"team": "platform"},
    },
}  # fmt: skip


# --- rendering ------------------------------------------------------------------------------


@cache
def chart() -> helm.Chart:
    return helm.Chart.load(CHART)


def render_files(
    values: dict[str, Any] | None = None,
    *,
    kube_version: str = KUBE_VERSION,
    api_versions: tuple[str, ...] = tuple(MONITORING_APIS),
) -> dict[str, str]:
    """`helm template` of the chart: template path → rendered text (NOTES.txt included).

    helm-python-sdk 0.2's Chart.render() passes no kube_version or api_versions (helm
    template's --kube-version and --api-versions), which its native helm_render takes in the
    same options object; so it is called directly (the version is pinned in pyproject.toml).
    """
    from helm_python import _native

    options = {**RELEASE, "kube_version": f"v{kube_version}", "api_versions": list(api_versions)}
    out = _native.call_string("helm_render", chart()._raw(), json.dumps(with_image(values)),
                              json.dumps(options))  # fmt: skip
    rendered: dict[str, str] = json.loads(out)
    return rendered


def render(values: dict[str, Any] | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    """Every object the chart renders (without crds/, as helm template does by default)."""
    objects = []
    for path, text in sorted(render_files(values, **kwargs).items()):
        if path.endswith(".yaml"):
            objects += [doc for doc in yaml.safe_load_all(text) if doc]
    return objects


def crd_objects() -> list[dict[str, Any]]:
    return [doc for path in sorted((CHART / "crds").glob("*.yaml"))
            for doc in yaml.safe_load_all(path.read_text()) if doc]  # fmt: skip


def only(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects
             if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]  # fmt: skip
    assert len(found) == 1, f"{len(found)} {kind} {name or ''}"
    return found[0]


def container(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    spec = only(objects, kind)["spec"]["template"]["spec"]
    (one,) = spec["containers"]
    return dict(one)


def operator_argv(objects: list[dict[str, Any]]) -> list[str]:
    """The operator's command line as the container runs it (the shell line included)."""
    c = container(objects, "Deployment")
    return [*c.get("command", ["unthrottle"]), *c["args"]]


# --- the real engine renders, lints and validates every configuration -----------------------


# --- the values schema refuses bad values, naming them ------------------------------------

BAD_VALUES = {
    "zero-replicas": ({"operator": {"replicas": 0}}, "/operator/replicas", "minimum"),
    "period-without-unit": ({"agent": {"period": "100"}}, "/agent/period", "pattern"),
    "cfs-period-without-unit": ({"operator": {"cfsPeriod": "100"}}, "/operator/cfsPeriod",
                                "pattern"),
    "url-without-scheme": ({"prometheus": {"url": "prometheus:9090"}}, "/prometheus/url",
                           "pattern"),
    "unknown-log-format": ({"operator": {"logFormat": "yaml"}}, "/operator/logFormat",
                           "one of"),
    "misspelt-key": ({"operator": {"replica": 2}}, "/operator", "'replica' not allowed"),
    "threshold-above-one": ({"agent": {"burst": {"nodeThreshold": 1.5}}},
                            "/agent/burst/nodeThreshold", "maximum"),
    "namespace-not-a-name": ({"operator": {"watchNamespaces": ["Shop_1"]}},
                             "/operator/watchNamespaces/0", "pattern"),
    "burst-namespace-not-a-name": ({"agent": {"burst": {"namespaces": ["shop*"]}}},
                                   "/agent/burst/namespaces/0", "pattern"),
}  # fmt: skip


CONFLICTS = {
    "both-monitor-kinds": (
        {"monitoring": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}}},
        "monitoring.serviceMonitor.enabled and monitoring.podMonitor.enabled",
    ),
    "nothing-to-install": ({"operator": {"enabled": False}, "agent": {"enabled": False}},
                           "nothing to install"),
    "two-ca-sources": ({"prometheus": {"caBundle": {"configMap": "a", "secret": "b",
                                                     "key": "ca.crt"}}}, "prometheus.caBundle"),
    "unused-priority-class": ({"agent": {"priorityClassName": "system-node-critical"}},
                              "agent.priorityClass.create=false"),
    "apply-without-namespaces": ({"operator": {"apply": {"enabled": True}}},
                                 "operator.apply.enabled needs operator.watchNamespaces"),
    "apply-in-kube-system": ({"operator": {"apply": {"enabled": True},
                                           "watchNamespaces": ["shop", "kube-system"]}},
                             "Apply mode is never granted in kube-system"),
    "burst-without-namespaces": ({"agent": {"burst": {"enabled": True}}},
                                 "agent.burst.enabled needs agent.burst.namespaces"),
    "in-place-without-apply": ({"operator": {"apply": {"inPlace": {"enabled": True}}}},
                               "operator.apply.inPlace.enabled needs operator.apply.enabled"),
}  # fmt: skip


# --- the operator -------------------------------------------------------------------------


def parse(name: str, args: list[str]) -> dict[str, Any]:
    """Parse a command line with the real CLI's options and types (nothing is run): a flag
    the CLI does not have, or a value of the wrong type or range, fails here."""
    group = typer.main.get_command(app)
    parent = group.make_context("unthrottle", [name, *args])
    command = group.get_command(parent, name)  # type: ignore[attr-defined]
    assert command is not None, name
    return dict(command.make_context(name, list(args), parent=parent).params)


def run_shell_line(argv: list[str], tmp_path: Path) -> list[str]:
    """Run a container's /bin/sh -c line with a stand-in `unthrottle` that prints its argv."""
    fake = tmp_path / "unthrottle"
    fake.write_text('#!/bin/sh\nprintf "%s\\0" "$@"\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    out = subprocess.run(["sh", *argv[1:]], capture_output=True, check=True, env=env)
    return out.stdout.decode().split("\0")[:-1]


REAL_RUNS = {
    "defaults": {},
    "peering-namespaces-auth-burst-off": {
        "operator": {"replicas": 2, "watchNamespaces": ["shop", "pay"], "logFormat": "text",
                     "statusMaxWorkloads": 1000, "cfsPeriod": "50ms"},
        "agent": {"burst": {"enabled": False}, "logLevel": "debug"},
        "prometheus": {**PROMETHEUS_AUTH, "caBundle": {"configMap": "", "secret": "",
                                                       "key": "ca.crt"}},
    },
}  # fmt: skip


# --- RBAC: exactly docs/operator.md's table -----------------------------------------------

Rule = tuple[str, str, str]  # (API group, resource, verb)


def documented_rbac() -> list[tuple[set[Rule], str]]:
    """docs/operator.md, "RBAC (least privilege)": each row's rules, and its reason."""
    text = (ROOT / "docs" / "operator.md").read_text()
    section = text.split("## RBAC (least privilege)", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        rules = set()
        for token in re.findall(r"`([^`]+)`", cells[0]):
            base, _, sub = token.partition("/")
            resource, _, group = base.partition(".")
            for verb in (v.strip() for v in cells[1].split(",")):
                rules.add((group, f"{resource}/{sub}" if sub else resource, verb))
        rows.append((rules, cells[2]))
    assert len(rows) >= 10, "the RBAC table of docs/operator.md was not found"
    return rows


def granted(objects: list[dict[str, Any]], role_names: set[str]) -> set[Rule]:
    rules = set()
    for role in objects:
        if role["kind"] in ("ClusterRole", "Role") and role["metadata"]["name"] in role_names:
            for rule in role["rules"]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        rules |= {(group, resource, verb) for verb in rule["verbs"]}
    return rules


OPERATOR_ROLES = {"unthrottle-operator", "unthrottle-operator-cluster"}
PEERING_VERBS = ("get", "list", "watch", "patch")  # Kopf's keep-alives in the peering status
RBAC_CASES = {
    "recommend-cluster-wide": ({}, False, False),
    "apply-in-namespaces": ({"operator": {"apply": {"enabled": True},
                                          "watchNamespaces": ["shop"]}}, True, True),
    "apply-in-place-in-namespaces": ({"operator": {"apply": {"enabled": True, "inPlace": {
        "enabled": True}}, "watchNamespaces": ["shop"]}}, True, True),
    "recommend-in-namespaces": ({"operator": {"watchNamespaces": ["shop"]}}, False, True),
    "peering-cluster-wide": ({"operator": {"replicas": 2}}, False, False),
    "peering-in-namespaces": ({"operator": {"replicas": 2, "watchNamespaces": ["shop"]}},
                              False, True),
}  # fmt: skip


# --- the agent ------------------------------------------------------------------------------


def cgroup_mount(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    pod = only(objects, "DaemonSet")["spec"]["template"]["spec"]
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "cgroup"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "cgroup"]
    return mount, volume


def millicores(quantity: str) -> float:
    return float(quantity[:-1]) if quantity.endswith("m") else float(quantity) * 1000


# --- Services, monitors, rules, notes -----------------------------------------------------


# --- the install path (issue 30, item 6) ---------------------------------------------------
