"""What the node agent asks of the API server in steady state, counted by the server itself.

    .venv/bin/python bench/agent_api_requests.py [--pods 50] [--seconds 60]
                                                 [--save bench/results/agent-api-requests.json]

Starts the real control plane (kube-apiserver, etcd, controller-manager, scheduler, kwok's
fake nodes; ``unthrottle_lab.kube``), binds ``--pods`` pods to one fake node, and reads
the API server's own counters (``apiserver_request_total`` and
``apiserver_longrunning_requests`` for pods, from its ``/metrics``) around three windows of
``--seconds`` each:

1. **baseline**: no agent; what the controllers and kwok ask for on their own;
2. **agent**: ``unthrottle agent`` for that node, as the chart runs it (a process, its
   default ``--discover-every 5s``), after a 10 s warm-up: one LIST at its start, then a
   WATCH (agent/podwatch.py);
3. **list every 5 s**: the agent's discovery before issue 30, which listed the node's pods
   at every rediscovery: the product's own list source (``KubePodSource``) called every
   5 s for the same window.

Each window's figures are the counters' rise less the baseline's (the other clients' own
traffic). A LIST is what costs the server: it reads every pod of its cache to apply the
field selector; a WATCH is one long-lived request, renewed every 5 minutes. Needs root
(the agent reads the node's cgroups; none need to be there).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from unthrottle.agent.naming import KubePodSource
from unthrottle_lab.children import stop
from unthrottle_lab.kube import ControlPlane, ensure_built

UNTHROTTLE = Path(sys.executable).parent / "unthrottle"
_SAMPLE = re.compile(r"^(\w+)\{([^}]*)\}\s+(\S+)$")


def pod_counters(plane: ControlPlane) -> dict[str, float]:
    """LIST and WATCH requests on pods (finished), and open WATCHes on pods, from the API
    server's own /metrics."""
    out = {"LIST": 0.0, "WATCH": 0.0, "open_WATCH": 0.0}
    for line in plane.kubectl("get", "--raw", "/metrics").splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, labels, value = match.groups()
        if 'resource="pods"' not in labels or re.search(r'subresource="[^"]+"', labels):
            continue  # pods themselves, not their status, binding, log…
        verb = re.search(r'verb="(\w+)"', labels)
        if verb is None:
            continue
        if name == "apiserver_request_total" and verb[1] in ("LIST", "WATCH"):
            out[verb[1]] += float(value)
        elif name == "apiserver_longrunning_requests" and verb[1] == "WATCH":
            out["open_WATCH"] += float(value)
    return out


def bind_pods(plane: ControlPlane, node: str, count: int) -> None:
    plane.kubectl("create", "namespace", "bench")
    items = [{"apiVersion": "v1", "kind": "Pod",
              "metadata": {"name": f"web-{i:03d}", "namespace": "bench"},
              "spec": {"nodeName": node, "containers": [
                  {"name": "app", "image": "registry.example/app:1"}]}}
             for i in range(count)]  # fmt: skip
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"apiVersion": "v1", "kind": "List", "items": items}, f)
    try:
        plane.kubectl("apply", "-f", f.name)
    finally:
        os.unlink(f.name)


def window(plane: ControlPlane, seconds: float, during: Any = None) -> dict[str, float]:
    """The counters' rise over ``seconds`` (``during`` is called every second meanwhile)."""
    before = pod_counters(plane)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if during is not None:
            during()
        time.sleep(min(1.0, max(0.0, end - time.monotonic())))
    after = pod_counters(plane)
    rise = {k: after[k] - before[k] for k in ("LIST", "WATCH")}
    rise["open_WATCH"] = after["open_WATCH"]
    return rise


def run_agent(plane: ControlPlane, node: str, folder: Path, seconds: float) -> dict[str, float]:
    port = _free_port()
    log = (folder / "agent.log").open("w")
    proc = subprocess.Popen(
        [str(UNTHROTTLE), "agent", "--kubeconfig", str(plane.kubeconfig), "--node-name", node,
         "--listen", f"127.0.0.1:{port}", "--discover-every", "5s"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        _wait_listening(port)
        time.sleep(10)  # its first list and watch, then steady state
        return window(plane, seconds)
    finally:
        stop(proc, timeout_s=15)
        log.close()


def run_relisting(plane: ControlPlane, node: str, seconds: float) -> dict[str, float]:
    """The discovery before issue 30: the node's pods listed every 5 s."""
    from kubernetes import client, config

    api = client.CoreV1Api(config.new_client_from_config(str(plane.kubeconfig)))
    source = KubePodSource(api, node)
    last = [0.0]

    def discover() -> None:
        if time.monotonic() - last[0] >= 5.0:
            last[0] = time.monotonic()
            source.pods()

    return window(plane, seconds, during=discover)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_listening(port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).close()
            return
        except urllib.error.HTTPError:
            return  # 503 with a reason (no kubepods cgroup here): it is up
        except OSError:
            time.sleep(0.2)
    raise SystemExit("the agent did not start listening")


def less(figures: dict[str, float], base: dict[str, float]) -> dict[str, float]:
    return {"LIST": figures["LIST"] - base["LIST"], "WATCH": figures["WATCH"] - base["WATCH"],
            "open_WATCH": figures["open_WATCH"] - base["open_WATCH"]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--save", type=Path)
    args = parser.parse_args()
    binaries = ensure_built()
    with (
        tempfile.TemporaryDirectory() as tmp,
        ControlPlane(Path(tmp) / "plane", nodes=1, binaries=binaries) as plane,
    ):
        nodes = json.loads(plane.kubectl("get", "nodes", "-o", "json"))["items"]
        node = nodes[0]["metadata"]["name"]
        bind_pods(plane, node, args.pods)
        time.sleep(5)
        baseline = window(plane, args.seconds)
        agent = less(run_agent(plane, node, Path(tmp), args.seconds), baseline)
        relisting = less(run_relisting(plane, node, args.seconds), baseline)
    minutes = args.seconds / 60
    result = {
        "command": "bench/agent_api_requests.py",
        "pods": args.pods,
        "seconds": args.seconds,
        "baseline": baseline,
        "agent": agent,
        "list_every_5s": relisting,
        "per_minute": {"agent_LIST": agent["LIST"] / minutes,
                       "list_every_5s_LIST": relisting["LIST"] / minutes},
        "lists_per_second_at_1000_nodes": {
            "agent": agent["LIST"] / args.seconds * 1000,
            "list_every_5s": relisting["LIST"] / args.seconds * 1000,
        },
    }  # fmt: skip
    print(json.dumps(result, indent=1))
    if args.save:
        args.save.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
