"""The operator's workload store, fed by watches, against the real API server (its requests
through a recording proxy): it follows the namespace with one LIST per resource, and a
store whose watch fails says so instead of serving a stale state."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from kube import Kube
from kube_faults import FaultProxy
from realistic import deployment
from unthrottle.kube.watched import WatchedWorkloadStore, WatchStale
from unthrottle.model.owners import DEPLOYMENT
from unthrottle.scan import ClusterError, ScanRequest, select

DEPLOYMENTS = "apps/v1/deployments"
T = TypeVar("T")


@pytest.fixture
def watched(kube: Kube, tmp_path: Path) -> Iterator[tuple[WatchedWorkloadStore, FaultProxy]]:
    """The store as the operator makes it for one namespace, its requests through a proxy."""
    from kubernetes import client

    with FaultProxy(kube) as proxy:
        api = kube.api_client(proxy.kubeconfig(tmp_path / "kc"))
        store = WatchedWorkloadStore(client.CoreV1Api(api), client.AppsV1Api(api),
                                     namespaces=(kube.namespace,), timeout_s=5)  # fmt: skip
        try:
            yield store, proxy
        finally:
            store.close()


def _lists(proxy: FaultProxy, ns: str) -> dict[str, int]:
    """The proxy's LISTs (not WATCHes) of the namespace's Deployments, ReplicaSets, pods."""
    out = {"deployments": 0, "replicasets": 0, "pods": 0}
    for r in proxy.requests("GET", rf"/namespaces/{ns}/(deployments|replicasets|pods)$"):
        if not r.params.get("watch"):
            out[r.path.rsplit("/", 1)[1]] += 1
    return out


def _until(what: str, read: Callable[[], T], check: Callable[[T], bool], wait_s: float = 20) -> T:
    deadline = time.monotonic() + wait_s
    found = read()
    while not check(found):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} never matched: {found}")
        time.sleep(0.1)
        found = read()
    return found


def test_the_store_follows_the_namespace_with_one_list_per_resource(
    kube: Kube, watched: tuple[WatchedWorkloadStore, FaultProxy]
) -> None:
    """Created, rolled out, scaled and deleted Deployments reach the store through its
    watches; however many reads, one LIST each of Deployments, ReplicaSets and pods."""
    store, proxy = watched
    ns = kube.namespace
    kube.create(DEPLOYMENTS, deployment(ns, "checkout"))
    first = kube.replicaset_of(kube.rolled_out(ns, "checkout"))
    assert [d.name for d in store.deployments([ns])] == ["checkout"]
    kube.create(DEPLOYMENTS, deployment(ns, "cart", replicas=1))
    kube.patch(DEPLOYMENTS, ns, "checkout", {"spec": {"template": {"metadata": {
        "annotations": {"restarted": "1"}}}}})  # fmt: skip
    second = kube.replicaset_of(kube.rolled_out(ns, "checkout"))
    cart = kube.replicaset_of(kube.rolled_out(ns, "cart"))
    live = {p["metadata"]["name"] for p in kube.pods_of(second)}

    def owners() -> dict[tuple[str, str], str]:
        return store.pod_owners([ns], (DEPLOYMENT,)).pods

    expected = {(ns, p["metadata"]["name"]): "cart" for p in kube.pods_of(cart)}
    expected |= {(ns, pod): "checkout" for pod in live}
    _until("the pods of both", owners, lambda found: found == expected)
    replica_sets = store.pod_owners([ns]).replicasets
    assert replica_sets[(ns, first["metadata"]["name"])] == "checkout"  # the old one, kept
    assert replica_sets[(ns, cart["metadata"]["name"])] == "cart"
    kube.delete(DEPLOYMENTS, ns, "cart")
    _until("cart gone", lambda: sorted(d.name for d in store.deployments([ns])),
           lambda names: names == ["checkout"])  # fmt: skip
    for _ in range(20):  # a reconcile's reads, many times over: memory, no request
        store.deployments([ns])
        store.pod_owners([ns])
    assert _lists(proxy, ns) == {"deployments": 1, "replicasets": 1, "pods": 1}
    assert store.requests[0] == 3
    # the object kept is the object, less the server's field owners
    (info,) = store.deployments([ns])
    assert info.raw["kind"] == "Deployment" and "managedFields" not in info.raw["metadata"]
    served = kube.get(DEPLOYMENTS, ns, "checkout")
    assert served is not None and served["metadata"]["managedFields"]
    assert info.raw["metadata"]["resourceVersion"] == served["metadata"]["resourceVersion"]


def test_a_dropped_watch_resumes_without_a_list_and_a_failing_one_fails_the_read(
    kube: Kube, watched: tuple[WatchedWorkloadStore, FaultProxy]
) -> None:
    store, proxy = watched
    ns = kube.namespace
    kube.create(DEPLOYMENTS, deployment(ns, "checkout", replicas=1))
    assert [d.name for d in store.deployments([ns])] == ["checkout"]
    proxy.end_watches()  # the connection drops (an API server restarts, a proxy)
    kube.create(DEPLOYMENTS, deployment(ns, "cart", replicas=1))
    _until("cart", lambda: sorted(d.name for d in store.deployments([ns])),
           lambda names: names == ["cart", "checkout"])  # fmt: skip
    assert _lists(proxy, ns)["deployments"] == 1  # resumed from its resourceVersion
    # the API server stops answering the watch: the store says so, it does not serve the
    # last state as if it were current; a scan over it is the operator's ApiUnavailable
    proxy.fail_next("GET", rf"/namespaces/{ns}/deployments$", status=503, count=3)
    proxy.end_watches()
    with pytest.raises(WatchStale, match=rf"deployments in {ns}.*503"):
        _until("the failure seen", lambda: store.deployments([ns]), lambda _: False, wait_s=10)
    request = ScanRequest(window_s=3600, now=time.time(), namespaces=(ns,))
    with pytest.raises(ClusterError, match="Deployments from the Kubernetes API"):
        select(request, store, None)  # type: ignore[arg-type]  # no metrics are read
    # the watch works again (after its back-off): so does the store, and it has followed
    kube.delete(DEPLOYMENTS, ns, "cart")
    found = _until("the store back", lambda: _read(store, ns), lambda names: names == ["checkout"])
    assert found == ["checkout"]


def _read(store: WatchedWorkloadStore, ns: str) -> list[str] | None:
    try:
        return sorted(d.name for d in store.deployments([ns]))
    except WatchStale:
        return None


def test_closing_the_store_ends_its_open_watches_at_once(
    kube: Kube, watched: tuple[WatchedWorkloadStore, FaultProxy]
) -> None:
    """An operator or agent that stops lets go of its watches at once, not when the server
    next writes to them (a bookmark, about a minute later): each watch thread is blocked
    reading an idle stream when ``close`` comes."""
    store, _ = watched
    ns = kube.namespace
    kube.create(DEPLOYMENTS, deployment(ns, "checkout"))
    kube.rolled_out(ns, "checkout")
    store.deployments([ns])
    store.pod_owners([ns], (DEPLOYMENT,))
    informers = list(store.informers.values())
    assert len(informers) == 3
    time.sleep(1.0)  # every watch open and idle
    started = time.monotonic()
    store.close()
    took = time.monotonic() - started
    alive = [i.name for i in informers if i._thread.is_alive()]
    assert not alive, f"still watching after close: {alive}"
    assert took < 5.0, f"closing three idle watches took {took:.1f} s"
