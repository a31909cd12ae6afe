"""What the real control plane and the real node cost the test suite and the demo
(docs/benchmarks.md §12).

    .venv/bin/python bench/controlplane.py            # warm build, link-only build, start-ups
    .venv/bin/python bench/controlplane.py --cold     # also a fresh machine's download and build

The real node (containerd, runc, the CNI plugins, pause: ``controlplane/node/``; the
kubelet is built with the control plane) is measured the same way beside it, and its
start-up (``RealNode.start()`` until the Node is Ready, its images imported) as root.

- **download**: ``go mod download`` of the pinned module graph into an empty module cache
  (``GOMODCACHE``), from the Go module proxy: what a fresh machine fetches once;
- **cold**: ``ensure_built()`` with that module cache, an empty Go build cache and no cached
  binaries: what a fresh machine compiles once (a fresh machine pays download + cold);
- **link only**: no cached binaries, the Go build cache warm (go.mod or Go changed only in
  what the compiler does not see, e.g. the version stamp);
- **warm**: binaries present: what every `make test` after the first pays;
- **start-up**: ``ControlPlane.start()`` until every component is ready, ``--starts`` times.

Results go to bench/results/controlplane.json. Other load on the machine lengthens each
figure; the script prints the load average with them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from unthrottle_lab.kube import ControlPlane, RealNode, ensure_built, ensure_node_built
from unthrottle_lab.kube.build import NODE_MODULE, go_binary, source

RESULTS = Path(__file__).resolve().parent / "results" / "controlplane.json"


def _timed_build(env: dict[str, str]) -> float:
    """Both builds (the control plane's, then the node's) with ``env`` set; seconds."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        started = time.monotonic()
        ensure_built()
        ensure_node_built()
        return time.monotonic() - started
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _go(modcache: Path, *args: str, check: bool = True, where: Path | None = None) -> None:
    """``go ARGS`` in controlplane/ (or ``where``), with ``modcache`` as the module cache."""
    env = {**os.environ, "GOMODCACHE": str(modcache), "GOFLAGS": "-mod=readonly"}
    subprocess.run([go_binary(), *args], cwd=where or source(), env=env, check=check)


def _timed_download(modcache: Path) -> float:
    """``go mod download`` of controlplane/'s graph into an empty module cache."""
    started = time.monotonic()
    _go(modcache, "mod", "download")
    _go(modcache, "mod", "download", where=source() / NODE_MODULE)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cold", action="store_true", help="also build from an empty Go cache")
    parser.add_argument("--starts", type=int, default=5)
    args = parser.parse_args()
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory() as scratch:
        fresh = Path(scratch)
        if args.cold:
            modcache = fresh / "gomod"
            try:
                out["download_s"] = round(_timed_download(modcache), 1)
                print(f"module download: {out['download_s']} s", flush=True)
                cold = {"UNTHROTTLE_CACHE": str(fresh / "cold"), "GOMODCACHE": str(modcache),
                        "GOCACHE": str(fresh / "gocache")}  # fmt: skip
                out["cold_s"] = round(_timed_build(cold), 1)
                print(f"cold build: {out['cold_s']} s", flush=True)
            finally:
                _go(modcache, "clean", "-modcache", check=False)  # its files are read-only
                shutil.rmtree(fresh / "gocache", ignore_errors=True)
        out["link_only_s"] = round(_timed_build({"UNTHROTTLE_CACHE": str(fresh / "link")}), 1)
        print(f"link-only build: {out['link_only_s']} s", flush=True)
    out["warm_s"] = round(_timed_build({}), 3)
    print(f"warm (cached binaries): {out['warm_s']} s", flush=True)
    binaries = ensure_built()
    starts = []
    for _ in range(args.starts):
        with tempfile.TemporaryDirectory() as folder:
            plane = ControlPlane(Path(folder), binaries=binaries)
            try:
                plane.start()
                starts.append(round(plane.started_in_s, 2))
            finally:
                plane.stop()
    out["start_s"] = starts
    out["start_median_s"] = statistics.median(starts)
    if os.geteuid() == 0:
        out["node_start_s"] = _node_starts(args.starts)
        out["node_start_median_s"] = statistics.median(out["node_start_s"])
        print(f"real node start-up: {out['node_start_s']} s", flush=True)
    out["version"] = ControlPlane(Path(tempfile.gettempdir())).version
    out["load_average"] = [round(x, 2) for x in os.getloadavg()]
    print(f"start-up: {starts} s (median {out['start_median_s']} s), "
          f"load average {out['load_average']}")  # fmt: skip
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=1) + "\n")


def _node_starts(count: int) -> list[float]:
    """A real node's start-ups (the Node Ready, images imported) beside one control plane."""
    starts = []
    with (
        tempfile.TemporaryDirectory() as folder,
        ControlPlane(Path(folder) / "cp", nodes=0) as plane,
    ):
        for index in range(count):
            node = RealNode(plane, Path(folder) / f"node-{index}")
            try:
                node.start()
                starts.append(round(node.started_in_s, 2))
            finally:
                node.stop()
            plane.request("DELETE", f"/api/v1/nodes/{node.name}")
    return starts


if __name__ == "__main__":
    main()
