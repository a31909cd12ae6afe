"""Why Apply mode leaves a workload alone, and where its rollout stands: pure checks over
the workload (a Deployment, a StatefulSet or a DaemonSet, by its ``kind``) and its VPAs."""

from __future__ import annotations

from typing import Any

ARGO_ANNOTATION = "argocd.argoproj.io/tracking-id"
ARGO_LABEL = "argocd.argoproj.io/instance"
FLUX_PREFIXES = ("kustomize.toolkit.fluxcd.io/", "helm.toolkit.fluxcd.io/")


def gitops_owner(deployment: dict[str, Any]) -> str | None:
    """Argo CD or Flux, when one of them manages the Deployment (and would revert a patch)."""
    meta = deployment.get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    if ARGO_ANNOTATION in annotations or ARGO_LABEL in labels:
        return "Argo CD"
    if any(k.startswith(FLUX_PREFIXES) for k in labels):
        return "Flux"
    return None


def vpa_controlling(deployment: dict[str, Any], vpas: list[dict[str, Any]] | None) -> str | None:
    """The name of a VPA that sets this Deployment's CPU limits, if any.

    A VPA in a mode other than ``Off`` whose container policies leave
    ``controlledValues`` at its default (``RequestsAndLimits``) or set it so, and
    whose ``controlledResources`` include cpu (the default), changes limits on every
    pod it recreates: a limit we patched would not last."""
    name = (deployment.get("metadata") or {}).get("name")
    kind = deployment.get("kind") or "Deployment"
    for vpa in vpas or []:
        spec = vpa.get("spec") or {}
        target = spec.get("targetRef") or {}
        if target.get("kind") != kind or target.get("name") != name:
            continue
        if (spec.get("updatePolicy") or {}).get("updateMode", "Auto") == "Off":
            continue
        policies = (spec.get("resourcePolicy") or {}).get("containerPolicies") or [{}]
        for policy in policies:
            if policy.get("mode") == "Off":
                continue
            if "cpu" not in policy.get("controlledResources", ["cpu", "memory"]):
                continue
            if policy.get("controlledValues", "RequestsAndLimits") == "RequestsAndLimits":
                return str((vpa.get("metadata") or {}).get("name"))
    return None


def skip_reason(deployment: dict[str, Any], vpas: list[dict[str, Any]] | None, *,
                gitops_patch: bool) -> str | None:  # fmt: skip
    """Why Apply must not patch this Deployment, or None."""
    if (deployment.get("spec") or {}).get("paused"):
        return "the Deployment is paused (spec.paused): unpause it to let unthrottle apply"
    vpa = vpa_controlling(deployment, vpas)
    if vpa is not None:
        return (f"the VerticalPodAutoscaler {vpa} controls its CPU limits "
                "(controlledValues RequestsAndLimits): set controlledValues: RequestsOnly, or "
                "leave the limit to the VPA")  # fmt: skip
    owner = gitops_owner(deployment)
    if owner is not None and not gitops_patch:
        return (f"{owner} manages it and would revert a patch: apply the kustomize report "
                "through Git instead (unthrottle report POLICY --format kustomize), or set "
                "apply.gitOps: Patch")  # fmt: skip
    return None


def on_delete(workload: dict[str, Any]) -> bool:
    """A StatefulSet or DaemonSet whose pods take a new template only when deleted
    (``updateStrategy.type: OnDelete``): nothing restarts after a patch."""
    strategy = ((workload.get("spec") or {}).get("updateStrategy") or {}).get("type")
    return workload.get("kind") in ("StatefulSet", "DaemonSet") and strategy == "OnDelete"


def rollout(deployment: dict[str, Any]) -> str:
    """``done``, ``failed`` or ``progressing``, from the workload's status: what ``kubectl
    rollout status`` says for its kind (k8s.io/kubectl's polymorphichelpers), and for a
    Deployment, also that old pods still terminating are gone. With ``OnDelete``, done once
    every pod has been restarted onto the new template."""
    kind = deployment.get("kind") or "Deployment"
    if kind == "StatefulSet":
        return _statefulset_rollout(deployment)
    if kind == "DaemonSet":
        return _daemonset_rollout(deployment)
    meta, spec = deployment.get("metadata") or {}, deployment.get("spec") or {}
    status = deployment.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("type") == "Progressing" and (
            condition.get("reason") == "ProgressDeadlineExceeded"
        ):
            return "failed"
    replicas = spec.get("replicas", 1)
    if (
        (status.get("observedGeneration") or 0) >= (meta.get("generation") or 0)
        and (status.get("updatedReplicas") or 0) >= replicas
        and (status.get("availableReplicas") or 0) >= replicas
        and not status.get("unavailableReplicas")
        # old pods still terminating count in status.replicas (kubectl rollout status waits
        # for them too): until they are gone, their counters are not the new settings'
        and (status.get("replicas") or 0) <= (status.get("updatedReplicas") or 0)
    ):
        return "done"
    return "progressing"


def _observed(workload: dict[str, Any]) -> bool:
    meta, status = workload.get("metadata") or {}, workload.get("status") or {}
    seen = status.get("observedGeneration") or 0
    return bool(seen) and seen >= (meta.get("generation") or 0)


def partition(statefulset: dict[str, Any]) -> int:
    """The ordinal from which a StatefulSet's RollingUpdate updates pods (0: all)."""
    strategy = (statefulset.get("spec") or {}).get("updateStrategy") or {}
    return int((strategy.get("rollingUpdate") or {}).get("partition") or 0)


def _statefulset_rollout(sts: dict[str, Any]) -> str:
    """kubectl's StatefulSetStatusViewer: the spec observed, every replica ready, and the
    pods from the partition up updated (OnDelete: every pod, once the team restarted it)."""
    spec, status = sts.get("spec") or {}, sts.get("status") or {}
    replicas = spec.get("replicas", 1)
    if not _observed(sts) or (status.get("readyReplicas") or 0) < replicas:
        return "progressing"
    wanted = replicas if on_delete(sts) else replicas - partition(sts)
    return "done" if (status.get("updatedReplicas") or 0) >= wanted else "progressing"


def _daemonset_rollout(ds: dict[str, Any]) -> str:
    """kubectl's DaemonSetStatusViewer: the spec observed, every node's pod updated and
    available."""
    status = ds.get("status") or {}
    desired = status.get("desiredNumberScheduled") or 0
    if not _observed(ds) or (status.get("updatedNumberScheduled") or 0) < desired:
        return "progressing"
    return "done" if (status.get("numberAvailable") or 0) >= desired else "progressing"
