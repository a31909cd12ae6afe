"""The Kubernetes API emulator answers as a real API server would, to the real client and Kopf.

Every test talks HTTP to the emulator on its real port: through the ``kubernetes`` client
(configured from the kubeconfig file the emulator writes) or plain urllib where the client
cannot send what is tested. The last tests run a real ``kopf run`` against it.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from kube_emulator import KubeEmulator
from unthrottle.devtools.processes import stop

TPOL = "unthrottle.io/v1alpha1/throttlepolicies"
DEPLOY = "apps/v1/deployments"
TPOL_URL = "/apis/unthrottle.io/v1alpha1/namespaces/shop/throttlepolicies"
DEPLOY_URL = "/apis/apps/v1/namespaces/shop/deployments"
KOPF = Path(sys.executable).parent / "kopf"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


@pytest.fixture
def kube() -> Iterator[KubeEmulator]:
    with KubeEmulator() as emulator:
        yield emulator


@pytest.fixture
def api(kube: KubeEmulator, tmp_path: Path) -> client.ApiClient:
    return kube.api_client(kube.kubeconfig(tmp_path / "kubeconfig"))


@pytest.fixture
def apps(api: client.ApiClient) -> client.AppsV1Api:
    return client.AppsV1Api(api)


@pytest.fixture
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


@pytest.fixture
def custom(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


def http(
    kube: KubeEmulator,
    method: str,
    path: str,
    body: Any = None,
    content_type: str = "application/json",
) -> tuple[int, Any]:
    """A request without the client's retries or serialisation: (status, decoded JSON)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        kube.url + path, data=data, method=method, headers={"Content-Type": content_type}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def refused(e: pytest.ExceptionInfo[ApiException]) -> tuple[int, str]:
    """The status code and the Status reason of an API error."""
    return e.value.status, json.loads(e.value.body)["reason"]


def deployment(name: str = "web", replicas: int = 2, **meta: Any) -> dict[str, Any]:
    containers = [
        {"name": "app", "image": "app:1", "env": [{"name": "A", "value": "1"}]},
        {"name": "envoy", "image": "envoy:1"},
    ]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, **meta},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": containers}},
        },
    }


def policy(name: str = "p", **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "unthrottle.io/v1alpha1",
        "kind": "ThrottlePolicy",
        "metadata": {"name": name, "namespace": "shop", **meta},
        "spec": {"headroom": 1.2},
    }


# ----------------------------------------------------------------------------- identity


def test_a_created_object_gets_uid_timestamp_generation_and_a_growing_resource_version(
    apps: client.AppsV1Api,
) -> None:
    first = apps.create_namespaced_deployment("shop", deployment("a"))
    second = apps.create_namespaced_deployment("shop", deployment("b"))
    assert first.metadata.namespace == "shop"  # from the URL
    assert first.metadata.uid and first.metadata.uid != second.metadata.uid
    assert first.metadata.creation_timestamp is not None
    assert first.metadata.generation == 1
    assert int(second.metadata.resource_version) > int(first.metadata.resource_version)
    assert first.spec.strategy.type == "RollingUpdate"  # defaulted, as a real server does


@pytest.mark.parametrize(
    ("patch", "to_status", "generation_step"),
    [
        ({"spec": {"replicas": 3}}, False, 1),
        ({"metadata": {"labels": {"team": "a"}}}, False, 0),
        ({"metadata": {"annotations": {"note": "x"}}}, False, 0),
        ({"status": {"replicas": 2}}, True, 0),
    ],
    ids=[
        "a spec change bumps it",
        "a label does not",
        "an annotation does not",
        "a status write does not",
    ],
)
def test_generation_moves_with_the_spec_only_and_every_write_moves_the_resource_version(
    apps: client.AppsV1Api, patch: dict[str, Any], to_status: bool, generation_step: int
) -> None:
    before = apps.create_namespaced_deployment("shop", deployment())
    write = (
        apps.patch_namespaced_deployment_status if to_status else apps.patch_namespaced_deployment
    )
    after = write("web", "shop", patch)
    assert after.metadata.generation == before.metadata.generation + generation_step
    assert int(after.metadata.resource_version) > int(before.metadata.resource_version)


def test_a_patch_that_changes_nothing_writes_nothing(apps: client.AppsV1Api) -> None:
    before = apps.create_namespaced_deployment("shop", deployment(replicas=2))
    after = apps.patch_namespaced_deployment("web", "shop", {"spec": {"replicas": 2}})
    assert after.metadata.resource_version == before.metadata.resource_version


# ----------------------------------------------------------------------------- conflicts


@pytest.mark.parametrize(
    "how",
    ["replace", "merge patch", "status replace"],
    ids=[
        "a PUT with a stale resourceVersion",
        "a merge patch carrying a stale one",
        "a status PUT with a stale one",
    ],
)
def test_a_stale_resource_version_is_a_conflict_and_changes_nothing(
    kube: KubeEmulator, apps: client.AppsV1Api, how: str
) -> None:
    stale = apps.create_namespaced_deployment("shop", deployment())
    apps.patch_namespaced_deployment("web", "shop", {"spec": {"replicas": 5}})  # someone else
    stale.spec.replicas = 9
    with pytest.raises(ApiException) as e:
        if how == "replace":
            apps.replace_namespaced_deployment("web", "shop", stale)
        elif how == "status replace":
            apps.replace_namespaced_deployment_status("web", "shop", stale)
        else:
            rv = stale.metadata.resource_version
            patch = {"metadata": {"resourceVersion": rv}, "spec": {"replicas": 9}}
            apps.patch_namespaced_deployment("web", "shop", patch)
    assert refused(e) == (409, "Conflict")
    assert kube.get(DEPLOY, "shop", "web")["spec"]["replicas"] == 5  # type: ignore[index]


def test_a_put_without_a_resource_version_is_an_unconditional_update(
    kube: KubeEmulator,
) -> None:
    kube.put(DEPLOY, deployment(namespace="shop"))
    status, body = http(kube, "PUT", f"{DEPLOY_URL}/web", deployment(replicas=7))
    assert status == 200 and body["spec"]["replicas"] == 7
    assert body["metadata"]["generation"] == 2


def test_creating_an_existing_name_is_already_exists(apps: client.AppsV1Api) -> None:
    apps.create_namespaced_deployment("shop", deployment())
    with pytest.raises(ApiException) as e:
        apps.create_namespaced_deployment("shop", deployment())
    assert refused(e) == (409, "AlreadyExists")


@pytest.mark.parametrize(
    ("method", "path", "body", "content_type"),
    [
        ("GET", "/api/v1/namespaces/shop/configmaps/nope", None, "application/json"),
        ("PATCH", "/api/v1/namespaces/shop/configmaps/nope", {"data": {}}, MERGE),
        (
            "PUT",
            "/api/v1/namespaces/shop/configmaps/nope",
            {"metadata": {"name": "nope"}},
            "application/json",
        ),
        ("DELETE", "/api/v1/namespaces/shop/configmaps/nope", None, "application/json"),
        ("GET", f"{TPOL_URL}/nope/status", None, "application/json"),
    ],
    ids=["get", "patch", "put", "delete", "get status"],
)
def test_a_missing_object_is_404_with_a_status_body(
    kube: KubeEmulator, method: str, path: str, body: Any, content_type: str
) -> None:
    status, answer = http(kube, method, path, body, content_type)
    assert status == 404
    assert answer["kind"] == "Status" and answer["reason"] == "NotFound"
    assert answer["details"]["name"] == "nope" and answer["code"] == 404


# ----------------------------------------------------------------------------- patches


def test_a_failed_json_patch_test_is_422_and_applies_nothing(kube: KubeEmulator) -> None:
    before = kube.put(TPOL, policy())
    ops = [
        {"op": "replace", "path": "/spec/headroom", "value": 9},
        {"op": "test", "path": "/metadata/resourceVersion", "value": "1"},
    ]
    status, answer = http(kube, "PATCH", f"{TPOL_URL}/p", ops, JSON_PATCH)
    assert (status, answer["reason"]) == (422, "Invalid")
    assert kube.get(TPOL, "shop", "p") == before  # not even the op before the test


def test_a_json_patch_whose_test_holds_is_applied(kube: KubeEmulator) -> None:
    rv = kube.put(TPOL, policy())["metadata"]["resourceVersion"]
    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
        {"op": "add", "path": "/metadata/finalizers", "value": ["x/y"]},
    ]
    status, answer = http(kube, "PATCH", f"{TPOL_URL}/p", ops, JSON_PATCH)
    assert status == 200 and answer["metadata"]["finalizers"] == ["x/y"]


def test_a_strategic_merge_patch_merges_containers_and_env_by_name(
    kube: KubeEmulator, apps: client.AppsV1Api
) -> None:
    apps.create_namespaced_deployment("shop", deployment())
    containers = [
        {
            "name": "app",
            "env": [{"name": "B", "value": "2"}],
            "resources": {"limits": {"cpu": "500m"}},
        }
    ]
    apps.patch_namespaced_deployment(
        "web", "shop", {"spec": {"template": {"spec": {"containers": containers}}}}
    )
    (sent,) = kube.requests("PATCH", "/deployments/web$")
    assert sent.content_type == STRATEGIC  # what the client sends for a dict
    got = kube.get(DEPLOY, "shop", "web")["spec"]["template"]["spec"]["containers"]  # type: ignore[index]
    assert [c["name"] for c in got] == ["app", "envoy"]  # the sidecar is kept
    assert got[0]["image"] == "app:1" and got[0]["resources"] == {"limits": {"cpu": "500m"}}
    assert got[0]["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]


def test_a_strategic_merge_patch_deletes_an_item_by_name(kube: KubeEmulator) -> None:
    kube.put(DEPLOY, deployment(namespace="shop"))
    patch = {
        "spec": {"template": {"spec": {"containers": [{"name": "envoy", "$patch": "delete"}]}}}
    }
    status, body = http(kube, "PATCH", f"{DEPLOY_URL}/web", patch, STRATEGIC)
    assert status == 200
    assert [c["name"] for c in body["spec"]["template"]["spec"]["containers"]] == ["app"]


def test_a_merge_patch_replaces_lists_whole(kube: KubeEmulator) -> None:
    kube.put(DEPLOY, deployment(namespace="shop"))
    patch = {"spec": {"template": {"spec": {"containers": [{"name": "app", "image": "app:2"}]}}}}
    status, body = http(kube, "PATCH", f"{DEPLOY_URL}/web", patch, MERGE)
    assert status == 200
    assert body["spec"]["template"]["spec"]["containers"] == [{"name": "app", "image": "app:2"}]


@pytest.mark.parametrize(
    ("content_type", "resource_url"),
    [
        (STRATEGIC, TPOL_URL),
        ("application/apply-patch+yaml", DEPLOY_URL),
        ("text/plain", DEPLOY_URL),
    ],
    ids=["strategic merge on a custom resource", "server-side apply", "no patch type"],
)
def test_patch_types_a_server_refuses_are_415(
    kube: KubeEmulator, content_type: str, resource_url: str
) -> None:
    kube.put(TPOL, policy())
    kube.put(DEPLOY, deployment(namespace="shop"))
    name = "p" if resource_url == TPOL_URL else "web"
    status, body = http(kube, "PATCH", f"{resource_url}/{name}", {"spec": {}}, content_type)
    assert (status, body["reason"]) == (415, "UnsupportedMediaType")


# ----------------------------------------------------------------------------- status


@pytest.mark.parametrize(
    ("resource", "url", "name"),
    [(TPOL, TPOL_URL, "p"), (DEPLOY, DEPLOY_URL, "web")],
    ids=["ThrottlePolicy", "Deployment"],
)
@pytest.mark.parametrize("to_status", [False, True], ids=["main object", "/status"])
def test_the_status_subresource_and_the_main_object_change_apart(
    kube: KubeEmulator, resource: str, url: str, name: str, to_status: bool
) -> None:
    kube.put(resource, policy() if resource == TPOL else deployment(namespace="shop"))
    before = kube.patch_status(resource, "shop", name, {"old": True})
    patch = {
        "metadata": {"labels": {"touched": "yes"}},
        "spec": {"replicas": 4},
        "status": {"old": None, "new": True},
    }
    status, _ = http(kube, "PATCH", f"{url}/{name}{'/status' if to_status else ''}", patch, MERGE)
    now = kube.get(resource, "shop", name)
    assert status == 200 and now is not None
    if to_status:  # only status changes; metadata and spec are ignored
        assert now["status"] == {"new": True}
        assert now["spec"] == before["spec"] and "labels" not in now["metadata"]
        assert now["metadata"]["generation"] == before["metadata"]["generation"]
    else:  # status is ignored on the main object
        assert now["status"] == {"old": True}
        assert now["spec"]["replicas"] == 4 and now["metadata"]["labels"] == {"touched": "yes"}
        assert now["metadata"]["generation"] == before["metadata"]["generation"] + 1


def test_status_given_on_create_is_dropped_where_status_is_a_subresource(
    custom: client.CustomObjectsApi,
) -> None:
    body = policy() | {"status": {"forged": True}}
    created = custom.create_namespaced_custom_object(
        "unthrottle.io", "v1alpha1", "shop", "throttlepolicies", body
    )
    assert "status" not in created


# ----------------------------------------------------------------------------- dry run


@pytest.mark.parametrize(
    ("method", "path", "body", "content_type"),
    [
        ("POST", TPOL_URL, {"metadata": {"name": "q"}, "spec": {}}, "application/json"),
        ("PATCH", f"{TPOL_URL}/p", {"spec": {"headroom": 2}}, MERGE),
        (
            "PUT",
            f"{TPOL_URL}/p",
            {"metadata": {"name": "p"}, "spec": {"headroom": 3}},
            "application/json",
        ),
        ("DELETE", f"{TPOL_URL}/p", None, "application/json"),
    ],
    ids=["create", "patch", "replace", "delete"],
)
def test_a_dry_run_answers_as_if_done_and_stores_nothing(
    kube: KubeEmulator, method: str, path: str, body: Any, content_type: str
) -> None:
    kube.put(TPOL, policy())
    before = (kube.list(TPOL), kube.resource_version)
    status, answer = http(kube, method, f"{path}?dryRun=All", body, content_type)
    assert status in (200, 201)
    if method in ("PATCH", "PUT"):
        assert answer["spec"]["headroom"] in (2, 3)
    assert (kube.list(TPOL), kube.resource_version) == before


# ----------------------------------------------------------------------------- lists


@pytest.fixture
def labelled(kube: KubeEmulator) -> KubeEmulator:
    for name, labels in (
        ("front", {"tier": "front", "team": "a"}),
        ("back", {"tier": "back"}),
        ("bare", {}),
    ):
        kube.put(
            "v1/configmaps", {"metadata": {"namespace": "shop", "name": name, "labels": labels}}
        )
    kube.put("v1/configmaps", {"metadata": {"namespace": "other", "name": "front"}})
    return kube


@pytest.mark.parametrize(
    ("selector", "names"),
    [
        ("tier=front", ["front"]),
        ("tier==front", ["front"]),
        ("tier!=front", ["back", "bare"]),
        ("tier in (front,back)", ["back", "front"]),
        ("tier notin (front)", ["back", "bare"]),
        ("tier", ["back", "front"]),
        ("!tier", ["bare"]),
        ("tier=front,team=a", ["front"]),
        ("tier in (back), !team", ["back"]),
    ],
    ids=[
        "equality",
        "double equality",
        "inequality matches the unlabelled",
        "in",
        "notin",
        "exists",
        "does not exist",
        "two requirements",
        "set and absence",
    ],
)
def test_a_label_selector_filters_the_list(
    labelled: KubeEmulator, core: client.CoreV1Api, selector: str, names: list[str]
) -> None:
    listed = core.list_namespaced_config_map("shop", label_selector=selector)
    assert sorted(i.metadata.name for i in listed.items) == names
    assert int(listed.metadata.resource_version) > 0


@pytest.mark.parametrize(
    ("selector", "found"),
    [
        ("metadata.name=front", [("other", "front"), ("shop", "front")]),
        ("metadata.namespace=other", [("other", "front")]),
        ("metadata.name=front,metadata.namespace!=other", [("shop", "front")]),
    ],
    ids=["by name", "by namespace", "by name and not namespace"],
)
def test_a_field_selector_filters_the_list(
    labelled: KubeEmulator, core: client.CoreV1Api, selector: str, found: list[tuple[str, str]]
) -> None:
    listed = core.list_config_map_for_all_namespaces(field_selector=selector)
    assert [(i.metadata.namespace, i.metadata.name) for i in listed.items] == found


def test_a_field_a_real_server_does_not_index_is_refused(labelled: KubeEmulator) -> None:
    status, body = http(labelled, "GET", "/api/v1/configmaps?fieldSelector=data.k%3Dv")
    assert (status, body["reason"]) == (400, "BadRequest")


def test_a_pods_node_is_a_field_selector(kube: KubeEmulator, core: client.CoreV1Api) -> None:
    for name, node in (("a", "n1"), ("b", "n2")):
        kube.put(
            "v1/pods",
            {
                "metadata": {"namespace": "shop", "name": name},
                "spec": {"nodeName": node, "containers": []},
            },
        )
    listed = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=n2")
    assert [p.metadata.name for p in listed.items] == ["b"]


def test_deleting_a_collection_deletes_what_the_selector_selects(
    labelled: KubeEmulator, core: client.CoreV1Api
) -> None:
    core.delete_collection_namespaced_config_map("shop", label_selector="tier")
    left = [
        (c["metadata"]["namespace"], c["metadata"]["name"]) for c in labelled.list("v1/configmaps")
    ]
    assert left == [("other", "front"), ("shop", "bare")]  # other namespaces are not touched


def test_a_list_comes_in_pages_with_limit_and_continue(
    labelled: KubeEmulator, core: client.CoreV1Api
) -> None:
    first = core.list_namespaced_config_map("shop", limit=2)
    rest = core.list_namespaced_config_map("shop", limit=2, _continue=first.metadata._continue)
    assert [i.metadata.name for i in first.items] == ["back", "bare"]
    assert first.metadata.remaining_item_count == 1
    assert [i.metadata.name for i in rest.items] == ["front"] and not rest.metadata._continue


# ----------------------------------------------------------------------------- watches


def events_of(stream: Iterator[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(event["type"], event["object"].metadata.name) for event in stream]


def test_a_watch_from_a_resource_version_gets_only_the_later_changes(
    labelled: KubeEmulator, core: client.CoreV1Api
) -> None:
    rv = core.list_namespaced_config_map("shop").metadata.resource_version
    core.patch_namespaced_config_map("front", "shop", {"data": {"k": "v"}})
    core.delete_namespaced_config_map("back", "shop")
    stream = watch.Watch().stream(
        core.list_namespaced_config_map, "shop", resource_version=rv, timeout_seconds=1
    )
    assert events_of(stream) == [("MODIFIED", "front"), ("DELETED", "back")]  # no replay


def test_a_watch_without_a_resource_version_starts_with_the_objects_then_follows(
    labelled: KubeEmulator, core: client.CoreV1Api
) -> None:
    later = threading.Timer(0.3, lambda: labelled.delete("v1/configmaps", "shop", "bare"))
    later.start()
    try:
        stream = watch.Watch().stream(core.list_namespaced_config_map, "shop", timeout_seconds=1)
        seen = events_of(stream)
    finally:
        later.join()
    assert seen == [("ADDED", "back"), ("ADDED", "bare"), ("ADDED", "front"), ("DELETED", "bare")]


def test_an_object_leaving_a_watched_selector_is_deleted_to_that_watch(
    labelled: KubeEmulator, core: client.CoreV1Api
) -> None:
    rv = labelled.resource_version
    core.patch_namespaced_config_map("back", "shop", {"metadata": {"labels": {"tier": "front"}}})
    core.patch_namespaced_config_map("front", "shop", {"metadata": {"labels": {"tier": None}}})
    stream = watch.Watch().stream(
        core.list_namespaced_config_map,
        "shop",
        resource_version=rv,
        label_selector="tier=front",
        timeout_seconds=1,
    )
    assert events_of(stream) == [("ADDED", "back"), ("DELETED", "front")]


def test_a_watch_ends_after_its_timeout_seconds(kube: KubeEmulator) -> None:
    started = time.monotonic()
    with urllib.request.urlopen(
        f"{kube.url}/api/v1/pods?watch=true&resourceVersion="
        f"{kube.resource_version}&timeoutSeconds=1",
        timeout=10,
    ) as r:
        assert r.read() == b""
    assert 0.9 < time.monotonic() - started < 3


def test_a_watch_from_a_compacted_resource_version_is_told_gone(
    labelled: KubeEmulator, core: client.CoreV1Api
) -> None:
    rv = labelled.resource_version
    labelled.delete("v1/configmaps", "shop", "bare")
    labelled.compact()
    with pytest.raises(ApiException) as e:
        list(
            watch.Watch().stream(
                core.list_namespaced_config_map, "shop", resource_version=rv, timeout_seconds=1
            )
        )
    assert e.value.status == 410


# ----------------------------------------------------------------------------- names


def test_namespaces_are_listed_with_those_objects_live_in(
    kube: KubeEmulator, core: client.CoreV1Api
) -> None:
    kube.put("v1/configmaps", {"metadata": {"namespace": "shop", "name": "a"}})
    kube.create_namespace("empty", labels={"team": "a"})
    names = [n.metadata.name for n in core.list_namespace().items]
    assert names == ["default", "empty", "kube-system", "shop"]
    assert core.read_namespace("shop").status.phase == "Active"
    assert [n.metadata.name for n in core.list_namespace(label_selector="team=a").items] == [
        "empty"
    ]


def test_deleting_a_namespace_deletes_what_is_in_it(
    kube: KubeEmulator, core: client.CoreV1Api
) -> None:
    kube.put("v1/configmaps", {"metadata": {"namespace": "shop", "name": "a"}})
    core.delete_namespace("shop")
    assert kube.get("v1/namespaces", None, "shop") is None
    assert kube.list("v1/configmaps", "shop") == []


def test_generate_name_makes_a_new_unique_name_each_time(core: client.CoreV1Api) -> None:
    body = {
        "metadata": {"generateName": "kopf-event-"},
        "reason": "Seen",
        "involvedObject": {"kind": "ThrottlePolicy", "name": "p"},
    }
    names = {core.create_namespaced_event("shop", body).metadata.name for _ in range(5)}
    assert len(names) == 5 and all(n.startswith("kopf-event-") for n in names)


@pytest.mark.parametrize(
    ("metadata", "code"),
    [
        ({"name": "Not_A_Name"}, 422),
        ({"name": "x", "labels": {"a": "b c"}}, 422),
        ({"name": "x", "annotations": {"a": 1}}, 400),
        ({}, 422),
    ],
    ids=["a bad name", "a bad label value", "a number as an annotation", "no name at all"],
)
def test_metadata_a_real_server_refuses_is_refused(
    kube: KubeEmulator, metadata: dict[str, Any], code: int
) -> None:
    status, _ = http(kube, "POST", "/api/v1/namespaces/shop/configmaps", {"metadata": metadata})
    assert status == code
    assert kube.list("v1/configmaps", "shop") == []


# ----------------------------------------------------------------------------- finalizers


def test_finalizers_hold_a_deleted_object_until_they_are_removed(
    kube: KubeEmulator, custom: client.CustomObjectsApi
) -> None:
    args = ("unthrottle.io", "v1alpha1", "shop", "throttlepolicies", "p")
    kube.put(TPOL, policy(finalizers=["x/y"]))
    custom.delete_namespaced_custom_object(*args)
    held = kube.get(TPOL, "shop", "p")
    assert held is not None and held["metadata"]["deletionTimestamp"]
    status, _ = http(
        kube, "PATCH", f"{TPOL_URL}/p", {"metadata": {"finalizers": ["x/y", "z/w"]}}, MERGE
    )
    assert status == 422  # no new finalizers on an object being deleted
    rv = kube.resource_version
    custom.patch_namespaced_custom_object(*args, {"metadata": {"finalizers": None}})
    assert kube.get(TPOL, "shop", "p") is None
    status, body = http(kube, "GET", f"{TPOL_URL}?watch=true&resourceVersion={rv}&timeoutSeconds=1")
    assert status == 200 and body["type"] == "DELETED"  # one event: the update is never written


def test_an_object_without_finalizers_goes_at_once(kube: KubeEmulator) -> None:
    kube.put(TPOL, policy())
    status, body = http(kube, "DELETE", f"{TPOL_URL}/p")
    assert (status, body["kind"], body["status"]) == (200, "Status", "Success")
    assert kube.get(TPOL, "shop", "p") is None


# ----------------------------------------------------------------------------- controllers


def test_a_completed_rollout_shows_the_generation_observed_and_all_replicas_available(
    kube: KubeEmulator, apps: client.AppsV1Api
) -> None:
    apps.create_namespaced_deployment("shop", deployment(replicas=3))
    apps.patch_namespaced_deployment(
        "web", "shop", {"spec": {"template": {"metadata": {"annotations": {"a": "b"}}}}}
    )
    kube.complete_rollout("shop", "web")
    status = apps.read_namespaced_deployment_status("web", "shop").status
    assert status.observed_generation == 2
    assert (
        status.replicas,
        status.updated_replicas,
        status.ready_replicas,
        status.available_replicas,
    ) == (3, 3, 3, 3)
    assert {(c.type, c.status) for c in status.conditions} >= {("Available", "True")}


def test_a_failed_rollout_shows_the_progress_deadline_exceeded(
    kube: KubeEmulator, apps: client.AppsV1Api
) -> None:
    apps.create_namespaced_deployment("shop", deployment())
    kube.fail_rollout("shop", "web")
    status = apps.read_namespaced_deployment_status("web", "shop").status
    progressing = next(c for c in status.conditions if c.type == "Progressing")
    assert (progressing.status, progressing.reason) == ("False", "ProgressDeadlineExceeded")
    assert status.observed_generation == 1 and status.unavailable_replicas == 1


# ----------------------------------------------------------------------------- faults


@pytest.mark.parametrize(
    ("status", "reason"),
    [(500, "InternalError"), (409, "Conflict"), (503, "ServiceUnavailable")],
    ids=["500", "409", "503"],
)
def test_fail_next_fails_that_many_matching_requests_then_serves_again(
    kube: KubeEmulator, status: int, reason: str
) -> None:
    kube.put(TPOL, policy())
    kube.fail_next("PATCH", r"/throttlepolicies/p$", status, count=2)
    assert http(kube, "GET", f"{TPOL_URL}/p")[0] == 200  # another method: served
    patch = {"spec": {"headroom": 2}}
    answers = [http(kube, "PATCH", f"{TPOL_URL}/p", patch, MERGE) for _ in range(3)]
    assert [(code, body.get("reason")) for code, body in answers[:2]] == [(status, reason)] * 2
    assert answers[2][0] == 200 and answers[2][1]["spec"]["headroom"] == 2


def test_fail_next_can_answer_late_or_not_at_all(kube: KubeEmulator) -> None:
    kube.fail_next("GET", "/namespaces/default$", None, delay=0.5)
    started = time.monotonic()
    assert http(kube, "GET", "/api/v1/namespaces/default")[0] == 200
    assert time.monotonic() - started >= 0.5
    kube.fail_next("GET", "/namespaces/default$", disconnect=True)
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        http(kube, "GET", "/api/v1/namespaces/default")


def test_the_requests_received_can_be_asserted(kube: KubeEmulator, apps: client.AppsV1Api) -> None:
    apps.create_namespaced_deployment("shop", deployment())
    apps.read_namespaced_deployment("web", "shop")
    assert not kube.requests("PATCH", "/deployments/")
    apps.patch_namespaced_deployment("web", "shop", {"spec": {"replicas": 1}}, dry_run="All")
    (patch,) = kube.requests("PATCH", "/deployments/")
    assert patch.query == {"dryRun": "All"} and patch.body == {"spec": {"replicas": 1}}
    assert [r.method for r in kube.requests(path="/deployments")] == ["POST", "GET", "PATCH"]


# ----------------------------------------------------------------------------- discovery


@pytest.mark.parametrize(
    ("path", "name", "namespaced", "short"),
    [
        ("/apis/unthrottle.io/v1alpha1", "throttlepolicies", True, ["tpol"]),
        ("/apis/unthrottle.io/v1alpha1", "throttlepolicies/status", True, ["tpol"]),
        ("/api/v1", "namespaces", False, ["ns"]),
        ("/apis/apps/v1", "deployments/status", True, ["deploy"]),
        ("/apis/events.k8s.io/v1", "events", True, ["ev"]),
    ],
    ids=["ThrottlePolicy", "its status", "namespaces", "a Deployment's status", "events"],
)
def test_discovery_shows_the_resources_and_their_status_subresources(
    kube: KubeEmulator, path: str, name: str, namespaced: bool, short: list[str]
) -> None:
    status, body = http(kube, "GET", path)
    found = {r["name"]: r for r in body["resources"]}
    assert status == 200 and found[name]["namespaced"] is namespaced
    assert found[name]["shortNames"] == short


@pytest.mark.parametrize(
    "path",
    ["/nonsense", "/apis/unknown.io", "/apis/unknown.io/v1", "/apis/apps/v1/things",
     "/api/v1/namespaces/shop/pods/x/log", "/apis/apps/v1/namespaces/shop/deployments/web/scale"],
    ids=["no API path", "an unknown group", "an unknown version", "an unknown resource",
         "an unemulated subresource", "the scale subresource"],
)  # fmt: skip
def test_what_is_not_served_is_404_not_found(kube: KubeEmulator, path: str) -> None:
    kube.put(DEPLOY, deployment(namespace="shop"))
    status, body = http(kube, "GET", path)
    assert (status, body["reason"]) == (404, "NotFound")


@pytest.mark.parametrize("vpa", [False, True], ids=["without VPA", "with VPA"])
def test_the_vpa_resource_is_served_on_request(vpa: bool) -> None:
    with KubeEmulator(vpa=vpa) as kube:
        groups = [g["name"] for g in http(kube, "GET", "/apis")[1]["groups"]]
        status, _ = http(kube, "GET", "/apis/autoscaling.k8s.io/v1/verticalpodautoscalers")
    assert ("autoscaling.k8s.io" in groups, status == 200) == (vpa, vpa)


# ----------------------------------------------------------------------------- real Kopf

OPERATOR = """
import kopf

@kopf.on.create("unthrottle.io", "v1alpha1", "throttlepolicies")
def created(patch, **_):
    patch.status["created"] = True

@kopf.timer("unthrottle.io", "v1alpha1", "throttlepolicies", interval=1)
def seen(body, patch, **_):
    patch.status["seen"] = True
    kopf.info(body, reason="Seen", message="hello")
"""


@contextlib.contextmanager
def kopf_running(kube: KubeEmulator, tmp_path: Path, *scope: str) -> Iterator[None]:
    """``kopf run`` on the tiny operator, pointed at the emulator by $KUBECONFIG; its log is
    printed if the block fails; it is stopped by its PID (SIGTERM, then SIGKILL)."""
    operator = tmp_path / "operator.py"
    operator.write_text(OPERATOR)
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig(tmp_path / "kubeconfig"))}
    log = tmp_path / "kopf.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(KOPF), "run", "--standalone", "--verbose", *scope, str(operator)],
            env=env,
            stdout=out,
            stderr=out,
        )
    try:
        yield
    except BaseException:
        print(
            f"kopf run {' '.join(scope)} (exit code {proc.poll()}):\n"
            + log.read_text(errors="replace")
        )
        raise
    finally:
        stop(proc, timeout_s=10)


@pytest.mark.parametrize(
    "scope",
    [("--all-namespaces",), ("--namespace", "shop")],
    ids=["cluster-wide", "one namespace (Kopf lists and watches namespaces)"],
)
def test_a_real_kopf_operator_writes_status_posts_events_and_lets_go_on_deletion(
    kube: KubeEmulator, tmp_path: Path, scope: tuple[str, ...]
) -> None:
    kube.create_namespace("shop")
    with kopf_running(kube, tmp_path, *scope):
        kopf_serves_a_policy(kube)
    if "--namespace" in scope:  # Kopf found the namespace by listing and watching namespaces
        assert kube.requests("GET", r"^/api/v1/namespaces$")
    assert not kube.emulator.internal_errors


def kopf_serves_a_policy(kube: KubeEmulator) -> None:
    kube.create(TPOL, policy())
    done = kube.wait_for(
        TPOL,
        "shop",
        "p",
        lambda o: bool(o and o.get("status", {}).get("seen") and o["status"].get("created")),
    )
    assert done is not None
    assert "kopf.zalando.org/KopfFinalizerMarker" in done["metadata"]["finalizers"]
    deadline = time.monotonic() + 20
    while not any(e["reason"] == "Seen" for e in kube.list("v1/events", "shop")):
        assert time.monotonic() < deadline, "no Seen event"
        time.sleep(0.1)
    event = next(e for e in kube.list("v1/events", "shop") if e["reason"] == "Seen")
    assert event["involvedObject"]["name"] == "p" and event["message"] == "hello"
    assert event["metadata"]["name"].startswith("kopf-event-")
    kube.delete(TPOL, "shop", "p")  # held by Kopf's finalizer until Kopf lets it go
    kube.wait_for(TPOL, "shop", "p", lambda o: o is None)
