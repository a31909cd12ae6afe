"""This node's pods, kept by a watch: one LIST, then a WATCH that resumes where it left off.

The agent used to LIST its node's pods at every rediscovery (5 s): on 1,000 nodes about 200
LISTs a second against the API server, each one a pass over every pod the server's cache
holds. A kubelet does what :class:`WatchedPods` does: LIST once (``spec.nodeName``, from the
server's cache), then WATCH with the same field selector from that list's
``resourceVersion``, asking for bookmarks so that the version stays fresh while nothing
changes; a re-list only on ``410 Gone`` (:class:`unthrottle.kube.informer.Informer`). In
steady state: one long-lived request per node, renewed every ``watch_s``.

:meth:`WatchedPods.pods` returns what it holds now and never blocks, so an API outage keeps
the last state (said once in the log), as :class:`~unthrottle.agent.naming.CachedPods` does
for lists.
"""

from __future__ import annotations

from typing import Any

from unthrottle.agent.naming import PodInfo, pod_info
from unthrottle.kube.informer import Informer, one_attempt


def _uid(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


class WatchedPods(Informer[PodInfo]):
    """The pods bound to ``node_name``, kept by a LIST then a resumed WATCH (module doc)."""

    def __init__(self, api: Any, node_name: str, *, timeout_s: float = 10.0,
                 watch_s: int = 300, backoff_max_s: float = 30.0) -> None:  # fmt: skip
        self.node_name = node_name

        def on_node(obj: dict[str, Any]) -> PodInfo | None:
            # a pod bound elsewhere (or moved off this node) is dropped
            return pod_info(obj) if (obj.get("spec") or {}).get("nodeName") == node_name else None

        one_attempt(api)
        super().__init__(api.list_pod_for_all_namespaces, on_node, name=f"pods of {node_name}",
                         key=_uid, params={"field_selector": f"spec.nodeName={node_name}"},
                         timeout_s=timeout_s, watch_s=watch_s,
                         backoff_max_s=backoff_max_s)  # fmt: skip

    def pods(self) -> list[PodInfo]:
        """The node's pods as last seen (never raises, never waits)."""
        return self.values()
