"""The machine- and terminal-facing formats: JSON, YAML, CSV and a rich table.

JSON and YAML are the report document itself (:meth:`Report.to_json`); CSV and the
table are one row per container with the same figures.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from unthrottle.report import units
from unthrottle.report.model import Advice, Report
from unthrottle.report.units import cpu

TABLE_COLUMNS = ("namespace", "workload", "container", "current_limit", "throttle_ratio",
                 "demand_p99_max", "recommended_limit", "burst_ms", "gomaxprocs",
                 "expected_throttle_ratio", "evidence", "confidence", "reason")  # fmt: skip
"""The table's columns (CSV has every row field); the expected ratio's cell holds its range
on a shared node."""
CSV_COLUMNS = ("namespace", "kind", "name", "deployment", "container", "evidence", "pods",
               "current_limit", "throttle_ratio", "demand_p99_max", "recommended_limit",
               "burst_ms", "gomaxprocs", "expected_throttle_ratio",
               "expected_throttle_ratio_range", "confidence", "reason", "reasons")  # fmt: skip
"""Every row field, in order: the CSV's header, the same with no row (a script reading the
columns by name reads an empty report too). ``deployment`` is the name of a Deployment, and
empty for a StatefulSet's or a DaemonSet's row (the column earlier readers know)."""


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def _span(span: tuple[float, float] | None) -> str:
    return "" if span is None else f"{span[0]:.3f}–{span[1]:.3f}"


def rows(report: Report) -> list[dict[str, Any]]:
    """One flat row per container."""
    out = []
    for w in report.workloads:
        for c in w.containers:
            rec = c.recommendation
            out.append({
                "namespace": w.namespace, "workload": w.ref, "kind": w.kind, "name": w.name,
                "deployment": w.deployment or "",
                "container": c.name, "evidence": c.evidence, "pods": c.pods,
                "current_limit": cpu(c.current.limit_millicores),
                "throttle_ratio": _ratio(c.throttle_ratio),
                "demand_p99_max": (f"{cpu(c.demand.p99_millicores)} / "
                                   f"{cpu(c.demand.max_millicores)}" if c.demand else ""),
                "recommended_limit": _capped(rec) if rec else "",
                "burst_ms": f"{rec.burst_us / 1000:g}" if rec else "",
                "gomaxprocs": (rec.gomaxprocs or "") if rec else "",
                "expected_throttle_ratio": _ratio(rec.expected_throttle_ratio) if rec else "",
                # on a shared node: beside the same neighbours – if the node goes quiet
                "expected_throttle_ratio_range": _span(rec.expected_range()) if rec else "",
                "confidence": f"{rec.confidence:.2f}" if rec else "",
                # the last step that shaped the value (a bound, the burst, the headroom);
                # JSON, YAML and CSV's "reasons" keep the whole chain
                "reason": (rec.reasons or ("",))[-1] if rec else "no evidence in the window",
                "reasons": " | ".join(c.notes()) if rec else "",
            })  # fmt: skip
    return out


def _capped(rec: Advice) -> str:
    """``1``; ``1 (uncapped 3)`` when a bound or step limit held it back; ``1 (600m–1)``
    when made from throttled data (what the demand itself asks for is in it)."""
    limit, uncapped = rec.limit_millicores, rec.uncapped_limit_millicores
    shown = units.limit(limit, rec.lower_limit_millicores)
    if uncapped is None or limit is None or uncapped == limit:
        return shown
    return f"{shown} (uncapped {cpu(uncapped)})"


def render_json(report: Report) -> str:
    """The report document, indented."""
    return json.dumps(report.to_json(), indent=2) + "\n"


def render_yaml(report: Report) -> str:
    """The report document as YAML."""
    return str(yaml.safe_dump(report.to_json(), sort_keys=False))


def render_csv(report: Report) -> str:
    """One row per container, with a header."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows(report))
    return out.getvalue()


def render_table(report: Report, *, width: int = 200) -> str:
    """A rich table, ``width`` columns wide."""
    table = Table(title=f"unthrottle recommend: window {escape(report.window)}, target "
                        f"{report.target:g}", title_justify="left")  # fmt: skip
    for name in TABLE_COLUMNS:
        table.add_column(name.replace("_", " ").replace("p99 max", "p99 / max"), overflow="fold")
    for r in rows(report):
        if r["expected_throttle_ratio_range"]:  # a shared node's: beside them – node quiet
            r["expected_throttle_ratio"] += f" ({r['expected_throttle_ratio_range']})"
        table.add_row(*(escape(str(r[c])) for c in TABLE_COLUMNS))  # cluster text is no markup
    console = Console(file=io.StringIO(), width=width)
    console.print(table)
    return console.file.getvalue()  # type: ignore[attr-defined, no-any-return]
