"""The `--simulate` document: flattening, default UUIDs, and the messages bad files get."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kube_vgpu.standins.nvml.config import WHOLE_GPU, SimulationError, default_gpu_uuid, parse_simulation

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
UUID_RE = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")

SPEC_EXAMPLE = """
gpus:
  - model: NVIDIA A100-SXM4-80GB
    memoryMiB: 81920
    count: 2
    migCapable: true
    migEnabled: false
  - model: Tesla V100-PCIE-32GB
    memoryMiB: 32768
events:
  - {after: 30, gpu: 0, xid: 79}
"""


def test_spec_example_flattens_counts_into_indexed_gpus() -> None:
    spec = parse_simulation(SPEC_EXAMPLE, "node-a")
    assert [(g.index, g.model, g.memory_mib) for g in spec.gpus] == [
        (0, "NVIDIA A100-SXM4-80GB", 81920),
        (1, "NVIDIA A100-SXM4-80GB", 81920),
        (2, "Tesla V100-PCIE-32GB", 32768),
    ]
    assert spec.gpus[0].mig_capable and not spec.gpus[2].mig_capable
    (event,) = spec.events
    assert (event.after, event.gpu, event.xid, event.lost) == (30.0, 0, 79, None)
    assert event.gpu_instance_id == WHOLE_GPU


def test_default_uuids_are_full_length_stable_and_per_node() -> None:
    first = parse_simulation(SPEC_EXAMPLE, "node-a")
    again = parse_simulation(SPEC_EXAMPLE, "node-a")
    other = parse_simulation(SPEC_EXAMPLE, "node-b")
    uuids = [g.uuid for g in first.gpus]
    assert all(UUID_RE.fullmatch(u) for u in uuids)
    assert len(set(uuids)) == 3
    assert uuids == [g.uuid for g in again.gpus]
    assert set(uuids).isdisjoint(g.uuid for g in other.gpus)
    assert uuids[1] == default_gpu_uuid("node-a", 1)


def test_given_uuids_and_known_model_memory_default() -> None:
    text = "gpus:\n  - {model: NVIDIA H200, count: 2, uuids: [GPU-aaaa-1, GPU-bbbb-2]}\n"
    spec = parse_simulation(text, "n")
    assert [g.uuid for g in spec.gpus] == ["GPU-aaaa-1", "GPU-bbbb-2"]
    assert spec.gpus[0].memory_mib == 143771


def test_a_parsed_mapping_is_accepted() -> None:
    spec = parse_simulation({"gpus": [{"model": "NVIDIA H100 80GB HBM3", "migCapable": True}]}, "n")
    assert spec.gpus[0].mig_capable


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("gpus:\n  - {model: X, memoryMiB: -5}\n", r"gpus\[0\]\.memoryMiB: expected an integer >= 1, got -5"),
        (
            "gpus:\n  - {model: X, memoryMiB: 10, count: 0}\n",
            r"gpus\[0\]\.count: expected an integer >= 1, got 0",
        ),
        (
            "gpus:\n  - {model: X}\n",
            r"gpus\[0\]: missing key 'memoryMiB' \(the simulator does not know 'X'\)",
        ),
        ("gpus:\n  - {memoryMiB: 10}\n", r"gpus\[0\]: missing key 'model'"),
        (
            "gpus:\n  - {model: Tesla T4, memoryMiB: 15360, migCapable: true}\n",
            r"gpus\[0\]\.model: no MIG profiles for 'Tesla T4' \(migCapable needs one of: NVIDIA A100",
        ),
        ("gpus:\n  - {model: NVIDIA H200, migEnabled: true}\n", "migEnabled and migPending need migCapable"),
        ("gpus:\n  - {model: NVIDIA H200, migEnable: true}\n", r"gpus\[0\]: unknown key 'migEnable'"),
        ("gpus:\n  - {model: NVIDIA H200, migCapable: yes please}\n", r"migCapable: expected true or false"),
        ("gpus:\n  - {model: NVIDIA H200, count: 2, uuids: [GPU-a]}\n", r"uuids: 1 UUIDs for count 2"),
        ("gpus:\n  - {model: NVIDIA H200, uuids: [gpu-a]}\n", r"uuids\[0\]: 'gpu-a' must start with GPU-"),
        ("gpus:\n  - {model: NVIDIA H200, uuids: ['GPU-a:1']}\n", r"hold no space or , : ; \[ \]"),
        (
            "gpus:\n  - {model: NVIDIA H200, count: 2, uuids: [GPU-a, GPU-a]}\n",
            "duplicate GPU UUID 'GPU-a' \\(GPUs 0 and 1\\)",
        ),
        ("gpus:\n  - {model: NVIDIA H200, count: 2, uuids: [GPU-a, GPU-ab]}\n", "contain one another"),
        (
            "gpus:\n  - {model: NVIDIA H200, migCapable: true, migInstances: [3g.71gb]}\n",
            "instances need migEnabled: true",
        ),
        (
            "gpus:\n  - {model: NVIDIA H200, migCapable: true, migEnabled: true, migInstances: [3g.40gb]}\n",
            r"migInstances\[0\]: NVIDIA H200 has no MIG profile '3g.40gb'",
        ),
        (
            "gpus:\n  - {model: NVIDIA H200, count: 2}\nevents:\n  - {after: 1, gpu: 2, xid: 79}\n",
            r"events\[0\]\.gpu: 2 is not a GPU index \(the file describes 2 GPUs: 0\.\.1\)",
        ),
        (
            "gpus: []\nevents:\n  - {after: -1, gpu: 0, xid: 79}\n",
            r"events\[0\]\.after: expected seconds >= 0",
        ),
        ("gpus:\n  - {model: NVIDIA H200}\nevents:\n  - {after: 1, gpu: 0}\n", "needs 'xid' or 'lost'"),
        (
            "gpus:\n  - {model: NVIDIA H200}\nevents:\n  - {after: 1, gpu: 0, xid: 79, foo: 1}\n",
            "unknown key 'foo'",
        ),
        ("nodes: []\n", "simulation file: unknown key 'nodes'"),
        ("events: []\n", "missing key 'gpus'"),
        ("gpus: [unclosed\n", "not valid YAML"),
        ("- 1\n", "simulation file: expected a mapping, got list"),
    ],
)
def test_bad_files_name_the_key_and_value(text: str, fragment: str) -> None:
    with pytest.raises(SimulationError, match=fragment):
        parse_simulation(text, "node-a")


def test_a_node_holds_at_most_64_gpus_of_at_most_int32_mib() -> None:
    # Volcano keeps a GPU's memory as an int32 (DeviceInfo.Devmem); 64 GPUs is four times the largest
    # server. Past either bound a typo used to build millions of GPUs or register a size Volcano
    # cannot read; both are named instead.
    most = parse_simulation(
        "gpus:\n  - {model: X, memoryMiB: 2147483647, count: 60}\n  - {model: Y, memoryMiB: 1, count: 4}\n",
        "n",
    )
    assert len(most.gpus) == 64 and most.gpus[0].memory_mib == 2147483647
    with pytest.raises(
        SimulationError,
        match=r"gpus\[0\]\.memoryMiB: expected an integer <= 2147483647 \(Volcano reads GPU memory as a "
        r"32-bit number\), got 2147483648",
    ):
        parse_simulation("gpus:\n  - {model: X, memoryMiB: 2147483648}\n", "n")
    with pytest.raises(
        SimulationError, match=r"gpus\[1\]\.count: 5 more GPUs make 65 on the node; a node holds at most 64"
    ):
        parse_simulation(
            "gpus:\n  - {model: X, memoryMiB: 1, count: 60}\n  - {model: Y, memoryMiB: 1, count: 5}\n", "n"
        )
    with pytest.raises(SimulationError, match=r"gpus\[0\]\.count: 10000000 more GPUs make 10000000"):
        parse_simulation("gpus:\n  - {model: X, memoryMiB: 1, count: 10000000}\n", "n")


def test_empty_events_key_means_no_events_and_node_name_is_required() -> None:
    assert parse_simulation("gpus: []\nevents:\n", "n").events == ()
    with pytest.raises(SimulationError, match="node name"):
        parse_simulation("gpus: []\n", "")


@pytest.mark.parametrize("name", ["simulate-a100.yaml", "simulate-h100-mig.yaml"])
def test_example_files_are_valid(name: str) -> None:
    spec = parse_simulation((EXAMPLES / name).read_text(), "demo-node")
    assert spec.gpus and all(UUID_RE.fullmatch(g.uuid) for g in spec.gpus)
    if "mig" in name:
        assert [(g.model, g.mig_enabled) for g in spec.gpus] == [("NVIDIA H100 80GB HBM3", True)] * 2
    else:
        assert [g.model for g in spec.gpus] == ["NVIDIA A100-SXM4-80GB"] * 4
