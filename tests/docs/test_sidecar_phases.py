"""bench/sidecar_phases.py: the two-container pod's sidecar in the model at phases around
the measured ones and over a whole period, against the kernel's measurement, and the
pooling of results files that bench/lab_vs_model.py's ``--from`` does."""

from __future__ import annotations

import sys
from functools import cache
from typing import Any

import pytest

from support.docs import prose, results, section
from support.paths import ROOT
from unthrottle_lab.agreement import RunAgreement, cfs_latency

sys.path.insert(0, str(ROOT / "bench"))
import lab_vs_model
import sidecar_phases

PINNED = ["lab-vs-model-sidecar-pinned-first.json", "lab-vs-model-sidecar.json",
          "lab-vs-model-sidecar-pinned-more.json", "sched-trace-sidecar.json",
          "sched-trace-turns.json"]  # fmt: skip
"""Every pinned measurement of the two-container pod, in the order the docs pool them."""


def pinned() -> dict[str, Any]:
    return lab_vs_model.pooled([results(name) for name in PINNED])


@cache
def pinned_agreements() -> list[RunAgreement]:
    """The two runs held over every pinned measurement (the model's bands take a while)."""
    return lab_vs_model.agreements(pinned())


def test_pooling_keeps_every_measurement_and_every_command() -> None:
    pool = pinned()
    assert len(pool["measurements"]) == sum(len(results(n)["measurements"]) for n in PINNED)
    assert pool["commands"] == [results(n)["command"] for n in PINNED]
    throttled = pinned_agreements()[0]
    alone = [lab_vs_model.agreements(results(n))[0] for n in PINNED]
    assert throttled.agreeing == sum(a.agreeing for a in alone)
    assert len(throttled.comparisons) == sum(len(a.comparisons) for a in alone)


def test_only_results_of_one_set_pool() -> None:
    with pytest.raises(ValueError, match="one set"):
        lab_vs_model.pooled([results("lab-vs-model-sidecar.json"),
                             results("lab-vs-model-pod.json")])  # fmt: skip


def test_the_docs_table_of_the_two_container_pod_is_every_pinned_measurement() -> None:
    table = lab_vs_model.table(pinned_agreements())
    throttled, room = pinned_agreements()
    n = len(throttled.comparisons)
    # the throttled run does not agree (at least half of the measurements: 1 of 18)
    assert not throttled.agrees and room.agrees
    assert f"**no**, in {throttled.agreeing} of {n} |" in table
    assert f"yes, in {room.agreeing} of {n} |" in table
    assert " ".join(table.split()) in " ".join(section(3).split())


def test_the_sweep_is_the_model_at_the_measured_phases_and_around_them() -> None:
    """The first pinned measurement swept coarsely: the model at its phases is what the
    agreement rules compare, and the sweep around them is the saved one (the model has not
    moved since it was saved)."""
    throttled = pinned_agreements()[0]
    first = throttled.comparisons[0]
    scenario = sidecar_phases._scenario(throttled.scenario)
    swept = sidecar_phases.sweep(throttled.spec, scenario, first.measured, 2, 50_000)
    assert first.sidecar is not None
    assert swept["model"]["p50_ms"] == round(first.sidecar.predicted.latency.p50, 1)
    assert swept["over_phases"]["of"] == 4
    near = swept["near_phases"]
    assert near["of"] == 81
    assert near["p50_ms"][0] <= swept["model"]["p50_ms"] <= near["p50_ms"][1]
    saved = results("sidecar-phases.json")["measurements"][0]
    assert saved["near_phases"] == near
    assert saved["model"] == swept["model"]
    assert saved["kernel"]["p50_ms"] == round(cfs_latency(first.sidecar.measured).p50, 1)


def test_the_docs_quote_the_saved_sweep() -> None:
    saved = results("sidecar-phases.json")
    throttled = [m for m in saved["measurements"] if m["run"].startswith("1 CPU")]
    assert len(throttled) == len(pinned()["measurements"])
    near = sum(m["near_phases"]["agreeing"] > 0 for m in throttled)
    anywhere = sum(m["over_phases"]["agreeing"] > 0 for m in throttled)
    low = min(m["over_phases"]["p50_ms"][0] for m in throttled)
    high = max(m["over_phases"]["p50_ms"][1] for m in throttled)
    text = " ".join(section(3).split())
    assert saved["command"] in section(3).replace("\\ ", "")
    assert f"within 2 ms of its measured phases in {near} of the {len(throttled)}" in text
    assert f"at some phase of the period in {anywhere}" in text
    assert f"its p50 over the period {low:.1f}–{high:.1f} ms" in text


def test_the_docs_count_the_throttled_runs_misses_as_the_pool_holds_them() -> None:
    throttled = pinned_agreements()[0]
    missed = [c.misses for c in throttled.comparisons if c.misses]
    side = [m for m in missed if any(x.startswith("sidecar:") for x in m)]
    batch = [m for m in missed if any(not x.startswith("sidecar:") for x in m)]
    ratio = sum(any(x.startswith("sidecar: throttle ratio") for x in m) for m in missed)
    p50 = sum(any(x.startswith("sidecar: p50") for x in m) for m in missed)
    # the kernel's p50 of the sidecar in the measurements whose p50 missed, as compared
    # (less what the host took from its tasks)
    kernel = [
        cfs_latency(c.sidecar.measured).p50
        for c in throttled.comparisons
        if c.sidecar is not None and any(x.startswith("sidecar: p50") for x in c.misses)
    ]
    span = f"{min(kernel):.1f}–{max(kernel):.1f} ms"
    text = " ".join(section(3).split())
    assert (f"Of the {len(missed)} misses the sidecar's are {len(side)} (its throttle ratio"
            f" in {ratio}, the kernel's") in text  # fmt: skip
    assert f"and its p50 in {p50}, {span}) and the batch's {len(batch)}" in text


def test_the_readme_and_the_model_doc_quote_the_pool_and_the_sweep() -> None:
    throttled, room = pinned_agreements()
    n = len(throttled.comparisons)
    sweep = [m for m in results("sidecar-phases.json")["measurements"]
             if m["run"].startswith("1 CPU")]  # fmt: skip
    near = sum(m["near_phases"]["agreeing"] > 0 for m in sweep)
    low = min(m["over_phases"]["p50_ms"][0] for m in sweep)
    high = max(m["over_phases"]["p50_ms"][1] for m in sweep)
    readme, model = prose("docs/limits.md"), prose("docs/model.md")
    assert f"run with room (in {room.agreeing} of {n} measurements;" in readme
    assert f"it agrees in {throttled.agreeing} of {n} only" in readme
    assert f"{low:.1f}–{high:.1f} at any phase" in readme
    assert f"the sidecar agrees in {near} of {n})" in readme
    assert f"the run with room agrees in {room.agreeing} (" in model
    assert (
        f"does not agree by the rules below: it agrees in {throttled.agreeing} of the {n}" in model
    )
    assert f"within 2 ms of the measured phases it agrees in {near} of the {n}" in model


def test_the_docs_say_when_and_beside_what_the_pool_was_measured() -> None:
    pool = pinned()
    load = [m["other_load_cores"] for m in pool["measurements"]]
    said = (f"Measured {len(load)} times with both pinned, all on {pool['measured']},"
            f" {min(load):.2f}–{max(load):.2f} cores of other load")  # fmt: skip
    assert said in " ".join(section(3).split())


def test_the_readme_and_the_model_doc_quote_the_ten_traced_shares() -> None:
    turns = [m["turns"] for name in ("sched-trace-sidecar.json", "sched-trace-turns.json")
             for m in results(name)["measurements"]]  # fmt: skip
    throttled, room = ([t[i]["sidecar_share"] for t in turns] for i in (0, 1))
    assert len(throttled) == 10
    shares = f"{min(throttled):.3f}–{max(throttled):.3f}"
    assert f"got {shares} of the CPU time it took turns for" in prose("docs/limits.md")
    assert f"and it got {min(room):.3f}–{max(room):.3f} with room" in prose("docs/limits.md")
    assert f"got {min(room):.3f}–{max(room):.3f} of the time it took turns" in prose(
        "docs/model.md"
    )
    assert f"but {shares} in the throttled pod" in prose("docs/model.md")
