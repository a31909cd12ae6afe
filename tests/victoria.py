"""A real single-node VictoriaMetrics for tests, serving the history the Prometheus tests
backfill, imported through its own import API.

Debian's ``victoria-metrics`` 1.79, with its ``vmalert`` (``make victoria-metrics``
installs it; nothing is started as a service). The server listens on 127.0.0.1, keeps
its data in the test's folder and is ended by PID, like ``prom.PrometheusServer``, whose
``url`` and context-manager behaviour it shares.

History: the tests write OpenMetrics (timestamps in seconds, ``# EOF``). It is sent to
``/api/v1/import/prometheus``, Prometheus text with timestamps in **milliseconds**:
VictoriaMetrics 1.79 also takes seconds there, but by guessing from their size, so the
timestamps are converted rather than left to the guess. Then ``/internal/force_flush``
makes the samples searchable at once.

No search flag is changed: the server runs as users run it (response cache on,
``-search.latencyOffset=30s``). unthrottle sends ``nocache=1`` with every query, so
neither the cache nor the latency offset hides just-imported samples from it, and the
tests would catch a query sent without it (``docs/metrics.md``, "Compatible backends").
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

import pytest

from missing import MISSING
from prom import PrometheusServer, free_port, requires_prometheus
from unthrottle_lab.children import stop

BINARY = "victoria-metrics"
requires_victoria = pytest.mark.skipif(
    shutil.which(BINARY) is None or shutil.which("vmalert") is None,
    reason=f"{MISSING} victoria-metrics is not installed "
    "(make test installs Debian's package as root)",
)
__all__ = ["BACKENDS", "VictoriaMetricsServer", "prometheus_text", "requires_victoria"]

CHUNK_BYTES = 4 << 20
"""Import in pieces well under ``-maxInsertRequestSize`` (32 MB by default)."""


def prometheus_text(openmetrics: str) -> Iterator[str]:
    """OpenMetrics sample lines (timestamps in seconds) as Prometheus text exposition lines
    with timestamps in milliseconds; comments and ``# EOF`` are dropped."""
    for line in openmetrics.splitlines():
        if not line or line.startswith("#"):
            continue
        # labels may hold spaces: the value and the timestamp follow the last '}', if any
        cut = line.rfind("}") + 1 or line.find(" ")
        series, rest = line[:cut], line[cut:].split()
        if len(rest) == 2:
            yield f"{series} {rest[0]} {round(float(rest[1]) * 1000)}"
        else:
            yield f"{series} {' '.join(rest)}"


class VictoriaMetricsServer:
    """Start with optional OpenMetrics history to import; ``url`` is its address. It may be
    stopped (``__exit__``) and started again on the same port, keeping its data.

    ``flags`` are VictoriaMetrics command-line flags (``-search.maxUniqueTimeseries=100``).
    """

    def __init__(self, folder: Path, *, openmetrics: str = "",
                 flags: tuple[str, ...] = ()) -> None:  # fmt: skip
        self.folder = folder
        self.data = folder / "victoria-data"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.flags = flags
        self.openmetrics = openmetrics
        self.loaded = False
        self.log = folder / "victoria-metrics.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> VictoriaMetricsServer:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [BINARY, f"-storageDataPath={self.data}", f"-httpListenAddr=127.0.0.1:{self.port}",
                 *self.flags],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            self._wait_ready()
            if self.openmetrics and not self.loaded:  # a restart keeps what was imported
                self.load(self.openmetrics)
                self.loaded = True
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                break
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=1) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"victoria-metrics did not become ready:\n{self.tail()}")

    def load(self, openmetrics: str) -> int:
        """Import OpenMetrics history and flush it so queries see it; the samples sent."""
        chunk: list[str] = []
        size = sent = 0
        for line in prometheus_text(openmetrics):
            chunk.append(line)
            size += len(line) + 1
            if size >= CHUNK_BYTES:
                sent += self._post(chunk)
                chunk, size = [], 0
        sent += self._post(chunk)
        self._get("/internal/force_flush")
        return sent

    def record(self, rules: Path, start: int, end: int) -> None:
        """Evaluate a Prometheus rule file over ``[start, end]`` (Unix seconds) and store what
        it records: vmalert's replay mode, VictoriaMetrics' ``promtool tsdb
        create-blocks-from rules``."""
        at = [time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t)) for t in (start, end)]
        subprocess.run(
            ["vmalert", f"-rule={rules}", f"-datasource.url={self.url}",
             f"-remoteWrite.url={self.url}", f"-replay.timeFrom={at[0]}",
             f"-replay.timeTo={at[1]}", "-replay.disableProgressBar", "-replay.rulesDelay=0s"],
            check=True, capture_output=True,
        )  # fmt: skip
        self._get("/internal/force_flush")

    def _post(self, lines: list[str]) -> int:
        if lines:
            body = ("\n".join(lines) + "\n").encode()
            request = urllib.request.Request(f"{self.url}/api/v1/import/prometheus", data=body)
            with urllib.request.urlopen(request, timeout=60) as reply:
                assert reply.status == 204, reply.read()
        return len(lines)

    def _get(self, path: str) -> bytes:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=60) as reply:
            return bytes(reply.read())

    def samples(self, match: str = '{__name__!=""}') -> int:
        """How many samples VictoriaMetrics holds for a series selector (its export API)."""
        query = urllib.parse.urlencode({"match[]": match})
        rows = self._get(f"/api/v1/export?{query}").splitlines()
        return sum(len(json.loads(row)["values"]) for row in rows if row.strip())

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.proc is not None:
            stop(self.proc, timeout_s=15)


BACKENDS = [
    pytest.param(PrometheusServer, id="prometheus", marks=requires_prometheus),
    pytest.param(VictoriaMetricsServer, id="victoria-metrics", marks=requires_victoria),
]
"""The ``params`` of a test module's ``backend`` fixture: the server class, started as
``backend(folder, openmetrics=TEXT)``; both have ``url`` and end with their ``with``."""
