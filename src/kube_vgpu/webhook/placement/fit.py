"""Whether a vGPU pod can ever fit the GPUs the cluster has: pure, inventory in, warnings out.

Each vGPU of a container sits on a different GPU of one node, so a container asking
N vGPUs of M MiB needs a node with N GPUs of at least M MiB each. Checked against every GPU node
the webhook knows, whatever the pod's selectors (a pod that fits nowhere fits none of its selected
GPUs either). The answer is a warning, not a denial: an autoscaled cluster may add a bigger node
later. With no GPU node known at all nothing is said here (the selector check covers it).

A container's answer depends only on its vGPU count and memory and on the fleet's node shapes, and
almost every pod of a cluster asks the same few things, so `never_fits_in` keeps the answers per
inventory state: a bounded LRU keyed by the ask, the inventory and its `generation`, which every
change of the inventory bumps (as `webhook.placement` keeps placements).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence

from kube_vgpu.contract.resources import PodRequest
from kube_vgpu.webhook.placement.inventory import Inventory

# Answers kept: one per distinct (count, memory) ask and inventory state; a fleet has a handful.
_MEMO_SIZE = 256


def never_fits(request: PodRequest, shapes: Iterable[Sequence[int | None]]) -> list[str]:
    """One warning per container that no GPU node of the cluster could hold, saying what would fit.

    `shapes` are the nodes' GPU memories (MiB per GPU, None when not known); nodes of the same shape
    answer alike, so `Inventory.memory_shapes()` gives each once and the check does not grow with the fleet.
    """
    known = tuple(tuple(shape) for shape in shapes if shape)
    return [
        f"container {container.container!r} {problem}"
        for container in request.containers
        if container.vgpus != 0
        and (problem := _problem(container.vgpus, container.memory_mib, known)) is not None
    ]


def never_fits_in(request: PodRequest, inv: Inventory) -> list[str]:
    """`never_fits(request, inv.memory_shapes())`, each container's answer kept per inventory state."""
    return [
        f"container {container.container!r} {problem}"
        for container in request.containers
        if container.vgpus != 0
        and (problem := _problem_memoised(container.vgpus, container.memory_mib, inv, inv.generation))
        is not None
    ]


@functools.lru_cache(maxsize=_MEMO_SIZE)
def _problem_memoised(count: int, memory: int | None, inv: Inventory, generation: int) -> str | None:
    """`_problem` against the inventory's shapes: `generation` is only part of the key, so a changed
    inventory is a new key and an answer found before the change is never handed out after it."""
    del generation
    return _problem(count, memory, tuple(shape for shape in inv.memory_shapes() if shape))


def _problem(count: int, memory: int | None, known: Sequence[Sequence[int | None]]) -> str | None:
    """Why `count` vGPUs of `memory` MiB fit no node of the shapes `known` (the warning after the
    container's name), or None when some node holds them or no shape is known."""
    if not known:
        return None
    most_gpus = max(len(shape) for shape in known)
    largest = max((mib for shape in known for mib in shape if mib is not None), default=None)
    if count > most_gpus:
        return (
            f"asks for {count} vGPUs, each on a different GPU, but no node has more than "
            f"{most_gpus} GPUs: it can never be scheduled; ask for at most {most_gpus}"
        )
    if memory is not None and largest is not None and memory > largest:
        return (
            f"asks for {memory} MiB per vGPU, but the largest GPU in the cluster has "
            f"{largest} MiB: it can never be scheduled; ask for at most {largest}"
        )
    if memory is not None and not any(
        sum(1 for mib in shape if (mib or 0) >= memory) >= count for shape in known
    ):
        return (
            f"asks for {count} vGPUs of {memory} MiB, but no node has {count} GPUs "
            f"with {memory} MiB or more: it can never be scheduled"
        )
    return None
