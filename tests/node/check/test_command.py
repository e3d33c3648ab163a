"""`kube-vgpu node check` on simulated nodes (A100, H100 with MIG on and off, two GPUs): what it
prints, its exit codes, the flags it shares with `kube-vgpu node`, and that it only ever reads."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kube_vgpu.cli.main import main
from kube_vgpu.contract.config import Config, NodeConfig
from kube_vgpu.contract.mig.shipped import default_device_config
from kube_vgpu.node.check.report import CheckSettings, check_node
from kube_vgpu.standins.hamicore import install_placeholder
from kube_vgpu.standins.nvml.api import load_simulation

NODE = "gpu-node-1"
A100 = "NVIDIA A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"
V100 = "Tesla V100-PCIE-32GB"
UUID_A = "GPU-1c2d3e4f-0a1b-2c3d-4e5f-60718293a4b5"
UUID_B = "GPU-9f8e7d6c-5b4a-3928-1706-f5e4d3c2b1a0"


@pytest.fixture
def kubelet(kdir: Path) -> Iterator[Path]:
    """A device-plugin folder holding a listening kubelet socket (a real one, as the kubelet makes)."""
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(kdir / "kubelet.sock"))
    listener.listen()
    try:
        yield kdir
    finally:
        listener.close()


class Node:
    """A simulated node on disk: simulation file, configuration with its hookPath, kubelet folder."""

    def __init__(self, tmp: Path, kubelet_dir: Path, gpus: list[dict[str, Any]]) -> None:
        self.tmp = tmp
        self.hook = tmp / "hook"
        self.kubelet_dir = kubelet_dir
        self.sim = tmp / "sim.yaml"
        self.sim.write_text(yaml.safe_dump({"gpus": gpus}))
        self.config = tmp / "config.yaml"
        self.config.write_text(yaml.safe_dump({"node": {"hookPath": str(self.hook)}}))

    def argv(self, *extra: str) -> list[str]:
        return [
            "node",
            "check",
            f"--node-name={NODE}",
            f"--simulate={self.sim}",
            f"--config={self.config}",
            f"--kubelet-dir={self.kubelet_dir}",
            *extra,
        ]


def run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def report_of(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, dict[str, Any], str]:
    code, out, err = run(capsys, [*argv, "-o", "json"])
    return code, json.loads(out), err


def a100(**flags: Any) -> list[dict[str, Any]]:
    return [{"model": A100, "migCapable": True, "uuids": [UUID_A], **flags}]


def h100(**flags: Any) -> list[dict[str, Any]]:
    return [{"model": H100, "migCapable": True, "uuids": [UUID_A], **flags}]


# --- what it prints -----------------------------------------------------------------------------------


def test_a100_ready_for_hami_core(tmp_path: Path, kubelet: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = Node(tmp_path, kubelet, a100())
    install_placeholder(node.hook)
    code, out, err = run(capsys, node.argv())
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"kube-vgpu node check: node {NODE}, mode hami-core"
    assert lines[2] == "driver 550.54.15, NVML 12.550.54.15, CUDA 12.4"
    assert f"GPU 0  {A100}  {UUID_A}  81920 MiB" in lines
    assert "  MIG: capable, mode off" in lines
    profiles = next(line for line in lines if line.startswith("  MIG profiles: "))
    assert "1g.10gb 9728 MiB x7" in profiles and "7g.80gb 80896 MiB x1" in profiles
    assert f"HAMi-core in {node.hook} (needed): usable" in lines
    size = (node.hook / "libvgpu.so").stat().st_size
    assert f"  libvgpu.so: present, {size} bytes, readable" in lines
    assert f"kubelet socket {kubelet / 'kubelet.sock'}: present" in lines
    assert "  volcano.sh/vgpu-number: 10 devices (10 healthy) through the kubelet" in lines
    assert "  volcano.sh/vgpu-memory: 81920 (node capacity)" in lines
    assert "  volcano.sh/vgpu-cores: 100 (node capacity)" in lines
    assert lines[-1] == "OK: this node can serve hami-core"


def test_h100_with_mig_on(tmp_path: Path, kubelet: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = Node(tmp_path, kubelet, h100(migEnabled=True, migInstances=["3g.40gb"]))
    install_placeholder(node.hook)
    # Served in mig mode: fine, and the existing MIG device is listed with its profile and memory.
    code, report, err = report_of(capsys, node.argv("--mode=mig"))
    assert (code, err, report["problems"]) == (0, "", [])
    (gpu,) = report["gpus"]
    assert (gpu["name"], gpu["memoryMiB"], gpu["migMode"]) == (H100, 81559, {"current": 1, "pending": 1})
    (instance,) = gpu["instances"]
    (device,) = instance["computeInstances"]
    assert instance["profile"] == "3g.40gb" and device["migUuid"].startswith("MIG-")
    assert device["memoryMiB"] == next(p["memoryMiB"] for p in gpu["profiles"] if p["name"] == "3g.40gb")
    assert report["hamiCore"]["needed"] is False
    assert report["wouldAdvertise"]["registerRecords"][0]["mode"] == "mig"
    assert isinstance(gpu["plans"], dict) and gpu["plans"]  # the shipped geometry, planned on it
    code, out, _ = run(capsys, node.argv("--mode=mig"))
    assert f"  MIG devices: {device['migUuid']} (3g.40gb, GI {instance['gpuInstanceId']} CI 0," in out

    # The same GPU in a hami-core group: CUDA gets no compute on a MIG-enabled GPU.
    code, out, err = run(capsys, node.argv())
    assert code == 1
    assert "has MIG mode on" in out and "nvidia-smi -i 0 -mig 0" in out
    assert err.count("\n") == 1 and err.startswith(f"node {NODE} cannot serve hami-core: GPU 0 ")


def test_h100_with_mig_off(tmp_path: Path, kubelet: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = Node(tmp_path, kubelet, h100())
    install_placeholder(node.hook)
    code, out, _ = run(capsys, node.argv())
    assert code == 0 and "  MIG: capable, mode off" in out and "MIG devices" not in out
    code, report, err = report_of(capsys, node.argv("--mode=mig"))
    assert code == 1
    (problem,) = report["problems"]
    assert "MIG mode is off" in problem and "nvidia-smi -i 0 -mig 1" in problem
    assert err == f"node {NODE} cannot serve mig: GPU {UUID_A}: {problem.split(': ', 1)[1]}\n"


def test_h100_with_mig_turning_on_at_the_next_reset(
    tmp_path: Path, kubelet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node = Node(tmp_path, kubelet, h100(migPending=True))
    install_placeholder(node.hook)
    code, out, _ = run(capsys, node.argv())
    assert code == 1
    assert "  MIG: capable, mode off, on after the next GPU reset" in out
    assert "MIG mode turns on at the next GPU reset" in out


def test_two_gpu_node(tmp_path: Path, kubelet: Path, capsys: pytest.CaptureFixture[str]) -> None:
    node = Node(
        tmp_path, kubelet, [{"model": V100, "memoryMiB": 32768, "count": 2, "uuids": [UUID_A, UUID_B]}]
    )
    install_placeholder(node.hook)
    code, report, _ = report_of(capsys, node.argv())
    assert code == 0
    assert [(g["index"], g["uuid"], g["migMode"]) for g in report["gpus"]] == [
        (0, UUID_A, "not supported"),
        (1, UUID_B, "not supported"),
    ]
    advertised = report["wouldAdvertise"]
    assert (advertised["devices"], advertised["healthyDevices"]) == (20, 20)
    assert advertised["capacity"] == {"volcano.sh/vgpu-memory": "65536", "volcano.sh/vgpu-cores": "200"}
    assert [(r["uuid"], r["count"], r["memoryMiB"]) for r in advertised["registerRecords"]] == [
        (UUID_A, 10, 32768),
        (UUID_B, 10, 32768),
    ]
    assert report["labels"]["gpu-model.kube-vgpu.io/Tesla-V100-PCIE-32GB"] == "true"
    code, out, _ = run(capsys, node.argv())
    assert out.count("  MIG: not supported") == 2


# --- what stops a node, and the exit codes --------------------------------------------------------------


def test_missing_hami_core_fails_a_hami_core_node_only(
    tmp_path: Path, kubelet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node = Node(tmp_path, kubelet, h100(migEnabled=True))
    code, report, err = report_of(capsys, node.argv())
    assert code == 1
    assert report["hamiCore"]["ready"] is False
    assert [f["present"] for f in report["hamiCore"]["files"]] == [False, False]
    # What the plugin would do about it: nothing offered.
    assert report["wouldAdvertise"]["capacity"]["volcano.sh/vgpu-memory"] == "0"
    assert report["wouldAdvertise"]["healthyDevices"] == 0
    assert any(str(node.hook) in p and "node.hamiCoreInstaller.enabled=true" in p for p in report["problems"])
    assert err.count("\n") == 1
    # A MIG node does not need it.
    code, report, err = report_of(capsys, node.argv("--mode=mig"))
    assert (code, err) == (0, "")
    assert report["wouldAdvertise"]["capacity"]["volcano.sh/vgpu-memory"] == "81559"


def test_missing_or_fake_kubelet_socket(
    tmp_path: Path, kdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node = Node(tmp_path, kdir, a100())
    install_placeholder(node.hook)
    code, out, err = run(capsys, node.argv())
    assert code == 1 and f"kubelet socket {kdir / 'kubelet.sock'}: missing" in out
    assert "--kubelet-dir" in err
    (kdir / "kubelet.sock").write_text("")
    code, out, err = run(capsys, node.argv())
    assert code == 1 and "present but not a socket" in out and "is not a socket" in err


def test_a_serving_plugin_is_noticed(
    tmp_path: Path, kubelet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node = Node(tmp_path, kubelet, a100())
    install_placeholder(node.hook)
    _, report, _ = report_of(capsys, node.argv())
    assert report["kubelet"]["pluginSocket"]["present"] is False
    (kubelet / "kube-vgpu-vgpu-number.sock").write_text("")
    _, report, _ = report_of(capsys, node.argv())
    assert report["kubelet"]["pluginSocket"]["present"] is True


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("sim", "cannot read simulation file"),
        ("config", "unknown key"),
        ("device-config", "cannot read --device-config"),
    ],
)
def test_bad_input_exits_2(
    tmp_path: Path, kubelet: Path, capsys: pytest.CaptureFixture[str], change: str, message: str
) -> None:
    node = Node(tmp_path, kubelet, a100())
    extra: list[str] = []
    if change == "sim":
        node.sim.unlink()
    elif change == "config":
        node.config.write_text("node: {nope: 1}\n")
    else:
        extra = [f"--device-config={tmp_path / 'absent.yaml'}"]
    code, out, err = run(capsys, node.argv(*extra))
    assert (code, out) == (2, "")
    assert message in err and "Traceback" not in err


def test_without_a_driver_it_says_so(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # The real pynvml: with no NVIDIA driver (as where the tests usually run), NVML cannot start.
    code, out, err = run(capsys, ["node", "check", f"--kubelet-dir={tmp_path}"])
    if "cannot initialise NVML" in err:
        assert (code, out) == (1, "") and err.count("\n") == 1
    else:  # a machine with a driver: a report, whatever it says
        assert code in (0, 1) and out.startswith("kube-vgpu node check: node ")


# --- the flags it shares with `kube-vgpu node` --------------------------------------------------------


def test_flags_before_check_and_variables_reach_it(
    tmp_path: Path, kubelet: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    node = Node(tmp_path, kubelet, h100(migEnabled=True))
    monkeypatch.setenv("KUBE_VGPU_MODE", "mig")
    monkeypatch.setenv("KUBE_VGPU_SIMULATE", str(node.sim))
    monkeypatch.setenv("KUBE_VGPU_NODE_NAME", "from-env")
    # The variables, as the DaemonSet's pod sets them: `kubectl exec ... kube-vgpu node check`.
    base = [f"--config={node.config}", f"--kubelet-dir={kubelet}"]
    _, report, _ = report_of(capsys, ["node", "check", *base])
    assert (report["node"], report["mode"]) == ("from-env", "mig")
    # A flag before `check` wins over the variable, and one after `check` too.
    _, report, _ = report_of(capsys, ["node", "--mode=hami-core", "check", *base])
    assert report["mode"] == "hami-core"
    _, report, _ = report_of(capsys, ["node", "check", "--mode=hami-core", *base])
    assert report["mode"] == "hami-core"
    _, report, _ = report_of(capsys, ["node", "--node-name=before", "check", *base])
    assert report["node"] == "before"


def test_serving_still_needs_a_node_name(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, ["node", "--simulate=x.yaml"])
    assert code == 2 and "required: --node-name" in err


# --- it only reads --------------------------------------------------------------------------------------


class Recorder:
    """The simulated NVML, with every NVML function called through it recorded by name."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self.called: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._nvml, name)
        if name.startswith("nvml") and callable(value):
            self.called.add(name)
        return value


READS = ("nvmlDeviceGet", "nvmlSystemGet", "nvmlGpuInstanceGet")


@pytest.mark.parametrize("mode", ["hami-core", "mig"])
def test_the_check_calls_only_nvml_queries(tmp_path: Path, kubelet: Path, mode: str) -> None:
    nvml = load_simulation(
        {
            "gpus": [
                *h100(migEnabled=True, migInstances=["3g.40gb", "1g.10gb"]),
                {"model": V100, "memoryMiB": 32768},
            ]
        },
        NODE,
    )
    nvml.nvmlInit()
    try:
        recorder = Recorder(nvml)
        settings = CheckSettings(
            node_name=NODE,
            mode=mode,
            kubelet_dir=kubelet,
            config=Config(node=NodeConfig(hook_path=str(tmp_path))),
            nvml_source="test",
            geometry=default_device_config(),
        )
        before = json.dumps(check_node(nvml, settings)["gpus"])
        report = check_node(recorder, settings)
        assert json.dumps(report["gpus"]) == before  # nothing moved
        assert recorder.called and all(name.startswith(READS) for name in recorder.called), recorder.called
        assert "nvmlDeviceGetMigDeviceHandleByIndex" in recorder.called  # it did look at MIG devices
    finally:
        nvml.nvmlShutdown()
