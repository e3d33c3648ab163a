"""The pure validating pipeline (`webhook.validation`): what reaches the quota step, and when not."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from kube_vgpu.contract.config import Config, WebhookConfig
from kube_vgpu.contract.names import BIND_PHASE, USE_GPUTYPE, VGPU_MODE, VGPU_NODE
from kube_vgpu.webhook.admission.gates import QuotaRequest
from kube_vgpu.webhook.admission.review import Verdict, parse_review
from kube_vgpu.webhook.admission.validation import Validation
from kube_vgpu.webhook.placement.inventory import Inventory
from tests.support.admission_view import StaticView
from tests.support.webhook import A10, A100, H100, container, gpu_node, pod, review

NODES = (
    gpu_node("mixed", "hami-core", [(A10, 24576), (A100, 40960)]),
    gpu_node("h100", "mig", [(H100, 81920)]),
)
LIMITED = {"default": {"quota.kube-vgpu.io/vgpu-memory": "100000"}}


@dataclasses.dataclass
class RecordingQuota:
    answer: str | None = None
    calls: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    async def admit(self, ask: QuotaRequest) -> str | None:
        self.calls.append(
            {"largest": ask.largest_gpu_mib, "uid": ask.pod_uid, "dry_run": ask.dry_run, "ns": ask.namespace}
        )
        return self.answer


def validate(
    obj: Mapping[str, Any],
    *,
    quota: RecordingQuota | None = None,
    namespaces: Mapping[str, Mapping[str, str]] | None = LIMITED,
    operation: str = "CREATE",
    old: Mapping[str, Any] | None = None,
    username: str = "alice",
    dry_run: bool = False,
    fresh: bool = True,
    config: Config | None = None,
) -> Verdict:
    inventory = Inventory()
    for node in NODES:
        inventory.upsert(node)
    view = StaticView(inventory, namespaces, is_fresh=fresh)
    doc = review(obj, operation=operation, dry_run=dry_run)
    doc["request"]["oldObject"] = old
    doc["request"]["userInfo"] = {"username": username}
    validation = Validation(config or Config(), view, quota or RecordingQuota())
    return asyncio.run(validation.review(parse_review(json.dumps(doc).encode())))


def final(obj: dict[str, Any], uid: str = "uid-1") -> dict[str, Any]:
    obj["metadata"]["uid"] = uid
    return obj


def test_quota_is_asked_with_the_pod_uid_and_the_largest_gpu_it_may_land_on() -> None:
    quota = RecordingQuota()
    obj = final(pod(container(percent=50), annotations={USE_GPUTYPE: "A100,A10", VGPU_MODE: "hami-core"}))
    assert validate(obj, quota=quota).allowed
    assert quota.calls == [{"largest": 40960, "uid": "uid-1", "dry_run": False, "ns": "default"}]
    mig = RecordingQuota()
    validate(final(pod(container(percent=50), annotations={VGPU_MODE: "mig"})), quota=mig, dry_run=True)
    assert mig.calls[0]["largest"] == 81920 and mig.calls[0]["dry_run"] is True


def test_a_quota_refusal_is_a_denial_with_its_message() -> None:
    verdict = validate(final(pod(container(memory=10))), quota=RecordingQuota("namespace default: over"))
    assert not verdict.allowed and verdict.reason == "quota" and verdict.message == "namespace default: over"
    assert verdict.patch == ()


def test_quota_is_not_asked_for_pods_without_vgpu_or_after_earlier_denials() -> None:
    quota = RecordingQuota()
    assert validate(final(pod(container("cpu"))), quota=quota).allowed
    forged = final(pod(container(memory=10), annotations={VGPU_NODE: "n"}))
    assert validate(forged, quota=quota).reason == "forged-annotation"
    assert quota.calls == []


def test_a_create_is_booked_unless_it_is_a_dry_run() -> None:
    quota = RecordingQuota()
    obj = final(pod(container(memory=10), name="taken"))
    assert validate(obj, quota=quota).allowed
    assert validate(obj, quota=quota, dry_run=True).allowed
    assert [call["dry_run"] for call in quota.calls] == [False, True]
    refusing = RecordingQuota("namespace default: over")
    assert not validate(obj, quota=refusing).allowed


def test_a_stale_view_refuses_only_where_quota_applies_or_is_unknown() -> None:
    obj = final(pod(container(memory=10)))
    assert validate(obj, fresh=False).reason == "stale-cache"
    assert validate(obj, fresh=False, namespaces={}).reason == "stale-cache"  # namespace not known
    assert validate(obj, fresh=False, namespaces={"default": {}}).allowed


def test_an_opted_out_namespace_is_not_validated_but_a_labelled_pod_is() -> None:
    forged = final(pod(container(memory=10), annotations={VGPU_NODE: "n"}))
    assert validate(forged, namespaces={"default": {"kube-vgpu.io/webhook": "ignore"}}).allowed
    forged["metadata"]["labels"] = {"kube-vgpu.io/webhook": "ignore"}
    assert not validate(forged).allowed


def test_update_rules_compare_old_and_new_annotations() -> None:
    old = final(pod(container(memory=10), annotations={BIND_PHASE: "allocating"}))
    new = final(pod(container(memory=10), annotations={BIND_PHASE: "success"}))
    assert validate(new, operation="UPDATE", old=old).reason == "forged-annotation"
    writer = "system:serviceaccount:volcano-system:volcano-scheduler"
    assert validate(new, operation="UPDATE", old=old, username=writer).allowed
    # Without oldObject every scheduler annotation on the object counts as added.
    assert not validate(new, operation="UPDATE", old=None, username="alice").allowed
    # Other writers are configurable; the default is then no longer one.
    config = Config(webhook=WebhookConfig(annotation_writers=("ops",)))
    assert validate(new, operation="UPDATE", old=old, username="ops", config=config).allowed
    assert not validate(new, operation="UPDATE", old=old, username=writer, config=config).allowed


def test_no_cores_in_a_cores_quota_namespace_warns() -> None:
    namespaces = {"default": {"quota.kube-vgpu.io/vgpu-cores": "400"}}
    verdict = validate(
        final(pod(container(memory=10), container("b", memory=5, cores=20))), namespaces=namespaces
    )
    assert verdict.allowed and len(verdict.warnings) == 1 and "'main'" in verdict.warnings[0]
    assert not validate(final(pod(container(memory=10)))).warnings  # no cores quota: nothing to say


def test_cores_zero_is_explained_with_or_without_a_cores_quota() -> None:
    # `vgpu-cores: 0` reads like "no cores" and means no SM limit: the answer says so every time.
    plain = validate(final(pod(container(memory=10, cores=0))))
    assert plain.allowed and len(plain.warnings) == 1
    assert "'main': volcano.sh/vgpu-cores: 0 means no SM limit" in plain.warnings[0]
    assert "quota" not in plain.warnings[0]
    quota = {"default": {"quota.kube-vgpu.io/vgpu-cores": "400"}}
    charged = validate(final(pod(container(memory=10, cores=0))), namespaces=quota)
    assert len(charged.warnings) == 1 and "charged 100 per vGPU" in charged.warnings[0]
    # 1, the smallest limit, is a limit: nothing to explain.
    assert not validate(final(pod(container(memory=10, cores=1)))).warnings


def test_a_debug_update_of_any_kind_is_shape_checked_and_bounded_before_its_containers_are() -> None:
    # Attack (a review sent straight to the port): `pods/ephemeralcontainers` with request.kind
    # `EphemeralContainers` (the kind before Kubernetes 1.23) was judged as `kubectl debug` by
    # /validate, but parse_review shape-checked and bounded only kind `Pod`, so a mistyped container
    # raised TypeError (a 500 with a traceback) and a huge one skipped the work bounds.
    mistyped = pod(container("c", number=1))
    mistyped["spec"]["containers"][0]["securityContext"] = {"capabilities": {"add": 5}}
    huge = pod(*(container(f"c{i}", number=1) for i in range(WebhookConfig().max_containers + 1)))
    for obj, reason in ((mistyped, "malformed-object"), (huge, "over-limit")):
        for kind in ("Pod", "EphemeralContainers"):
            doc = review(obj, operation="UPDATE", kind=kind)
            doc["request"]["subResource"] = "ephemeralcontainers"
            doc["request"]["oldObject"] = obj
            view = StaticView(Inventory(), LIMITED, is_fresh=True)
            validation = Validation(Config(), view, RecordingQuota())
            verdict = asyncio.run(validation.review(parse_review(json.dumps(doc).encode())))
            assert (verdict.allowed, verdict.reason) == (False, reason), kind
