"""The chart's admission webhook for InPlace changes (templates/webhook.yaml): rendered and
linted by Helm's own engine (helm-python-sdk), checked against Kubernetes 1.30's schemas,
its certificate read with ``cryptography``, its arguments parsed by the real CLI; and an
install and upgrades on the real control plane, where ``lookup`` keeps the certificate.

What is checked is what a cluster admin relies on: the webhook comes with Apply mode
only; it can never hold a pod back; it sees only Deployments' pods, never the release's
namespace nor kube-system; the API server can reach the operator through it and trust
its certificate; an upgrade keeps that certificate, and a new one rolls the operator.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from chart_on_cluster import helm_config, with_image
from kube import Kube, fresh_name
from support.chart import (
    CHART,
    KUBE_VERSION,
    RELEASE,
    UNTHROTTLE,
    chart,
    container,
    only,
    parse,
    render,
)
from unthrottle.operator.admission import HANDLER_ID

IN_PLACE = {"enabled": True, "inPlace": {"enabled": True}}
APPLY: dict[str, Any] = {"operator": {"apply": IN_PLACE, "watchNamespaces": ["shop"]}}
"""Apply mode with InPlace, which the webhook serves."""
ROLLOUT: dict[str, Any] = {"operator": {"apply": {"enabled": True}, "watchNamespaces": ["shop"]}}
"""Apply mode with Rollout only (the policies' default method)."""
WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "Service", "Secret")
Obj = dict[str, Any]


def webhook_objects(objects: list[Obj]) -> dict[str, Obj]:
    """kind → the webhook's object of that kind, for those the chart rendered."""
    return {o["kind"]: o for o in objects if o["kind"] in WEBHOOK_KINDS
            and o["metadata"]["name"].endswith("-webhook")}  # fmt: skip


def hook_of(objects: list[Obj]) -> Obj:
    """The webhook for a Deployment's pods; the one for a StatefulSet's or DaemonSet's
    differs from it in its name and its object selector alone."""
    hook, revisions = only(objects, "MutatingWebhookConfiguration")["webhooks"]
    assert revisions["name"] == "inplace-revision-pods.unthrottle.io"
    assert revisions["objectSelector"] == {
        "matchExpressions": [{"key": "controller-revision-hash", "operator": "Exists"}]
    }
    same = ("name", "objectSelector")
    assert ({k: v for k, v in revisions.items() if k not in same}
            == {k: v for k, v in hook.items() if k not in same})  # fmt: skip
    return dict(hook)


def operator_params(objects: list[Obj]) -> dict[str, Any]:
    """The operator's options, parsed by the real CLI (the peering shell line's too)."""
    args = container(objects, "Deployment")["args"]
    return parse("operator", args[1:] if args[0] == "operator" else args)


def pem(data: str) -> bytes:
    return base64.b64decode(data)


# --- when it is there --------------------------------------------------------------------

WHEN = {
    "defaults": ({}, False),
    "apply-in-place": (APPLY, True),
    "apply-rollout-only": (ROLLOUT, False),
    "apply-in-place-webhook-off": ({"operator": {"apply": {"enabled": True, "inPlace": {
                                                    "enabled": True, "webhook": False}},
                                             "watchNamespaces": ["shop"]}}, False),
    "recommend-mode-webhook-asked": ({"operator": {"apply": {"enabled": False,
                                                             "inPlace": {"webhook": True}}}},
                                     False),
    "agent-only": ({"operator": {"enabled": False, "apply": IN_PLACE}}, False),
}  # fmt: skip


@pytest.mark.parametrize(("values", "present"), WHEN.values(), ids=WHEN.keys())
def test_the_webhook_comes_with_apply_mode_only_and_can_be_turned_off(
    values: Obj, present: bool
) -> None:
    """It gives pods the limits of an InPlace change, which only Apply mode with InPlace
    makes: on with operator.apply.inPlace.enabled, never for Apply with Rollout alone, off
    with operator.apply.inPlace.webhook false."""
    objects = render(values)
    found = webhook_objects(objects)
    assert set(found) == (set(WEBHOOK_KINDS) if present else set())
    if values.get("operator", {}).get("enabled", True):
        params = operator_params(objects)
        assert (params["webhook"] is not None) is present
        assert (params["webhook_tls_dir"] is not None) is present
        ports = {p["name"] for p in container(objects, "Deployment")["ports"]}
        assert ("webhook" in ports) is present


# --- it never holds a pod back, and sees only what it may change ---------------------------


def test_the_configuration_never_holds_a_pod_back() -> None:
    hook = hook_of(render(APPLY))
    assert hook["failurePolicy"] == "Ignore"  # the operator down: the pod is created as it came
    assert hook["timeoutSeconds"] == 2  # the operator hung: no more than 2 s
    assert hook["sideEffects"] == "None"  # dry runs are mutated too, and nothing else is done
    assert hook["reinvocationPolicy"] == "Never"
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
                              "operations": ["CREATE"], "scope": "Namespaced"}]  # fmt: skip


NAMESPACES = {  # Apply mode needs given namespaces (tests/servers/test_chart.py)
    "one-namespace": (["shop"], ["shop"]),
    "given-namespaces": (["shop", "pay"], ["shop", "pay"]),
}


@pytest.mark.parametrize(("watch", "only_in"), NAMESPACES.values(), ids=NAMESPACES.keys())
def test_it_sees_deployments_pods_only_never_in_its_own_namespace_or_kube_system(
    watch: list[str], only_in: list[str] | None
) -> None:
    hook = hook_of(render({"operator": {"apply": IN_PLACE, "watchNamespaces": watch}}))
    expressions = hook["namespaceSelector"]["matchExpressions"]
    name = "kubernetes.io/metadata.name"  # every namespace has it (the API server sets it)
    assert {"key": name, "operator": "NotIn", "values": [RELEASE["namespace"], "kube-system"]} in (
        expressions
    )
    given = [e["values"] for e in expressions if e["operator"] == "In"]
    assert given == ([only_in] if only_in else [])
    assert all(e["key"] == name for e in expressions)
    # a ReplicaSet labels its pods with pod-template-hash: no call for any other pod
    assert hook["objectSelector"] == {
        "matchExpressions": [{"key": "pod-template-hash", "operator": "Exists"}]
    }


# --- the API server reaches the operator, and trusts it ----------------------------------


def test_the_api_server_reaches_the_operators_webhook_through_its_service() -> None:
    objects = render(APPLY)
    reference = hook_of(objects)["clientConfig"]["service"]
    service = only(objects, "Service", reference["name"])
    assert reference["namespace"] == service["metadata"]["namespace"] == RELEASE["namespace"]
    assert reference["path"] == f"/{HANDLER_ID}"  # Kopf routes by path to the handler's id
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == reference["port"]]
    pod = only(objects, "Deployment")["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    ports = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
    params = operator_params(objects)
    assert params["webhook"] == f"0.0.0.0:{ports[port['targetPort']]}"
    # the certificate folder is the Secret, mounted read-only
    mounts = {m["mountPath"]: m for m in pod["spec"]["containers"][0]["volumeMounts"]}
    mount = mounts[str(params["webhook_tls_dir"])]
    assert mount["readOnly"] is True
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == mount["name"]]
    secret = only(objects, "Secret")
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    assert {i["path"] for i in volume["secret"]["items"]} == {"tls.crt", "tls.key"}
    assert secret["type"] == "kubernetes.io/tls"


def certificates(objects: list[Obj]) -> tuple[x509.Certificate, x509.Certificate, bytes]:
    """(the caBundle's CA, the Secret's certificate, the Secret's key in PEM)."""
    data = only(objects, "Secret")["data"]
    ca = x509.load_pem_x509_certificate(pem(hook_of(objects)["clientConfig"]["caBundle"]))
    assert pem(data["ca.crt"]) == ca.public_bytes(serialization.Encoding.PEM)
    return ca, x509.load_pem_x509_certificate(pem(data["tls.crt"])), pem(data["tls.key"])


def test_the_serving_certificate_is_signed_by_the_ca_bundle_and_names_the_service() -> None:
    objects = render(APPLY)
    ca, cert, key = certificates(objects)
    cert.verify_directly_issued_by(ca)  # raises unless the CA signed it
    reference = hook_of(objects)["clientConfig"]["service"]
    svc, ns = reference["name"], reference["namespace"]
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    # the API server asks for <service>.<namespace>.svc
    assert {f"{svc}.{ns}.svc", f"{svc}.{ns}", svc} <= set(names.get_values_for_type(x509.DNSName))
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in usage
    lasts = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert lasts.days >= 3649  # kept on upgrade, so it must outlast many of them
    private = serialization.load_pem_private_key(key, password=None)
    assert private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ) == cert.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _operator(tmp_path: Path, tls_dir: Path) -> subprocess.CompletedProcess[str]:
    """The real `unthrottle operator` with the chart's webhook flags and ``tls_dir``, and
    no kubeconfig: it fails there once every option is accepted."""
    env = {**os.environ, "KUBECONFIG": str(tmp_path / "absent"), "HOME": str(tmp_path)}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    argv = [str(UNTHROTTLE), "operator", "--prometheus", "http://prometheus:9090",
            "--webhook", "0.0.0.0:9443", "--webhook-tls-dir", str(tls_dir)]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120,
                          check=False)  # fmt: skip


def _write_tls(folder: Path, data: Obj) -> Path:
    folder.mkdir()
    for key in ("tls.crt", "tls.key"):
        (folder / key).write_bytes(pem(data[key]))
    return folder


def test_the_operator_accepts_the_charts_certificate_and_refuses_a_key_of_another(
    tmp_path: Path,
) -> None:
    data = only(render(APPLY), "Secret")["data"]
    accepted = _operator(tmp_path, _write_tls(tmp_path / "tls", data))
    assert "kubeconfig" in accepted.stderr.lower(), accepted.stderr
    other = only(render(APPLY), "Secret")["data"]  # each render without a cluster: new ones
    mixed = _write_tls(tmp_path / "mixed", {"tls.crt": data["tls.crt"],
                                            "tls.key": other["tls.key"]})  # fmt: skip
    refused = _operator(tmp_path, mixed)
    assert refused.returncode == 2
    assert "are not a certificate and its key" in refused.stderr, refused.stderr
    missing = _operator(tmp_path, tmp_path / "nowhere")
    assert missing.returncode == 2 and "tls.crt is not a file" in missing.stderr


def checksum(objects: list[Obj]) -> str:
    template = only(objects, "Deployment")["spec"]["template"]
    return str(template["metadata"]["annotations"]["checksum/webhook-tls"])


def test_the_operator_pod_carries_the_certificates_checksum_so_a_new_one_rolls_it() -> None:
    first, second = render(APPLY), render(APPLY)
    for objects in (first, second):
        data = only(objects, "Secret")["data"]
        # Helm's toJson of the three keys, as the template hashes it
        text = json.dumps({k: data[k] for k in ("ca.crt", "tls.crt", "tls.key")},
                          separators=(",", ":"))  # fmt: skip
        assert checksum(objects) == hashlib.sha256(text.encode()).hexdigest()
    # without a cluster to look the Secret up in, each render makes new ones: a new checksum
    assert certificates(first)[0] != certificates(second)[0]
    assert checksum(first) != checksum(second)
    assert "checksum/webhook-tls" not in (
        only(render(), "Deployment")["spec"]["template"]["metadata"].get("annotations") or {}
    )


CERT_MANAGER = {"operator": {"apply": {**IN_PLACE, "inPlace": {"enabled": True, "certificates": {
    "source": "certManager"}}}, "watchNamespaces": ["shop"]}}  # fmt: skip
CA = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").decode()
THEIRS = {"operator": {"apply": {**IN_PLACE, "inPlace": {"enabled": True, "certificates": {
    "source": "secret", "secret": {"name": "webhook-tls", "caBundle": CA}}}},
    "watchNamespaces": ["shop"]}}  # fmt: skip


# --- Helm and Kubernetes accept it -------------------------------------------------------

CONFIGURATIONS = {
    "apply-mode": APPLY,
    "apply-in-namespaces": {"operator": {"apply": IN_PLACE,
                                         "watchNamespaces": ["shop", "pay"]}},
    "apply-peering-no-scrape-annotations": {
        "operator": {"replicas": 3, "apply": IN_PLACE, "ports": {"webhook": 10443},
                     "watchNamespaces": ["shop"]},
        "monitoring": {"scrapeAnnotations": False},
    },
    "cert-manager": CERT_MANAGER,
    "own-secret": THEIRS,
}  # fmt: skip


@pytest.mark.parametrize("values", CONFIGURATIONS.values(), ids=CONFIGURATIONS.keys())
def test_every_webhook_configuration_is_valid_for_kubernetes_and_passes_helm_lint(
    values: Obj,
) -> None:
    objects = render(values)
    kinds = set(WEBHOOK_KINDS) - ({"Secret"} if values in (CERT_MANAGER, THEIRS) else set())
    assert set(webhook_objects(objects)) == kinds
    for obj in objects:
        if obj["apiVersion"] in ("kopf.dev/v1", "cert-manager.io/v1"):
            continue  # custom kinds: Kopf's peering (tests/servers/test_chart.py), cert-manager's
        try:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            where = ".".join(str(p) for p in error.path)
            pytest.fail(f"{obj['kind']} {obj['metadata']['name']}: {where}: {error.message}")
    report = helm.lint(CHART, with_image(values), strict=True, kube_version=f"v{KUBE_VERSION}")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []
    params = operator_params(objects)
    port = values["operator"].get("ports", {}).get("webhook", 9443)
    assert params["webhook"] == f"0.0.0.0:{port}"


BAD = {
    "misspelt-webhook-key": ({"operator": {"apply": {"enabled": True,
                                                     "inPlace": {"webhok": True}}}},
                             "/operator/apply/inPlace", "'webhok' not allowed"),
    "webhook-not-a-boolean": ({"operator": {"apply": {"enabled": True,
                                                      "inPlace": {"webhook": "yes"}}}},
                              "/operator/apply/inPlace/webhook", "boolean"),
    "webhook-port-zero": ({"operator": {"ports": {"webhook": 0}}}, "/operator/ports/webhook",
                          "minimum"),
}  # fmt: skip


@pytest.mark.parametrize(("values", "where", "why"), BAD.values(), ids=BAD.keys())
def test_the_schema_refuses_a_bad_webhook_value_naming_it(values: Obj, where: str,
                                                          why: str) -> None:  # fmt: skip
    with pytest.raises(helm.HelmValuesError) as refused:
        chart().validate_schema(values)
    assert f"at '{where}'" in str(refused.value) and why in str(refused.value)


# --- on the real control plane: an upgrade keeps the certificate ---------------------------


WEBHOOKS = "admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


@dataclass(frozen=True)
class Served:
    """The release's webhook as the server has it."""

    name: str
    """The Secret's, the Service's and the configuration's."""
    secret: dict[str, str]
    ca_bundle: str
    checksum: str
    replicaset: str
    """The operator's current ReplicaSet: a new one means its pod was rolled."""


def served(kube: Kube, release: str) -> Served:
    (deployment,) = kube.list("apps/v1/deployments", kube.namespace, selector=(
        f"app.kubernetes.io/instance={release},app.kubernetes.io/component=operator"))  # fmt: skip
    name = f"{deployment['metadata']['name']}-webhook"
    secret = kube.get("v1/secrets", kube.namespace, name)
    config = kube.get(WEBHOOKS, None, name)
    assert secret is not None and config is not None
    rolled = kube.rolled_out(kube.namespace, deployment["metadata"]["name"])
    return Served(name=name, secret=dict(secret["data"]),
                  ca_bundle=config["webhooks"][0]["clientConfig"]["caBundle"],
                  checksum=rolled["spec"]["template"]["metadata"]["annotations"][
                      "checksum/webhook-tls"],
                  replicaset=kube.replicaset_of(rolled)["metadata"]["name"])  # fmt: skip


@contextmanager
def released(kube: Kube, values: Obj) -> Iterator[tuple[helm.Config, str]]:
    """``helm install`` into the test's namespace (uninstalled after)."""
    release = fresh_name("ut")
    with helm_config(kube, kube.namespace) as config:
        try:
            summary = config.install(CHART, release, with_image(values), namespace=kube.namespace,
                                     timeout=120)  # fmt: skip
            assert summary["status"] == "deployed", summary
            yield config, release
        finally:
            config.uninstall(release, wait="watcher", timeout=120, ignore_not_found=True)


def test_an_upgrade_keeps_the_certificate_and_a_deleted_secret_is_made_anew(kube: Kube) -> None:
    """``lookup`` finds the release's Secret on upgrade: the same certificate, the same
    caBundle, the operator's pod left running. Deleted, the next upgrade makes new ones,
    caBundle and Secret in step, and rolls the operator to serve the new one."""
    watched = fresh_name("shop")  # the configuration applies there only
    kube.create_namespace(watched)
    values = {"operator": {"apply": IN_PLACE, "watchNamespaces": [watched]},
              "agent": {"enabled": False}}  # fmt: skip
    try:
        with released(kube, values) as (config, release):
            installed = served(kube, release)
            config.upgrade(
                CHART, release, with_image(values), namespace=kube.namespace, timeout=120
            )
            upgraded = served(kube, release)
            kube.delete("v1/secrets", kube.namespace, upgraded.name)
            config.upgrade(
                CHART, release, with_image(values), namespace=kube.namespace, timeout=120
            )
            renewed = served(kube, release)
    finally:
        kube.delete("v1/namespaces", None, watched)
    assert upgraded == installed
    assert renewed.secret["tls.crt"] != installed.secret["tls.crt"]
    assert renewed.ca_bundle == renewed.secret["ca.crt"] != installed.secret["ca.crt"]
    ca = x509.load_pem_x509_certificate(pem(renewed.ca_bundle))
    x509.load_pem_x509_certificate(pem(renewed.secret["tls.crt"])).verify_directly_issued_by(ca)
    assert renewed.checksum != installed.checksum
    assert renewed.replicaset != installed.replicaset  # the operator's pod was rolled


# --- under GitOps: cert-manager, or a Secret of the user's ---------------------------------


@pytest.mark.parametrize("values", [CERT_MANAGER, THEIRS], ids=["cert-manager", "own-secret"])
def test_under_gitops_two_renders_are_the_same_so_a_sync_settles(values: Obj) -> None:
    """helm template (Argo CD, Flux) has no cluster to look a Secret up in: with cert-manager
    or a Secret of the user's, nothing of the chart's changes from one render to the next,
    and the operator's pod carries no certificate checksum that would roll it."""
    first, second = render(values), render(values)
    assert first == second
    template = only(first, "Deployment")["spec"]["template"]
    assert "checksum/webhook-tls" not in (template["metadata"].get("annotations") or {})
    assert not [o for o in first if o["kind"] == "Secret"]  # the chart makes no key
    generated = render(APPLY)
    assert generated != render(APPLY)  # the default's new CA at each render, as documented


def test_cert_manager_issues_the_certificate_and_its_cainjector_fills_the_ca_bundle() -> None:
    objects = render(CERT_MANAGER)
    hook = only(objects, "MutatingWebhookConfiguration")
    name = hook["metadata"]["name"]
    assert hook["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": f"{RELEASE['namespace']}/{name}"}  # fmt: skip
    assert "caBundle" not in hook_of(objects)["clientConfig"]
    cert = only(objects, "Certificate")
    reference = hook_of(objects)["clientConfig"]["service"]
    svc, ns = reference["name"], reference["namespace"]
    assert f"{svc}.{ns}.svc" in cert["spec"]["dnsNames"]  # what the API server asks for
    assert cert["spec"]["secretName"] == name  # the Secret the operator mounts
    pod = only(objects, "Deployment")["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "webhook-tls"]
    assert volume["secret"]["secretName"] == name
    # no issuer given: a self-signed Issuer of the release's; given: that one
    assert only(objects, "Issuer")["spec"] == {"selfSigned": {}}
    assert cert["spec"]["issuerRef"] == {"name": name, "kind": "Issuer",
                                         "group": "cert-manager.io"}  # fmt: skip
    theirs = json.loads(json.dumps(CERT_MANAGER))
    theirs["operator"]["apply"]["inPlace"]["certificates"]["certManager"] = {
        "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}
    }
    objects = render(theirs)
    assert not [o for o in objects if o["kind"] == "Issuer"]
    assert only(objects, "Certificate")["spec"]["issuerRef"] == {
        "name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}  # fmt: skip


def test_a_secret_of_the_users_is_mounted_and_its_ca_trusted() -> None:
    objects = render(THEIRS)
    assert hook_of(objects)["clientConfig"]["caBundle"] == CA
    pod = only(objects, "Deployment")["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "webhook-tls"]
    assert volume["secret"]["secretName"] == "webhook-tls"
    assert not [o for o in objects if o["kind"] in ("Certificate", "Issuer")]
    missing = json.loads(json.dumps(THEIRS))
    del missing["operator"]["apply"]["inPlace"]["certificates"]["secret"]["caBundle"]
    with pytest.raises(helm.HelmRenderError, match=r"set certificates\.secret\.name"):
        render(missing)
