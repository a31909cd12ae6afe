"""The operator's knobs, in one place, each with its unit and the reason for its default."""

from __future__ import annotations

from dataclasses import dataclass, field

from unthrottle.metrics.source import PrometheusConfig
from unthrottle.scan.reuse import ReuseSettings
from unthrottle.units import DEFAULT_PERIOD_US


@dataclass(frozen=True, slots=True)
class OperatorSettings:
    """How the operator runs. Passed in, never read from globals."""

    prometheus: PrometheusConfig
    """Where evidence comes from: the operator's own setting, never a policy's (a namespace's
    user must not point the operator, with its credentials, at a URL of their choice)."""
    namespaces: tuple[str, ...] = ()
    """Namespaces watched; empty: every namespace."""
    status_max_workloads: int = 100
    """Deployments kept in a policy's status, most harmful first; the report ConfigMap has
    the rest. 100 keeps status far below etcd's 1.5 MiB object limit (about 1 KiB each)."""
    report_max_bytes: int = 900 * 1024
    """Report ConfigMap size cap, under the API server's 1 MiB object limit with room for
    metadata."""
    report_refresh_s: float = 3600.0
    """The report ConfigMap is rewritten when a state or recommendation changed, and at
    least this often (its throttle ratios move a little every cycle; rewriting a
    megabyte every 5 minutes for that is waste)."""
    checkpoint_max_bytes: int = 900 * 1024
    """Largest checkpoint ConfigMap payload; a larger checkpoint is split over several."""
    backoff_min_s: float = 10.0
    """First retry after Prometheus or the API failed; doubled on each failure in a row."""
    backoff_max_s: float = 300.0
    """Longest wait between retries (never longer than the policy's interval)."""
    poll_s: float = 1.0
    """How often a policy's loop checks for a spec change while it waits."""
    concurrency: int = 3
    """Prometheus queries in flight per reconcile."""
    jobs: int | None = 1
    """Processes computing recommendations; 1 keeps the operator one process (the engine
    runs only for containers whose evidence changed, docs/operator.md)."""
    reuse: ReuseSettings = field(default_factory=ReuseSettings)
    """When a container's last recommendation is kept rather than recomputed."""
    api_timeout_s: float = 30.0
    """Every Kubernetes API call's timeout."""
    peering_lifetime_s: int = 20
    """How long a replica's keep-alive in the Kopf peering object counts, s (with
    ``--peering``): a standby takes over at most this long after the working replica died
    without a word (SIGKILL, a lost node), when its record expires. Each replica renews
    its own 5-10 s before that (a PATCH every 10-15 s at 20). Kopf's default, 60, would let
    a policy of the shortest interval (30 s) miss two of its runs; 20 keeps the next status
    within two intervals (docs/operator.md, "Two replicas")."""
    cfs_period_us: int = DEFAULT_PERIOD_US
    """The CFS period, µs, of containers the node agent reports none for: the kubelets'
    ``--cpu-cfs-quota-period`` (100 ms, Kubernetes' default). A node fact, not a policy's:
    where the agent's series exist, each container's own period is used instead."""
