"""Label selectors as ``kubectl -l`` reads them, matched on objects and on kube-state-metrics."""

from __future__ import annotations

import re

import pytest

from unthrottle.model.selector import SelectorError, parse_selector

WEB = {"app": "web", "tier": "front", "app.kubernetes.io/name": "shop"}
BATCH = {"app": "batch", "tier": "back"}
BARE: dict[str, str] = {}


@pytest.mark.parametrize(
    ("text", "matching"),
    [
        ("", {"web", "batch", "bare"}),
        ("app=web", {"web"}),
        ("app==web", {"web"}),
        ("app!=web", {"batch", "bare"}),  # a missing key is "not web", as in Kubernetes
        ("tier in (front, back)", {"web", "batch"}),
        ("tier notin (front)", {"batch", "bare"}),
        ("app", {"web", "batch"}),
        ("!app", {"bare"}),
        ("app, tier!=back", {"web"}),
        (" app.kubernetes.io/name = shop ", {"web"}),
        ("app in (web),tier in (back)", set()),
    ],
)
def test_selectors_match_as_kubectl_does(text: str, matching: set[str]) -> None:
    selector = parse_selector(text)
    objects = {"web": WEB, "batch": BATCH, "bare": BARE}
    assert {name for name, labels in objects.items() if selector.matches(labels)} == matching


def test_kube_state_metrics_label_names_are_matched_by_their_exported_spelling() -> None:
    series = {"namespace": "shop", "deployment": "web", "label_app_kubernetes_io_name": "shop"}
    assert parse_selector("app.kubernetes.io/name=shop").matches_exported(series)
    assert not parse_selector("app.kubernetes.io/name=other").matches_exported(series)
    assert parse_selector("!app").matches_exported(series)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("app=web,,tier=x", "',tier=x'"),
        ("app=we b", "'app=we b' is not a requirement"),
        ("!app=web", "'!app=web'"),
        ("app in ()", "'app in ()'"),
        ("app in (a b)", "'a b'"),
        ("-app=web", "'-app'"),
        ("app>3", "'app>3'"),
        ("app=" + "x" * 64, "is not a label value"),
    ],
)
def test_a_malformed_selector_names_the_part_at_fault(text: str, named: str) -> None:
    with pytest.raises(SelectorError, match=re.escape(named)):
        parse_selector(text)
