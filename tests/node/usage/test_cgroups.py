"""Reading a process's pod UID and container ID from its cgroup text, in every shape runtimes write,
and surviving whatever else the text holds."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kube_vgpu.node.usage.cgroups import MAX_CGROUP_TEXT, CgroupIds, parse_cgroup, read_proc_cgroup

UID = "5f0c3a1e-8b2d-4c6f-9a7e-1d2b3c4d5e6f"
UID_ = UID.replace("-", "_")
CID = "3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a"


@pytest.mark.parametrize(
    "text",
    [
        # cgroup v2, systemd driver, containerd
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
        # cgroup v2, guaranteed QoS (no QoS slice), CRI-O
        f"0::/kubepods.slice/kubepods-pod{UID_}.slice/crio-{CID}.scope\n",
        # cgroup v1, systemd driver, docker; the pod's line is not the first
        "12:pids:/system.slice/docker.service\n"
        f"11:memory:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/docker-{CID}.scope\n",
        # cgroup v1, cgroupfs driver: UID with '-', bare container ID
        f"4:devices:/kubepods/burstable/pod{UID}/{CID}\n",
        # cgroupfs driver with CRI-O's prefix
        f"0::/kubepods/besteffort/pod{UID}/crio-{CID}\n",
        # relative to the reader's cgroup namespace (the plugin's own cgroup hides the root)
        f"0::/../../kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
        # nested under another manager (kind, systemd in a container)
        f"0::/system.slice/docker-aaaa.scope/kubelet.slice/kubepods.slice/kubepods-pod{UID_}.slice/"
        f"cri-containerd-{CID}.scope",
    ],
)
def test_every_runtime_and_driver_shape_names_the_pod_and_container(text: str) -> None:
    assert parse_cgroup(text) == CgroupIds(UID, CID)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "0::/\n",
        "0::/user.slice/user-1000.slice/session-3.scope\n",  # a host process
        "0::/system.slice/containerd.service\n",
        # CRI-O's monitor process lives beside the container, not in it
        f"0::/kubepods.slice/kubepods-pod{UID_}.slice/crio-conmon-{CID}.scope\n",
        # an unknown runtime's scope
        f"0::/kubepods.slice/kubepods-pod{UID_}.slice/podman-{CID}.scope\n",
        # the pod's own cgroup, not a container's (a process in the pod sandbox)
        f"0::/kubepods.slice/kubepods-pod{UID_}.slice\n",
        # a container ID of the wrong length
        f"0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID[:-1]}.scope\n",
        # not a UUID
        "0::/kubepods.slice/kubepods-podnot-a-uid.slice/cri-containerd-" + CID + ".scope\n",
        "garbage without colons",
        "\x00\xff:\n::::\n",
    ],
)
def test_texts_that_name_no_pod_container_give_nothing(text: str) -> None:
    assert parse_cgroup(text) is None


def test_a_huge_text_is_read_only_up_to_its_bound() -> None:
    line = f"0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope\n"
    assert parse_cgroup("x" * (MAX_CGROUP_TEXT + 1) + "\n" + line) is None
    # thousands of lines before the real one: only the first lines are looked at
    assert parse_cgroup("1:cpu:/\n" * 100_000 + line) is None
    assert parse_cgroup("1:cpu:/\n" * 10 + line) == CgroupIds(UID, CID)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=2000))
def test_any_text_parses_without_raising(text: str) -> None:
    result = parse_cgroup(text)
    assert result is None or isinstance(result, CgroupIds)


def test_the_proc_reader_reads_the_file_and_answers_none_for_a_missing_process(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_bytes(b"0::/x\n\xff\n")
    assert read_proc_cgroup(42, tmp_path) == "0::/x\n\ufffd\n"
    assert read_proc_cgroup(43, tmp_path) is None
    (tmp_path / "44").mkdir()
    (tmp_path / "44" / "cgroup").write_bytes(b"a" * (MAX_CGROUP_TEXT * 4))
    text = read_proc_cgroup(44, tmp_path)
    assert text is not None and len(text) == MAX_CGROUP_TEXT
