"""The /metrics text parses back exactly, whatever the label values."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from unthrottle.agent.discovery import Found
from unthrottle.agent.exposition import render
from unthrottle.agent.sampling import BUCKETS_CORES, Sampler, Series
from unthrottle.cfs.backlog import LEVELS_MILLICORES, OVER_QUOTAS, BacklogFold
from unthrottle.cgroups import Cgroup, CpuStat, Layout, Version
from unthrottle.cgroups.counters import CounterReader, Vanished
from unthrottle.units import Bandwidth


def v2_cgroup(root: Path, rel: str, stat: str) -> Layout:
    d = root / rel
    d.mkdir(parents=True)
    (d / "cpu.stat").write_text(stat)
    (d / "cpu.max").write_text("30000 100000\n")
    return Layout(Version.V2, root, root)


STAT = "usage_usec 1000\nnr_periods 10\nnr_throttled 4\nthrottled_usec 7000\n"


def series(layout: Layout, rel: str, pod: str) -> Series:
    reader = CounterReader(layout, rel)
    start = reader.read()
    return Series(Found(rel, "ns", pod, "c"), reader, Bandwidth(30_000), 8_000, 0, start)


def test_hostile_label_values_parse_back_unchanged(tmp_path: Path) -> None:
    layout = v2_cgroup(tmp_path, "a", STAT)
    hostile = 'we"ird\\pod\nname} le="x'
    s = series(layout, "a", hostile)
    s.observe(8_000 + 106_000, 100_000_000, keep=10)  # 106 ms over 100 ms: 1.06 cores
    s.latest = CpuStat(31_000, 11, 5, 83_000, 0, 0)
    families = {f.name: f for f in text_string_to_metric_families(render([s]).decode())}
    buckets = [x for x in families["unthrottle_cpu_demand_cores"].samples
               if x.name.endswith("_bucket")]  # fmt: skip
    assert {x.labels["pod"] for x in buckets} == {hostile}
    assert len(buckets) == len(BUCKETS_CORES) + 1
    by_le = {x.labels["le"]: x.value for x in buckets}
    assert by_le["1.0"] == 0 and by_le["1.25"] == 1 and by_le["+Inf"] == 1
    periods = families["unthrottle_cpu_cfs_periods"].samples[0]
    assert periods.value == 11 and periods.labels["namespace"] == "ns"
    assert families["unthrottle_cpu_cfs_quota_seconds"].samples[0].value == 0.03
    s.reader.close()


def test_v2_counters_read_through_open_files_see_new_values(tmp_path: Path) -> None:
    layout = v2_cgroup(tmp_path, "a", STAT)
    reader = CounterReader(layout, "a")
    assert reader.read() == CpuStat(1000, 10, 4, 7000, 0, 0)
    (tmp_path / "a" / "cpu.stat").write_text(STAT.replace("1000", "2000"))
    assert reader.read().usage_us == 2000
    reader.close()
    reader.close()  # twice is fine


def test_a_missing_cgroup_is_vanished_not_an_error(tmp_path: Path) -> None:
    layout = Layout(Version.V2, tmp_path, tmp_path)
    with pytest.raises(Vanished):
        CounterReader(layout, "gone")


@pytest.mark.kernel
def test_a_cgroup_removed_while_sampled_is_dropped_quietly(layout: Layout) -> None:
    cg = Cgroup(layout, f"unthrottle-test-vanish-{os.getpid()}")
    cg.create()
    try:
        sampler = Sampler(layout, lambda known: [Found(cg.path, "", "x", "")])
        sampler.refresh()
        sampler.sample()
        assert list(sampler.series) == [cg.path]
    finally:
        cg.remove()
    sampler.sample()  # the files now read as gone
    assert sampler.series == {}
    sampler.refresh()  # and rediscovery copes with a path that no longer exists
    assert sampler.series == {}
    sampler.close()


def test_agent_logs_are_one_json_object_per_line() -> None:
    import json
    import logging

    from unthrottle.agent.logs import JsonFormatter

    record = logging.LogRecord("unthrottle.agent", logging.WARNING, __file__, 1,
                               "cannot read %s", ("a/b",), None)  # fmt: skip
    entry = json.loads(JsonFormatter().format(record))
    assert entry["level"] == "warning" and entry["msg"] == "cannot read a/b"
    assert entry["logger"] == "unthrottle.agent" and entry["ts"].endswith("Z")


@pytest.mark.kernel
def test_idle_windows_count_as_zero_and_nothing_is_lost_when_the_cgroup_runs(
    layout: Layout,
) -> None:
    import subprocess
    import sys
    import time

    cg = Cgroup(layout, f"unthrottle-test-idle-{os.getpid()}")
    cg.create()
    child = None
    try:
        cg.write_bandwidth(Bandwidth(30_000))
        sampler = Sampler(layout, lambda known: [Found(cg.path, "", "x", "")])
        sampler.refresh()
        series = sampler.series[cg.path]
        for _ in range(5):  # nothing runs: five windows of zero demand
            time.sleep(0.02)
            sampler.sample()
        with sampler.lock:  # quiet windows are accounted when scraped (or when it runs)
            sampler.snapshot()
        assert series.total == series.counts[0] == 5 and series.sum_cores == 0
        code = "import time\nend = time.monotonic() + 0.6\nwhile time.monotonic() < end: pass"
        child = subprocess.Popen([sys.executable, "-c", code])
        cg.add_process(child.pid)
        while child.poll() is None:  # busy windows, then idle ones once it has ended
            time.sleep(0.1)
            sampler.sample()
        for _ in range(3):
            time.sleep(0.1)
            sampler.sample()
        stat = cg.read_stat()
        # every µs of usage + throttled time is in some window: none was skipped
        # (±1 µs: the agent rounds usage + throttled ns once, cpu.stat's figures each);
        # the demand holds, besides, the wait beyond the throttled time
        demand = series.last_demand_us - series.contention_us
        assert abs(demand - (stat.usage_us + stat.throttled_us)) <= 1
        with sampler.lock:
            sampler.snapshot()
        assert series.total == sampler.windows
        assert series.counts[0] >= 8  # the idle windows before and after
        assert series.sum_cores > 3  # about 1 core of demand in each busy window
    finally:
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()
        sampler.close()
        cg.remove()


def test_the_backlog_series_count_windows_in_runs_and_parse_back(tmp_path: Path) -> None:
    layout = v2_cgroup(tmp_path, "a", STAT)
    s = series(layout, "a", "p")
    s.backlog = BacklogFold(100_000)
    for _ in range(3):  # three windows in a row at 1.5 cores
        s._record(1.5, keep=10)
    s.catch_up(s.accounted + 2, 0, keep=10)  # then two quiet ones
    families = {f.name: f for f in text_string_to_metric_families(render([s]).decode())}
    above = {(x.labels["level"], x.labels["over"]): x.value
             for x in families["unthrottle_cpu_demand_backlog_windows"].samples}  # fmt: skip
    assert len(above) == len(LEVELS_MILLICORES) * len(OVER_QUOTAS)
    # above 1 core the backlog is 50, 100, 150 ms, then 50 ms in the first quiet window
    assert above[("1", "0")] == 4 and above[("1", "0.5")] == 2 and above[("1", "1")] == 1
    assert above[("2", "0")] == 0 and above[("0.1", "2")] == 5
    assert families["unthrottle_cpu_active_windows"].samples[0].value == 3
    s.reader.close()
