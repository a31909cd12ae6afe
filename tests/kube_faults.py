"""A fault-injecting proxy in front of the real API server: the one test double left for
Kubernetes, for what a real server cannot be made to do on demand — answer 500, answer
late, lose the connection, end every watch at once, refuse with 409 again and again.

Everything else passes through to the real kube-apiserver, so the bodies, the status
codes and the watch streams a client sees are the server's own. The proxy listens on
plain HTTP on 127.0.0.1 and calls the server as the admin (or with the client's own
``Authorization`` header, which it forwards, so RBAC still holds for a token); it
records every request it forwards or fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.web

from kube import Kube
from unthrottle_lab.prometheus import free_port

_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding",
        "host", "upgrade", "proxy-authorization", "te", "trailer"}  # fmt: skip


@dataclass(frozen=True)
class SeenRequest:
    """One request as the client sent it."""

    method: str
    path: str
    params: dict[str, str]
    body: Any
    content_type: str


@dataclass
class Fault:
    """The next ``count`` requests matching ``method`` and ``path`` (a regex, searched)
    wait ``delay`` s, then get ``status`` (None: forwarded, only late) or lose the
    connection (``disconnect``)."""

    method: str | None
    path: str
    status: int | None
    count: int
    delay: float = 0.0
    disconnect: bool = False
    hits: int = field(default=0)

    def matches(self, method: str, path: str) -> bool:
        return (self.hits < self.count
                and (self.method is None or self.method.upper() == method)
                and re.search(self.path, path) is not None)  # fmt: skip


class FaultProxy:
    """``with FaultProxy(kube) as proxy:`` — ``proxy.kubeconfig(path)`` for the client."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._faults: list[Fault] = []
        self._seen: list[SeenRequest] = []
        self._watches: set[aiohttp.ClientResponse] = set()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="fault-proxy", daemon=True)

    # -- the test's side ----------------------------------------------------------------

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the fault proxy did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def kubeconfig(self, path: Path, *, namespace: str | None = None) -> Path:
        """A kubeconfig whose server is this proxy (plain HTTP, no credentials)."""
        return self.kube.kubeconfig(path, namespace=namespace, server=self.url)

    def fail_next(self, method: str | None, path: str, status: int | None = 500,
                  count: int = 1, *, delay: float = 0.0,
                  disconnect: bool = False) -> Fault:  # fmt: skip
        fault = Fault(method, path, status, count, delay, disconnect)
        with self._lock:
            self._faults.append(fault)
        return fault

    def requests(self, method: str | None = None, path: str | None = None) -> list[SeenRequest]:
        """The requests seen so far, by method and path (a regex, searched)."""
        with self._lock:
            return [r for r in self._seen
                    if (method is None or r.method == method.upper())
                    and (path is None or re.search(path, r.path))]  # fmt: skip

    def clear_requests(self) -> None:
        with self._lock:
            self._seen.clear()

    def end_watches(self) -> None:
        """End every open watch stream (clients reconnect from their resourceVersion)."""
        loop = self._loop
        if loop is None:
            return

        def close() -> None:
            for upstream in list(self._watches):
                upstream.close()

        loop.call_soon_threadsafe(close)

    # -- the proxy --------------------------------------------------------------------------

    def _fault_for(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.matches(method, path):
                    fault.hits += 1
                    return fault
        return None

    async def _handle(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        raw = await request.read()
        content_type = request.headers.get("Content-Type", "")
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        with self._lock:
            self._seen.append(SeenRequest(request.method, request.path, dict(request.query),
                                          body, content_type))  # fmt: skip
        fault = self._fault_for(request.method, request.path)
        if fault is not None:
            await asyncio.sleep(fault.delay)  # a client that gives up cancels us here
            if fault.disconnect:
                if request.transport is not None:
                    request.transport.close()
                raise ConnectionResetError("fault: connection lost")
            if fault.status is not None:
                status = {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                          "message": f"injected fault: HTTP {fault.status}",
                          "reason": "InternalError" if fault.status >= 500 else "Conflict",
                          "code": fault.status}  # fmt: skip
                return aiohttp.web.json_response(status, status=fault.status)
        return await self._forward(request, raw)

    async def _forward(self, request: aiohttp.web.Request,
                       raw: bytes) -> aiohttp.web.StreamResponse:  # fmt: skip
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        session = self._token_session if "Authorization" in headers else self._admin_session
        # skip_auto_headers: a body sent without Content-Type (the kubernetes client does
        # that for JSON) must reach the server without one, not as application/octet-stream
        upstream = await session.request(request.method, self.kube.plane.server + request.path_qs,
                                         data=raw or None, headers=headers,
                                         skip_auto_headers=("Content-Type",),
                                         timeout=aiohttp.ClientTimeout(total=None))  # fmt: skip
        watch = request.query.get("watch") in ("1", "true")
        reply = aiohttp.web.StreamResponse(status=upstream.status, headers={
            k: v for k, v in upstream.headers.items() if k.lower() not in _HOP})  # fmt: skip
        await reply.prepare(request)
        if watch:
            self._watches.add(upstream)
        try:
            async for chunk in upstream.content.iter_any():
                await reply.write(chunk)
        except (aiohttp.ClientError, ConnectionError):
            pass  # ended by end_watches, or by the server
        finally:
            self._watches.discard(upstream)
            upstream.release()
        with contextlib.suppress(ConnectionError):
            await reply.write_eof()
        return reply

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        admin = ssl.create_default_context(cafile=str(self.kube.plane.pki.ca))
        admin.load_cert_chain(*map(str, self.kube.plane.pki.admin))
        bare = ssl.create_default_context(cafile=str(self.kube.plane.pki.ca))
        self._admin_session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=admin))
        self._token_session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=bare))
        app = aiohttp.web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = aiohttp.web.AppRunner(app, handle_signals=False)
        await runner.setup()
        await aiohttp.web.TCPSite(runner, "127.0.0.1", self.port).start()
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            for upstream in list(self._watches):
                upstream.close()
            await runner.cleanup()
            await self._admin_session.close()
            await self._token_session.close()


@contextlib.contextmanager
def proxied(kube: Kube) -> Iterator[FaultProxy]:
    """A started proxy in front of ``kube``'s control plane."""
    with FaultProxy(kube) as proxy:
        yield proxy
