"""MIG through the pynvml surface (simulated): reading state, creating and destroying, inspection."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from kube_vgpu.contract.mig.geometry import MigGroup, MigInstanceType
from kube_vgpu.node.mig.inspect import describe_mig, main
from kube_vgpu.node.mig.layout import LayoutActions, plan_group
from kube_vgpu.node.mig.nvml import MigNvmlError, apply_actions, destroy_all, read_state
from kube_vgpu.standins.nvml.api import SimProcess, load_simulation
from tests.support.node import NODE
from tests.support.node_mig import A100_40, GPU_0, mig_sim

GROUP2 = MigGroup("group2", (MigInstanceType("2g.10gb", 9856, 3), MigInstanceType("1g.5gb", 4864, 1)))


def test_mode_of_gpus_without_mig_off_and_pending() -> None:
    plain = load_simulation({"gpus": [{"model": "Tesla V100-PCIE-32GB", "memoryMiB": 32768}]}, NODE)
    plain.nvmlInit()
    state = read_state(plain, plain.gpus[0].uuid)
    assert not state.mode.supported and state.profiles == {} and state.instances == ()
    off = read_state(mig_sim(mig_enabled=False), GPU_0)
    assert (off.mode.current, off.mode.pending, off.mode.enabled) == (0, 0, False)
    assert "2g.10gb" in off.profiles  # profiles are readable before MIG is on
    pending = read_state(mig_sim(mig_enabled=False, migPending=True), GPU_0)
    assert (pending.mode.current, pending.mode.pending, pending.mode.enabled) == (0, 1, False)


def test_a_plan_is_created_with_its_placements_and_read_back() -> None:
    nvml = mig_sim()
    state = read_state(nvml, GPU_0)
    plan = plan_group(GROUP2, state.profiles)
    apply_actions(nvml, state, LayoutActions(create=plan.instances), node_name=NODE, reason="test")
    after = read_state(nvml, GPU_0)
    assert [(o.start, o.size) for o in after.instances] == [(0, 2), (2, 2), (4, 2), (6, 1)]
    assert all(len(o.compute) == 1 and o.compute[0].full for o in after.instances)
    assert [o.compute[0].memory_mib for o in after.instances] == [9856, 9856, 9856, 4864]
    assert len({o.compute[0].mig_uuid for o in after.instances}) == 4
    destroy_all(nvml, after, node_name=NODE, reason="test")
    assert read_state(nvml, GPU_0).instances == ()


def test_instances_a_process_runs_on_are_not_destroyed() -> None:
    nvml = mig_sim(migInstances=["3g.20gb", "3g.20gb"])
    state = read_state(nvml, GPU_0)
    busy = state.instances[1]
    nvml.set_processes(0, [SimProcess(4242, 1 << 30, busy.gi_id, busy.compute[0].ci_id)])
    with pytest.raises(MigNvmlError, match=f"process 4242 still runs on GPU instance {busy.gi_id}"):
        destroy_all(nvml, state, node_name=NODE, reason="test")
    assert read_state(nvml, GPU_0).instances == state.instances  # nothing went


def test_a_failed_create_names_the_gpu_and_the_step() -> None:
    nvml = mig_sim(migInstances=["7g.40gb"])
    state = read_state(nvml, GPU_0)
    plan = plan_group(GROUP2, state.profiles)
    with pytest.raises(MigNvmlError, match=rf"GPU {GPU_0}: creating 2g\.10gb at placement 0:2 failed"):
        apply_actions(nvml, state, LayoutActions(create=plan.instances), node_name=NODE, reason="test")


def test_describe_mig_reports_mode_profiles_instances_and_device_order() -> None:
    nvml = mig_sim(migInstances=["3g.20gb"])
    report = describe_mig(nvml)
    (gpu,) = report["gpus"]
    assert (gpu["uuid"], gpu["name"], gpu["migMode"]) == (GPU_0, A100_40, {"current": 1, "pending": 1})
    profile = next(p for p in gpu["profiles"] if p["name"] == "3g.20gb")
    assert (profile["memoryMiB"], profile["placements"]) == (19968, [[0, 4], [4, 4]])
    (instance,) = gpu["instances"]
    assert instance["profile"] == "3g.20gb" and instance["computeInstances"][0]["migUuid"].startswith("MIG-")
    assert gpu["migDeviceOrder"][0] == [instance["gpuInstanceId"], 0]
    json.dumps(report)  # plain data


def test_mig_inspect_runs_over_a_simulation_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "sim.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "gpus": [
                    {"model": A100_40, "migCapable": True},
                    {"model": "Tesla V100-PCIE-32GB", "memoryMiB": 32768},
                ]
            }
        )
    )
    assert main([], load_simulation(path, NODE)) == 0
    report = json.loads(capsys.readouterr().out)
    assert [g["migMode"] for g in report["gpus"]] == [{"current": 0, "pending": 0}, "not supported"]
    assert "instances" not in report["gpus"][0]  # MIG is off: nothing to list
    # The built-in geometry's groups, planned on this GPU's profiles.
    assert report["gpus"][0]["plans"]["group2"] == [
        [0, "2g.10gb", 0, 2, 9856],
        [1, "2g.10gb", 2, 2, 9856],
        [2, "2g.10gb", 4, 2, 9856],
        [3, "1g.5gb", 6, 1, 4864],
    ]


def test_mig_inspect_plans_a_given_device_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sim = tmp_path / "sim.yaml"
    sim.write_text(yaml.safe_dump({"gpus": [{"model": A100_40, "migCapable": True, "migEnabled": True}]}))
    config = tmp_path / "device-config.yaml"
    config.write_text(
        "nvidia:\n  knownMigGeometries:\n  - models: [A100-SXM4-40GB]\n    allowedGeometries:\n"
        "    - group: ok\n      geometries:\n"
        "      - {name: 4g.20gb, memory: 19968, count: 1}\n"
        "      - {name: 3g.20gb, memory: 19968, count: 1}\n"
        "    - group: bad\n      geometries: [{name: 3g.20gb, memory: 19968, count: 3}]\n"
    )
    assert main(["--device-config", str(config)], load_simulation(sim, NODE)) == 0
    plans = json.loads(capsys.readouterr().out)["gpus"][0]["plans"]
    assert plans["ok"] == [[0, "4g.20gb", 0, 4, 19968], [1, "3g.20gb", 4, 4, 19968]]
    assert "at most 2" in plans["bad"]["error"]
    config.write_text("nvidia: [")
    assert main(["--device-config", str(config)], load_simulation(sim, NODE)) == 2
    assert "cannot use --device-config" in capsys.readouterr().err


def test_mig_inspect_over_the_real_nvml_reports_or_says_why_not(capsys: pytest.CaptureFixture[str]) -> None:
    # With no NVIDIA driver (as on the machines the tests usually run on) the real pynvml cannot
    # initialise; with one, the report is printed.
    code = main([])
    out, err = capsys.readouterr()
    if code == 1:
        assert "cannot initialise NVML" in err and out == ""
    else:
        assert code == 0 and "gpus" in json.loads(out)
