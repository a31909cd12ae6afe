"""Pods on the real node reach the API server through the ``kubernetes`` Service, as on a
cluster, and the host reaches a Service's pods through its ClusterIP, as the API server does
for an admission webhook: kube-proxy's rules on the node, the server advertising the node's
address.

One node for the session (``real_node`` in conftest); each test a namespace of its own and
pods pinned to the node (``nodeName``), tolerating its taint.
"""

from __future__ import annotations

import base64
import datetime
import json
import textwrap
import urllib.request
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from kube import Kube
from unthrottle_lab.kube import REAL_NODE_TAINT, RealNode

pytestmark = pytest.mark.kernel

WEBHOOKS = "admissionregistration.k8s.io/v1/validatingwebhookconfigurations"

# In-cluster config by hand, as a client library reads it: the Service's address the kubelet
# injects, the mounted CA and token. One GET of the pod itself with the token, one without.
IN_CLUSTER = textwrap.dedent("""
    import json, os, ssl, urllib.error, urllib.request
    sa = "/var/run/secrets/kubernetes.io/serviceaccount"
    host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
    ns, token = open(f"{sa}/namespace").read(), open(f"{sa}/token").read()
    url = f"https://{host}:{port}/api/v1/namespaces/{ns}/pods/{os.environ['POD_NAME']}"
    context = ssl.create_default_context(cafile=f"{sa}/ca.crt")
    def status(headers):
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                        context=context, timeout=10) as reply:
                return reply.status
        except urllib.error.HTTPError as error:
            return error.code
    print(json.dumps({"host": host, "port": port, "without_token": status({}),
                      "with_token": status({"Authorization": f"Bearer {token}"})}))
""")

# An admission webhook in a pod: it denies every object it is asked about, naming itself.
WEBHOOK = textwrap.dedent("""
    import json, os, ssl
    from http.server import BaseHTTPRequestHandler, HTTPServer
    class Deny(BaseHTTPRequestHandler):
        def do_POST(self):
            review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            reply = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                     "response": {"uid": review["request"]["uid"], "allowed": False,
                                  "status": {"message": "denied by " + os.environ["POD_NAME"]}}}
            body = json.dumps(reply).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
    server = HTTPServer(("0.0.0.0", 8443), Deny)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain("/tls/tls.crt", "/tls/tls.key")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    server.serve_forever()
""")


def _pod(node: RealNode, name: str, namespace: str, command: list[str], *,
         labels: dict[str, str] | None = None, port: int | None = None,
         **spec: Any) -> dict[str, Any]:  # fmt: skip
    """A pod of the workload image (this machine's Python) on the real node."""
    container: dict[str, Any] = {
        "name": "app", "image": node.images["workload"].name, "imagePullPolicy": "Never",
        "command": command,
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"},
                      "limits": {"cpu": "500m", "memory": "128Mi"}},
    }  # fmt: skip
    if port is not None:
        container["ports"] = [{"containerPort": port}]
        container["readinessProbe"] = {"tcpSocket": {"port": port}, "periodSeconds": 1}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {"nodeName": node.name, "tolerations": [{**REAL_NODE_TAINT, "operator": "Equal"}],
                 "terminationGracePeriodSeconds": 1, "containers": [container], **spec},
    }  # fmt: skip


def _service(name: str, namespace: str, *, port: int, target: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": namespace},
        "spec": {"selector": {"app": name}, "ports": [{"port": port, "targetPort": target}]},
    }  # fmt: skip


def _ready(kube: Kube, name: str) -> dict[str, Any]:
    def ready(pod: dict[str, Any] | None) -> bool:
        return pod is not None and any(c["type"] == "Ready" and c["status"] == "True"
                                       for c in pod["status"].get("conditions") or [])  # fmt: skip

    pod = kube.until(f"{name} Ready on the real node",
                     lambda: kube.get("v1/pods", kube.namespace, name), ready,
                     timeout_s=90)  # fmt: skip
    assert pod is not None
    return pod


def _serving_certificate(dns: str) -> tuple[bytes, bytes]:
    """A self-signed certificate for ``dns`` (PEM) and its key: the webhook's, and the
    ``caBundle`` the API server checks it against."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(dns)]), critical=False)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())  # fmt: skip
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def test_a_pod_reads_the_api_through_the_kubernetes_service_with_its_token(
    kube: Kube, real_node: RealNode
) -> None:
    ns = kube.namespace
    kube.create("v1/serviceaccounts", {
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "reader", "namespace": ns},
    })  # fmt: skip
    kube.create("rbac.authorization.k8s.io/v1/roles", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "reader", "namespace": ns},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}],
    })  # fmt: skip
    kube.create("rbac.authorization.k8s.io/v1/rolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "reader", "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": ns}],
    })  # fmt: skip
    kube.create("v1/pods", _pod(real_node, "in-cluster", ns, ["python", "-c", IN_CLUSTER],
                                serviceAccountName="reader", restartPolicy="Never"))  # fmt: skip
    done = kube.until("the in-cluster client's pod done",
                      lambda: kube.get("v1/pods", ns, "in-cluster"),
                      lambda p: p is not None and p["status"].get("phase") in {"Succeeded",
                                                                               "Failed"},
                      timeout_s=90)  # fmt: skip
    log = kube.call("GET", f"/api/v1/namespaces/{ns}/pods/in-cluster/log")
    assert done is not None and done["status"]["phase"] == "Succeeded", log
    # The log is the one JSON line the pod printed (the admin's client decodes it).
    seen = log if isinstance(log, dict) else json.loads(str(log).strip().splitlines()[-1])
    assert (seen["host"], seen["port"]) == ("10.96.0.1", "443")  # the Service, not the host
    assert seen["with_token"] == 200
    assert seen["without_token"] in (401, 403)  # the server's authentication, through it


def test_the_kubernetes_service_leads_to_the_address_the_server_advertises(
    kube: Kube, real_node: RealNode, control_plane: Any
) -> None:
    slices = kube.list("discovery.k8s.io/v1/endpointslices", "default",
                       selector="kubernetes.io/service-name=kubernetes")  # fmt: skip
    port = int(control_plane.server.rsplit(":", 1)[1])
    assert [(e["addresses"], s["ports"][0]["port"]) for s in slices for e in s["endpoints"]] == [
        (["10.88.0.1"], port)
    ]


def test_the_host_reaches_a_pod_through_its_services_cluster_ip(
    kube: Kube, real_node: RealNode
) -> None:
    ns = kube.namespace
    kube.create("v1/pods", _pod(real_node, "web", ns,
                                ["python", "-m", "http.server", "8080", "-d", "/"],
                                labels={"app": "web"}, port=8080))  # fmt: skip
    service = kube.create("v1/services", _service("web", ns, port=80, target=8080))
    _ready(kube, "web")
    url = f"http://{service['spec']['clusterIP']}:80/"

    def get() -> int:
        try:
            with urllib.request.urlopen(url, timeout=3) as reply:
                return int(reply.status)
        except OSError:
            return 0

    assert kube.until(f"GET {url} from the host", get, lambda s: s == 200, timeout_s=30) == 200


def test_the_api_server_calls_a_webhook_in_a_pod_through_its_service(
    kube: Kube, real_node: RealNode
) -> None:
    ns = kube.namespace
    cert, key = _serving_certificate(f"deny.{ns}.svc")
    kube.create("v1/secrets", {
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": "deny-tls", "namespace": ns},
        "data": {"tls.crt": base64.b64encode(cert).decode(),
                 "tls.key": base64.b64encode(key).decode()},
    })  # fmt: skip
    pod = _pod(real_node, "deny", ns, ["python", "-c", WEBHOOK], labels={"app": "deny"},
               port=8443,
               volumes=[{"name": "tls", "secret": {"secretName": "deny-tls"}}])  # fmt: skip
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "tls", "mountPath": "/tls"}]
    kube.create("v1/pods", pod)
    kube.create("v1/services", _service("deny", ns, port=443, target=8443))
    _ready(kube, "deny")
    webhook = f"deny-{ns}"
    kube.create(WEBHOOKS, {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": webhook},
        "webhooks": [{
            "name": "deny.unthrottle.io", "admissionReviewVersions": ["v1"],
            "sideEffects": "None", "failurePolicy": "Fail", "timeoutSeconds": 5,
            "clientConfig": {"service": {"name": "deny", "namespace": ns, "port": 443},
                             "caBundle": base64.b64encode(cert).decode()},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": ["configmaps"]}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "objectSelector": {"matchLabels": {"probe": "webhook"}},
        }],
    })  # fmt: skip
    try:
        probe = {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"generateName": "probe-", "namespace": ns,
                              "labels": {"probe": "webhook"}}}  # fmt: skip
        _, reply = kube.until(
            "the webhook's answer",
            lambda: kube.try_call("POST", f"/api/v1/namespaces/{ns}/configmaps", probe),
            lambda r: r[0] != 201 and "denied by deny" in str(r[1]), timeout_s=30,
        )  # fmt: skip
        assert "denied by deny" in reply["message"], reply
    finally:
        kube.delete(WEBHOOKS, None, webhook)
