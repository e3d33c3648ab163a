"""The demo doubles as an end-to-end test: every example pod ends as its file says, through the real parts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kube_vgpu.demo.cli import DEFAULT_EXAMPLES

REPO = Path(__file__).resolve().parents[2]


def run_demo(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBE_VGPU_")}
    return subprocess.run(
        [sys.executable, "-m", "kube_vgpu", "demo", "--once", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def edited_examples(tmp_path: Path, *edits: tuple[str, str, str]) -> Path:
    """A copy of the repository's examples with each (file, old, new) edit made: the first `old` in
    `file` (which must hold it) replaced by `new`."""
    examples = tmp_path / "examples"
    shutil.copytree(DEFAULT_EXAMPLES, examples)
    for name, old, new in edits:
        path = examples / name
        text = path.read_text()
        assert old in text, f"{name} no longer holds {old!r}"
        path.write_text(text.replace(old, new, 1))
    return examples


def test_every_example_ends_as_expected() -> None:
    result = run_demo()
    assert result.returncode == 0, result.stdout + result.stderr
    pods = sorted((DEFAULT_EXAMPLES / "pods").glob("*.yaml"))
    assert f"{len(pods)} of {len(pods)} examples ended as expected." in result.stdout
    # Each kind of outcome is shown in readable form.
    # Quota is decided by the validating phase, after the mutating one admitted the pod.
    assert "webhook /validate: DENIED: namespace team-small: vgpu-memory quota exceeded" in result.stdout
    assert "env   NVIDIA_VISIBLE_DEVICES=MIG-" in result.stdout
    assert "env   CUDA_DEVICE_MEMORY_LIMIT_0=10000m" in result.stdout
    assert 'replace /metadata/annotations/nvidia.com/use-gputype = "[NVIDIA A100-SXM4-80GB]"' in result.stdout
    assert "Traceback" not in result.stdout + result.stderr
    # Before any pod: `node check` on each simulated node, from the plugin's own code.
    checked = result.stdout.split("$ kube-vgpu node check (on each simulated node)\n", 1)[1].split("\n\n")[0]
    assert checked.splitlines() == [
        "  gpu-a100 (hami-core): OK; 4 GPU(s), 40 devices (40 healthy), HAMi-core usable",
        "  gpu-h100-mig (mig): OK; 2 GPU(s), 20 devices (20 healthy), HAMi-core not needed",
        "  gpu-node-dra (dra): OK; 3 GPU(s), 3 shared devices, sockets serving, "
        "3 GPU(s) in the NVIDIA CDI spec",
    ]
    # It ends with `kube-vgpu top`: both simulated nodes, and the quota namespace with its limit.
    top = result.stdout.split("$ kube-vgpu top\n", 1)[1].splitlines()
    assert top[0].split()[0] == "NODE" and {"gpu-a100", "gpu-h100-mig"} <= {r.split()[0] for r in top if r}
    assert any(r.split()[:1] == ["team-small"] and "/16384" in r for r in top)
    # The usage path runs too: each workload's figures are read back from the plugins' /metrics,
    # its process mapped to its container through its cgroup (MIG: per MIG device).
    usage = result.stdout.split("Usage read from NVML", 1)[1].split("$ kube-vgpu top", 1)[0]
    assert "not reported yet" not in usage
    assert "team-a/plain-slice/infer" in usage and "SM 24%" in usage
    assert "team-a/mig-slice/infer" in usage


def test_an_example_that_ends_otherwise_fails_the_run(tmp_path: Path) -> None:
    # 8000 MiB fits team-small's 16 GiB quota, so the expected denial does not happen.
    examples = edited_examples(
        tmp_path,
        ("pods/06-over-quota.yaml", 'volcano.sh/vgpu-memory: "20000"', 'volcano.sh/vgpu-memory: "8000"'),
    )
    result = run_demo("--examples", str(examples))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "expected a denial, the webhook allowed the pod" in result.stdout
    assert f"{len(list((examples / 'pods').glob('*.yaml'))) - 1} of" in result.stdout


def test_a_node_that_node_check_finds_wanting_fails_the_run(tmp_path: Path) -> None:
    # MIG turning on at the next reset: the plugin still serves (every example ends as expected),
    # but a hami-core node in that state is a problem `node check` reports, and the run says so.
    examples = edited_examples(
        tmp_path,
        (
            "nodes.yaml",
            "        count: 4\n",
            "        count: 4\n        migCapable: true\n        migPending: true\n",
        ),
    )
    result = run_demo("--examples", str(examples))
    assert result.returncode == 1, result.stdout + result.stderr
    pods = len(list((examples / "pods").glob("*.yaml")))
    assert f"{pods} of {pods} examples ended as expected." in result.stdout
    assert "  gpu-a100 (hami-core): PROBLEMS (4); 4 GPU(s)" in result.stdout
    assert "MIG mode turns on at the next GPU reset" in result.stdout
    assert "  gpu-h100-mig (mig): OK;" in result.stdout


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("nodes.yaml", "mode: hami-core", "mode: turbo"), "nodes[0].mode: expected one of hami-core, mig"),
        (("pods/01-plain-slice.yaml", "expect: allocated", "expect: maybe"), "must be allocated, denied or"),
        # A typo, a zero count and a negative size in a node's GPUs: named with the file and node
        # before anything starts (they used to surface as a traceback from inside a running plugin).
        (
            ("nodes.yaml", "memoryMiB: 81920", "memoryMB: 81920"),
            "nodes.yaml: nodes[0] (node gpu-a100): gpus[0]: unknown key 'memoryMB'",
        ),
        (
            ("nodes.yaml", "count: 4", "count: 0"),
            "nodes.yaml: nodes[0] (node gpu-a100): gpus[0].count: expected an integer >= 1, got 0",
        ),
        (
            ("nodes.yaml", "memoryMiB: 81559", "memoryMiB: -5"),
            "nodes.yaml: nodes[1] (node gpu-h100-mig): gpus[0].memoryMiB: expected an integer >= 1, got -5",
        ),
        (("nodes.yaml", "    mode: mig", "    mode: mig\n    gpu: []"), "nodes[1]: unknown key 'gpu'"),
        # A count far past any server: named before any GPU is built (it used to run out the clock).
        (
            ("nodes.yaml", "count: 4", "count: 4000"),
            "nodes[0] (node gpu-a100): gpus[0].count: 4000 more GPUs make 4000 on the node",
        ),
        # A name the API server would refuse, named up front (it used to be its traceback mid-run).
        (("nodes.yaml", "name: gpu-a100", "name: GPU_A100"), "nodes[0].name: must be a DNS subdomain"),
        # A pod the webhooks admit and the API server then refuses: named with its file.
        (
            ("pods/01-plain-slice.yaml", "  containers:", "  containerz:"),
            '01-plain-slice.yaml: the API server refuses this pod: Pod "plain-slice" is invalid: '
            "spec.containers: Required value",
        ),
        # A quantity the API server's decoder cannot read: refused before any webhook, named.
        (
            ("pods/01-plain-slice.yaml", 'volcano.sh/vgpu-number: "1"', "volcano.sh/vgpu-number: [1]"),
            '01-plain-slice.yaml: the API server refuses this pod: Pod in version "v1" cannot be handled',
        ),
        # The API server refuses a pod in a namespace that does not exist; the demo says so up front.
        (
            ("pods/01-plain-slice.yaml", "namespace: team-a", "namespace: team-z"),
            "01-plain-slice.yaml: metadata.namespace 'team-z' is not in namespaces.yaml",
        ),
    ],
)
def test_bad_example_files_are_named_with_exit_2(
    tmp_path: Path, edit: tuple[str, str, str], message: str
) -> None:
    examples = edited_examples(tmp_path, edit)
    result = run_demo("--examples", str(examples))
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_closed_stdout_ends_the_demo_quietly() -> None:
    # `kube-vgpu demo --once | head -2`: the reader leaves after two lines.
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBE_VGPU_")}
    with subprocess.Popen(
        [sys.executable, "-m", "kube_vgpu", "demo", "--once"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as demo:
        assert demo.stdout is not None and demo.stderr is not None
        first = demo.stdout.readline()
        demo.stdout.close()
        errors = demo.stderr.read()
        code = demo.wait(timeout=120)
    assert first.startswith("kube-vgpu demo:")
    assert errors == "", errors
    assert code == 141  # what a shell reports for a writer ended by a closed pipe


def test_the_dra_node_carries_each_claim_to_its_cdi_edits() -> None:
    """The DRA node group: the examples/dra/ pods from admission through the scheduler stand-in's
    allocation and the kubelet stand-in's prepare to the CDI edits their containers get."""
    result = run_demo()
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    templates = sorted((DEFAULT_EXAMPLES / "dra").glob("*.yaml"))
    assert f"1 DRA node with {len(templates)} example pod(s)" in out.splitlines()[0]
    assert f"{len(templates)} of {len(templates)} DRA examples ended as expected." in out
    pool = out.split(
        "DRA node gpu-node-dra: driver vgpu.kube-vgpu.io registered with the kubelet (v1.DRAPlugin)"
    )[1]
    assert [line.split()[:3] for line in pool.splitlines()[1:4]] == [
        ["gpu-0", "a100-sxm4-80gb", "shared"],
        ["gpu-1", "a100-sxm4-80gb", "shared"],
        ["gpu-2", "a100-sxm4-80gb", "shared"],
    ]
    sections = {s.split(" ", 1)[0]: s for s in out.split("== default/")[1:]}
    # 20 GiB at 30% cores: allocated by the scheduler stand-in, prepared into HAMi-core limits.
    slice_ = sections["train-slice"]
    assert "claim train-slice-gpu (template slice-20gi-30pct), request gpu: memory 20Gi, cores 30" in slice_
    assert "gpu -> gpu-node-dra/gpu-0: cores=30, memory=20Gi" in slice_
    assert "kubelet NodePrepareResources, gpu on gpu-0: CDI devices" in slice_
    assert "    vgpu.kube-vgpu.io/claim=" in slice_ and "    nvidia.com/gpu=GPU-" in slice_
    for line in (
        "env   CUDA_DEVICE_MEMORY_LIMIT_0=20480m",
        "env   CUDA_DEVICE_SM_LIMIT=30",
        "env   CUDA_DEVICE_MEMORY_SHARED_CACHE=/tmp/vgpu/vgpu.cache",
        "device /dev/nvidia0",
    ):
        assert f"    {line}\n" in slice_, line
    assert "    mount /usr/local/vgpu/libvgpu.so <- " in slice_ and "/vgpu-hook/libvgpu.so (ro)" in slice_
    assert "result: allocated and prepared, as expected" in slice_
    # Two shares on two GPUs for one container: a limit per GPU.
    two = sections["two-gpus"]
    assert "gpus -> gpu-node-dra/gpu-0: cores=50, memory=10Gi" in two
    assert "gpus -> gpu-node-dra/gpu-1: cores=50, memory=10Gi" in two
    assert "CUDA_DEVICE_MEMORY_LIMIT_0=10240m" in two and "CUDA_DEVICE_MEMORY_LIMIT_1=10240m" in two
    assert "device /dev/nvidia0" in two and "device /dev/nvidia1" in two
    # The whole GPU: the one card no share holds, all of it.
    whole = sections["train-whole"]
    assert "request gpu: no capacity named: the whole GPU" in whole
    assert "gpu -> gpu-node-dra/gpu-2: cores=100, memory=80Gi" in whole
    assert "CUDA_DEVICE_MEMORY_LIMIT_0=81920m" in whole and "CUDA_DEVICE_SM_LIMIT=100" in whole
    # Over team-small's memory label: the claim is refused by the validating webhook as it is made.
    over = out.split("== team-small/too-big-slice")[1].split("\n== ")[0]
    assert (
        "result: denied, as expected: claim refused by the webhook: ResourceClaim too-big-slice-gpu: "
        "namespace team-small: vgpu-memory quota exceeded: requested 40960 MiB, in use 0 MiB of 16384 MiB"
    ) in over
    assert "scheduler" not in over
    assert "webhook: pod allowed by /mutate (no patch) and /validate\n" in over
    assert "(the pod is created and stays Pending: the claim controller retries its claim)" in over
    assert "webhook: claim allowed by /validate\n" in slice_


def test_a_dra_example_that_cannot_be_allocated_fails_the_run(tmp_path: Path) -> None:
    # 100 GiB: more than any of the node's 80 GB cards.
    examples = edited_examples(tmp_path, ("dra/slice-20gi-30pct.yaml", "memory: 20Gi", "memory: 100Gi"))
    result = run_demo("--examples", str(examples))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "result: NOT as expected (allocated and prepared): not allocated: request gpu:" in result.stdout
    assert "3 of 4 DRA examples ended as expected." in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_a_dra_example_file_without_its_pod_exits_2(tmp_path: Path) -> None:
    examples = tmp_path / "examples"
    shutil.copytree(DEFAULT_EXAMPLES, examples)
    whole = examples / "dra" / "whole-gpu.yaml"
    whole.write_text(whole.read_text().split("\n---\n")[0])
    result = run_demo("--examples", str(examples))
    assert result.returncode == 2, result.stdout + result.stderr
    assert (
        "kube-vgpu demo: dra/whole-gpu.yaml: holds ResourceClaimTemplate; it must hold one "
        "ResourceClaimTemplate and one Pod that uses it"
    ) in result.stderr


def test_dra_examples_pass_the_webhooks_as_in_a_cluster(tmp_path: Path) -> None:
    # The pod through both phases, the claim its template makes through the validating one: an
    # isolation rule refuses a pod, and a namespace's memory label refuses a claim.
    examples = edited_examples(
        tmp_path,
        # team-small may take 16384 MiB; a whole GPU is charged as the largest card (80 GiB).
        ("dra/whole-gpu.yaml", "  name: train-whole\n", "  name: train-whole\n  namespace: team-small\n"),
        (
            "dra/two-slices-distinct-gpus.yaml",
            "      resources:\n",
            "      securityContext: {privileged: true}\n      resources:\n",
        ),
    )
    result = run_demo("--examples", str(examples))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "claim refused by the webhook: " in result.stdout and "vgpu-memory quota exceeded" in result.stdout
    assert "pod refused by the webhook (validate): " in result.stdout and "privileged" in result.stdout
    assert "2 of 4 DRA examples ended as expected." in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_a_dra_example_expected_denied_that_is_admitted_fails_the_run(tmp_path: Path) -> None:
    # 10 GiB: within team-small's 16 GiB.
    examples = edited_examples(tmp_path, ("dra/over-quota.yaml", "memory: 40Gi", "memory: 10Gi"))
    result = run_demo("--examples", str(examples))
    assert result.returncode == 1, result.stdout + result.stderr
    assert (
        "result: NOT as expected (a refusal containing 'vgpu-memory quota exceeded: requested 40960 MiB, "
        "in use 0 MiB of 16384 MiB'): allocated and prepared"
    ) in result.stdout
    assert "4 of 4 DRA examples" not in result.stdout  # its GPU share then crowds out the whole GPU too


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            ("expect: denied", "expect: pending"),
            "annotation demo.kube-vgpu.io/expect is 'pending'; a DRA example is allocated (the default: its "
            "claim allocated and prepared) or denied",
        ),
        (
            ("demo.kube-vgpu.io/expect: denied", "demo.kube-vgpu.io/expected: denied"),
            "annotation demo.kube-vgpu.io/expected is not one a DRA example takes",
        ),
        (
            ("resourceClaimTemplateName: slice-40gi", "resourceClaimTemplateName: slice-4gi"),
            "the Pod names the ResourceClaimTemplate 'slice-40gi' in 0 of its spec.resourceClaims",
        ),
        (
            ("  annotations:\n", "  annotations: bad\n  labels:\n"),
            "metadata.annotations: expected a mapping of text to text (quote numbers), got 'bad'",
        ),
        (
            ("  name: too-big-slice\n", "  name: [too-big-slice]\n"),
            "metadata.name: expected a string, got ['too-big-slice']",
        ),
        (
            ("namespace: team-small", "namespace: team-x"),
            "metadata.namespace 'team-x' is not in namespaces.yaml (which lists team-a, team-small) and is "
            "not 'default'",
        ),
    ],
)
def test_a_dra_example_mistake_is_named_before_anything_starts(
    tmp_path: Path, edit: tuple[str, str], message: str
) -> None:
    examples = edited_examples(tmp_path, ("dra/over-quota.yaml", *edit))
    result = run_demo("--examples", str(examples))
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"kube-vgpu demo: dra/over-quota.yaml: {message}" in result.stderr
    assert result.stdout == ""  # nothing started
