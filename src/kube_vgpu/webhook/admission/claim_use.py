"""Whether a pod uses kube-vgpu's GPUs through Dynamic Resource Allocation, and whether safely.

A pod names claims in `spec.resourceClaims[]` (`resourceClaimName`, or `resourceClaimTemplateName`
from which Kubernetes' claim controller makes one), and its containers pick them in
`resources.claims[]` (`name`, optionally one `request`). A pod whose claim or template names one of
kube-vgpu's DeviceClasses runs under HAMi-core limits like a vGPU pod, so it gets every isolation
rule a vGPU pod gets. A claim or template the webhook's cache does not show (created a moment ago,
or not yet seen) might be one of ours: the pod is treated as using kube-vgpu's GPUs, which only
applies rules a well-behaved pod passes.

A container may use at most one request of kube-vgpu's classes: each prepared request carries its
own HAMi-core limits (`CUDA_DEVICE_MEMORY_LIMIT_0`, `CUDA_DEVICE_SM_LIMIT`, ...) in its CDI device,
and two CDI devices in one container would overwrite each other's variables.

Pure: the cache is read through the two lookups handed in.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from kube_vgpu.webhook.quota.claims import MAX_REQUESTS, ClaimError, names_class, parse_claim
from kube_vgpu.webhook.records import ClaimRecord, TemplateRecord

# (namespace, name) -> the cached object, or None when the cache does not show it.
ClaimLookup = Callable[[str, str], "ClaimRecord | None"]
TemplateLookup = Callable[[str, str], "TemplateRecord | None"]
# Bounded work per review: a pod naming more claims than this is refused (no workload needs more).
MAX_POD_CLAIMS: Final = 128


@dataclass(frozen=True)
class ClaimUse:
    """What a pod's claims say: whether it uses kube-vgpu's GPUs, and the refusal when unsafely."""

    uses: bool = False
    problem: str | None = None


NONE: Final = ClaimUse()


def _claim_spec(
    namespace: str, entry: Mapping[str, Any], claims: ClaimLookup, templates: TemplateLookup
) -> ClaimRecord | Literal[False] | None:
    """The ResourceClaim (or template's claim) an entry of spec.resourceClaims names; None when the
    cache does not show it; `False` when the entry names neither."""
    claim_name = entry.get("resourceClaimName")
    if isinstance(claim_name, str) and claim_name:
        return claims(namespace, claim_name)
    template_name = entry.get("resourceClaimTemplateName")
    if isinstance(template_name, str) and template_name:
        template = templates(namespace, template_name)
        if template is None:
            return None
        spec = template.get("spec")
        inner = spec.get("spec") if isinstance(spec, Mapping) else None
        return {"spec": inner} if inner is not None else {}
    return False


def pod_claim_use(
    pod: Mapping[str, Any],
    namespace: str,
    classes: Collection[str],
    claims: ClaimLookup,
    templates: TemplateLookup,
) -> ClaimUse:
    """Whether `pod` uses a claim of `classes` (unknown claims count), and the refusal when one
    of its containers would use more than one request of those classes."""
    spec = pod.get("spec")
    if not classes or not isinstance(spec, Mapping):
        return NONE
    entries = spec.get("resourceClaims")
    if not isinstance(entries, list) or not entries:
        return NONE
    if len(entries) > MAX_POD_CLAIMS:
        return ClaimUse(True, f"spec.resourceClaims has {len(entries)} entries; at most {MAX_POD_CLAIMS}")
    uses = False
    # Per pod-level claim name: the names of its requests of our classes (None: not known).
    ours: dict[str, frozenset[str] | None] = {}
    for entry in entries:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
            continue
        found = _claim_spec(namespace, entry, claims, templates)
        if found is False:
            continue
        if found is None:
            uses = True  # not shown yet: might be ours
            ours[entry["name"]] = None
            continue
        if not names_class(found, classes):
            continue
        uses = True
        try:
            requests = parse_claim(found, classes).requests
        except ClaimError:
            ours[entry["name"]] = None
            continue
        ours[entry["name"]] = frozenset(r.name for r in requests[:MAX_REQUESTS])
    if not uses:
        return NONE
    return ClaimUse(True, _container_problem(spec, ours))


def _container_problem(spec: Mapping[str, Any], ours: Mapping[str, frozenset[str] | None]) -> str | None:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for container in spec.get(key) or ():
            if not isinstance(container, Mapping):
                continue
            resources = container.get("resources")
            refs = resources.get("claims") if isinstance(resources, Mapping) else None
            if not isinstance(refs, list):
                continue
            used: list[str] = []
            for ref in refs[:MAX_POD_CLAIMS]:
                if not isinstance(ref, Mapping):
                    continue
                claim = ref.get("name")
                requests = ours.get(claim) if isinstance(claim, str) else None
                if requests is None:
                    continue
                request = ref.get("request")
                if isinstance(request, str) and request:
                    # `req` or `req/sub`: the request of the claim it belongs to.
                    if request.split("/", 1)[0] in requests:
                        used.append(f"{claim}/{request}")
                else:
                    used.extend(f"{claim}/{r}" for r in sorted(requests))
            if len(used) > 1:
                return (
                    f"container {key}[{container.get('name', '?')}] uses {len(used)} requests of kube-vgpu's "
                    f"DRA classes ({', '.join(used)}): each carries its own HAMi-core limits "
                    "(CUDA_DEVICE_MEMORY_LIMIT_0, CUDA_DEVICE_SM_LIMIT), which would overwrite each other "
                    "in one container; ask for several GPUs with one request's count instead"
                )
    return None
