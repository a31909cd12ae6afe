"""A real Kubernetes control plane on 127.0.0.1: etcd, kube-apiserver (RBAC, service-account
signing, the default admission plugins), kube-controller-manager, kube-scheduler, and kwok
with fake nodes whose pods the real controllers create and the real scheduler places.

The API server also serves where a real node's pods reach it, as on a cluster: it listens
on every address (``0.0.0.0``: the node's bridge, and with it its address, is made after
the server starts, and a server bound to one address cannot gain another) and advertises
:data:`ADVERTISE_ADDRESS`, the real node's address, so the ``kubernetes`` Service's
Endpoints and EndpointSlice name ``ADVERTISE_ADDRESS:<port>`` and the node's kube-proxy
maps ``10.96.0.1:443`` there. kube-apiserver does not insist that the address it
advertises exists when it starts; until a real node runs, the endpoint leads nowhere (no
pod of a fake node sends traffic). Its certificate names that address too.

Everything lives in one folder: keys and certificates, etcd's data, each component's log,
the admin kubeconfig. :meth:`ControlPlane.stop` ends every process it started, by PID, and
removes what it wrote.
"""

from __future__ import annotations

import base64
import ctypes
import json
import os
import shutil
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from unthrottle_lab.children import stop
from unthrottle_lab.kube.build import Binaries, ensure_built, kubernetes_version
from unthrottle_lab.kube.pki import Pki, make_pki
from unthrottle_lab.prometheus import free_port

__all__ = ["ControlPlane", "KubectlError", "StartError"]

SERVICE_RANGE = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"  # the range's first address: the `kubernetes` Service
ADVERTISE_ADDRESS = "10.88.0.1"
"""Where a real node's pods reach the API server: the node's address, its bridge's own
(:data:`unthrottle_lab.kube.node.NODE_ADDRESS`); the ``kubernetes`` Service's endpoint."""
FAKE_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")


class KubectlError(RuntimeError):
    """kubectl failed (the message has its command and its stderr)."""


class StartError(RuntimeError):
    """A component did not start or become ready in time (the message has its log's end)."""


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


_LIBC = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: the kernel sends it SIGKILL when the process that started
    it dies, so a test run killed with SIGKILL leaves no API server or etcd behind. One
    libc call, nothing that takes a lock (the hazard of preexec_fn beside threads)."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _decoded(raw: bytes) -> Any:
    """A reply's JSON, or its text (``/readyz`` answers ``ok``), or None when empty."""
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


def fake_node(name: str, *, cpu: str = "16", memory: str = "64Gi") -> dict[str, Any]:
    """A Node that kwok manages: it keeps the node's lease and ``Ready`` condition, and
    plays the kubelet for the pods placed on it."""
    key, value = FAKE_NODE_ANNOTATION
    capacity = {"cpu": cpu, "memory": memory, "pods": "110"}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name, "annotations": {key: value, "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                       "kubernetes.io/arch": "amd64", "type": "kwok"},
        },
        "status": {"capacity": capacity, "allocatable": capacity},
    }  # fmt: skip


class ControlPlane:
    """Start with :meth:`start` (or ``with``); ``kubeconfig`` is then the admin's."""

    def __init__(self, folder: Path, *, nodes: int = 3, binaries: Binaries | None = None,
                 timeout_s: float = 90.0, client_qps: int | None = None) -> None:  # fmt: skip
        self.folder = folder
        self.nodes = nodes
        self.timeout_s = timeout_s
        self.client_qps = client_qps
        """The controllers' and the scheduler's requests per second to the API server (their
        defaults, 20 and 50, when None); a benchmark that rolls out thousands of Deployments
        raises it, or their client-side rate limit sets its pace."""
        self._binaries = binaries
        self._procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self._made: list[Path] = []
        self.version = kubernetes_version()
        self.api_port = free_port()
        self.server = f"https://127.0.0.1:{self.api_port}"
        self.kubeconfig = folder / "kubeconfig"
        self.pki = Pki(folder / "pki")

    # -- the public surface ----------------------------------------------------------------

    @property
    def binaries(self) -> Binaries:
        if self._binaries is None:
            self._binaries = ensure_built()
        return self._binaries

    def bin(self, name: str) -> Path:
        """A binary this control plane runs (``kubectl`` too)."""
        return self.binaries.path(name)

    def start(self) -> ControlPlane:
        """Start every component and wait until each is ready (StartError otherwise)."""
        started = time.monotonic()
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            for sub in ("pki", "logs", "etcd"):
                self._made.append(self.folder / sub)
            (self.folder / "logs").mkdir(exist_ok=True)
            make_pki(self.pki.folder, service_ip=SERVICE_IP, addresses=(ADVERTISE_ADDRESS,))
            self._start_etcd()
            self._start_apiserver()
            self._write_kubeconfig()
            self._start_controllers()
            self._add_nodes()
            self._wait(
                "the default ServiceAccount (controller-manager)",
                lambda: self._ok("/api/v1/namespaces/default/serviceaccounts/default"),
            )
        except BaseException:
            self.stop()
            raise
        self.started_in_s = time.monotonic() - started
        return self

    def stop(self) -> None:
        """End every component, last started first, by PID; remove what was written."""
        for _, proc in reversed(self._procs):
            stop(proc, timeout_s=10)
        self._procs.clear()
        for path in self._made:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        self._made.clear()

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        self.stop()

    def request(self, method: str, path: str, body: Any = None, *,
                content_type: str = "application/json") -> tuple[int, Any]:  # fmt: skip
        """One call to the API server as the admin: (HTTP status, decoded body)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method,
                                     headers={"Content-Type": content_type})  # fmt: skip
        try:
            with urllib.request.urlopen(req, context=self._tls(), timeout=10) as reply:
                return reply.status, _decoded(reply.read())
        except urllib.error.HTTPError as error:
            return error.code, _decoded(error.read())

    def kubectl(self, *args: str, timeout_s: float = 90.0) -> str:
        """Run this control plane's own kubectl as the admin; its stdout (KubectlError
        with kubectl's stderr when it fails)."""
        done = subprocess.run([str(self.bin("kubectl")), "--kubeconfig", str(self.kubeconfig),
                               *args], capture_output=True, text=True, timeout=timeout_s,
                              check=False)  # fmt: skip
        if done.returncode != 0:
            raise KubectlError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def install_crds(self, path: Path, *, server_side: bool = False) -> list[str]:
        """Apply the CustomResourceDefinitions in ``path`` (a file or a folder) with kubectl,
        as the README tells users to, and wait until each is Established (the server
        accepted its schema); their ``crd/NAME``s."""
        extra = ["--server-side"] if server_side else []
        names = self.kubectl("apply", *extra, "-f", str(path), "-o", "name").split()
        self.kubectl("wait", "--for=condition=Established", "--timeout=60s", *names)
        return names

    def link_binaries(self, folder: Path) -> None:
        """Symbolic links to every binary this control plane runs (kubectl among them) in
        ``folder``, removed by :meth:`stop` with the rest."""
        folder.mkdir(parents=True, exist_ok=True)
        self._made.append(folder)
        for binary in (self.binaries.folder / "bin").iterdir():
            (folder / binary.name).unlink(missing_ok=True)
            (folder / binary.name).symlink_to(binary)

    def exited(self) -> list[str]:
        """The components that have ended (none while all is well)."""
        return [name for name, proc in self._procs if proc.poll() is not None]

    def pids(self) -> dict[str, int]:
        """Each running component's PID."""
        return {name: proc.pid for name, proc in self._procs if proc.poll() is None}

    # -- the steps ------------------------------------------------------------------------

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = (self.folder / "logs" / f"{name}.log").open("wb")
        binary = str(self.bin(name))
        proc = subprocess.Popen([binary, *args], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=self.folder,
                                preexec_fn=_die_with_parent)  # noqa: PLW1509  # fmt: skip
        log.close()
        self._procs.append((name, proc))
        return proc

    def _wait(self, what: str, ready: Callable[[], bool], *, log: str | None = None) -> None:
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            for name, proc in self._procs:
                if proc.poll() is not None:
                    raise StartError(
                        f"{name} exited ({proc.returncode}) while waiting for "
                        f"{what}:\n{_tail(self.folder / 'logs' / f'{name}.log')}"
                    )
            try:
                if ready():
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
        where = f":\n{_tail(self.folder / 'logs' / f'{log}.log')}" if log else ""
        raise StartError(f"{what} not ready after {self.timeout_s:.0f} s{where}")

    def _tls(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.pki.ca))
        context.load_cert_chain(*map(str, self.pki.admin))
        return context

    def _ok(self, path: str) -> bool:
        status, _ = self.request("GET", path)
        return status == 200

    @staticmethod
    def _healthy(url: str) -> bool:
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # the component's self-signed serving cert
        with urllib.request.urlopen(url, context=insecure, timeout=5) as reply:
            return bool(reply.status == 200)

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        self._spawn("etcd", [
            "--name=default", f"--data-dir={self.folder / 'etcd'}",
            f"--listen-client-urls={self.etcd_url}", f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=default=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync=true",  # a test's data: no need to survive a power cut
            "--log-level=warn",
        ])  # fmt: skip

        def healthy() -> bool:
            with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=5) as reply:
                return bool(json.loads(reply.read()).get("health") == "true")

        self._wait("etcd", healthy, log="etcd")

    def _start_apiserver(self) -> None:
        cert, key = self.pki.server
        public, private = self.pki.service_accounts
        self._spawn("kube-apiserver", [
            f"--etcd-servers={self.etcd_url}",
            # Every address: 127.0.0.1 for us, the node's bridge for its pods (module doc).
            "--bind-address=0.0.0.0", f"--advertise-address={ADVERTISE_ADDRESS}",
            f"--secure-port={self.api_port}",
            f"--tls-cert-file={cert}", f"--tls-private-key-file={key}",
            f"--client-ca-file={self.pki.ca}",
            "--authorization-mode=Node,RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={public}",
            f"--service-account-signing-key-file={private}",
            f"--service-cluster-ip-range={SERVICE_RANGE}",
            "--allow-privileged=true",  # the node agent's DaemonSet mounts the host's cgroups
            # A real node's kubelet (logs, exec, port-forward), reached at its address.
            f"--kubelet-client-certificate={self.pki.kubelet_client[0]}",
            f"--kubelet-client-key={self.pki.kubelet_client[1]}",
            f"--kubelet-certificate-authority={self.pki.ca}",
            "--kubelet-preferred-address-types=InternalIP",  # the node's, not a DNS name
            f"--cert-dir={self.folder / 'pki'}",
            "--v=1",
        ])  # fmt: skip
        self._wait("kube-apiserver", lambda: self._ok("/readyz"), log="kube-apiserver")

    def _write_kubeconfig(self) -> None:
        def b64(path: Path) -> str:
            return base64.b64encode(path.read_bytes()).decode()

        cert, key = self.pki.admin
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "admin",
            "clusters": [{"name": "unthrottle-test", "cluster": {
                "server": self.server, "certificate-authority-data": b64(self.pki.ca)}}],
            "users": [{"name": "admin", "user": {
                "client-certificate-data": b64(cert), "client-key-data": b64(key)}}],
            "contexts": [{"name": "admin", "context": {
                "cluster": "unthrottle-test", "user": "admin", "namespace": "default"}}],
        }  # fmt: skip
        self.kubeconfig.write_text(yaml.safe_dump(config, sort_keys=False))
        self.kubeconfig.chmod(0o600)
        self._made.append(self.kubeconfig)

    def _start_controllers(self) -> None:
        kubeconfig = f"--kubeconfig={self.kubeconfig}"
        delegated = [f"--authentication-kubeconfig={self.kubeconfig}",
                     f"--authorization-kubeconfig={self.kubeconfig}"]  # fmt: skip
        cm_port, sched_port, kwok_port = free_port(), free_port(), free_port()
        private = self.pki.service_accounts[1]
        qps = self.client_qps
        rate = [f"--kube-api-qps={qps}", f"--kube-api-burst={2 * qps}"] if qps else []
        self._spawn("kube-controller-manager", [
            kubeconfig, *delegated, "--leader-elect=false",
            "--bind-address=127.0.0.1", f"--secure-port={cm_port}",
            f"--cert-dir={self.folder / 'pki'}",
            "--use-service-account-credentials=true",  # each controller with its own RBAC
            f"--service-account-private-key-file={private}", f"--root-ca-file={self.pki.ca}",
            f"--cluster-signing-cert-file={self.pki.ca}",
            f"--cluster-signing-key-file={self.pki.ca_key}",
            "--v=1", *rate,
        ])  # fmt: skip
        self._spawn("kube-scheduler", [
            kubeconfig, *delegated, "--leader-elect=false",
            "--bind-address=127.0.0.1", f"--secure-port={sched_port}",
            f"--cert-dir={self.folder / 'pki'}", "--v=1", *rate,
        ])  # fmt: skip
        key, value = FAKE_NODE_ANNOTATION
        self._spawn("kwok", [
            kubeconfig, f"--config={self.binaries.stages}",
            f"--manage-nodes-with-annotation-selector={key}={value}",
            "--node-lease-duration-seconds=40",
            "--cidr=10.244.0.1/16",  # pod IPs are only written in status: no traffic
            f"--server-address=127.0.0.1:{kwok_port}",
        ])  # fmt: skip
        self._wait("kube-controller-manager",
                   lambda: self._healthy(f"https://127.0.0.1:{cm_port}/healthz"),
                   log="kube-controller-manager")  # fmt: skip
        self._wait("kube-scheduler",
                   lambda: self._healthy(f"https://127.0.0.1:{sched_port}/healthz"),
                   log="kube-scheduler")  # fmt: skip

    def _add_nodes(self) -> None:
        names = [f"kwok-node-{i}" for i in range(self.nodes)]
        for name in names:
            status, body = self.request("POST", "/api/v1/nodes", fake_node(name))
            if status not in (201, 409):
                raise StartError(f"cannot create node {name}: HTTP {status} {body}")

        def all_ready() -> bool:
            status, body = self.request("GET", "/api/v1/nodes")
            ready = {
                n["metadata"]["name"] for n in (body or {}).get("items", [])
                if any(c.get("type") == "Ready" and c.get("status") == "True"
                       for c in (n.get("status") or {}).get("conditions") or [])
            }  # fmt: skip
            return status == 200 and set(names) <= ready

        self._wait(f"{len(names)} fake nodes Ready (kwok)", all_ready, log="kwok")


def environment(plane: ControlPlane) -> dict[str, str]:
    """The environment for a child that should talk to this control plane."""
    return {**os.environ, "KUBECONFIG": str(plane.kubeconfig)}
