"""Building the control plane's binaries from the Go module in ``controlplane/``.

kube-apiserver, kube-controller-manager, kube-scheduler and kubectl come from
``k8s.io/kubernetes``, etcd from ``go.etcd.io/etcd/server/v3`` and kwok from
``sigs.k8s.io/kwok``, at the versions ``controlplane/go.mod`` pins. They are built once
into a cache outside the work tree (``$UNTHROTTLE_CACHE``, else ``$XDG_CACHE_HOME`` or
``~/.cache``, then ``unthrottle/controlplane/<key>``), where ``key`` is a hash of every
input: go.mod, go.sum, our sources, kwok's stages and the Go version. A build goes to a
temporary folder renamed into place when whole, under a lock, so two runs never build
twice and a killed build leaves nothing half-made.
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

__all__ = ["BINARIES", "Binaries", "BuildError", "ensure_built", "go_binary", "kubernetes_version",
           "source"]  # fmt: skip

# binary name → Go package (a main package of a module go.mod requires, or ours)
BINARIES: dict[str, str] = {
    "etcd": "./cmd/etcd",
    "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
    "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
    "kubectl": "k8s.io/kubernetes/cmd/kubectl",
    "kwok": "sigs.k8s.io/kwok/cmd/kwok",
}

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


def _cache_root() -> Path:
    given = os.environ.get("UNTHROTTLE_CACHE")
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "unthrottle"


def _inputs(src: Path) -> list[Path]:
    ours = sorted(p for p in src.rglob("*") if p.is_file() and p.suffix in {".go", ".yaml"})
    return [src / "go.mod", src / "go.sum", *ours]


def _key(src: Path, go: str) -> str:
    digest = hashlib.sha256()
    for path in _inputs(src):
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
    final = _cache_root() / "controlplane" / _key(src, go)
    if (final / "version").is_file():
        return Binaries(final)
    with _locked(final.parent / ".lock"):
        if (final / "version").is_file():  # another run built them meanwhile
            return Binaries(final)
        _say(f"building Kubernetes {kubernetes_version(src)}, etcd and kwok into {final} "
             "(from cold about 4 minutes on 2 cores; reused afterwards)")  # fmt: skip
        work = Path(tempfile.mkdtemp(prefix=".building-", dir=final.parent))
        try:
            (work / "bin").mkdir()
            _build(src, go, work)
            work.rename(final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return Binaries(final)
