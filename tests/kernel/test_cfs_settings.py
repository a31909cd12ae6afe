"""Bandwidth settings: what the kernel accepts, and Kubernetes quantities at the edge."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from unthrottle.cgroups import Cgroup, Layout
from unthrottle.units import Bandwidth, InvalidSettings, format_cpu, parse_cpu


class TestKernelRules:
    @pytest.mark.parametrize(
        ("kwargs", "field"),
        [
            ({"quota_us": 999}, "quota"),
            ({"quota_us": 50_000, "period_us": 999}, "period"),
            ({"quota_us": 50_000, "period_us": 1_000_001}, "period"),
            ({"quota_us": 50_000, "burst_us": 50_001}, "burst"),
            ({"quota_us": 50_000, "burst_us": -1}, "burst"),
            ({"quota_us": None, "burst_us": 10_000}, "burst"),
        ],
        ids=[
            "quota-under-1ms",
            "period-under-1ms",
            "period-over-1s",
            "burst-over-quota",
            "negative-burst",
            "burst-without-quota",
        ],
    )
    def test_a_setting_the_kernel_refuses_is_refused_naming_the_field(
        self, kwargs: dict[str, int | None], field: str
    ) -> None:
        with pytest.raises(InvalidSettings) as info:
            Bandwidth(**kwargs)  # type: ignore[arg-type]
        assert info.value.field == field
        assert str(info.value).startswith(f"{field}: ")

    @pytest.mark.parametrize(
        "kwargs",
        [
            {"quota_us": 1_000},
            {"quota_us": 1_000, "period_us": 1_000},
            {"quota_us": 4_000_000, "period_us": 1_000_000},
            {"quota_us": 50_000, "burst_us": 50_000},
            {},
        ],
        ids=["min-quota", "min-period", "max-period-many-cpus", "burst-equal-quota", "unlimited"],
    )
    @pytest.mark.kernel
    def test_the_edges_the_kernel_accepts_are_accepted_and_read_back_from_a_cgroup(
        self, kwargs: dict[str, int], layout: Layout
    ) -> None:
        bandwidth = Bandwidth(**kwargs)
        assert (bandwidth.quota_us, bandwidth.period_us, bandwidth.burst_us) == (
            kwargs.get("quota_us"), kwargs.get("period_us", 100_000), kwargs.get("burst_us", 0)
        )  # fmt: skip
        cgroup = Cgroup(layout, f"unthrottle-test-edges-{os.getpid()}")
        cgroup.create()
        try:
            cgroup.write_bandwidth(bandwidth)
            assert cgroup.read_bandwidth() == bandwidth
        finally:
            cgroup.remove()


class TestMillicores:
    def test_a_limit_becomes_the_quota_the_kubelet_writes(self) -> None:
        assert Bandwidth.from_millicores(500) == Bandwidth(50_000, 100_000)
        assert Bandwidth.from_millicores(1500, period_us=10_000) == Bandwidth(15_000, 10_000)

    def test_a_tiny_limit_is_raised_to_the_kernel_minimum_quota(self) -> None:
        assert Bandwidth.from_millicores(1).quota_us == 1_000

    def test_no_limit_is_unlimited(self) -> None:
        assert not Bandwidth.from_millicores(None).limited

    def test_a_non_positive_limit_is_refused(self) -> None:
        with pytest.raises(InvalidSettings, match="limit"):
            Bandwidth.from_millicores(0)

    @given(st.integers(10, 64_000))
    def test_millicores_round_trip_through_the_quota(self, millicores: int) -> None:
        assert Bandwidth.from_millicores(millicores).millicores == millicores


class TestQuantities:
    @pytest.mark.parametrize(
        ("text", "millicores"),
        [
            ("500m", 500),
            ("1.5", 1500),
            ("2", 2000),
            (2, 2000),
            (0.25, 250),
            ("0.0001", 1),
            (" 250m ", 250),
            ("100m", 100),
            (".5", 500),
        ],
    )
    def test_kubernetes_cpu_quantities_parse_to_millicores(
        self, text: str | float, millicores: int
    ) -> None:
        assert parse_cpu(text) == millicores

    @pytest.mark.parametrize("text", ["", "abc", "1Gi", "-1", "1.5.2", "m"])
    def test_anything_else_is_refused_with_the_value_shown(self, text: str) -> None:
        with pytest.raises(ValueError, match="not a CPU quantity"):
            parse_cpu(text)

    @pytest.mark.parametrize(("millicores", "text"), [(2000, "2"), (1500, "1500m"), (1, "1m")])
    def test_millicores_format_as_the_shortest_quantity(self, millicores: int, text: str) -> None:
        assert format_cpu(millicores) == text

    @given(st.integers(0, 10**7))
    def test_formatting_then_parsing_gives_the_same_amount(self, millicores: int) -> None:
        assert parse_cpu(format_cpu(millicores)) == millicores


class TestKernelRulesProperty:
    @given(
        st.one_of(st.none(), st.integers(-10, 3_000_000)),
        st.integers(0, 2_000_000),
        st.integers(-10, 3_000_000),
    )
    def test_settings_are_accepted_exactly_when_the_kernel_would_take_them(
        self, quota: int | None, period: int, burst: int
    ) -> None:
        kernel_takes = (
            1_000 <= period <= 1_000_000
            and (quota is None or quota >= 1_000)
            and burst >= 0
            and (burst == 0 or (quota is not None and burst <= quota))
        )
        try:
            Bandwidth(quota, period, burst)
        except InvalidSettings:
            assert not kernel_takes
        else:
            assert kernel_takes
