"""The pod level's figures in the docs are the saved runs' (bench/results/pod-stall.json,
bench/results/lab-vs-model-pod.json), as tests/test_docs_figures.py holds the others."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest

from conftest import ROOT
from test_docs_figures import prose, results, section, span

sys.path.insert(0, str(ROOT / "bench"))
import lab_vs_model


def pairs() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Each run alone beside the run with the pod quota that followed it."""
    runs = results("pod-stall.json")["runs"]
    alone = [r for r in runs if not r["pod_quota"]]
    in_pod = [r for r in runs if r["pod_quota"]]
    return list(zip(alone, in_pod, strict=True))


def pod_runs(key: str, digits: int = 0) -> str:
    return span([p[key] for _, p in pairs()], digits)


def ratios(top: Callable[[dict[str, Any], dict[str, Any]], float], digits: int = 2) -> str:
    return span([top(a, p) for a, p in pairs()], digits)


QUOTES: list[tuple[str, str, Callable[[], object]]] = [
    ("docs/model.md", "own throttled time was only {} of the sum",
     lambda: ratios(lambda _, p: p["container_throttled_s"] / p["sum_throttled_s"])),
    ("docs/model.md", "the sum {}× the throttled time of the same container alone",
     lambda: ratios(lambda a, p: p["sum_throttled_s"] / a["container_throttled_s"])),
    ("docs/model.md", "and the wait {}× the sum",
     lambda: ratios(lambda _, p: p["wait_s"] / p["sum_throttled_s"])),
    ("docs/model.md", "The sum passed the wait ({}×)",
     lambda: f"{max(p['sum_throttled_s'] / p['wait_s'] for _, p in pairs()):.2f}"),
    ("docs/model.md", "measured {} ms apart", lambda: pod_runs("pod_period_phase_ms", 1)),
    ("docs/benchmarks.md", "recommended {}m from them with the pod's throttled time",
     lambda: pod_runs("counters_recommended_millicores")),
    ("docs/benchmarks.md", "and {}m without it", lambda: pod_runs(
        "counters_recommended_without_pod_millicores")),
    ("docs/benchmarks.md", "alone, {}m from the same counters",
     lambda: span([a["counters_recommended_millicores"] for a, _ in pairs()], 0)),
    ("docs/benchmarks.md", "the wait read, as `lab tune` reads it, {}m in the pod",
     lambda: pod_runs("recommended_millicores")),
    ("docs/benchmarks.md", "against {}m alone",
     lambda: span([a["recommended_millicores"] for a, _ in pairs()], 0)),
    ("docs/benchmarks.md", "4 runs each way (2026-12-03, {} cores of other load)",
     lambda: f"{results('pod-stall.json')['other_load_cores']:.2f}"),
    ("README.md", "counting the pod's throttled time, {}m in the pod",
     lambda: pod_runs("counters_recommended_millicores")),
    ("README.md", "against {}m without it)", lambda: pod_runs(
        "counters_recommended_without_pod_millicores")),
]  # fmt: skip


@pytest.mark.parametrize("doc, text, figure", QUOTES, ids=[f"{d}: {t}" for d, t, _ in QUOTES])
def test_the_docs_quote_the_figure_the_pod_runs_hold(
    doc: str, text: str, figure: Callable[[], object]
) -> None:
    quoted = text.format(figure())
    assert quoted in prose(doc), f"{doc} should say: {quoted}"


def test_the_pod_table_is_the_saved_runs() -> None:
    saved = results("lab-vs-model-pod.json")
    table = lab_vs_model.table(lab_vs_model.agreements(saved))
    assert "pod quota" in table
    assert " ".join(table.split()) in section(3)


@pytest.mark.parametrize("name", ["pod-stall.json", "lab-vs-model-pod.json"])
def test_each_pod_results_file_is_named_with_its_command(name: str) -> None:
    assert results(name)["command"] in section(3).replace("\\ ", "")
