"""What test_takeover.py shares with other test modules: two operator replicas in Kopf
peering, the policy's status writes as a watcher sees them, and the Prometheus server's own
query log, read to tell a whole-window read from a read of the gap."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from kube import Kube
from kube_faults import FaultProxy
from operator_proc import UNTHROTTLE, OperatorProcess
from prom import PrometheusServer, free_port
from shop import Workload
from support.paths import ROOT
from unthrottle.kube.patching import RECORD_ANNOTATION, Record

POLICIES = "unthrottle.io/v1alpha1/throttlepolicies"
DEPLOYMENTS = "apps/v1/deployments"
PEERINGS = "kopf.dev/v1/kopfpeerings"
PEERING_CRDS = ROOT / "charts" / "unthrottle" / "crds" / "kopfpeerings.yaml"
PEERING = "unthrottle"
"""The chart's default peering name (``operator.peering.name``)."""
APP = Workload("stage", "checkout", 0.1, 0.10, 1.2, 0.5, 2, {"tier": "web"})
INTERVAL_S = 30
"""The policy's interval: the shortest the CRD admits."""
WINDOW_S = 2 * 3600
LIFETIME_S = 20
"""The operator's default ``--peering-lifetime``."""


class Replica(OperatorProcess):
    """``unthrottle operator --peering`` as the chart runs each pod: its own priority, and
    ``POD_ID`` (the pod's name in the chart) as its identity in the peering object."""

    def __init__(self, name: str, kubeconfig: Path, prometheus: str, log: Path,
                 namespace: str, priority: int, *extra: str) -> None:  # fmt: skip
        super().__init__(kubeconfig, prometheus, log)
        self.name = name
        self.metrics = f"127.0.0.1:{free_port()}"
        self.command = [str(UNTHROTTLE), "operator", "--prometheus", prometheus,
                        "--peering", PEERING, "--priority", str(priority),
                        "--namespace", namespace, "--metrics", self.metrics,
                        "--log-format", "text", *extra]  # fmt: skip
        self.env["POD_ID"] = name

    def queries(self) -> float:
        """Prometheus queries this process sent (its own /metrics)."""
        with urllib.request.urlopen(f"http://{self.metrics}/metrics", timeout=10) as reply:
            text = reply.read().decode()
        found = re.search(r"^unthrottle_operator_prometheus_queries_total (\S+)$", text, re.M)
        assert found is not None, text[:2000]
        return float(found.group(1))


@dataclass(frozen=True)
class Write:
    """A status write as the watcher saw it: when (this host's clock) and what."""

    at: float
    status: dict[str, Any]


@dataclass
class StatusWatch:
    """Every status write of one policy (told apart by ``lastRun``), polled every 0.1 s in
    a thread of its own."""

    kube: Kube
    namespace: str
    name: str
    writes: list[Write] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> StatusWatch:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        last = None
        while not self._stop.is_set():
            try:
                body = self.kube.get(POLICIES, self.namespace, self.name) or {}
            except Exception:  # a slow answer: the next poll
                body = {}
            status = body.get("status") or {}
            run = status.get("lastRun")
            if run is not None and run != last:
                self.writes.append(Write(time.time(), status))
                last = run
            time.sleep(0.1)

    def after(self, at: float, timeout_s: float, log: OperatorProcess) -> Write:
        """The first write seen after ``at``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = next((w for w in list(self.writes) if w.at > at), None)
            if found is not None:
                return found
            time.sleep(0.05)
        raise AssertionError(f"no status write within {timeout_s:g} s; log:\n{log.tail()}")


@dataclass
class World:
    kube: Kube
    proxy: FaultProxy
    prom: PrometheusServer
    query_log: Path
    kubeconfig: Path
    namespace: str
    folder: Path

    def replica(self, name: str, priority: int, *extra: str) -> Replica:
        return Replica(name, self.kubeconfig, self.prom.url, self.folder / f"{name}.log",
                       self.namespace, priority, *extra)  # fmt: skip

    def peers(self) -> dict[str, Any]:
        """The keep-alives in the peering object, by identity."""
        found = self.kube.get(PEERINGS, self.namespace, PEERING) or {}
        return dict(found.get("status") or {})

    def deployment(self) -> dict[str, Any]:
        found = self.kube.get(DEPLOYMENTS, self.namespace, "checkout")
        assert found is not None
        return found

    def limit_patches(self) -> int:
        """JSON Patches to the Deployment that change its CPU limit, seen by the proxy."""
        return sum(1 for r in self.proxy.requests("PATCH", "/deployments/checkout$")
                   if any("/resources" in op.get("path", "") and op["op"] != "test"
                          for op in r.body or []))  # fmt: skip

    def reads(self, since: float) -> list[Read]:
        """The queries Prometheus answered from ``since`` (this host's clock) on."""
        out = []
        if not self.query_log.exists():
            return out
        for line in self.query_log.read_text().splitlines():
            entry = json.loads(line)
            if _seconds(entry["ts"]) < since:
                continue
            params = entry["params"]
            out.append(Read(params["query"], _seconds(params["start"]), _seconds(params["end"]),
                            float(params.get("step") or 0)))  # fmt: skip
        return out


@dataclass(frozen=True)
class Read:
    """One query in Prometheus's query log."""

    query: str
    start: float
    end: float
    step: float

    @property
    def plots(self) -> bool:
        """One of the report's plot series (the plotted containers' pods by name, over the
        window at each reconcile that changed them): not the evidence reads."""
        return "pod=~" in self.query

    @property
    def covers_s(self) -> float:
        """The span of samples it reads: its longest range selector, plus the range
        query's own span."""
        ranges = [_duration_s(m) for m in re.findall(r"\[([0-9a-z]+)(?::[0-9a-z]*)?\]", self.query)]
        return max(ranges, default=0.0) + (self.end - self.start if self.step else 0.0)


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800, "y": 31_536_000}


def _duration_s(text: str) -> float:
    return sum(float(n) * _UNITS[u] for n, u in re.findall(r"(\d+)(ms|s|m|h|d|w|y)", text))


def with_query_log(prom: PrometheusServer, log: Path) -> None:
    """Have ``prom`` (not started yet) log every query it answers to ``log``."""
    text = prom.config.read_text()
    assert text.startswith("global: {"), text
    prom.config.write_text(text.replace("global: {", f"global: {{query_log_file: {log}, ", 1))


def record(deploy: dict[str, Any]) -> Record | None:
    text = (deploy["metadata"].get("annotations") or {}).get(RECORD_ANNOTATION)
    return None if text is None else Record.from_annotation(text)


def wait(check: Any, what: str, *logs: OperatorProcess, timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    tails = "\n".join(f"--- {log.log.name}:\n{log.tail()}" for log in logs)
    raise AssertionError(f"{what} never happened; logs:\n{tails}")
