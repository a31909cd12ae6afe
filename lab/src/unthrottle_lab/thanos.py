"""Thanos Query over Prometheus servers on 127.0.0.1: a sidecar beside each, one querier.

The binary is built from Thanos's Go module (:mod:`unthrottle_lab.kube.thanos_build`,
``make controlplane``). What it takes, read in Thanos v0.42.4's source and tried here:

- Thanos Query reads only the gRPC Store API, which Prometheus does not serve: each
  Prometheus gets a ``thanos sidecar`` (``--prometheus.url``), which reads it through
  Prometheus's remote-read API and serves it over gRPC.
- A sidecar waits, not ready, until its Prometheus has ``global.external_labels``
  ("no external labels configured on Prometheus server, uniquely identifying external
  labels must be configured"): each server needs its own (``shard``, ``replica``). The
  querier adds them to every series it returns.
- ``--storage.tsdb.min-block-duration`` = ``max-block-duration`` (2 h) is checked only when
  the sidecar uploads blocks to object storage (``cmd/thanos/sidecar.go``,
  ``validatePrometheus``); these sidecars upload nothing, so Debian's Prometheus runs with
  its defaults and its backfilled blocks.
- A querier's ``/-/ready`` says nothing of its stores: they are found by an info call
  repeated every 5 s (``--endpoint.info-timeout``). :meth:`ThanosQuery.__enter__` waits
  until ``/api/v1/stores`` lists every sidecar without an error.
- A store that fails that info call is no longer queried, and no longer warned about,
  unless it was given as strict (``--endpoint-strict``): ``endpointRef.isQueryable``,
  ``pkg/query/endpointset.go``. A stopped sidecar's warnings ended 6.5 s and 7.5 s after
  it stopped, in two runs (docs/thanos.md says what that does to a recommendation).

Each process is ended by PID on exit; the caller owns the folder.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from unthrottle_lab.children import stop
from unthrottle_lab.prometheus import PrometheusServer, free_port

__all__ = ["READY_S", "Sidecar", "ThanosQuery"]

READY_S = 60.0
"""How long a sidecar or the querier may take to be ready, s (two sidecars and a querier
listing both took 0.6 s here)."""


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=2) as reply:
        return json.loads(reply.read()) if reply.headers.get_content_type().endswith(
            "json") else reply.status  # fmt: skip


def _wait(what: str, ready: Any, log: Path, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            if ready():
                return
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    tail = log.read_text(errors="replace").strip().splitlines()[-5:]
    raise RuntimeError(f"{what} did not become ready in {READY_S:g} s: " + " | ".join(tail))


class Sidecar:
    """``thanos sidecar`` beside one Prometheus: its Store API on ``grpc`` (host:port)."""

    def __init__(self, binary: Path, prometheus: PrometheusServer, folder: Path) -> None:
        self.binary = binary
        self.prometheus = prometheus
        self.folder = folder
        self.grpc = f"127.0.0.1:{free_port()}"
        self.http = f"127.0.0.1:{free_port()}"
        self.log = folder / "sidecar.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it and wait until it has read its Prometheus's external labels."""
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [str(self.binary), "sidecar", f"--prometheus.url={self.prometheus.url}",
                 f"--tsdb.path={self.prometheus.tsdb}", f"--grpc-address={self.grpc}",
                 f"--http-address={self.http}"],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        _wait("thanos sidecar", lambda: _get(f"http://{self.http}/-/ready") == 200, self.log,
              self.proc)  # fmt: skip

    def stop(self) -> None:
        """End it by PID (a no-op when it was not started or has ended)."""
        if self.proc is not None:
            stop(self.proc, timeout_s=15)


class ThanosQuery:
    """A sidecar for each of ``servers`` (started already, each with its own external
    labels) and ``thanos query`` over them; ``url`` is the querier's HTTP API, which
    ``unthrottle`` reads as it reads a Prometheus.

    ``replica_labels``: ``--query.replica-label`` (deduplication). ``strict``: the sidecars
    are ``--endpoint-strict``, queried even while their health check fails.
    """

    def __init__(self, binary: Path, servers: Sequence[PrometheusServer], folder: Path, *,
                 replica_labels: Sequence[str] = (), strict: bool = False,
                 flags: Sequence[str] = ()) -> None:  # fmt: skip
        self.binary = binary
        self.folder = folder
        self.sidecars = []
        for k, server in enumerate(servers):
            (place := folder / f"sidecar-{k}").mkdir(parents=True, exist_ok=True)
            self.sidecars.append(Sidecar(binary, server, place))
        self.replica_labels = tuple(replica_labels)
        self.strict = strict
        self.flags = tuple(flags)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = folder / "query.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_in_s = 0.0
        """Seconds from the first sidecar's start to every store listed by the querier."""

    def stores(self) -> list[dict[str, Any]]:
        """What the querier's ``/api/v1/stores`` lists (every kind of store together)."""
        data = _get(f"{self.url}/api/v1/stores")["data"] or {}
        return [store for kind in data.values() for store in kind]

    def _all_stores(self) -> bool:
        found = {s["name"]: s for s in self.stores()}
        return all(
            sidecar.grpc in found and not found[sidecar.grpc].get("lastError")
            for sidecar in self.sidecars
        )

    def __enter__(self) -> ThanosQuery:
        began = time.monotonic()
        try:
            for sidecar in self.sidecars:
                sidecar.start()
            flag = "--endpoint-strict" if self.strict else "--endpoint"
            with self.log.open("ab") as log:
                self.proc = subprocess.Popen(
                    [str(self.binary), "query", f"--http-address=127.0.0.1:{self.port}",
                     f"--grpc-address=127.0.0.1:{free_port()}",
                     *(f"{flag}={s.grpc}" for s in self.sidecars),
                     *(f"--query.replica-label={label}" for label in self.replica_labels),
                     *self.flags],
                    stdout=log, stderr=subprocess.STDOUT,
                )  # fmt: skip
            _wait("thanos query", self._all_stores, self.log, self.proc)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        self.started_in_s = time.monotonic() - began
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.proc is not None:
            stop(self.proc, timeout_s=15)
        for sidecar in self.sidecars:
            sidecar.stop()
