"""NodePrepareResources and NodeUnprepareResources: one implementation, served to the kubelet through
two thin servicers, one per DRA API version it may choose (v1, v1beta1).

Prepare reads the ResourceClaim from the API server, decides with `node.dra.limits`, and makes the
claim's shares (in the checkpoint) and its CDI spec durable before answering: a crash at any point
leaves no half-written spec, and either a checkpointed share whose spec the kubelet's next prepare (or
unprepare) completes (or removes), or a spec no share owns, removed at the next start. Both calls are
idempotent, as the kubelet repeats them (pkg/kubelet/cm/dra/manager.go), and answer an entry for every
claim asked.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from grpc import aio

from kube_vgpu.kubeapi.client import ApiError, ApiUnavailable
from kube_vgpu.node.dra.cdi import CdiError, GpuDevices, SpecDir, device_name, qualified
from kube_vgpu.node.dra.checkpoint import Checkpoint, CheckpointError, CheckpointFile, PreparedClaim
from kube_vgpu.node.dra.limits import (
    Card,
    ClaimRef,
    ClaimRefused,
    Edits,
    Share,
    admin_requests,
    allocation_results,
    base_request,
    by_request,
    cache_host_dir,
    check_fit,
    check_uid,
    own_results,
    request_edits,
    shares,
)
from kube_vgpu.proto import dra_v1_pb2 as v1
from kube_vgpu.proto import dra_v1_pb2_grpc as v1_grpc
from kube_vgpu.proto import dra_v1beta1_pb2 as v1beta1
from kube_vgpu.proto import dra_v1beta1_pb2_grpc as v1beta1_grpc

log = logging.getLogger("kube_vgpu.node.dra")

ReadClaim = Callable[[str, str], Awaitable[Mapping[str, Any] | None]]


# Called with (step, claim uid) between the steps of a prepare; tests inject a failure there.
Fault = Callable[[str, str], None]


def no_fault(step: str, claim_uid: str) -> None:
    return None


@dataclass(frozen=True)
class PreparedDevice:
    """One device of a prepared claim, as the kubelet is told."""

    request: str
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None


@dataclass(frozen=True)
class PrepareResult:
    """The answer for one claim: its devices, or why it could not be prepared."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


@dataclass
class Preparer:
    """Prepares and unprepares this node's claims of one driver."""

    driver: str
    pool: str
    cards: Callable[[], Mapping[str, Card]]
    read_claim: ReadClaim
    specs: SpecDir
    gpu_devices: GpuDevices
    checkpoint_file: CheckpointFile
    hook_path: str
    lock_dir: str
    fault: Fault = no_fault
    _checkpoint: Checkpoint = field(default_factory=Checkpoint)
    # Decisions are taken one at a time on the loop; the checkpoint is written from threads, one
    # at a time, each write carrying the latest decided state.
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _file_lock: threading.Lock = field(default_factory=threading.Lock)

    def load(self) -> None:
        """Read the checkpoint (CheckpointError when it cannot be used: the plugin must not start) and
        clear what a crash may have left: temporary spec files, and specs no checkpointed claim owns."""
        self._checkpoint = self.checkpoint_file.load()
        for path in self.specs.remove_leftovers():
            log.info("event=cdi_temp_removed path=%s", path)
        for uid in self.specs.claim_uids() - set(self._checkpoint.claims):
            self.specs.remove(uid)
            log.info("event=cdi_orphan_removed claim_uid=%s", uid)

    @property
    def prepared(self) -> Mapping[str, PreparedClaim]:
        """The claims in the checkpoint, by uid."""
        return dict(self._checkpoint.claims)

    def _persist(self) -> None:
        """Write the claims as now decided (from a thread). The dict is replaced, never changed in
        place, so the snapshot taken here is a whole state."""
        with self._file_lock:
            self.checkpoint_file.save(Checkpoint(dict(self._checkpoint.claims)))

    async def prepare(self, refs: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        """Prepare every claim; each gets its devices or its error."""
        out: dict[str, PrepareResult] = {}
        for ref in refs:
            try:
                out[ref.uid] = PrepareResult(await self._prepare_one(ref))
            except (ClaimRefused, CdiError) as exc:
                out[ref.uid] = PrepareResult(error=str(exc))
            except (ApiError, ApiUnavailable) as exc:
                out[ref.uid] = PrepareResult(error=f"claim {ref}: cannot read it from the API server: {exc}")
            except (OSError, CheckpointError) as exc:
                out[ref.uid] = PrepareResult(error=f"claim {ref}: cannot record it on the node: {exc}")
            if out[ref.uid].error:
                log.warning(
                    "event=claim_refused node=%s claim=%s error=%r", self.pool, ref, out[ref.uid].error
                )
        return out

    async def _prepare_one(self, ref: ClaimRef) -> tuple[PreparedDevice, ...]:
        check_uid(ref)
        results: list[Mapping[str, Any]] | None = None
        admin: frozenset[str] = frozenset()
        if ref.uid not in self._checkpoint.claims:
            claim = await self.read_claim(ref.namespace, ref.name)
            if claim is None:
                raise ClaimRefused(f"claim {ref}: not found in the API server")
            results = own_results(allocation_results(claim, ref), driver=self.driver, pool=self.pool, ref=ref)
            admin = admin_requests(claim)
        async with self._lock:
            cards = self.cards()
            known = self._checkpoint.claims.get(ref.uid)
            if known is None:
                if results is None:
                    raise ClaimRefused(
                        f"claim {ref}: unprepared while it was being prepared; prepare it again"
                    )
                held = shares(results, cards, ref, admin)
                check_fit(ref, held, {u: c.shares for u, c in self._checkpoint.claims.items()}, cards)
            else:
                held = list(known.shares)
            devices = self._devices(held, cards, ref)
            edits = {
                request: request_edits(
                    # CUDA numbers a container's GPUs in PCI bus order (NVML's index order), and
                    # HAMi-core's CUDA_DEVICE_MEMORY_LIMIT_<i> follows CUDA's numbering.
                    sorted(group, key=lambda s: cards[s.device].index),
                    hook_path=self.hook_path,
                    lock_dir=self.lock_dir,
                    cache_dir=cache_host_dir(self.hook_path, ref.uid, request),
                )
                for request, group in by_request(held).items()
            }
            if known is None:
                # Held from here on: a decision taken while the writes below run counts it.
                self._checkpoint = Checkpoint(
                    {**self._checkpoint.claims, ref.uid: PreparedClaim(ref, tuple(held))}
                )
            try:
                await self._record(ref, edits, new=known is None)
            except Exception:
                if known is None:
                    await self._undo(ref.uid, held)
                raise
        log.info(
            "event=claim_prepared node=%s claim=%s devices=%s",
            self.pool,
            ref,
            ",".join(f"{s.device}:{s.memory_mib}MiB:{s.cores}%" for s in held),
        )
        return devices

    async def _record(self, ref: ClaimRef, edits: Mapping[str, Edits], *, new: bool) -> None:
        """Make the claim's share and its CDI spec durable before the kubelet hears of them. The two
        writes go to disk side by side (each costs a journal commit; together they cost about one):
        a crash between them leaves a share the kubelet's retry completes, or a spec no share owns,
        which the next start removes (the kubelet retries a prepare it got no answer to)."""

        def save_share() -> None:
            if new:
                self._persist()
            self.fault("checkpointed", ref.uid)

        def write_spec() -> None:
            # A claim with nothing to limit (admin access only) has no device of ours: no spec, as a
            # CDI spec must define at least one device.
            if edits:
                for request in edits:
                    self._make_dir(cache_host_dir(self.hook_path, ref.uid, request))
                self._make_dir(self.lock_dir)
                self.specs.write(ref.uid, edits)
            self.fault("spec-written", ref.uid)

        outcomes = await asyncio.gather(
            asyncio.to_thread(save_share), asyncio.to_thread(write_spec), return_exceptions=True
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    def _devices(
        self, held: Sequence[Share], cards: Mapping[str, Card], ref: ClaimRef
    ) -> tuple[PreparedDevice, ...]:
        out = []
        first: set[str] = set()
        for share in held:
            card = cards.get(share.device)
            if card is None:
                raise ClaimRefused(
                    f"claim {ref}: device {share.device} ({share.gpu_uuid}) is gone from this node"
                )
            ids = [self.gpu_devices.device_id(card.uuid, card.index)]
            # kube-vgpu's device carries the limits of every GPU of the request: given once per request.
            if not share.admin and share.request not in first:
                first.add(share.request)
                ids.append(qualified(self.specs.kind, device_name(ref.uid, share.request)))
            out.append(PreparedDevice(share.request, self.pool, share.device, tuple(ids), share.share_id))
        return tuple(out)

    @staticmethod
    def _make_dir(path: str) -> None:
        # World writable: the containers' own users write HAMi-core's shared cache and lock there, as
        # with the device plugin's folders.
        os.makedirs(path, exist_ok=True)
        os.chmod(path, 0o777)

    async def _undo(self, uid: str, held: Sequence[Share]) -> None:
        """Remove what prepare made for a claim: its spec and folders, and its checkpoint entry (side
        by side, as prepare writes them)."""

        def remove_files() -> None:
            self.specs.remove(uid)
            for request in by_request(held):
                shutil.rmtree(cache_host_dir(self.hook_path, uid, request), ignore_errors=True)

        forget = uid in self._checkpoint.claims
        if forget:
            self._checkpoint = Checkpoint({u: c for u, c in self._checkpoint.claims.items() if u != uid})

        def forget_share() -> None:
            if forget:
                self._persist()

        outcomes = await asyncio.gather(
            asyncio.to_thread(remove_files), asyncio.to_thread(forget_share), return_exceptions=True
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    async def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, str]:
        """Undo what prepare made for each claim (nothing to undo is success); uid -> error or ""."""
        out: dict[str, str] = {}
        for ref in refs:
            try:
                check_uid(ref)
            except ClaimRefused as exc:
                out[ref.uid] = str(exc)
                continue
            async with self._lock:
                known = self._checkpoint.claims.get(ref.uid)
                try:
                    await self._undo(ref.uid, known.shares if known else ())
                    out[ref.uid] = ""
                except (OSError, CheckpointError) as exc:
                    out[ref.uid] = f"claim {ref}: cannot remove what was prepared for it: {exc}"
                    log.warning(
                        "event=claim_unprepare_failed node=%s claim=%s error=%r", self.pool, ref, str(exc)
                    )
                    continue
            if known is not None:
                log.info("event=claim_unprepared node=%s claim=%s", self.pool, ref)
        return out


def _refs(claims: Sequence[v1.Claim] | Sequence[v1beta1.Claim]) -> list[ClaimRef]:
    return [ClaimRef(c.namespace, c.name, c.uid) for c in claims]


class DraV1(v1_grpc.DRAPluginServicer):
    """`k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`."""

    def __init__(self, preparer: Preparer) -> None:
        self._preparer = preparer

    async def NodePrepareResources(
        self,
        request: v1.NodePrepareResourcesRequest,
        context: aio.ServicerContext[v1.NodePrepareResourcesRequest, v1.NodePrepareResourcesResponse],
    ) -> v1.NodePrepareResourcesResponse:
        results = await self._preparer.prepare(_refs(request.claims))
        response = v1.NodePrepareResourcesResponse()
        for uid, result in results.items():
            entry = response.claims[uid]
            entry.error = result.error
            for d in result.devices:
                device = entry.devices.add(
                    request_names=[base_request(d.request)],
                    pool_name=d.pool,
                    device_name=d.device,
                    cdi_device_ids=d.cdi_device_ids,
                )
                if d.share_id is not None:
                    device.share_id = d.share_id
        return response

    async def NodeUnprepareResources(
        self,
        request: v1.NodeUnprepareResourcesRequest,
        context: aio.ServicerContext[v1.NodeUnprepareResourcesRequest, v1.NodeUnprepareResourcesResponse],
    ) -> v1.NodeUnprepareResourcesResponse:
        errors = await self._preparer.unprepare(_refs(request.claims))
        response = v1.NodeUnprepareResourcesResponse()
        for uid, error in errors.items():
            response.claims[uid].error = error
        return response


class DraV1beta1(v1beta1_grpc.DRAPluginServicer):
    """`k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin`: the same answers in v1beta1's messages."""

    def __init__(self, preparer: Preparer) -> None:
        self._preparer = preparer

    async def NodePrepareResources(
        self,
        request: v1beta1.NodePrepareResourcesRequest,
        context: aio.ServicerContext[
            v1beta1.NodePrepareResourcesRequest, v1beta1.NodePrepareResourcesResponse
        ],
    ) -> v1beta1.NodePrepareResourcesResponse:
        results = await self._preparer.prepare(_refs(request.claims))
        response = v1beta1.NodePrepareResourcesResponse()
        for uid, result in results.items():
            entry = response.claims[uid]
            entry.error = result.error
            for d in result.devices:
                entry.devices.add(
                    request_names=[base_request(d.request)],
                    pool_name=d.pool,
                    device_name=d.device,
                    cdi_device_ids=d.cdi_device_ids,
                )
        return response

    async def NodeUnprepareResources(
        self,
        request: v1beta1.NodeUnprepareResourcesRequest,
        context: aio.ServicerContext[
            v1beta1.NodeUnprepareResourcesRequest, v1beta1.NodeUnprepareResourcesResponse
        ],
    ) -> v1beta1.NodeUnprepareResourcesResponse:
        errors = await self._preparer.unprepare(_refs(request.claims))
        response = v1beta1.NodeUnprepareResourcesResponse()
        for uid, error in errors.items():
            response.claims[uid].error = error
        return response


def add_to_server(preparer: Preparer, server: aio.Server) -> None:
    """Serve both versions on `server`."""
    v1_grpc.add_DRAPluginServicer_to_server(DraV1(preparer), server)
    v1beta1_grpc.add_DRAPluginServicer_to_server(DraV1beta1(preparer), server)
