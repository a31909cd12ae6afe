"""The pod level's figures in the docs are the saved runs' (bench/results/pod-stall.json,
bench/results/lab-vs-model-pod.json, bench/results/pod-sidecar.json,
bench/results/lab-vs-model-sidecar.json), as
tests/docs/test_docs_figures.py holds the others."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest

from support.docs import prose, results, section, span
from support.paths import ROOT

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
    ("docs/model.md", "where the kernel's sum was {}× the container's alone",
     lambda: ratios(lambda a, p: p["sum_throttled_s"] / a["container_throttled_s"])),
    ("src/unthrottle/cfs/pod.py", "the two added up to {}× the throttled time",
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
    ("docs/limits.md", "counting the pod's throttled time, {}m in the pod",
     lambda: pod_runs("counters_recommended_millicores")),
    ("docs/limits.md", "against {}m without it)", lambda: pod_runs(
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


POD_RESULTS = ["pod-stall.json", "lab-vs-model-pod.json", "pod-sidecar.json",
               "lab-vs-model-sidecar.json", "lab-vs-model-sidecar-pinned-more.json",
               "sched-trace-sidecar.json", "sched-trace-turns.json",
               "sidecar-phases.json"]  # fmt: skip


@pytest.mark.parametrize("name", POD_RESULTS)
def test_each_pod_results_file_is_named_with_its_command(name: str) -> None:
    assert results(name)["command"] in section(3).replace("\\ ", "")


def sidecar_runs(millicores: int, key: str, digits: int = 2) -> str:
    """A figure of the two-container ``lab run``s at the batch's limit ``millicores``."""
    runs = results("pod-sidecar.json")["runs"]
    return span([r[key] for r in runs if r["limit_millicores"] == millicores], digits)


def tunes(key: str, digits: int = 0) -> str:
    return span([t[key] for t in results("pod-sidecar.json")["tunes"]], digits)


def after(digits: int = 2) -> str:
    levels = ("container_throttle_ratio", "sidecar_throttle_ratio", "pod_throttle_ratio")
    found = [t["after"][k] for t in results("pod-sidecar.json")["tunes"] for k in levels]
    return span(found, digits)


def baseline(name: str, key: str, digits: int = 0) -> str:
    tuned = results("pod-sidecar.json")["tunes"]
    return span([b[key] for t in tuned for b in t["baselines"] if b["name"] == name], digits)


SIDECAR_QUOTES: list[tuple[str, str, Callable[[], object]]] = [
    ("docs/benchmarks.md", "the batch was throttled in {} of its periods",
     lambda: sidecar_runs(1000, "container_throttle_ratio")),
    ("docs/benchmarks.md", "the sidecar in {} (",
     lambda: sidecar_runs(1000, "sidecar_throttle_ratio")),
    ("docs/benchmarks.md", "and the pod in {} (", lambda: sidecar_runs(1000, "pod_throttle_ratio")),
    ("docs/benchmarks.md", "({} ms, booked in the pod's counters only)",
     lambda: sidecar_runs(1000, "pod_throttled_ms", 0)),
    ("docs/benchmarks.md", "The tune answered {}m for the batch",
     lambda: tunes("recommended_millicores")),
    ("docs/benchmarks.md", "and {}m for the sidecar",
     lambda: tunes("sidecar_recommended_millicores")),
    ("docs/benchmarks.md", "were throttled in {} of their periods after", after),
    ("docs/benchmarks.md", "VPA ({}m and", lambda: baseline("vpa", "limit_millicores")),
    ("docs/benchmarks.md", "left the pod throttled in {} and",
     lambda: baseline("vpa", "pod_throttle_ratio", 2)),
    ("docs/benchmarks.md", "(2026-12-04, {} cores of other load)",
     lambda: f"{results('pod-sidecar.json')['other_load_cores']:.2f}"),
    ("docs/model.md", "the batch was throttled in {} of its periods",
     lambda: sidecar_runs(1000, "container_throttle_ratio")),
    ("docs/model.md", "in {} ({} ms) besides", lambda: (sidecar_runs(1000, "pod_throttle_ratio"),
                                                        sidecar_runs(1000, "pod_throttled_ms", 0))),
    ("docs/model.md", "the answers {}m for the batch and {}m for the sidecar",
     lambda: (tunes("recommended_millicores"), tunes("sidecar_recommended_millicores"))),
    ("docs/limits.md", "3 tunes: {}m and {}m", lambda: (tunes("recommended_millicores"),
                                                   tunes("sidecar_recommended_millicores"))),
    ("docs/limits.md", "throttled in {} of their periods after", after),
    ("docs/limits.md", "left the pod throttled in {} (docs/benchmarks.md §3)",
     lambda: baseline("vpa", "pod_throttle_ratio", 2)),
]  # fmt: skip


@pytest.mark.parametrize(
    "doc, text, figure", SIDECAR_QUOTES, ids=[f"{d}: {t}" for d, t, _ in SIDECAR_QUOTES]
)
def test_the_docs_quote_the_figures_the_two_container_runs_hold(
    doc: str, text: str, figure: Callable[[], object]
) -> None:
    found = figure()
    quoted = text.format(*found) if isinstance(found, tuple) else text.format(found)
    assert quoted in prose(doc), f"{doc} should say: {quoted}"


def sidecar_p50s(name: str) -> list[tuple[str, str]]:
    """The throttled two-container run's sidecar p50 in each measurement of a results
    file, the kernel's and the model's at its phases, ms."""
    throttled = lab_vs_model.agreements(results(name))[0]
    assert throttled.spec.cpus == 1
    sides = [c.sidecar for c in throttled.comparisons if c.sidecar is not None]
    return [(f"{s.measured.latency.p50:.1f}", f"{s.predicted.latency.p50:.1f}") for s in sides]


def test_the_four_unpinned_two_container_measurements_are_the_saved_runs() -> None:
    """The prose's sidecar p50s with the sidecar left to the scheduler, kernel against
    model, each at its phases."""
    pairs = sidecar_p50s("lab-vs-model-sidecar-first.json") + sidecar_p50s(
        "lab-vs-model-sidecar-unpinned.json"
    )
    kernel, model = (", ".join(x[:-1]) + f" and {x[-1]}" for x in zip(*pairs, strict=True))
    assert f"{kernel} ms on the kernel against {model} in the model" in section(3)


def test_the_eight_pinned_two_container_measurements_are_the_saved_runs() -> None:
    """The prose's sidecar p50s with the sidecar pinned, kernel against model, each at its
    phases, and how many of them agreed."""
    names = ["lab-vs-model-sidecar-pinned-first.json", "lab-vs-model-sidecar.json",
             "lab-vs-model-sidecar-pinned-more.json"]  # fmt: skip
    pairs = [pair for name in names for pair in sidecar_p50s(name)]
    kernel, model = (", ".join(x[:-1]) + f" and {x[-1]}" for x in zip(*pairs, strict=True))
    assert f"{kernel} ms on the kernel against {model} in the model" in section(3)
    throttled = [lab_vs_model.agreements(results(name))[0] for name in names]
    sides = [c.sidecar for a in throttled for c in a.comparisons if c.sidecar is not None]
    agreed = sum(not s.misses for s in sides)
    assert f"the sidecar agreed in {agreed}, and" in section(3)


def test_the_first_pinned_measurement_agreed_in_both_runs() -> None:
    found = lab_vs_model.agreements(results("lab-vs-model-sidecar-pinned-first.json"))
    assert [a.agrees for a in found] == [True, True]
    assert "`bench/results/lab-vs-model-sidecar-pinned-first.json`" in section(3)


def test_the_traced_turns_are_the_saved_ones() -> None:
    """The sidecar's share of the turns it took with the batch's thread, with room and
    throttled, and how many traced measurements agreed, as bench/sched_trace.py saved them."""
    saved = results("sched-trace-sidecar.json")
    throttled, room = ([m["turns"][i]["sidecar_share"] for m in saved["measurements"]]
                       for i in (0, 1))  # fmt: skip
    assert f"With room the sidecar ran {min(room):.3f}–{max(room):.3f} of those turns" in section(3)
    assert f"in the throttled pod {min(throttled):.3f}–{max(throttled):.3f} (" in section(3)
    beside = [m["turns"][0]["sidecar_share_beside"] for m in saved["measurements"]]
    assert f"on the other CPU ({min(beside):.3f}–{max(beside):.3f})" in section(3)
    found = lab_vs_model.agreements(saved)[0]
    agreed = sum(not c.misses for c in found.comparisons)
    assert f"throttled run agreed in {agreed} of these {len(found.comparisons)}" in section(3)


def test_the_traced_turns_lengths_are_the_saved_ones() -> None:
    """How long each side's turns were, in ticks, and the share, p50s and agreement of
    the second traced set, as bench/sched_trace.py saved them."""
    saved = results("sched-trace-turns.json")
    turns = [m["turns"] for m in saved["measurements"]]
    batch = [t[i]["batch_turns"] for t in turns for i in (0, 1)]
    text = section(3)
    assert (
        f"the batch's turns were one tick (4 ms at HZ=250) in "
        f"{sum(b['one_tick'] for b in batch)} of {sum(b['turns'] for b in batch)}"
    ) in text
    for index, said in ((1, "With room {} of the sidecar's turns were one tick (median {} ms)"),
                        (0, "in the throttled pod {} (median {} ms)")):  # fmt: skip
        side = [t[index]["sidecar_turns"] for t in turns]
        ones = span([s["one_tick"] / s["turns"] for s in side], 2)
        assert said.format(ones, span([s["median_ms"] for s in side], 2)) in text
    throttled, room = ([t[i]["sidecar_share"] for t in turns] for i in (0, 1))
    assert (
        f"Its share this time was {span(throttled, 3)} throttled and {span(room, 3)} with room"
    ) in text
    found = lab_vs_model.agreements(saved)[0]
    sides = [c.sidecar for c in found.comparisons if c.sidecar is not None]
    kernel = span([s.measured.latency.p50 for s in sides], 1)
    model = span([s.predicted.latency.p50 for s in sides], 1)
    agreed = sum(not c.misses for c in found.comparisons)
    assert (
        f"agreed in {agreed} of the {len(sides)} (the sidecar's p50 {kernel} ms against"
        f" the model's {model})"
    ) in text
