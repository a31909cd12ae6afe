"""Deployments as read from the API's JSON: containers, runtimes, labels and bursts (kmock)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kmock_thread import KmockThread
from unthrottle.cfs.settings import DEFAULT_PERIOD_US
from unthrottle.kube.workloads import KubeWorkloadStore
from unthrottle.recommend import Runtime


def deployment(name: str, annotations: dict[str, str], containers: list[dict[str, Any]]) -> Any:
    return {
        "kind": "Deployment",
        "metadata": {"namespace": "shop", "name": name, "labels": {"team": "a"}},
        "spec": {"template": {"metadata": {"annotations": annotations},
                              "spec": {"containers": containers}}},
    }  # fmt: skip


def store(km: KmockThread, tmp_path: Path) -> KubeWorkloadStore:
    from kubernetes import client, config

    config.load_kube_config(str(km.kubeconfig(tmp_path / "kc")))
    return KubeWorkloadStore(client.CoreV1Api(), client.AppsV1Api())


def test_containers_runtimes_labels_and_bursts_are_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    go = {"name": "api", "resources": {"limits": {"cpu": "0.5"}, "requests": {"cpu": "100m"}},
          "env": [{"name": "GOMAXPROCS", "value": "6"}]}  # fmt: skip
    jvm = {"name": "jvm", "resources": {"limits": {"cpu": "2"}},
           "env": [{"name": "JAVA_TOOL_OPTIONS", "value": "-Xmx1g"}]}  # fmt: skip
    bare = {"name": "bare"}
    with KmockThread() as km:
        asked = {"unthrottle.io/cpu-burst": "*=10%,api=80ms"}
        km.put("apps/v1/deployments", deployment("api", asked, [go, jvm, bare]))
        km.put("apps/v1/deployments", deployment("bad", {"unthrottle.io/cpu-burst": "lots"}, [go]))
        found = {d.name: d for d in store(km, tmp_path).deployments(["shop"])}
    api = found["api"]
    assert api.labels == {"team": "a"}
    c = api.containers
    assert (c["api"].limit_millicores, c["api"].request_millicores) == (500, 100)
    assert (c["api"].runtime, c["api"].gomaxprocs_env) == (Runtime.GO, 6)
    assert c["jvm"].runtime is Runtime.JVM and c["bare"].runtime is Runtime.UNKNOWN
    # 80 ms asked, 50 ms quota: clamped as the agent writes it; 10 % of 200 ms; no limit, none
    at_100ms = [c[name].burst_at(DEFAULT_PERIOD_US) for name in ("api", "jvm", "bare")]
    assert at_100ms == [50_000, 20_000, 0]
    # a malformed annotation counts as no burst, and says why
    assert found["bad"].containers["api"].burst_at(DEFAULT_PERIOD_US) == 0
    assert "shop/bad" in caplog.text and "'lots' is not a duration" in caplog.text
