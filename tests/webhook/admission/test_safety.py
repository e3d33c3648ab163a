"""`webhook.admission.safety` as plain calls: each rule at the edge where it starts and stops refusing.

Written to kill mutmut's mutants of the module (docs/testing.md, 'Mutation testing: isolation and
safety'): every reason, every message part a user acts on, and both sides of every condition.
"""

from __future__ import annotations

from typing import Any

import pytest

from kube_vgpu.contract.config import Config, ResourceNames, WebhookConfig
from kube_vgpu.contract.names import PLACEMENT_ANNOTATIONS, SCHEDULER_OWNED_ANNOTATIONS
from kube_vgpu.webhook.admission import isolation
from kube_vgpu.webhook.admission.safety import (
    BYPASSES_SCHEDULER,
    FORGED_ANNOTATION,
    ISOLATION_ESCAPE,
    MALFORMED_VALUE,
    PRIVILEGED,
    Denied,
    annotations_of,
    changed_annotations,
    check_containers,
    check_create,
    check_update,
    read_pod,
)

CONFIG = Config(webhook=WebhookConfig(annotation_writers=("scheduler", "node-plugin")))
GPU = {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "1024"}


def gpu_pod(**spec: Any) -> dict[str, Any]:
    containers = [{"name": "main", "resources": {"limits": dict(GPU)}}]
    return {"metadata": {"name": "p", "namespace": "a"}, "spec": {"containers": containers, **spec}}


def denial(call: Any, *args: Any) -> Denied:
    with pytest.raises(Denied) as caught:
        call(*args)
    return caught.value


def create(pod: dict[str, Any], config: Config = CONFIG) -> None:
    check_create(pod, read_pod(pod, config.resource_names), config)


# --- read_pod and annotations_of ---------------------------------------------------------------


def test_read_pod_reads_the_limits() -> None:
    request = read_pod(gpu_pod(), ResourceNames())
    assert request.asks_vgpu and request.containers[0].memory_mib == 1024


def test_read_pod_refuses_unreadable_limits_as_malformed_values() -> None:
    pod = gpu_pod()
    pod["spec"]["containers"][0]["resources"]["limits"]["volcano.sh/vgpu-memory"] = "3Gi"
    refused = denial(read_pod, pod, ResourceNames())
    assert refused.reason == MALFORMED_VALUE and "volcano.sh/vgpu-memory" in str(refused)
    assert refused.__suppress_context__  # `from None`: the user sees the message, not a chain


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        ({"metadata": {"annotations": {"a": "b"}}}, {"a": "b"}),
        ({"metadata": {"annotations": ["a"]}}, {}),
        ({"metadata": {"annotations": None}}, {}),
        ({"metadata": None}, {}),
        ({}, {}),
        (None, {}),
    ],
)
def test_annotations_of(pod: dict[str, Any] | None, expected: dict[str, str]) -> None:
    assert annotations_of(pod) == expected


# --- check_create: placement and forged bookings -------------------------------------------------


def test_a_pod_placed_by_hand_is_refused_naming_the_node_and_the_fix() -> None:
    refused = denial(create, gpu_pod(nodeName="gpu-1"))
    assert refused.reason == BYPASSES_SCHEDULER
    assert str(refused) == (
        "spec.nodeName is set (gpu-1): a vGPU pod must be placed by the scheduler, which chooses its "
        "GPUs; use nodeSelector kubernetes.io/hostname instead"
    )


@pytest.mark.parametrize("node", ["", None])
def test_an_empty_node_name_is_no_placement(node: str | None) -> None:
    create(gpu_pod(nodeName=node))


def test_every_scheduler_owned_annotation_is_refused_on_a_new_pod_and_named() -> None:
    pod = gpu_pod()
    pod["metadata"]["annotations"] = dict.fromkeys(SCHEDULER_OWNED_ANNOTATIONS, "x") | {"other": "y"}
    refused = denial(create, pod)
    assert refused.reason == FORGED_ANNOTATION
    assert str(refused) == (
        f"annotation(s) {', '.join(SCHEDULER_OWNED_ANNOTATIONS)} are written by the scheduler when it "
        "places a pod; a new pod must not carry them: remove them"
    )


def test_other_annotations_are_not_forgeries() -> None:
    pod = gpu_pod()
    pod["metadata"]["annotations"] = {"volcano.sh/vgpu-mode": "hami-core", "example.com/x": "y"}
    create(pod)


# --- check_containers: privilege and capabilities -------------------------------------------------


def with_security(security: Any, group: str = "containers") -> dict[str, Any]:
    pod = gpu_pod()
    pod["spec"].setdefault(group, []).append({"name": "side", "securityContext": security})
    return pod


def test_a_privileged_container_is_refused_naming_it() -> None:
    refused = denial(create, with_security({"privileged": True}))
    assert refused.reason == PRIVILEGED
    assert str(refused) == (
        "container 'side': a privileged container in a vGPU pod sees every GPU and can escape the memory "
        "and core limits; remove securityContext.privileged"
    )


@pytest.mark.parametrize("group", ["initContainers", "ephemeralContainers"])
def test_privilege_is_refused_in_every_group(group: str) -> None:
    assert denial(create, with_security({"privileged": True}, group)).reason == PRIVILEGED


@pytest.mark.parametrize(
    "security",
    [
        {"privileged": False},
        {"privileged": "true"},  # only JSON true counts (the shape check refuses the string first)
        {},
        None,
        ["privileged"],
        {"capabilities": None},
        {"capabilities": ["SYS_ADMIN"]},
        {"capabilities": {"add": None}},
        {"capabilities": {"drop": ["ALL"]}},
        {"capabilities": {"add": ["NET_ADMIN", "SYS_PTRACE", "CAP_NET_RAW", "SYS_ADMINX", "XCAP_SYS_ADMIN"]}},
    ],
)
def test_unprivileged_settings_are_allowed(security: Any) -> None:
    create(with_security(security))


@pytest.mark.parametrize(
    ("added", "named"),
    [
        (["SYS_ADMIN"], "SYS_ADMIN"),
        (["CAP_SYS_ADMIN"], "CAP_SYS_ADMIN"),
        (["sys_admin"], "sys_admin"),
        (["cap_all"], "cap_all"),
        (["ALL"], "ALL"),
        (["NET_RAW", "SYS_ADMIN", "ALL", "SYS_ADMIN"], "ALL, SYS_ADMIN"),  # sorted, once each
    ],
)
def test_strong_capabilities_are_refused_and_named(added: list[str], named: str) -> None:
    refused = denial(create, with_security({"capabilities": {"add": added}}))
    assert refused.reason == PRIVILEGED
    assert str(refused) == (
        f"container 'side': capabilities {named} in a vGPU pod can unmount HAMi-core's preload and "
        "escape the limits; remove them from securityContext.capabilities.add"
    )


def test_privilege_is_named_before_capabilities() -> None:
    both = {"privileged": True, "capabilities": {"add": ["SYS_ADMIN"]}}
    assert "remove securityContext.privileged" in str(denial(create, with_security(both)))


def test_a_container_without_a_name_is_named_by_a_question_mark() -> None:
    pod = gpu_pod()
    pod["spec"]["containers"].append({"securityContext": {"privileged": True}})
    assert str(denial(create, pod)).startswith("container '?':")


def test_deny_privileged_off_allows_privilege_but_not_escapes() -> None:
    lenient = Config(webhook=WebhookConfig(deny_privileged=False))
    create(with_security({"privileged": True, "capabilities": {"add": ["ALL"]}}), lenient)
    escaping = with_security({"privileged": True})
    escaping["spec"]["containers"][1]["env"] = [{"name": "LD_PRELOAD", "value": "x"}]
    assert denial(create, escaping, lenient).reason == ISOLATION_ESCAPE


def test_check_containers_refuses_an_escape_with_its_message() -> None:
    pod = gpu_pod()
    pod["spec"]["containers"][0]["env"] = [{"name": "CUDA_DISABLE_CONTROL", "value": "1"}]
    refused = denial(check_containers, pod, CONFIG)
    assert refused.reason == ISOLATION_ESCAPE
    assert str(refused).startswith("containers[main]: env CUDA_DISABLE_CONTROL is set by the node plugin")


def test_check_containers_ignores_pod_level_rules() -> None:
    # A running pod has a node and the scheduler's annotations: the debug path must not refuse them.
    pod = gpu_pod(nodeName="gpu-1")
    pod["metadata"]["annotations"] = dict.fromkeys(SCHEDULER_OWNED_ANNOTATIONS, "x")
    check_containers(pod, CONFIG)


# --- changed_annotations and check_update --------------------------------------------------------


def annotated(annotations: dict[str, str] | None) -> dict[str, Any]:
    pod = gpu_pod()
    if annotations is not None:
        pod["metadata"]["annotations"] = annotations
    return pod


def test_changed_annotations_finds_adds_changes_and_removals_in_the_order_given() -> None:
    old = annotated({"a": "1", "b": "2", "c": "3"})
    new = annotated({"a": "1", "b": "changed", "d": "4"})
    assert changed_annotations(old, new, ["d", "c", "b", "a"]) == ["d", "c", "b"]
    assert changed_annotations(None, new, ["a"]) == ["a"]
    assert changed_annotations(old, None, ["a", "z"]) == ["a"]


def test_an_update_touching_nothing_owned_is_allowed() -> None:
    kept = dict.fromkeys(SCHEDULER_OWNED_ANNOTATIONS + PLACEMENT_ANNOTATIONS, "x")
    check_update(annotated(kept), annotated(kept | {"team": "vision"}), "alice", CONFIG)


def test_every_changed_annotation_is_named() -> None:
    owned = SCHEDULER_OWNED_ANNOTATIONS[:2]
    refused = denial(check_update, annotated({}), annotated(dict.fromkeys(owned, "x")), "alice", CONFIG)
    assert str(refused).startswith(f"annotation(s) {owned[0]}, {owned[1]} belong to the scheduler")
    placement = PLACEMENT_ANNOTATIONS[:2]
    refused = denial(check_update, annotated({}), annotated(dict.fromkeys(placement, "x")), "alice", CONFIG)
    assert str(refused).startswith(f"annotation(s) {placement[0]}, {placement[1]} are fixed when")


@pytest.mark.parametrize("key", SCHEDULER_OWNED_ANNOTATIONS)
def test_an_author_changing_a_booking_is_refused(key: str) -> None:
    refused = denial(check_update, annotated({}), annotated({key: "x"}), "alice", CONFIG)
    assert refused.reason == FORGED_ANNOTATION
    assert str(refused) == (
        f"annotation(s) {key} belong to the scheduler and the node plugin; alice may not add, change "
        "or remove them (leave them as they are; the writers are set in webhook.annotationWriters)"
    )


def test_an_anonymous_update_is_named_as_such() -> None:
    refused = denial(
        check_update, annotated({}), annotated({SCHEDULER_OWNED_ANNOTATIONS[0]: "x"}), "", CONFIG
    )
    assert "; an anonymous user may not add" in str(refused)


@pytest.mark.parametrize("key", PLACEMENT_ANNOTATIONS)
def test_an_author_changing_a_placement_annotation_is_refused_first(key: str) -> None:
    new = annotated({key: "x", SCHEDULER_OWNED_ANNOTATIONS[0]: "y"})
    refused = denial(check_update, annotated({}), new, "alice", CONFIG)
    assert refused.reason == FORGED_ANNOTATION
    assert str(refused) == (
        f"annotation(s) {key} are fixed when the pod is created: they decided its node affinity and its "
        "quota charge; delete the pod and create it again to change them"
    )


@pytest.mark.parametrize("writer", ["scheduler", "node-plugin"])
def test_the_configured_writers_may_change_both(writer: str) -> None:
    new = annotated({PLACEMENT_ANNOTATIONS[0]: "mig", SCHEDULER_OWNED_ANNOTATIONS[0]: "y"})
    check_update(annotated({}), new, writer, CONFIG)


def test_check_containers_lists_the_pod_s_containers_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # The list built for the privilege check is the one the escape check walks: a pod of hundreds of
    # containers is not listed twice per review.
    listed: list[object] = []
    original = isolation.grouped_containers

    def counting(pod: Any) -> list[tuple[str, dict[str, Any]]]:
        listed.append(pod)
        return original(pod)

    monkeypatch.setattr(isolation, "grouped_containers", counting)
    pod = {"spec": {"containers": [{"name": "c", "env": [{"name": "LD_AUDIT"}]}]}}
    assert denial(check_containers, pod, CONFIG).reason == ISOLATION_ESCAPE
    assert listed == []
