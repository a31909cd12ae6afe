"""One reconcile of one ThrottlePolicy, as named, timed steps:
parse → select → exclude (opt-outs, other policies' Deployments) → evidence → assess →
report → status → events.

Nothing here imports Kopf: the handlers (``handlers.py``) call :meth:`Reconciler.reconcile`
in a thread and sleep for the delay it returns. A fault never escapes as an exception
that stops the others: a bad spec, the API or Prometheus failing each become a
condition, a warning event and a retry.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from unthrottle.kube.deployments import DeploymentStore
from unthrottle.kube.objects import NotOwnedError, ObjectStore
from unthrottle.kube.pods import PodStore
from unthrottle.kube.workloads import WorkloadStore
from unthrottle.metrics.source import MetricsError, MetricsSource
from unthrottle.model.owners import KINDS, ref
from unthrottle.model.policy import SpecError, ThrottlePolicySpec, parse_spec
from unthrottle.model.status import ThrottlePolicyStatus
from unthrottle.operator.apply import Applier
from unthrottle.operator.settings import OperatorSettings
from unthrottle.operator.status import (
    IGNORE_ANNOTATION,
    State,
    StatusView,
    condition,
    timestamp,
    workload_state,
    workloads_status,
)
from unthrottle.operator.telemetry import Telemetry
from unthrottle.report import markdown
from unthrottle.report.thinning import CONFIGMAP_POINTS, thin
from unthrottle.scan import (
    ClusterError,
    EngineCache,
    ScanRequest,
    ScanResult,
    Selection,
    assess,
    engine_policy,
    select,
    with_series,
)
from unthrottle.scan.readers import EvidenceReader, FullWindowReader, PolicyMemory

_log = logging.getLogger("unthrottle.operator")
PLOTTED = 50
"""Deployments whose demand histograms the report ConfigMap keeps (the HTML report plots the
50 most harmful); the others' would make a 1,000-Deployment report pass 1 MiB."""
MARKDOWN_ROWS = 200
"""Deployments in the ConfigMap's report.md (a page people read); report.json has them all."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a reconcile did, and when to run the next one."""

    next_in_s: float
    fault: str | None = None
    """The reason of a failed reconcile (InvalidSpec, PrometheusUnavailable, ApiUnavailable)."""


def _created(body: dict[str, Any]) -> tuple[str, str]:
    meta = body.get("metadata") or {}
    return str(meta.get("creationTimestamp") or ""), str(meta.get("name") or "")


class Reconciler:
    """Reconciles policies; holds each policy's memory (aggregates, engine cache)."""

    def __init__(self, settings: OperatorSettings, *, metrics: MetricsSource,
                 workloads: WorkloadStore, objects: ObjectStore,
                 evidence: EvidenceReader | None = None,
                 deployments: DeploymentStore | None = None,
                 pods: PodStore | None = None,
                 telemetry: Telemetry | None = None,
                 clock: Callable[[], float] = time.time) -> None:  # fmt: skip
        self.settings = settings
        self.metrics = metrics
        self.workloads = workloads
        self.objects = objects
        self.evidence = evidence or FullWindowReader(metrics)
        self.telemetry = telemetry or Telemetry()
        self.clock = clock
        self.memory: dict[str, PolicyMemory] = {}
        self.applier = None if deployments is None else Applier(
            deployments=deployments, objects=objects, metrics=metrics, clock=clock,
            pods=pods)  # fmt: skip

    def forget(self, body: dict[str, Any]) -> None:
        """A policy was deleted: drop its memory, and close its InPlace records so that the
        admission webhook stops giving new pods its settings (``Applier.release``)."""
        self.memory.pop(_memory_key(body), None)
        self.telemetry.forget(uid_of(body))
        if self.applier is None:
            return
        namespace = (body.get("metadata") or {}).get("namespace") or ""
        try:
            listed = self.workloads.deployments([namespace], KINDS)  # its records, any kind
        except Exception as error:  # the records stay; the webhook checks the policy too
            _log.warning("policy %s deleted: its records not closed: %s", namespace, error)
            return
        self.applier.release(body, [d.raw for d in listed], self.clock())

    def reconcile(self, body: dict[str, Any]) -> Outcome:
        """Reconcile one policy; never raises for the policy's or the cluster's faults."""
        meta = body.get("metadata") or {}
        key = _memory_key(body)
        memory = self.memory.get(key)
        if memory is None:
            memory = self.memory[key] = PolicyMemory(cache=EngineCache(self.settings.reuse))
        started = time.perf_counter()
        try:
            outcome = self._reconcile(body, memory)
        except Exception as error:  # the last line of defence: log, mark, retry
            _log.exception(
                "policy %s/%s: reconcile failed", meta.get("namespace"), meta.get("name")
            )
            outcome = self._degraded(body, memory, "InternalError", f"reconcile failed: {error}")
        self.telemetry.reconciled(uid_of(body), time.perf_counter() - started, outcome.fault)
        return outcome

    # -- the steps -------------------------------------------------------------------

    def _reconcile(self, body: dict[str, Any], memory: PolicyMemory) -> Outcome:
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        try:
            spec = parse_spec(body.get("spec") or {})
            policy = engine_policy(spec)
        except SpecError as error:
            return self._invalid(body, memory, error)
        now = self.clock()
        request = ScanRequest(
            window_s=spec.window_s, now=now, policy=policy,
            namespaces=(namespace,), selector=spec.label_selector(),
            containers=frozenset(spec.containers) if spec.containers else None,
            concurrency=self.settings.concurrency, jobs=self.settings.jobs,
            cfs_period_us=self.settings.cfs_period_us,
            cfs_period_from="the operator's --cfs-period", kinds=tuple(spec.kinds),
        )  # fmt: skip
        try:
            selection = self._timed("select", body, lambda: select(request, self.workloads,
                                                                   self.metrics))  # fmt: skip
            skipped, conflicts = self._excluded(body, selection)
            found, problems = self._timed("evidence", body, lambda: self.evidence.read(
                memory, request, selection, policy=body))  # fmt: skip
        except ClusterError as error:
            return self._degraded(body, memory, "ApiUnavailable", str(error))
        except MetricsError as error:
            self.telemetry.prometheus_error()
            return self._degraded(body, memory, "PrometheusUnavailable", str(error))
        skip = frozenset((namespace, d) for d in skipped)
        result = self._timed("assess", body, lambda: assess(
            request, selection, found, problems=problems, cache=memory.cache,
            skip=skip))  # fmt: skip
        overrides = None
        if spec.mode == "Apply" and self.applier is not None:
            states = {w.deployment: workload_state(w, skipped)[0] for w in result.workloads}
            overrides = self._timed("apply", body, lambda: self.applier.run(  # type: ignore[union-attr]
                body, spec, selection, result, states, skipped))  # fmt: skip
        view = workloads_status(result, skipped, limit=self.settings.status_max_workloads,
                                overrides=overrides)  # fmt: skip
        decisions = self._decisions(view)
        self._timed("report", body, lambda: self._write_report(body, spec, result, view, memory,
                                                               decisions))  # fmt: skip
        status = self._status(body, spec, now, view, conflicts, result, memory)
        self.objects.patch_status(namespace, name, conformed(status))
        self._events(body, memory, result, view, conflicts, decisions)
        memory.failures, memory.last_fault = 0, None
        self.telemetry.states(uid_of(body), view.states)
        wake = self.applier.wake_in_s if overrides is not None and self.applier else None
        if wake is not None:  # a rollout or a resize in progress, a verification due
            return Outcome(next_in_s=max(1.0, min(float(spec.interval_s), wake)))
        return Outcome(next_in_s=float(spec.interval_s))

    def _timed(self, step: str, body: dict[str, Any], run: Callable[[], Any]) -> Any:
        started = time.perf_counter()
        try:
            return run()
        finally:
            meta = body["metadata"]
            _log.info("policy %s/%s: %s took %.3f s", meta["namespace"], meta["name"], step,
                      time.perf_counter() - started)  # fmt: skip

    def _excluded(
        self, body: dict[str, Any], selection: Selection
    ) -> tuple[dict[str, str], dict[str, str]]:
        """Deployments left out: opted out (annotation), or selected by an older policy.
        Returns (Deployment → why) and (Deployment → the other policy)."""
        skipped: dict[str, str] = {}
        conflicts: dict[str, str] = {}
        meta = body["metadata"]
        older = []
        for other in self.objects.policies(meta["namespace"]):
            other_meta = other.get("metadata") or {}
            if other_meta.get("uid") == meta.get("uid") or other_meta.get("name") == meta["name"]:
                continue
            if other_meta.get("deletionTimestamp") or _created(other) >= _created(body):
                continue
            try:
                older.append((str(other_meta.get("name")),
                              parse_spec(other.get("spec") or {}).label_selector()))  # fmt: skip
            except SpecError:
                continue  # an invalid policy owns nothing
        for (_, deploy), info in (selection.deployments or {}).items():
            if str(info.annotations.get(IGNORE_ANNOTATION, "")).lower() == "true":
                skipped[deploy] = f'opted out: the {info.kind} has {IGNORE_ANNOTATION}: "true"'
                continue
            for other_name, selector in older:
                if selector.matches(info.labels):
                    skipped[deploy] = f"selected by the older policy {other_name}, which keeps it"
                    conflicts[deploy] = other_name
                    break
        return skipped, conflicts

    def _status(self, body: dict[str, Any], spec: ThrottlePolicySpec, now: float,
                view: StatusView, conflicts: dict[str, str], result: ScanResult,
                memory: PolicyMemory) -> dict[str, Any]:  # fmt: skip
        meta = body["metadata"]
        generation = meta.get("generation")
        previous = (body.get("status") or {}).get("conditions")
        covered = "Deployments" if list(spec.kinds) == ["Deployment"] else "workloads"
        ready_message = (f"{view.summary['deployments']} {covered}, "
                         f"{view.summary['overTarget']} over target")  # fmt: skip
        if result.fatal is not None:
            ready_message = result.fatal.message
        if spec.mode == "Apply" and self.applier is None:
            ready_message += "; Apply mode needs write access to Deployments: nothing is patched"
        conditions = [condition(previous, "Ready", True, "Reconciled", ready_message,
                                now=now, generation=generation)]  # fmt: skip
        degraded = [("ConfigMapNotOwned", m) for _, m in sorted(memory.not_owned.items())]
        if conflicts:
            others = sorted(set(conflicts.values()))
            degraded.append(("Conflict", f"{len(conflicts)} selected Deployments belong to "
                             f"the older policy {', '.join(others)}: "
                             f"{', '.join(sorted(conflicts))}"))  # fmt: skip
        if degraded:
            conditions.append(condition(
                previous, "Degraded", True, degraded[0][0], "; ".join(m for _, m in degraded),
                now=now, generation=generation))  # fmt: skip
        else:
            conditions.append(condition(previous, "Degraded", False, "Healthy", "",
                                        now=now, generation=generation))  # fmt: skip
        if spec.mode == "Apply" and spec.apply.method != "Rollout" and self.applier is not None:
            missing = self.applier.no_resize
            conditions.append(condition(
                previous, "InPlaceResize", missing is None,
                "Available" if missing is None else "NoResizeSubresource",
                missing or "pods are resized through their resize subresource",
                now=now, generation=generation))  # fmt: skip
        return {
            "observedGeneration": generation,
            "lastRun": timestamp(now),
            "lastGoodRun": timestamp(now),
            "summary": view.summary,
            "workloads": view.workloads,
            "conditions": conditions,
        }

    @staticmethod
    def _decisions(view: StatusView) -> str:
        """What a reviewer acts on: each Deployment's state and recommendations (throttle
        ratios move a little every cycle; these do not, unless something changed)."""
        return json.dumps(
            [[w["deployment"], w["state"], [c["recommended"] for c in w["containers"]]]
             for w in view.workloads] + [view.summary["deployments"]],
            sort_keys=True,
        )  # fmt: skip

    def _write_report(self, body: dict[str, Any], spec: ThrottlePolicySpec, result: ScanResult,
                      view: StatusView, memory: PolicyMemory,
                      decisions: str) -> None:  # fmt: skip
        """The report ConfigMap: rewritten when the decisions changed, or an hour passed."""
        meta = body["metadata"]
        if (decisions == memory.report_signature
                and result.now - memory.report_at < self.settings.report_refresh_s):  # fmt: skip
            return
        states = {k: v.value for k, v in view.states.items()}
        try:  # the plots' series: only the plotted and changed containers', a few queries
            result = with_series(result, self.metrics, max_plots=PLOTTED,
                                 concurrency=self.settings.concurrency)  # fmt: skip
        except MetricsError as error:  # a report without plots is still a report
            _log.warning("policy %s/%s: the report's plots are left out: %s",
                         meta["namespace"], meta["name"], error)  # fmt: skip
        doc = thin(result.to_json(spec.window), CONFIGMAP_POINTS)
        doc["policy"] = {"namespace": meta["namespace"], "name": meta["name"]}
        for rank, w in enumerate(doc["workloads"]):
            w["state"] = states.get(ref(w["kind"], w["name"]))
            if rank >= PLOTTED:  # the histograms are for the plots of the most harmful only
                for c in w["containers"]:
                    c["histogram"] = []
        total = limit = len(doc["workloads"])
        title = f"unthrottle: policy {meta['namespace']}/{meta['name']}"
        while True:  # cut to fit: truncated with a note, never failing
            shown = dict(doc, workloads=doc["workloads"][:limit])
            if limit < total:
                shown["truncated"] = {"shown": limit, "left_out": total - limit}
            text_json = json.dumps(shown, separators=(",", ":"))
            text_md = markdown(result, title=title, states=states,
                               max_workloads=min(limit, MARKDOWN_ROWS))  # fmt: skip
            size = len(text_json) + len(text_md)
            if size <= self.settings.report_max_bytes or limit == 0:
                break
            # the share that fits, with a margin: one or two rounds instead of halvings
            limit = min(limit - 1, int(limit * self.settings.report_max_bytes / size * 0.9))
        name = f"{meta['name']}-report"
        try:
            self.objects.put_configmap(
                meta["namespace"], name, owner=body,
                data={"report.md": text_md, "report.json": text_json},
                labels={"app.kubernetes.io/managed-by": "unthrottle",
                        "unthrottle.io/policy": meta["name"]},
            )  # fmt: skip
        except NotOwnedError as error:  # the status still carries every recommendation
            memory.not_owned[name] = str(error)
            return
        memory.not_owned.pop(name, None)
        memory.report_signature, memory.report_at = decisions, result.now

    def _events(self, body: dict[str, Any], memory: PolicyMemory, result: ScanResult,
                view: StatusView, conflicts: dict[str, str],
                decisions: str) -> None:  # fmt: skip
        if decisions != memory.last_signature:
            memory.last_signature = decisions
            recommended = sum(1 for s in view.states.values() if s == State.RECOMMENDED)
            worst = view.summary["worstThrottleRatio"]
            message = (f"{view.summary['deployments']} Deployments, "
                       f"{view.summary['overTarget']} over target, {recommended} with a new "
                       "recommendation")  # fmt: skip
            if worst is not None:
                message += f"; worst {worst * 100:.0f} % of periods throttled"
            self._event(body, "Normal", "Recommended", message)
        for problem in result.problems:
            if problem.kind.value != "RecordedSeries":
                self._event(body, "Warning", problem.kind.value, problem.message)
        refusals = frozenset(memory.not_owned.values())
        if refusals != memory.not_owned_said:
            memory.not_owned_said = refusals
            for message in sorted(refusals):
                self._event(body, "Warning", "ConfigMapNotOwned", message)
        if conflicts:
            owned = ", ".join(f"{d} ({p})" for d, p in sorted(conflicts.items()))
            self._event(
                body,
                "Warning",
                "Conflict",
                f"Deployments selected by an older policy are left to it: {owned}",
            )

    def _event(self, body: dict[str, Any], kind: str, reason: str, message: str) -> None:
        try:
            self.objects.event(body, kind, reason, message)
        except Exception as error:  # an event is worth a log line, not a failed reconcile
            _log.warning("cannot post event %s: %s", reason, error)

    # -- faults ----------------------------------------------------------------------

    def _invalid(self, body: dict[str, Any], memory: PolicyMemory, error: SpecError) -> Outcome:
        meta = body["metadata"]
        generation = meta.get("generation")
        message = f"spec.{error.field}: {error}" if not str(error).startswith(error.field) else (
            f"spec.{error}")  # fmt: skip
        if memory.warned_generation != generation or memory.last_fault != "InvalidSpec":
            self._event(body, "Warning", "InvalidSpec", message)
            memory.warned_generation = generation
        memory.last_fault = "InvalidSpec"
        self._write_fault_status(body, "InvalidSpec", message)
        return Outcome(next_in_s=self.settings.backoff_max_s, fault="InvalidSpec")

    def _degraded(self, body: dict[str, Any], memory: PolicyMemory, reason: str,
                  message: str) -> Outcome:  # fmt: skip
        memory.failures += 1
        if memory.last_fault != reason:
            self._event(body, "Warning", reason, message)
        memory.last_fault = reason
        try:
            self._write_fault_status(body, reason, message)
        except Exception as error:  # the API may be what failed
            _log.warning("cannot write the status of a degraded policy: %s", error)
        delay = min(self.settings.backoff_max_s,
                    self.settings.backoff_min_s * 2 ** (memory.failures - 1))  # fmt: skip
        return Outcome(next_in_s=delay, fault=reason)

    def _write_fault_status(self, body: dict[str, Any], reason: str, message: str) -> None:
        """Conditions say what failed; the last good workloads and their time stay."""
        meta = body["metadata"]
        now = self.clock()
        previous = (body.get("status") or {}).get("conditions")
        generation = meta.get("generation")
        since = (body.get("status") or {}).get("lastGoodRun")
        ready = "the last good recommendations are kept" + (f" (from {since})" if since else "")
        status = {
            "lastRun": timestamp(now),
            "conditions": [
                condition(previous, "Ready", False, reason, f"{message}; {ready}",
                          now=now, generation=generation),
                condition(previous, "Degraded", True, reason, message,
                          now=now, generation=generation),
            ],
        }  # fmt: skip
        if reason == "InvalidSpec":
            status["observedGeneration"] = generation
        self.objects.patch_status(meta["namespace"], meta["name"], conformed(status))


def conformed(status: dict[str, Any]) -> dict[str, Any]:
    """The status as the CRD's schema declares it (the model it is generated from): a
    field it would prune or a null it would refuse is a bug here, not a failed write."""
    model = ThrottlePolicyStatus.model_validate(status)
    return model.model_dump(by_alias=True, mode="json", exclude_unset=True)


def _memory_key(body: dict[str, Any]) -> str:
    """A policy's key in memory: its uid (a policy deleted and made again starts afresh)."""
    return str((body.get("metadata") or {}).get("uid") or uid_of(body))


def uid_of(body: dict[str, Any]) -> str:
    """A policy's identity in memory and metrics."""
    meta = body.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"
