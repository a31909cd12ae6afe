"""The Kopf handlers: thin. One daemon per policy runs a reconcile in a thread, then waits
for the policy's interval (or the retry delay), waking early when the spec changes.

A daemon rather than a timer: a timer's interval is fixed when the handler is
declared, and each policy has its own. Kopf is imported here and in ``runner.py``
only (an import-linter contract says so).

With an admission webhook (``unthrottle operator --webhook``), one mutating handler gives
the pods an InPlace change's ReplicaSet creates the applied settings
(:mod:`unthrottle.operator.admission`).
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Callable
from typing import Any

import kopf

from unthrottle.kube.objects import GROUP, PLURAL, VERSION
from unthrottle.operator.admission import HANDLER_ID, PodAdmission
from unthrottle.operator.reconcile import Reconciler
from unthrottle.operator.settings import OperatorSettings

_log = logging.getLogger("unthrottle.operator")


def register(registry: kopf.OperatorRegistry, reconciler: Reconciler, settings: OperatorSettings,
             *, admission: PodAdmission | None = None,
             api_version: Callable[[], str] | None = None) -> None:  # fmt: skip
    """Declare the handlers on ``registry`` (``admission``: the pods' mutating webhook too;
    ``api_version``: asks the API server its version, raising when it does not answer)."""

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # the kubernetes client's own loading: $KUBECONFIG, or the in-cluster service account
        return kopf.login_via_client(**kwargs)

    peering_lifetime_s = settings.peering_lifetime_s

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        # With --peering: how soon a standby sees that the working replica died unannounced
        # (its keep-alive expires); the keep-alives start after the startup handlers
        settings.peering.lifetime = peering_lifetime_s
        # Kopf's own bookkeeping in annotations, never in status (which is ours)
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
            prefix="unthrottle.io"
        )
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix="unthrottle.io", key="last-handled-configuration"
        )
        settings.posting.level = logging.WARNING  # our events say what happened
        settings.networking.request_timeout = 60
        settings.watching.server_timeout = 300

    @kopf.daemon(GROUP, VERSION, PLURAL, registry=registry, cancellation_timeout=10.0)
    async def policy_loop(body: kopf.Body, stopped: kopf.DaemonStopped, **_: Any) -> None:
        while not stopped:
            generation = body.get("metadata", {}).get("generation")
            snapshot = copy.deepcopy(dict(body))
            outcome = await asyncio.to_thread(reconciler.reconcile, snapshot)
            waited = 0.0
            while not stopped and waited < outcome.next_in_s:
                await asyncio.sleep(settings.poll_s)
                waited += settings.poll_s
                if body.get("metadata", {}).get("generation") != generation:
                    break  # the spec changed: reconcile now

    @kopf.on.delete(GROUP, VERSION, PLURAL, registry=registry, optional=True)
    def forget(body: kopf.Body, **_: Any) -> None:
        reconciler.forget(copy.deepcopy(dict(body)))

    @kopf.on.probe(registry=registry, id="policies")
    def policies(**_: Any) -> int:
        return len(reconciler.memory)

    if api_version is not None:
        # /healthz fails (500) while the API server does not answer: an operator that cannot
        # reach it does nothing, and its pod should say so (not Ready, then restarted by the
        # liveness probe) instead of looking healthy while Kopf retries in its log.
        @kopf.on.probe(registry=registry, id="api", errors=kopf.ErrorsMode.PERMANENT)
        def api(**_: Any) -> str:
            try:
                return api_version()
            except Exception as error:
                raise kopf.PermanentError(f"the API server did not answer: {error}") from None

    if admission is not None:
        _register_admission(registry, admission)


def _register_admission(registry: kopf.OperatorRegistry, admission: PodAdmission) -> None:
    # ignore_failures and side_effects describe the configuration, which the chart writes
    # (settings.admission.managed is None); Kopf rejects a pod whose handler raises, so
    # admission.review never raises.
    @kopf.on.mutate("v1", "pods", id=HANDLER_ID, operations=["CREATE"], ignore_failures=True,
                    side_effects=False, registry=registry)  # fmt: skip
    async def inplace_pods(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        merge = await admission.review(copy.deepcopy(dict(body)))
        if merge is not None:
            patch.update(merge)  # Kopf sends it as a JSON Patch against the pod as it came
