"""Pods are attributed to Deployments by owner reference, and gone pods by their generated name."""

from __future__ import annotations

from unthrottle.model.owners import Owners

OWNERS = Owners(
    pods={("shop", "api-7d9f-b2x4k"): "api", ("shop", "cron-1"): "cron"},
    replicasets={("shop", "api-7d9f"): "api", ("shop", "api-5c4b"): "api"},
)


def test_a_live_pod_is_known_by_its_owner_reference() -> None:
    assert OWNERS.deployment_of("shop", "api-7d9f-b2x4k") == "api"
    assert OWNERS.deployment_of("shop", "cron-1") == "cron"


def test_a_gone_pod_is_known_by_its_replicasets_name() -> None:
    # an old ReplicaSet's pod, deleted by the rollout
    assert OWNERS.deployment_of("shop", "api-5c4b-q8wzt") == "api"


def test_names_that_are_not_generated_by_a_replicaset_are_not_guessed() -> None:
    assert OWNERS.deployment_of("shop", "api-5c4b-manual") is None  # not 5 characters
    assert OWNERS.deployment_of("shop", "api-5c4b-aeiou") is None  # vowels never occur
    assert OWNERS.deployment_of("other", "api-5c4b-q8wzt") is None  # another namespace
    assert OWNERS.deployment_of("shop", "web-5c4b-q8wzt") is None  # no such ReplicaSet
