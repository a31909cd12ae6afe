"""How run figures are shown: a rich table for people, JSON lines for programs.

Scenario names and labels are user text: they reach a table as :func:`~unthrottle.cli.text.cell`
(never markup, no control characters)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from unthrottle.cli.text import cell, plain
from unthrottle_lab.agreement import LOST_NOTED_MS, cfs_latency
from unthrottle_lab.figures import RunFigures
from unthrottle_lab.scenario import Scenario
from unthrottle_lab.tune import TuneResult, throttle_ratio


def scenario_json(scenario: Scenario, runs: Sequence[RunFigures]) -> dict[str, Any]:
    """The ``{"name", "runs": [...]}`` object of one scenario."""
    return {"name": scenario.name, "runs": [r.to_json() for r in runs]}


def print_json(scenario: Scenario, runs: Sequence[RunFigures]) -> None:
    """One JSON object per scenario, on one line (JSON Lines)."""
    print(json.dumps(scenario_json(scenario, runs)), flush=True)


def figures_table(title: str, rows: Sequence[tuple[Scenario, Sequence[RunFigures]]]) -> Table:
    """A table of every run of every scenario."""
    table = Table(title=title, title_justify="left")
    for header in ("scenario", "run"):
        table.add_column(header, no_wrap=True)
    for header in ("p50 ms", "p95 ms", "p99 ms", "max ms", "wall ms"):
        table.add_column(header, justify="right")
    for header in ("periods", "throttled", "ratio", "throttled ms", "bursts", "burst ms"):
        table.add_column(header, justify="right")
    pods = any("pod" in fig.extra for _, runs in rows for fig in runs)
    if pods:  # the pod cgroup's own counters, beside the container's (``pod_quota``)
        for header in ("pod periods", "pod throttled", "pod ratio", "pod throttled ms"):
            table.add_column(header, justify="right")
    for scenario, runs in rows:
        for index, (spec, fig) in enumerate(zip(scenario.runs, runs, strict=True)):
            pod = fig.extra.get("pod")
            pod_cells = [] if not pods else ["", "", "", ""] if not pod else [
                str(pod["nr_periods"]), str(pod["nr_throttled"]),
                f"{pod['throttle_ratio']:.2f}", f"{pod['throttled_ms']:.0f}"]  # fmt: skip
            table.add_row(
                cell(scenario.name if index == 0 else ""),
                cell(spec.label()),
                f"{fig.latency.p50:.1f}",
                f"{fig.latency.p95:.1f}",
                f"{fig.latency.p99:.1f}",
                f"{fig.latency.max:.1f}",
                f"{fig.wall_ms:.0f}",
                str(fig.stat.nr_periods),
                str(fig.stat.nr_throttled),
                f"{fig.stat.throttle_ratio:.2f}",
                f"{fig.stat.throttled_us / 1000:.0f}",
                str(fig.stat.nr_bursts),
                f"{fig.stat.burst_us / 1000:.0f}",
                *pod_cells,
            )
            side = fig.extra.get("sidecar")
            if side is not None:  # a two-container pod: the sidecar's own row, the pod's cells
                table.add_row("", cell(f"  sidecar, {spec.sidecar.cpus:g} CPU" if spec.sidecar
                                       else "  sidecar"), *_sidecar_cells(side),
                              *(["", "", "", ""] if pods else []))  # fmt: skip
        table.add_section()
    return table


def _sidecar_cells(side: dict[str, Any]) -> list[str]:
    """A sidecar's figures (the JSON shape of a run) in the table's columns."""
    latency = side["latency_ms"]
    return [f"{latency['p50']:.1f}", f"{latency['p95']:.1f}", f"{latency['p99']:.1f}",
            f"{latency['max']:.1f}", f"{side['wall_ms']:.0f}", str(side["nr_periods"]),
            str(side["nr_throttled"]), f"{side['throttle_ratio']:.2f}",
            f"{side['throttled_ms']:.0f}", str(side["nr_bursts"]),
            f"{side['burst_ms']:.0f}"]  # fmt: skip


def tune_table(result: TuneResult) -> Table:
    """Before, ours and the baselines, side by side."""
    title = f"lab tune: {plain(result.scenario, one_line=True)}, target throttle ratio "
    table = Table(title=Text(title + f"{result.target:g}"), title_justify="left")
    for header in ("settings", "limit", "burst ms"):
        table.add_column(header, no_wrap=True)
    pods = "pod" in result.before.extra
    sidecar = result.sidecar is not None
    headers: tuple[str, ...] = ("ratio", "throttled ms")
    if sidecar:  # a two-container pod: the sidecar's limit and ratio beside the container's
        headers += ("sidecar limit", "sidecar ratio")
    headers += ("pod ratio", "pod throttled ms") if pods else ()
    for header in (*headers, "p50 ms", "p95 ms", "p99 ms", "meets target"):
        table.add_column(header, justify="right")

    def row(name: str, limit: str, burst_us: int, fig: RunFigures) -> None:
        pod = fig.extra.get("pod") or {}
        side = fig.extra.get("sidecar")
        # Under a pod quota the target holds for the pod's periods too: its throttling
        # stalls the container as much as the container's own (and the sidecar's).
        ratios = [fig.stat.throttle_ratio, pod.get("throttle_ratio", 0.0)]
        side_cells: tuple[str, ...] = ()
        if sidecar:
            side_limit = f"{side['limit'].get('cpus', 0) * 1000:.0f}m" if side else ""
            side_cells = (side_limit, f"{side['throttle_ratio']:.3f}" if side else "")
            ratios.append(side["throttle_ratio"] if side else 0.0)
        ok = max(ratios) <= result.target
        pod_cells = (f"{pod.get('throttle_ratio', 0.0):.3f}",
                     f"{pod.get('throttled_ms', 0.0):.0f}") if pods else ()  # fmt: skip
        table.add_row(
            cell(name), cell(limit), f"{burst_us / 1000:g}",
            f"{fig.stat.throttle_ratio:.3f}", f"{fig.stat.throttled_us / 1000:.0f}",
            *side_cells, *pod_cells,
            f"{fig.latency.p50:.1f}", f"{fig.latency.p95:.1f}", f"{fig.latency.p99:.1f}",
            "yes" if ok else "no",
        )  # fmt: skip

    before = result.before
    row("today", before.limit.get("cpus", "none").__str__() + " CPU", 0, before)
    rec = result.recommendation
    shown = f"{rec.limit_millicores}m"
    if rec.lower_limit_millicores is not None:  # from throttled data: the top of a range
        shown += f" ({rec.lower_limit_millicores}m–{rec.limit_millicores}m)"
    row("unthrottle", shown, rec.burst_us, result.after)
    if result.refined is not None:
        ref = result.refined.recommendation
        row("unthrottle, refined", f"{ref.limit_millicores}m", ref.burst_us, result.refined.after)
    for base in result.baselines:
        row(base.name, f"{base.limit_millicores}m", base.burst_us, base.after)
    return table


def print_tune(result: TuneResult) -> None:
    """The tune table and our reasons."""
    console = Console(emoji=False, highlight=False)
    console.width = max(console.width, 120)
    console.print(tune_table(result))
    first = result.recommendation
    if first.expected_throttle_ratio_range is not None:  # what a reviewer read before Apply
        low, high = first.expected_throttle_ratio_range
        measured = throttle_ratio(result.after)
        console.print(Text(f"first answer {first.limit_millicores}m: expected throttle ratio "
                           f"{low:.3f}–{high:.3f} (beside the same neighbours – if the node "
                           f"goes quiet), measured {measured:.3f}"))  # fmt: skip
    rec, _ = result.final
    console.print(Text(f"expected throttle ratio {rec.expected_throttle_ratio}, "
                       f"confidence {rec.confidence} ({rec.confidence_label})"))  # fmt: skip
    for reason in rec.reasons:
        console.print(Text(f"  - {plain(reason)}"))
    if result.sidecar is not None:  # a two-container pod: the sidecar's own answer
        side = result.sidecar.refined or result.sidecar.recommendation
        console.print(Text(f"sidecar: {side.limit_millicores}m, expected throttle ratio "
                           f"{side.expected_throttle_ratio}, confidence {side.confidence} "
                           f"({side.confidence_label})"))  # fmt: skip
        for reason in side.reasons:
            console.print(Text(f"  - {plain(reason)}"))


def print_table(title: str, rows: Sequence[tuple[Scenario, Sequence[RunFigures]]]) -> None:
    """Print the table to stdout."""
    console = Console(emoji=False, highlight=False)
    console.width = max(console.width, 180)  # the table is wide; let it be
    console.print(figures_table(title, rows))
    for line in lost_notes(rows):
        console.print(Text(line))


def lost_notes(rows: Sequence[tuple[Scenario, Sequence[RunFigures]]]) -> list[str]:
    """A line for each lab run the host took from (steal time, unthrottle_lab/worker.py)."""
    out = []
    for scenario, runs in rows:
        for spec, fig in zip(scenario.runs, runs, strict=True):
            lost = fig.extra.get("lost_ms") or 0.0
            if lost >= LOST_NOTED_MS:
                without = cfs_latency(fig).p95
                out.append(f"{scenario.name} / {spec.label()}: the host took {lost:.0f} ms from "
                           f"its tasks (steal); p95 {without:.1f} ms without it")  # fmt: skip
    return out
