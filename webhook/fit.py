"""Whether a vGPU pod can ever fit the GPUs the cluster has: pure, inventory in, warnings out.

Each vGPU of a container sits on a different GPU of one node (SPEC §1), so a container asking
N vGPUs of M MiB needs a node with N GPUs of at least M MiB each. Checked against every GPU node
the webhook knows, whatever the pod's selectors (a pod that fits nowhere fits none of its selected
GPUs either). The answer is a warning, not a denial: an autoscaled cluster may add a bigger node
later. With no GPU node known at all nothing is said here (the selector check covers it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from contract.resources import PodRequest


def never_fits(request: PodRequest, shapes: Iterable[Sequence[int | None]]) -> list[str]:
    """One warning per container that no GPU node of the cluster could hold, saying what would fit.

    `shapes` are the nodes' GPU memories (MiB per GPU, None when not known); nodes of the same shape
    answer alike, so `Inventory.memory_shapes()` gives each once and the check does not grow with the fleet.
    """
    known = [shape for shape in shapes if shape]
    if not known:
        return []
    most_gpus = max(len(shape) for shape in known)
    sizes = [mib for shape in known for mib in shape if mib is not None]
    largest = max(sizes, default=None)
    warnings: list[str] = []
    for container in request.containers:
        count, memory = container.vgpus, container.memory_mib
        if count == 0:
            continue
        name = f"container {container.container!r}"
        if count > most_gpus:
            warnings.append(
                f"{name} asks for {count} vGPUs, each on a different GPU, but no node has more than "
                f"{most_gpus} GPUs: it can never be scheduled; ask for at most {most_gpus}"
            )
        elif memory is not None and largest is not None and memory > largest:
            warnings.append(
                f"{name} asks for {memory} MiB per vGPU, but the largest GPU in the cluster has "
                f"{largest} MiB: it can never be scheduled; ask for at most {largest}"
            )
        elif memory is not None and not any(
            sum(1 for mib in shape if (mib or 0) >= memory) >= count for shape in known
        ):
            warnings.append(
                f"{name} asks for {count} vGPUs of {memory} MiB, but no node has {count} GPUs "
                f"with {memory} MiB or more: it can never be scheduled"
            )
    return warnings
