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
from contract.models import gputype_item, gputype_items, token_matches_model
from contract.names import (
    HOSTNAME_LABEL,
    MODE_LABEL,
    MODEL_LABEL_PREFIX,
    NOUSE_GPUTYPE,
    OPT_OUT_LABEL,
    OPT_OUT_VALUE,
    SCHEDULER_OWNED_ANNOTATIONS,
    USE_GPUTYPE,
    UUID_LABEL_PREFIX,
    VGPU_MODE,
    Mode,
)
from contract.resources import PodRequest, RequestError, iter_containers, parse_pod
from webhook import affinity
from webhook.fit import never_fits
from webhook.gates import ClusterView, QuotaGate
from webhook.inventory import GpuFilter, Inventory
from webhook.review import AdmissionRequest, Verdict, make_patch
from webhook.selectors import (
    AFFINITY_MARKER,
    ORIGINAL_NOUSE_GPUTYPE,
    ORIGINAL_USE_GPUTYPE,
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
QUOTA = "quota"


class Denied(Exception):
    """A rule refused the pod; carries the metrics reason and the user's message."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


@dataclass(frozen=True)
class Placement:
    """Where a pod may go, resolved against the inventory."""

    mode: Mode
    filter: GpuFilter
    allowed_models: frozenset[str] | None
    alternatives: list[list[affinity.Requirement]]
    largest_gpu_mib: int | None
    matches_nothing: bool


def _uuid_alternatives(wanted: frozenset[str], allowed: frozenset[str] | None, inv: Inventory) -> list[str]:
    keep = []
    for uuid in sorted(wanted):
        gpu = inv.gpu(uuid)
        # A known GPU of a model the type selectors refuse can never be chosen: no term for it.
        if gpu is None or allowed is None or gpu.model in allowed:
            keep.append(uuid)
    return keep


def resolve_placement(sel: Selectors, request: PodRequest, inv: Inventory, default_mode: Mode) -> Placement:
    """Resolve selectors and mode against the inventory into node requirements (SPEC §2 steps 2-3)."""
    allowed: frozenset[str] | None = None
    if sel.by_type:
        allowed = frozenset(
            model
            for model in inv.models()
            if (sel.use_types is None or any(token_matches_model(t, model) for t in sel.use_types))
            and not any(token_matches_model(t, model) for t in sel.nouse_types or ())
        )
    excluded = frozenset(sel.nouse_uuids or ())
    uuids = None if sel.use_uuids is None else frozenset(sel.use_uuids) - excluded
    memory = max((c.memory_mib or 0 for c in request.containers), default=0)
    by_selectors = GpuFilter(models=allowed, uuids=uuids, excluded=excluded)
    fits = GpuFilter(models=allowed, uuids=uuids, excluded=excluded, min_memory_mib=memory)
    mode: Mode
    if sel.mode is not None:
        mode = sel.mode
    else:
        offered = inv.offered_modes(fits)
        mode = next(iter(offered)) if len(offered) == 1 else default_mode
    selector_terms: list[affinity.Requirement] = []
    if uuids is not None:
        selector_terms = [
            affinity.exists(UUID_LABEL_PREFIX + u) for u in _uuid_alternatives(uuids, allowed, inv)
        ]
    elif allowed:
        selector_terms = [affinity.exists(MODEL_LABEL_PREFIX + m) for m in sorted(allowed)]
    common: list[affinity.Requirement] = [affinity.one_of(MODE_LABEL, [mode])]
    shared_tail: list[affinity.Requirement] = []
    hosts = inv.fully_excluded_hostnames(excluded)
    if hosts:
        shared_tail.append(affinity.none_of(HOSTNAME_LABEL, hosts))
    alternatives = [[*common, term, *shared_tail] for term in selector_terms] or [[*common, *shared_tail]]
    return Placement(
        mode=mode,
        filter=fits,
        allowed_models=allowed,
        alternatives=alternatives,
        largest_gpu_mib=inv.largest_memory(by_selectors, mode),
        matches_nothing=sel.any and not inv.any_gpu(by_selectors),
    )


def _exact_refusal(allowed: frozenset[str], known: frozenset[str]) -> list[str] | None:
    """`nouse-gputype` items refusing exactly the TYPEs not allowed, or None when none exist."""
    refused = [gputype_item(type_field) for type_field in sorted(known - allowed)]
    if not refused or any(item.lower() in t.lower() for item in refused for t in allowed):
        return None
    return refused


def _describe(sel: Selectors) -> str:
    parts = []
    for name, items in (
        ("use-gputype", sel.use_types),
        ("nouse-gputype", sel.nouse_types),
        ("use-gpuuuid", sel.use_uuids),
        ("nouse-gpuuuid", sel.nouse_uuids),
    ):
        if items is not None:
            parts.append(f"{name}={','.join(items)}")
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

        after: dict[str, Any] = copy.deepcopy(dict(pod))
        self._default_number(after, pod_request)
        self._set_scheduler(after)
        placement = resolve_placement(
            selectors, pod_request, self.view.inventory, self.config.webhook.default_mode
        )
        warnings = never_fits(pod_request, self.view.inventory.nodes.values())
        if placement.matches_nothing:
            message = f"GPU selectors match no GPU in the cluster: {_describe(selectors)}"
            if self.config.webhook.strict_selectors:
                raise Denied(NO_MATCHING_GPU, message)
            warnings.append(f"{message}; the pod stays pending until such a GPU joins")
        new_annotations = dict(canonical)
        new_annotations[VGPU_MODE] = placement.mode
        warnings += self._rewrite_gputype(new_annotations, selectors, placement)
        previous = affinity.decode_marker(annotations.get(AFFINITY_MARKER))
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

    def _rewrite_gputype(
        self, annotations: dict[str, str], sel: Selectors, placement: Placement
    ) -> list[str]:
        """Write `use-gputype` as items Volcano's substring rule reads exactly; keep the user's words."""
        if not sel.by_type or not placement.allowed_models:
            return []  # nothing matches: the user's words stay as written, to be resolved when GPUs join
        inv = self.view.inventory
        allowed_types = inv.types_of(placement.allowed_models)
        if not allowed_types:
            return [
                f"no node registers a GPU TYPE for {', '.join(sorted(placement.allowed_models))} yet; "
                f"{USE_GPUTYPE} is left as written"
            ]
        known = inv.types()
        items = gputype_items(allowed_types, known)
        annotations.pop(ORIGINAL_USE_GPUTYPE, None)
        annotations.pop(ORIGINAL_NOUSE_GPUTYPE, None)
        if sel.use_types_text is not None:
            annotations[ORIGINAL_USE_GPUTYPE] = sel.use_types_text
        if sel.nouse_types_text is not None:
            annotations[ORIGINAL_NOUSE_GPUTYPE] = sel.nouse_types_text
        refused = _exact_refusal(allowed_types, known) if items.inexact else None
        if refused is not None:
            # Reference-form TYPEs can be substrings of each other (NVIDIA-NVIDIA A10 in ...A100...);
            # naming the refused TYPEs is then exact where naming the allowed ones is not.
            annotations[NOUSE_GPUTYPE] = ",".join(refused)
            annotations.pop(USE_GPUTYPE, None)
            return []
        annotations[USE_GPUTYPE] = ",".join(items.items)
        annotations.pop(NOUSE_GPUTYPE, None)  # Volcano ignores it once use-gputype is present
        if items.inexact:
            return [
                f"GPU TYPE(s) {', '.join(items.inexact)} are registered in the reference plugin's form; "
                "Volcano may also place the pod on a GPU whose TYPE contains them"
            ]
        return []
