"""unthrottle's recording rules: valid for Prometheus, evaluated by promtool over real history,
and read back by `recommend` with the same evidence as the raw samples."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from prom import PrometheusServer, requires_prometheus
from support.metrics_evidence import (
    HOUR,
    history,
)
from support.recording_rules import (
    UNTHROTTLE,
    rules,
)
from unthrottle.evidence.containers import WorkloadKey
from unthrottle.evidence.fetching import fetch, recorded_covers
from unthrottle.metrics.source import PrometheusConfig, PrometheusSource
from unthrottle_lab.prometheus import RULE_BLOCK_S

pytestmark = requires_prometheus


def test_the_rules_are_valid_for_prometheus(tmp_path: Path) -> None:
    out = subprocess.run(["promtool", "check", "rules", str(rules(tmp_path))],
                         capture_output=True, text=True, check=False)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "7 rules found" in out.stdout


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """An hour of history, and the rules evaluated over it by promtool (as if installed)."""
    folder = tmp_path_factory.mktemp("recorded")
    now = int(time.time())
    with PrometheusServer(folder, openmetrics=history(now)) as prom:
        blocks = prom.record(rules(folder), now - HOUR, now)
    for block in blocks:
        shutil.move(str(block), folder / "tsdb" / block.name)
    with PrometheusServer(folder, tsdb=folder / "tsdb") as prom:
        yield prom.url, now


def test_rules_are_recorded_when_the_range_starts_a_second_before_a_promtool_block_edge(
    tmp_path: Path,
) -> None:
    # What once left the fixture above without rule blocks: promtool cuts the range at 2 h
    # edges and stops at a first piece holding no evaluation time (PrometheusServer.record).
    edge = (int(time.time()) - 1800) // RULE_BLOCK_S * RULE_BLOCK_S
    now = edge + 1800  # half an hour of history on either side of the edge
    with PrometheusServer(tmp_path, openmetrics=history(now)) as prom:
        alone = tmp_path / "promtool-alone"
        subprocess.run(
            ["promtool", "tsdb", "create-blocks-from", "rules", f"--url={prom.url}",
             f"--start={edge - 1}", f"--end={now}", f"--output-dir={alone}",
             str(rules(tmp_path))],
            check=True, capture_output=True,
        )  # fmt: skip
        assert not alone.exists(), "promtool no longer stops there (prometheus#19714 fixed)"
        blocks = prom.record(rules(tmp_path), edge - 1, now)
    for block in blocks:
        shutil.move(str(block), tmp_path / "tsdb" / block.name)
    with PrometheusServer(tmp_path, tsdb=tmp_path / "tsdb") as prom:
        source = PrometheusSource(PrometheusConfig(prom.url))
        assert recorded_covers(source, ["shop"], 1500, at=now)
        raw = fetch(source, ["shop"], 1500, at=now)
        rec = fetch(source, ["shop"], 1500, at=now, recorded=True)
    api = WorkloadKey("shop", "api", "api")
    assert rec[api].periods == pytest.approx(raw[api].periods, rel=0.1)
    assert rec[api].throttle_ratio() == pytest.approx(raw[api].throttle_ratio(), abs=0.02)


def test_recorded_series_give_the_evidence_raw_samples_give(recorded: tuple[str, int]) -> None:
    url, now = recorded
    source = PrometheusSource(PrometheusConfig(url))
    assert recorded_covers(source, ["shop"], 3600, at=now)
    assert not recorded_covers(source, ["shop"], 86400, at=now)  # rules younger than a day
    raw = fetch(source, ["shop"], 3600, at=now)
    rec = fetch(source, ["shop"], 3600, at=now, recorded=True)
    assert set(rec) == set(raw)
    for key in (WorkloadKey("shop", "api", "api"), WorkloadKey("shop", "batch", "main")):
        a, b = raw[key], rec[key]
        assert b.pods == a.pods and b.kind == a.kind
        assert b.periods == pytest.approx(a.periods, rel=0.1)
        assert b.usage_s == pytest.approx(a.usage_s, rel=0.1)
        assert b.throttle_ratio() == pytest.approx(a.throttle_ratio(), abs=0.02)
        for le, count in a.buckets.items():
            assert b.buckets[le] == pytest.approx(count, rel=0.1)


def test_recommend_reads_the_recorded_series_when_they_cover_the_window(
    recorded: tuple[str, int],
) -> None:
    url, _ = recorded
    base = [str(UNTHROTTLE), "recommend", "--prometheus", url, "--no-cluster", "--namespace",
            "shop", "--window", "1h", "--format", "json"]  # fmt: skip
    auto = subprocess.run(base, capture_output=True, text=True, timeout=120, check=False)
    raw = subprocess.run([*base, "--history", "raw"], capture_output=True, text=True,
                         timeout=120, check=False)  # fmt: skip
    assert auto.returncode == raw.returncode == 0, auto.stderr + raw.stderr
    assert "recording rules" in auto.stderr and "recording rules" not in raw.stderr

    def api(out: subprocess.CompletedProcess[str]) -> dict[str, object]:
        doc = json.loads(out.stdout)
        return dict(next(w for w in doc["workloads"] if w["deployment"] == "api")["containers"][0])

    got, want = api(auto)["recommendation"], api(raw)["recommendation"]
    assert isinstance(got, dict) and isinstance(want, dict)
    assert abs(got["limit_millicores"] - want["limit_millicores"]) <= 0.1 * want["limit_millicores"]
