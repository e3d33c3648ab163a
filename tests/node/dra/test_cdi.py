"""kube-vgpu's CDI specs (one per claim, atomic) and the GPUs' own CDI devices."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from kube_vgpu.node.dra import cdi
from kube_vgpu.node.dra.cdi import CdiError, GpuDevices, SpecDir, parse_spec, qualified, read_spec_file
from kube_vgpu.node.dra.limits import Edits, Mount

EDITS = {
    "gpu": Edits(("CUDA_DEVICE_SM_LIMIT=30",), (Mount("/h/libvgpu.so", "/usr/local/vgpu/libvgpu.so", True),))
}


def nvidia_spec(names: list[str], kind: str = "nvidia.com/gpu") -> dict[str, Any]:
    # The shape `nvidia-ctk cdi generate` writes: a device per GPU, shared edits at the top.
    return {
        "cdiVersion": "0.5.0",
        "kind": kind,
        "devices": [
            {"name": n, "containerEdits": {"deviceNodes": [{"path": f"/dev/nvidia{i}"}]}}
            for i, n in enumerate(names)
        ],
        "containerEdits": {"deviceNodes": [{"path": "/dev/nvidiactl"}]},
    }


def test_one_spec_per_claim_named_by_its_uid(tmp_path: Path) -> None:
    specs = SpecDir(tmp_path)
    path = specs.write("0b6e-uid", EDITS)
    assert path.name == "vgpu.kube-vgpu.io-claim_0b6e-uid.json"
    spec = read_spec_file(path)
    assert spec["kind"] == "vgpu.kube-vgpu.io/claim"
    assert spec["devices"] == [
        {
            "name": "0b6e-uid_gpu",
            "containerEdits": {
                "env": ["CUDA_DEVICE_SM_LIMIT=30"],
                "mounts": [
                    {
                        "hostPath": "/h/libvgpu.so",
                        "containerPath": "/usr/local/vgpu/libvgpu.so",
                        "options": ["ro", "nosuid", "nodev", "bind"],
                    }
                ],
            },
        }
    ]
    assert specs.claim_uids() == {"0b6e-uid"}
    assert specs.remove("0b6e-uid") and not specs.remove("0b6e-uid")
    assert list(tmp_path.iterdir()) == []


def test_a_sub_request_gets_a_cdi_legal_name() -> None:
    assert (
        qualified("vgpu.kube-vgpu.io/claim", cdi.device_name("u", "gpu/big"))
        == "vgpu.kube-vgpu.io/claim=u_gpu_big"
    )


def test_a_write_cut_short_leaves_no_spec_and_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    specs = SpecDir(tmp_path)
    specs.write("u", EDITS)
    before = (tmp_path / "vgpu.kube-vgpu.io-claim_u.json").read_bytes()

    def broken(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(OSError, match="No space"):
        specs.write("u", {"other": EDITS["gpu"]})
    with pytest.raises(OSError, match="No space"):
        specs.write("v", EDITS)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vgpu.kube-vgpu.io-claim_u.json"]
    assert (tmp_path / "vgpu.kube-vgpu.io-claim_u.json").read_bytes() == before


def test_leftover_temporary_files_are_removed_and_others_kept(tmp_path: Path) -> None:
    (tmp_path / ".vgpu.kube-vgpu.io-claim_u.json.1a2b3c4d.tmp").write_text("{")
    (tmp_path / "nvidia.yaml").write_text("x")
    removed = SpecDir(tmp_path).remove_leftovers()
    assert [p.name for p in removed] == [".vgpu.kube-vgpu.io-claim_u.json.1a2b3c4d.tmp"]
    assert [p.name for p in tmp_path.iterdir()] == ["nvidia.yaml"]


@pytest.mark.parametrize("kind", ["vgpu", "/claim", "a/", "-a/b", "a/b c", "a/b/c"])
def test_bad_kinds_are_refused(kind: str) -> None:
    with pytest.raises(CdiError, match="is not vendor/class"):
        cdi.split_kind(kind)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ([], "a CDI spec is a mapping"),
        ({"kind": "a/b", "devices": []}, "cdiVersion is missing"),
        ({"cdiVersion": "0.5.0", "kind": "a/b"}, "devices is missing"),
        ({"cdiVersion": "0.5.0", "kind": "a/b", "devices": []}, "devices is missing, empty"),
        ({"cdiVersion": "0.5.0", "kind": "a/b", "devices": [{"name": "x"}]}, "containerEdits is missing"),
        (
            {"cdiVersion": "0.5.0", "kind": "a/b", "devices": [{"name": "a/b", "containerEdits": {}}]},
            "characters",
        ),
        (
            {
                "cdiVersion": "0.5.0",
                "kind": "a/b",
                "devices": [{"name": "x", "containerEdits": {"env": ["=v"]}}],
            },
            "NAME=VALUE",
        ),
        (
            {"cdiVersion": "0.5.0", "kind": "a/b", "devices": [{"name": "x", "containerEdits": {}}] * 2},
            "defined twice",
        ),
    ],
)
def test_malformed_specs_are_refused_naming_the_field(document: object, message: str) -> None:
    with pytest.raises(CdiError, match=message):
        parse_spec(document, "f.json")


def test_the_gpu_device_by_uuid_when_named_so_else_by_index(tmp_path: Path) -> None:
    (tmp_path / "nvidia.json").write_text(json.dumps(nvidia_spec(["0", "GPU-aaaa", "all"])))
    (tmp_path / "k8s.nvidia.com-device.yaml").write_text(
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n"
        "- name: '1'\n  containerEdits: {deviceNodes: [{path: /dev/nvidia1}]}\n"
    )
    (tmp_path / "type-index.json").write_text(json.dumps(nvidia_spec(["gpu2"])))
    gpus = GpuDevices([tmp_path])
    assert gpus.device_id("GPU-aaaa", 0) == "nvidia.com/gpu=GPU-aaaa"
    assert gpus.device_id("GPU-bbbb", 1) == "nvidia.com/gpu=1"
    assert gpus.device_id("GPU-cccc", 2) == "nvidia.com/gpu=gpu2"  # --device-name-strategy=type-index


def test_a_gpu_with_no_cdi_device_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "nvidia.json").write_text(json.dumps(nvidia_spec(["0"])))
    (tmp_path / "other.json").write_text(json.dumps(nvidia_spec(["1"], kind="example.com/gpu")))
    (tmp_path / "broken.yaml").write_text("kind: [")
    with pytest.raises(CdiError) as error:
        GpuDevices([tmp_path]).device_id("GPU-cccc", 2)
    message = str(error.value)
    assert "no CDI device of kind nvidia.com/gpu for GPU GPU-cccc (index 2)" in message
    assert "devices found: 0" in message
    assert "broken.yaml: not valid YAML" in message
    assert "nvidia-ctk cdi generate" in message


def test_the_gpu_kind_is_configurable_and_changes_are_read(tmp_path: Path) -> None:
    gpus = GpuDevices([tmp_path], "example.com/gpu")
    with pytest.raises(CdiError, match="devices found: none"):
        gpus.device_id("GPU-aaaa", 0)
    (tmp_path / "example.json").write_text(json.dumps(nvidia_spec(["GPU-aaaa"], kind="example.com/gpu")))
    assert gpus.device_id("GPU-aaaa", 0) == "example.com/gpu=GPU-aaaa"
    (tmp_path / "example.json").unlink()
    with pytest.raises(CdiError, match="devices found: none"):
        gpus.device_id("GPU-aaaa", 0)


def test_an_oversized_spec_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    path.write_bytes(b" " * (cdi.MAX_SPEC_BYTES + 1))
    with pytest.raises(CdiError, match="larger than"):
        read_spec_file(path)


def test_gpu_specs_are_read_from_every_folder(tmp_path: Path) -> None:
    etc, run = tmp_path / "etc", tmp_path / "run"
    etc.mkdir()
    run.mkdir()
    (etc / "nvidia.yaml").write_text(json.dumps(nvidia_spec(["GPU-aaaa"])))
    (run / "k8s.json").write_text(json.dumps(nvidia_spec(["1"])))
    gpus = GpuDevices([etc, run])
    assert gpus.device_id("GPU-aaaa", 0) == "nvidia.com/gpu=GPU-aaaa"
    assert gpus.device_id("GPU-bbbb", 1) == "nvidia.com/gpu=1"
    with pytest.raises(CdiError, match=f"in {etc}, {run}"):
        gpus.device_id("GPU-cccc", 2)


def test_kube_vgpus_own_claim_specs_are_not_read_for_gpu_devices(tmp_path: Path) -> None:
    """Claim specs share /var/run/cdi with the GPUs' spec: they are left unread (a broken one is no
    problem, and one claiming the GPU kind adds no device), so a prepare never reads them all."""
    (tmp_path / "nvidia.json").write_text(json.dumps(nvidia_spec(["0"])))
    (tmp_path / cdi.spec_file_name("uid-broken")).write_text("{")
    (tmp_path / cdi.spec_file_name("uid-forged")).write_text(json.dumps(nvidia_spec(["GPU-ffff"])))
    gpus = GpuDevices([tmp_path])
    assert gpus.device_id("GPU-aaaa", 0) == "nvidia.com/gpu=0"
    with pytest.raises(CdiError) as error:
        gpus.device_id("GPU-ffff", 3)
    assert "devices found: 0)" in str(error.value) and "unreadable" not in str(error.value)
    (tmp_path / "other-vendor_uid.json").write_text(json.dumps(nvidia_spec(["GPU-ffff"])))
    assert gpus.device_id("GPU-ffff", 3) == "nvidia.com/gpu=GPU-ffff"  # only our own prefix is skipped


def test_a_yaml_spec_is_refused_in_one_line_for_a_syntax_error_or_a_key_given_twice(tmp_path: Path) -> None:
    path = tmp_path / "nvidia.yaml"
    path.write_text("cdiVersion: 0.5.0\nkind: [\n")
    with pytest.raises(CdiError) as info:
        read_spec_file(path)
    assert str(info.value).startswith(f"{path}: not valid YAML: ") and "\n" not in str(info.value)
    path.write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\nkind: example.com/gpu\ndevices: []\n")
    with pytest.raises(CdiError) as info:
        read_spec_file(path)
    assert str(info.value) == (
        f"{path}: not valid YAML: key 'kind' given twice (lines 2 and 3): keep one of them"
    )
