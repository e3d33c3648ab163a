"""The admission decision for one pod CREATE (SPEC §2): pure, no I/O, the pod before in and a verdict out.

The pod is copied, every rule edits the copy, and the JSONPatch is the diff of the two documents,
so a rule that changes nothing adds nothing to the patch and a second admission of the output is
an empty patch. The order of the rules is the SPEC's: validation and safety first (a denial names
what to fix), then defaults, scheduler, mode, selectors, and quota last, in `Admission._quota`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from contract.config import Config
from contract.names import (
    OPT_OUT_LABEL,
    OPT_OUT_VALUE,
    SCHEDULER_OWNED_ANNOTATIONS,
    VGPU_MODE,
)
from contract.resources import PodRequest, RequestError, iter_containers, parse_pod
from webhook import affinity
from webhook.gates import ClusterView, QuotaGate
from webhook.limits import LimitExceeded, Limits, check_affinity, check_selectors
from webhook.placement import Placement, clip, pending_warning, resolve_placement, rewrite_gputype
from webhook.review import AdmissionRequest, Verdict, make_patch
from webhook.selectors import (
    AFFINITY_MARKER,
    SelectorError,
    Selectors,
    canonical_annotations,
    parse_selectors,
)

DEFAULT_SCHEDULER = "default-scheduler"

# Denial reasons (the `reason` label of the denials metric).
MALFORMED_VALUE = "malformed-value"
INVALID_ANNOTATION = "invalid-annotation"
FORGED_ANNOTATION = "forged-annotation"
PRIVILEGED = "privileged"
BYPASSES_SCHEDULER = "bypasses-scheduler"
OTHER_SCHEDULER = "other-scheduler"
NO_MATCHING_GPU = "no-matching-gpu"
OVER_LIMIT = "over-limit"
QUOTA = "quota"

__all__ = ["Admission", "Denied", "Placement", "resolve_placement"]


class Denied(Exception):
    """A rule refused the pod; carries the metrics reason and the user's message."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


def _describe(sel: Selectors) -> str:
    parts = []
    for name, items in (
        ("use-gputype", sel.use_types),
        ("nouse-gputype", sel.nouse_types),
        ("use-gpuuuid", sel.use_uuids),
        ("nouse-gpuuuid", sel.nouse_uuids),
    ):
        if items is not None:
            parts.append(f"{name}={clip(','.join(items))}")
    return " ".join(parts)


@dataclass(frozen=True)
class Admission:
    """The decision pipeline with its configuration, cluster view and quota step."""

    config: Config
    view: ClusterView
    quota: QuotaGate

    def review(self, request: AdmissionRequest) -> Verdict:
        """The verdict for one AdmissionReview request (already parsed and shape-checked)."""
        if not request.is_pod_create or request.object is None:
            return Verdict(allowed=True)
        pod = request.object
        namespace = request.namespace or str((pod.get("metadata") or {}).get("namespace", ""))
        labels = (pod.get("metadata") or {}).get("labels") or {}
        namespace_labels = self.view.namespace_labels(namespace) or {}
        if OPT_OUT_VALUE in (labels.get(OPT_OUT_LABEL), namespace_labels.get(OPT_OUT_LABEL)):
            return Verdict(allowed=True)
        try:
            return self._mutate(request, pod, namespace, namespace_labels)
        except Denied as denial:
            return Verdict(allowed=False, message=str(denial), reason=denial.reason)

    def _mutate(
        self,
        request: AdmissionRequest,
        pod: Mapping[str, Any],
        namespace: str,
        namespace_labels: Mapping[str, str],
    ) -> Verdict:
        try:
            pod_request = parse_pod(pod, self.config.resource_names)
        except RequestError as exc:
            raise Denied(MALFORMED_VALUE, str(exc)) from None
        if not pod_request.asks_vgpu:
            return Verdict(allowed=True)
        annotations: Mapping[str, str] = (pod.get("metadata") or {}).get("annotations") or {}
        self._check_safety(pod, pod_request, annotations)
        try:
            selectors = parse_selectors(annotations)
            canonical = canonical_annotations(annotations)
        except SelectorError as exc:
            raise Denied(INVALID_ANNOTATION, str(exc)) from None
        limits = Limits.of(self.config.webhook)
        try:
            check_selectors(selectors, limits)
        except LimitExceeded as exc:
            raise Denied(OVER_LIMIT, str(exc)) from None

        after: dict[str, Any] = copy.deepcopy(dict(pod))
        self._default_number(after, pod_request)
        self._set_scheduler(after)
        placement = resolve_placement(
            selectors, pod_request, self.view.inventory, self.config.webhook.default_mode
        )
        previous = affinity.decode_marker(annotations.get(AFFINITY_MARKER))
        try:
            check_affinity(affinity.own_terms(after, previous), placement.alternatives, limits)
        except LimitExceeded as exc:
            raise Denied(OVER_LIMIT, str(exc)) from None
        warnings: list[str] = []
        if placement.matches_nothing:
            message = f"GPU selectors match no GPU in the cluster: {_describe(selectors)}"
            if self.config.webhook.strict_selectors:
                raise Denied(NO_MATCHING_GPU, message)
            warnings.append(pending_warning(message, placement, selectors))
        new_annotations = dict(canonical)
        new_annotations[VGPU_MODE] = placement.mode
        warnings += rewrite_gputype(new_annotations, selectors, placement, self.view.inventory)
        affinity.apply_required(after, placement.alternatives, previous)
        added = [r for alt in placement.alternatives for r in alt]
        if added:
            new_annotations[AFFINITY_MARKER] = affinity.encode_marker(added)
        else:
            new_annotations.pop(AFFINITY_MARKER, None)
        after.setdefault("metadata", {})["annotations"] = new_annotations

        refusal = self._quota(
            request=request,
            namespace=namespace,
            namespace_labels=namespace_labels,
            pod=after,
            pod_request=pod_request,
            placement=placement,
        )
        if refusal is not None:
            raise Denied(QUOTA, refusal)
        return Verdict(allowed=True, patch=make_patch(pod, after), warnings=tuple(warnings))

    def _quota(
        self,
        *,
        request: AdmissionRequest,
        namespace: str,
        namespace_labels: Mapping[str, str],
        pod: Mapping[str, Any],
        pod_request: PodRequest,
        placement: Placement,
    ) -> str | None:
        """SPEC §2 step 4: the one place the quota step is called."""
        return self.quota.admit(
            namespace=namespace,
            namespace_labels=namespace_labels,
            pod=pod,
            request=pod_request,
            largest_gpu_mib=placement.largest_gpu_mib,
            review_uid=request.uid,
            dry_run=request.dry_run,
        )

    def _check_safety(
        self, pod: Mapping[str, Any], pod_request: PodRequest, annotations: Mapping[str, str]
    ) -> None:
        """SPEC §2 step 5: forged allocations, pods placed by hand, and privileged vGPU containers."""
        node_name = (pod.get("spec") or {}).get("nodeName")
        if node_name:
            # Without the scheduler no GPU is chosen for the pod, and the node plugin would fail it
            # at Allocate with a less helpful UnexpectedAdmissionError.
            raise Denied(
                BYPASSES_SCHEDULER,
                f"spec.nodeName is set ({node_name}): a vGPU pod must be placed by the scheduler, which "
                "chooses its GPUs; use nodeSelector kubernetes.io/hostname instead",
            )
        forged = [key for key in SCHEDULER_OWNED_ANNOTATIONS if key in annotations]
        if forged:
            raise Denied(
                FORGED_ANNOTATION,
                f"annotation(s) {', '.join(forged)} are written by the scheduler when it places a pod; "
                "a new pod must not carry them",
            )
        if not self.config.webhook.deny_privileged:
            return
        for (container, _), parsed in zip(iter_containers(pod), pod_request.containers, strict=True):
            security = container.get("securityContext") or {}
            if parsed.asks_vgpu and security.get("privileged") is True:
                raise Denied(
                    PRIVILEGED,
                    f"container {parsed.container!r}: privileged containers cannot use a vGPU "
                    "(they see every GPU and escape the memory and core limits)",
                )

    def _default_number(self, pod: dict[str, Any], pod_request: PodRequest) -> None:
        """SPEC §2 step 0: a container asking only memory/percentage/cores gets `vgpu-number: 1`."""
        count = self.config.resource_names.count
        for (container, _), parsed in zip(iter_containers(pod), pod_request.containers, strict=True):
            if not parsed.asks_vgpu or parsed.number is not None:
                continue
            assert isinstance(container, dict)  # the copy is made of plain dicts
            resources = container.setdefault("resources", {})
            for part in ("limits", "requests"):
                amounts = resources.get(part)
                if not isinstance(amounts, dict):
                    amounts = resources[part] = {}
                amounts[count] = "1"

    def _set_scheduler(self, pod: dict[str, Any]) -> None:
        """SPEC §2 step 1."""
        spec = pod.setdefault("spec", {})
        ours = self.config.webhook.scheduler_name
        current = spec.get("schedulerName") or ""
        if current in ("", DEFAULT_SCHEDULER):
            spec["schedulerName"] = ours
        elif current != ours and self.config.webhook.other_schedulers == "deny":
            raise Denied(
                OTHER_SCHEDULER,
                f"spec.schedulerName={current!r}: vGPU pods must be scheduled by {ours!r} "
                "(leave schedulerName empty to get it)",
            )
