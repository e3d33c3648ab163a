"""`webhook.admission.bounds`: the work limits per review, each tested at its maximum and one past it,
with the defaults and with configured values, through the pure review path (parse, then decide)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

from kube_vgpu.contract.config import Config, ConfigError, WebhookConfig, parse_config
from kube_vgpu.webhook.admission.bounds import DEFAULT_BOUNDS, WorkBounds, work_problem
from kube_vgpu.webhook.admission.mutation import Admission
from kube_vgpu.webhook.admission.review import Verdict, parse_review
from kube_vgpu.webhook.admission.validation import Validation
from kube_vgpu.webhook.placement.inventory import Inventory
from tests.support.admission_view import AllowAllQuota, StaticView
from tests.support.webhook import container, pod, review

DEFAULTS = WebhookConfig()


def _gpu(name: str = "main") -> dict[str, Any]:
    return container(name, memory=1024, cores=10)


def _plain(name: str) -> dict[str, Any]:
    return {"name": name, "image": "busybox"}


def with_containers(count: int) -> dict[str, Any]:
    """A vGPU pod of `count` containers: a third init, a third ephemeral, the rest app containers."""
    init = [_plain(f"i{i}") for i in range(count // 3)]
    debug = [_plain(f"e{i}") for i in range(count // 3)]
    apps = [_gpu("main")] + [_plain(f"c{i}") for i in range(count - len(init) - len(debug) - 1)]
    obj = pod(*apps)
    obj["spec"]["initContainers"] = init
    obj["spec"]["ephemeralContainers"] = debug
    return obj


def with_volumes(count: int) -> dict[str, Any]:
    obj = pod(_gpu())
    obj["spec"]["volumes"] = [{"name": f"v{i}", "hostPath": {"path": f"/srv/{i}"}} for i in range(count)]
    return obj


def with_mounts(count: int) -> dict[str, Any]:
    """A vGPU pod whose second container has `count` mounts, half of them block devices."""
    side = _plain("side")
    side["volumeMounts"] = [{"name": "v", "mountPath": f"/data/{i}"} for i in range(count - count // 2)]
    side["volumeDevices"] = [{"name": "b", "devicePath": f"/dev/b{i}"} for i in range(count // 2)]
    obj = pod(_gpu(), side)
    obj["spec"]["volumes"] = [
        {"name": "v", "emptyDir": {}},
        {"name": "b", "persistentVolumeClaim": {"claimName": "c"}},
    ]
    return obj


def with_env(count: int) -> dict[str, Any]:
    init = _plain("setup")
    init["env"] = [{"name": f"SETTING_{i}", "value": str(i)} for i in range(count)]
    obj = pod(_gpu())
    obj["spec"]["initContainers"] = [init]
    return obj


def _decide(obj: dict[str, Any], webhook: WebhookConfig) -> tuple[Verdict, Verdict]:
    """(the /mutate verdict, the /validate verdict) for a CREATE of `obj` under `webhook`."""
    config = Config(webhook=webhook)
    view = StaticView(Inventory())
    admission = Admission(config, view)
    body = json.dumps(review(obj)).encode()
    mutated = admission.review(parse_review(body, admission.bounds))
    validation = Validation(config, view, AllowAllQuota())
    validated = asyncio.run(validation.review(parse_review(body, WorkBounds.of(webhook))))
    return mutated, validated


# (what, builder, the default limit, the config key, the words of the denial for `limit + 1`)
LIMITS: list[tuple[str, Callable[[int], dict[str, Any]], int, str, str]] = [
    (
        "containers",
        with_containers,
        DEFAULTS.max_containers,
        "maxContainers",
        "containers (init, app and ephemeral",
    ),
    ("volumes", with_volumes, DEFAULTS.max_volumes, "maxVolumes", "spec.volumes has"),
    (
        "mounts",
        with_mounts,
        DEFAULTS.max_mounts_per_container,
        "maxMountsPerContainer",
        "spec.containers[1] has",
    ),
    ("env", with_env, DEFAULTS.max_env_per_container, "maxEnvPerContainer", "spec.initContainers[0] has"),
]


@pytest.mark.parametrize(("what", "build", "limit", "key", "words"), LIMITS, ids=[row[0] for row in LIMITS])
def test_each_default_limit_admits_its_maximum_and_refuses_one_more(
    what: str, build: Callable[[int], dict[str, Any]], limit: int, key: str, words: str
) -> None:
    for verdict in _decide(build(limit), DEFAULTS):
        assert verdict.allowed, verdict.message
    for verdict in _decide(build(limit + 1), DEFAULTS):
        assert not verdict.allowed and verdict.reason == "over-limit"
        assert f"{limit + 1} " in verdict.message and f"the limit is {limit}" in verdict.message
        assert f"(webhook.{key})" in verdict.message and words in verdict.message


@pytest.mark.parametrize(("what", "build", "limit", "key", "words"), LIMITS, ids=[row[0] for row in LIMITS])
def test_each_limit_is_read_from_the_config_file(
    what: str, build: Callable[[int], dict[str, Any]], limit: int, key: str, words: str
) -> None:
    webhook = parse_config(f"webhook:\n  {key}: 4\n").webhook
    assert all(v.allowed for v in _decide(build(4), webhook))
    assert all(not v.allowed and "the limit is 4 " in v.message for v in _decide(build(5), webhook))


@pytest.mark.parametrize(
    "key", ["maxContainers", "maxVolumes", "maxMountsPerContainer", "maxEnvPerContainer"]
)
def test_a_limit_below_one_is_refused_by_the_config_file(key: str) -> None:
    assert parse_config(f"webhook:\n  {key}: 1\n")
    with pytest.raises(ConfigError, match=f"webhook.{key}: expected at least 1"):
        parse_config(f"webhook:\n  {key}: 0\n")


def test_real_pods_are_well_within_the_defaults() -> None:
    # What the defaults must keep admitting: a large training pod with sidecars and many settings.
    big = pod(_gpu(), *(_plain(f"side{i}") for i in range(30)))
    big["spec"]["containers"][0]["env"] = [{"name": f"E{i}", "value": "v"} for i in range(300)]
    big["spec"]["containers"][0]["volumeMounts"] = [
        {"name": f"v{i}", "mountPath": f"/m/{i}"} for i in range(100)
    ]
    big["spec"]["volumes"] = [{"name": f"v{i}", "configMap": {"name": f"c{i}"}} for i in range(100)]
    assert work_problem(big, DEFAULT_BOUNDS) is None


def test_the_limits_are_checked_before_the_pods_shape_is_walked() -> None:
    # One container past the limit and a mistyped one: the denial is the limit, so nothing walked
    # the containers (a shape check of 20,000 containers was the cost the limit exists to avoid).
    obj = with_containers(DEFAULTS.max_containers + 1)
    obj["spec"]["containers"].append({"name": 5})
    request = parse_review(json.dumps(review(obj)).encode())
    assert request.over_limit and not request.object_error


def test_an_updates_old_object_is_bounded_too() -> None:
    old = with_volumes(DEFAULTS.max_volumes + 1)
    doc = review(pod(_gpu()), operation="UPDATE")
    doc["request"]["oldObject"] = old
    body = json.dumps(doc).encode()
    assert parse_review(body).over_limit.startswith("oldObject: spec.volumes has")


@pytest.mark.parametrize(
    "spec",
    [{"containers": "x", "volumes": 7}, {"containers": [None], "initContainers": {}}, {"volumes": None}],
)
def test_mistyped_lists_count_as_empty_for_the_shape_check_to_name(spec: dict[str, Any]) -> None:
    assert work_problem({"spec": spec}, WorkBounds(1, 1, 1, 1)) is None
    assert work_problem({"spec": "not an object"}, WorkBounds(1, 1, 1, 1)) is None
