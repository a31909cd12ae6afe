"""Pods are attributed to their workloads (Deployments, StatefulSets, DaemonSets) by owner
reference, and gone pods by their generated names."""

from __future__ import annotations

from unthrottle.evidence.fetching import owners_of, queries
from unthrottle.evidence.plots import pods_pattern
from unthrottle.model.owners import KINDS, Owners, kind_and_name, ref, workload_of_pod_name

OWNERS = Owners(
    pods={("shop", "api-7d9f-b2x4k"): "api", ("shop", "cron-1"): "cron"},
    replicasets={("shop", "api-7d9f"): "api", ("shop", "api-5c4b"): "api"},
)


def test_a_live_pod_is_known_by_its_owner_reference() -> None:
    assert OWNERS.workload_of("shop", "api-7d9f-b2x4k") == "api"
    assert OWNERS.workload_of("shop", "cron-1") == "cron"


def test_a_gone_pod_is_known_by_its_replicasets_name() -> None:
    # an old ReplicaSet's pod, deleted by the rollout
    assert OWNERS.workload_of("shop", "api-5c4b-q8wzt") == "api"


def test_names_that_are_not_generated_by_a_replicaset_are_not_guessed() -> None:
    assert OWNERS.workload_of("shop", "api-5c4b-manual") is None  # not 5 characters
    assert OWNERS.workload_of("shop", "api-5c4b-aeiou") is None  # vowels never occur
    assert OWNERS.workload_of("other", "api-5c4b-q8wzt") is None  # another namespace
    assert OWNERS.workload_of("shop", "web-5c4b-q8wzt") is None  # no such ReplicaSet


KINDS_OWNERS = Owners(
    pods={("shop", "db-0"): "statefulset/db", ("shop", "logs-q8wzt"): "daemonset/logs"},
    replicasets={("shop", "api-7d9f"): "api"},
    direct={("shop", "db"): "StatefulSet", ("shop", "logs"): "DaemonSet"},
)


def test_a_statefulsets_and_a_daemonsets_gone_pods_are_known_by_their_names() -> None:
    assert KINDS_OWNERS.workload_of("shop", "db-0") == "statefulset/db"  # live
    assert KINDS_OWNERS.workload_of("shop", "db-7") == "statefulset/db"  # scaled down since
    assert KINDS_OWNERS.workload_of("shop", "logs-x2b4k") == "daemonset/logs"  # its node went
    assert KINDS_OWNERS.workload_of("shop", "db-07") is None  # no ordinal has a leading 0
    assert KINDS_OWNERS.workload_of("shop", "db-x2b4k") is None  # a StatefulSet's is numbered
    assert KINDS_OWNERS.workload_of("shop", "logs-3") is None  # a DaemonSet's is not
    assert KINDS_OWNERS.workload_of("other", "db-1") is None  # another namespace


def test_a_reference_names_the_kind_and_splits_back() -> None:
    for kind in KINDS:
        assert kind_and_name(ref(kind, "a.b-c")) == (kind, "a.b-c")
    assert ref("Deployment", "web") == "web"  # what every earlier reader has
    assert ref("StatefulSet", "db") == "statefulset/db"


def test_a_pods_workload_is_told_from_its_name_among_those_wanted() -> None:
    wanted = frozenset({"web", "statefulset/db", "daemonset/logs", "daemonset/web-7c9d8f"})
    assert workload_of_pod_name("web-7c9d8f-x2b4k", wanted) == "web"  # the Deployment's first
    assert workload_of_pod_name("db-12", wanted) == "statefulset/db"
    assert workload_of_pod_name("logs-q8wzt", wanted) == "daemonset/logs"
    assert workload_of_pod_name("db-x2b4k", wanted) is None
    assert workload_of_pod_name("cache-0", wanted) is None


def test_the_pod_pattern_has_one_alternative_per_kind_and_matches_what_it_should() -> None:
    import re

    pattern = pods_pattern(["web", "statefulset/db", "daemonset/logs"])
    full = re.compile(f"^(?:{pattern})$")  # PromQL anchors its matchers
    for pod in ("web-7c9d8f-x2b4k", "db-0", "db-12", "logs-q8wzt"):
        assert full.match(pod), pod
    for pod in ("web-x2b4k", "db-x2b4k", "logs-1", "db-01", "other-0"):
        assert not full.match(pod), pod
    assert pods_pattern(["web"]) == "(web)-[a-z0-9]+-[bcdfghjklmnpqrstvwxz2456789]{5}"


class _Series:
    def __init__(self, **labels: str) -> None:
        self.labels = labels


def test_kube_state_metrics_owners_reach_each_kind_asked_for_and_no_other() -> None:
    replicasets = [_Series(namespace="shop", replicaset="api-7d9f", owner_name="api")]
    pods = [
        _Series(namespace="shop", pod="api-7d9f-b2x4k", owner_kind="ReplicaSet",
                owner_name="api-7d9f"),
        _Series(namespace="shop", pod="db-0", owner_kind="StatefulSet", owner_name="db"),
        _Series(namespace="shop", pod="logs-q8wzt", owner_kind="DaemonSet", owner_name="logs"),
        _Series(namespace="shop", pod="job-x", owner_kind="Job", owner_name="job"),
    ]  # fmt: skip
    every = owners_of(replicasets, pods, KINDS)
    assert every.pods == {("shop", "api-7d9f-b2x4k"): "api", ("shop", "db-0"): "statefulset/db",
                          ("shop", "logs-q8wzt"): "daemonset/logs"}  # fmt: skip
    assert every.workload_of("shop", "db-3") == "statefulset/db"  # by name, once it is known
    only = owners_of(replicasets, pods)  # the default: Deployments
    assert only.pods == {("shop", "api-7d9f-b2x4k"): "api"}
    sts = owners_of(replicasets, pods, ("StatefulSet",))
    assert sts.pods == {("shop", "db-0"): "statefulset/db"}


def test_one_owners_query_whatever_the_kinds() -> None:
    one = queries(["shop"], 3600, with_owners=True)
    every = queries(["shop"], 3600, with_owners=True, kinds=KINDS)
    assert list(one) == list(every)  # the same queries, by name: 11
    assert len(every) == 11
    assert 'owner_kind="ReplicaSet"' in one["pod_owners"]
    assert 'owner_kind=~"ReplicaSet|StatefulSet|DaemonSet"' in every["pod_owners"]


def test_the_policys_kinds_are_the_kinds_unthrottle_reads() -> None:
    from typing import get_args

    from unthrottle.model.policy import WorkloadKind

    assert get_args(WorkloadKind) == KINDS
