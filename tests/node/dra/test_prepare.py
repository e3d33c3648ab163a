"""NodePrepareResources / NodeUnprepareResources through real gRPC on unix sockets, called by the kubelet
stand-in after a real registration, reading claims from the API-server stand-in through the product's
client; containers' edits resolved from the CDI specs as a runtime resolves them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client

from kube_vgpu.kubeapi.client import Kube
from kube_vgpu.node.dra.checkpoint import Checkpoint, CheckpointError, encode
from kube_vgpu.node.dra.limits import Card, ClaimRef
from kube_vgpu.node.dra.prepare import Fault, no_fault
from kube_vgpu.node.dra.server import DraServer, serve_dra
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.standins.kubelet.dra import ClaimId, DraError, DraKubelet, PreparedDevice, cdi_ids_for, resolve
from tests.support.node import short_tempdir

DRIVER = "vgpu.kube-vgpu.io"
NODE = "node-1"
GROUP, VERSION = "resource.k8s.io", "v1"
MIB80 = 81920


def uuid(i: int) -> str:
    return f"GPU-{i:08d}-0000-0000-0000-000000000000"


def eight_gpus() -> dict[str, Card]:
    return {f"gpu-{i}": Card(f"gpu-{i}", uuid(i), i, MIB80) for i in range(8)}


def nvidia_spec(count: int = 8) -> dict[str, Any]:
    # What `nvidia-ctk cdi generate` writes: each GPU by index and by UUID, plus `all`.
    devices = []
    for i in range(count):
        edits = {"deviceNodes": [{"path": f"/dev/nvidia{i}"}]}
        devices += [{"name": str(i), "containerEdits": edits}, {"name": uuid(i), "containerEdits": edits}]
    devices.append({"name": "all", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}})
    return {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": devices,
        "containerEdits": {
            "deviceNodes": [{"path": "/dev/nvidiactl"}],
            "env": ["NVIDIA_CTK_LIBCUDA_DIR=/usr/lib"],
        },
    }


def is_dir(path: str) -> bool:
    return os.path.isdir(path)


def inode(path: Path) -> int:
    return path.stat().st_ino


@pytest.fixture
def root() -> Iterator[Path]:
    with short_tempdir() as path:
        yield path


@dataclass
class DraNode:
    root: Path
    kube: Kube
    custom: client.CustomObjectsApi
    kubelet: DraKubelet
    cards: dict[str, Card] = field(default_factory=eight_gpus)
    server: DraServer | None = None

    @property
    def cdi_dir(self) -> Path:
        return self.root / "cdi"

    @property
    def hook(self) -> Path:
        return self.root / "hook"

    async def start(self, fault: Fault = no_fault) -> None:
        self.server = await serve_dra(
            node_name=NODE,
            kube=self.kube,
            cards=lambda: self.cards,
            hook_path=str(self.hook),
            lock_dir=str(self.root / "lock"),
            kubelet_root_dir=self.root / "kubelet",
            cdi_dir=self.cdi_dir,
            gpu_cdi_dirs=[self.cdi_dir],
            fault=fault,
        )
        self.kubelet = DraKubelet(self.root / "kubelet", self.kubelet.services)
        assert [p.driver for p in await self.kubelet.register_all()] == [DRIVER]

    async def stop(self) -> None:
        await self.kubelet.close()
        if self.server is not None:
            await self.server.stop()
            self.server = None

    def claim(
        self,
        name: str,
        results: list[dict[str, Any]] | None,
        namespace: str = "default",
        *,
        admin: bool | None = None,
    ) -> ClaimId:
        """Create a claim and, with `results`, allocate it as the scheduler would (through /status).
        Its request `gpu` asks adminAccess when `admin` says so, or (None) when the results are
        marked adminAccess."""
        if admin is None:
            admin = any(r.get("adminAccess") is True for r in results or ())
        exactly: dict[str, Any] = {"deviceClassName": DRIVER}
        if admin:
            exactly["adminAccess"] = True
        body: dict[str, Any] = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
        }
        created = cast(
            dict[str, Any],
            self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "resourceclaims", body),
        )
        if results is not None:
            self.custom.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                namespace,
                "resourceclaims",
                name,
                {"status": {"allocation": {"devices": {"results": results}}}},
            )
        return ClaimId(namespace, name, created["metadata"]["uid"])

    def delete(self, claim: ClaimId) -> None:
        self.custom.delete_namespaced_custom_object(
            GROUP, VERSION, claim.namespace, "resourceclaims", claim.name
        )

    async def prepare(self, *claims: ClaimId) -> dict[str, list[PreparedDevice]]:
        return await self.kubelet.prepare(DRIVER, claims)

    async def unprepare(self, *claims: ClaimId) -> None:
        await self.kubelet.unprepare(DRIVER, claims)

    def container(self, devices: list[PreparedDevice]) -> dict[str, str]:
        return resolve([self.cdi_dir], cdi_ids_for(devices, "gpu")).env_map

    def spec_files(self) -> list[str]:
        return sorted(p.name for p in self.cdi_dir.iterdir() if p.name.startswith(("vgpu", ".vgpu")))

    def checkpoint(self) -> dict[str, Any]:
        path = self.root / "kubelet" / "plugins" / DRIVER / "checkpoint.json"
        if not path.exists():
            return {}
        claims: dict[str, Any] = json.loads(path.read_text())["data"]["claims"]
        return claims


def share(
    device: str = "gpu-0", memory: str | None = None, cores: str | None = None, **extra: Any
) -> dict[str, Any]:
    out: dict[str, Any] = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}
    out.update(extra)
    consumed = {k: v for k, v in (("memory", memory), ("cores", cores)) if v is not None}
    if consumed:
        out["consumedCapacity"] = consumed
    return out


@contextlib.asynccontextmanager
async def dra_node(
    apiserver: ApiServerStandin,
    root: Path,
    *,
    fault: Fault = no_fault,
    services: tuple[str, ...] | None = None,
) -> AsyncIterator[DraNode]:
    (root / "cdi").mkdir()
    (root / "cdi" / "nvidia.yaml").write_text(json.dumps(nvidia_spec()))  # JSON is YAML
    kube = Kube(apiserver.api_client(), component="node")
    with apiserver.api_client() as api_client:
        kubelet = DraKubelet(root / "kubelet") if services is None else DraKubelet(root / "kubelet", services)
        node = DraNode(root, kube, client.CustomObjectsApi(api_client), kubelet)
        await node.start(fault)
        try:
            yield node
        finally:
            await node.stop()
            kube.close()


async def test_two_claims_limits_in_their_cdi_specs(apiserver: ApiServerStandin, root: Path) -> None:
    async with dra_node(apiserver, root) as node:
        a = node.claim("a", [share(memory="30Gi", cores="30", shareID="share-a")])
        b = node.claim("b", [share(memory="20Gi", cores="50")])
        prepared = await node.prepare(a, b)
        assert prepared[a.uid] == [
            PreparedDevice(
                ("gpu",),
                NODE,
                "gpu-0",
                (f"nvidia.com/gpu={uuid(0)}", f"vgpu.kube-vgpu.io/claim={a.uid}_gpu"),
                "share-a",
            )
        ]
        env_a, env_b = node.container(prepared[a.uid]), node.container(prepared[b.uid])
        assert (env_a["CUDA_DEVICE_MEMORY_LIMIT_0"], env_a["CUDA_DEVICE_SM_LIMIT"]) == ("30720m", "30")
        assert (env_b["CUDA_DEVICE_MEMORY_LIMIT_0"], env_b["CUDA_DEVICE_SM_LIMIT"]) == ("20480m", "50")
        assert env_a["CUDA_DEVICE_MEMORY_SHARED_CACHE"] == "/tmp/vgpu/vgpu.cache"
        config = resolve([node.cdi_dir], cdi_ids_for(prepared[a.uid], "gpu"))
        assert [n["path"] for n in config.device_nodes] == ["/dev/nvidiactl", "/dev/nvidia0"]
        cache = config.mount_at("/tmp/vgpu")
        assert cache is not None and cache["hostPath"] == f"{node.hook}/vgpu/claims/{a.uid}_gpu"
        assert is_dir(cache["hostPath"])
        assert {m["containerPath"] for m in config.mounts} == {
            "/usr/local/vgpu/libvgpu.so",
            "/tmp/vgpu",
            "/tmp/vgpulock",
            "/etc/ld.so.preload",
        }
        assert node.spec_files() == sorted(f"vgpu.kube-vgpu.io-claim_{c.uid}.json" for c in (a, b))


async def test_a_claim_with_no_capacity_gets_the_whole_card(apiserver: ApiServerStandin, root: Path) -> None:
    async with dra_node(apiserver, root) as node:
        whole = node.claim("whole", [share("gpu-3")])
        prepared = await node.prepare(whole)
        env = node.container(prepared[whole.uid])
        assert (env["CUDA_DEVICE_MEMORY_LIMIT_0"], env["CUDA_DEVICE_SM_LIMIT"]) == (f"{MIB80}m", "100")
        # ...and it holds the card: nothing else fits beside it.
        more = node.claim("more", [share("gpu-3", memory="1Mi", cores="1")])
        with pytest.raises(DraError, match=r"memory 1 MiB asked \+ 81920 MiB held by 1 other"):
            await node.prepare(more)


async def test_two_gpus_of_one_request_get_one_limit_each(apiserver: ApiServerStandin, root: Path) -> None:
    async with dra_node(apiserver, root) as node:
        pair = node.claim(
            "pair", [share("gpu-1", memory="10Gi", cores="20"), share("gpu-2", memory="12Gi", cores="40")]
        )
        devices = (await node.prepare(pair))[pair.uid]
        assert [d.cdi_device_ids[0] for d in devices] == [
            f"nvidia.com/gpu={uuid(1)}",
            f"nvidia.com/gpu={uuid(2)}",
        ]
        env = node.container(devices)
        assert (env["CUDA_DEVICE_MEMORY_LIMIT_0"], env["CUDA_DEVICE_MEMORY_LIMIT_1"]) == ("10240m", "12288m")
        assert env["CUDA_DEVICE_SM_LIMIT"] == "20"
        # Limits follow the GPUs' order in the container (PCI bus order), not the results' order.
        swapped = node.claim(
            "swapped", [share("gpu-4", memory="12Gi", cores="40"), share("gpu-3", memory="10Gi", cores="20")]
        )
        env = node.container((await node.prepare(swapped))[swapped.uid])
        assert (env["CUDA_DEVICE_MEMORY_LIMIT_0"], env["CUDA_DEVICE_MEMORY_LIMIT_1"]) == ("10240m", "12288m")


async def test_a_sub_request_is_reported_under_its_request(apiserver: ApiServerStandin, root: Path) -> None:
    async with dra_node(apiserver, root) as node:
        claim = node.claim("alt", [share("gpu-4", memory="16Gi", cores="20", request="gpu/small")])
        (device,) = (await node.prepare(claim))[claim.uid]
        assert device.request_names == ("gpu",)
        assert device.cdi_device_ids[1] == f"vgpu.kube-vgpu.io/claim={claim.uid}_gpu_small"
        assert node.container([device])["CUDA_DEVICE_MEMORY_LIMIT_0"] == "16384m"


async def test_three_30_gib_claims_on_one_80_gib_gpu(apiserver: ApiServerStandin, root: Path) -> None:
    async with dra_node(apiserver, root) as node:
        first, second = (node.claim(n, [share(memory="30Gi", cores="10")]) for n in ("c1", "c2"))
        await node.prepare(first, second)
        # A third allocation the scheduler would never make (a forged status) is the last line's to refuse.
        third = node.claim("c3", [share(memory="30Gi", cores="10")])
        with pytest.raises(DraError) as refused:
            await node.prepare(third)
        assert str(refused.value) == (
            f"NodePrepareResources failed for ResourceClaim c3: claim default/c3 (uid {third.uid}): "
            f"device gpu-0 ({uuid(0)}) would be over-committed: memory 30720 MiB asked + 61440 MiB held by "
            "2 other prepared claim(s) > 81920 MiB on the card"
        )
        assert third.uid not in node.checkpoint()
        assert f"vgpu.kube-vgpu.io-claim_{third.uid}.json" not in node.spec_files()
        # Once one of the two is unprepared, the third fits.
        await node.unprepare(first)
        await node.prepare(third)


async def test_concurrent_prepares_never_over_commit(apiserver: ApiServerStandin, root: Path) -> None:
    async with dra_node(apiserver, root) as node:
        claims = [node.claim(f"c{i}", [share("gpu-6", memory="10Gi", cores="5")]) for i in range(10)]
        outcomes = await asyncio.gather(*(node.prepare(c) for c in claims), return_exceptions=True)
        refused = [o for o in outcomes if isinstance(o, DraError)]
        assert len(refused) == 2 and all("would be over-committed" in str(o) for o in refused)
        held = node.checkpoint()
        assert len(held) == 8
        assert sum(s["memoryMiB"] for c in held.values() for s in c["shares"]) == MIB80
        assert len(node.spec_files()) == 8


async def test_prepare_and_unprepare_repeated(apiserver: ApiServerStandin, root: Path) -> None:
    async with dra_node(apiserver, root) as node:
        claim = node.claim("c", [share(memory="8Gi", cores="25")])
        first = await node.prepare(claim)
        spec = (node.cdi_dir / f"vgpu.kube-vgpu.io-claim_{claim.uid}.json").read_bytes()
        written = inode(node.cdi_dir / f"vgpu.kube-vgpu.io-claim_{claim.uid}.json")
        assert await node.prepare(claim) == first
        assert (node.cdi_dir / f"vgpu.kube-vgpu.io-claim_{claim.uid}.json").read_bytes() == spec
        assert inode(node.cdi_dir / f"vgpu.kube-vgpu.io-claim_{claim.uid}.json") == written  # not rewritten
        assert list(node.checkpoint()) == [claim.uid]
        await node.unprepare(claim)
        await node.unprepare(claim)
        assert node.spec_files() == [] and node.checkpoint() == {}
        assert not (node.hook / "vgpu" / "claims" / f"{claim.uid}_gpu").exists()
        assert (node.cdi_dir / "nvidia.yaml").exists()
        assert await node.prepare(claim) == first


async def test_prepare_and_unprepare_across_a_restart(apiserver: ApiServerStandin, root: Path) -> None:
    async with dra_node(apiserver, root) as node:
        kept = node.claim("kept", [share(memory="40Gi", cores="50")])
        gone = node.claim("gone", [share(memory="40Gi", cores="50")])
        before = await node.prepare(kept, gone)
        await node.stop()
        node.delete(gone)  # the claim may be gone from the API by the time the kubelet unprepares it
        await node.start()
        assert await node.prepare(kept) == {kept.uid: before[kept.uid]}
        # The restarted plugin still counts both shares.
        late = node.claim("late", [share(memory="1Mi", cores="1")])
        with pytest.raises(DraError, match=r"81920 MiB held by 2 other prepared claim"):
            await node.prepare(late)
        await node.unprepare(gone)
        assert gone.uid not in node.checkpoint()
        assert node.spec_files() == [f"vgpu.kube-vgpu.io-claim_{kept.uid}.json"]
        await node.prepare(late)


@pytest.mark.parametrize(
    ("result", "message"),
    [
        (share("gpu-9"), "got device 'gpu-9', which this node does not have"),
        (share("gpu-5"), f"got device gpu-5 \\({uuid(5)}\\), which is unhealthy: XID 79"),
        (share(memory="-1Gi"), "consumes memory '-1Gi', not a positive amount"),
        (share(memory="1Ei"), "which has 81920 MiB"),
        (share(cores="101"), "consumes cores '101'"),
        ({**share(), "pool": "node-2"}, "in pool 'node-2', not this node's pool 'node-1'"),
    ],
)
async def test_results_this_node_cannot_honour_are_refused(
    apiserver: ApiServerStandin, root: Path, result: dict[str, Any], message: str
) -> None:
    async with dra_node(apiserver, root) as node:
        node.cards["gpu-5"] = Card("gpu-5", uuid(5), 5, MIB80, unhealthy="XID 79")
        bad = node.claim("bad", [result])
        with pytest.raises(
            DraError, match=rf"ResourceClaim bad: claim default/bad \(uid {bad.uid}\): .*{message}"
        ):
            await node.prepare(bad)
        assert node.spec_files() == [] and node.checkpoint() == {}


async def test_the_claim_must_be_the_one_named_and_allocated(apiserver: ApiServerStandin, root: Path) -> None:
    async with dra_node(apiserver, root) as node:
        unallocated = node.claim("pending", None)
        with pytest.raises(DraError, match=r"claim default/pending \(uid .*\): not allocated"):
            await node.prepare(unallocated)
        real = node.claim("real", [share()])
        stale = ClaimId("default", "real", "0000-stale-uid")
        with pytest.raises(DraError, match=f"holds a claim of that name with uid '{real.uid}'"):
            await node.prepare(stale)
        missing = ClaimId("default", "missing", "0000-missing")
        with pytest.raises(DraError, match="not found in the API server"):
            await node.prepare(missing)


def admin_namespace(apiserver: ApiServerStandin, name: str = "ops") -> str:
    """The API server stores adminAccess allocations only in a namespace labelled for it."""
    apiserver.put(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name, "labels": {"resource.kubernetes.io/admin-access": "true"}},
        }
    )
    return name


async def test_admin_access_reaches_a_full_gpu_without_limits(
    apiserver: ApiServerStandin, root: Path
) -> None:
    ops = admin_namespace(apiserver)
    async with dra_node(apiserver, root) as node:
        await node.prepare(node.claim("whole", [share("gpu-7")]))
        monitor = node.claim("monitor", [share("gpu-7", adminAccess=True)], namespace=ops)
        (device,) = (await node.prepare(monitor))[monitor.uid]
        assert device.cdi_device_ids == (f"nvidia.com/gpu={uuid(7)}",)
        assert not any(k.startswith("CUDA_") for k in node.container([device]))
        assert f"vgpu.kube-vgpu.io-claim_{monitor.uid}.json" not in node.spec_files()
        await node.unprepare(monitor)
        assert monitor.uid not in node.checkpoint()


async def test_an_admin_access_share_holds_nothing_across_a_restart(
    apiserver: ApiServerStandin, root: Path
) -> None:
    """The monitor is prepared first and counted for nothing: a whole-card claim still fits beside
    it, before and after a plugin restart (the checkpoint keeps it as admin access); the shares it
    reports (consumedCapacity of a shared device) are ignored; unprepare removes only its entry."""
    ops = admin_namespace(apiserver)
    async with dra_node(apiserver, root) as node:
        monitor = node.claim(
            "monitor", [share("gpu-3", "80Gi", "100", adminAccess=True, shareID="s-1")], namespace=ops
        )
        before = await node.prepare(monitor)
        assert node.checkpoint()[monitor.uid]["shares"][0]["adminAccess"] is True
        assert node.checkpoint()[monitor.uid]["shares"][0]["memoryMiB"] == 0
        await node.stop()
        await node.start()
        assert await node.prepare(monitor) == before
        whole = node.claim("whole", [share("gpu-3", "80Gi", "100")])
        (device,) = (await node.prepare(whole))[whole.uid]
        assert node.container([device])["CUDA_DEVICE_MEMORY_LIMIT_0"] == "81920m"
        # The other side: a user share beside the whole card is refused as ever.
        late = node.claim("late", [share("gpu-3", "1Mi", "1")])
        with pytest.raises(DraError, match=r"81920 MiB held by 1 other prepared claim"):
            await node.prepare(late)
        await node.unprepare(monitor)
        assert list(node.checkpoint()) == [whole.uid]
        assert node.spec_files() == [f"vgpu.kube-vgpu.io-claim_{whole.uid}.json"]


async def test_a_result_marked_admin_access_whose_request_does_not_ask_it_is_refused(
    apiserver: ApiServerStandin, root: Path
) -> None:
    """The result's adminAccess would give the GPU without limits: the driver takes it only from a
    request that asks it (the request is what the API server checked against the namespace's
    label), and refuses the claim naming claim, request and device; nothing is prepared."""
    ops = admin_namespace(apiserver)
    async with dra_node(apiserver, root) as node:
        forged = node.claim(
            "forged", [share("gpu-2", "1Gi", "1", adminAccess=True)], namespace=ops, admin=False
        )
        with pytest.raises(DraError) as refused:
            await node.prepare(forged)
        message = str(refused.value)
        assert f"claim {ops}/forged (uid {forged.uid})" in message
        assert f"result for request 'gpu' on device gpu-2 ({uuid(2)}) is marked adminAccess" in message
        assert "does not ask it" in message
        assert node.checkpoint() == {} and node.spec_files() == []
        # The other side: the same result under a request that asks it is prepared without limits.
        asked = node.claim("asked", [share("gpu-2", "1Gi", "1", adminAccess=True)], namespace=ops, admin=True)
        (device,) = (await node.prepare(asked))[asked.uid]
        assert device.cdi_device_ids == (f"nvidia.com/gpu={uuid(2)}",)


@pytest.mark.parametrize("uid", ["../../x", "a/b", "", "x" * 64, "uid with space"])
async def test_a_uid_that_is_no_kubernetes_uid_is_refused_and_touches_no_file(
    apiserver: ApiServerStandin, root: Path, uid: str
) -> None:
    async with dra_node(apiserver, root) as node:
        hostile = ClaimId("default", "c", uid)
        with pytest.raises(DraError, match="is not a Kubernetes UID"):
            await node.prepare(hostile)
        with pytest.raises(DraError, match="is not a Kubernetes UID"):
            await node.unprepare(hostile)
        assert node.spec_files() == [] and node.checkpoint() == {}


async def test_other_drivers_results_are_ignored(apiserver: ApiServerStandin, root: Path) -> None:
    async with dra_node(apiserver, root) as node:
        mixed = node.claim(
            "mixed",
            [{**share("gpu-0"), "driver": "gpu.nvidia.com", "pool": "other"}, share("gpu-1", memory="1Gi")],
        )
        (device,) = (await node.prepare(mixed))[mixed.uid]
        assert device.device == "gpu-1"


async def test_a_kubelet_that_knows_only_v1beta1_gets_the_same_answers(
    apiserver: ApiServerStandin, root: Path
) -> None:
    async with dra_node(apiserver, root, services=("v1beta1.DRAPlugin",)) as node:
        assert node.kubelet.plugin(DRIVER).service == "v1beta1.DRAPlugin"
        claim = node.claim("c", [share(memory="2Gi", cores="5")])
        devices = (await node.prepare(claim))[claim.uid]
        assert node.container(devices)["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2048m"
        await node.unprepare(claim)
        assert node.spec_files() == []


class Crash(BaseException):
    """A process dying mid-prepare: nothing after the fault point runs, not even clean-up handlers."""


@pytest.mark.parametrize("step", ["checkpointed", "spec-written"])
async def test_a_crash_mid_prepare_leaves_no_half_spec_and_no_leaked_share(
    apiserver: ApiServerStandin, root: Path, step: str
) -> None:
    async with dra_node(apiserver, root) as node:
        claim = node.claim("c", [share(memory="60Gi", cores="60")])
        assert node.server is not None
        preparer = node.server.preparer

        def crash(at: str, uid: str) -> None:
            if at == step:
                raise Crash

        preparer.fault = crash
        with pytest.raises(Crash):
            await preparer.prepare([ClaimRef(claim.namespace, claim.name, claim.uid)])
        # As a killed process leaves it: a write cut short before its rename.
        (node.cdi_dir / f".vgpu.kube-vgpu.io-claim_{claim.uid}.json.deadbeef.tmp").write_text('{"cdiVer')
        await node.stop()
        assert list(node.checkpoint()) == [claim.uid]
        await node.start()
        assert not any(name.startswith(".") for name in node.spec_files())
        # The share is still held: nothing can over-commit the GPU meanwhile.
        other = node.claim("other", [share(memory="30Gi", cores="10")])
        with pytest.raises(DraError, match="61440 MiB held by 1 other"):
            await node.prepare(other)
        # The kubelet's retry completes it; its unprepare removes all of it.
        devices = (await node.prepare(claim))[claim.uid]
        assert node.container(devices)["CUDA_DEVICE_MEMORY_LIMIT_0"] == "61440m"
        await node.unprepare(claim)
        assert node.spec_files() == [] and node.checkpoint() == {}
        await node.prepare(other)


async def test_a_spec_no_share_owns_is_removed_at_start(apiserver: ApiServerStandin, root: Path) -> None:
    async with dra_node(apiserver, root) as node:
        claim = node.claim("c", [share(memory="10Gi", cores="10")])
        first = await node.prepare(claim)
        spec = node.cdi_dir / f"vgpu.kube-vgpu.io-claim_{claim.uid}.json"
        await node.stop()
        # As a crash between the two writes leaves it: the spec on disk, the share not recorded.
        path = root / "kubelet" / "plugins" / DRIVER / "checkpoint.json"
        path.write_bytes(encode(Checkpoint()))
        await node.start()
        assert not spec.exists()
        assert await node.prepare(claim) == first  # the kubelet's retry prepares it afresh
        assert list(node.checkpoint()) == [claim.uid]


async def test_a_failure_mid_prepare_is_undone(apiserver: ApiServerStandin, root: Path) -> None:
    def fail(at: str, uid: str) -> None:
        if at == "spec-written":
            raise OSError(28, "No space left on device")

    async with dra_node(apiserver, root, fault=fail) as node:
        claim = node.claim("c", [share(memory="60Gi", cores="60")])
        with pytest.raises(DraError, match=r"cannot record it on the node: .*No space left on device"):
            await node.prepare(claim)
        assert node.spec_files() == [] and node.checkpoint() == {}
        assert not (node.hook / "vgpu" / "claims" / f"{claim.uid}_gpu").exists()


async def test_a_missing_gpu_cdi_device_is_a_clear_error(apiserver: ApiServerStandin, root: Path) -> None:
    async with dra_node(apiserver, root) as node:
        (node.cdi_dir / "nvidia.yaml").unlink()
        claim = node.claim("c", [share("gpu-2")])
        with pytest.raises(
            DraError, match=f"no CDI device of kind nvidia.com/gpu for GPU {uuid(2)} \\(index 2\\)"
        ):
            await node.prepare(claim)
        assert node.spec_files() == [] and node.checkpoint() == {}


async def test_a_corrupt_checkpoint_stops_the_plugin_and_is_kept(
    apiserver: ApiServerStandin, root: Path
) -> None:
    async with dra_node(apiserver, root) as node:
        claim = node.claim("c", [share(memory="1Gi")])
        await node.prepare(claim)
        await node.stop()
        path = root / "kubelet" / "plugins" / DRIVER / "checkpoint.json"
        damaged = path.read_bytes().replace(b'"memoryMiB": 1024', b'"memoryMiB": 1')
        path.write_bytes(damaged)
        with pytest.raises(CheckpointError, match=f"{path}: checksum mismatch"):
            await node.start()
        assert path.read_bytes() == damaged
        assert node.spec_files() == [f"vgpu.kube-vgpu.io-claim_{claim.uid}.json"]
