"""The claims this node has prepared, on disk: what NodeUnprepareResources must undo (after a restart,
after the claim is gone from the API) and what the over-commit check counts.

One JSON file, written atomically (temporary file, fsync, rename) and carrying a format version and a
checksum of its data, as the kubelet's own checkpoints do (pkg/kubelet/checkpointmanager: a checkpoint
whose checksum does not match is refused as corrupt). A file that cannot be read is never overwritten:
loading raises `CheckpointError` naming the file and the problem, and the plugin does not start on a
guess, since forgetting a prepared share would let the next claim over-commit its GPU.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from kube_vgpu.node.dra.cdi import write_atomic
from kube_vgpu.node.dra.limits import ClaimRef, Share

CHECKPOINT_KIND: Final = "KubeVgpuDRACheckpoint"
VERSION: Final = 1
FILE_NAME: Final = "checkpoint.json"
MAX_BYTES: Final = 64 * 1024 * 1024


class CheckpointError(Exception):
    """The checkpoint file cannot be used; the message names the file and what is wrong."""


@dataclass(frozen=True)
class PreparedClaim:
    """One claim as prepared on this node (its share is held from the moment it is recorded: a claim
    whose prepare a crash cut short holds it until the kubelet prepares it again or unprepares it)."""

    ref: ClaimRef
    shares: tuple[Share, ...]


@dataclass
class Checkpoint:
    """Prepared claims by uid."""

    claims: dict[str, PreparedClaim] = field(default_factory=dict)


def _share_json(share: Share) -> dict[str, Any]:
    out: dict[str, Any] = {
        "request": share.request,
        "device": share.device,
        "gpuUUID": share.gpu_uuid,
        "memoryMiB": share.memory_mib,
        "cores": share.cores,
    }
    if share.share_id is not None:
        out["shareID"] = share.share_id
    if share.admin:
        out["adminAccess"] = True
    return out


def _data(checkpoint: Checkpoint) -> dict[str, Any]:
    return {
        "claims": {
            uid: {
                "namespace": c.ref.namespace,
                "name": c.ref.name,
                "shares": [_share_json(s) for s in c.shares],
            }
            for uid, c in sorted(checkpoint.claims.items())
        }
    }


def checksum(data: Mapping[str, Any]) -> str:
    """sha256 of the data's canonical JSON (sorted keys, no spaces)."""
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def encode(checkpoint: Checkpoint) -> bytes:
    """The file's bytes."""
    data = _data(checkpoint)
    document = {"kind": CHECKPOINT_KIND, "version": VERSION, "checksum": checksum(data), "data": data}
    return json.dumps(document, indent=1, sort_keys=True).encode() + b"\n"


def _need(value: object, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(value, kind) or isinstance(value, bool):
        raise CheckpointError(f"{where} is missing or malformed")
    return value


def decode(raw: bytes, where: str) -> Checkpoint:
    """Parse the file's bytes; CheckpointError naming `where` and the problem."""
    try:
        document = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(f"{where}: not JSON ({exc}); the file is kept as it is") from None
    if not isinstance(document, dict) or document.get("kind") != CHECKPOINT_KIND:
        raise CheckpointError(f"{where}: not a kube-vgpu DRA checkpoint (kind is not {CHECKPOINT_KIND})")
    if document.get("version") != VERSION:
        raise CheckpointError(
            f"{where}: checkpoint version {document.get('version')!r}, this plugin reads version {VERSION}"
        )
    data = document.get("data")
    if not isinstance(data, dict) or document.get("checksum") != checksum(data):
        raise CheckpointError(
            f"{where}: checksum mismatch (the file was changed or cut short); the file is kept as it is"
        )
    out = Checkpoint()
    for uid, entry in _need(data.get("claims"), dict, f"{where}: data.claims").items():
        at = f"{where}: claim {uid}"
        _need(entry, dict, at)
        shares = []
        for i, s in enumerate(_need(entry.get("shares"), list, f"{at} shares")):
            _need(s, dict, f"{at} shares[{i}]")
            share_id = s.get("shareID")
            shares.append(
                Share(
                    request=_need(s.get("request"), str, f"{at} shares[{i}].request"),
                    device=_need(s.get("device"), str, f"{at} shares[{i}].device"),
                    gpu_uuid=_need(s.get("gpuUUID"), str, f"{at} shares[{i}].gpuUUID"),
                    memory_mib=_need(s.get("memoryMiB"), int, f"{at} shares[{i}].memoryMiB"),
                    cores=_need(s.get("cores"), int, f"{at} shares[{i}].cores"),
                    share_id=share_id if isinstance(share_id, str) else None,
                    admin=s.get("adminAccess") is True,
                )
            )
        ref = ClaimRef(
            _need(entry.get("namespace"), str, f"{at} namespace"),
            _need(entry.get("name"), str, f"{at} name"),
            uid,
        )
        out.claims[uid] = PreparedClaim(ref, tuple(shares))
    return out


class CheckpointFile:
    """The checkpoint in its folder (the plugin's folder under the kubelet's plugins folder)."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / FILE_NAME

    def load(self) -> Checkpoint:
        """The saved checkpoint; an empty one when there is no file yet."""
        try:
            with open(self.path, "rb") as file:
                raw = file.read(MAX_BYTES + 1)
        except FileNotFoundError:
            return Checkpoint()
        except OSError as exc:
            raise CheckpointError(f"{self.path}: cannot read: {exc.strerror}") from None
        if len(raw) > MAX_BYTES:
            raise CheckpointError(f"{self.path}: larger than {MAX_BYTES} bytes; the file is kept as it is")
        return decode(raw, str(self.path))

    def save(self, checkpoint: Checkpoint) -> None:
        """Replace the file atomically."""
        os.makedirs(self.path.parent, exist_ok=True)
        write_atomic(self.path, encode(checkpoint))
