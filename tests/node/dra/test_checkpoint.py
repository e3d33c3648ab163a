"""The prepared-claims checkpoint: versioned, checksummed, atomic; a bad file is refused and kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kube_vgpu.node.dra.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointFile,
    PreparedClaim,
    checksum,
    encode,
)
from kube_vgpu.node.dra.limits import ClaimRef, Share

CLAIM = PreparedClaim(
    ClaimRef("team-a", "slice", "uid-1"),
    (
        Share("gpu", "gpu-0", "GPU-aaaa", 30720, 30, "share-1"),
        Share("gpu", "gpu-1", "GPU-bbbb", 81920, 100),
        Share("watch", "gpu-1", "GPU-bbbb", 0, 0, admin=True),
    ),
)


def test_round_trip(tmp_path: Path) -> None:
    file = CheckpointFile(tmp_path)
    assert file.load() == Checkpoint()
    file.save(Checkpoint({"uid-1": CLAIM}))
    assert file.load() == Checkpoint({"uid-1": CLAIM})
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.json"]
    document = json.loads(file.path.read_bytes())
    assert (document["kind"], document["version"]) == ("KubeVgpuDRACheckpoint", 1)


def corrupt(tmp_path: Path, raw: bytes) -> CheckpointFile:
    file = CheckpointFile(tmp_path)
    file.path.write_bytes(raw)
    return file


def edited(change: str) -> bytes:
    document = json.loads(encode(Checkpoint({"uid-1": CLAIM})))
    if change == "checksum":
        document["data"]["claims"]["uid-1"]["shares"][0]["memoryMiB"] = 1
    elif change == "version":
        document["version"] = 2
    elif change == "shares":
        document["data"]["claims"]["uid-1"]["shares"] = {"gpu": 1}
        document["checksum"] = checksum(document["data"])
    elif change == "kind":
        document["kind"] = "Other"
    return json.dumps(document).encode()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{not json", "not JSON"),
        (b"", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (edited("checksum"), "checksum mismatch"),
        (edited("version"), "checkpoint version 2, this plugin reads version 1"),
        (edited("shares"), "claim uid-1 shares is missing or malformed"),
        (edited("kind"), "not a kube-vgpu DRA checkpoint"),
        (encode(Checkpoint({"uid-1": CLAIM}))[:-40], "not JSON"),
    ],
)
def test_a_hostile_file_is_a_clear_error_and_is_kept(tmp_path: Path, raw: bytes, message: str) -> None:
    file = corrupt(tmp_path, raw)
    with pytest.raises(CheckpointError, match=message) as error:
        file.load()
    assert str(file.path) in str(error.value)
    assert file.path.read_bytes() == raw


def test_wrong_types_inside_a_checksummed_file_are_refused(tmp_path: Path) -> None:
    data = {"claims": {"u": {"namespace": "n", "name": "c", "shares": [{"request": "r"}]}}}
    document = {"kind": "KubeVgpuDRACheckpoint", "version": 1, "checksum": checksum(data), "data": data}
    with pytest.raises(CheckpointError, match=r"claim u shares\[0\].device is missing or malformed"):
        corrupt(tmp_path, json.dumps(document).encode()).load()
