"""A real Prometheus server on 127.0.0.1: scraping, or serving backfilled history.

Debian's ``prometheus`` and ``promtool`` (``make prometheus`` installs them).
The server keeps its data in a folder the caller owns and is ended by PID.
Shared by the demo, the benchmarks and the tests (``tests/prom.py`` re-exports
it beside the pytest marker); it imports no test framework.
"""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from types import TracebackType

from unthrottle_lab.children import stop

__all__ = ["RULE_BLOCK_S", "PrometheusServer", "free_port", "have_prometheus"]

FIRST_SCRAPE_S = 30
"""How long :meth:`PrometheusServer.until_scraped` waits for a job's first scrape, s: the
server applies its scrape targets some 5 s after it is ready (5.0-5.9 s measured here)."""
RULE_BLOCK_S = 2 * 3600
"""The blocks ``promtool tsdb create-blocks-from rules`` cuts its range into: 2 h, aligned
on the Unix epoch (its default, without ``--max-block-duration``)."""


def have_prometheus() -> bool:
    """True when ``prometheus`` and ``promtool`` are on the PATH."""
    return shutil.which("prometheus") is not None and shutil.which("promtool") is not None


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrometheusServer:
    """Start with an optional scrape config and/or OpenMetrics history to backfill.

    ``tsdb`` serves an existing TSDB folder (a benchmark's cached history).
    """

    def __init__(self, folder: Path, *, scrape: str = "", openmetrics: str = "",
                 tsdb: Path | None = None, flags: tuple[str, ...] = (),
                 tls: tuple[Path, Path] | None = None,
                 users: dict[str, str] | None = None,
                 listen: str = "127.0.0.1", binary: str = "prometheus",
                 external_labels: dict[str, str] | None = None) -> None:  # fmt: skip
        """``listen``: the address it serves on (``0.0.0.0``: also where the real node's pods
        reach the host); ``url`` is on 127.0.0.1 either way. ``binary``: Debian's by default
        (:mod:`unthrottle_lab.kube.prometheus_build` has one with Kubernetes discovery).
        ``external_labels``: the ``global.external_labels`` that name this server among
        others (a Thanos sidecar refuses to serve a Prometheus without any:
        :mod:`unthrottle_lab.thanos`)."""
        self.folder = folder
        self.listen = listen
        self.binary = binary
        self.flags = flags
        self.port = free_port()
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        web = ""
        if tls:  # (certificate, key): Prometheus serves HTTPS only
            web += f"tls_server_config:\n  cert_file: {tls[0]}\n  key_file: {tls[1]}\n"
        if users:  # name → bcrypt hash: Prometheus's own basic auth
            web += "basic_auth_users:\n" + "".join(f"  {u}: '{h}'\n" for u, h in users.items())
        if web:
            (folder / "web.yml").write_text(web)
            self.flags = (*flags, f"--web.config.file={folder / 'web.yml'}")
        self.tsdb = tsdb or folder / "tsdb"
        self.config = folder / "prometheus.yml"
        named = f", external_labels: {json.dumps(external_labels)}" if external_labels else ""
        self.config.write_text(
            f"global: {{scrape_interval: 1s, evaluation_interval: 1s{named}}}\n" + (scrape or "")
        )
        if openmetrics:
            data = folder / "history.om"
            data.write_text(
                openmetrics if openmetrics.endswith("# EOF\n") else openmetrics + "# EOF\n"
            )
            backfill = ["promtool", "tsdb", "create-blocks-from", "openmetrics"]
            subprocess.run([*backfill, str(data), str(self.tsdb)], check=True, capture_output=True)
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> PrometheusServer:
        self.proc = subprocess.Popen(
            [self.binary, f"--config.file={self.config}", f"--storage.tsdb.path={self.tsdb}",
             f"--web.listen-address={self.listen}:{self.port}", "--storage.tsdb.retention.time=30d",
             *self.flags],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                unverified = ssl._create_unverified_context()  # readiness only
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1,
                                            context=unverified) as reply:  # fmt: skip
                    if reply.status == 200:
                        return self
            except urllib.error.HTTPError as err:
                if err.code == 401:  # up, and asking for the credentials it was given
                    return self
                time.sleep(0.1)
            except OSError:
                time.sleep(0.1)
        self.__exit__(None, None, None)
        raise RuntimeError("prometheus did not become ready")

    def until_scraped(self, job: str, timeout_s: float = FIRST_SCRAPE_S) -> None:
        """Wait until this server has scraped ``job`` and found it up (its ``up`` is 1).

        Prometheus (2.42) is ready before it scrapes: the first scrape came 5.0-5.9 s after
        ready here, in 3 starts (its discovery hands targets over on a 5 s tick).
        A measurement started at ready is seen from then on only: an 8 s workload whose
        last 2-3 s alone were scraped read a median of 0.68 core over ``[8s]`` (nearly
        half of its windows the idle ones after it) where every window read about 1. Raises
        RuntimeError with the last answer when the job is not up in ``timeout_s``. (Plain
        HTTP or HTTPS without the server's basic auth.)
        """
        query = urllib.parse.urlencode({"query": f'up{{job="{job}"}}'})
        unverified = ssl._create_unverified_context()  # a local test server's own certificate
        deadline = time.monotonic() + timeout_s
        last: object = None
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/api/v1/query?{query}", timeout=2,
                                            context=unverified) as reply:  # fmt: skip
                    last = json.loads(reply.read())["data"]["result"]
            except OSError as err:
                last = err
            if isinstance(last, list) and any(r["value"][1] == "1" for r in last):
                return
            time.sleep(0.1)
        raise RuntimeError(f"prometheus did not scrape job {job!r} up in {timeout_s:g} s "
                           f"(up: {last!r})")  # fmt: skip

    def record(self, rules: Path, start: int, end: int) -> list[Path]:
        """Evaluate a rule file over ``[start, end]`` (Unix seconds) against this server with
        ``promtool tsdb create-blocks-from rules``: the blocks it wrote (under
        ``folder/rule-blocks``), which a Prometheus serves once they are moved into its TSDB
        and it starts (it reads blocks when it opens its TSDB, before it is ready).

        promtool cuts the range at 2 h edges and evaluates each piece at the group's
        evaluation times, which start at an offset hashed from the group's name and file
        path. Debian's promtool 2.42 stops at the first piece that holds no evaluation time
        (a ``break`` in ``importRule``; prometheus/prometheus#19714), exits 0 and writes
        nothing. A ``start`` less than one interval (5 m for unthrottle's rules) before an edge
        hits it: two hours of history ending at the current minute began there about one run
        in fifty, as the offset moves with the temporary folder's name. That was the fixture
        that once wrote no ``rule-blocks`` in ``make test``. So the range is sent as two
        calls, the piece before the first edge and the rest from the edge on: each starts
        either in the only piece it has or on an edge, where its first piece holds
        evaluation times, and together they evaluate the times one call would if promtool
        did not stop.
        """
        out = self.folder / "rule-blocks"
        edge = (start // RULE_BLOCK_S + 1) * RULE_BLOCK_S
        for a, b in ((start, min(end, edge - 1)), (edge, end)):
            if a < b:
                subprocess.run(
                    ["promtool", "tsdb", "create-blocks-from", "rules", f"--url={self.url}",
                     f"--start={a}", f"--end={b}", f"--output-dir={out}", str(rules)],
                    check=True, capture_output=True,
                )  # fmt: skip
        blocks = sorted(out.iterdir()) if out.is_dir() else []
        if not blocks:
            raise RuntimeError(f"promtool recorded nothing from {rules} over [{start}, {end}]")
        return blocks

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.proc is not None:
            stop(self.proc, timeout_s=15)
