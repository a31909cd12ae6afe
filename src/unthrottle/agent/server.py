"""The agent's HTTP endpoints: /metrics and /healthz (200 ``ok``, or 503 and the reason)."""

from __future__ import annotations

import contextlib
import resource
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from unthrottle.agent.exposition import CONTENT_TYPE, render
from unthrottle.agent.sampling import Sampler


def make_server(
    sampler: Sampler,
    host: str,
    port: int,
    *,
    extra: Callable[[], str] | None = None,
) -> ThreadingHTTPServer:
    """An HTTP server (not yet serving) for a sampler; ``extra`` adds exposition lines."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] == "/metrics":
                with sampler.lock:
                    series = sampler.snapshot()
                    body = render(series, windows=sampler.windows, cgroups=len(series))
                if extra is not None:
                    body += extra().encode()
                self._reply(200, CONTENT_TYPE, body)
            elif self.path == "/healthz":
                # Healthy while windows are taken and there are cgroups to take them of;
                # else 503 with the reason (Sampler.health).
                ok, reason = sampler.health()
                self._reply(200 if ok else 503, "text/plain", f"{reason}\n".encode())
            else:
                self._reply(404, "text/plain", b"not found\n")

        def _reply(self, code: int, content_type: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # one line per scrape would flood the logs

    return ThreadingHTTPServer((host, port), Handler)


def raise_open_files_limit() -> int:
    """Raise the soft limit of open files to the hard one, and return it: the wait keeps a
    file open per thread of every container (docs/agent.md, "Wait"), and runtimes often
    start containers with a soft limit of 1024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def serve(sampler: Sampler, server: ThreadingHTTPServer, stop: threading.Event) -> None:
    """Discover, sample and serve, each on its own thread, until ``stop`` is set; then stop
    them and close every file (a discovery stuck in an API call is not waited for)."""
    if sampler.settings.measure_wait:
        raise_open_files_limit()
    serving = threading.Thread(target=server.serve_forever, name="http", daemon=True)
    threads = sampler.start(stop)
    serving.start()
    try:
        stop.wait()
    finally:
        server.shutdown()
        server.server_close()
        for thread in threads:
            if thread.name == "sampler":
                thread.join()
        sampler.close()
