"""How much do unaligned sampling windows matter? The agent's sampling against the kernel.

    sudo .venv/bin/python bench/window_alignment.py > bench/results/window-alignment.md

The agent cannot see the kernel's period grid; its 100 ms windows straddle
periods. The lab can (it calibrates the grid), so its per-period samples are
the truth. For throttled workloads, the same run is sampled by the agent's
own reader at once:

- ``aligned``: the lab's per-period samples (the truth);
- ``100ms @25/50/75``: plain windows, a quarter, half, three quarters off the grid;
- ``sliding 25ms``: readings every 25 ms, demand over the last 100 ms each time;
- ``sliding max``: of each four sliding windows, the largest (an upper estimate).

Compared: demand quantiles (cores), and the throttle ratio the CFS model
predicts from each series at the run's own quota, against what cpu.stat
counted. Prints a Markdown table (docs/benchmarks.md §6).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from unthrottle.cfs import simulate_series
from unthrottle.cgroups import Cgroup, detect_layout
from unthrottle.cgroups.counters import CounterReader
from unthrottle.units import Bandwidth
from unthrottle_lab.runner import LabOptions, run_sampled
from unthrottle_lab.scenario import load_scenario
from unthrottle_lab.schedule import ScheduledReader

ROOT = Path(__file__).resolve().parent.parent
CASES = [("seed-002-burst.yaml", 0), ("tune-open-pool.yaml", 0), ("tune-batch-parallel.yaml", 0),
         ("seed-000-serial-5ms.yaml", 1)]  # fmt: skip
PERIOD_MS = 100
SAMPLINGS = [("100ms @25", 100, 25), ("100ms @50", 100, 50), ("100ms @75", 100, 75),
             ("sliding 25ms", 25, 1)]  # fmt: skip


def quantiles(values: list[float] | np.ndarray) -> str:
    arr = np.asarray(values, dtype=float)
    arr = arr[arr > 0] if arr.size else arr
    if not arr.size:
        return "- | - | -"
    p = np.percentile(arr, [50, 90, 99], method="inverted_cdf")
    return " | ".join(f"{x:.2f}" for x in p)


def predicted(values: list[float] | np.ndarray, bandwidth: Bandwidth) -> float:
    demand = np.round(np.asarray(values) * bandwidth.period_us).astype(np.int64)
    return simulate_series(demand, bandwidth).throttle_ratio


def main() -> int:
    layout = detect_layout()
    rows = ["| scenario | sampling | p50 | p90 | p99 | predicted ratio | cpu.stat ratio |",
            "|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, index in CASES:
        scenario = load_scenario(ROOT / "scenarios" / name)
        spec = scenario.runs[index]
        samplers: dict[str, ScheduledReader] = {}
        readers: list[CounterReader] = []

        def watch(
            cgroup: Cgroup,
            t0: int,
            period_ns: int,
            samplers: dict[str, ScheduledReader] = samplers,
            readers: list[CounterReader] = readers,
        ) -> Callable[[], None]:
            for label, step, phase in SAMPLINGS:
                reader = CounterReader(layout, cgroup.path)
                readers.append(reader)
                samplers[label] = ScheduledReader(reader, t0, step * 1_000_000, phase * 1_000_000)
                samplers[label].start()

            def stop(samplers: dict[str, ScheduledReader] = samplers) -> None:
                for s in samplers.values():
                    s.stop()

            return stop

        figures, truth = run_sampled(scenario.workload.to_workload(), spec, layout,
                                     LabOptions(), watch=watch)  # fmt: skip
        for reader in readers:
            reader.close()
        bandwidth = spec.bandwidth()
        real = figures.stat.throttle_ratio
        aligned = truth.demand_us / truth.period_us
        rows.append(f"| {scenario.name} ({spec.label()}) | aligned (truth) | {quantiles(aligned)} "
                    f"| {predicted(aligned, bandwidth):.3f} | {real:.3f} |")  # fmt: skip
        for label, sampler in samplers.items():
            values = sampler.demands(PERIOD_MS * 1_000_000)
            rows.append(f"| | {label} | {quantiles(values)} | {predicted(values, bandwidth):.3f} "
                        f"| {real:.3f} |")  # fmt: skip
            if label.startswith("sliding"):
                blocks = [max(values[i : i + 4]) for i in range(0, len(values) - 3, 4)]
                rows.append(f"| | sliding max | {quantiles(blocks)} "
                            f"| {predicted(blocks, bandwidth):.3f} | {real:.3f} |")  # fmt: skip
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
