"""The pod level of the CFS model: a pod quota over its container's (issue 28 §1)."""

from __future__ import annotations

import numpy as np
import pytest

from unthrottle.cfs import pod_series_bandwidth, simulate_pod_series, simulate_series, stalled_us
from unthrottle.units import Bandwidth
from unthrottle_lab.sim.tasks import Machine, simulate_tasks
from unthrottle_lab.workload import Kind, Workload

BATCH = Workload(Kind.BATCH, task_cpu_us=60_000, workers=2, tasks=10)
BURSTY = Workload(Kind.SERIAL, task_cpu_us=20_000, workers=1, tasks=60, think_us=73_000)
ONE_CPU = Bandwidth(100_000, 100_000)
QUARTER_WITH_BURST = Bandwidth(25_000, 100_000, 25_000)
QUARTER = Bandwidth(25_000, 100_000)


class TestTheContainersStall:
    def test_the_pods_throttled_time_is_added_to_the_containers(self) -> None:
        assert stalled_us(800, 100) == 900

    def test_without_a_pod_quota_the_containers_own_is_the_stall(self) -> None:
        assert stalled_us(800, None) == 800

    def test_the_threads_wait_caps_the_sum_and_never_the_containers_own(self) -> None:
        """Both cgroups book a stall when their quotas run out together; the threads' wait
        counts it once."""
        assert stalled_us(800, 400, 1000) == 1000
        assert stalled_us(800, 100, 2000) == 900
        assert stalled_us(800, 100, 500) == 800

    def test_windows_add_up_one_by_one(self) -> None:
        own = np.array([0, 50_000, 10_000], dtype=np.int64)
        pod = np.array([20_000, 0, 5_000], dtype=np.int64)
        assert stalled_us(own, pod).tolist() == [20_000, 50_000, 15_000]


class TestTheTaskModelUnderAPodQuota:
    def test_a_pod_quota_far_above_the_limit_changes_nothing(self) -> None:
        alone = simulate_tasks(BATCH, ONE_CPU, Machine(cores=2))
        in_pod = simulate_tasks(BATCH, ONE_CPU, Machine(cores=2), pod=Bandwidth(1_000_000))
        assert in_pod.stat == alone.stat and in_pod.latency == alone.latency
        assert in_pod.extra["pod"]["nr_throttled"] == 0

    def test_a_pod_quota_below_the_limit_throttles_in_the_pods_counters_only(self) -> None:
        """Two CPUs for the container in a one-CPU pod run as one CPU does, and the
        container's own counters show nothing of it."""
        alone = simulate_tasks(BATCH, ONE_CPU, Machine(cores=2))
        in_pod = simulate_tasks(BATCH, Bandwidth(200_000), Machine(cores=2), pod=ONE_CPU)
        assert in_pod.latency == alone.latency
        assert in_pod.stat.nr_throttled == 0 and in_pod.stat.throttled_us == 0
        assert in_pod.extra["pod"]["throttled_ms"] * 1000 == alone.stat.throttled_us
        assert in_pod.extra["pod"]["nr_throttled"] == alone.stat.nr_throttled

    @pytest.mark.parametrize("pod_phase_ms", [0, 30, 50, 80], ids=lambda p: f"pod-phase-{p}ms")
    def test_a_pod_quota_equal_to_the_limit_leaves_the_batch_as_throttled_as_alone(
        self, pod_phase_ms: int
    ) -> None:
        """The batch uses its whole quota every period: the pod, given the same, runs out
        with the container, wherever its grid lies; the stall is the same in all."""
        alone = simulate_tasks(BATCH, ONE_CPU, Machine(cores=2))
        machine = Machine(cores=2, pod_phase_us=pod_phase_ms * 1000)
        in_pod = simulate_tasks(BATCH, ONE_CPU, machine, pod=ONE_CPU)
        stalled = in_pod.stat.throttled_us + in_pod.extra["pod"]["throttled_ms"] * 1000
        assert stalled == pytest.approx(alone.stat.throttled_us, rel=0.02)
        assert in_pod.latency.p50 == pytest.approx(alone.latency.p50, rel=0.02)

    @pytest.mark.parametrize("pod_phase_ms", [0, 50], ids=lambda p: f"pod-phase-{p}ms")
    def test_a_containers_burst_is_taken_away_by_a_pod_quota_without_one(
        self, pod_phase_ms: int
    ) -> None:
        """A 20 ms task every 93 ms at 0.25 CPU: a 25 ms burst stops the throttling of a
        container alone; in a pod whose quota is the same 0.25 CPU with no burst (as a
        kubelet makes it) the pod throttles as the container would with no burst, and the
        container's own counters read 0."""
        machine = Machine(cores=2, pod_phase_us=pod_phase_ms * 1000)
        with_burst = simulate_tasks(BURSTY, QUARTER_WITH_BURST, machine)
        without = simulate_tasks(BURSTY, QUARTER, machine)
        in_pod = simulate_tasks(BURSTY, QUARTER_WITH_BURST, machine, pod=QUARTER)
        assert with_burst.stat.nr_throttled == 0 and without.stat.nr_throttled > 5
        assert in_pod.stat.nr_throttled == 0
        assert in_pod.extra["pod"]["nr_throttled"] == without.stat.nr_throttled
        assert in_pod.latency.p95 == without.latency.p95 > with_burst.latency.p95

    def test_the_pods_phase_is_reported_with_its_counters(self) -> None:
        machine = Machine(cores=2, pod_phase_us=30_000)
        figures = simulate_tasks(BATCH, ONE_CPU, machine, pod=ONE_CPU)
        assert figures.extra["pod_period_phase_ms"] == 30.0
        assert set(figures.extra["pod"]) == {"nr_periods", "nr_throttled", "throttled_ms",
                                             "throttle_ratio"}  # fmt: skip


class TestTheSeriesModelUnderAPodQuota:
    SPIKES = np.array([20_000 if i % 5 == 0 else 0 for i in range(100)], dtype=np.int64)

    def test_a_burst_the_pod_has_not_is_not_spent(self) -> None:
        """10 ms a period with a 10 ms burst absorbs a 20 ms spike every 5 periods alone;
        under a pod quota of the same 10 ms with no burst, every spike throttles."""
        burst = Bandwidth(10_000, 100_000, 10_000)
        pod = Bandwidth(10_000, 100_000)
        assert simulate_series(self.SPIKES, burst).nr_throttled == 0
        assert simulate_series(self.SPIKES, burst, pod=pod).nr_throttled == 20
        assert simulate_series(self.SPIKES, burst, pod=pod) == simulate_series(self.SPIKES, pod)

    @pytest.mark.parametrize(
        ("container", "pod", "pair"),
        [
            (QUARTER_WITH_BURST, None, QUARTER_WITH_BURST),
            (QUARTER_WITH_BURST, QUARTER, QUARTER),
            (QUARTER_WITH_BURST, Bandwidth(50_000, 100_000), QUARTER_WITH_BURST),
            (QUARTER_WITH_BURST, Bandwidth(40_000, 100_000), Bandwidth(25_000, 100_000, 15_000)),
            (Bandwidth(200_000), ONE_CPU, ONE_CPU),
            (Bandwidth(None), ONE_CPU, ONE_CPU),
        ],
        ids=["no-pod", "equal-no-burst", "pod-room-for-the-burst", "pod-room-for-part",
             "pod-below-the-limit", "no-container-limit"],
    )  # fmt: skip
    def test_the_pair_is_one_bandwidth(
        self, container: Bandwidth, pod: Bandwidth | None, pair: Bandwidth
    ) -> None:
        assert pod_series_bandwidth(container, pod) == pair

    def test_a_pod_on_another_period_is_refused_at_this_level(self) -> None:
        with pytest.raises(ValueError, match="pod"):
            pod_series_bandwidth(ONE_CPU, Bandwidth(50_000, 50_000))


class TestSeveralContainersOfAPod:
    RNG = np.random.default_rng(1)
    BUSY = RNG.integers(0, 150_000, 500)
    SIDECAR = RNG.integers(0, 60_000, 500)

    def test_one_container_under_a_pod_with_room_is_the_series_alone(self) -> None:
        result = simulate_pod_series([self.BUSY], [ONE_CPU], Bandwidth(10_000_000))
        assert result.containers[0] == simulate_series(self.BUSY, ONE_CPU)

    def test_a_pod_quota_that_is_the_sum_of_the_limits_never_binds_without_bursts(self) -> None:
        limits = [ONE_CPU, Bandwidth(50_000)]
        result = simulate_pod_series([self.BUSY, self.SIDECAR], limits, Bandwidth(150_000))
        assert result.pod_nr_throttled == 0
        assert [c.nr_throttled for c in result.containers] == [
            simulate_series(self.BUSY, ONE_CPU).nr_throttled,
            simulate_series(self.SIDECAR, Bandwidth(50_000)).nr_throttled,
        ]

    def test_a_pod_quota_below_the_sum_throttles_both_as_one(self) -> None:
        """Each container may use the whole pod quota; the pod then binds as one cgroup
        holding both would, and both containers count the periods it was short."""
        each = Bandwidth(150_000)
        result = simulate_pod_series([self.BUSY, self.SIDECAR], [each, each], each)
        together = simulate_series(self.BUSY + self.SIDECAR, each)
        assert result.pod_nr_throttled == together.nr_throttled
        assert result.worst_ratio >= together.throttle_ratio - 0.01
        assert sum(c.used_us for c in result.containers) == together.used_us

    def test_containers_and_their_series_must_match(self) -> None:
        with pytest.raises(ValueError, match="one series per container"):
            simulate_pod_series([self.BUSY], [ONE_CPU, ONE_CPU], ONE_CPU)


@pytest.mark.parametrize("seed", range(30))
def test_a_pod_whose_quota_and_burst_are_its_containers_sums_throttles_none_of_them_more(
    seed: int,
) -> None:
    # a kubelet's pod quota is the sum of the limits, and the agent writes the sum of the
    # bursts into the pod: each container's own bucket then binds first, so sizing each
    # container to the target sizes the sum (on one grid: the phase between them is the
    # kernel's, measured in the pod's counters and counted into the containers' demand)
    rng = np.random.default_rng(seed)
    k = int(rng.integers(2, 4))
    demands = [np.where(rng.random(300) < 0.5, rng.integers(0, 250_000, 300), 0) for _ in range(k)]
    containers = []
    for _ in range(k):
        quota = int(rng.integers(10_000, 150_000))
        containers.append(Bandwidth(quota, 100_000, int(rng.integers(0, quota + 1))))
    pod = Bandwidth(sum(c.quota_us or 0 for c in containers), 100_000,
                    sum(c.burst_us for c in containers))  # fmt: skip
    together = simulate_pod_series(demands, containers, pod)
    assert together.pod_nr_throttled == 0
    for demand, container, result in zip(demands, containers, together.containers, strict=True):
        alone = simulate_series(demand, container)
        assert (result.nr_throttled, result.used_us) == (alone.nr_throttled, alone.used_us)


def test_a_pod_without_its_containers_bursts_throttles_them_when_they_burst_together() -> None:
    each = Bandwidth(50_000, 100_000, 50_000)
    demands = [[0, 100_000, 0], [0, 100_000, 0]]
    summed = simulate_pod_series(demands, [each, each], Bandwidth(100_000, 100_000, 100_000))
    bare = simulate_pod_series(demands, [each, each], Bandwidth(100_000, 100_000))
    assert summed.pod_nr_throttled == 0 and summed.worst_ratio == 0
    assert bare.pod_nr_throttled == 1 and bare.worst_ratio > 0
