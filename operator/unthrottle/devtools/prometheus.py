"""A real Prometheus server on 127.0.0.1: scraping, or serving backfilled history.

Debian's ``prometheus`` and ``promtool`` (``make prometheus`` installs them).
The server keeps its data in a folder the caller owns and is ended by PID.
Shared by the demo, the benchmarks and the tests (``tests/prom.py`` re-exports
it beside the pytest marker); it imports no test framework.
"""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from unthrottle.devtools.processes import stop

__all__ = ["PrometheusServer", "free_port", "have_prometheus"]


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
                 users: dict[str, str] | None = None) -> None:  # fmt: skip
        self.folder = folder
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
        self.config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n" + (scrape or "")
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
            ["prometheus", f"--config.file={self.config}", f"--storage.tsdb.path={self.tsdb}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=30d",
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

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.proc is not None:
            stop(self.proc, timeout_s=15)
