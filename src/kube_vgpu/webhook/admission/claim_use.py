"""Whether a pod uses kube-vgpu's GPUs through Dynamic Resource Allocation, and whether safely.

A pod names claims in `spec.resourceClaims[]` (`resourceClaimName`, or `resourceClaimTemplateName`
from which Kubernetes' claim controller makes one), and its containers pick them in
`resources.claims[]` (`name`, optionally one `request`). A pod whose claim or template names one of
kube-vgpu's DeviceClasses runs under HAMi-core limits like a vGPU pod, so it gets every isolation
rule a vGPU pod gets. A claim or template the webhook's cache does not show (created a moment ago,
or not yet seen) might be one of ours: the pod is treated as using kube-vgpu's GPUs, which only
applies rules a well-behaved pod passes.

A container may use at most one request of kube-vgpu's classes that carries limits: each prepared
request carries its own HAMi-core limits (`CUDA_DEVICE_MEMORY_LIMIT_0`, `CUDA_DEVICE_SM_LIMIT`, ...)
in its CDI device, and two CDI devices in one container would overwrite each other's variables.
Nor may it use such a request beside an `adminAccess` request of kube-vgpu's classes: the admin
request's GPU has no limits of its own, the container would see both GPUs, and the limits,
indexed by the order in which it sees its GPUs, could land on the admin GPU and leave the slice's
GPU unlimited. Admin requests alone (one or several) carry no limits to overwrite.

A pod whose every request of kube-vgpu's classes is an `adminAccess` one (a DCGM exporter, an
`nvidia-smi` monitor: they need privileges) runs under no HAMi-core limits at all, so the isolation
rules, which protect those limits, do not apply to it (`ClaimUse.limited` is false). As soon as one
claim of the pod has a request that carries limits (or one claim cannot be read or is not in the
cache yet), every container of the pod gets the rules: a privileged container beside a limited one
could reach its processes (shareProcessNamespace), its mounts and every GPU of the node.

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
    """What a pod's claims say: whether it uses kube-vgpu's GPUs, whether under HAMi-core limits
    (any of its requests of kube-vgpu's classes is not an admin one, or might not be), and the
    refusal when unsafely."""

    uses: bool = False
    problem: str | None = None
    limited: bool = False


@dataclass(frozen=True)
class _Requests:
    """The requests of kube-vgpu's classes of one claim, by whether they carry limits."""

    limited: frozenset[str]
    admin: frozenset[str]


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
        return ClaimUse(
            True, f"spec.resourceClaims has {len(entries)} entries; at most {MAX_POD_CLAIMS}", True
        )
    uses = False
    limited = False
    # Per pod-level claim name: its requests of our classes (None: not known).
    ours: dict[str, _Requests | None] = {}
    for entry in entries:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
            continue
        found = _claim_spec(namespace, entry, claims, templates)
        if found is False:
            continue
        if found is None:
            uses = limited = True  # not shown yet: might be ours, with limits
            ours[entry["name"]] = None
            continue
        if not names_class(found, classes):
            continue
        uses = True
        try:
            # admin_free: the admin requests are listed apart (no charge is computed here).
            parsed = parse_claim(found, classes, admin_free=True)
        except ClaimError:
            limited = True
            ours[entry["name"]] = None
            continue
        requests = _Requests(
            frozenset(r.name for r in parsed.requests[:MAX_REQUESTS]), frozenset(parsed.admin[:MAX_REQUESTS])
        )
        limited = limited or bool(requests.limited)
        ours[entry["name"]] = requests
    if not uses:
        return NONE
    return ClaimUse(True, _container_problem(spec, ours), limited)


def _container_problem(spec: Mapping[str, Any], ours: Mapping[str, _Requests | None]) -> str | None:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for container in spec.get(key) or ():
            if not isinstance(container, Mapping):
                continue
            resources = container.get("resources")
            refs = resources.get("claims") if isinstance(resources, Mapping) else None
            if not isinstance(refs, list):
                continue
            used: list[str] = []
            admin: list[str] = []
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
                    parent = request.split("/", 1)[0]
                    if parent in requests.limited:
                        used.append(f"{claim}/{request}")
                    elif parent in requests.admin:
                        admin.append(f"{claim}/{request}")
                else:
                    used.extend(f"{claim}/{r}" for r in sorted(requests.limited))
                    admin.extend(f"{claim}/{r}" for r in sorted(requests.admin))
            where = f"container {key}[{container.get('name', '?')}]"
            if len(used) > 1:
                return (
                    f"{where} uses {len(used)} requests of kube-vgpu's "
                    f"DRA classes ({', '.join(used)}): each carries its own HAMi-core limits "
                    "(CUDA_DEVICE_MEMORY_LIMIT_0, CUDA_DEVICE_SM_LIMIT), which would overwrite each other "
                    "in one container; ask for several GPUs with one request's count instead"
                )
            if used and admin:
                return (
                    f"{where} uses the adminAccess request(s) {', '.join(admin)} beside the request "
                    f"{used[0]} of kube-vgpu's DRA classes: the admin GPU has no HAMi-core limits, and "
                    f"{used[0]}'s limits, indexed by the order in which the container sees its GPUs, "
                    "could land on the admin GPU and leave the slice's GPU unlimited; put the admin "
                    "request in a container of its own (name the claim's request in each container's "
                    "resources.claims[].request)"
                )
    return None
