"""Apply mode's InPlace method: resize the running pods of a Deployment, one canary first,
without a rollout and without restarting a pod.

Every step is decided from the Deployment's record (``unthrottle.io/last-applied``) and the
pods as they are, never from memory; the record names the pods before they are touched, so
an operator killed at any point resumes, and a rollback knows what to resize back.

Per reconcile, for a record of ours with no verdict:

=============================  ===========================================================
where it stands                what happens
=============================  ===========================================================
a newer ReplicaSet             the team rolled out a change: the record is closed
                               (``Superseded``), the new pods are left alone
``undo`` set                   every resized pod is resized back (ready or not), a step at
                               a time, the burst lowered first where the change had raised
                               it; then the verdict ``RolledBack``
canary not resized yet         interim burst (if the burst falls) → the node agent wrote it
                               → resize → the kubelet reports it → final burst
canary resized                 ``verifyFor`` later, the canary's own throttle ratio: worse
                               → ``undo``; else the rest, ``maxConcurrent`` pods at a time
a resized pod not Ready        ``undo``: the resize hurt it (the canary is not replaced by
                               the next pod, which would spread the harm)
a resize in progress or Error  given up (``undo``) after ``resize_timeout_s``: the kubelet
past its deadline              retries an Error for ever
every pod resized              the verdict ``Applied``
``Applied``, a pod of the      resized in place like the others (:meth:`InPlace.strays`),
ReplicaSet not at the settings and the status says so while it is not done
Deferred / Infeasible / refused InPlace: ``undo`` with the kubelet's (or server's) words;
                               InPlaceOrRollout: a rollout instead
=============================  ===========================================================

Pods the ReplicaSet creates meanwhile get the applied settings from the admission webhook
once the canary passed (:func:`unthrottle.kube.inplace.admission_patch`). The webhook never
blocks a pod (``failurePolicy: Ignore``): one created while the operator was down keeps the
template's settings, and is resized at the next reconcile after the verdict.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from unthrottle.kube.deployments import DeploymentStore, PatchConflict, PatchRefused
from unthrottle.kube.inplace import (
    InPlaceError,
    ResizeState,
    annotation_patch,
    burst_annotation,
    interim_burst,
    interim_bursts_us,
    resize_body,
    resize_state,
    restarted_by_policy,
    targets,
)
from unthrottle.kube.patching import Record, record_patch, record_text
from unthrottle.kube.pods import NoResizeSubresource, PodStore, present, running
from unthrottle.metrics.promql import pod_burst_query, pod_counter_queries
from unthrottle.metrics.source import MetricsError, MetricsSource
from unthrottle.model.burst import BURST_ANNOTATION
from unthrottle.model.owners import DEPLOYMENT, ref_of
from unthrottle.model.policy import ThrottlePolicySpec
from unthrottle.operator.changes import judged_against
from unthrottle.operator.status import State
from unthrottle.scan import canary_ratios

_log = logging.getLogger("unthrottle.operator")
Outcome = tuple[State, str | None]
Event = Callable[[dict[str, Any], str, str, str], None]
Worse = Callable[[float | None, float, float, float], bool]


STEP_POLL_S = 2.0
WRITE_ATTEMPTS = 3
"""The next reconcile, while a pod's resize waits for its kubelet or the node agent."""


class GiveUp(Exception):
    """A pod cannot take the resize (Deferred, Infeasible, refused, no resize subresource)."""


@dataclass(frozen=True, slots=True)
class Step:
    """Where one pod's resize stands after this reconcile's step."""

    done: bool
    message: str = ""
    sent: bool = False
    """A resize was sent in this step (its time goes into the record)."""


def refused(pod: str, state: ResizeState) -> str:
    """The kubelet's answer to a resize it holds back (Deferred, Infeasible), in words."""
    return f"the kubelet of pod {pod} reports the resize {state.state.title()}: {state.message}"


def _pct(ratio: float | None) -> str:
    return "?" if ratio is None else f"{ratio * 100:.0f} %"


class InPlace:
    """Drives InPlace records; the Applier hands it the Deployments whose record says so."""

    def __init__(self, *, deployments: DeploymentStore, pods: PodStore, metrics: MetricsSource,
                 event: Event, worse: Worse, soon: Callable[[float], None],
                 resize_timeout_s: float = 300.0) -> None:  # fmt: skip
        self.deployments = deployments
        self.pods = pods
        self.metrics = metrics
        self.event = event
        self.worse = worse
        self.no_resize: str | None = None
        """Set when the API server had no pods/resize (Kubernetes before 1.33), until a
        resize goes through (the server was upgraded)."""
        self._soon = soon
        """Asks for the next reconcile within so many seconds: a resize waits seconds for
        its kubelet, not an interval."""
        self.resize_timeout_s = resize_timeout_s

    # -- the record ------------------------------------------------------------------------

    def write(self, raw: dict[str, Any], record: Record, *,
              first: bool = False) -> dict[str, Any] | None:  # fmt: skip
        """Write the record on the Deployment as it is now (``first``: there was none of
        this change yet), if nobody rewrote it meanwhile; the Deployment as written, or None.
        A Deployment's generation rises with its annotations: the record keeps the one its
        own write gives, so a later change by someone else is seen as one."""
        meta = raw["metadata"]
        for _ in range(WRITE_ATTEMPTS):
            fresh = self.deployments.get(meta["namespace"], ref_of(raw))
            if fresh is None or (not first and record_text(fresh) != record_text(raw)):
                return None
            record = replace(record, generation=int(fresh["metadata"].get("generation") or 0) + 1)
            try:
                return self.deployments.json_patch(meta["namespace"], ref_of(raw),
                                                   record_patch(fresh, record))  # fmt: skip
            except PatchConflict:
                # the Deployment controller writes the status after each of our writes (the
                # annotation moves the generation): the record is still ours, read again
                continue
            except Exception as error:  # a failed call: re-read on the next step
                _log.info("record of %s/%s not written: %s", meta["namespace"], meta["name"],
                          error)  # fmt: skip
                break
        self._soon(STEP_POLL_S)
        return None

    # -- one pod ---------------------------------------------------------------------------

    def drive(self, pod: dict[str, Any], record: Record, *, undo: bool, now: float) -> Step:
        """One step of a pod's resize (``undo``: back to the settings before), in the order
        the kernel allows: interim burst, resize, final burst. GiveUp when it cannot be,
        or when the kubelet has not finished it ``resize_timeout_s`` after it was sent."""
        meta = pod["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        try:
            want = targets(pod, record, undo=undo)
        except InPlaceError as error:
            raise GiveUp(str(error)) from None
        state = resize_state(pod, want)
        key = record.burst_key
        interim = interim_burst(record, undo=undo)
        if state.state == "asked":
            if interim is not None and burst_annotation(pod, BURST_ANNOTATION) != interim:
                self.pods.annotate(namespace, name, annotation_patch(BURST_ANNOTATION, interim))
                return Step(False, f"pod {name}: burst lowered first (the kernel refuses a "
                            "quota under the burst); waiting for the node agent")  # fmt: skip
            if interim is not None and not self._burst_written(pod, record):
                return Step(False, f"pod {name}: waiting for the node agent to write the lower "
                                   "burst before the quota falls")  # fmt: skip
            body = resize_body(pod, want)
            assert body is not None
            try:
                self.pods.resize(namespace, name, body)
            except NoResizeSubresource as error:
                self.no_resize = str(error)
                raise GiveUp(str(error)) from None
            except PatchRefused as error:
                raise GiveUp(str(error)) from None
            self.no_resize = None
            return Step(False, f"pod {name}: resize sent, waiting for its kubelet", sent=True)
        if state.state in ("deferred", "infeasible"):
            raise GiveUp(refused(name, state))
        sent_at = record.resize_sent_at.get(name)
        if state.state in ("error", "resizing") and sent_at is not None and (
                now - sent_at > self.resize_timeout_s):  # fmt: skip
            raise GiveUp(f"the kubelet of pod {name} has not finished the resize in "
                         f"{now - sent_at:.0f} s ({state.message or state.state})")  # fmt: skip
        if state.state == "error":
            return Step(False, f"pod {name}: the kubelet failed to resize it ({state.message}); "
                               "it retries")  # fmt: skip
        if state.state == "resizing":
            return Step(False, f"pod {name}: resizing ({state.message or 'in progress'})")
        final = record.burst_before if undo else record.burst_after
        if key is not None and burst_annotation(pod, key) != final:
            self.pods.annotate(namespace, name, annotation_patch(key, final))
        return Step(True, f"pod {name}: resized in place")

    def _burst_written(self, pod: dict[str, Any], record: Record) -> bool:
        """The node agent reports each container's burst at or under the interim one (no
        series for the pod: no agent samples it, so none wrote a burst into its cgroup)."""
        meta = pod["metadata"]
        try:
            samples = self.metrics.instant(pod_burst_query(meta["namespace"], meta["name"]))
        except MetricsError:
            return False
        seen = {s.labels.get("container"): s.value for s in samples}
        return all(seen.get(name) is None or seen[name] * 1e6 <= us + 1
                   for name, us in interim_bursts_us(record).items())  # fmt: skip

    def pod_ratio(self, namespace: str, pod: str, window_s: int,
                  at: float) -> dict[str, tuple[float, float]]:  # fmt: skip
        """Per container of one pod: (throttle ratio, periods) over the window, its share of
        the pod cgroup's own throttling counted (:func:`canary_ratios`)."""
        queries = pod_counter_queries(namespace, pod, max(window_s, 60))

        def per_container(name: str) -> dict[str, float]:
            return {str(s.labels.get("container", "")): s.value
                    for s in self.metrics.instant(queries[name], at=at)}  # fmt: skip

        return canary_ratios(per_container("usage_seconds"), per_container("periods"),
                             per_container("throttled_periods"))  # fmt: skip

    # -- one Deployment --------------------------------------------------------------------

    def step(self, spec: ThrottlePolicySpec, raw: dict[str, Any], record: Record, now: float,
             fallback: Callable[[str], Outcome]) -> Outcome:  # fmt: skip
        """Advance an InPlace record (no verdict yet) by what can be done now."""
        current, pods = self.pods.current(raw)
        if current != record.replicaset:
            closed = replace(record, verdict="Superseded", verdict_at=now,
                             verdict_reason=f"a rollout replaced {_revision(raw)} "
                             f"{record.replicaset} ({current} now); its new pods are left "
                             "alone")  # fmt: skip
            self.write(raw, closed)
            return State.RECOMMENDED, (f"{closed.verdict_reason}: recommended again from their "
                                       "evidence")  # fmt: skip
        alive = {p["metadata"]["name"]: p for p in pods if present(p)}
        if record.undo is not None:
            return self._undo(raw, record, alive, now)
        try:
            hurt = self._hurt(record, alive)
            if hurt is not None:
                return self._start_undo(raw, replace(record, undo=hurt), alive, now)
            if record.canary_verified_at is None:
                return self._canary(spec, raw, record, alive, now)
            return self._rest(spec, raw, record, alive, now)
        except GiveUp as error:
            reason = str(error)
            if spec.apply.method == "InPlaceOrRollout":
                return fallback(reason)
            self.event(raw, "Warning", "InPlaceGivenUp", f"in-place resize given up: {reason}")
            return self._start_undo(raw, replace(record, undo=f"in-place resize given up: "
                                                 f"{reason}"), alive, now)  # fmt: skip

    def _hurt(self, record: Record, alive: dict[str, dict[str, Any]]) -> str | None:
        """Why to roll back now: a pod whose resize was sent is no longer Ready (a canary that
        throttling made unready must not be replaced by the next pod, resized at once)."""
        for name in sorted({*record.resized, *([record.canary] if record.canary else [])}):
            pod = alive.get(name)
            if pod is None or running(pod):
                continue
            try:
                state = resize_state(pod, targets(pod, record))
            except InPlaceError:
                continue
            if state.state in ("deferred", "infeasible"):
                # never actuated: its unreadiness is not the resize's (a restarted kubelet
                # reports its pods unready a while), the kubelet's answer is the reason
                raise GiveUp(refused(name, state))
            if state.state != "asked":
                return f"pod {name} is not Ready since its resize"
        return None

    def _start_undo(self, raw: dict[str, Any], undo: Record, alive: dict[str, dict[str, Any]],
                    now: float) -> Outcome:  # fmt: skip
        written = self.write(raw, undo)
        if written is None:
            return State.VERIFYING, "the record changed meanwhile: re-read next cycle"
        return self._undo(written, undo, alive, now)

    def _sent(self, raw: dict[str, Any], record: Record, names: list[str],
              now: float) -> tuple[dict[str, Any], Record]:  # fmt: skip
        """Record when each named pod's resize was sent (its deadline counts from then)."""
        if not names:
            return raw, record
        record = replace(record, resize_sent_at={**record.resize_sent_at,
                                                 **dict.fromkeys(names, now)})  # fmt: skip
        written = self.write(raw, record)
        return (written, record) if written is not None else (raw, record)

    def _canary(self, spec: ThrottlePolicySpec, raw: dict[str, Any], record: Record,
                alive: dict[str, dict[str, Any]], now: float) -> Outcome:  # fmt: skip
        live = {name: p for name, p in alive.items() if running(p)}
        canary = live.get(record.canary or "")
        if canary is None:  # gone, or unready before its resize was sent (_hurt saw to after)
            if not live:
                return State.VERIFYING, "no running pod to resize yet (scaled to zero?)"
            pick = sorted(live)[0]
            moved = replace(record, canary=pick, canary_done_at=None,
                            resized=tuple(sorted({*record.resized, pick})))  # fmt: skip
            if self.write(raw, moved) is None:
                return State.VERIFYING, "the record changed meanwhile: re-read next cycle"
            return State.VERIFYING, (f"the canary pod {record.canary} is gone or not Ready: "
                                     f"{pick} is the canary")  # fmt: skip
        step = self.drive(canary, record, undo=False, now=now)
        if step.sent:
            raw, record = self._sent(raw, record, [canary["metadata"]["name"]], now)
        if not step.done:
            self._soon(STEP_POLL_S)
            return State.VERIFYING, f"canary: {step.message}"
        if record.canary_done_at is None:
            record = replace(record, canary_done_at=now)
            written = self.write(raw, record)
            if written is None:
                return State.VERIFYING, "the record changed meanwhile: re-read next cycle"
            raw = written
            how = _restarts(canary, record)
            self.event(raw, "Normal", "CanaryResized", f"pod {record.canary} resized in place, "
                       f"{how}; verifying for {spec.apply.verify_for}")  # fmt: skip
        assert record.canary_done_at is not None
        ready_at = record.canary_done_at + spec.apply.verify_for_s
        if now < ready_at:
            self._soon(ready_at - now)
            return State.VERIFYING, (f"canary pod {record.canary} resized in place; verifying "
                                     f"its throttling until {_iso(ready_at)}")  # fmt: skip
        namespace = raw["metadata"]["namespace"]
        try:
            found = self.pod_ratio(namespace, record.canary or "",
                                   int(now - record.canary_done_at), now)  # fmt: skip
        except MetricsError as error:
            return State.VERIFYING, f"no verdict while Prometheus cannot answer ({error})"
        after: dict[str, float | None] = {}
        worse = []
        for c in record.containers:
            if c.name not in found:
                return State.VERIFYING, f"no counters for canary pod {record.canary} yet"
            ratio, periods = found[c.name]
            after[c.name] = ratio
            if self.worse(judged_against(c), ratio, periods, spec.target_throttle_ratio):
                worse.append(f"{c.name} {_pct(c.ratio_before)} → {_pct(ratio)}")
        record = replace(record, ratio_after=after)
        if worse and spec.apply.rollback_if_worse:
            return self._start_undo(raw, replace(
                record, undo=f"throttling of canary pod {record.canary} got worse: "
                f"{', '.join(worse)} of periods"), alive, now)  # fmt: skip
        passed = replace(record, canary_verified_at=now)
        written = self.write(raw, passed)
        if written is None:
            return State.VERIFYING, "the record changed meanwhile: re-read next cycle"
        text = ", ".join(f"{c.name} {_pct(c.ratio_before)} → {_pct(after.get(c.name))}"
                         for c in record.containers)  # fmt: skip
        self.event(written, "Normal", "CanaryPassed", f"canary pod {record.canary}: {text} of "
                   "periods throttled; resizing the rest")  # fmt: skip
        return self._rest(spec, written, passed, alive, now)

    def _rest(self, spec: ThrottlePolicySpec, raw: dict[str, Any], record: Record,
              alive: dict[str, dict[str, Any]], now: float) -> Outcome:  # fmt: skip
        waiting, untouched, sent = [], [], []
        for name in sorted(alive):
            pod = alive[name]
            if name in record.resized or name == record.canary:
                step = self.drive(pod, record, undo=False, now=now)
                sent += [name] if step.sent else []
                if not step.done:
                    waiting.append(step.message)
            elif resize_state(pod, targets(pod, record)).state == "done":
                continue  # created after the canary passed: the webhook gave it the settings
            elif running(pod):
                untouched.append(name)
        room = max(0, spec.apply.max_concurrent - len(waiting))
        start = untouched[:room]
        if start:
            record = replace(record, resized=tuple(sorted({*record.resized, *start})))
            written = self.write(raw, record)  # named before they are touched
            if written is None:
                return State.VERIFYING, "the record changed meanwhile: re-read next cycle"
            raw = written
            for name in start:
                step = self.drive(alive[name], record, undo=False, now=now)
                sent += [name] if step.sent else []
                waiting.append(step.message)
        raw, record = self._sent(raw, record, sent, now)
        if waiting or untouched[room:]:
            self._soon(STEP_POLL_S)
            left = len(untouched) - len(start)
            more = f"; {left} more after these" if left else ""
            return State.VERIFYING, (f"canary passed; resizing the rest "
                                     f"(apply.maxConcurrent {spec.apply.max_concurrent}): "
                                     f"{'; '.join(waiting)}{more}")  # fmt: skip
        sample = next(iter(alive.values()), None)
        done = replace(
            record,
            verdict="Applied",
            verdict_at=now,
            verdict_reason=f"{len(alive)} pods resized in place{_whole(raw, alive)}, "
            f"{_restarts(sample, record) if sample else 'none restarted'}",
        )
        if self.write(raw, done) is None:
            return State.VERIFYING, "the record changed meanwhile: re-read next cycle"
        self.event(raw, "Normal", "Verified", f"kept: {done.verdict_reason}")
        return State.APPLIED, f"applied in place: {done.verdict_reason}"

    def strays(self, raw: dict[str, Any], record: Record, summary: str,
               now: float) -> Outcome | None:  # fmt: skip
        """An ``Applied`` record whose ReplicaSet has running pods without the applied
        settings: the webhook was not reached when they were created (the operator down,
        or slower than the API server waits). Each is resized in place, as the rest were
        (the change passed its canary); the status says so until they are done, or why one
        cannot be. None when every pod has the settings (or the ReplicaSet is not current:
        a newer one's pods are the team's)."""
        current, pods = self.pods.current(raw)
        if current != record.replicaset:
            return None
        waiting: list[str] = []
        for pod in sorted((p for p in pods if running(p)), key=lambda p: p["metadata"]["name"]):
            name = pod["metadata"]["name"]
            try:  # a pod at the settings costs nothing here (its burst set if it was not)
                step = self.drive(pod, record, undo=False, now=now)
            except (InPlaceError, GiveUp) as error:
                waiting.append(f"pod {name} keeps the template's settings: {error}")
                continue
            if step.sent:
                self.event(raw, "Normal", "StrayResized", f"pod {name} was created without the "
                           "applied settings (the admission webhook was not reached): resized "
                           "in place")  # fmt: skip
            if not step.done:
                waiting.append(step.message)
        if not waiting:
            return None
        self._soon(STEP_POLL_S)
        return State.APPLIED, (f"applied: {summary}; pods created without the applied settings "
                               f"(the admission webhook was not reached): "
                               f"{'; '.join(waiting)}")  # fmt: skip

    def _undo(self, raw: dict[str, Any], record: Record, alive: dict[str, dict[str, Any]],
              now: float) -> Outcome:  # fmt: skip
        waiting, sent = [], []
        for name in sorted(alive):  # the resized ones (Ready or not), any the webhook changed
            try:
                step = self.drive(alive[name], record, undo=True, now=now)
            except GiveUp as error:
                waiting.append(f"pod {name} cannot be resized back: {error}")
                continue
            sent += [name] if step.sent else []
            if not step.done:
                waiting.append(step.message)
        raw, record = self._sent(raw, record, sent, now)
        if waiting:
            self._soon(STEP_POLL_S)
            return State.VERIFYING, f"rolling back in place ({record.undo}): {'; '.join(waiting)}"
        done = replace(record, verdict="RolledBack", verdict_at=now, verdict_reason=record.undo)
        if self.write(raw, done) is None:
            return State.VERIFYING, "the record changed meanwhile: re-read next cycle"
        self.event(raw, "Warning", "RolledBack", f"rolled back in place: {record.undo}")
        return State.ROLLED_BACK, f"rolled back: {record.undo}"


def _revision(raw: dict[str, Any]) -> str:
    """What a Deployment's pods belong to (its ReplicaSet), or another kind's (a revision)."""
    kind = raw.get("kind") or DEPLOYMENT
    return "ReplicaSet" if kind == DEPLOYMENT else f"{kind} revision"


def _whole(raw: dict[str, Any], alive: dict[str, dict[str, Any]]) -> str:
    """`` (the canary was the whole StatefulSet: one pod)``: a verdict on one pod alone,
    which no canary could spare (a single database; a DaemonSet on one node)."""
    if len(alive) != 1:
        return ""
    return f" (the canary was the whole {raw.get('kind') or DEPLOYMENT}: one pod)"


def _restarts(pod: dict[str, Any], record: Record) -> str:
    """What the resize did to the containers: none restarted, or which ones the kubelet
    restarted because their ``resizePolicy`` says ``RestartContainer``."""
    restarted = restarted_by_policy(pod, record)
    if not restarted:
        return "none restarted"
    return (
        f"container {', '.join(restarted)} restarted by the kubelet (its resizePolicy is "
        "RestartContainer)"
    )


def _iso(unix: float) -> str:
    from unthrottle.operator.status import timestamp

    return timestamp(unix)
