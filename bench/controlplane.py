"""What the real control plane costs the test suite and the demo (docs/benchmarks.md §12).

    .venv/bin/python bench/controlplane.py            # warm build, link-only build, start-ups
    .venv/bin/python bench/controlplane.py --cold     # also a build from an empty Go cache

- **cold**: ``ensure_built()`` with an empty Go build cache and no cached binaries, as on a
  fresh machine (Go modules already downloaded: add the download apart; ~40 s here);
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
import tempfile
import time
from pathlib import Path
from typing import Any

from unthrottle.devtools.kube import ControlPlane, ensure_built

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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cold", action="store_true", help="also build from an empty Go cache")
    parser.add_argument("--starts", type=int, default=5)
    args = parser.parse_args()
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory() as scratch:
        fresh = Path(scratch)
        if args.cold:
            out["cold_s"] = round(_timed_build({"UNTHROTTLE_CACHE": str(fresh / "cold"),
                                                "GOCACHE": str(fresh / "gocache")}), 1)  # fmt: skip
            shutil.rmtree(fresh / "gocache", ignore_errors=True)
            print(f"cold build: {out['cold_s']} s", flush=True)
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
