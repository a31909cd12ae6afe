"""This node's pods, kept by a watch: one LIST, then a WATCH that resumes where it left off.

The agent used to LIST its node's pods at every rediscovery (5 s): on 1,000 nodes about 200
LISTs a second against the API server, each one a pass over every pod the server's cache
holds. A kubelet does what :class:`WatchedPods` does: LIST once (``spec.nodeName``, from the
server's cache), then WATCH with the same field selector from that list's
``resourceVersion``, asking for bookmarks so that the version stays fresh while nothing
changes. When a watch ends (the server's ``timeoutSeconds``, a dropped connection, a
restarted API server), the next one resumes from the last version seen: no LIST. Only when
the server no longer has that version (``410 Gone``, an ``ERROR`` event with code 410) is
the node's list taken again. In steady state: one long-lived request per node, renewed
every ``watch_s``.

The watch runs on a thread of its own; :meth:`WatchedPods.pods` returns what it holds now
and never blocks, so an API outage keeps the last state (said once in the log), as
:class:`~unthrottle.agent.naming.CachedPods` does for lists.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from typing import Any

from unthrottle.agent.naming import PodInfo, _one_attempt, pod_info

log = logging.getLogger("unthrottle.agent")


class Gone(Exception):
    """The resourceVersion to resume from is no longer kept by the server (410)."""


class WatchedPods:
    """The pods bound to ``node_name``, kept by a LIST then a resumed WATCH (module doc)."""

    def __init__(self, api: Any, node_name: str, *, timeout_s: float = 10.0,
                 watch_s: int = 300, backoff_max_s: float = 30.0) -> None:  # fmt: skip
        self.api = api
        self.node_name = node_name
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
        self._pods: dict[str, PodInfo] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._response: Any = None
        self._failing = False
        self._thread = threading.Thread(target=self._run, name="pod-watch", daemon=True)
        _one_attempt(api)

    # -- the agent's side ------------------------------------------------------------------

    def start(self, *, wait_s: float = 0.0) -> WatchedPods:
        """Start watching; wait up to ``wait_s`` for the first list."""
        self._thread.start()
        self._synced.wait(wait_s)
        return self

    def pods(self) -> list[PodInfo]:
        """The node's pods as last seen (never raises, never waits)."""
        with self._lock:
            return list(self._pods.values())

    @property
    def synced(self) -> bool:
        """Whether the first list has arrived."""
        return self._synced.is_set()

    def close(self) -> None:
        """Stop watching (the open watch is cut; the thread ends within a moment)."""
        self._stop.set()
        response = self._response
        if response is not None:
            # closing a connection that the watch thread reads from: it may say so
            with contextlib.suppress(Exception):
                response.close()
        self._thread.join(self.timeout_s)

    # -- the watch thread ------------------------------------------------------------------

    def _selector(self) -> str:
        return f"spec.nodeName={self.node_name}"

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
                log.info("pod watch: resourceVersion %s is gone; listing again",
                         self.resource_version)  # fmt: skip
                self.resource_version = ""
            except Exception as err:  # the API client raises many kinds
                if self._stop.is_set():
                    return
                if not self._failing:
                    log.error("cannot watch pods from the API (%s); keeping the last state, "
                              "retrying", err)  # fmt: skip
                self._failing = True
                self._stop.wait(delay)
                delay = min(self.backoff_max_s, delay * 2)

    def _recovered(self) -> None:
        if self._failing:
            log.info("pod watch works again")
        self._failing = False

    def _list(self) -> None:
        """The node's pods from the server's cache (resourceVersion 0), and the version to
        watch from."""
        from kubernetes.client.exceptions import ApiException

        try:
            reply = self.api.list_pod_for_all_namespaces(
                field_selector=self._selector(), resource_version="0",
                _preload_content=False, _request_timeout=(self.timeout_s, self.timeout_s),
            )  # fmt: skip
        except ApiException as err:
            raise RuntimeError(f"list: {err.status} {err.reason}") from None
        body = json.loads(reply.data)
        self.lists += 1
        pods = {}
        for item in body.get("items", []):
            if (item.get("spec") or {}).get("nodeName") == self.node_name:
                info = pod_info(item)
                pods[info.uid] = info
        with self._lock:
            self._pods = pods
        self.resource_version = str((body.get("metadata") or {}).get("resourceVersion") or "")
        self._synced.set()
        self._recovered()

    def _watch(self) -> None:
        """One WATCH from ``resource_version`` until the server ends it (or a stop)."""
        from kubernetes.client.exceptions import ApiException
        from kubernetes.watch.watch import iter_resp_lines

        self.watches += 1
        try:
            self._response = self.api.list_pod_for_all_namespaces(
                field_selector=self._selector(), watch=True,
                resource_version=self.resource_version, allow_watch_bookmarks=True,
                timeout_seconds=self.watch_s, _preload_content=False,
                _request_timeout=(self.timeout_s, self.watch_s + self.timeout_s),
            )  # fmt: skip
        except ApiException as err:
            if err.status == 410:
                raise Gone from None
            raise RuntimeError(f"watch: {err.status} {err.reason}") from None
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
            info = pod_info(obj)
            with self._lock:
                if kind == "DELETED" or (obj.get("spec") or {}).get("nodeName") != self.node_name:
                    self._pods.pop(info.uid, None)
                else:
                    self._pods[info.uid] = info
        if version:
            self.resource_version = str(version)
