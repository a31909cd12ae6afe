"""Building the control plane's and the node's binaries from the Go modules in
``controlplane/``.

kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, the kubelet and kube-proxy
come from ``k8s.io/kubernetes``, etcd from ``go.etcd.io/etcd/server/v3`` and kwok from
``sigs.k8s.io/kwok``, at the versions ``controlplane/go.mod`` pins. The rest of a real
node — containerd with its runc shim and ``ctr``, runc, the CNI plugins (bridge,
host-local, loopback) and our pause program — come from a module of their own,
``controlplane/node/go.mod``: containerd's and Kubernetes' requirements are not one
graph, and apart neither moves the other's versions.

Each is built once into a cache outside the work tree (``$UNTHROTTLE_CACHE``, else
``$XDG_CACHE_HOME`` or ``~/.cache``, then ``unthrottle/controlplane/<key>`` and
``unthrottle/node/<key>``), where ``key`` is a hash of every input: go.mod, go.sum, our
sources, kwok's stages, what is built and the Go version. A build goes to a temporary
folder renamed into place when whole, under one lock, so two runs never build twice and
a killed build leaves nothing half-made.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BINARIES",
    "NODE_BINARIES",
    "Binaries",
    "BuildError",
    "NodeBinaries",
    "cache_root",
    "ensure_built",
    "ensure_node_built",
    "go_binary",
    "kubernetes_version",
    "source",
]  # fmt: skip

# binary name → Go package (a main package of a module go.mod requires, or ours)
BINARIES: dict[str, str] = {
    "etcd": "./cmd/etcd",
    "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
    "kube-proxy": "k8s.io/kubernetes/cmd/kube-proxy",
    "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
    "kubectl": "k8s.io/kubernetes/cmd/kubectl",
    "kubelet": "k8s.io/kubernetes/cmd/kubelet",
    "kwok": "sigs.k8s.io/kwok/cmd/kwok",
}

NODE_MODULE = "node"
"""The node's module, a folder of ``controlplane/`` that the control plane's key leaves out."""


@dataclass(frozen=True)
class NodeBinary:
    """One binary of the node's module and how it is built."""

    package: str
    cgo: bool = False
    """runc is cgo (libseccomp, libc's clone); everything else is static Go."""
    tags: str = ""


# binary name → how to build it, from controlplane/node/go.mod
NODE_BINARIES: dict[str, NodeBinary] = {
    "containerd": NodeBinary("github.com/containerd/containerd/v2/cmd/containerd",
                             tags="no_btrfs"),  # no btrfs headers here; we use overlayfs
    "containerd-shim-runc-v2": NodeBinary(
        "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"),
    "ctr": NodeBinary("github.com/containerd/containerd/v2/cmd/ctr", tags="no_btrfs"),
    # The seccomp tag: a runc without it refuses every sandbox the kubelet asks for
    # ("seccomp: config provided but seccomp not supported"). Needs libseccomp-dev.
    "runc": NodeBinary("github.com/opencontainers/runc", cgo=True, tags="seccomp"),
    "bridge": NodeBinary("github.com/containernetworking/plugins/plugins/main/bridge"),
    "host-local": NodeBinary("github.com/containernetworking/plugins/plugins/ipam/host-local"),
    "loopback": NodeBinary("github.com/containernetworking/plugins/plugins/main/loopback"),
    "pause": NodeBinary("unthrottle.io/node/cmd/pause"),
}  # fmt: skip

# kwok's own stages, read from its module at the pinned version; pod-ready is ours
# (controlplane/stages/pod-ready.yaml: it also reports container IDs).
KWOK_STAGES = (
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "kustomize/stage/pod/fast/pod-complete.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
)


class BuildError(RuntimeError):
    """The binaries could not be built (no Go, or the build failed: the message says)."""


@dataclass(frozen=True)
class Binaries:
    """The built binaries' folder and kwok's stage configuration beside it."""

    folder: Path

    def path(self, name: str) -> Path:
        return self.folder / "bin" / name

    @property
    def stages(self) -> Path:
        return self.folder / "kwok-stages.yaml"


def source() -> Path:
    """The Go module's folder: ``controlplane/`` of this repository (or
    ``$UNTHROTTLE_CONTROLPLANE_SRC``)."""
    given = os.environ.get("UNTHROTTLE_CONTROLPLANE_SRC")
    folder = Path(given) if given else Path(__file__).resolve().parents[4] / "controlplane"
    if not (folder / "go.mod").is_file():
        raise BuildError(f"no control-plane Go module at {folder} (go.mod missing)")
    return folder


def kubernetes_version(src: Path | None = None) -> str:
    """The ``k8s.io/kubernetes`` release go.mod pins, e.g. ``v1.36.3``."""
    text = ((src or source()) / "go.mod").read_text()
    found = re.search(r"^\s*k8s\.io/kubernetes (v\d+\.\d+\.\d+)", text, re.M)
    if found is None:
        raise BuildError("controlplane/go.mod does not require k8s.io/kubernetes")
    return found.group(1)


def go_binary() -> str:
    """The ``go`` command: on the PATH, else Go's default install folder."""
    go = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists()
                                else None)  # fmt: skip
    if go is None:
        raise BuildError("the control plane is built with Go (>= 1.26): install Go, then retry")
    return go


def cache_root() -> Path:
    """Where built things are kept: ``$UNTHROTTLE_CACHE``, else ``~/.cache/unthrottle``."""
    given = os.environ.get("UNTHROTTLE_CACHE")
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "unthrottle"


def _inputs(src: Path, *, skip: str | None = None) -> list[Path]:
    ours = sorted(
        p for p in src.rglob("*")
        if p.is_file() and p.suffix in {".go", ".yaml"}
        and not (skip and p.relative_to(src).parts[0] == skip)
    )  # fmt: skip
    return [src / "go.mod", src / "go.sum", *ours]


def _key(src: Path, go: str, what: str, *, skip: str | None = None) -> str:
    digest = hashlib.sha256(what.encode())
    for path in _inputs(src, skip=skip):
        digest.update(path.relative_to(src).as_posix().encode() + b"\0" + path.read_bytes())
    version = subprocess.run([go, "version"], capture_output=True, text=True, check=True)
    digest.update(version.stdout.encode())
    return digest.hexdigest()[:16]


def _ldflags(version: str) -> str:
    """Stamp the release into the binaries, as Kubernetes' own build does: without it the
    server reports v0.0.0-master, which Helm's kubeVersion checks and kubectl refuse."""
    major, minor = version.lstrip("v").split(".")[:2]
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [f"-X {pkg}.gitVersion={version}", f"-X {pkg}.gitMajor={major}",
                  f"-X {pkg}.gitMinor={minor}", f"-X {pkg}.gitTreeState=clean",
                  f"-X {pkg}.buildDate=1970-01-01T00:00:00Z"]  # fmt: skip
    return " ".join(flags)


def _say(text: str) -> None:
    print(f"controlplane: {text}", file=sys.stderr, flush=True)


def _stages(src: Path, go: str, out: Path) -> None:
    kwok = subprocess.run([go, "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/kwok"], cwd=src,
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    docs = [(Path(kwok) / rel).read_text() for rel in KWOK_STAGES]
    docs.append((src / "stages" / "pod-ready.yaml").read_text())
    out.write_text("\n---\n".join(d.strip() for d in docs) + "\n")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build(src: Path, go: str, out: Path) -> None:
    version = kubernetes_version(src)
    env = {**os.environ, "GOFLAGS": "-mod=readonly -buildvcs=false"}
    started = time.monotonic()
    for name, package in BINARIES.items():
        _say(f"building {name} ({package}) …")
        begun = time.monotonic()
        done = subprocess.run(
            [go, "build", "-trimpath", f"-ldflags={_ldflags(version)}",
             "-o", str(out / "bin" / name), package],
            check=False, cwd=src, env=env, capture_output=True, text=True,
        )  # fmt: skip
        if done.returncode != 0:
            raise BuildError(f"go build {package} failed:\n{done.stderr.strip()[-4000:]}")
        _say(f"built {name} in {time.monotonic() - begun:.0f} s")
    _stages(src, go, out / "kwok-stages.yaml")
    (out / "version").write_text(f"{version}\n")
    _say(f"all built in {time.monotonic() - started:.0f} s")


def ensure_built() -> Binaries:
    """The binaries for this checkout, built first when the cache has none."""
    src = source()
    go = go_binary()
    final = cache_root() / "controlplane" / _key(src, go, repr(BINARIES), skip=NODE_MODULE)
    if (final / "version").is_file():
        return Binaries(final)
    with _locked(final.parent / ".lock"):
        if (final / "version").is_file():  # another run built them meanwhile
            return Binaries(final)
        _say(f"building Kubernetes {kubernetes_version(src)} (the kubelet too), etcd and kwok "
             f"into {final} (from cold about 11 minutes on 2 cores with the node's; reused "
             "afterwards)")  # fmt: skip
        work = Path(tempfile.mkdtemp(prefix=".building-", dir=final.parent))
        try:
            (work / "bin").mkdir()
            _build(src, go, work)
            work.rename(final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return Binaries(final)


@dataclass(frozen=True)
class NodeBinaries:
    """The node's built binaries: ``bin/`` holds containerd, its shim, ctr, runc and pause;
    ``cni/`` the CNI plugins (containerd's ``bin_dirs``)."""

    folder: Path

    def path(self, name: str) -> Path:
        return self.folder / ("cni" if name in _CNI_PLUGINS else "bin") / name

    @property
    def bin(self) -> Path:
        return self.folder / "bin"

    @property
    def cni(self) -> Path:
        return self.folder / "cni"


_CNI_PLUGINS = {"bridge", "host-local", "loopback"}


def _need_libseccomp() -> None:
    """runc's seccomp tag links libseccomp: say how to get it rather than show cgo's error."""
    found = subprocess.run(["pkg-config", "--exists", "libseccomp"], check=False,
                           capture_output=True) if shutil.which("pkg-config") else None  # fmt: skip
    if found is None or found.returncode != 0:
        raise BuildError("runc is built with libseccomp: install Debian's libseccomp-dev and "
                         "pkg-config (make controlplane does, as root), then retry")  # fmt: skip


def _build_node(src: Path, go: str, out: Path) -> None:
    env = {**os.environ, "GOFLAGS": "-mod=readonly -buildvcs=false"}
    started = time.monotonic()
    for name, how in NODE_BINARIES.items():
        _say(f"building {name} ({how.package}) …")
        begun = time.monotonic()
        target = out / ("cni" if name in _CNI_PLUGINS else "bin") / name
        done = subprocess.run(
            [go, "build", "-trimpath", "-ldflags=-s -w", f"-tags={how.tags}",
             "-o", str(target), how.package],
            check=False, cwd=src, capture_output=True, text=True,
            env={**env, "CGO_ENABLED": "1" if how.cgo else "0"},
        )  # fmt: skip
        if done.returncode != 0:
            raise BuildError(f"go build {how.package} failed:\n{done.stderr.strip()[-4000:]}")
        _say(f"built {name} in {time.monotonic() - begun:.0f} s")
    (out / "version").write_text("node\n")
    _say(f"the node's binaries built in {time.monotonic() - started:.0f} s")


def ensure_node_built() -> NodeBinaries:
    """The node's binaries (containerd, runc, the CNI plugins, pause) for this checkout,
    built first when the cache has none. The kubelet is the control plane's
    (:func:`ensure_built`): it comes from the same ``k8s.io/kubernetes``."""
    src = source() / NODE_MODULE
    go = go_binary()
    final = cache_root() / "node" / _key(src, go, repr(NODE_BINARIES))
    if (final / "version").is_file():
        return NodeBinaries(final)
    _need_libseccomp()
    with _locked(cache_root() / "controlplane" / ".lock"):
        if (final / "version").is_file():
            return NodeBinaries(final)
        _say(f"building containerd, runc, the CNI plugins and pause into {final} "
             "(once; reused afterwards)")  # fmt: skip
        final.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=".building-", dir=final.parent))
        try:
            (work / "bin").mkdir()
            (work / "cni").mkdir()
            _build_node(src, go, work)
            work.rename(final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return NodeBinaries(final)
