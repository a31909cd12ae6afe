"""Apply mode: turn a policy's recommendations into patches, a few at a time; verify each
after its rollout on the kernel's own counters; roll back what made things worse.

Every decision is made from the Deployments' records (``unthrottle.io/last-applied``),
never from memory, so an operator killed at any point resumes where it was: a record
with no verdict is a change in verification.

Per Deployment, in order:

=====================  ========================================================
record                 what happens
=====================  ========================================================
ours, no verdict       rollout failed → roll back; rollout done → note the time;
                       ``verifyFor`` after it → read the new pods' throttling:
                       worse (above the target and the ratio before, beyond noise)
                       → roll back (``rollbackIfWorse``), else ``Applied``
ours, RolledBack       left alone until the policy or the Deployment changes
ours, Applied          ``cooldown`` after the change, a new change may follow
none / older           a recommended change, if ``maxConcurrent`` allows
=====================  ========================================================
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from unthrottle.kube.deployments import (
    AccessDenied,
    DeploymentStore,
    PatchConflict,
    PatchRefused,
)
from unthrottle.kube.inplace import InPlaceError, resize_body, targets
from unthrottle.kube.objects import ObjectStore
from unthrottle.kube.patching import (
    ContainerChange,
    PatchPlanError,
    Record,
    RecordError,
    apply_patch,
    plan,
    record_of,
    record_patch,
    record_text,
    rollback_patch,
    template_fingerprint,
)
from unthrottle.kube.pods import NoResizeSubresource, PodStore, running
from unthrottle.metrics.source import MetricsError, MetricsSource
from unthrottle.model.owners import DEPLOYMENT, STATEFULSET, Owners, ref_of
from unthrottle.model.policy import ThrottlePolicySpec
from unthrottle.operator.changes import (
    changes_as_read,
    changes_for,
    describe,
    in_ms,
    judged_against,
    percent,
)
from unthrottle.operator.gates import on_delete, partition, rollout, skip_reason
from unthrottle.operator.inplace import InPlace, Outcome
from unthrottle.operator.status import State
from unthrottle.scan import (
    ContainerResult,
    ScanResult,
    Selection,
    WorkloadKey,
    WorkloadResult,
    fetch_evidence,
)
from unthrottle.units import format_cpu

_log = logging.getLogger("unthrottle.operator")


WAITS_FOR_RESTARTS = ("its pods take the change when they are restarted (by your own "
                      "rollout or deletes), and it is verified once every one has")  # fmt: skip


def _updated(raw: dict[str, Any]) -> str:
    """``1 of 3 pods have it``: how far an OnDelete workload's pods took the new template."""
    status, spec = raw.get("status") or {}, raw.get("spec") or {}
    if raw.get("kind") == "DaemonSet":
        done, total = status.get("updatedNumberScheduled"), status.get("desiredNumberScheduled")
    else:
        done, total = status.get("updatedReplicas"), spec.get("replicas", 1)
    return f"{done or 0} of {total or 0} pods have it"


ROLLOUT_POLL_S = 5.0
"""The next reconcile while a rollout of ours is in progress (seen done within seconds,
so that ``verifyFor`` runs from then, not from the next interval)."""


@dataclass(frozen=True, slots=True)
class VerifySettings:
    """When a change counts as worse."""

    noise: float = 0.02
    """Throttle ratios within this of the ratio before are the same (absolute)."""
    sigmas: float = 3.0
    """…or within this many binomial standard deviations of it, on the periods seen."""
    resize_timeout_s: float = 300.0
    """InPlace: how long a pod's resize may stay in progress, or failing (``Error``: the
    kubelet retries for ever), before it is given up and rolled back. A kubelet actuates
    a CPU resize within seconds (5 s here, docs/operator.md); five minutes leave room for
    a busy node without holding one of ``maxConcurrent``'s slots for good."""


class Applier:
    """Runs Apply mode's step of one reconcile."""

    def __init__(self, *, deployments: DeploymentStore, objects: ObjectStore,
                 metrics: MetricsSource, clock: Callable[[], float],
                 verify: VerifySettings | None = None,
                 pods: PodStore | None = None) -> None:  # fmt: skip
        self.deployments = deployments
        self.objects = objects
        self.metrics = metrics
        self.clock = clock
        self.verify = verify or VerifySettings()
        self.wake_in_s: float | None = None
        """How soon the last run wants the next (None: the policy's interval will do)."""
        self.inplace = None if pods is None else InPlace(
            deployments=deployments, pods=pods, metrics=metrics, event=self._event,
            worse=self._worse, soon=self._soon,
            resize_timeout_s=self.verify.resize_timeout_s)  # fmt: skip

    def run(self, body: dict[str, Any], spec: ThrottlePolicySpec, selection: Selection,
            result: ScanResult, states: dict[str, State],
            skipped: dict[str, str]) -> dict[str, Outcome]:  # fmt: skip
        """States (and messages) for the Deployments Apply acted on or held back."""
        meta = body["metadata"]
        namespace, policy = meta["namespace"], meta["name"]
        now = self.clock()
        self.wake_in_s = None
        out: dict[str, Outcome] = {}
        unreadable = None  # why VPAs cannot be read: then nothing is changed
        try:
            vpas = self.deployments.vpas(namespace)
        except AccessDenied as error:  # a chart without Apply: not a fault to retry
            vpas = None
            unreadable = ("not changed: unthrottle cannot tell whether a "
                          f"VerticalPodAutoscaler controls its limits ({error})")  # fmt: skip
        infos = selection.deployments or {}
        records: dict[str, Record | None] = {}  # each Deployment's record, read once
        in_flight = 0
        for w in result.workloads:
            info = infos.get((w.namespace, w.deployment))
            if info is None or w.deployment in skipped:
                continue
            try:
                record = records[w.deployment] = record_of(info.raw)
            except RecordError as error:
                out[w.deployment] = (State.SKIPPED, f"{error}: fix or remove the annotation")
                continue
            if record is not None and record.policy == policy and record.in_verification():
                if record.in_place and self.inplace is not None:
                    outcome = self.inplace.step(spec, info.raw, record, now,
                                                self._fallback(body, spec, w, now))  # fmt: skip
                else:
                    outcome = self._verify(body, spec, selection, info.raw, record, w, now)
                out[w.deployment] = outcome
                in_flight += outcome[0] == State.VERIFYING
            elif (record is not None and record.policy == policy and record.in_place
                  and record.verdict == "Applied" and self.inplace is not None):  # fmt: skip
                # pods the webhook missed (created while it was down) are resized first
                stray = self.inplace.strays(info.raw, record, self._summary(record), now)
                if stray is not None:
                    out[w.deployment] = stray
        for w in result.workloads:  # most harmful first
            if w.deployment in out or w.deployment in skipped:
                continue
            info = infos.get((w.namespace, w.deployment))
            if info is None:
                continue
            ours = records.get(w.deployment)
            if ours is not None and ours.policy != policy:
                ours = None  # another policy's record: nothing of ours to hold back or show
            held = self._held(body, spec, info.raw, ours, vpas, now)
            if held is not None:
                if states.get(w.deployment) == State.RECOMMENDED or held[0] != State.SKIPPED:
                    out[w.deployment] = held
                continue
            if states.get(w.deployment) != State.RECOMMENDED:
                if (
                    ours is not None
                    and ours.verdict == "Applied"
                    and (states.get(w.deployment) == State.UP_TO_DATE)
                ):
                    out[w.deployment] = (State.APPLIED, f"applied: {self._summary(ours)}")
                continue
            if unreadable is not None:
                out[w.deployment] = (State.SKIPPED, unreadable)
                continue
            if not spec.apply.dry_run and in_flight >= spec.apply.max_concurrent:
                limit = spec.apply.max_concurrent
                out[w.deployment] = (State.RECOMMENDED, f"waiting: {in_flight} of this "
                                     "policy's changes are rolling out or in verification "
                                     f"(apply.maxConcurrent {limit})")  # fmt: skip
                continue
            outcome = self._change(body, spec, w, info.raw, now)
            out[w.deployment] = outcome
            in_flight += outcome[0] == State.VERIFYING
        return out

    # -- holding back ------------------------------------------------------------------

    @property
    def no_resize(self) -> str | None:
        """Why pods cannot be resized in place on this server, if the last run found out."""
        return None if self.inplace is None else self.inplace.no_resize

    def release(self, body: dict[str, Any], deployments: list[dict[str, Any]],
                now: float) -> list[str]:  # fmt: skip
        """The policy was deleted: each of its InPlace records still open or Applied gets the
        verdict ``PolicyDeleted``, so the webhook gives new pods nothing more (the pods
        already resized keep their limits until the next rollout, and the record says
        so). The Deployments whose record was closed."""
        uid = str((body.get("metadata") or {}).get("uid"))
        closed = []
        for raw in deployments:
            try:
                record = record_of(raw)
            except RecordError:
                continue
            if (record is None or record.policy_uid != uid or not record.in_place
                    or record.verdict not in (None, "Applied")):  # fmt: skip
                continue
            done = replace(record, verdict="PolicyDeleted", verdict_at=now,
                           verdict_reason=f"policy {record.policy} was deleted: new pods get "
                           "the template's settings; pods resized in place keep theirs until "
                           "the next rollout")  # fmt: skip
            meta = raw["metadata"]
            try:
                self.deployments.json_patch(meta["namespace"], ref_of(raw),
                                            record_patch(raw, done))  # fmt: skip
            except Exception as error:  # the API failed: logged, the next one is tried
                _log.warning("record of %s/%s not closed: %s", meta["namespace"], meta["name"],
                             _short(error))  # fmt: skip
                continue
            closed.append(meta["name"])
        return closed

    def _soon(self, seconds: float) -> None:
        """Ask for the next reconcile within ``seconds`` (a rollout or a resize to see done,
        a verification due): the policy's interval is for finding new work."""
        self.wake_in_s = seconds if self.wake_in_s is None else min(self.wake_in_s, seconds)

    def _held(self, body: dict[str, Any], spec: ThrottlePolicySpec, raw: dict[str, Any],
              record: Record | None, vpas: list[dict[str, Any]] | None,
              now: float) -> Outcome | None:  # fmt: skip
        """Why not to change it now: a skip, a rollback to respect, a cooldown (``record``:
        this policy's record on the Deployment, if any)."""
        reason = skip_reason(raw, vpas, gitops_patch=spec.apply.git_ops == "Patch")
        if reason is not None:
            return State.SKIPPED, reason
        if record is None:
            return None
        generation = body["metadata"].get("generation")
        if record.verdict == "RolledBack":
            # A scale (an HPA's) raises the generation too: the template is what counts.
            same = (record.template == template_fingerprint(raw) if record.template
                    else record.generation == raw["metadata"].get("generation"))  # fmt: skip
            unchanged = record.policy_generation == generation and same
            if unchanged:
                return State.ROLLED_BACK, (f"rolled back: {record.verdict_reason}; not tried "
                                           "again until the policy or the Deployment "
                                           "changes")  # fmt: skip
            return None
        if record.verdict == "Applied" and now < record.at + spec.apply.cooldown_s:
            return State.APPLIED, (f"applied: {self._summary(record)}; cooldown until "
                                   f"{_iso(record.at + spec.apply.cooldown_s)}")  # fmt: skip
        return None

    @staticmethod
    def _summary(record: Record) -> str:
        parts = []
        for c in record.containers:
            after = record.ratio_after.get(c.name)
            parts.append(
                f"{c.name} {percent(c.ratio_before)} → {percent(after)} of periods throttled"
            )
        return ", ".join(parts)

    # -- changing ----------------------------------------------------------------------

    def _change(self, body: dict[str, Any], spec: ThrottlePolicySpec, w: WorkloadResult,
                listed: dict[str, Any], now: float) -> Outcome:  # fmt: skip
        namespace = body["metadata"]["namespace"]
        raw = self.deployments.get(namespace, w.deployment) or listed  # fresh: smaller races
        changes = changes_as_read(w, raw, spec)
        if not changes:
            return State.UP_TO_DATE, None
        if spec.apply.method != "Rollout":
            if self.inplace is None:
                return State.SKIPPED, ("apply.method " + spec.apply.method + ": this operator "
                                       "was started without access to pods")  # fmt: skip
            return self._change_in_place(body, spec, w, raw, changes, now)
        return self._rollout(body, spec, raw, changes, now)

    def _rollout(self, body: dict[str, Any], spec: ThrottlePolicySpec, raw: dict[str, Any],
                 changes: list[ContainerChange], now: float,
                 note: str = "") -> Outcome:  # fmt: skip
        meta = body["metadata"]
        namespace, policy = meta["namespace"], meta["name"]
        deployment = ref_of(raw)
        record = plan(raw, changes, policy=policy, policy_uid=str(meta.get("uid")),
                      policy_generation=int(meta.get("generation") or 0), now=now)  # fmt: skip
        text = "; ".join(describe(c, policy) for c in changes)
        try:
            ops = apply_patch(raw, record)
            self.deployments.json_patch(namespace, deployment, ops, dry_run=spec.apply.dry_run)
        except PatchConflict as error:
            return State.RECOMMENDED, f"{error}: re-read and retried on the next cycle"
        except (PatchPlanError, PatchRefused) as error:
            return State.SKIPPED, str(error)
        except Exception as error:  # the API failed or timed out: nothing known to be written
            _log.warning("patch of %s/%s failed: %s", namespace, deployment, _short(error))
            return State.RECOMMENDED, (f"the patch failed ({_short(error)}): retried on the "
                                       "next cycle, from the Deployment's record")  # fmt: skip
        if spec.apply.dry_run:
            self._event(raw, "Normal", "DryRun", f"dry run, nothing changed: would have {text}")
            return State.RECOMMENDED, f"dry run (the API server accepted it): would have {text}"
        self._event(raw, "Normal", "Applied", text + note)
        self._soon(ROLLOUT_POLL_S)
        if on_delete(raw):
            return State.VERIFYING, (f"changed: {text}{note}; its updateStrategy is OnDelete: "
                                     f"{WAITS_FOR_RESTARTS}")  # fmt: skip
        return State.VERIFYING, f"changed: {text}{note}; waiting for the rollout"

    # -- in place ----------------------------------------------------------------------

    def _change_in_place(self, body: dict[str, Any], spec: ThrottlePolicySpec,
                         w: WorkloadResult, raw: dict[str, Any],
                         changes: list[ContainerChange], now: float) -> Outcome:  # fmt: skip
        assert self.inplace is not None
        meta = body["metadata"]
        namespace, policy = meta["namespace"], meta["name"]
        if rollout(raw) != "done":
            return State.RECOMMENDED, (f"waiting: the {w.kind} is rolling out; its pods are "
                                       "resized in place once it is done")  # fmt: skip
        current, pods = self.inplace.pods.current(raw)
        live = sorted(p["metadata"]["name"] for p in pods if running(p))
        if current is None or not live:
            return State.RECOMMENDED, "no running pod to resize in place (scaled to zero?)"
        kept, note = [], ""
        for change in changes:  # an env var: only a rollout changes it
            c = change
            if c.after.gomaxprocs != c.before.gomaxprocs:
                note += (f"; GOMAXPROCS {c.after.gomaxprocs} for {c.name} is not applied: an "
                         "env var, which a resize cannot change and InPlace leaves the "
                         "template alone (set it in the template, or use apply.method "
                         "Rollout)")  # fmt: skip
                c = replace(c, after=replace(c.after, gomaxprocs=c.before.gomaxprocs))
            if c.after != c.before:
                kept.append(c)
        if not kept:
            return State.UP_TO_DATE, note[2:] or None
        record = replace(
            plan(raw, kept, policy=policy, policy_uid=str(meta.get("uid")),
                 policy_generation=int(meta.get("generation") or 0), now=now),
            method="InPlace", replicaset=current, canary=live[0], resized=(live[0],),
        )  # fmt: skip
        text = "; ".join(describe(c, policy) for c in kept)
        if spec.apply.dry_run:
            try:
                pod = self.inplace.pods.get(namespace, live[0])
                body_ = None if pod is None else resize_body(pod, targets(pod, record))
                if body_ is not None:
                    self.inplace.pods.resize(namespace, live[0], body_, dry_run=True)
            except NoResizeSubresource as error:
                self.inplace.no_resize = str(error)
                return State.SKIPPED, f"dry run: in-place resize refused: {error}"
            except (PatchRefused, InPlaceError) as error:
                return State.SKIPPED, f"dry run: in-place resize refused: {error}"
            self._event(raw, "Normal", "DryRun", f"dry run, nothing changed: would have resized "
                        f"pod {live[0]} in place first: {text}")  # fmt: skip
            return State.RECOMMENDED, (f"dry run (the API server accepted the resize): would "
                                       f"have resized pod {live[0]} in place first: "
                                       f"{text}{note}")  # fmt: skip
        written = self.inplace.write(raw, record, first=True)
        if written is None:
            return State.RECOMMENDED, "the Deployment changed while read: retried next cycle"
        self._event(raw, "Normal", "Applied", f"resizing in place, canary pod {live[0]} first: "
                    f"{text}{note}")  # fmt: skip
        return self.inplace.step(spec, written, record, now, self._fallback(body, spec, w, now))

    def _fallback(self, body: dict[str, Any], spec: ThrottlePolicySpec, w: WorkloadResult,
                  now: float) -> Callable[[str], Outcome]:  # fmt: skip
        """InPlaceOrRollout: the same change as a rollout, once a pod cannot be resized."""
        namespace = body["metadata"]["namespace"]

        def rollout_instead(reason: str) -> Outcome:
            raw = self.deployments.get(namespace, w.deployment)
            if raw is None:
                return State.SKIPPED, "the Deployment is gone"
            changes = changes_as_read(w, raw, spec)
            if not changes:
                return State.UP_TO_DATE, None
            return self._rollout(body, spec, raw, changes, now,
                                 note=f" (a rollout: {reason})")  # fmt: skip

        return rollout_instead

    # -- verifying ---------------------------------------------------------------------

    def _verify(self, body: dict[str, Any], spec: ThrottlePolicySpec, selection: Selection,
                raw: dict[str, Any], record: Record, w: WorkloadResult,
                now: float) -> Outcome:  # fmt: skip
        namespace = body["metadata"]["namespace"]
        state = rollout(raw)
        if state == "failed":
            return self._rollback(raw, record, now, "the rollout failed (ProgressDeadlineExceeded)")
        if state == "progressing" and record.rollout_done_at is None:
            if on_delete(raw):  # nothing to poll for: the team's restarts, whenever they come
                return State.VERIFYING, (f"{WAITS_FOR_RESTARTS} ({_updated(raw)}): "
                                         f"{self._describe(record)}")  # fmt: skip
            self._soon(ROLLOUT_POLL_S)
            return State.VERIFYING, f"rolling out: {self._describe(record)}"
        if record.rollout_done_at is None:
            record = replace(record, rollout_done_at=now)
            if not self._rewrite(raw, record):
                return State.VERIFYING, "the record changed meanwhile: re-read next cycle"
        assert record.rollout_done_at is not None
        ready_at = record.rollout_done_at + spec.apply.verify_for_s
        if now < ready_at:
            self._soon(ready_at - now)
            return State.VERIFYING, (f"rolled out; verifying until {_iso(ready_at)}: "
                                     f"{self._describe(record)}")  # fmt: skip
        window = max(60, math.floor(now - record.rollout_done_at))
        try:
            owners = self._new_revision(raw, selection.owners)
            found = fetch_evidence(self.metrics, [namespace], window, at=now, owners=owners)
        except MetricsError as error:
            return State.VERIFYING, f"no verdict while Prometheus cannot answer ({error})"
        after: dict[str, float | None] = {}
        worse, unused = [], []
        for c in record.containers:
            item = found.get(WorkloadKey(namespace, w.deployment, c.name))
            ratio = item.throttle_ratio() if item is not None else None
            burst_periods = item.burst_periods if item is not None else None
            if c.after.burst_us and burst_periods is not None and burst_periods < 1:
                unused.append(f"{c.name} {in_ms(c.after.burst_us)}")  # cAdvisor's counters say
            if ratio is None:
                if (raw.get("spec") or {}).get("replicas", 1) == 0:
                    return State.VERIFYING, ("scaled to zero: no pod has run the change yet; "
                                             "verified once it runs again")  # fmt: skip
                return State.VERIFYING, "no counters for the new pods yet: no verdict"
            after[c.name] = ratio
            if self._worse(judged_against(c), ratio, item.periods if item else 0,
                           spec.target_throttle_ratio):  # fmt: skip
                worse.append(f"{c.name} {percent(c.ratio_before)} → {percent(ratio)}")
        record = replace(record, ratio_after=after)
        if worse and spec.apply.rollback_if_worse:
            why = f"throttling got worse: {', '.join(worse)} of periods"
            return self._rollback(raw, record, now, why)
        reason = ("worse, kept (rollbackIfWorse is false)" if worse else
                  "throttling at or under the target, or better than before")  # fmt: skip
        if unused:  # a burst that is never used was not needed: the next recommendation drops it
            reason += (f"; the burst was never used ({', '.join(unused)}): not needed, and a "
                       "recommendation from the counters drops it")  # fmt: skip
        done = replace(record, verdict="Applied", verdict_at=now, verdict_reason=reason)
        if not self._rewrite(raw, done):
            return State.VERIFYING, "the record changed meanwhile: re-read next cycle"
        self._event(raw, "Normal", "Verified", f"kept: {self._summary(done)}")
        return State.APPLIED, f"applied: {self._summary(done)}"

    def _worse(self, before: float | None, after: float, periods: float, target: float) -> bool:
        if after <= target:
            return False
        base = before or 0.0
        spread = self.verify.sigmas * math.sqrt(max(base * (1 - base), 1e-9) / max(periods, 1))
        return after > base + max(self.verify.noise, spread)

    def _rollback(self, raw: dict[str, Any], record: Record, now: float, reason: str) -> Outcome:
        meta = raw["metadata"]
        try:
            fresh = self._fresh(raw)
            if fresh is None:
                return State.VERIFYING, ("rollback postponed: the record changed meanwhile: "
                                         "re-read next cycle")  # fmt: skip
            ops, _ = rollback_patch(fresh, record, now=now, reason=reason)
            self.deployments.json_patch(meta["namespace"], ref_of(raw), ops)
        except PatchConflict as error:
            return State.VERIFYING, f"rollback postponed: {error}"
        except (PatchPlanError, PatchRefused) as error:
            return State.SKIPPED, f"not rolled back: {error}"
        except Exception as error:  # the API failed: the record still says what to undo
            return State.VERIFYING, f"rollback postponed: the patch failed ({_short(error)})"
        text = ", ".join(
            f"CPU limit of {c.name} back to "
            f"{'none' if c.before.cpu_limit is None else format_cpu(c.before.cpu_limit)}"
            for c in record.containers
        )
        self._event(raw, "Warning", "RolledBack", f"rolled back: {reason}; {text}")
        return State.ROLLED_BACK, f"rolled back: {reason}"

    def _rewrite(self, raw: dict[str, Any], record: Record) -> bool:
        meta = raw["metadata"]
        try:
            fresh = self._fresh(raw)
            if fresh is None:
                return False
            self.deployments.json_patch(meta["namespace"], ref_of(raw),
                                        record_patch(fresh, record))  # fmt: skip
        except Exception:  # a conflict or a failed call: the next cycle re-reads the record
            return False
        return True

    def _fresh(self, raw: dict[str, Any]) -> dict[str, Any] | None:
        """The Deployment as it is now, if its record is still the one in ``raw`` (None:
        gone, or the record was rewritten meanwhile). A verdict is written on this copy,
        not on ``raw``: the patch tests the resourceVersion, which every write of the
        Deployment controller moves (a pod that comes or goes changes the status), and
        ``raw`` was read before the reconcile's metrics queries; on that copy a rollback
        would wait for a reconcile in which no pod changed, which an unhealthy Deployment
        may never have."""
        meta = raw["metadata"]
        fresh = self.deployments.get(meta["namespace"], ref_of(raw))
        if fresh is None or record_text(fresh) != record_text(raw):
            return None
        return fresh

    def _new_revision(self, raw: dict[str, Any], owners: Owners | None) -> Owners | None:
        """Whose pods a verdict reads: a StatefulSet's updated from its partition up, only
        its pods at the new revision (``status.updateRevision``, their
        ``controller-revision-hash``); else every pod (once the rollout is done, the pods
        that ran since are the new template's)."""
        status = raw.get("status") or {}
        if raw.get("kind") != STATEFULSET or not partition(raw) or not status.get("updateRevision"):
            return owners
        reference = ref_of(raw)
        namespace = raw["metadata"]["namespace"]
        pods = self.deployments.revision_pods(raw, str(status["updateRevision"]))
        return Owners(pods={(namespace, pod): reference for pod in pods},
                      pod_level=set(owners.pod_level) if owners else set())  # fmt: skip

    @staticmethod
    def _describe(record: Record) -> str:
        return "; ".join(describe(c, record.policy) for c in record.containers)

    def _event(self, raw: dict[str, Any], kind: str, reason: str, message: str) -> None:
        involved = {"apiVersion": "apps/v1", "kind": raw.get("kind") or DEPLOYMENT,
                    "metadata": raw["metadata"]}  # fmt: skip
        try:
            self.objects.event(involved, kind, reason, message)
        except Exception as error:  # an event is worth a log line, not a failed change
            _log.warning("cannot post event %s: %s", reason, error)


def _short(error: Exception) -> str:
    """An API error in one line: its HTTP status and reason, or its type."""
    status = getattr(error, "status", None)
    if status is not None:
        return f"HTTP {status} {getattr(error, 'reason', '')}".strip()
    return type(error).__name__


def _iso(unix: float) -> str:
    from unthrottle.operator.status import timestamp

    return timestamp(unix)


__all__ = ["Applier", "ContainerResult", "VerifySettings", "changes_for", "describe"]
