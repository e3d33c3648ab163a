"""The mutating decision for one pod CREATE (SPEC §2.1): pure, no I/O, the pod before in and a verdict out.

The pod is only read: each rule writes the JSONPatch operation for the field it sets
(`webhook.patch`), and writes nothing when the pod already holds that value, so a second admission
of the output is an empty patch; property tests keep the patch equal in effect to the diff of the
pod before and after. The order of the rules is the SPEC's: malformed values and safety first (a denial
names what to fix), then defaults, scheduler, mode and selectors. Quota is not here: this phase may
be called twice for one pod and sees no name or uid for a `generateName` pod, so quota is decided
once, on the final object, by the validating phase (`webhook.validation`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from kube_vgpu.contract.config import Config
from kube_vgpu.contract.names import (
    CHARGED_GPU_MEMORY,
    HAMI_CORE,
    OPT_OUT_LABEL,
    OPT_OUT_VALUE,
    VGPU_MODE,
)
from kube_vgpu.contract.resources import PodRequest
from kube_vgpu.webhook.admission.bounds import WorkBounds
from kube_vgpu.webhook.admission.gates import ClusterView
from kube_vgpu.webhook.admission.patch import PatchBuilder, pointer
from kube_vgpu.webhook.admission.review import ALLOWED, AdmissionRequest, Verdict
from kube_vgpu.webhook.admission.safety import (
    INVALID_ANNOTATION,
    MALFORMED_OBJECT,
    NO_MATCHING_GPU,
    OTHER_SCHEDULER,
    OVER_LIMIT,
    UNBOUNDED_SHARE,
    Denied,
    check_create,
    read_pod,
)
from kube_vgpu.webhook.placement import affinity
from kube_vgpu.webhook.placement.fit import never_fits_in
from kube_vgpu.webhook.placement.limits import LimitExceeded, Limits, check_affinity, check_selectors
from kube_vgpu.webhook.placement.resolve import (
    Placement,
    clip,
    pending_warning,
    resolve_placement,
    rewrite_gputype,
)
from kube_vgpu.webhook.placement.selectors import (
    AFFINITY_MARKER,
    SelectorError,
    Selectors,
    canonical_annotations,
    parse_selectors,
)
from kube_vgpu.webhook.quota.charge import needs_gpu_size, parse_limits

DEFAULT_SCHEDULER = "default-scheduler"


__all__ = ["Admission", "Denied", "Placement", "resolve_placement"]


def _indexed_containers(pod: Mapping[str, Any]) -> Iterator[tuple[tuple[str | int, ...], Mapping[str, Any]]]:
    """(path, container) for the containers `iter_containers` yields, in its order."""
    spec = pod.get("spec") or {}
    for key in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(key) or []):
            if isinstance(container, dict):
                yield ("spec", key, index), container


# The pointers to a pod's annotations and spec, built once for the members written under them.
_ANNOTATIONS_AT = pointer("metadata", "annotations")
_SPEC_AT = pointer("spec")


def _set_annotations(pod: Mapping[str, Any], annotations: Mapping[str, str], patch: PatchBuilder) -> None:
    """Make the pod's annotations `annotations`, one key at a time (a reader sees what changed)."""
    metadata = pod.get("metadata")
    if not isinstance(metadata, dict):
        patch.set(pod, ("metadata",), {"annotations": annotations})
        return
    current = metadata.get("annotations")
    if not isinstance(current, dict):
        patch.set(metadata, ("metadata", "annotations"), annotations)
        return
    for key in current:
        if key not in annotations:
            patch.remove(current, ("metadata", "annotations", key))
    patch.set_members(current, _ANNOTATIONS_AT, annotations)


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
    """The mutating pipeline with its configuration and cluster view."""

    config: Config
    view: ClusterView

    @functools.cached_property
    def bounds(self) -> WorkBounds:
        """The per-review work limits the HTTP edge parses reviews with (`review.parse_review`)."""
        return WorkBounds.of(self.config.webhook)

    @functools.cached_property
    def _limits(self) -> Limits:
        """The work limits, read from the configuration once rather than per review."""
        return Limits.of(self.config.webhook)

    def review(self, request: AdmissionRequest) -> Verdict:
        """The verdict for one AdmissionReview request (already parsed and shape-checked)."""
        if not request.is_pod_create or request.object is None:
            return ALLOWED
        if request.over_limit:
            return Verdict(allowed=False, reason=OVER_LIMIT, message=request.over_limit)
        if request.object_error:
            # Only a caller other than the API server sends mistyped pods; no rule may meet one.
            return Verdict(
                allowed=False, reason=MALFORMED_OBJECT, message=f"malformed pod: {request.object_error}"
            )
        pod = request.object
        namespace = request.namespace or str((pod.get("metadata") or {}).get("namespace", ""))
        # Only the namespace can opt out: a pod's labels are written by its author (SPEC §1).
        namespace_labels = self.view.namespace_labels(namespace) or {}
        if namespace_labels.get(OPT_OUT_LABEL) == OPT_OUT_VALUE:
            return ALLOWED
        try:
            return self._mutate(pod, namespace, namespace_labels)
        except Denied as denial:
            return Verdict(allowed=False, message=str(denial), reason=denial.reason)

    def _mutate(self, pod: Mapping[str, Any], namespace: str, namespace_labels: Mapping[str, str]) -> Verdict:
        pod_request = read_pod(pod, self.config.resource_names)
        if not pod_request.asks_vgpu:
            return ALLOWED
        annotations: Mapping[str, str] = (pod.get("metadata") or {}).get("annotations") or {}
        check_create(pod, pod_request, self.config)
        try:
            selectors = parse_selectors(annotations)
            canonical = canonical_annotations(annotations)
        except SelectorError as exc:
            raise Denied(INVALID_ANNOTATION, str(exc)) from None
        limits = self._limits
        try:
            check_selectors(selectors, limits)
        except LimitExceeded as exc:
            raise Denied(OVER_LIMIT, str(exc)) from None

        patch = PatchBuilder()
        self._default_resources(pod, pod_request, patch)
        self._set_scheduler(pod, patch)
        placement = resolve_placement(
            selectors, pod_request, self.view.inventory, self.config.webhook.default_mode
        )
        previous = affinity.decode_marker(annotations.get(AFFINITY_MARKER))
        own_terms = affinity.own_terms(pod, previous)
        try:
            check_affinity(own_terms, placement.alternatives, limits)
        except LimitExceeded as exc:
            raise Denied(OVER_LIMIT, str(exc)) from None
        warnings = never_fits_in(pod_request, self.view.inventory)
        if placement.matches_nothing:
            message = f"GPU selectors match no GPU in the cluster: {_describe(selectors)}"
            if self.config.webhook.strict_selectors:
                raise Denied(NO_MATCHING_GPU, message)
            warnings.append(pending_warning(message, placement, selectors))
        new_annotations = canonical  # a new dict already: the pod's own are left as they are
        new_annotations[VGPU_MODE] = placement.mode
        warnings += rewrite_gputype(new_annotations, selectors, placement, self.view.inventory)
        spec: Mapping[str, Any] = pod["spec"]  # a vGPU pod has containers, so it has a spec
        new_affinity = affinity.required_with(pod, own_terms, placement.alternatives, previous)
        if new_affinity is None:
            patch.remove(spec, ("spec", "affinity"))
        else:
            patch.set_member(spec, _SPEC_AT, "affinity", new_affinity)
        if placement.marker:
            new_annotations[AFFINITY_MARKER] = placement.marker
        else:
            new_annotations.pop(AFFINITY_MARKER, None)
        # Whatever the author wrote here is replaced: the node plugin trusts this figure.
        charged = self._charged_gpu_memory(pod_request, selectors, placement, namespace, namespace_labels)
        if charged is None:
            new_annotations.pop(CHARGED_GPU_MEMORY, None)
        else:
            new_annotations[CHARGED_GPU_MEMORY] = str(charged)
        _set_annotations(pod, new_annotations, patch)

        return Verdict(allowed=True, patch=patch.operations, warnings=tuple(warnings))

    def _charged_gpu_memory(
        self,
        pod_request: PodRequest,
        selectors: Selectors,
        placement: Placement,
        namespace: str,
        namespace_labels: Mapping[str, str],
    ) -> int | None:
        """The MiB of the GPU a share-of-card pod's memory is charged on, to record; None when the
        charge does not depend on the GPU (or is not charged).

        Quota sizes a container asking a percentage of a GPU's memory, or none (the whole card), on
        the largest GPU it could get today. Only a `use-gputype` or UUID selector keeps it off a
        larger GPU that joins later: the node affinity follows them, and so does Volcano's choice of
        each GPU on a node (`checkType` and `checkGPUtype` in Volcano's
        pkg/scheduler/api/devices/nvidia/vgpu/utils.go test every GPU's TYPE against
        `nvidia.com/use-gputype`). Without one, in a namespace with a memory quota, the pod is
        refused with how to ask; a `nouse-` selector only excludes, so it bounds nothing.
        The node plugin refuses a booking on a GPU larger than the recorded figure.
        """
        if placement.mode != HAMI_CORE or parse_limits(namespace_labels).memory_mib is None:
            return None
        shares = [c.container for c in pod_request.containers if needs_gpu_size(c)]
        if not shares:
            return None
        if selectors.use_types is None and selectors.use_uuids is None:
            names = self.config.resource_names
            raise Denied(
                UNBOUNDED_SHARE,
                f"namespace {namespace} has a GPU memory quota and container {shares[0]!r} asks for a share "
                f"of a GPU's memory ({names.memory_percentage}, or no {names.memory}: the whole card), "
                "which is charged on the largest GPU known now and could be placed on a larger one "
                f"that joins later: state the memory in MiB ({names.memory}), or choose the GPU models "
                "with the annotation nvidia.com/use-gputype (or volcano.sh/vgpu-use-gpuuuid)",
            )
        return placement.largest_gpu_mib

    def _default_resources(
        self, pod: Mapping[str, Any], pod_request: PodRequest, patch: PatchBuilder
    ) -> None:
        """Defaults for a vGPU container's limits and requests (SPEC §2.1 step 0 and §2.2 step 1).

        Step 0: a container asking only memory/percentage/cores gets `vgpu-number: 1`. Step 1: with
        `defaultCores` set, one stating no cores gets that limit; without it HAMi-core runs the
        container with no SM limit, and quota charges it a whole GPU.
        """
        names = self.config.resource_names
        cores = self.config.webhook.default_cores
        if not any(
            c.asks_vgpu and (c.number is None or (cores != 0 and c.cores is None))
            for c in pod_request.containers
        ):
            return  # every vGPU container states what the defaults would add (nearly every pod)
        for (path, container), parsed in zip(_indexed_containers(pod), pod_request.containers, strict=True):
            if not parsed.asks_vgpu:
                continue
            defaults = {}
            if parsed.number is None:
                defaults[names.count] = "1"
            if cores != 0 and parsed.cores is None:
                defaults[names.cores] = str(cores)
            if not defaults:
                continue
            resources = container.get("resources")
            if not isinstance(resources, dict):
                patch.set(
                    container, (*path, "resources"), {"limits": dict(defaults), "requests": dict(defaults)}
                )
                continue
            for part in ("limits", "requests"):
                amounts = resources.get(part)
                if not isinstance(amounts, dict):
                    patch.set(resources, (*path, "resources", part), dict(defaults))
                    continue
                for name, value in defaults.items():
                    patch.set(amounts, (*path, "resources", part, name), value)

    def _set_scheduler(self, pod: Mapping[str, Any], patch: PatchBuilder) -> None:
        """SPEC §2.1 step 1."""
        spec: Mapping[str, Any] = pod["spec"]
        ours = self.config.webhook.scheduler_name
        current = spec.get("schedulerName") or ""
        if current in ("", DEFAULT_SCHEDULER):
            patch.set_member(spec, _SPEC_AT, "schedulerName", ours)
        elif current != ours and self.config.webhook.other_schedulers == "deny":
            raise Denied(
                OTHER_SCHEDULER,
                f"spec.schedulerName={current!r}: vGPU pods must be scheduled by {ours!r} "
                "(leave schedulerName empty to get it)",
            )
