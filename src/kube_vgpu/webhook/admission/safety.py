"""The safety rules of admission (SPEC §2.2 steps 2-3): pure checks that raise `Denied` naming the fix.

Used by the validating phase on the final object, and by the mutating phase too, so a pod that can
never be admitted is told so before any rewrite. Nothing here reads pod labels: a pod's labels are its
author's, so none of them can exempt a pod from these rules.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from kube_vgpu.contract.config import Config, ResourceNames
from kube_vgpu.contract.names import PLACEMENT_ANNOTATIONS, SCHEDULER_OWNED_ANNOTATIONS
from kube_vgpu.contract.resources import PodRequest, RequestError, parse_pod
from kube_vgpu.webhook.admission.isolation import find_escape, grouped_containers

# Denial reasons (the `reason` label of the denials metric).
# A pod whose shape is not a Pod's (only a caller other than the API server sends one).
MALFORMED_OBJECT = "malformed-object"
MALFORMED_VALUE = "malformed-value"
INVALID_ANNOTATION = "invalid-annotation"
FORGED_ANNOTATION = "forged-annotation"
PRIVILEGED = "privileged"
BYPASSES_SCHEDULER = "bypasses-scheduler"
OTHER_SCHEDULER = "other-scheduler"
NO_MATCHING_GPU = "no-matching-gpu"
ISOLATION_ESCAPE = "isolation-escape"
QUOTA = "quota"
# A share-of-card pod in a memory-quota namespace whose GPUs nothing bounds.
UNBOUNDED_SHARE = "unbounded-share"
STALE_CACHE = "stale-cache"
# A pod over a work limit (selectors and affinity, or containers, volumes, mounts and env entries).
OVER_LIMIT = "over-limit"


class Denied(Exception):
    """A rule refused the pod; carries the metrics reason and the user's message."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


def read_pod(pod: Mapping[str, Any], names: ResourceNames) -> PodRequest:
    """The pod's GPU request, or a denial naming the value that cannot be read: refused, not
    skipped, since a pod whose limits cannot be read could not be charged or checked either."""
    try:
        return parse_pod(pod, names)
    except RequestError as exc:
        raise Denied(MALFORMED_VALUE, str(exc)) from None


def annotations_of(pod: Mapping[str, Any] | None) -> Mapping[str, str]:
    """A pod's annotations (empty when it has none)."""
    annotations = ((pod or {}).get("metadata") or {}).get("annotations") or {}
    # JSON gives a `dict`: a far cheaper check than the Mapping ABC, made for every review.
    return annotations if isinstance(annotations, dict) else {}


def check_create(pod: Mapping[str, Any], pod_request: PodRequest, config: Config) -> None:
    """Refuse a new vGPU pod that is placed by hand, forges an allocation, or escapes its limits."""
    node_name = (pod.get("spec") or {}).get("nodeName")
    if node_name:
        # Without the scheduler no GPU is chosen for the pod, and the node plugin would fail it
        # at Allocate with a less helpful UnexpectedAdmissionError.
        raise Denied(
            BYPASSES_SCHEDULER,
            f"spec.nodeName is set ({node_name}): a vGPU pod must be placed by the scheduler, which "
            "chooses its GPUs; use nodeSelector kubernetes.io/hostname instead",
        )
    annotations = annotations_of(pod)
    # One test in C for the common case (none of them); the ones present are listed, in order, only
    # for the denial.
    if not annotations.keys().isdisjoint(SCHEDULER_OWNED_ANNOTATIONS):
        forged = [key for key in SCHEDULER_OWNED_ANNOTATIONS if key in annotations]
        raise Denied(
            FORGED_ANNOTATION,
            f"annotation(s) {', '.join(forged)} are written by the scheduler when it places a pod; "
            "a new pod must not carry them: remove them",
        )
    check_containers(pod, config)


def check_containers(pod: Mapping[str, Any], config: Config) -> None:
    """Refuse a vGPU pod any of whose containers (init, app and ephemeral) is privileged, adds a
    capability that undoes the node plugin's mounts, or escapes its limits through env or volumes.

    The one check of a pod's containers: run at CREATE, and on `kubectl debug` (an UPDATE of
    `pods/ephemeralcontainers`), where the debug container joins the GPU pod on its node.
    """
    containers = grouped_containers(pod)
    if config.webhook.deny_privileged:
        # Every container of a vGPU pod: a privileged sidecar shares the pod with the GPU container
        # and can reach its mounts and every GPU of the node.
        for _, container in containers:
            security = container.get("securityContext")
            # Values come from JSON, so a mapping is a `dict` (a far cheaper check than the Mapping
            # ABC); nearly every container states no securityContext at all.
            if security and isinstance(security, dict):
                _check_security(container, security)
    escape = find_escape(pod, config, containers)
    if escape is not None:
        raise Denied(ISOLATION_ESCAPE, escape.message())


def _check_security(container: Mapping[str, Any], security: Mapping[str, Any]) -> None:
    name = str(container.get("name", "?"))
    capabilities = security.get("capabilities") or {}
    if security.get("privileged") is True:
        raise Denied(
            PRIVILEGED,
            f"container {name!r}: a privileged container in a vGPU pod sees every GPU and can "
            "escape the memory and core limits; remove securityContext.privileged",
        )
    added = (capabilities.get("add") or []) if isinstance(capabilities, dict) else []
    risky = sorted({str(c) for c in added if _strong_capability(c)})
    if risky:
        raise Denied(
            PRIVILEGED,
            f"container {name!r}: capabilities {', '.join(risky)} in a vGPU pod can unmount "
            "HAMi-core's preload and escape the limits; remove them from "
            "securityContext.capabilities.add",
        )


# Capabilities that undo the node plugin's bind mounts (mount/umount) or everything at once.
_STRONG_CAPABILITIES: Final = frozenset({"SYS_ADMIN", "ALL"})


def _strong_capability(value: object) -> bool:
    name = str(value).upper()
    return name.removeprefix("CAP_") in _STRONG_CAPABILITIES


def changed_annotations(
    old: Mapping[str, Any] | None, new: Mapping[str, Any] | None, keys: Iterable[str]
) -> list[str]:
    """Which of `keys` an update adds, changes or removes, in the order given."""
    before, after = annotations_of(old), annotations_of(new)
    return [key for key in keys if before.get(key) != after.get(key)]


def check_update(
    old: Mapping[str, Any] | None, new: Mapping[str, Any] | None, username: str, config: Config
) -> None:
    """Refuse an update of the scheduler-owned annotations by anyone but the configured writers, and
    of the mode and selector annotations, which decided the pod's placement and quota charge."""
    if username in config.webhook.annotation_writers:
        return
    placement = changed_annotations(old, new, PLACEMENT_ANNOTATIONS)
    if placement:
        raise Denied(
            FORGED_ANNOTATION,
            f"annotation(s) {', '.join(placement)} are fixed when the pod is created: they decided its "
            "node affinity and its quota charge; delete the pod and create it again to change them",
        )
    changed = changed_annotations(old, new, SCHEDULER_OWNED_ANNOTATIONS)
    if not changed:
        return
    raise Denied(
        FORGED_ANNOTATION,
        f"annotation(s) {', '.join(changed)} belong to the scheduler and the node plugin; "
        f"{username or 'an anonymous user'} may not add, change or remove them "
        "(leave them as they are; the writers are set in webhook.annotationWriters)",
    )
