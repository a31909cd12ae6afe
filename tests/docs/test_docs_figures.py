"""The figures the docs quote are the ones the benchmarks' results files hold.

Each figure is computed once, below, from a results file that a ``bench/`` script writes
(``bench/results/*.json``, and the Markdown table of §6), and every place that quotes it
(docs/benchmarks.md §1 and §5–§13, README.md, docs/install.md, a test's comment) is
checked for the same text; each table of §5–§13 is rebuilt from its file. A figure
edited in the docs without its results, or results saved without the docs, fail here.
Markdown wraps lines anywhere, so the docs are compared with their whitespace collapsed.
No kernel, no server: the files are read, nothing is measured.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from support.docs import RESULTS, number, prose, results, section, span
from support.paths import ROOT


def kib(size: int) -> str:
    return f"{number(size / 1024)} KiB"


def seconds(spread: dict[str, float]) -> str:
    """``0.49 s (0.26–1.48)``: a median and its min–max, two decimals below a second."""
    digits = 2 if spread["median"] < 1 else 1
    low, high = number(spread["min"], digits), number(spread["max"], digits)
    return f"{number(spread['median'], digits)} s ({low}–{high})"


# -- the figures, each computed in one place ---------------------------------------------


def pod_quota_sum() -> str:
    """``8.2–9.8``: the container's own throttled time and its pod's together, per run with
    the pod's quota (what the evidence counts since issue 28), seconds."""
    runs = results("pod-quota.json")["runs"]
    return span([r["container_throttled_s"] + r["pod_throttled_s"] for r in runs
                 if r["pod_quota"]], 1)  # fmt: skip


def pod_wait(key: str, pod: str, container: str) -> str:
    """``0.94–0.97``: bench/pod_wait.py's cases with these quotas, seconds."""
    cases = results("pod-wait.json")["cases"]
    return span([c[key] for c in cases if (c["pod"], c["container"]) == (pod, container)], 2)


def pod_wait_table() -> list[str]:
    """§4: the pod's throttled time and the run delay, case by case."""
    return [f"| {c['pod']} | {c['container']} | {c['usage_s']:.2f} "
            f"| {c['container_throttled_s']:.2f} | {c['pod_throttled_s']:.2f} "
            f"| {c['run_delay_s']:.2f} |" for c in results("pod-wait.json")["cases"]]  # fmt: skip


def pod_quota(key: str, *, with_quota: bool) -> str:
    """``7.1–8.6``: bench/pod_quota.py's runs with or without the pod's quota, seconds."""
    runs = results("pod-quota.json")["runs"]
    return span([r[key] for r in runs if r["pod_quota"] is with_quota], 1)


def open_pool_load(setting: str, *limits: str) -> str:
    """``24–28``: bench/open_pool_load.py's p95 (ms) in one setting, over the runs named."""
    (row,) = [r for r in results("open-pool-load.json")["settings"] if r["setting"] == setting]
    return span([p for limit in limits for p in row["p95_ms"][limit]], 0)


def late_read(key: str) -> str:
    """``1.07–1.18``: a ratio's span over bench/late_readings.py's runs read late on purpose
    whose truth test_censoring accepts (two busy threads: a median window over 150 ms)."""
    runs = results("late-readings.json")["runs"]
    return span([r[key] for r in runs if r["truth_median_window_ms"] > 150], 2)


def late_booked() -> Any:
    """bench/late_readings.py's run with nothing read late on purpose, and its truth."""
    return results("late-booked.json")["runs"][0]


def burst_throttled() -> str:
    """``4–13 of 55–59``: throttled periods of the burst seed at 0.25 CPU over the identical
    runs of bench/host_steal.py, and how many periods they spanned."""
    counts = [r["throttled"].split() for r in results("host-steal.json")["runs"]
              if r["run"] == "0.25 CPU"]  # fmt: skip
    return f"{span([int(c[0]) for c in counts], 0)} of {span([int(c[-1]) for c in counts], 0)}"


def agent_runs(
    *, busy: int, skip: bool, layout: str | None = None, wait: bool = True
) -> list[dict[str, Any]]:
    """The runs of bench/agent_cost.py; by default as shipped, with the threads' wait."""
    return [r for r in results("agent-cost.json")["runs"]
            if r["busy"] == busy and r["skip_quiet_subtrees"] == skip
            and r["measure_wait"] == wait and layout in (None, r["layout"])]  # fmt: skip


def agent_sizing(threads: int, key: str, digits: int = 1) -> str:
    """bench/agent_sizing.py's run with ``threads`` per container: ``71.8``."""
    (run,) = [r for r in results("agent-sizing.json")["runs"]
              if r["threads_per_container"] == threads]  # fmt: skip
    return f"{run[key]:.{digits}f}"


def agent_cost_running(*, wait: bool = True) -> str:
    """The agent's share of a core, 10 of 200 containers running, as shipped (skipping
    quiet subtrees, reading the wait), or without the wait."""
    return span([r["core_pct"] for r in agent_runs(busy=10, skip=True, wait=wait)], 2, " %")


def agent_cost_idle(*, wait: bool = True) -> str:
    return span([r["core_pct"] for r in agent_runs(busy=0, skip=True, wait=wait)], 2, " %")


def agent_wait_read(key: str, digits: int) -> str:
    """The cost of reading one container's threads' wait, measured apart (§5)."""
    return number(results("agent-cost.json")["wait_read"][key], digits)


def agent_scrape_per_container() -> str:
    return number(results("agent-cost.json")["scrape"]["ms_per_container"], 3)


def agent_discovery_share() -> str:
    runs = agent_runs(busy=10, skip=True) + agent_runs(busy=0, skip=True)
    return span([r["discovery_thread_pct"] for r in runs], 2, " %")


def steady_samples_share() -> str:
    """A steady reconcile's samples, as a share of the first read's, on average over the
    hour of reconciles (the hourly one reads the tail too) (§9)."""
    return number(100 * results("operator-reconcile.json")["summary"]["steady_samples_share_mean"],
                  2) + " %"  # fmt: skip


def _steady(head_only: bool) -> list[dict[str, Any]]:
    """The steady reconciles that read only the head, or the ones that read more."""
    reconciles = results("operator-reconcile.json")["reconciles"][1:]
    return [r for r in reconciles if (r["reads"] == ["head"]) == head_only]


def steady_cpu() -> str:
    """A steady reconcile's CPU, the ones that read only the head (§9)."""
    return span([r["cpu_s"] for r in _steady(True)], 2, " s")


def hourly_cpu() -> str:
    """The hourly one's: the head, the tail and the report (§9)."""
    return span([r["cpu_s"] for r in _steady(False)], 2, " s")


def recommend_queries(which: str) -> int:
    return int(results("recommend-queries.json")[which]["instant_queries"])


def fetch_queries() -> int:
    return int(results("cluster-query.json")["queries"])


def cluster_seconds() -> str:
    return number(results("cluster-query.json")["ours_s"]) + " s"


def fewer_queries() -> str:
    return number(results("cluster-query.json")["fewer_queries"]) + "×"


def same_recommendations() -> str:
    return results("operator-reconcile.json")["same_recommendations"]


def model_speed(digits: int) -> str:
    return number(results("simulate-speed.json")["median_s"], digits) + " s"


def inplace_span(method: str, key: str, digits: int, unit: str = "") -> str:
    """The range of one figure's medians over the scenarios of a method ("": all)."""
    medians = []
    for scenario, s in results("inplace.json")["summary"].items():
        if method in scenario:
            figure = s["per_deployment"].get(key) or s[key]
            medians.append(figure["median"])
    return span(medians, digits, unit)


def fresh_machine_s() -> float:
    """What a fresh machine spends on the control plane: the download and the cold build."""
    r = results("controlplane.json")
    return float(r["download_s"] + r["cold_s"])


def fresh_machine_minutes() -> str:
    return number(fresh_machine_s() / 60)


def demo_span(side: str, key: str, digits: int, unit: str, scale: float = 1.0) -> str:
    """A figure of both of `make demo`'s workloads, on one side of its table."""
    workloads = results("demo-real-node.json")["workloads"].values()
    return span([w[side][key] * scale for w in workloads], digits, unit)


def demo_after(name: str, key: str) -> Any:
    return results("demo-real-node.json")["workloads"][name]["after"][key]


def demo_before(name: str, key: str) -> Any:
    return results("demo-real-node.json")["workloads"][name]["before"][key]


def demo_expected(name: str) -> str:
    (w,) = [w for w in results("demo-real-node.json")["recommended"] if w["deployment"] == name]
    return number(w["containers"][0]["expectedThrottleRatio"] * 100, 1) + " %"


def demo_rows() -> list[str]:
    """The README's copy of `make demo`'s table, rebuilt from the run's results."""
    rows = []
    for name, w in results("demo-real-node.json")["workloads"].items():
        for label, fig in (("today", w["before"]), ("unthrottle", w["after"])):
            kernel = fig["kernel"]
            limit = round(kernel["quota_us"] / 100)
            cpu = f"{limit // 1000}" if limit % 1000 == 0 else f"{limit}m"
            rows.append(" ".join([
                name if label == "today" else "", label, fig["pod"], str(fig["restarts"]),
                f"{cpu} / {kernel['burst_us'] / 1000:g} ms",
                f"{fig['throttle_ratio'] * 100:.0f} %",
                f"{fig['pod_throttle_ratio'] * 100:.0f} % / {fig['pod_throttled_s']:.1f} s",
                f"{fig['p99_ms']:.1f} ms"]).strip())  # fmt: skip
    return rows


PEAKS = "clustered-peaks.json"
PEAKS_SHUFFLED = "clustered-peaks-shuffled.json"
"""The same bench with the engine before the order worst for a burst (a histogram alone
rebuilt and shuffled, its peaks taken to stand apart): what the README says it got."""


def peaks_first(scenario: str, view: str, file: str = PEAKS) -> list[dict[str, Any]]:
    """The first recommendation of each ``bench/clustered_peaks.py`` run (from today's
    throttled run, as the operator makes it), and the kernel's run under it."""
    return [r["recommendation"] for r in results(file)["runs"]
            if (r["scenario"], r["view"]) == (scenario, view)]  # fmt: skip


def peaks(scenario: str, view: str, key: str, file: str = PEAKS) -> str:
    """One figure of those runs, as the docs quote it: ``1,810m``, ``44 ms``, ``55.0 %``."""
    values = [f[key] for f in peaks_first(scenario, view, file)]
    if key == "limit_millicores":
        return span(values, 0, "m")
    if key == "burst_us":
        return span([v / 1000 for v in values], 0, " ms")
    return span([v * 100 for v in values], 1, " %")


def peaks_rows() -> list[str]:
    def cell(f: dict[str, Any] | None) -> str:
        if f is None:
            return "– | – | –"
        return (f"{f['limit_millicores']}m + {f['burst_us'] / 1000:g} ms | "
                f"{f['expected_throttle_ratio']:.3f} | {f['kernel_throttle_ratio']:.2f} "
                f"({f['nr_throttled']} of {f['nr_periods']})")  # fmt: skip

    return [f"| {r['scenario']} | {r['view']} | {r['before_throttle_ratio']:.2f} | "
            f"{cell(r['recommendation'])} | {cell(r['refined'])} |"
            for r in results(PEAKS)["runs"]]  # fmt: skip


def test_the_peaks_table_is_the_saved_runs() -> None:
    missing = [row for row in map(" ".join, map(str.split, peaks_rows())) if row not in section(4)]
    assert not missing, "docs/benchmarks.md §4 should hold:\n" + "\n".join(missing)


Quote = tuple[str, str, Callable[[], object]]
"""(document, text with ``{}`` where the figure goes, the figure)."""

QUOTES: list[Quote] = [
    # peaks in runs against peaks apart (§4, README "Limits")
    ("docs/limits.md", "with the backlog series, got {} and no burst",
     lambda: peaks("tune-batch-runs", "agent", "limit_millicores")),
    ("docs/limits.md", "and no burst, {} throttled; seed 002",
     lambda: peaks("tune-batch-runs", "agent", "kernel_throttle_ratio")),
    ("docs/limits.md", "seed 002's scattered peaks kept a {} burst",
     lambda: peaks("seed-002-burst", "agent", "burst_us")),
    ("docs/limits.md", "burst at {}, ",
     lambda: peaks("seed-002-burst", "agent", "limit_millicores")),
    ("docs/limits.md", "and were {} throttled",
     lambda: peaks("seed-002-burst", "agent", "kernel_throttle_ratio")),
    ("docs/limits.md", "the batch got {} and no burst",
     lambda: peaks("tune-batch-runs", "histogram", "limit_millicores")),
    ("docs/limits.md", "and no burst, {} throttled, where the engine before",
     lambda: peaks("tune-batch-runs", "histogram", "kernel_throttle_ratio")),
    ("docs/limits.md", "had got {} with a",
     lambda: peaks("tune-batch-runs", "histogram", "limit_millicores", PEAKS_SHUFFLED)),
    ("docs/limits.md", "with a {} burst, expected",
     lambda: peaks("tune-batch-runs", "histogram", "burst_us", PEAKS_SHUFFLED)),
    ("docs/limits.md", "expected {}, and the kernel throttled",
     lambda: peaks("tune-batch-runs", "histogram", "expected_throttle_ratio", PEAKS_SHUFFLED)),
    ("docs/limits.md", "the kernel throttled {} of its periods",
     lambda: peaks("tune-batch-runs", "histogram", "kernel_throttle_ratio", PEAKS_SHUFFLED)),
    ("docs/limits.md", "seed 002 got {} with a",
     lambda: peaks("seed-002-burst", "histogram", "limit_millicores")),
    ("docs/limits.md", "with a {} burst from the histogram alone",
     lambda: peaks("seed-002-burst", "histogram", "burst_us")),
    ("docs/benchmarks.md", "The batch gets {} and no burst from today's run",
     lambda: peaks("tune-batch-runs", "histogram", "limit_millicores")),
    ("docs/benchmarks.md", "it got {} with a",
     lambda: peaks("tune-batch-runs", "histogram", "limit_millicores", PEAKS_SHUFFLED)),
    ("docs/benchmarks.md", "with a {} burst, expected",
     lambda: peaks("tune-batch-runs", "histogram", "burst_us", PEAKS_SHUFFLED)),
    ("docs/benchmarks.md", "expected {}, and the kernel throttled",
     lambda: peaks("tune-batch-runs", "histogram", "expected_throttle_ratio", PEAKS_SHUFFLED)),
    ("docs/benchmarks.md", "the kernel throttled {} of its periods",
     lambda: peaks("tune-batch-runs", "histogram", "kernel_throttle_ratio", PEAKS_SHUFFLED)),
    ("docs/benchmarks.md", "the burst stays ({} + ",
     lambda: peaks("seed-002-burst", "agent", "limit_millicores")),
    ("docs/benchmarks.md", "+ {}). From the histogram",
     lambda: peaks("seed-002-burst", "agent", "burst_us")),
    ("docs/benchmarks.md", "order they might have had: {} with a",
     lambda: peaks("seed-002-burst", "histogram", "limit_millicores")),
    ("docs/benchmarks.md", "with a {} burst, a burst only",
     lambda: peaks("seed-002-burst", "histogram", "burst_us")),
    # the agent's cost: §5, README, install.md and the chart's test quote the same runs
    ("docs/benchmarks.md", "With 10 of 200 containers running: **{}** of one core",
     agent_cost_running),
    ("docs/benchmarks.md", "none running: **{}**", agent_cost_idle),
    ("docs/benchmarks.md", "Without the wait: {} with 10 running",
     lambda: agent_cost_running(wait=False)),
    ("docs/benchmarks.md", "and {} with none", lambda: agent_cost_idle(wait=False)),
    ("docs/benchmarks.md", "reading the wait of {} threads",
     lambda: results("agent-cost.json")["wait_read"]["threads"]),
    ("docs/benchmarks.md", "costs {} µs of CPU per thread",
     lambda: agent_wait_read("us_per_thread_per_read", 2)),
    ("docs/benchmarks.md", "and re-reading its thread list {} µs",
     lambda: agent_wait_read("us_per_list_and_open", 0)),
    ("docs/agent.md", "for 200 containers of which 10 run, {} of one core", agent_cost_running),
    ("docs/agent.md", "without the wait, {})", lambda: agent_cost_running(wait=False)),
    ("docs/agent.md", "when none run, {}", agent_cost_idle),
    ("docs/limits.md", "The agent's sampling costs {} of a core for 200 cgroups",
     agent_cost_running),
    ("docs/limits.md", "10 of them running, {} when none run", agent_cost_idle),
    ("docs/install.md", "sampling 200 containers every 100 ms costs {} of one core",
     agent_cost_running),
    ("docs/install.md", "({} when none run)", agent_cost_idle),
    ("docs/install.md", "a scrape {} ms per container", agent_scrape_per_container),
    ("docs/install.md", "the discovery thread {} of a core", agent_discovery_share),
    ("tests/servers/test_chart.py", "# docs/benchmarks.md §5: {} of a core sampling 200 containers",
     agent_cost_running),
    # the agent with every container running: install.md, §5's table, the chart's values
    ("docs/install.md", "it took {}m with one thread per", lambda: agent_sizing(1, "millicores")),
    ("docs/install.md", "container and {}m with 16", lambda: agent_sizing(16, "millicores")),
    ("docs/install.md", "{} MiB resident at its peak", lambda: agent_sizing(16, "peak_rss_mib")),
    ("charts/unthrottle/values.yaml", "# {}m with one thread each",
     lambda: agent_sizing(1, "millicores", 0)),
    ("charts/unthrottle/values.yaml", "and {}m with 16 each",
     lambda: agent_sizing(16, "millicores", 0)),
    # the operator's steady reconcile: §9 and README
    ("docs/benchmarks.md", "samples; **{}** of the first on average", steady_samples_share),
    ("docs/architecture.md", "later ones read only what is new ({} of the samples",
     steady_samples_share),
    ("docs/limits.md", "reconcile of 1,000 Deployments costs {} of CPU on", steady_cpu),
    ("docs/limits.md", "hourly one, which also reads the first read's tail and rewrites the "
     "report, {})", hourly_cpu),
    ("docs/limits.md", "and {} of the samples of its first read on average",
     steady_samples_share),
    ("docs/limits.md", "and {} of the samples of its first read", steady_samples_share),
    ("docs/limits.md", "({} Deployments there)", lambda: same_recommendations().split(" of ")[0]
     + " of 1,000"),
    ("docs/benchmarks.md", "**{}** equal", same_recommendations),
    # recommend's queries: README and §7
    ("docs/architecture.md", "in {} batched queries", lambda: recommend_queries("with_cluster")),
    ("docs/architecture.md", "({} without cluster access)",
     lambda: recommend_queries("no_cluster")),
    ("docs/benchmarks.md", "`recommend` sends {} queries with cluster access",
     lambda: recommend_queries("with_cluster")),
    ("docs/benchmarks.md", "and {} with `--no-cluster`", lambda: recommend_queries("no_cluster")),
    ("docs/benchmarks.md", "queries sent by `fetch` without cluster access | **{}**",
     fetch_queries),
    ("docs/benchmarks.md", "the same {} queries sent raw", fetch_queries),
    ("docs/architecture.md", "10,000 containers and a week: {} of queries", cluster_seconds),
    ("docs/commands.md", "It sends {} batched queries in all",
     lambda: recommend_queries("with_cluster")),
    ("docs/commands.md", "({} with `--no-cluster`), up", lambda: recommend_queries("no_cluster")),
    ("docs/commands.md", "1,000 Deployments and 7 days: {} of queries (`--no-cluster`)",
     cluster_seconds),
    ("docs/architecture.md", "{} fewer than one query per workload", fewer_queries),
    ("docs/benchmarks.md", "| fewer queries | **{}** |", fewer_queries),
    # Apply in place (§13): the prose beside the tables
    ("docs/benchmarks.md", "the kubelet wrote the canary's quota {} (medians) after the resize was",
     lambda: inplace_span("InPlace", "canary_after_sent_s", 2, " s")),
    ("docs/benchmarks.md", "the change request leaves {}, medians",
     lambda: inplace_span("", "sent_s", 2, " s after it starts")),
    ("docs/benchmarks.md", "{} here, over 15 minutes",
     lambda: inplace_span("InPlace", "every_pod_equiv_s", 0, " s")),
    ("docs/benchmarks.md", "from the operator ({} requests",
     lambda: inplace_span("InPlace", "requests_total", 0)),
    ("docs/benchmarks.md", "against {}): per pod",
     lambda: inplace_span("Rollout", "requests_total", 0)),
    ("docs/benchmarks.md", "a rollout costs more writes ({}: each pod",
     lambda: inplace_span("Rollout", "control_plane_writes", 0)),
    ("docs/benchmarks.md", "than resizing in place ({})",
     lambda: inplace_span("InPlace", "control_plane_writes", 0)),
    ("docs/benchmarks.md", "was up during {} of the 21 runs", lambda: sum(
        r["machine"]["kube_apiservers"] > 1 for r in results("inplace.json")["runs"])),
    ("docs/benchmarks.md", "the whole machine was busy {} of 2", lambda: span(
        [r["machine"]["busy_cores"] for r in results("inplace.json")["runs"]], 1, " cores")),
    # the control plane: a fresh machine's download and build, and a start-up (§12, README)
    ("docs/benchmarks.md", "the download and the cold build, {} (about",
     lambda: number(fresh_machine_s()) + " s"),
    ("docs/benchmarks.md", "(about {} minutes, the figure the README", fresh_machine_minutes),
    ("docs/demo.md", "about {} minutes on 2 cores with the module download", fresh_machine_minutes),
    ("CONTRIBUTING.md", "(about {} minutes on 2 cores the first time", fresh_machine_minutes),
    ("lab/src/unthrottle_lab/kube/build.py", "(from cold about {} minutes on 2 cores",
     fresh_machine_minutes),
    ("CONTRIBUTING.md", "prints the line once all are ready (about {} s)",
     lambda: number(results("controlplane.json")["start_median_s"])),
    ("CONTRIBUTING.md", "The node is Ready about {} s after the control plane",
     lambda: number(results("controlplane.json")["node_start_median_s"])),
    # what the host takes from a lab run (§3, docs/model.md)
    ("docs/benchmarks.md", "the host took at least 1 ms from **{}** runs", lambda: (
        f"{results('host-steal.json')['runs_the_host_took_from']} of "
        f"{len(results('host-steal.json')['runs'])}")),
    ("docs/benchmarks.md", "Their p95 as measured: {}; less",
     lambda: span(results("host-steal.json")["p95_ms_of_those"], 1, " ms")),
    ("docs/benchmarks.md", "less what was lost: {}, against",
     lambda: span(results("host-steal.json")["p95_less_lost_ms_of_those"], 1, " ms")),
    ("docs/benchmarks.md", "against the model's {} (0.25 CPU)",
     lambda: number(results("host-steal.json")["model_p95_ms"]["0.25 CPU"], 1)),
    ("docs/benchmarks.md", "and {} (with the burst)",
     lambda: number(results("host-steal.json")["model_p95_ms"]["0.25 CPU, 25 ms burst"], 1)),
    ("docs/benchmarks.md", "is at most {} ms from the model's",
     lambda: number(results("host-steal.json")["p95_less_lost_farthest_from_model_ms"], 1)),
    ("docs/benchmarks.md", "The worst task took {} ms for 20 ms",
     lambda: number(results("host-steal.json")["worst_task_ms"], 1)),
    ("docs/benchmarks.md", "(below) throttled {} periods", burst_throttled),
    ("scenarios/seed-002-burst.yaml", "{} periods throttled (bench/results/host-steal.json)",
     burst_throttled),
    ("docs/model.md", "tasks measured p95 up to {} ms",
     lambda: number(max(results("host-steal.json")["p95_ms_of_those"]), 1)),
    ("docs/model.md", "and at most {} ms less what was lost",
     lambda: number(max(results("host-steal.json")["p95_less_lost_ms_of_those"]), 1)),
    # the open pool beside other load, isolated or not (§3, README)
    ("docs/limits.md", "an unlimited open pool measured p95 {} ms instead",
     lambda: open_pool_load("beside one hog", "no limit")),
    ("docs/limits.md", "ms instead of {} ms (the machine's other work",
     lambda: open_pool_load("beside nothing", "no limit")),
    ("docs/limits.md", "(the machine's other work, {} cores, ran beside both)", lambda: number(
        results("open-pool-load.json")["settings"][0]["other_load_cores"], 2)),
    ("docs/limits.md", "while a run measures: {} ms beside two hogs",
     lambda: open_pool_load("beside two hogs, isolated", "no limit", "1.2 CPU")),
    ("docs/benchmarks.md", "p95 {} ms unlimited; beside one CPU hog",
     lambda: open_pool_load("beside nothing", "no limit")),
    ("docs/benchmarks.md", "beside one CPU hog, not isolated, {} ms",
     lambda: open_pool_load("beside one hog", "no limit")),
    ("docs/benchmarks.md", "two hogs, isolated, {} ms with or without",
     lambda: open_pool_load("beside two hogs, isolated", "no limit", "1.2 CPU")),
    ("lab/src/unthrottle_lab/isolation.py", "the open pool measured p95 {} ms",
     lambda: open_pool_load("beside two hogs, isolated", "no limit", "1.2 CPU")),
    # one container under a pod-level quota (§3, README)
    ("docs/limits.md", "its throttled time {} s against", lambda: pod_quota(
        "container_throttled_s", with_quota=True)),
    ("docs/limits.md", "s against {} s without the pod quota", lambda: pod_quota(
        "container_throttled_s", with_quota=False)),
    ("docs/limits.md", "the pod's cgroup throttled {} s besides", lambda: pod_quota(
        "pod_throttled_s", with_quota=True)),
    ("docs/benchmarks.md", "the container's throttled time {} s with the pod quota",
     lambda: pod_quota("container_throttled_s", with_quota=True)),
    ("docs/benchmarks.md", "with the pod quota against {} s without",
     lambda: pod_quota("container_throttled_s", with_quota=False)),
    ("docs/benchmarks.md", "was throttled {} s, which the container's own",
     lambda: pod_quota("pod_throttled_s", with_quota=True)),
    ("docs/benchmarks.md", "the container's own and the pod's together are {} s per run",
     pod_quota_sum),
    ("docs/recommend.md", "was throttled {} s by its own counters", lambda: pod_quota(
        "container_throttled_s", with_quota=True)),
    ("docs/recommend.md", "by its own counters, the pod cgroup {} s more", lambda: pod_quota(
        "pod_throttled_s", with_quota=True)),
    ("docs/recommend.md", "s more, against {} s without the pod quota", lambda: pod_quota(
        "container_throttled_s", with_quota=False)),
    ("docs/recommend.md", "(measured: {} s per run, own and pod's together", pod_quota_sum),
    ("docs/recommend.md", "s per run, own and pod's together, against {} s with no pod",
     lambda: pod_quota("container_throttled_s", with_quota=False)),
    ("docs/recommend.md", "and no quota of its own waited {} s of 2 s",
     lambda: pod_wait("run_delay_s", "0.5 CPU", "no quota")),
    ("docs/recommend.md", "s of 2 s, the pod throttled {} s",
     lambda: pod_wait("pod_throttled_s", "0.5 CPU", "no quota")),
    ("docs/benchmarks.md", "throttled time add up to {} s in the first run", lambda: number(
        max(c["container_throttled_s"] + c["pod_throttled_s"] for c in results("pod-wait.json")[
            "cases"] if c["container"] != "no quota" and c["pod"] != "no quota"), 2)),
    ("docs/benchmarks.md", "isolated, 3 runs each (2026-12-03, {} cores of other load)",
     lambda: number(results("pod-quota.json")["other_load_cores"], 2)),
    # late readings attributed by their refills (§3)
    ("docs/benchmarks.md", "(2026-12-03, {} cores of other load), the kernel booked",
     lambda: number(late_booked()["other_load_cores"], 2)),
    ("docs/benchmarks.md", "as read, windows of {} ms took", lambda: " and ".join(
        str(w) for w in late_booked()["largest_windows_as_read_ms"][:2])),
    ("docs/benchmarks.md", "took the recommendation to {}m against",
     lambda: number(late_booked()["as_read_millicores"])),
    ("docs/benchmarks.md", "against the truth's {}m (",
     lambda: number(late_booked()["from_truth_millicores"])),
    ("docs/benchmarks.md", "m ({}×, past `test_censoring`'s 1.25)",
     lambda: number(late_booked()["as_read_ratio"], 2)),
    ("docs/benchmarks.md", "attributed by their refills, {}m",
     lambda: number(late_booked()["attributed_millicores"])),
    ("docs/benchmarks.md", "m ({}×). With six readings",
     lambda: number(late_booked()["attributed_ratio"], 2)),
    ("docs/benchmarks.md", "got two CPUs), as read {}×,", lambda: late_read("as_read_ratio")),
    ("docs/benchmarks.md", "attributed {}×. `tests/unit/test_late_readings.py`",
     lambda: late_read("attributed_ratio")),
    # the model's speed: §1 and README
    ("docs/architecture.md", "of 100 ms periods takes {};", lambda: model_speed(2)),
    # `make demo` on the real node: README's quick start and "Limits"
    ("docs/demo.md", "({} s in all, with the control plane's and the node's start)",
     lambda: results("demo-real-node.json")["elapsed_s"]),
    ("docs/demo.md", "the whole loop (about {} min)",
     lambda: number(results("demo-real-node.json")["elapsed_s"] / 60, 1)),
    ("docs/limits.md", "before the resize the pod cgroups throttled {} of their periods",
     lambda: demo_span("before", "pod_throttle_ratio", 0, " %", 100)),
    ("docs/limits.md", "of their periods ({} in 30 s)",
     lambda: demo_span("before", "pod_throttled_s", 1, " s")),
    ("docs/limits.md", "beside their containers' own {}",
     lambda: demo_span("before", "throttle_ratio", 0, " %", 100)),
    ("docs/limits.md", "containers' own {} (",
     lambda: demo_span("before", "throttle_ratio", 0, " %", 100)),
    ("docs/limits.md", "% ({}), and 0 % after",
     lambda: demo_span("before", "throttled_s", 1, " s")),
    ("docs/demo.md", "pod cgroup was throttled {} in 30 s",
     lambda: f"{demo_before('batch', 'pod_throttled_s'):.1f} s"),
    ("docs/demo.md", "unthrottle sizes from, show {}",
     lambda: f"{demo_before('batch', 'throttled_s'):.1f} s"),
    ("docs/demo.md", "the pool's threads waited {} for a",
     lambda: f"{demo_before('pool', 'agent_wait_s'):.1f} s"),
    ("docs/demo.md", "(their quota throttled them {}), and used",
     lambda: f"{demo_before('pool', 'throttled_s'):.1f} s"),
    ("docs/demo.md", " s), and used {}; the engine counts",
     lambda: f"{demo_before('pool', 'usage_s'):.1f} s"),
    ("docs/demo.md", "where the kernel counted {}",
     lambda: f"{demo_after('pool', 'throttle_ratio') * 100:.1f} %"),
    ("docs/limits.md", "the batch got {} and a",
     lambda: number(demo_after("batch", "limit_millicores")) + "m"),
    ("docs/limits.md", "and a {} burst there",
     lambda: f"{demo_after('batch', 'burst_us') / 1000:g} ms"),
    ("docs/demo.md", "so it expected the pool {} throttled", lambda: demo_expected("pool")),
    ("docs/benchmarks.md", "median {} (7 runs", lambda: model_speed(3)),
]  # fmt: skip


@pytest.mark.parametrize("doc, text, figure", QUOTES, ids=[f"{d}: {t}" for d, t, _ in QUOTES])
def test_the_docs_quote_the_figure_its_results_file_holds(
    doc: str, text: str, figure: Callable[[], object]
) -> None:
    assert text.count("{}") == 1, "a quote holds its figure once"
    quoted = text.format(figure())
    assert quoted in prose(doc), f"{doc} should say: {quoted}"


# -- tables, rebuilt from their results ---------------------------------------------------


def agent_cost_table() -> list[str]:
    def each(runs: list[dict[str, Any]]) -> str:
        return ", ".join(number(r["core_pct"], 2) for r in runs) + " %"

    def per_window(runs: list[dict[str, Any]]) -> str:
        return span([r["sampling_thread_ms_per_window"] for r in runs], 2, " ms")

    rows = []
    for busy in (10, 0):
        for layout, label in (("flat", "flat, 200 series"), ("kubelet", "kubelet, 300 series")):
            runs = {(skip, wait): agent_runs(busy=busy, skip=skip, layout=layout, wait=wait)
                    for skip in (True, False) for wait in (True, False)}  # fmt: skip
            running = f"{busy} of 200" if busy else "none"
            rows.append(
                f"| {label} | {running} | **{each(runs[True, True])}** "
                f"| {each(runs[True, False])} | {each(runs[False, True])} "
                f"| {each(runs[False, False])} | {per_window(runs[True, True])} "
                f"| {per_window(runs[True, False])} "
                f"| {span([r['other_load_cores'] for rs in runs.values() for r in rs], 2)} |"
            )
    scrape = results("agent-cost.json")["scrape"]
    rows.append(
        f"| rendering a scrape | **{number(scrape['ms_per_container'], 3)} ms** CPU per "
        f"container ({number(scrape['ms_per_scrape'], 1)} ms for {scrape['containers']}; "
        f"{number(scrape['kib'])} KiB, {number(scrape['lines'])} lines) | ≤ 0.2 ms |"
    )
    return rows


def cluster_query_table() -> list[str]:
    r = results("cluster-query.json")
    return [
        f"| one query per metric per Deployment, as per-workload tools do "
        f"| {number(r['per_workload_queries'])} ({number(r['per_workload_s'], 1)} s, "
        f"answers not even parsed) |",
        f"sent raw (HTTP, body read, nothing parsed) | {number(r['raw_http_s'], 2)} s |",
        f"(`stats=all`) | {number(r['server_exec_s'], 2)} s |",
        f"| `fetch`, three queries in flight (default) | **{number(r['ours_s'], 2)} s = "
        f"{number(r['ratio_to_raw_http'], 2)}× raw** | ≤ 1.5× |",
        f"| `fetch`, one query at a time | {number(r['ours_sequential_s'], 2)} s = "
        f"{number(r['sequential_ratio_to_raw_http'], 2)}× raw | ≤ 1.5× |",
        f"| answer size | {number(r['answer_mb'], 1)} MB JSON",
        f"| samples Prometheus read | {number(r['samples_read'] / 1e6, 1)} million |",
        f"| engine, {number(r['deployment_containers'])} Deployment containers, "
        f"{r['engine_workers']} worker processes | {number(r['engine_s'], 1)} s |",
        f"pod and ReplicaSet owners: {number(r['series'])} series.",
        f"OpenMetrics ({number(r['om_bytes'] / 1e9, 2)} GB, {number(r['write_s'])} s) and "
        f"backfilled with promtool ({number(r['backfill_s'])} s",
        f"Against `execTotalTime` it is {number(r['ratio_to_server'], 2)}×",
    ]


FORMATS_HISTOGRAM = [
    ("model (`Report.from_scan`: the JSON document, validated)", "model (from_scan)"),
    ("Markdown", "Markdown"), ("HTML, 50 plots", "HTML, 50 plots"),
    ("HTML, no plots (`max_plots=0`)", "HTML, no plots (`max_plots=0`)"),
    ("JSON (`indent=2`, histograms included)", "JSON (`indent=2`)"),
    ("kustomize (kustomization.yaml + 950 patches)", "kustomize"),
]  # fmt: skip
FORMATS_COUNTERS = [
    ("model (`Report.from_scan`)", "model (from_scan)"), ("Markdown", "Markdown"),
    ("JSON (`indent=2`), 50 containers' series", "JSON (`indent=2`)"),
    ("JSON (`indent=2`) without the series", "JSON (`indent=2`) without the series"),
    ("HTML, 50 containers plotted (144 points a series)", "HTML, 50 containers plotted"),
    ("HTML, no plots (`max_plots=0`)", "HTML, no plots (`max_plots=0`)"),
]  # fmt: skip


def format_row(label: str, row: dict[str, Any]) -> str:
    if "bytes" not in row:
        return f"| {label} | {number(row['s'], 2)} s | | |"
    return f"| {label} | {number(row['s'], 2)} s | {kib(row['bytes'])} | {row['svg']} |"


def report_size_table() -> list[str]:
    r = results("report-size.json")
    rows = [format_row(label, r["histogram"]["formats"][key]) for label, key in FORMATS_HISTOGRAM]
    counters = r["counters_only"]
    rows += [format_row(label, counters["formats"][key]) for label, key in FORMATS_COUNTERS]
    cm = counters["configmap"]
    thinned = cm["thinned"]
    rows.append(format_row(f"HTML from the ConfigMap's report.json ({thinned['deployments_shown']} "
                           f"Deployments, {thinned['points_per_series']} points a series)",
                           cm["html_from_configmap"]))  # fmt: skip
    rows.append(format_row("the same, no plots", cm["html_from_configmap_no_plots"]))
    for label, key in (
        ("thinned (what the operator writes)", "thinned"),
        ("not thinned", "not thinned"),
        ("no series (the report before plots from counters)", "no series"),
    ):
        c = cm[key]
        shape = (f"{c['points_per_series']} × {number(c['series_step_s'] / 60)} min"
                 if c["points_per_series"] else "")  # fmt: skip
        rows.append(f"| {label} | {shape} | {kib(c['json_all_deployments_bytes'])} "
                    f"| {number(c['json_bytes'] / 1024)} + {kib(c['markdown_bytes'])} "
                    f"| {c['deployments_shown']} of {number(c['deployments'])} "
                    f"| {number(c['series_bytes'] / 1024) if c['series_bytes'] else 0}"
                    f"{' KiB' if c['series_bytes'] else ''} |")  # fmt: skip
    fits = counters["github_comment"]
    hist = r["histogram"]["github_comment"]
    rows.append(
        f"`recommend --top {hist['largest_top_that_fits']} --format markdown` is the most "
        f"that fits with the agent's histograms (`--top 25` is "
        f"{number(hist['top_25_chars'])} characters, `--top 50` "
        f"{number(hist['top_50_chars'])}), `--top {fits['largest_top_that_fits']}` with "
        f"counters only, whose reasons are shorter (`--top 25` "
        f"{number(fits['top_25_chars'])}, `--top 50` {number(fits['top_50_chars'])})."
    )
    return rows


def operator_table() -> list[str]:
    r = results("operator-reconcile.json")
    first, steady = r["reconciles"][0], r["reconciles"][1:]
    head, hourly = _steady(True), _steady(False)
    rec, summary, held = r["recommend"], r["summary"], r["bytes_per_object"]
    lists = summary["steady_lists"]
    watched = sum(lists[f"LIST {k} (namespace)"] for k in ("deployments", "replicasets", "pods"))
    objects = sum(v for k, v in held.items() if k.endswith(" kept"))
    return [
        f"| `recommend`'s scan of the window (same pipeline, in process; it LISTs the "
        f"namespace) | {rec['queries']} queries, {number(rec['samples'] / 1e6, 1)} M samples, "
        f"{number(rec['wall_s'], 1)} s |",
        f"| the operator's first reconcile | {first['queries']} queries, "
        f"{number(first['samples'] / 1e6, 1)} M samples, {number(first['wall_s'], 1)} s: "
        f"**{number(summary['first_vs_recommend_wall'], 2)}× `recommend`**; "
        f"{number(first['cpu_s'], 2)} s of CPU",
        f"| a steady-state reconcile: samples | {span([s['queries'] for s in head], 0)} "
        f"queries (the head) and {span([s['samples'] for s in head], 0)} samples; once an "
        f"hour {span([s['queries'] for s in hourly], 0)} queries (head, tail, report) and "
        f"{span([s['samples'] for s in hourly], 0)} samples; **{steady_samples_share()}** "
        f"of the first on average | ≤ 1 % |",
        f"| a steady-state reconcile: API requests | **{watched} LISTs of Deployments, "
        f"ReplicaSets or pods** in {len(steady)} reconciles",
        f"{lists['LIST throttlepolicies (namespace)'] // len(steady)} LIST of the namespace's "
        f"policies",
        f"| a steady-state reconcile: CPU (this process, watch threads included) | "
        f"**{steady_cpu()}**, wall {span([s['wall_s'] for s in head], 1, ' s')}; the hourly "
        f"one {hourly_cpu()}, wall {span([s['wall_s'] for s in hourly], 1, ' s')}",
        f"| memory held by the watches | {number(held['bytes_held'] / 1e6, 1)} MB for "
        f"{number(objects)} objects: **{number(held['bytes_per_object'])} bytes per object**",
        f"| RSS after 2 and after 12 reconciles (after `gc` and `malloc_trim`) "
        f"| {number(summary['rss_mb_after_2'], 1)} and {number(summary['rss_mb_after_12'], 1)} MB",
    ]


def apply_faults_table() -> list[str]:
    r = results("apply-faults.json")["summary"]
    labels = {
        "409": "409 on patches",
        "500": "500 on patches",
        "timeout": "patch timed out",
        "prometheus": "Prometheus down",
        "restart": "operator restarted",
        "none": "none",
    }
    rows = [f"| {labels[k]} | {n} | 0 | all Applied |" for k, n in r["by_fault"].items()]
    rows.append(f"| **all** | **{r['runs']}** | **{r['inconsistent_runs']}** (goal: none) | |")
    return rows


BAD_INPUT_ROWS = {  # results key → the start of its row in §11
    "prometheus_urls": "| `--prometheus` URLs", "numbers": "| numbers", "text": "| text",
    "credentials_and_headers": "| credentials and headers", "files": "| files",
    "servers_that_fail": "| servers that fail", "simulate_and_lab": "| `simulate` and `lab`",
    "agent": "| `agent`", "operator_report_and_more": "| `operator`",
}  # fmt: skip


def bad_input_table() -> list[str]:
    r = results("bad-input.json")
    section_11 = section(11)
    for key, start in BAD_INPUT_ROWS.items():
        g = r["groups"][key]
        found = re.search(re.escape(start) + r"[^|]*\| (\d+) \| (\d+) / (\d+) \|", section_11)
        assert found, f"§11 has no row starting {start}"
        assert (int(found.group(1)), int(found.group(2)), int(found.group(3))) == (
            g["cases"],
            g["exit_2"],
            g["exit_1"],
        ), f"§11's row {start} should count {g}"
    total = r["hand_written"]
    generated = r["generated"]
    return [
        f"| **hand-written** | **{total['cases']}** | {total['exit_2']} / {total['exit_1']} |",
        f"| {' + '.join([str(generated['examples_each'])] * generated['properties'])} |",
    ]


INPLACE_ROWS = {  # results scenario → its label in §13's tables
    "3x4 Rollout maxConcurrent=4": "3 × 4, Rollout, maxConcurrent 4",
    "3x4 Rollout maxConcurrent=1": "3 × 4, Rollout, maxConcurrent 1",
    "3x4 InPlace maxConcurrent=1": "3 × 4, InPlace, maxConcurrent 1",
    "3x4 InPlace maxConcurrent=4": "3 × 4, InPlace, maxConcurrent 4",
    "1x20 Rollout maxConcurrent=1": "1 × 20, Rollout",
    "1x20 InPlace maxConcurrent=1": "1 × 20, InPlace, maxConcurrent 1",
    "1x20 InPlace maxConcurrent=4": "1 × 20, InPlace, maxConcurrent 4",
}


def inplace_tables() -> list[str]:
    rows = []
    for key, label in INPLACE_ROWS.items():
        s = results("inplace.json")["summary"][key]
        per = s["per_deployment"]
        inplace = "InPlace" in key
        first = (f"canary {seconds(per['canary_s'])}" if inplace
                 else seconds(per["first_new_pod_ready_s"]))  # fmt: skip
        verdict = (seconds(per["applied_equiv_s"]) if inplace
                   else f"{number(per['applied_equiv_s']['median'])} s")  # fmt: skip
        rest = seconds(per["rest_from_verdict_s"]) if inplace else "—"
        rows.append(f"| {label} | {first} | {rest} | {seconds(per['every_pod_equiv_s'])}")
        rows.append(f"| {verdict} | {'**' if inplace else ''}{s['pods_replaced']['median']} / "
                    f"{s['container_restarts']['median']}{'**' if inplace else ''} |")  # fmt: skip
        methods = s["requests_by_method"]
        deployments = int(key.split("x")[0])
        resized = per["resize_requests"]["median"] * deployments if inplace else 0
        writes = s["control_plane_writes"]
        rows.append(
            f"| {label} | {s['reconciles']['median']} | "
            + " / ".join(str(methods[m]["median"]) for m in ("GET", "PATCH", "POST", "PUT"))
            + f" ({s['requests_total']['median']}) | {resized} | {writes['median']} "
            f"({writes['min']}–{writes['max']}) |"
        )
    return rows


def controlplane_table() -> list[str]:
    r = results("controlplane.json")
    load = number(r["load_average"][0], 1)
    starts = " / ".join(f"{number(s, 1)} s" for s in r["start_s"])
    return [f"from the Go module proxy) | {number(r['download_s'])} s |",
            f"all the binaries of both modules (`--cold`) | {number(r['cold_s'])} s |",
            f"{number(r['link_only_s'])} s at load average {load}",
            f"| {number(r['warm_s'], 3)} s (hashing the inputs) |",
            f"{starts} at load average {load}",
            " / ".join(f"{number(s, 1)} s" for s in r["node_start_s"]) + " |"]  # fmt: skip


def alignment_rows() -> dict[str, dict[str, list[str]]]:
    """bench/results/window-alignment.md (the script's Markdown): scenario → sampling → cells."""
    table: dict[str, dict[str, list[str]]] = {}
    scenario = ""
    for line in (RESULTS / "window-alignment.md").read_text().splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        scenario = cells[0] or scenario
        table.setdefault(scenario, {})[cells[1]] = cells[2:]
    return table


def largest_gap(scenarios: list[str], samplings: list[str], quantiles: range) -> str:
    """How far, in cores, some samplings' quantiles land from the aligned truth at most."""
    table = alignment_rows()
    return number(max(abs(float(table[sc][way][q]) - float(table[sc]["aligned (truth)"][q]))
                      for sc in scenarios for way in samplings for q in quantiles), 2)  # fmt: skip


UNALIGNED = ["100ms @25", "100ms @50", "100ms @75"]


def alignment_table() -> list[str]:
    table = alignment_rows()
    rows = []
    for scenario in ("seed-002-burst (0.25 CPU)", "tune-open-pool (0.6 CPU)"):
        ways = table[scenario]
        rows.append(f"| {scenario} | aligned (truth) | {' | '.join(ways['aligned (truth)'])} |")
        cells = [span([float(ways[w][i]) for w in UNALIGNED], 3 if i == 3 else 2)
                 for i in range(4)]  # fmt: skip
        rows.append(f"| | 100ms @25 / @50 / @75 | {' | '.join(cells)} | |")
        for way in ("sliding 25ms", "sliding max"):
            rows.append(f"| | {way} | {' | '.join(ways[way][:4])} | |")
    others = ["tune-batch-parallel (1 CPU)", "seed-000-serial-5ms (0.5 CPU)"]
    every = [w for w in table[others[0]] if w != "aligned (truth)"]
    rows.append(f"| tune-batch-parallel, serial-5ms | all | equal within "
                f"{largest_gap(others, every, range(3))} | | | 1.000 | 1.000 |")  # fmt: skip
    gap = largest_gap(["seed-002-burst (0.25 CPU)", "tune-open-pool (0.6 CPU)"], UNALIGNED,
                      range(2))  # fmt: skip
    rows.append(f"Unaligned windows land within {gap} core of the aligned truth at p50 and p90")
    return rows


def agent_api_table() -> list[str]:
    """§14: the rise of the API server's own counters of requests on pods, less the
    baseline's, over one window, for the agent and for the list every 5 s it replaced."""
    r = results("agent-api-requests.json")
    rows = []
    for key, label in (("agent", "the agent: one list, then a watch"),
                       ("list_every_5s", "a list every 5 s (the agent before)")):  # fmt: skip
        f = r[key]
        at_scale = number(r["lists_per_second_at_1000_nodes"][key])
        rows.append(f"| {label} | {number(f['LIST'])} | {number(f['WATCH'])} | "
                    f"{number(f['open_WATCH'])} | {at_scale} |")  # fmt: skip
    rows.append(f"{number(r['seconds'])} s windows, {r['pods']} pods on the node")
    return rows


TABLES: dict[str, tuple[int, Callable[[], list[str]]]] = {
    "agent cost (§5)": (5, agent_cost_table),
    "sampling windows (§6)": (6, alignment_table),
    "recommend at 10,000 containers (§7)": (7, cluster_query_table),
    "report sizes (§8)": (8, report_size_table),
    "the operator (§9)": (9, operator_table),
    "Apply under faults (§10)": (10, apply_faults_table),
    "bad input (§11)": (11, bad_input_table),
    "the control plane (§12)": (12, controlplane_table),
    "Apply in place (§13)": (13, inplace_tables),
    "the agent's API requests (§14)": (14, agent_api_table),
    "the pod's throttled time and the run delay (§4)": (4, pod_wait_table),
}


@pytest.mark.parametrize("name", list(TABLES))
def test_each_table_holds_what_its_results_file_holds(name: str) -> None:
    number_, rows = TABLES[name]
    text = section(number_)
    missing = [row for row in map(" ".join, map(str.split, rows())) if row not in text]
    assert not missing, f"§{number_} should hold:\n" + "\n".join(missing)


# -- every results file quoted has its command beside it ----------------------------------

SOURCES = {  # results file → the script that writes it, and the section that quotes it
    "agent-cost.json": ("bench/agent_cost.py", 5),
    "agent-sizing.json": ("bench/agent_sizing.py", 5),
    "window-alignment.md": ("bench/window_alignment.py", 6),
    "cluster-query.json": ("bench/cluster_query.py", 7),
    "recommend-queries.json": ("bench/recommend_queries.py", 7),
    "report-size.json": ("bench/report_size.py", 8),
    "operator-reconcile.json": ("bench/operator_reconcile.py", 9),
    "apply-faults.json": ("bench/apply_faults.py", 10),
    "bad-input.json": ("bench/bad_input_cases.py", 11),
    "controlplane.json": ("bench/controlplane.py", 12),
    "inplace.json": ("bench/inplace.py", 13),
    "agent-api-requests.json": ("bench/agent_api_requests.py", 14),
    "simulate-speed.json": ("bench/simulate_speed.py", 1),
    "host-steal.json": ("bench/host_steal.py", 3),
    "late-booked.json": ("bench/late_readings.py", 3),
    "late-readings.json": ("bench/late_readings.py", 3),
    "pod-quota.json": ("bench/pod_quota.py", 3),
    "pod-wait.json": ("bench/pod_wait.py", 4),
    "clustered-peaks.json": ("bench/clustered_peaks.py", 4),
    "clustered-peaks-shuffled.json": ("bench/clustered_peaks.py", 4),
    "open-pool-load.json": ("bench/open_pool_load.py", 3),
}


def test_the_readmes_demo_table_is_the_saved_runs() -> None:
    missing = [row for row in demo_rows() if row not in prose("docs/demo.md")]
    assert not missing, "docs/demo.md should hold:\n" + "\n".join(missing)


@pytest.mark.parametrize("name", list(SOURCES))
def test_each_results_file_is_named_with_the_command_that_writes_it(name: str) -> None:
    script, number_ = SOURCES[name]
    text = section(number_)
    assert f"bench/results/{name}" in text
    assert script in text
    assert (ROOT / script).is_file()


@pytest.mark.parametrize("name", ["agent-cost.json", "simulate-speed.json"])
def test_timings_quoted_were_measured_without_the_kernel_lab_beside_them(name: str) -> None:
    """The kernel lab moves every other process into an idle-priority cgroup while it runs."""
    assert results(name)["lab_cgroups_seen"] == []


def test_the_agent_cost_quoted_covers_both_layouts_busy_and_idle_with_its_options() -> None:
    measured = results("agent-cost.json")
    assert {(r["layout"], r["busy"], r["skip_quiet_subtrees"], r["measure_wait"])
            for r in measured["runs"]} == {
        (layout, busy, skip, wait) for layout in ("flat", "kubelet") for busy in (10, 0)
        for skip in (True, False) for wait in (True, False)
    }  # fmt: skip
    assert measured["wait_read"]["threads"] >= 100
    options = measured["options"]
    assert f"--seconds {number(options['seconds'])} --repeat {options['repeat']}" in section(5)
