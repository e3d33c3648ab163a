"""The demo's DRA node group: one simulated node served by the node plugin's `--api dra`, and the
examples/dra/ pods carried from admission through the scheduler stand-in's allocation and the kubelet
stand-in's prepare to the CDI edits their containers get. Also the objects tests put in a stand-in
cluster: the DeviceClass the chart installs, ResourceClaims, the NVIDIA Container Toolkit's CDI spec."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kube_vgpu.contract.config import Config
from kube_vgpu.contract.names import HOSTNAME_LABEL
from kube_vgpu.contract.yamltext import safe_load_all, utf8_problem, yaml_problem
from kube_vgpu.demo.examples import EXPECT_PREFIX, ExampleError, check_namespace, check_pod_manifest
from kube_vgpu.kubeapi.client import Kube
from kube_vgpu.node.dra.driver import DraNodePlugin, DraSettings
from kube_vgpu.node.dra.slices import DRIVER
from kube_vgpu.standins.apiserver.admission_chain import AdmissionChain
from kube_vgpu.standins.apiserver.dra import FeatureGates
from kube_vgpu.standins.apiserver.errors import StatusError
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.standins.dra.scheduler import DraScheduler, Unschedulable
from kube_vgpu.standins.hamicore import install_placeholder
from kube_vgpu.standins.kubelet.dra import (
    ClaimId,
    ContainerConfig,
    DraError,
    DraKubelet,
    PreparedDevice,
    cdi_ids_for,
    resolve,
)
from kube_vgpu.standins.nvml.api import load_simulation

# Who creates a claim from a pod's template: Kubernetes' resource claim controller
# (kubernetes pkg/controller/resourceclaim, run by kube-controller-manager under this account).
CLAIM_CONTROLLER = "system:serviceaccount:kube-system:resource-claim-controller"
# The DeviceClass the chart installs (helm/kube-vgpu/templates/node-deviceclass.yaml).
DEVICE_CLASS = DRIVER


def device_class() -> dict[str, Any]:
    """`vgpu.kube-vgpu.io`: every device of the driver."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DEVICE_CLASS},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }


def nvidia_cdi_spec(gpus: Sequence[tuple[int, str]]) -> dict[str, Any]:
    """What `nvidia-ctk cdi generate` writes for GPUs given as (index, UUID): each GPU named by its
    index and by its UUID, plus `all`, with the control devices as common edits."""
    devices: list[dict[str, Any]] = []
    for index, uuid in gpus:
        edits = {"deviceNodes": [{"path": f"/dev/nvidia{index}"}]}
        devices += [{"name": str(index), "containerEdits": edits}, {"name": uuid, "containerEdits": edits}]
    devices.append(
        {"name": "all", "containerEdits": {"deviceNodes": [{"path": f"/dev/nvidia{i}"} for i, _ in gpus]}}
    )
    return {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": devices,
        "containerEdits": {
            "deviceNodes": [{"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia-uvm"}],
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
        },
    }


# -- the demo's DRA node group --------------------------------------------------------------------

# The DRA node beside the Volcano nodes: three A100 80GB, served by the plugin's `--api dra`.
DRA_NODE = "gpu-node-dra"
DRA_SIMULATION: dict[str, Any] = {
    "gpus": [{"model": "NVIDIA A100-SXM4-80GB", "memoryMiB": 81920, "count": 3}]
}
DRA_EXAMPLES = "dra"
NAMESPACE = "default"


class DraDemoError(RuntimeError):
    """The DRA node did not come up; the message says which part."""


@dataclass
class DraNode:
    """The DRA node: its plugin (the product's `--api dra` assembly) and the kubelet's DRA side."""

    name: str
    root: Path
    cdi: Path
    nvml: Any
    plugin: DraNodePlugin
    kubelet: DraKubelet
    registered: str = ""

    async def stop(self) -> None:
        """Close the kubelet's connections, stop the plugin, shut NVML down."""
        await self.kubelet.close()
        await self.plugin.stop()
        with contextlib.suppress(Exception):
            self.nvml.nvmlShutdown()


async def start_dra_node(
    api: ApiServerStandin, workdir: Path, config: Config, kube: Kube, name: str = DRA_NODE
) -> DraNode:
    """Start the DRA node on the API server stand-in (turned to Kubernetes 1.36's DRA gates): the
    DeviceClass the chart installs, the Node, the NVIDIA toolkit's CDI spec of its GPUs, the plugin,
    and the kubelet's registration of it."""
    api.feature_gates = FeatureGates.of_release(36)
    api.put(device_class())
    api.put(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {HOSTNAME_LABEL: name}},
            "status": {
                "capacity": {"cpu": "32", "memory": "256Gi"},
                "allocatable": {"cpu": "32", "memory": "256Gi"},
            },
        }
    )
    nvml = load_simulation(dict(DRA_SIMULATION), name)
    nvml.nvmlInit()
    root = workdir / "dra" / name
    (root / "plugins_registry").mkdir(parents=True)
    cdi = workdir / "cdi" / name
    cdi.mkdir(parents=True)
    gpus = [
        (i, str(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i))))
        for i in range(nvml.nvmlDeviceGetCount())
    ]
    (cdi / "nvidia.json").write_text(json.dumps(nvidia_cdi_spec(gpus)))
    install_placeholder(Path(config.node.hook_path))
    settings = DraSettings(
        node_name=name,
        config=config,
        kubelet_root_dir=root,
        cdi_dir=cdi,
        gpu_cdi_dirs=(cdi,),
        lock_dir=str(workdir / "vgpulock"),
        metrics_port=0,
        xid_wait_ms=250,
    )
    plugin = DraNodePlugin(settings, nvml, kube)
    node = DraNode(name, root, cdi, nvml, plugin, DraKubelet(root))
    try:
        await plugin.start()
        registered = await node.kubelet.register_all()
    except Exception as exc:
        await node.stop()
        raise DraDemoError(f"DRA node {name}: {exc}") from exc
    if [p.driver for p in registered] != [DRIVER]:
        await node.stop()
        raise DraDemoError(f"DRA node {name}: the kubelet registered {registered}, not {DRIVER}")
    node.registered = registered[0].service
    return node


def pool_summary(api: ApiServerStandin, node: DraNode) -> list[str]:
    """The node's published pool, a line per device."""
    slices = [s for s in api.list("ResourceSlice") if s["spec"].get("nodeName") == node.name]
    generation = max((s["spec"]["pool"]["generation"] for s in slices), default=0)
    lines = [
        f"DRA node {node.name}: driver {DRIVER} registered with the kubelet ({node.registered}), "
        f"pool {node.name} generation {generation}:"
    ]
    for s in slices:
        for device in s["spec"]["devices"]:
            capacity = ", ".join(f"{k} {v['value']}" for k, v in (device.get("capacity") or {}).items())
            shared = "shared" if device.get("allowMultipleAllocations") else "whole"
            model = device["attributes"]["model"]["string"]
            lines.append(f"    {device['name']}  {model}  {shared}  {capacity}")
    return lines


# -- one example from claim to CDI edits ---------------------------------------------------------


@dataclass(frozen=True)
class DraExample:
    """One examples/dra/ file: its ResourceClaimTemplate and the pod that uses it, and whether the
    webhook must refuse the pod or its claim (`demo.kube-vgpu.io/expect: denied` on the pod, with an
    optional `expect-message`, a part of the refusal); without the annotation it must be allocated and
    prepared."""

    source: str
    template: dict[str, Any]
    pod: dict[str, Any]
    denied: bool = False
    message: str | None = None


@dataclass
class DraOutcome:
    """Everything the demo saw for one DRA pod."""

    example: DraExample
    claim: str = ""
    node: str | None = None
    results: list[dict[str, Any]] = field(default_factory=list)
    prepared: list[PreparedDevice] = field(default_factory=list)
    containers: dict[str, ContainerConfig] = field(default_factory=dict)
    pod_patch_ops: int | None = None  # the pod's mutation, once both phases allowed it
    claim_allowed: bool = False
    refused: str = ""  # the webhook's refusal of the pod or of its claim
    error: str = ""

    @property
    def ok(self) -> bool:
        """Whether it ended as its example expects."""
        if self.example.denied:
            return bool(self.refused) and (self.example.message or "") in self.refused
        return not self.refused and not self.error and self.node is not None and bool(self.containers)


_DRA_EXPECTATIONS = frozenset((EXPECT_PREFIX + "expect", EXPECT_PREFIX + "expect-message"))


def _check_template_use(source: str, template: dict[str, Any], pod: dict[str, Any]) -> None:
    """The pod must name its file's template in exactly one of its `spec.resourceClaims`."""
    name = (template.get("metadata") or {}).get("name")
    claims = (pod.get("spec") or {}).get("resourceClaims") or []
    uses = [c for c in claims if isinstance(c, dict) and c.get("resourceClaimTemplateName") == name]
    if len(uses) != 1:
        raise ExampleError(
            f"{source}: the Pod names the ResourceClaimTemplate {name!r} in {len(uses)} of its "
            f"spec.resourceClaims; it must name it in exactly one (resourceClaimTemplateName: {name})"
        )


def check_dra_namespaces(examples: list[DraExample], namespaces: Collection[str]) -> None:
    """Refuse a DRA pod whose namespace is neither `default` nor one `namespaces.yaml` lists."""
    for example in examples:
        namespace = example.pod["metadata"].get("namespace", NAMESPACE)
        check_namespace(example.source, namespace, namespaces, default=NAMESPACE)


def load_dra_examples(folder: Path) -> list[DraExample]:
    """Each `*.yaml` in `folder` with exactly one ResourceClaimTemplate and one Pod (ExampleError
    naming the file otherwise)."""
    examples = []
    for path in sorted(folder.glob("*.yaml")):
        try:
            docs = [d for d in safe_load_all(path.read_text(encoding="utf-8")) if d]
        except OSError as exc:
            raise ExampleError(f"{DRA_EXAMPLES}/{path.name}: cannot be read: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise ExampleError(f"{DRA_EXAMPLES}/{path.name}: {utf8_problem(exc)}") from None
        except yaml.YAMLError as exc:
            raise ExampleError(f"{DRA_EXAMPLES}/{path.name}: {yaml_problem(exc)}") from None
        kinds = sorted(str(d.get("kind")) if isinstance(d, dict) else "?" for d in docs)
        if kinds != ["Pod", "ResourceClaimTemplate"]:
            raise ExampleError(
                f"{DRA_EXAMPLES}/{path.name}: holds {', '.join(kinds) or 'nothing'}; it must hold one "
                "ResourceClaimTemplate and one Pod that uses it"
            )
        template = next(d for d in docs if d["kind"] == "ResourceClaimTemplate")
        pod = next(d for d in docs if d["kind"] == "Pod")
        source = f"{DRA_EXAMPLES}/{path.name}"
        annotations = check_pod_manifest(source, pod, namespaced=False)
        _check_template_use(source, template, pod)
        unknown = sorted(k for k in annotations if k.startswith(EXPECT_PREFIX) and k not in _DRA_EXPECTATIONS)
        if unknown:
            raise ExampleError(
                f"{source}: annotation {unknown[0]} is not one a DRA example takes; it takes "
                f"{EXPECT_PREFIX}expect (allocated or denied) and {EXPECT_PREFIX}expect-message"
            )
        expect = annotations.get(EXPECT_PREFIX + "expect", "allocated")
        if expect not in ("allocated", "denied"):
            raise ExampleError(
                f"{source}: annotation {EXPECT_PREFIX}expect is {expect!r}; a DRA example is allocated "
                f"(the default: its claim allocated and prepared) or denied (the webhook refuses the pod or "
                f"its claim; optionally {EXPECT_PREFIX}expect-message: a part of the refusal)"
            )
        message = annotations.get(EXPECT_PREFIX + "expect-message")
        examples.append(DraExample(source, template, pod, expect == "denied", message))
    return examples


async def run_dra_example(
    api: ApiServerStandin, node: DraNode, example: DraExample, chain: AdmissionChain
) -> DraOutcome:
    """The template stored; the pod admitted by the webhooks and created; its claim made from the
    template (as the resource claim controller makes it), admitted by the validating webhook (the
    namespace's quota) and created; the claim allocated on the DRA node by the scheduler stand-in and
    reserved for the pod; prepared through the kubelet stand-in; each container's CDI devices
    resolved as a runtime applies them."""
    outcome = DraOutcome(example)
    pod = json.loads(json.dumps(example.pod))
    pod["metadata"].setdefault("namespace", NAMESPACE)
    namespace, pod_name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    try:
        template_name = example.template["metadata"]["name"]
        (pod_claim,) = [
            c for c in pod["spec"]["resourceClaims"] if c.get("resourceClaimTemplateName") == template_name
        ]
        outcome.claim = f"{pod_name}-{pod_claim['name']}"
        template = json.loads(json.dumps(example.template))
        template["metadata"]["namespace"] = namespace
        api.put(template)
        admitted = await chain.create(pod)
        if not admitted.allowed:
            outcome.refused = f"pod refused by the webhook ({admitted.phase}): {admitted.message}"
            return outcome
        outcome.pod_patch_ops = len(admitted.patch)
        stored_pod = api.put(admitted.pod)
        owner = {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": pod_name,
            "uid": stored_pod["metadata"]["uid"],
            "controller": True,
        }
        made = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": outcome.claim, "namespace": namespace, "ownerReferences": [owner]},
            "spec": template["spec"]["spec"],
        }
        claim_admitted = await chain.create_claim(made, username=CLAIM_CONTROLLER)
        if not claim_admitted.allowed:
            outcome.refused = f"claim refused by the webhook: {claim_admitted.message}"
            return outcome
        outcome.claim_allowed = True
        api.put(claim_admitted.pod)
    except (StatusError, KeyError, ValueError, TypeError) as exc:
        raise ExampleError(f"{example.source}: the API server refuses it: {exc}") from None
    try:
        allocated = await asyncio.to_thread(
            DraScheduler(api).allocate, namespace, outcome.claim, node.name, stored_pod
        )
    except Unschedulable as exc:
        outcome.error = f"not allocated: {exc}"
        return outcome
    outcome.node = node.name
    outcome.results = list(allocated["status"]["allocation"]["devices"]["results"])
    claim = ClaimId(namespace, outcome.claim, allocated["metadata"]["uid"])
    try:
        prepared = await node.kubelet.prepare(DRIVER, [claim])
    except DraError as exc:
        outcome.error = str(exc)
        return outcome
    outcome.prepared = prepared[claim.uid]
    requests = [r["name"] for r in template["spec"]["spec"]["devices"]["requests"]]
    for container in pod["spec"]["containers"]:
        ids: list[str] = []
        for ref in (container.get("resources") or {}).get("claims") or []:
            if ref["name"] != pod_claim["name"]:
                continue
            for request in [ref["request"]] if ref.get("request") else requests:
                ids += [i for i in cdi_ids_for(outcome.prepared, request) if i not in ids]
        try:
            outcome.containers[container["name"]] = resolve([node.cdi], ids)
        except DraError as exc:
            outcome.error = f"container {container['name']}: {exc}"
    return outcome


def render_dra(outcome: DraOutcome, width: int = 100) -> Iterator[str]:
    """Lines describing one DRA pod's journey, as the demo prints Allocate answers."""
    example = outcome.example
    pod = example.pod["metadata"]
    title = f"== {pod.get('namespace', NAMESPACE)}/{pod['name']} ({example.source}) "
    yield title + "=" * max(0, width - len(title))
    for request in example.template["spec"]["spec"]["devices"]["requests"]:
        wanted = ((request.get("exactly") or {}).get("capacity") or {}).get("requests") or {}
        asked = ", ".join(f"{k} {v}" for k, v in wanted.items()) or "no capacity named: the whole GPU"
        template = example.template["metadata"]["name"]
        yield f"claim {outcome.claim} (template {template}), request {request['name']}: {asked}"
    if outcome.pod_patch_ops is not None:
        patched = f"{outcome.pod_patch_ops} patch operation(s)" if outcome.pod_patch_ops else "no patch"
        yield f"webhook: pod allowed by /mutate ({patched}) and /validate"
    if outcome.claim_allowed:
        yield "webhook: claim allowed by /validate"
    elif outcome.pod_patch_ops is not None and outcome.refused:
        yield "    (the pod is created and stays Pending: the claim controller retries its claim)"
    if outcome.node is not None:
        yield f"scheduler (local DRA allocation stand-in): node {outcome.node}"
        for r in outcome.results:
            used = (
                ", ".join(f"{k}={v}" for k, v in (r.get("consumedCapacity") or {}).items())
                or "the whole device"
            )
            yield f"    {r['request']} -> {r['pool']}/{r['device']}: {used}"
    for device in outcome.prepared:
        requests = ",".join(device.request_names)
        yield f"kubelet NodePrepareResources, {requests} on {device.device}: CDI devices"
        yield from (f"    {i}" for i in device.cdi_device_ids)
    for name, config in outcome.containers.items():
        yield f"container {name} would start with (CDI edits):"
        yield from (f"    env   {e}" for e in config.env)
        for mount in config.mounts:
            read_only = "ro" in (mount.get("options") or [])
            yield f"    mount {mount['containerPath']} <- {mount['hostPath']} ({'ro' if read_only else 'rw'})"
        yield from (f"    device {d['path']}" for d in config.device_nodes)
    if example.denied and outcome.ok:
        yield f"result: denied, as expected: {outcome.refused}"
    elif example.denied:
        wanted = f"a refusal containing {example.message!r}" if example.message else "a refusal"
        got = outcome.refused or outcome.error or "allocated and prepared"
        yield f"result: NOT as expected ({wanted}): {got}"
    elif outcome.ok:
        yield "result: allocated and prepared, as expected"
    else:
        got = outcome.refused or outcome.error or "no container got a GPU"
        yield f"result: NOT as expected (allocated and prepared): {got}"
    yield ""
