"""ResourceClaim CREATE through the validating pipeline (parsed from AdmissionReview JSON, decided by
the production quota path over an in-memory store), and pods that use kube-vgpu's DRA claims."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

from kube_vgpu.contract.config import Config, WebhookConfig
from kube_vgpu.contract.dra import DEVICE_CLASS
from kube_vgpu.contract.names import QUOTA_MEMORY_LABEL
from kube_vgpu.webhook.admission.review import Verdict, parse_review
from kube_vgpu.webhook.admission.validation import DRA_CLAIMS, Validation
from kube_vgpu.webhook.placement.inventory import Inventory
from kube_vgpu.webhook.quota.charge import Charge
from kube_vgpu.webhook.quota.claims import ADMIN_ACCESS_LABEL
from kube_vgpu.webhook.quota.gate import NamespaceQuota
from kube_vgpu.webhook.records import ClaimRecord, TemplateRecord
from tests.support.admission_view import StaticView
from tests.support.memory_store import MemoryStore
from tests.support.records import as_claim, as_template
from tests.support.webhook import A100, H100, container, gpu_node, pod, review
from tests.support.webhook_quota import Clocks, close, make_gate

CLASSES = (DEVICE_CLASS,)
CONFIG = Config(webhook=WebhookConfig(dra_device_classes=CLASSES))
QUOTA_NS = {
    "team-a": {QUOTA_MEMORY_LABEL: str(60 * 1024)},
    "gpu-ops": {QUOTA_MEMORY_LABEL: str(60 * 1024), ADMIN_ACCESS_LABEL: "true"},
    "free": {},
}
OTHER = "gpu.nvidia.com"


def claim(
    *requests: Mapping[str, Any],
    name: str = "c",
    namespace: str = "team-a",
    uid: str | None = "claim-uid-1",
    **meta: Any,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, **meta}
    if uid is not None:
        metadata["uid"] = uid
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": metadata,
        "spec": {"devices": {"requests": list(requests)}},
    }


def gpu(
    name: str = "gpu", memory: str | None = "20Gi", cls: str = DEVICE_CLASS, **more: Any
) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": cls, **more}
    if memory is not None:
        exactly["capacity"] = {"requests": {"memory": memory, "cores": "30"}}
    return {"name": name, "exactly": exactly}


def claim_review(obj: Mapping[str, Any], *, dry_run: bool = False) -> bytes:
    doc = review(obj, kind="ResourceClaim", dry_run=dry_run)
    doc["request"]["kind"] = {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"}
    doc["request"]["resource"] = {"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaims"}
    return json.dumps(doc).encode()


class Pipeline:
    """The validating phase over a real quota gate; claims and templates the cache 'shows'."""

    def __init__(
        self, *, config: Config = CONFIG, fresh: bool = True, gate: NamespaceQuota | None = None
    ) -> None:
        inventory = Inventory()
        inventory.upsert(gpu_node("mixed", "hami-core", [(A100, 40960), (H100, 81920)]))
        self.gate = gate or make_gate(
            Clocks(),
            store=MemoryStore(),
            claim_classes=frozenset(CLASSES),
            largest_gpu=inventory.largest_memory_any,
        )
        self.claims: dict[str, Mapping[str, Any]] = {}
        self.templates: dict[str, Mapping[str, Any]] = {}
        self.validation = Validation(
            config,
            StaticView(inventory, QUOTA_NS, is_fresh=fresh),
            self.gate,
            self.gate,
            claim_objects=self.claim_record,
            template_objects=self.template_record,
        )

    def claim_record(self, namespace: str, name: str) -> ClaimRecord | None:
        found = self.claims.get(f"{namespace}/{name}")
        return None if found is None else as_claim(found)

    def template_record(self, namespace: str, name: str) -> TemplateRecord | None:
        found = self.templates.get(f"{namespace}/{name}")
        return None if found is None else as_template(found)

    def run(self, *bodies: bytes) -> list[Verdict]:
        async def go() -> list[Verdict]:
            try:
                return [await self.validation.review(parse_review(b)) for b in bodies]
            finally:
                await close(self.gate)

        return asyncio.run(go())


def test_claims_are_charged_until_the_label_and_refused_past_it() -> None:
    p = Pipeline()
    first, second, third = p.run(
        claim_review(claim(gpu(memory="40Gi"), uid="u1", name="first")),
        claim_review(claim(gpu(memory="30Gi"), uid="u2", name="second")),
        claim_review(claim(gpu(memory="20Gi"), uid="u3", name="third")),
    )
    assert first.allowed and third.allowed
    assert not second.allowed and second.reason == "quota"
    assert second.message.startswith("ResourceClaim second: namespace team-a: vgpu-memory quota exceeded")
    assert "requested 30720 MiB, in use 40960 MiB of 61440 MiB" in second.message


def test_a_claim_naming_no_memory_is_charged_the_largest_gpu_of_the_inventory() -> None:
    (verdict,) = Pipeline().run(claim_review(claim(gpu(memory=None))))
    assert not verdict.allowed
    assert "requested 81920 MiB, in use 0 MiB of 61440 MiB" in verdict.message
    assert "names no memory, so it gets a whole GPU: 81920 MiB per device" in verdict.message


def test_dry_run_books_nothing() -> None:
    p = Pipeline()
    verdicts = p.run(
        *(claim_review(claim(gpu(memory="40Gi"), uid=f"d{i}"), dry_run=True) for i in range(3)),
        claim_review(claim(gpu(memory="60Gi"), uid="real")),
    )
    assert all(v.allowed for v in verdicts)
    assert p.gate.reserved("team-a") == Charge(1, 60 * 1024, 30)


def test_a_claim_made_from_a_template_is_charged_like_any_other() -> None:
    """Kubernetes' claim controller (pkg/controller/resourceclaim/controller.go) creates the claim of
    a pod's template through the API: generateName `<pod>-<claim>-`, the pod as owner, the
    `resource.kubernetes.io/pod-claim-name` annotation; the webhook sees an ordinary CREATE."""
    made = claim(
        gpu(memory="50Gi"),
        name="trainer-gpu-x7k2q",
        uid="from-template",
        generateName="trainer-gpu-",
        annotations={"resource.kubernetes.io/pod-claim-name": "gpu"},
        ownerReferences=[
            {"apiVersion": "v1", "kind": "Pod", "name": "trainer", "uid": "pod-1", "controller": True}
        ],
    )
    p = Pipeline()
    admitted, refused = p.run(claim_review(made), claim_review(claim(gpu(memory="20Gi"), uid="u2")))
    assert admitted.allowed
    assert p.gate.reserved("team-a").memory_mib == 50 * 1024
    assert not refused.allowed and "in use 51200 MiB of 61440 MiB" in refused.message


def test_an_admin_access_claim_books_nothing_and_the_quota_stays_whole() -> None:
    """A monitoring claim with adminAccess (the API server admits it only in a namespace labelled
    resource.kubernetes.io/admin-access) is admitted past the memory label and books nothing; the
    namespace's full quota is still there for its workloads, and the next claim past it is refused."""
    p = Pipeline()
    ops = {"namespace": "gpu-ops"}
    monitor, every, work, over = p.run(
        claim_review(claim(gpu(memory=None, adminAccess=True), uid="m", name="monitor", **ops)),
        claim_review(
            claim(gpu(memory=None, adminAccess=True, allocationMode="All"), uid="e", name="every", **ops)
        ),
        claim_review(claim(gpu(memory="60Gi"), uid="w", name="work", **ops)),
        claim_review(claim(gpu(memory="1Gi"), uid="o", name="over", **ops)),
    )
    assert monitor.allowed and every.allowed and work.allowed
    assert p.gate.reserved("gpu-ops") == Charge(1, 60 * 1024, 30)
    assert not over.allowed and "in use 61440 MiB of 61440 MiB" in over.message


def test_an_admin_access_claim_is_charged_where_the_cache_shows_no_admin_label() -> None:
    """Defence in depth: in a namespace the webhook's cache shows without
    resource.kubernetes.io/admin-access=true (the API server should have refused the claim), an
    admin request is charged like any other: past the quota it is refused, within it it is booked."""
    p = Pipeline()
    whole, every, small = p.run(
        claim_review(claim(gpu(memory=None, adminAccess=True), uid="m", name="monitor")),
        claim_review(claim(gpu(memory=None, adminAccess=True, allocationMode="All"), uid="e", name="every")),
        claim_review(claim(gpu(memory="20Gi", adminAccess=True), uid="s", name="small")),
    )
    assert not whole.allowed and whole.reason == "quota"
    assert "requested 81920 MiB, in use 0 MiB of 61440 MiB" in whole.message
    assert not every.allowed and "allocationMode All" in every.message
    assert small.allowed
    assert p.gate.reserved("team-a") == Charge(1, 20 * 1024, 30)


def test_other_classes_and_quota_free_namespaces_pass() -> None:
    p = Pipeline()
    theirs, free, unconfigured = p.run(
        claim_review(claim(gpu(memory="999Gi", cls=OTHER), uid="t")),
        claim_review(claim(gpu(memory="999Gi"), namespace="free", uid="f")),
        claim_review(claim(gpu(name="bad", memory="-1Gi", cls=OTHER), uid="o")),
    )
    assert theirs.allowed and free.allowed
    # A malformed request is refused whatever its class: the claim is read as a whole.
    assert not unconfigured.allowed
    assert p.gate.reserved("team-a") == Charge() and p.gate.reserved("free") == Charge()
    # With no DRA classes configured the webhook judges no claim at all.
    (off,) = Pipeline(config=Config()).run(claim_review(claim(gpu(memory="-1Gi"))))
    assert off.allowed


def test_hostile_claims_get_one_clear_denial() -> None:
    p = Pipeline()
    verdicts = p.run(
        claim_review(claim(gpu(memory="-1Gi"), uid="a")),
        claim_review(claim(gpu(memory="0.5"), uid="b")),
        claim_review(claim(*(gpu(name=f"r{i}") for i in range(1000)), uid="c")),
        claim_review(claim(gpu(memory="1e30"), uid="d")),
        claim_review({"apiVersion": "resource.k8s.io/v1", "metadata": {"name": "x", "namespace": "team-a"}}),
        claim_review(claim(gpu(count=True), uid="e")),
    )
    negative, fraction, many, absurd, no_spec, boolean = verdicts
    assert not negative.allowed and negative.reason == "malformed-object"
    assert negative.message == (
        "malformed ResourceClaim c: spec.devices.requests[0] ('gpu').exactly.capacity.requests.memory "
        "'-1Gi' is negative"
    )
    assert fraction.allowed  # half a byte: rounded up to the 256 MiB minimum, and charged so
    assert not many.allowed and "has 1000 requests; Kubernetes allows 32" in many.message
    assert not absurd.allowed and "more memory than any GPU has" in absurd.message
    assert not no_spec.allowed and "spec must be an object" in no_spec.message
    assert not boolean.allowed and "count must be a positive integer" in boolean.message
    assert p.gate.reserved("team-a") == Charge(1, 256, 30)


def test_stale_cache_and_missing_uid_are_refused_in_a_quota_namespace() -> None:
    (stale,) = Pipeline(fresh=False).run(claim_review(claim(gpu())))
    assert not stale.allowed and stale.reason == "stale-cache"
    (no_uid,) = Pipeline().run(claim_review(claim(gpu(), uid=None)))
    assert not no_uid.allowed and "register ResourceClaim CREATE on /validate" in no_uid.message


# -- pods that use claims ----------------------------------------------------------------------------


def claim_pod(
    *entries: Mapping[str, Any],
    refs: list[dict[str, Any]] | None = None,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    c = container()
    c["resources"] = {"claims": refs if refs is not None else [{"name": e["name"]} for e in entries]}
    if env:
        c["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return pod(c, namespace="team-a", resourceClaims=list(entries))


def pod_review(obj: Mapping[str, Any]) -> bytes:
    body = json.loads(json.dumps(obj))
    body["metadata"]["uid"] = "pod-uid"
    return json.dumps(review(body)).encode()


ESCAPE = {"CUDA_DEVICE_MEMORY_LIMIT_0": "80g"}


def test_a_pod_using_a_kube_vgpu_claim_gets_the_isolation_rules() -> None:
    p = Pipeline()
    p.claims["team-a/mine"] = claim(gpu(), name="mine")
    p.claims["team-a/theirs"] = {
        "metadata": {"name": "theirs", "namespace": "team-a"}
    }  # as the cache keeps it
    p.templates["team-a/slice"] = {"metadata": {"name": "slice"}, "spec": {"spec": claim(gpu())["spec"]}}
    mine, theirs, template, unknown, clean = p.run(
        pod_review(claim_pod({"name": "g", "resourceClaimName": "mine"}, env=ESCAPE)),
        pod_review(claim_pod({"name": "g", "resourceClaimName": "theirs"}, env=ESCAPE)),
        pod_review(claim_pod({"name": "g", "resourceClaimTemplateName": "slice"}, env=ESCAPE)),
        pod_review(claim_pod({"name": "g", "resourceClaimName": "not-seen-yet"}, env=ESCAPE)),
        pod_review(claim_pod({"name": "g", "resourceClaimName": "mine"})),
    )
    for denied in (mine, template, unknown):
        assert not denied.allowed and denied.reason == "isolation-escape", denied
        assert "CUDA_DEVICE_MEMORY_LIMIT_0" in denied.message
    assert theirs.allowed
    assert clean.allowed
    # The pod is not charged again: only the claim is.
    assert p.gate.reserved("team-a") == Charge()


def test_a_privileged_container_in_a_claim_pod_is_refused() -> None:
    p = Pipeline()
    p.claims["team-a/mine"] = claim(gpu(), name="mine")
    obj = claim_pod({"name": "g", "resourceClaimName": "mine"})
    obj["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    (verdict,) = p.run(pod_review(obj))
    assert not verdict.allowed and verdict.reason == "privileged"


def test_a_container_may_use_one_kube_vgpu_request_only() -> None:
    p = Pipeline()
    p.claims["team-a/two"] = claim(gpu("a"), gpu("b"), gpu("nic", cls=OTHER), name="two")
    p.claims["team-a/one"] = claim(gpu("x"), name="one")
    whole, picked, across, with_nic = p.run(
        pod_review(claim_pod({"name": "g", "resourceClaimName": "two"})),
        pod_review(
            claim_pod({"name": "g", "resourceClaimName": "two"}, refs=[{"name": "g", "request": "a"}])
        ),
        pod_review(
            claim_pod(
                {"name": "g", "resourceClaimName": "two"},
                {"name": "h", "resourceClaimName": "one"},
                refs=[{"name": "g", "request": "b"}, {"name": "h"}],
            )
        ),
        pod_review(
            claim_pod(
                {"name": "g", "resourceClaimName": "two"},
                refs=[{"name": "g", "request": "a"}, {"name": "g", "request": "nic"}],
            )
        ),
    )
    assert not whole.allowed and whole.reason == DRA_CLAIMS
    assert "uses 2 requests of kube-vgpu's DRA classes (g/a, g/b)" in whole.message
    assert "one request's count" in whole.message
    assert picked.allowed
    assert not across.allowed and "(g/b, h/x)" in across.message
    assert with_nic.allowed


# -- adminAccess requests in pods ---------------------------------------------------------------------


def admin(name: str = "monitor", **more: Any) -> dict[str, Any]:
    return gpu(name, memory="256Mi", adminAccess=True, **more)


def two_containers(
    entries: list[dict[str, Any]],
    first: list[dict[str, Any]],
    second: list[dict[str, Any]],
    security: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A pod of two containers using `first` and `second`; the first one with `security`."""
    a, b = container("tool"), container("work")
    a["resources"] = {"claims": first}
    b["resources"] = {"claims": second}
    if security is not None:
        a["securityContext"] = dict(security)
    return pod(a, b, namespace="gpu-ops", resourceClaims=entries)


def debug_review(obj: Mapping[str, Any], security: Mapping[str, Any]) -> bytes:
    """`kubectl debug` on the running `obj`: an UPDATE of pods/ephemeralcontainers."""
    old = json.loads(json.dumps(obj))
    old["metadata"]["uid"] = "pod-uid"
    new = json.loads(json.dumps(old))
    new["spec"]["ephemeralContainers"] = [{"name": "debug", "image": "busybox", "securityContext": security}]
    doc = review(new, operation="UPDATE")
    doc["request"]["oldObject"] = old
    doc["request"]["subResource"] = "ephemeralcontainers"
    return json.dumps(doc).encode()


def test_a_container_may_not_use_an_admin_request_beside_a_slice() -> None:
    """A container that sees an admin GPU (no limits) and a slice's GPU would get the slice's
    HAMi-core limits indexed by the order in which it sees its GPUs: refused, whichever way the
    two requests are named; each in a container of its own passes, and so do admin requests alone."""
    p = Pipeline()
    p.claims["gpu-ops/mixed"] = claim(admin("a"), gpu("b"), name="mixed", namespace="gpu-ops")
    p.claims["gpu-ops/watch"] = claim(admin("w"), name="watch", namespace="gpu-ops")
    p.claims["gpu-ops/watch2"] = claim(admin("v"), admin("u"), name="watch2", namespace="gpu-ops")
    p.claims["gpu-ops/share"] = claim(gpu("s"), name="share", namespace="gpu-ops")
    mixed = {"name": "m", "resourceClaimName": "mixed"}
    watch = {"name": "w", "resourceClaimName": "watch"}
    watch2 = {"name": "v", "resourceClaimName": "watch2"}
    share = {"name": "s", "resourceClaimName": "share"}
    whole, named, across, apart, admins = p.run(
        pod_review(two_containers([mixed], [{"name": "m"}], [])),
        pod_review(
            two_containers([mixed], [{"name": "m", "request": "a"}, {"name": "m", "request": "b"}], [])
        ),
        pod_review(two_containers([watch, share], [{"name": "w"}, {"name": "s"}], [])),
        pod_review(two_containers([mixed], [{"name": "m", "request": "a"}], [{"name": "m", "request": "b"}])),
        pod_review(two_containers([watch, watch2], [{"name": "w"}, {"name": "v"}], [])),
    )
    for denied in (whole, named, across):
        assert not denied.allowed and denied.reason == DRA_CLAIMS, denied
        assert "put the admin request in a container of its own" in denied.message
    assert whole.message.startswith(
        "container containers[tool] uses the adminAccess request(s) m/a beside the request m/b"
    )
    assert "w/w beside the request s/s" in across.message
    assert apart.allowed and admins.allowed


PRIVILEGED = {"privileged": True}
SYS_ADMIN = {"capabilities": {"add": ["SYS_ADMIN"]}}


def test_a_pod_using_only_admin_requests_is_exempt_from_the_isolation_rules() -> None:
    """A DCGM exporter or an nvidia-smi monitor needs privileges, and its admin GPU carries no
    HAMi-core limits for the rules to protect: a privileged or SYS_ADMIN container passes, and so
    does `kubectl debug` on such a pod."""
    p = Pipeline()
    p.claims["gpu-ops/watch"] = claim(admin(), name="watch", namespace="gpu-ops")
    p.templates["gpu-ops/every"] = {
        "metadata": {"name": "every"},
        "spec": {"spec": claim(admin(allocationMode="All"))["spec"]},
    }
    watch = {"name": "w", "resourceClaimName": "watch"}
    every = {"name": "e", "resourceClaimTemplateName": "every"}
    monitor = two_containers([watch], [{"name": "w"}], [], PRIVILEGED)
    verdicts = p.run(
        pod_review(monitor),
        pod_review(two_containers([watch], [{"name": "w"}], [], SYS_ADMIN)),
        pod_review(two_containers([every], [{"name": "e"}], [], PRIVILEGED)),
        pod_review(two_containers([watch], [{"name": "w"}], [{"name": "w"}], PRIVILEGED)),
        debug_review(monitor, PRIVILEGED),
    )
    assert all(v.allowed for v in verdicts), verdicts


def test_a_privileged_container_beside_a_limited_one_is_refused_pod_wide() -> None:
    """As soon as one request of the pod carries limits (or a claim may: not in the cache yet, or
    unreadable), every container gets the rules, the admin one's too: a privileged sibling could
    reach the limited container's processes, mounts and every GPU of the node."""
    p = Pipeline()
    p.claims["gpu-ops/watch"] = claim(admin(), name="watch", namespace="gpu-ops")
    p.claims["gpu-ops/mixed"] = claim(admin("a"), gpu("b"), name="mixed", namespace="gpu-ops")
    p.claims["gpu-ops/share"] = claim(gpu("s"), name="share", namespace="gpu-ops")
    p.claims["gpu-ops/bad"] = claim(gpu("x", memory="-1Gi"), name="bad", namespace="gpu-ops")
    watch = {"name": "w", "resourceClaimName": "watch"}
    mixed = {"name": "m", "resourceClaimName": "mixed"}
    share = {"name": "s", "resourceClaimName": "share"}
    unseen = {"name": "u", "resourceClaimName": "not-seen-yet"}
    bad = {"name": "x", "resourceClaimName": "bad"}
    beside_share, same_claim, unseen_claim, bad_claim, unused_share, via_sys_admin = p.run(
        pod_review(two_containers([watch, share], [{"name": "w"}], [{"name": "s"}], PRIVILEGED)),
        pod_review(
            two_containers(
                [mixed], [{"name": "m", "request": "a"}], [{"name": "m", "request": "b"}], PRIVILEGED
            )
        ),
        pod_review(two_containers([watch, unseen], [{"name": "w"}], [{"name": "u"}], PRIVILEGED)),
        pod_review(two_containers([watch, bad], [{"name": "w"}], [{"name": "x"}], PRIVILEGED)),
        pod_review(two_containers([watch, share], [{"name": "w"}], [], PRIVILEGED)),
        pod_review(two_containers([watch, share], [{"name": "w"}], [{"name": "s"}], SYS_ADMIN)),
    )
    for denied in (beside_share, same_claim, unseen_claim, bad_claim, unused_share):
        assert not denied.allowed and denied.reason == "privileged", denied
    assert not via_sys_admin.allowed and "SYS_ADMIN" in via_sys_admin.message
    (debugged,) = p.run(
        debug_review(two_containers([watch, share], [{"name": "w"}], [{"name": "s"}]), PRIVILEGED)
    )
    assert not debugged.allowed and debugged.reason == "privileged"
    # Admin requests only, but a vGPU asked in the limits (a Volcano share): the rules apply.
    with_vgpu = two_containers([watch], [{"name": "w"}], [], PRIVILEGED)
    with_vgpu["spec"]["containers"][1]["resources"]["limits"] = container(number=1)["resources"]["limits"]
    (vgpu,) = p.run(pod_review(with_vgpu))
    assert not vgpu.allowed and vgpu.reason == "privileged"
