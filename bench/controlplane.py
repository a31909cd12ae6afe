"""What the real control plane costs the test suite and the demo (docs/benchmarks.md §12).

    .venv/bin/python bench/controlplane.py            # warm build, link-only build, start-ups
    .venv/bin/python bench/controlplane.py --cold     # also a fresh machine's download and build

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

from unthrottle.devtools.kube import ControlPlane, ensure_built
from unthrottle.devtools.kube.build import go_binary, source

RESULTS = Path(__file__).resolve().parent / "results" / "controlplane.json"


def _timed_build(env: dict[str, str]) -> float:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        started = time.monotonic()
        ensure_built()
        return time.monotonic() - started
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _go(modcache: Path, *args: str, check: bool = True) -> None:
    """``go ARGS`` in controlplane/, with ``modcache`` as the module cache."""
    env = {**os.environ, "GOMODCACHE": str(modcache), "GOFLAGS": "-mod=readonly"}
    subprocess.run([go_binary(), *args], cwd=source(), env=env, check=check)


def _timed_download(modcache: Path) -> float:
    """``go mod download`` of controlplane/'s graph into an empty module cache."""
    started = time.monotonic()
    _go(modcache, "mod", "download")
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
    out["version"] = ControlPlane(Path(tempfile.gettempdir())).version
    out["load_average"] = [round(x, 2) for x in os.getloadavg()]
    print(f"start-up: {starts} s (median {out['start_median_s']} s), "
          f"load average {out['load_average']}")  # fmt: skip
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
