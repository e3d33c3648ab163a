"""Bounded work per review (docs/webhook.md, "Bounded work per review"): limits on a pod's containers,
volumes, mounts and env entries,
checked before anything walks them.

Every rule of admission walks these lists (the shape check, the limits parser, the isolation check,
the patch), so their lengths decide what a review costs. Unchecked, a legal dry-run pod of 20,000
containers cost up to a second of the event loop and a 5 MB patch, and one of 40,000 hostPath
volumes most of one. The check here reads only list lengths (one pass over the containers, no
item inside a list is opened), so a pod over a limit costs a few microseconds per container more
than decoding it, and a pod under every limit costs the rules time linear in what they then walk.
Pure: the pod in, the first limit it passes (as the user's message) or None out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kube_vgpu.contract.config import WebhookConfig

_CONTAINER_GROUPS = ("initContainers", "containers", "ephemeralContainers")


@dataclass(frozen=True)
class WorkBounds:
    """The four limits, as configured (the defaults are `WebhookConfig`'s)."""

    containers: int
    volumes: int
    mounts_per_container: int
    env_per_container: int

    @classmethod
    def of(cls, config: WebhookConfig) -> WorkBounds:
        """The limits a webhook configuration sets."""
        return cls(
            containers=config.max_containers,
            volumes=config.max_volumes,
            mounts_per_container=config.max_mounts_per_container,
            env_per_container=config.max_env_per_container,
        )


DEFAULT_BOUNDS = WorkBounds.of(WebhookConfig())


def _length(value: object) -> int:
    # A value of the wrong type is the shape check's to name; here it holds nothing to walk.
    return len(value) if isinstance(value, list) else 0


def work_problem(pod: Mapping[str, Any], bounds: WorkBounds) -> str | None:
    """The first work limit the pod passes, as a message naming the limit, its setting, the value and
    what to write instead; None when the pod is within every limit."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return None
    groups = [spec.get(key) for key in _CONTAINER_GROUPS]
    containers = sum(map(_length, groups))
    if containers > bounds.containers:
        return (
            f"the pod has {containers} containers (init, app and ephemeral together); the limit is "
            f"{bounds.containers} (webhook.maxContainers): split the work over several pods"
        )
    volumes = _length(spec.get("volumes"))
    if volumes > bounds.volumes:
        return (
            f"spec.volumes has {volumes} volumes; the limit is {bounds.volumes} (webhook.maxVolumes): "
            "mount fewer volumes, e.g. one projected volume for several ConfigMaps and Secrets"
        )
    for key, group in zip(_CONTAINER_GROUPS, groups, strict=True):
        if not isinstance(group, list):
            continue
        for index, container in enumerate(group):
            if not isinstance(container, dict):
                continue
            mounts = _length(container.get("volumeMounts")) + _length(container.get("volumeDevices"))
            if mounts > bounds.mounts_per_container:
                return (
                    f"spec.{key}[{index}] has {mounts} volumeMounts and volumeDevices; the limit is "
                    f"{bounds.mounts_per_container} per container (webhook.maxMountsPerContainer): "
                    "mount a parent folder once instead of many of its files"
                )
            env = _length(container.get("env"))
            if env > bounds.env_per_container:
                return (
                    f"spec.{key}[{index}] has {env} env entries; the limit is "
                    f"{bounds.env_per_container} per container (webhook.maxEnvPerContainer): "
                    "pass settings in a mounted ConfigMap or a file instead"
                )
    return None
