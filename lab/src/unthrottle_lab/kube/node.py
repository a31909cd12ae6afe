"""One real node beside the control plane: containerd (with runc and the CNI plugins) and a
kubelet, registered with the API server like a real node, running real pods in real
cgroups.

What it takes on these machines (docs/operator.md "The real node", ../shared TESTING.md):

- **cgroups**: the kubelet's cgroupfs driver (PID 1 is not systemd), with
  ``failCgroupV1: false`` where the machine has cgroup v1 (kubelet 1.35+ refuses v1
  otherwise). Its pods live below a cgroup root of their own, ``/unthrottle-<node>``,
  made in every hierarchy before the kubelet starts (it checks that the root exists) and
  removed after: ``<root>/kubepods/<qos>/pod<uid>/<container id>``, the pod cgroup with a
  quota of its own where every container has a CPU limit.
- **network**: pods get addresses from the CNI bridge and host-local plugins on a bridge of
  ours (``unthrottle0``, 10.88.0.0/16); the node's address is the bridge's own (a kubelet
  refuses a loopback address), so nothing leaves the machine. The kubelet serves on
  127.0.0.1 and that address; Prometheus scrapes ``/metrics/cadvisor`` on 127.0.0.1.
- **Services**: kube-proxy (iptables mode, as ``system:kube-proxy``) maps each Service's
  ClusterIP to its endpoints, so a pod's in-cluster config (``10.96.0.1:443``, the
  ``kubernetes`` Service) reaches the API server at the node's address, which it
  advertises, and the API server reaches a webhook's Service from the host (kube-proxy's
  ``OUTPUT`` rules). What it took on this kernel (6.18, Debian's iptables 1.8.9, nf_tables
  backend):

  - ``net.ipv4.ip_forward`` and ``net.bridge.bridge-nf-call-iptables`` (br_netfilter is
    built in here) are set to 1, as kube-proxy wants for pod-to-Service-to-pod traffic on
    one bridge; both were 1 already. Each is put back after, as read before.
  - kube-proxy by default raises conntrack's table size and sets its TCP timeouts (24 h
    established, 1 h close-wait: machine-wide settings), sets ``route_localnet`` for
    NodePorts on 127.0.0.1, and asks for ``oom_score_adj`` -999, which this machine
    refuses even to root. It is told to leave each alone (``--conntrack-*=0``,
    ``--iptables-localhost-nodeports=false``, ``--oom-score-adj=0``), and serves NodePorts
    on the node's address only (``--nodeport-addresses=primary``).
  - the pods reach ``10.96.0.1`` through ``PREROUTING`` and the host reaches a ClusterIP
    through ``OUTPUT``; traffic from outside ``10.88.0.0/16`` (the host's) is masqueraded,
    so a pod answers the bridge's address.
  - the kubelet makes ``KUBE-*`` chains of its own wherever ``iptables`` is installed
    (``KUBE-KUBELET-CANARY``, ``KUBE-IPTABLES-HINT``, and ``KUBE-FIREWALL`` on ``INPUT``
    and ``OUTPUT``, which drops packets from outside 127.0.0.0/8 to it) and never removes
    them, nor does ``kube-proxy --cleanup``; nodes before kube-proxy came left them on the
    host. The sweep removes every ``KUBE-*`` chain, for IPv4 and IPv6
    (:func:`~unthrottle_lab.kube.cleanup.sweep_iptables`).
- **containerd** keeps its state at ``/run/containerd`` (its shims' sockets and
  cAdvisor's containerd client look there), its images and snapshots in the node's
  folder; ``restrict_oom_score_adj``, since this machine refuses a negative
  ``oom_score_adj`` even to root. One real node per machine at a time (a lock says so).
- **identity**: a client certificate ``system:node:<name>`` (group ``system:nodes``)
  signed by the control plane's CA, as after a TLS bootstrap; a serving certificate from
  the same CA; webhook authentication and authorization, so ``/metrics/cadvisor`` asks
  the API server whether the caller may ``get nodes/metrics``.
- **images**: the pause and workload images built here (:mod:`.images`) and imported; the
  node pulls nothing.

:meth:`RealNode.stop` ends kube-proxy, the kubelet, every pod's processes, containerd's
shims and containerd, by PID; unmounts what they mounted; removes the cgroups, the bridge,
the network namespaces, the iptables chains and the folder; and puts back the kernel
settings the kubelet and the node change.
A guard process does the same if the process that started the node dies without stopping
it (SIGKILL): nothing is left either way.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from unthrottle_lab.children import stop
from unthrottle_lab.kube import cleanup
from unthrottle_lab.kube.build import NodeBinaries, cache_root, ensure_node_built
from unthrottle_lab.kube.cluster import (
    ADVERTISE_ADDRESS,
    ControlPlane,
    StartError,
    _die_with_parent,
    _tail,
)
from unthrottle_lab.kube.images import Image, build_pause, build_workload
from unthrottle_lab.kube.pki import NodePki, make_node_pki
from unthrottle_lab.kube.workloads import REAL_NODE_TAINT
from unthrottle_lab.prometheus import free_port

__all__ = ["RealNode"]

NODE_LOCK = Path("/run/unthrottle-node.lock")
CONTAINERD_STATE = Path("/run/containerd")
BRIDGE = "unthrottle0"
POD_SUBNET = "10.88.0.0/16"
NODE_ADDRESS = ADVERTISE_ADDRESS
"""The bridge's own address: the node's InternalIP (a kubelet refuses a loopback one), and
where its pods reach the API server (it advertises this address)."""


class RealNode:
    """A kubelet and containerd on this machine, joined to ``plane``; state in ``folder``."""

    def __init__(self, plane: ControlPlane, folder: Path, *, name: str = "unthrottle-node",
                 static_cpu_manager: bool = False, reserved_cpu: str | None = None,
                 timeout_s: float = 120.0) -> None:  # fmt: skip
        self.plane = plane
        self.folder = folder
        self.name = name
        self.static_cpu_manager = static_cpu_manager
        self.reserved_cpu = reserved_cpu
        self.timeout_s = timeout_s
        self.cgroup_parent = f"unthrottle-{name}"
        self.port = free_port()
        self.endpoint = f"https://127.0.0.1:{self.port}"
        self.images: dict[str, Image] = {}
        self._procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self._lock: int | None = None
        self._guard: subprocess.Popen[bytes] | None = None
        self._binaries: NodeBinaries | None = None

    # -- the public surface ---------------------------------------------------------------

    @property
    def binaries(self) -> NodeBinaries:
        if self._binaries is None:
            self._binaries = ensure_node_built()
        return self._binaries

    @property
    def cgroup_root(self) -> Path:
        """The CPU hierarchy's folder that holds ``kubepods``."""
        return cleanup.cpu_mount() / self.cgroup_parent

    def info(self) -> dict[str, Any]:
        """What ``DIR/kubelet.json`` says: where to scrape, where the cgroups are, the images."""
        return {
            "node": self.name, "endpoint": self.endpoint, "address": NODE_ADDRESS,
            "cgroup_root": str(self.cgroup_root), "cgroup_parent": self.cgroup_parent,
            "images": {"workload": self.images["workload"].name,
                       "pause": self.images["pause"].name},
        }  # fmt: skip

    def start(self) -> RealNode:
        """Start containerd and the kubelet; return once the Node is Ready."""
        started = time.monotonic()
        try:
            self._take_lock()
            self.folder.mkdir(parents=True, exist_ok=True)
            (self.folder / "logs").mkdir(exist_ok=True)
            self._start_guard()
            self._prepare_host()
            self._build_images()
            self._start_containerd()
            self._import_images()
            self._start_kubelet()
            self._wait("the node Ready", self._ready, log="kubelet")
            self._start_proxy()
            self._wait("kube-proxy's rules for the kubernetes Service", self._proxied,
                       log="kube-proxy")  # fmt: skip
        except BaseException:
            self.stop()
            raise
        self.started_in_s = time.monotonic() - started
        return self

    def stop(self) -> None:
        """End everything, by PID; unmount, remove what was made (see the module's docstring).
        A node that never got the machine's lock made nothing, and sweeps nothing: what is
        on the host then belongs to the node that holds it."""
        if self._lock is None:
            return
        kubelet = [p for n, p in self._procs if n == "kubelet"]
        for proc in kubelet:
            stop(proc, timeout_s=15)
        cleanup.kill_in_cgroups(self.cgroup_parent)
        for name, proc in reversed(self._procs):
            if name != "kubelet":
                stop(proc, timeout_s=15)
        self._procs.clear()
        cleanup.sweep(self._record())
        if self._guard is not None:
            with contextlib.suppress(OSError):
                assert self._guard.stdin is not None
                self._guard.stdin.close()  # the guard sweeps (nothing is left) and ends
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._guard.wait(timeout=30)
            self._guard = None
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def __enter__(self) -> RealNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def exited(self) -> list[str]:
        """The node's components that have ended (none while all is well)."""
        return [name for name, proc in self._procs if proc.poll() is not None]

    def pids(self) -> dict[str, int]:
        return {name: proc.pid for name, proc in self._procs if proc.poll() is None}

    def restart_kubelet(self, *, static_cpu_manager: bool = False,
                        reserved_cpu: str | None = None) -> None:  # fmt: skip
        """Restart the kubelet alone with another CPU manager policy or reservation; the
        pods and containerd run on, as when an admin reconfigures a node. The CPU manager's
        state file goes (a kubelet refuses to start on one of another policy)."""
        for name, proc in [(n, p) for n, p in self._procs if n == "kubelet"]:
            stop(proc, timeout_s=15)
            self._procs.remove((name, proc))
        (self.folder / "kubelet" / "cpu_manager_state").unlink(missing_ok=True)
        self.static_cpu_manager, self.reserved_cpu = static_cpu_manager, reserved_cpu
        self._start_kubelet()
        self._wait("the node Ready again", self._ready_again, log="kubelet")

    def _ready_again(self) -> bool:
        """The restarted kubelet wrote its CPU manager's state (the policy asked for) and
        the Node is Ready."""
        want = "static" if self.static_cpu_manager else "none"
        try:
            state = json.loads((self.folder / "kubelet" / "cpu_manager_state").read_text())
        except (OSError, ValueError):
            return False
        return bool(state.get("policyName") == want) and self._ready()

    def ctr(self, *args: str) -> str:
        """Run ``ctr`` against this node's containerd, in the kubelet's namespace."""
        done = subprocess.run([str(self.binaries.path("ctr")), "--address",
                               str(CONTAINERD_STATE / "containerd.sock"), "-n", "k8s.io", *args],
                              capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
        if done.returncode != 0:
            raise StartError(f"ctr {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def scrape(self, path: str) -> str:
        """GET a kubelet endpoint (``/metrics/cadvisor``) as the control plane's admin."""
        context = ssl.create_default_context(cafile=str(self.plane.pki.ca))
        context.load_cert_chain(*map(str, self.plane.pki.admin))
        with urllib.request.urlopen(self.endpoint + path, context=context, timeout=10) as reply:
            return str(reply.read().decode())

    # -- the steps ------------------------------------------------------------------------

    def _record(self) -> dict[str, Any]:
        return {"folder": str(self.folder), "cgroup_parent": self.cgroup_parent,
                "bridge": BRIDGE, "containerd_state": str(CONTAINERD_STATE),
                "shim": str(self.binaries.path("containerd-shim-runc-v2")),
                "kube_proxy": str(self.plane.bin("kube-proxy")),
                "sysctls": getattr(self, "_sysctls", {})}  # fmt: skip

    def _take_lock(self) -> None:
        self._lock = os.open(NODE_LOCK, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock)
            self._lock = None
            raise StartError(
                f"another real node runs on this machine ({NODE_LOCK} is held): one at a "
                "time, since containerd's state is /run/containerd"
            ) from None

    def _start_guard(self) -> None:
        """A process that sweeps the node away when ours dies without doing it (SIGKILL):
        it waits on a pipe from us, then cleans up by the record and ends."""
        self._sysctls = cleanup.read_sysctls()
        record = self.folder / "node-record.json"
        record.write_text(json.dumps(self._record()))
        self._guard = subprocess.Popen(
            [sys.executable, "-m", "unthrottle_lab.kube.cleanup", str(record)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
            stderr=(self.folder / "logs" / "guard.log").open("wb"), start_new_session=True,
        )  # fmt: skip

    def _prepare_host(self) -> None:
        cleanup.sweep(self._record() | {"folder": None})  # what a killed guard left, if any
        cleanup.make_cgroup_root(self.cgroup_parent)
        subprocess.run(["ip", "link", "add", BRIDGE, "type", "bridge"], check=True)
        subprocess.run(["ip", "addr", "add", f"{NODE_ADDRESS}/16", "dev", BRIDGE], check=True)
        subprocess.run(["ip", "link", "set", BRIDGE, "up"], check=True)
        for name in ("net/ipv4/ip_forward", "net/bridge/bridge-nf-call-iptables"):
            if (Path("/proc/sys") / name).exists():  # as read before, in the guard's record
                (Path("/proc/sys") / name).write_text("1\n")
        cni = self.folder / "cni"
        cni.mkdir(exist_ok=True)
        (cni / "10-unthrottle.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "unthrottle",
            "plugins": [{
                "type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False,
                "hairpinMode": True,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET,
                                                             "gateway": NODE_ADDRESS}]],
                         "routes": [{"dst": "0.0.0.0/0"}],
                         "dataDir": str(self.folder / "cni-ipam")},
            }],
        }, indent=1))  # fmt: skip

    def _build_images(self) -> None:
        self.images["pause"] = build_pause(self.binaries.path("pause"),
                                           self.folder / "images" / "pause.tar")  # fmt: skip
        self.images["workload"] = build_workload(cache_root() / "images")

    def _containerd_config(self) -> str:
        runtime = 'plugins."io.containerd.cri.v1.runtime"'
        return f"""version = 3
root = "{self.folder / "containerd"}"
state = "{CONTAINERD_STATE}"
[grpc]
  address = "{CONTAINERD_STATE / "containerd.sock"}"
[{runtime}]
  restrict_oom_score_adj = true
  enable_selinux = false
  [{runtime}.containerd]
    default_runtime_name = "runc"
    [{runtime}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{runtime}.containerd.runtimes.runc.options]
        BinaryName = "{self.binaries.path("runc")}"
        SystemdCgroup = false
  [{runtime}.cni]
    bin_dirs = ["{self.binaries.cni}"]
    conf_dir = "{self.folder / "cni"}"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{self.images["pause"].name}"
[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
"""

    def _start_containerd(self) -> None:
        config = self.folder / "containerd.toml"
        config.write_text(self._containerd_config())
        self._spawn("containerd", [str(self.binaries.path("containerd")), "--config", str(config),
                                   "--log-level", "warn"])  # fmt: skip
        self._wait("containerd", lambda: (CONTAINERD_STATE / "containerd.sock").exists()
                   and bool(self.ctr("version")), log="containerd")  # fmt: skip

    def _import_images(self) -> None:
        for image in self.images.values():
            self.ctr("images", "import", "--no-unpack=false", str(image.archive))
            self.ctr("images", "label", image.name, "io.cri-containerd.pinned=pinned")

    def _kubelet_config(self) -> dict[str, Any]:
        pki = make_node_pki(self.plane.pki, self.folder / "pki", node=self.name,
                            address=NODE_ADDRESS)  # fmt: skip
        config: dict[str, Any] = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "failCgroupV1": False,  # these machines are cgroup v1 (docs/operator.md)
            "cgroupDriver": "cgroupfs", "cgroupRoot": f"/{self.cgroup_parent}",
            "containerRuntimeEndpoint": f"unix://{CONTAINERD_STATE / 'containerd.sock'}",
            "address": "0.0.0.0", "port": self.port, "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": 0,
            "tlsCertFile": str(pki.serving[0]), "tlsPrivateKeyFile": str(pki.serving[1]),
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(self.plane.pki.ca)}},
            "authorization": {"mode": "Webhook"},
            "podLogsDir": str(self.folder / "pod-logs"),
            "failSwapOn": False, "resolvConf": "/etc/resolv.conf",
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "syncFrequency": "5s", "fileCheckFrequency": "5s",
            "nodeStatusUpdateFrequency": "5s", "serializeImagePulls": False,
            "registerWithTaints": [REAL_NODE_TAINT],  # only pods meant for it land here
        }  # fmt: skip
        if self.static_cpu_manager:
            config["cpuManagerPolicy"] = "static"
            config["kubeReserved"] = {"cpu": "500m"}  # static needs some CPU reserved
        if self.reserved_cpu:
            config["systemReserved"] = {"cpu": self.reserved_cpu}
        return config | {"_pki": pki}

    def _start_kubelet(self) -> None:
        config = self._kubelet_config()
        pki = config.pop("_pki")
        path = self.folder / "kubelet.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        kubeconfig = self.folder / "kubelet.kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "node",
            "clusters": [{"name": "local", "cluster": {
                "server": self.plane.server, "certificate-authority": str(self.plane.pki.ca)}}],
            "users": [{"name": "node", "user": {"client-certificate": str(pki.client[0]),
                                                "client-key": str(pki.client[1])}}],
            "contexts": [{"name": "node", "context": {"cluster": "local", "user": "node"}}],
        }))  # fmt: skip
        self._spawn("kubelet", [
            str(self.plane.bin("kubelet")), f"--config={path}", f"--kubeconfig={kubeconfig}",
            f"--root-dir={self.folder / 'kubelet'}", f"--hostname-override={self.name}",
            f"--node-ip={NODE_ADDRESS}", "--oom-score-adj=0", "--v=2",
        ])  # fmt: skip

    def _start_proxy(self) -> None:
        """kube-proxy in iptables mode, as ``system:kube-proxy``, on the API server's
        127.0.0.1; its health and metrics on free ports of 127.0.0.1."""
        cert, key = NodePki(self.folder / "pki").proxy  # made with the kubelet's
        kubeconfig = self.folder / "kube-proxy.kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "proxy",
            "clusters": [{"name": "local", "cluster": {
                "server": self.plane.server, "certificate-authority": str(self.plane.pki.ca)}}],
            "users": [{"name": "proxy", "user": {"client-certificate": str(cert),
                                                 "client-key": str(key)}}],
            "contexts": [{"name": "proxy", "context": {"cluster": "local", "user": "proxy"}}],
        }))  # fmt: skip
        self._spawn("kube-proxy", [
            str(self.plane.bin("kube-proxy")), f"--kubeconfig={kubeconfig}",
            "--proxy-mode=iptables", f"--hostname-override={self.name}",
            f"--cluster-cidr={POD_SUBNET}", "--nodeport-addresses=primary",
            f"--healthz-bind-address=127.0.0.1:{free_port()}",
            f"--metrics-bind-address=127.0.0.1:{free_port()}",
            # Leave the machine's settings alone (the module's docstring).
            "--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0s",
            "--conntrack-tcp-timeout-close-wait=0s", "--iptables-localhost-nodeports=false",
            "--oom-score-adj=0", "--v=2",
        ])  # fmt: skip

    def _proxied(self) -> bool:
        """kube-proxy has written the ``kubernetes`` Service's way to the API server."""
        saved = subprocess.run(["iptables-save", "-t", "nat"], capture_output=True, text=True,
                               check=False).stdout  # fmt: skip
        port = self.plane.server.rsplit(":", 1)[1]
        return f"--to-destination {NODE_ADDRESS}:{port}" in saved

    def _ready(self) -> bool:
        status, body = self.plane.request("GET", f"/api/v1/nodes/{self.name}")
        conditions = (
            ((body or {}).get("status") or {}).get("conditions") or [] if status == 200 else []
        )
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    def _spawn(self, name: str, args: list[str]) -> None:
        log = (self.folder / "logs" / f"{name}.log").open("wb")
        env = {**os.environ, "PATH": f"{self.binaries.bin}:{os.environ.get('PATH', '')}"}
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL, cwd=self.folder,
                                preexec_fn=_die_with_parent)  # noqa: PLW1509  # fmt: skip
        log.close()
        self._procs.append((name, proc))

    def _wait(self, what: str, ready: Callable[[], bool], *, log: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            for name, proc in self._procs:
                if proc.poll() is not None:
                    log = _tail(self.folder / "logs" / f"{name}.log")
                    raise StartError(f"{name} exited ({proc.returncode}) while waiting for "
                                     f"{what}:\n{log}")  # fmt: skip
            with contextlib.suppress(OSError, ValueError, StartError):
                if ready():
                    return
            time.sleep(0.5)
        raise StartError(f"{what} not ready after {self.timeout_s:.0f} s:\n"
                         f"{_tail(self.folder / 'logs' / f'{log}.log')}")  # fmt: skip
