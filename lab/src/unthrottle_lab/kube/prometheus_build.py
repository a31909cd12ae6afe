"""A Prometheus with Kubernetes service discovery, built from its Go module.

Debian's ``prometheus`` (2.42, which every other test and the lab use) is built without
``kubernetes_sd_configs``: its configuration parser does not know the field ("field
kubernetes_sd_configs not found in type config.ScrapeConfig"). A user's Prometheus finds
the chart's pods and the kubelets through it, so the test of the chart's pods and the demo
run this one: ``github.com/prometheus/prometheus/cmd/prometheus`` at :data:`VERSION` (the
module's tag for Prometheus 3.x), with only the Kubernetes discovery compiled in
(``remove_all_sd,enable_kubernetes_sd``: the cloud providers' SDKs stay out of the build).

Built once into ``~/.cache/unthrottle/prometheus`` (``make controlplane``), keyed on the
version, the tags and Go's version: 3 min 40 s from cold on 2 cores, downloads included;
110 MB.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from unthrottle_lab.kube.build import BuildError, _locked, cache_root, go_binary

__all__ = ["PACKAGE", "TAGS", "VERSION", "ensure_prometheus_built"]

PACKAGE = "github.com/prometheus/prometheus/cmd/prometheus"
VERSION = "v0.316.0"
TAGS = "remove_all_sd,enable_kubernetes_sd"


def _key(go: str) -> str:
    version = subprocess.run([go, "version"], capture_output=True, text=True, check=True)
    return hashlib.sha256(f"{PACKAGE}@{VERSION} {TAGS} {version.stdout}".encode()).hexdigest()[:16]


def ensure_prometheus_built() -> Path:
    """The ``prometheus`` binary, built first when the cache has none."""
    go = go_binary()
    final = cache_root() / "prometheus" / _key(go)
    binary = final / "prometheus"
    if binary.is_file():
        return binary
    with _locked(final.parent / ".lock"):
        if binary.is_file():
            return binary
        print(f"prometheus: building {PACKAGE}@{VERSION} (tags {TAGS}) into {final} (from "
              "cold about 4 minutes on 2 cores; reused afterwards)", file=sys.stderr,
              flush=True)  # fmt: skip
        work = Path(tempfile.mkdtemp(prefix=".building-", dir=final.parent))
        started = time.monotonic()
        try:
            env = {**os.environ, "GOBIN": str(work), "GOFLAGS": "-buildvcs=false"}
            done = subprocess.run([go, "install", "-trimpath", "-tags", TAGS,
                                   f"{PACKAGE}@{VERSION}"], env=env, cwd=work,
                                  capture_output=True, text=True, check=False)  # fmt: skip
            if done.returncode != 0:
                raise BuildError(f"go install {PACKAGE}@{VERSION} failed:\n"
                                 f"{done.stderr.strip()[-4000:]}")  # fmt: skip
            work.rename(final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print(f"prometheus: built in {time.monotonic() - started:.0f} s", file=sys.stderr,
              flush=True)  # fmt: skip
    return binary
