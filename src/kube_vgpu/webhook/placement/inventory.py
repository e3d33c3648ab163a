"""The cluster's GPUs as the webhook resolves selectors against them, kept from Node objects.

Models, UUIDs and mode come from the labels the node plugin publishes; each GPU's memory and register
TYPE from Volcano's register annotation, matched by UUID. Nodes are added and removed one at a time as
watch events arrive, and every question a review asks is answered from small aggregated indexes, so the
cost of a review does not grow with the number of nodes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from kube_vgpu.contract.models import model_label_name, parse_register_type
from kube_vgpu.contract.names import (
    HOSTNAME_LABEL,
    MODE_LABEL,
    MODEL_LABEL_PREFIX,
    MODES,
    NODE_REGISTER,
    UUID_LABEL_PREFIX,
    Mode,
)
from kube_vgpu.contract.register import GpuRecord, RegisterFormatError, decode_register
from kube_vgpu.webhook.records import NodeRecord


@dataclass(frozen=True)
class Gpu:
    """One physical GPU: model is the label-name form (`NVIDIA-A100-SXM4-80GB`); None = not known."""

    uuid: str
    node: str
    model: str | None
    type: str | None
    memory_mib: int | None


@dataclass(frozen=True)
class NodeGpus:
    """The GPU facts of one node; `problem` says why its register annotation was not used."""

    name: str
    hostname: str
    mode: Mode | None
    models: frozenset[str]
    gpus: tuple[Gpu, ...]
    problem: str = ""


def node_gpus(node: NodeRecord) -> NodeGpus | None:
    """The GPU facts of a Node object, or None when it carries no kube-vgpu GPU labels."""
    metadata = node.get("metadata") or {}
    name = str(metadata.get("name", ""))
    labels: Mapping[str, str] = metadata.get("labels") or {}
    annotations: Mapping[str, str] = metadata.get("annotations") or {}
    models = frozenset(k[len(MODEL_LABEL_PREFIX) :] for k in labels if k.startswith(MODEL_LABEL_PREFIX))
    uuids = sorted(k[len(UUID_LABEL_PREFIX) :] for k in labels if k.startswith(UUID_LABEL_PREFIX))
    raw_mode = labels.get(MODE_LABEL)
    mode: Mode | None = next((m for m in MODES if m == raw_mode), None)
    if not models and not uuids and mode is None:
        return None
    records: dict[str, GpuRecord] = {}
    problem = ""
    if NODE_REGISTER in annotations:
        try:
            records = {r.uuid: r for r in decode_register(str(annotations[NODE_REGISTER]))}
        except RegisterFormatError as exc:
            problem = str(exc)
    else:
        problem = f"no {NODE_REGISTER} annotation"
    # A GPU whose register record is missing still has a model when the node has only one.
    only_model = next(iter(models)) if len(models) == 1 else None
    gpus = []
    for uuid in uuids:
        record = records.get(uuid)
        if record is None:
            gpus.append(Gpu(uuid, name, only_model, None, None))
            continue
        model = model_label_name(parse_register_type(record.type).model)
        gpus.append(Gpu(uuid, name, model, record.type, record.memory_mib))
    return NodeGpus(
        name=name,
        hostname=str(labels.get(HOSTNAME_LABEL) or name),
        mode=mode,
        models=models,
        gpus=tuple(gpus),
        problem=problem,
    )


@dataclass(frozen=True)
class GpuFilter:
    """Which GPUs a pod may use: allowed models and UUIDs (None = any), excluded UUIDs, memory floor."""

    models: frozenset[str] | None = None
    uuids: frozenset[str] | None = None
    excluded: frozenset[str] = frozenset()
    min_memory_mib: int = 0

    def admits(self, gpu: Gpu) -> bool:
        """Whether one GPU passes the filter (unknown memory passes the memory floor)."""
        if self.models is not None and gpu.model not in self.models:
            return False
        if self.uuids is not None and gpu.uuid not in self.uuids:
            return False
        if gpu.uuid in self.excluded:
            return False
        return gpu.memory_mib is None or gpu.memory_mib >= self.min_memory_mib


_Key = tuple[str | None, Mode | None]


def _drop_zeros(counter: Counter[Any]) -> int:
    """Remove keys counted zero; returns how many keys remain."""
    for key in [k for k, n in counter.items() if n <= 0]:
        del counter[key]
    return len(counter)


def _shape(facts: NodeGpus) -> tuple[int | None, ...]:
    return tuple(sorted((g.memory_mib for g in facts.gpus), key=lambda mib: mib or 0, reverse=True))


class Inventory:
    """Every GPU node of the cluster, with indexes for the questions admission asks."""

    def __init__(self) -> None:
        # Bumped on every change of what the inventory holds, so an answer derived from it can be
        # kept until the next change (`webhook.placement` memoises placements by it).
        self.generation = 0
        self._reset()

    def _reset(self) -> None:
        self.generation += 1
        self._nodes: dict[str, NodeGpus] = {}
        self._uuids: dict[str, Gpu] = {}
        self._model_nodes: Counter[str] = Counter()
        self._types: Counter[str] = Counter()
        self._model_types: dict[str, Counter[str]] = {}
        self._memories: dict[_Key, Counter[int | None]] = {}
        self._shapes: Counter[tuple[int | None, ...]] = Counter()

    def __len__(self) -> int:
        return len(self._nodes)

    @property
    def nodes(self) -> Mapping[str, NodeGpus]:
        """The GPU nodes by name."""
        return self._nodes

    def upsert(self, node: NodeRecord) -> NodeGpus | None:
        """Add or replace a node from its Node object; returns its facts (None: not a GPU node)."""
        name = str((node.get("metadata") or {}).get("name", ""))
        facts = node_gpus(node)
        if self._nodes.get(name) == facts:
            return facts
        self.remove(name)
        if facts is not None:
            self._add(facts)
        return facts

    def remove(self, name: str) -> None:
        """Forget a node (no-op when unknown)."""
        facts = self._nodes.pop(name, None)
        if facts is None:
            return
        self.generation += 1
        self._model_nodes.subtract(facts.models)
        self._shapes[_shape(facts)] -= 1
        for gpu in facts.gpus:
            if self._uuids.get(gpu.uuid) == gpu:
                del self._uuids[gpu.uuid]
            if gpu.type is not None:
                self._types[gpu.type] -= 1
                if gpu.model is not None:
                    self._model_types[gpu.model][gpu.type] -= 1
            self._memories[(gpu.model, facts.mode)][gpu.memory_mib] -= 1
        # Drop zero counts and empty groups so membership tests and scans see only what exists.
        _drop_zeros(self._model_nodes)
        _drop_zeros(self._types)
        _drop_zeros(self._shapes)
        for model in list(self._model_types):
            if not _drop_zeros(self._model_types[model]):
                del self._model_types[model]
        for key in list(self._memories):
            if not _drop_zeros(self._memories[key]):
                del self._memories[key]

    def clear(self) -> None:
        """Forget every node."""
        self._reset()

    def _add(self, facts: NodeGpus) -> None:
        self.generation += 1
        self._nodes[facts.name] = facts
        self._model_nodes.update(facts.models)
        self._shapes[_shape(facts)] += 1
        for gpu in facts.gpus:
            self._uuids[gpu.uuid] = gpu
            if gpu.type is not None:
                self._types[gpu.type] += 1
                if gpu.model is not None:
                    self._model_types.setdefault(gpu.model, Counter())[gpu.type] += 1
            self._memories.setdefault((gpu.model, facts.mode), Counter())[gpu.memory_mib] += 1

    def memory_shapes(self) -> Collection[tuple[int | None, ...]]:
        """The distinct GPU memory lists of the nodes (MiB per GPU, largest first): a few for a fleet."""
        return self._shapes.keys()

    def models(self) -> frozenset[str]:
        """Every GPU model (label-name form) some node carries a model label for."""
        return frozenset(self._model_nodes)

    def types(self) -> frozenset[str]:
        """Every register TYPE some node registers."""
        return frozenset(self._types)

    def types_of(self, models: Iterable[str]) -> frozenset[str]:
        """The register TYPEs of the GPUs of the given models."""
        return frozenset(t for m in models for t in self._model_types.get(m, ()))

    def gpu(self, uuid: str) -> Gpu | None:
        """The GPU with this UUID, if some node has it."""
        return self._uuids.get(uuid)

    def mode_of(self, gpu: Gpu) -> Mode | None:
        """The mode of the node holding `gpu`."""
        facts = self._nodes.get(gpu.node)
        return facts.mode if facts else None

    def _matching(self, flt: GpuFilter) -> Iterator[tuple[Mode | None, int | None]]:
        """(node mode, memory) of every kind of GPU that passes the filter."""
        if flt.uuids is not None:
            for uuid in flt.uuids:
                gpu = self._uuids.get(uuid)
                if gpu is not None and flt.admits(gpu):
                    yield self.mode_of(gpu), gpu.memory_mib
            return
        excluded: Counter[tuple[str | None, Mode | None, int | None]] = Counter()
        for uuid in flt.excluded:
            gpu = self._uuids.get(uuid)
            if gpu is not None:
                excluded[(gpu.model, self.mode_of(gpu), gpu.memory_mib)] += 1
        for (model, mode), memories in self._memories.items():
            if flt.models is not None and model not in flt.models:
                continue
            for memory, count in memories.items():
                if memory is not None and memory < flt.min_memory_mib:
                    continue
                if count > excluded[(model, mode, memory)]:
                    yield mode, memory

    def any_gpu(self, flt: GpuFilter) -> bool:
        """Whether some GPU in the cluster passes the filter (any mode)."""
        return next(self._matching(flt), None) is not None

    def offered_modes(self, flt: GpuFilter) -> frozenset[Mode]:
        """The modes of the nodes holding a GPU that passes the filter."""
        return frozenset(mode for mode, _ in self._matching(flt) if mode is not None)

    def largest_memory(self, flt: GpuFilter, mode: Mode) -> int | None:
        """MiB of the largest GPU that passes the filter on a node in `mode` (None: none known)."""
        sizes = [m for node_mode, m in self._matching(flt) if node_mode == mode and m is not None]
        return max(sizes, default=None)

    def largest_memory_any(self) -> int | None:
        """MiB of the largest GPU on any node, whatever its mode (None: none known)."""
        return max((m for _, m in self._matching(GpuFilter()) if m is not None), default=None)

    def types_matching(self, flt: GpuFilter, mode: Mode) -> frozenset[str]:
        """Register TYPEs of the GPUs that pass the filter on nodes in `mode` (MIG charges need them)."""
        return frozenset(
            gpu.type
            for facts in self._nodes.values()
            if facts.mode == mode
            for gpu in facts.gpus
            if gpu.type is not None and flt.admits(gpu)
        )

    def fully_excluded_hostnames(self, excluded: Iterable[str]) -> tuple[str, ...]:
        """Hostnames of the nodes all of whose GPUs are in `excluded`, sorted."""
        excluded_set = frozenset(excluded)
        nodes = {gpu.node for uuid in excluded_set if (gpu := self._uuids.get(uuid)) is not None}
        hosts = {
            self._nodes[n].hostname
            for n in nodes
            if n in self._nodes and all(g.uuid in excluded_set for g in self._nodes[n].gpus)
        }
        return tuple(sorted(hosts))
