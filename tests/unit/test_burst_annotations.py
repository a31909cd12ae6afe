"""Burst annotations: every accepted form, and errors that name the annotation."""

from __future__ import annotations

from pathlib import Path

import pytest

from unthrottle.model.burst import (
    BURST_ANNOTATION,
    KOORDINATOR_ANNOTATION,
    BurstAnnotationError,
    BurstSpec,
    burst_specs,
    spec_for,
)


@pytest.mark.parametrize(
    ("value", "container", "quota", "burst"),
    [
        ("40ms", "api", 50_000, 40_000),
        ("40000us", "api", 50_000, 40_000),
        ("0.02s", "api", 50_000, 20_000),
        ("50%", "api", 30_000, 15_000),
        ("api=40ms,envoy=5ms", "envoy", 50_000, 5_000),
        ("*=10ms,api=40ms", "worker", 50_000, 10_000),
        ("0", "api", 50_000, 0),
        ("api=0", "api", 50_000, 0),
    ],
    ids=["ms", "us", "s", "percent", "per-container", "default", "zero", "zero-per-container"],
)
def test_our_annotation(value: str, container: str, quota: int, burst: int) -> None:
    spec = spec_for(burst_specs({BURST_ANNOTATION: value}), container)
    assert spec is not None and spec.resolve(quota) == (burst, False)


def test_a_container_the_annotation_does_not_name_gets_none() -> None:
    assert spec_for(burst_specs({BURST_ANNOTATION: "api=40ms"}), "envoy") is None


def test_more_than_the_quota_is_clamped_and_says_so() -> None:
    assert BurstSpec(burst_us=80_000).resolve(50_000) == (50_000, True)
    assert BurstSpec(percent=150).resolve(20_000) == (20_000, True)


def test_no_limit_means_no_burst() -> None:
    assert BurstSpec(burst_us=40_000).resolve(None) == (0, False)


@pytest.mark.parametrize(
    ("value", "percent"),
    [('{"policy": "auto", "cpuBurstPercent": 50}', 50.0), ('{"policy": "cpuBurstOnly"}', 1000.0),
     ('{"policy": "none", "cpuBurstPercent": 50}', None),
     ('{"policy": "cfsQuotaBurstOnly"}', None)],
    ids=["auto", "default-percent", "none", "quota-burst-only"],
)  # fmt: skip
def test_koordinators_annotation(value: str, percent: float | None) -> None:
    spec = spec_for(burst_specs({KOORDINATOR_ANNOTATION: value}), "api")
    assert spec is not None
    assert spec.percent == percent
    if percent is None:
        assert spec.resolve(50_000) == (0, False)


def test_ours_wins_over_koordinators() -> None:
    specs = burst_specs({BURST_ANNOTATION: "5ms", KOORDINATOR_ANNOTATION: '{"policy": "auto"}'})
    assert specs == {"*": BurstSpec(burst_us=5_000)}


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        ({BURST_ANNOTATION: "40"}, "unthrottle.io/cpu-burst: '40' needs a unit"),
        ({BURST_ANNOTATION: "fast"}, "unthrottle.io/cpu-burst: 'fast' is not a duration"),
        ({BURST_ANNOTATION: "api=1ms,api=2ms"}, "container 'api' appears twice"),
        ({BURST_ANNOTATION: "api=1ms,5ms"}, "'5ms' is not CONTAINER=AMOUNT"),
        ({BURST_ANNOTATION: "api=-3ms"}, "api: '-3ms' is not a duration"),
        ({KOORDINATOR_ANNOTATION: "{nope"}, "koordinator.sh/cpuBurst: not JSON"),
        ({KOORDINATOR_ANNOTATION: '{"policy": "max"}'}, "unknown policy 'max'"),
        ({KOORDINATOR_ANNOTATION: '{"cpuBurstPercent": -1}'}, "cpuBurstPercent -1"),
    ],
    ids=["no-unit", "words", "twice", "missing-name", "negative", "bad-json", "bad-policy",
         "negative-percent"],
)  # fmt: skip
def test_a_bad_annotation_names_itself_and_the_part(
    annotations: dict[str, str], message: str
) -> None:
    with pytest.raises(BurstAnnotationError, match=message.replace("(", r"\(")):
        burst_specs(annotations)


def test_a_kernel_without_burst_skips_writes_and_says_why_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from unthrottle.agent.burst import BurstWriter
    from unthrottle.agent.discovery import discover_kubepods
    from unthrottle.agent.naming import PodInfo, name_cgroups
    from unthrottle.cgroups import Layout, Version

    root = tmp_path
    uid, cid = "6f1e7c2a-93b4-4c1d-8e2f-0a1b2c3d4e5f", "a" * 64
    container = root / "kubepods" / "burstable" / f"pod{uid}" / cid
    container.mkdir(parents=True)
    for d in (container, container.parent):
        (d / "cpu.max").write_text("30000 100000\n")  # a kernel before 5.14: no cpu.max.burst
    layout = Layout(Version.V2, root, root)

    class Calm:
        def usage(self) -> float:
            return 0.0

    writer = BurstWriter(layout, Calm())
    pods = [PodInfo("shop", "api-1", uid, {cid: "api"}, {BURST_ANNOTATION: "10ms"})]
    for _ in range(3):
        writer.apply(name_cgroups(discover_kubepods(layout), pods), pods)
    assert not (container / "cpu.max.burst").exists()
    assert writer.granted == {}
    too_old = [r for r in caplog.records if "kernel too old for CPU burst" in r.getMessage()]
    assert len(too_old) == 1
