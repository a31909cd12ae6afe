"""Thanos (sidecar and querier in one binary), built from its Go module.

Thanos Query is how many users shard or replicate Prometheus: ``unthrottle`` reads it as it
reads one Prometheus (docs/thanos.md), and tests/cluster/test_thanos.py checks that it does,
against ``github.com/thanos-io/thanos/cmd/thanos`` at :data:`VERSION`.

One build tag is needed, ``slicelabels`` (:data:`TAGS`; Thanos's own release adds ``netgo``,
which only swaps the DNS resolver). Prometheus's ``labels.Labels`` is a packed string in
its default build and a slice of name/value pairs with the tag, and Thanos's gRPC code
casts it to its own slice type (``pkg/extgrpc/codec_slicelabels.go``): built without the
tag, the sidecar compiles and starts, then panics on the querier's first Info call
("makeslice: len out of range" in ``nonPoolingCodec.Marshal``, a size read from a string
header as a slice's).

Thanos's go.mod has ``replace`` directives, so ``go install …@version`` refuses it (a
module with replacements cannot be installed from outside); the build runs inside the
module's own folder in Go's module cache instead, against its own go.mod and go.sum: the
versions Thanos's release was tested with. The newest release served here, v0.42.5, needs
Go 1.26.10; v0.42.4 needs 1.26.0.

Built once into ``~/.cache/unthrottle/thanos`` (``make controlplane``), keyed on the version
the tags and Go's version: 5 min 48 s from cold on 2 cores (empty module and build caches:
1.4 GB of modules downloaded, 1.1 GB of build cache; 156 % CPU, beside other work); a
98 MB binary (stripped). The same build without the tag took 6 min 11 s.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from unthrottle_lab.kube.build import BuildError, _locked, cache_root, go_binary

__all__ = ["MODULE", "PACKAGE", "TAGS", "VERSION", "ensure_thanos_built"]

MODULE = "github.com/thanos-io/thanos"
PACKAGE = "./cmd/thanos"
VERSION = "v0.42.4"
TAGS = "slicelabels"


def _key(go: str) -> str:
    version = subprocess.run([go, "version"], capture_output=True, text=True, check=True)
    return hashlib.sha256(
        f"{MODULE}@{VERSION} {PACKAGE} {TAGS} {version.stdout}".encode()
    ).hexdigest()[:16]


def _module_folder(go: str, env: dict[str, str], cwd: Path) -> Path:
    """Thanos's source in Go's module cache (downloaded first when not there)."""
    done = subprocess.run([go, "mod", "download", "-json", f"{MODULE}@{VERSION}"], env=env,
                          cwd=cwd, capture_output=True, text=True, check=False)  # fmt: skip
    try:
        info = json.loads(done.stdout)
    except json.JSONDecodeError:
        info = {}
    if done.returncode != 0 or "Dir" not in info:
        raise BuildError(f"go mod download {MODULE}@{VERSION} failed: "
                         f"{info.get('Error') or done.stderr.strip()[-2000:]}")  # fmt: skip
    return Path(info["Dir"])


def ensure_thanos_built() -> Path:
    """The ``thanos`` binary, built first when the cache has none."""
    go = go_binary()
    final = cache_root() / "thanos" / _key(go)
    binary = final / "thanos"
    if binary.is_file():
        return binary
    with _locked(final.parent / ".lock"):
        if binary.is_file():
            return binary
        print(f"thanos: building {MODULE}/cmd/thanos@{VERSION} (tags {TAGS}) into {final} "
              "(from cold about 6 minutes on 2 cores; reused afterwards)", file=sys.stderr,
              flush=True)  # fmt: skip
        work = Path(tempfile.mkdtemp(prefix=".building-", dir=final.parent))
        started = time.monotonic()
        try:
            env = {**os.environ, "GOFLAGS": "-mod=readonly -buildvcs=false"}
            src = _module_folder(go, env, work)
            ldflags = f"-s -w -X github.com/prometheus/common/version.Version={VERSION[1:]}"
            done = subprocess.run([go, "build", "-trimpath", "-tags", TAGS,
                                   f"-ldflags={ldflags}", "-o", str(work / "thanos"), PACKAGE],
                                  env=env, cwd=src, capture_output=True, text=True,
                                  check=False)  # fmt: skip
            if done.returncode != 0:
                raise BuildError(f"go build {MODULE}/cmd/thanos@{VERSION} failed:\n"
                                 f"{done.stderr.strip()[-4000:]}")  # fmt: skip
            work.rename(final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print(f"thanos: built in {time.monotonic() - started:.0f} s", file=sys.stderr,
              flush=True)  # fmt: skip
    return binary
