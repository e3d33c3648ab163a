"""The validating decision for one pod CREATE or UPDATE: no I/O of its own, a verdict out.

Awaitable only because the quota step it calls last records a reservation through the API
(`kube_vgpu.webhook.quota.shared`); every rule here is plain computation on the request.

The API server calls this phase exactly once per write, after every mutation, with the final object:
name, uid and creationTimestamp filled in (the order of
k8s.io/apiserver's admission chain: mutating webhooks, then defaults and names, then validating ones). So
quota is decided
here, keyed by the pod's uid, and the safety rules judge what will really be stored. It never
patches. Pod labels exempt nothing; only a namespace label opts a namespace out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kube_vgpu.contract.config import Config
from kube_vgpu.contract.names import OPT_OUT_LABEL, OPT_OUT_VALUE
from kube_vgpu.contract.resources import PodRequest, RequestError, parse_pod
from kube_vgpu.webhook.admission.claim_use import ClaimLookup, ClaimUse, TemplateLookup, pod_claim_use
from kube_vgpu.webhook.admission.gates import (
    ClaimQuotaGate,
    ClaimQuotaRequest,
    QuotaGate,
    QuotaRequest,
    ValidationView,
)
from kube_vgpu.webhook.admission.review import ALLOWED, AdmissionRequest, Verdict
from kube_vgpu.webhook.admission.safety import (
    INVALID_ANNOTATION,
    MALFORMED_OBJECT,
    OVER_LIMIT,
    QUOTA,
    STALE_CACHE,
    Denied,
    check_containers,
    check_create,
    check_update,
    read_pod,
)
from kube_vgpu.webhook.placement.resolve import resolve_placement
from kube_vgpu.webhook.placement.selectors import SelectorError, parse_selectors
from kube_vgpu.webhook.quota.charge import parse_limits, states_no_cores
from kube_vgpu.webhook.quota.claims import ClaimError, admin_free, parse_claim

MISSING_UID = "missing-uid"
# The subresource `kubectl debug` writes to add an ephemeral container to a running pod.
EPHEMERAL_CONTAINERS = "ephemeralcontainers"
RESOURCE_GROUP = "resource.k8s.io"
# A pod whose container would use two requests of kube-vgpu's DRA classes (or a limited one beside
# an admin one).
DRA_CLAIMS = "dra-claims"


def _not_cached(namespace: str, name: str) -> None:
    return None


@dataclass(frozen=True)
class Validation:
    """The validating pipeline: safety on CREATE and UPDATE, quota on CREATE."""

    config: Config
    view: ValidationView
    quota: QuotaGate
    # The quota step for ResourceClaims of `config.webhook.dra_device_classes` (None: not judged).
    claims: ClaimQuotaGate | None = None
    # The cached ResourceClaims and ResourceClaimTemplates, by namespace and name (a pod naming one
    # the cache lacks is treated as using kube-vgpu's GPUs).
    claim_objects: ClaimLookup = field(default=_not_cached)
    template_objects: TemplateLookup = field(default=_not_cached)
    # The largest GPU a claim could get (None: the inventory's largest, from the view).
    largest_claim_gpu: Callable[[], int | None] | None = None

    async def review(self, request: AdmissionRequest) -> Verdict:
        """The verdict for one AdmissionReview request (already parsed and shape-checked)."""
        if (
            request.kind["group"] == RESOURCE_GROUP
            and request.kind["kind"] == "ResourceClaim"
            and request.operation == "CREATE"
            and not request.sub_resource
        ):
            return await self._claim(request)
        pod = request.object
        debug = request.operation == "UPDATE" and request.sub_resource == EPHEMERAL_CONTAINERS
        if pod is None or not (request.is_pod_create or request.is_pod_update or debug):
            return ALLOWED
        if request.over_limit:
            return Verdict(allowed=False, reason=OVER_LIMIT, message=request.over_limit)
        if request.object_error:
            # Only a caller other than the API server sends mistyped pods; no rule may meet one.
            return Verdict(
                allowed=False, reason=MALFORMED_OBJECT, message=f"malformed pod: {request.object_error}"
            )
        namespace = request.namespace or str((pod.get("metadata") or {}).get("namespace", ""))
        namespace_labels = self.view.namespace_labels(namespace)
        if (namespace_labels or {}).get(OPT_OUT_LABEL) == OPT_OUT_VALUE:
            return ALLOWED
        try:
            if debug:
                self._ephemeral(pod)
                return ALLOWED
            if request.is_pod_update:
                check_update(request.old_object, pod, request.username, self.config)
                return ALLOWED
            return await self._create(request, pod, namespace, namespace_labels)
        except Denied as denial:
            return Verdict(allowed=False, message=str(denial), reason=denial.reason)

    async def _create(
        self,
        request: AdmissionRequest,
        pod: Mapping[str, Any],
        namespace: str,
        namespace_labels: Mapping[str, str] | None,
    ) -> Verdict:
        pod_request = read_pod(pod, self.config.resource_names)
        dra = self._claim_use(pod, namespace)
        if not pod_request.asks_vgpu and not dra.uses:
            return ALLOWED
        if dra.problem is not None:
            raise Denied(DRA_CLAIMS, dra.problem)
        if not pod_request.asks_vgpu and not dra.limited:
            # Only adminAccess requests of kube-vgpu's classes: no HAMi-core limits anywhere in the
            # pod for the isolation rules to protect (`kube_vgpu.webhook.admission.claim_use`).
            return ALLOWED
        check_create(pod, pod_request, self.config)
        if not pod_request.asks_vgpu:
            # Its GPUs come from its claims, which were charged when they were created.
            return ALLOWED
        warnings = self._charge_warnings(pod_request, namespace, namespace_labels)
        # Booked whenever admitted, even under the name of a pod the cache holds: that pod may have
        # finished or be going, and the new one is then created. Where a live pod holds the name,
        # the API server refuses the create at the storage write, and the booking lapses as one for
        # a forged review does (`kube_vgpu.webhook.quota.shared.never_created`).
        refusal = await self._quota(request, pod_request, namespace, namespace_labels)
        if refusal is not None:
            raise Denied(QUOTA, refusal)
        return Verdict(allowed=True, warnings=tuple(warnings)) if warnings else ALLOWED

    def _claim_use(self, pod: Mapping[str, Any], namespace: str) -> ClaimUse:
        return pod_claim_use(
            pod,
            namespace,
            self.config.webhook.dra_device_classes,
            self.claim_objects,
            self.template_objects,
        )

    async def _claim(self, request: AdmissionRequest) -> Verdict:
        """A ResourceClaim CREATE: charged against its namespace's GPU quota when a request names one
        of kube-vgpu's DeviceClasses (`kube_vgpu.webhook.quota.claims`); any other claim passes."""
        classes = self.config.webhook.dra_device_classes
        claim = request.object
        if self.claims is None or not classes:
            return ALLOWED
        if claim is None:
            return Verdict(
                allowed=False,
                reason=MALFORMED_OBJECT,
                message="request.object is missing for a ResourceClaim CREATE",
            )
        meta = claim.get("metadata")
        meta = meta if isinstance(meta, Mapping) else {}
        namespace = request.namespace or str(meta.get("namespace", ""))
        namespace_labels = self.view.namespace_labels(namespace)
        if (namespace_labels or {}).get(OPT_OUT_LABEL) == OPT_OUT_VALUE:
            return ALLOWED
        name = meta.get("name") if isinstance(meta.get("name"), str) else None
        generate_name = meta.get("generateName") if isinstance(meta.get("generateName"), str) else None
        shown = str(name or f"{generate_name or ''}*")[:253]
        try:
            claim_request = parse_claim(claim, classes, admin_free=admin_free(namespace_labels))
        except ClaimError as exc:
            return Verdict(
                allowed=False, reason=MALFORMED_OBJECT, message=f"malformed ResourceClaim {shown}: {exc}"
            )
        if not claim_request.asks_vgpu:
            return ALLOWED
        uid = meta.get("uid")
        try:
            self._quota_preconditions(namespace, namespace_labels, uid, "ResourceClaim")
        except Denied as denial:
            return Verdict(allowed=False, message=str(denial), reason=denial.reason)
        if not isinstance(uid, str) or not uid:
            return ALLOWED
        refusal = await self.claims.admit_claim(
            ClaimQuotaRequest(
                namespace=namespace,
                namespace_labels=namespace_labels,
                claim_name=shown,
                request=claim_request,
                largest_gpu_mib=(
                    self.largest_claim_gpu()
                    if self.largest_claim_gpu is not None
                    else self.view.inventory.largest_memory_any()
                ),
                claim_uid=uid,
                dry_run=request.dry_run,
            )
        )
        if refusal is not None:
            return Verdict(allowed=False, message=refusal, reason=QUOTA)
        return ALLOWED

    def _quota_preconditions(
        self, namespace: str, namespace_labels: Mapping[str, str] | None, uid: object, what: str
    ) -> None:
        """Refuse a quota decision the cache cannot back (stale) or no uid could key; a namespace
        with no quota needs neither."""
        limits = parse_limits(namespace_labels or {})
        if (namespace_labels is None or limits.any or limits.invalid) and not self.view.fresh():
            raise Denied(
                STALE_CACHE,
                f"namespace {namespace}: the webhook has not heard from the API server within "
                f"{self.config.webhook.cache_staleness_seconds:.0f} s, so the namespace's GPU usage is "
                "not known and quota cannot be checked; retry once the API server is reachable",
            )
        if (not isinstance(uid, str) or not uid) and (limits.any or limits.invalid):
            raise Denied(
                MISSING_UID,
                "request.object.metadata.uid is missing: quota is decided on the stored object, which "
                f"the API server sends only to a validating webhook; register {what} CREATE on /validate "
                "in a ValidatingWebhookConfiguration",
            )

    def _ephemeral(self, pod: Mapping[str, Any]) -> None:
        """`kubectl debug` on a vGPU pod: the debug container joins the pod on its GPU node, so it
        gets every check a container gets at CREATE (privilege and capabilities included), through
        the same code. The pod-level rules of CREATE (nodeName, the scheduler's annotations) do not
        apply: a running pod has both, written by the scheduler."""
        try:
            asks_vgpu = parse_pod(pod, self.config.resource_names).asks_vgpu
        except RequestError:
            asks_vgpu = True  # stored pods were admitted; be strict with whatever this is
        namespace = str((pod.get("metadata") or {}).get("namespace", ""))
        if asks_vgpu or self._claim_use(pod, namespace).limited:
            check_containers(pod, self.config)

    async def _quota(
        self,
        request: AdmissionRequest,
        pod_request: PodRequest,
        namespace: str,
        namespace_labels: Mapping[str, str] | None,
    ) -> str | None:
        pod = request.pod or {}
        uid = (pod.get("metadata") or {}).get("uid")
        limits = parse_limits(namespace_labels or {})
        if (namespace_labels is None or limits.any or limits.invalid) and not self.view.fresh():
            raise Denied(
                STALE_CACHE,
                f"namespace {namespace}: the webhook has not heard from the API server within "
                f"{self.config.webhook.cache_staleness_seconds:.0f} s, so the namespace's GPU usage is "
                "not known and quota cannot be checked; retry once the API server is reachable",
            )
        if not isinstance(uid, str) or not uid:
            if not limits.any and not limits.invalid:
                return None  # nothing to enforce, and nothing to key a reservation by
            raise Denied(
                MISSING_UID,
                "request.object.metadata.uid is missing: quota is decided on the stored object, which "
                "the API server sends only to a validating webhook; register /validate in a "
                "ValidatingWebhookConfiguration",
            )
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        try:
            selectors = parse_selectors(annotations)
        except SelectorError as exc:
            raise Denied(INVALID_ANNOTATION, str(exc)) from None
        placement = resolve_placement(
            selectors, pod_request, self.view.inventory, self.config.webhook.default_mode
        )
        return await self.quota.admit(
            QuotaRequest(
                namespace=namespace,
                namespace_labels=namespace_labels,
                pod=pod,
                request=pod_request,
                largest_gpu_mib=placement.largest_gpu_mib,
                pod_uid=uid,
                dry_run=request.dry_run,
            )
        )

    def _charge_warnings(
        self, pod_request: PodRequest, namespace: str, namespace_labels: Mapping[str, str] | None
    ) -> list[str]:
        quota = parse_limits(namespace_labels or {}).cores is not None
        cores = self.config.resource_names.cores
        warnings = []
        for c in pod_request.containers:
            if c.vgpus > 0 and c.cores == 0:
                # An explicit 0 reads like "no cores"; it means the opposite, so it is always explained.
                charged = f", and is charged 100 per vGPU against namespace {namespace}'s vgpu-cores quota"
                warnings.append(
                    f"container {c.container!r}: {cores}: 0 means no SM limit: it may use every SM of its "
                    f"GPU(s){charged if quota else ''}; set 1-100 to limit it to that percent"
                )
            elif quota and states_no_cores(c):
                warnings.append(
                    f"container {c.container!r} states no {cores}: it runs with no SM limit, so it is "
                    f"charged 100 per vGPU against namespace {namespace}'s vgpu-cores quota; set {cores} "
                    "to charge less"
                )
        return warnings
