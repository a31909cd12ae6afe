"""One kind of object kept in memory by a watch: one LIST, then WATCHes that resume where
the last one left off (what client-go's informers do).

LIST once (from the API server's watch cache, ``resourceVersion=0``), then WATCH from that
list's ``resourceVersion``, asking for bookmarks so that the version stays fresh while
nothing changes. When a watch ends (the server's ``timeoutSeconds``, a dropped connection, a
restarted API server), the next one resumes from the last version seen: no LIST. Only when
the server no longer has that version (``410 Gone``, or an ``ERROR`` event with code 410) is
the list taken again. In steady state: one long-lived request per informer, renewed every
``watch_s``.

Each object is kept as what ``convert`` makes of it (a few fields, not the object: the
memory stays what the caller needs); ``convert`` returning None drops it. The watch runs on
a thread of its own; :meth:`Informer.values` returns what it holds now and never blocks. A
failing watch keeps the last state and says so once in the log; :attr:`Informer.failure`
tells the caller, who decides whether a stale state is good enough.

Used by the node agent (its node's pods, :mod:`unthrottle.agent.podwatch`) and by the
operator (the workloads, ReplicaSets and pods of the namespaces it watches,
:mod:`unthrottle.kube.watched`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

import urllib3

log = logging.getLogger("unthrottle.kube")

V = TypeVar("V")


class Gone(Exception):
    """The resourceVersion to resume from is no longer kept by the server (410)."""


def one_attempt(api: Any) -> None:
    """A list is one request: no retry inside it. urllib3 retries a GET that timed out
    three times by default, so a hung API server held a list for 4 × ``timeout_s``
    (measured behind a proxy that answered late: 2.0 s at 0.5 s). An informer lists or
    watches again itself, and keeps its last state meanwhile. A client without urllib3's
    pool manager (another kind of ``api``) is left as it is."""
    rest = getattr(getattr(api, "api_client", None), "rest_client", None)
    pools = getattr(rest, "pool_manager", None)
    if pools is not None and isinstance(getattr(pools, "connection_pool_kw", None), dict):
        pools.connection_pool_kw["retries"] = urllib3.Retry(total=0)
        pools.clear()  # pools made before now would keep their retries


def by_name(obj: dict[str, Any]) -> tuple[str, str]:
    """An object's key: its namespace and name."""
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


class Informer(Generic[V]):
    """Objects of one list call, kept by a LIST then resumed WATCHes (module doc).

    ``call`` is a ``kubernetes.client`` list method, bound to its namespace when it has
    one (``functools.partial(apps.list_namespaced_deployment, "shop")``); ``params`` are
    its selectors (``field_selector=...``)."""

    def __init__(self, call: Callable[..., Any], convert: Callable[[dict[str, Any]], V | None],
                 *, name: str, key: Callable[[dict[str, Any]], Hashable] = by_name,
                 params: dict[str, str] | None = None, timeout_s: float = 10.0,
                 watch_s: int = 300, backoff_max_s: float = 30.0) -> None:  # fmt: skip
        self.call = call
        self.convert = convert
        self.name = name
        """What is watched, for the log ("pods of node-1", "deployments in shop")."""
        self.key = key
        self.params = dict(params or {})
        self.timeout_s = timeout_s
        """Connect timeout, and read timeout of the LIST, s; a watch waits ``watch_s`` plus
        this for its next line (bookmarks come about every minute)."""
        self.watch_s = watch_s
        """The server ends each watch after this long, s (``timeoutSeconds``); the next one
        resumes from the last resourceVersion."""
        self.backoff_max_s = backoff_max_s
        """After a failure, the next try waits 1 s, doubling up to this, s."""
        self.resource_version = ""
        self.lists = 0
        """LISTs taken: 1, plus one per 410 Gone."""
        self.watches = 0
        """WATCH requests made."""
        self.failure: str | None = None
        """Why the last list or watch failed, while it has not worked again; None: fine."""
        self._items: dict[Hashable, V] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._response: Any = None
        self._thread = threading.Thread(target=self._run, name=f"watch {name}", daemon=True)

    # -- the caller's side -----------------------------------------------------------------

    def start(self, *, wait_s: float = 0.0) -> Informer[V]:
        """Start watching; wait up to ``wait_s`` for the first list."""
        self._thread.start()
        self._synced.wait(wait_s)
        return self

    def wait_synced(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the first list; whether it has arrived."""
        return self._synced.wait(timeout_s)

    def values(self) -> list[V]:
        """What is held now (never raises, never waits)."""
        with self._lock:
            return list(self._items.values())

    def items(self) -> list[tuple[Hashable, V]]:
        """What is held now, by key (never raises, never waits)."""
        with self._lock:
            return list(self._items.items())

    @property
    def synced(self) -> bool:
        """Whether the first list has arrived."""
        return self._synced.is_set()

    def close(self) -> None:
        """Stop watching (the open watch is cut; the thread ends within a moment)."""
        self._stop.set()
        response = self._response
        if response is not None:
            # The watch thread is blocked reading this response, holding its buffer's lock,
            # and closing the response waits for that lock: until the next line comes (a
            # bookmark, about a minute). Shutting the socket down ends the read at once.
            sock = getattr(getattr(response, "connection", None), "sock", None)
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            # closing a connection that the watch thread reads from: it may say so
            with contextlib.suppress(Exception):
                response.close()
        if self._thread.is_alive():
            self._thread.join(self.timeout_s)

    # -- the watch thread ------------------------------------------------------------------

    def _run(self) -> None:
        delay = 1.0
        while not self._stop.is_set():
            try:
                if not self.resource_version:
                    self._list()
                began = time.monotonic()
                self._watch()
                delay = 1.0
                self._recovered()
                if time.monotonic() - began < 1.0:  # ended at once: no tight loop
                    self._stop.wait(1.0)
            except Gone:
                log.info("watch of %s: resourceVersion %s is gone; listing again", self.name,
                         self.resource_version)  # fmt: skip
                self.resource_version = ""
            except Exception as err:  # the API client raises many kinds
                if self._stop.is_set():
                    return
                if self.failure is None:
                    log.error("cannot watch %s from the API (%s); keeping the last state, "
                              "retrying", self.name, err)  # fmt: skip
                self.failure = str(err) or type(err).__name__
                self._stop.wait(delay)
                delay = min(self.backoff_max_s, delay * 2)

    def _recovered(self) -> None:
        if self.failure is not None:
            log.info("watch of %s works again", self.name)
        self.failure = None

    def _list(self) -> None:
        """Every object from the server's cache (resourceVersion 0), and the version to
        watch from."""
        from kubernetes.client.exceptions import ApiException

        try:
            reply = self.call(
                resource_version="0", _preload_content=False,
                _request_timeout=(self.timeout_s, self.timeout_s), **self.params,
            )  # fmt: skip
        except ApiException as err:
            raise RuntimeError(f"list: {err.status} {err.reason}") from None
        body = json.loads(reply.data)
        self.lists += 1
        items: dict[Hashable, V] = {}
        for obj in body.get("items") or []:
            value = self.convert(obj)
            if value is not None:
                items[self.key(obj)] = value
        with self._lock:
            self._items = items
        self.resource_version = str((body.get("metadata") or {}).get("resourceVersion") or "")
        self._synced.set()
        self._recovered()

    def _watch(self) -> None:
        """One WATCH from ``resource_version`` until the server ends it (or a stop)."""
        from kubernetes.client.exceptions import ApiException
        from kubernetes.watch.watch import iter_resp_lines

        self.watches += 1
        try:
            self._response = self.call(
                watch=True, resource_version=self.resource_version,
                allow_watch_bookmarks=True, timeout_seconds=self.watch_s,
                _preload_content=False,
                _request_timeout=(self.timeout_s, self.watch_s + self.timeout_s), **self.params,
            )  # fmt: skip
        except ApiException as err:
            if err.status == 410:
                raise Gone from None
            raise RuntimeError(f"watch: {err.status} {err.reason}") from None
        self._recovered()  # the server took the watch: what comes now is current
        try:
            for line in iter_resp_lines(self._response):  # type: ignore[no-untyped-call]
                if self._stop.is_set():
                    return
                if line:
                    self._event(json.loads(line))
        finally:
            response, self._response = self._response, None
            if response is not None:
                response.release_conn()

    def _event(self, event: dict[str, Any]) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone
            raise RuntimeError(f"watch: {obj.get('code')} {obj.get('message')}")
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if kind != "BOOKMARK":
            key = self.key(obj)
            value = None if kind == "DELETED" else self.convert(obj)
            with self._lock:
                if value is None:
                    self._items.pop(key, None)
                else:
                    self._items[key] = value
        if version:
            self.resource_version = str(version)
