"""One example pod from CREATE to Allocate, the way a cluster would carry it.

1. Admission in the API server's order (`standins.apiserver.admission_chain`): the mutating webhook over
   HTTPS, its JSONPatch applied with `jsonpatch`; the name, uid and creationTimestamp filled in;
   the validating webhook once with that final object (or the denial recorded).
2. The pod is created in the (stand-in) API server, with that uid.
3. The Volcano stand-in picks a node and GPUs and binds the pod with the allocation annotations.
4. The node's kubelet stand-in sees the bind and admits the pod as the kubelet does, calling the node
   plugin's Allocate once per container that asks for `vgpu-number`, with device IDs from the
   plugin's ListAndWatch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from kube_vgpu.contract.names import DEVICES_TO_ALLOCATE, VGPU_IDS_NEW
from kube_vgpu.demo.cluster import DemoError, LocalCluster
from kube_vgpu.demo.examples import ExampleError, ExamplePod
from kube_vgpu.standins.apiserver.admission_chain import AdmissionChain, WebhookHttpError
from kube_vgpu.standins.apiserver.errors import StatusError
from kube_vgpu.standins.volcano.scheduler import VolcanoBinding


@dataclass
class ContainerAllocation:
    """What one container would start with."""

    container: str
    envs: dict[str, str]
    mounts: list[tuple[str, str, bool]]
    error: str | None = None


@dataclass
class Outcome:
    """Everything the demo saw for one pod."""

    example: ExamplePod
    allowed: bool = False
    message: str = ""
    denied_by: str = ""  # the admission phase that refused the pod: mutate or validate
    warnings: list[str] = field(default_factory=list)
    patch: list[dict[str, Any]] = field(default_factory=list)
    node: str | None = None
    devices: str | None = None
    waiting: str | None = None
    allocations: list[ContainerAllocation] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def allocated(self) -> bool:
        """Admitted, placed, and every vGPU container allocated without error."""
        return self.allowed and self.node is not None and all(a.error is None for a in self.allocations)


class PodFlow:
    """Carries example pods through a running LocalCluster."""

    def __init__(self, cluster: LocalCluster, session: aiohttp.ClientSession) -> None:
        self.cluster = cluster
        self.session = session

    async def run(self, example: ExamplePod) -> Outcome:
        """Admit, create, schedule and allocate one pod."""
        outcome = Outcome(example)
        # The chain decodes it first, as the API server does: the webhooks see `3000` as `3k`.
        final = await self._admit(dict(example.manifest), outcome)
        if not outcome.allowed:
            return outcome
        try:
            created = self.cluster.apiserver.put(final)
        except StatusError as exc:
            # What kubectl would print: the object itself is invalid, a mistake in the example file.
            raise ExampleError(f"pods/{example.source}: the API server refuses this pod: {exc}") from None
        await self._schedule(created, outcome)
        if outcome.node is not None:
            await self._allocate(created, outcome)
        return outcome

    async def _admit(self, pod: dict[str, Any], outcome: Outcome) -> dict[str, Any]:
        assert self.cluster.webhook is not None
        chain = AdmissionChain(
            self.session, f"https://127.0.0.1:{self.cluster.webhook.port}", self.cluster.ca_pem
        )
        try:
            admitted = await chain.create(pod)
        except WebhookHttpError as exc:
            raise DemoError(str(exc)) from None
        except StatusError as exc:
            # The API server decodes a pod before any webhook: a quantity it cannot read fails here.
            source = outcome.example.source
            raise ExampleError(f"pods/{source}: the API server refuses this pod: {exc}") from None
        outcome.allowed = admitted.allowed
        outcome.message = admitted.message
        outcome.denied_by = admitted.phase
        outcome.warnings = admitted.warnings
        outcome.patch = admitted.patch
        return admitted.pod

    async def _schedule(self, pod: Mapping[str, Any], outcome: Outcome) -> None:
        assert self.cluster.volcano is not None
        results = await asyncio.to_thread(self.cluster.volcano.schedule_once)
        result = results.get(outcome.example.key)
        if isinstance(result, VolcanoBinding):
            outcome.node, outcome.devices = result.node, result.devices
        else:
            outcome.waiting = result or "not considered by the scheduler"

    async def _allocate(self, pod: Mapping[str, Any], outcome: Outcome) -> None:
        assert outcome.node is not None
        node = self.cluster.nodes[outcome.node]
        # The node's kubelet stand-in saw the bind and admits the pod as the kubelet does: init
        # containers first, then app containers, one Allocate per container asking `vgpu-number`.
        meta = pod["metadata"]
        admitted = await node.admission.wait_admitted(meta["namespace"], meta["name"])
        for container in admitted.containers:
            outcome.allocations.append(
                ContainerAllocation(container.container, container.envs, container.mounts, container.error)
            )
        if admitted.rejected and not any(c.error for c in admitted.containers):
            outcome.allocations.append(ContainerAllocation("(pod)", {}, [], admitted.rejected))
        stored = self.cluster.apiserver.get("Pod", pod["metadata"]["name"], pod["metadata"]["namespace"])
        if stored is not None:
            annotations = stored["metadata"].get("annotations") or {}
            if annotations.get(VGPU_IDS_NEW) != outcome.devices:
                outcome.problems.append("the node plugin changed volcano.sh/vgpu-ids-new")
            outcome.devices = annotations.get(VGPU_IDS_NEW, outcome.devices)
            left = annotations.get(DEVICES_TO_ALLOCATE, "")
            if outcome.allocated and left.replace(";", ""):
                outcome.problems.append(f"devices-to-allocate not consumed: {left!r}")


def check(outcome: Outcome) -> list[str]:
    """How the outcome differs from the example's expectation (empty when it matches)."""
    expect = outcome.example.expect
    problems = list(outcome.problems)
    if expect.outcome == "denied":
        if outcome.allowed:
            problems.append("expected a denial, the webhook allowed the pod")
        elif expect.message and expect.message not in outcome.message:
            problems.append(f"denial message lacks {expect.message!r}")
        return problems
    if expect.outcome == "pending":
        if not outcome.allowed:
            return [*problems, f"expected a pending pod, the webhook denied: {outcome.message}"]
        if outcome.node is not None:
            return [*problems, f"expected a pending pod, it was scheduled to {outcome.node}"]
        if expect.message and expect.message not in (outcome.waiting or ""):
            problems.append(f"the scheduler's reason lacks {expect.message!r}: {outcome.waiting}")
        return problems
    if not outcome.allowed:
        return [*problems, f"expected allocation, the webhook denied: {outcome.message}"]
    if outcome.node is None:
        return [*problems, f"expected allocation, the pod was not scheduled: {outcome.waiting}"]
    if expect.node and outcome.node != expect.node:
        problems.append(f"expected node {expect.node}, got {outcome.node}")
    problems.extend(f"Allocate for {a.container} failed: {a.error}" for a in outcome.allocations if a.error)
    if not outcome.allocations:
        problems.append("no container was allocated")
    first_env = outcome.allocations[0].envs if outcome.allocations else {}
    for name, prefix in expect.env:
        if not first_env.get(name, "").startswith(prefix):
            problems.append(f"expected env {name} to start with {prefix!r}, got {first_env.get(name)!r}")
    return problems
