"""HAMi-core in hookPath: what counts as usable, and the running plugin's offer following it (no
hami-core capacity while it is missing, a Warning Event and a metric saying so, capacity back
without a restart once the files appear; a MIG node never asks for it)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from grpc import aio

from kube_vgpu.contract.names import NODE_REGISTER
from kube_vgpu.contract.register import decode_register
from kube_vgpu.node.events import HAMI_CORE_FOUND, HAMI_CORE_MISSING
from kube_vgpu.node.hookpath import INSTALLER_VALUE, HookPathState, HookPathWatch, inspect_hook_path
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.standins.hamicore import install_placeholder
from tests.node.test_events import describe_events
from tests.support.node import (
    NODE,
    RESOURCE,
    UUID_A,
    UUID_B,
    eventually,
    node_object,
    one_gpu_pod,
    running_plugin,
)
from tests.support.node_mig import mig_sim, running_mig_plugin

MEMORY = "volcano.sh/vgpu-memory"
CORES = "volcano.sh/vgpu-cores"


def problems(folder: Path) -> dict[str, str | None]:
    return {f.name: f.problem for f in inspect_hook_path(str(folder)).files}


# --- what counts as usable --------------------------------------------------------------------------


def test_the_installed_files_are_usable(tmp_path: Path) -> None:
    install_placeholder(tmp_path)
    state = inspect_hook_path(str(tmp_path))
    assert state.ready and state.problem is None
    library, preload = state.files
    assert (library.name, library.present, library.readable) == ("libvgpu.so", True, True)
    assert library.size == (tmp_path / "libvgpu.so").stat().st_size
    assert preload.size == len("/usr/local/vgpu/libvgpu.so\n")


def test_missing_folder_and_missing_files(tmp_path: Path) -> None:
    state = inspect_hook_path(str(tmp_path / "absent"))
    assert not state.ready
    assert problems(tmp_path / "absent") == {"libvgpu.so": "missing", "ld.so.preload": "missing"}
    assert state.problem is not None and str(tmp_path / "absent" / "libvgpu.so") in state.problem
    install_placeholder(tmp_path)
    (tmp_path / "ld.so.preload").unlink()
    assert problems(tmp_path) == {"libvgpu.so": None, "ld.so.preload": "missing"}


@pytest.mark.parametrize(
    ("library", "expected"),
    [
        (b"", "empty"),
        (b"#!/bin/sh\n", "not a shared library (no ELF header)"),
        (b"\x7fEL", "not a shared library (no ELF header)"),  # one byte short of the header
        (b"\x7fELF", None),
    ],
)
def test_the_library_must_be_an_elf_file(tmp_path: Path, library: bytes, expected: str | None) -> None:
    install_placeholder(tmp_path)
    (tmp_path / "libvgpu.so").write_bytes(library)
    assert problems(tmp_path)["libvgpu.so"] == expected


@pytest.mark.parametrize(
    ("content", "usable"),
    [
        ("/usr/local/vgpu/libvgpu.so\n", True),
        ("/opt/other.so /usr/local/vgpu/libvgpu.so", True),  # white space separates entries
        ("/opt/other.so:/usr/local/vgpu/libvgpu.so", True),  # so do colons
        ("", False),
        ("/usr/local/vgpu/libvgpu.so.v2.5.0\n", False),  # a name ld.so would look for elsewhere
        ("/k8s-vgpu/lib/nvidia/libvgpu.so\n", False),
    ],
)
def test_the_preload_file_must_name_the_library_where_containers_get_it(
    tmp_path: Path, content: str, usable: bool
) -> None:
    install_placeholder(tmp_path)
    (tmp_path / "ld.so.preload").write_text(content)
    problem = problems(tmp_path)["ld.so.preload"]
    assert (problem is None) == usable
    if not usable:
        assert problem is not None and "/usr/local/vgpu/libvgpu.so" in problem


def test_files_every_user_cannot_read_are_not_usable(tmp_path: Path) -> None:
    install_placeholder(tmp_path)
    (tmp_path / "libvgpu.so").chmod(0o640)  # root (the plugin) reads it; a container's user does not
    assert problems(tmp_path)["libvgpu.so"] == "not readable by every user (mode 0640)"
    (tmp_path / "libvgpu.so").chmod(0o604)
    assert problems(tmp_path)["libvgpu.so"] is None


def test_a_folder_in_place_of_a_file_is_not_usable(tmp_path: Path) -> None:
    install_placeholder(tmp_path)
    (tmp_path / "ld.so.preload").unlink()
    (tmp_path / "ld.so.preload").mkdir()  # what a hostPath mount of a missing file leaves behind
    file = inspect_hook_path(str(tmp_path)).files[1]
    assert (file.present, file.size, file.problem) == (True, None, "not a regular file")


async def test_the_watch_reports_changes_and_reminds_while_missing(tmp_path: Path) -> None:
    seen: list[HookPathState] = []
    now = [0.0]
    watch = HookPathWatch(
        str(tmp_path), seen.append, interval=1.0, remind_seconds=100.0, clock=lambda: now[0]
    )
    await watch.check()
    assert [s.ready for s in seen] == [False]
    now[0] = 99.0
    await watch.check()
    assert len(seen) == 1  # unchanged, and not yet time to remind
    now[0] = 100.0
    await watch.check()
    assert [s.ready for s in seen] == [False, False]  # the reminder
    install_placeholder(tmp_path)
    await watch.check()
    now[0] = 1000.0
    await watch.check()
    assert [s.ready for s in seen] == [False, False, True]  # ready: reported once, never reminded


# --- the running plugin ---------------------------------------------------------------------------


@pytest.fixture
def api(apiserver: ApiServerStandin) -> ApiServerStandin:
    apiserver.put(node_object())
    return apiserver


def node_state(api: ApiServerStandin) -> tuple[dict[str, Any], list[tuple[int, bool]]]:
    node = api.get("Node", NODE)
    assert node is not None
    register = decode_register(node["metadata"]["annotations"][NODE_REGISTER])
    return dict(node["status"]["capacity"]), [(r.count, r.healthy) for r in register]


def node_events(api: ApiServerStandin, reason: str) -> list[dict[str, Any]]:
    return [e for e in describe_events(api, "Node", NODE, "", NODE) if e["reason"] == reason]


async def metrics_text(port: int) -> str:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/metrics") as response,
    ):
        return await response.text()


def all_devices(health: str) -> Callable[[Any], bool]:
    return lambda ds: len(ds) == 20 and all(d.health == health for d in ds)


async def test_a_node_without_hami_core_offers_nothing_until_it_appears(
    api: ApiServerStandin, kdir: Path, tmp_path: Path
) -> None:
    hook = tmp_path / "hook"
    async with running_plugin(api, kdir, tmp_path, hami_core=False) as h:
        # From the first publish on: no capacity, count 0 in the register, every device Unhealthy.
        capacity, register = node_state(api)
        assert (capacity[MEMORY], capacity[CORES]) == ("0", "0")
        assert register == [(0, False), (0, False)]
        await h.kubelet.wait_devices(RESOURCE, all_devices("Unhealthy"))
        assert "HAMi-core not usable in" in (h.inventory.reason(UUID_A) or "")

        await eventually(lambda: bool(node_events(api, HAMI_CORE_MISSING)))
        (event,) = node_events(api, HAMI_CORE_MISSING)
        assert event["type"] == "Warning"
        assert str(hook) in event["message"] and INSTALLER_VALUE in event["message"]
        assert h.plugin.metrics_server is not None
        port = h.plugin.metrics_server.port
        assert f'kube_vgpu_hami_core_ready{{folder="{hook}",node="{NODE}"}} 0.0' in await metrics_text(port)

        install_placeholder(hook)  # what the chart's installer does; the plugin is not restarted
        await h.kubelet.wait_devices(RESOURCE, all_devices("Healthy"))
        await eventually(lambda: node_state(api)[1] == [(10, True), (10, True)])
        await eventually(lambda: node_state(api)[0][MEMORY] == "65536")
        assert node_state(api)[0][CORES] == "200"
        await eventually(lambda: bool(node_events(api, HAMI_CORE_FOUND)))
        assert node_events(api, HAMI_CORE_FOUND)[0]["type"] == "Normal"
        assert f'kube_vgpu_hami_core_ready{{folder="{hook}",node="{NODE}"}} 1.0' in await metrics_text(port)
        assert h.plugin.registrations == 1  # the same registration all along


async def test_a_pod_already_placed_there_is_refused_with_the_reason(
    api: ApiServerStandin, kdir: Path, tmp_path: Path
) -> None:
    # Volcano placed it before the node's offer went to 0: it must not start without limits.
    async with running_plugin(api, kdir, tmp_path, hami_core=False) as h:
        uid = api.put(one_gpu_pod("early"))["metadata"]["uid"]
        with pytest.raises(aio.AioRpcError) as refused:
            await h.allocate(1)
        assert f"GPU {UUID_A} is unhealthy (HAMi-core not usable in {h.hook}" in str(refused.value.details())
        assert h.annotations("early")["volcano.sh/bind-phase"] == "failed"
        await eventually(lambda: bool(describe_events(api, "Pod", "early", "default", uid)))
        (event,) = describe_events(api, "Pod", "early", "default", uid)
        assert "libvgpu.so: missing" in event["message"]


async def test_hami_core_going_away_takes_the_offer_and_keeps_gpu_health_apart(
    api: ApiServerStandin, kdir: Path, tmp_path: Path
) -> None:
    async with running_plugin(api, kdir, tmp_path, recovery_quiet_seconds=60.0) as h:
        assert node_state(api)[0][MEMORY] == "65536"
        h.nvml.inject_xid(1, 79)  # GPU B out of service on its own
        await eventually(lambda: node_state(api)[1] == [(10, True), (0, False)])

        os.unlink(h.hook / "libvgpu.so")
        await h.kubelet.wait_devices(RESOURCE, all_devices("Unhealthy"))
        await eventually(lambda: node_state(api)[0][MEMORY] == "0")
        await eventually(lambda: bool(node_events(api, HAMI_CORE_MISSING)))
        assert "libvgpu.so: missing" in node_events(api, HAMI_CORE_MISSING)[0]["message"]

        install_placeholder(h.hook)
        # Back: GPU A only; B stays out until NVML has been quiet long enough.
        await eventually(lambda: node_state(api)[0][MEMORY] == "32768")
        assert node_state(api)[1] == [(10, True), (0, False)]
        assert "XID 79" in (h.inventory.reason(UUID_B) or "")


async def test_a_library_containers_cannot_read_takes_the_offer_until_it_is_readable(
    api: ApiServerStandin, kdir: Path, tmp_path: Path
) -> None:
    # Present but unreadable to a container's user: as useless as missing (the plugin, root, could
    # read it, so a check that only opened the file would wrongly pass it).
    async with running_plugin(api, kdir, tmp_path) as h:
        assert node_state(api)[0][MEMORY] == "65536"
        (h.hook / "libvgpu.so").chmod(0o640)
        await h.kubelet.wait_devices(RESOURCE, all_devices("Unhealthy"))
        await eventually(lambda: node_state(api)[1] == [(0, False), (0, False)])
        await eventually(lambda: (node_state(api)[0][MEMORY], node_state(api)[0][CORES]) == ("0", "0"))
        await eventually(lambda: bool(node_events(api, HAMI_CORE_MISSING)))
        message = node_events(api, HAMI_CORE_MISSING)[0]["message"]
        assert "libvgpu.so: not readable by every user (mode 0640)" in message
        assert str(h.hook) in message and INSTALLER_VALUE in message

        (h.hook / "libvgpu.so").chmod(0o644)  # what the installer's chmod leaves
        await h.kubelet.wait_devices(RESOURCE, all_devices("Healthy"))
        await eventually(lambda: node_state(api)[1] == [(10, True), (10, True)])
        assert h.plugin.registrations == 1


async def test_a_mig_node_does_not_need_hami_core(api: ApiServerStandin, kdir: Path, tmp_path: Path) -> None:
    nvml = mig_sim(count=2)
    try:
        async with running_mig_plugin(api, kdir, tmp_path, nvml, hami_core=False) as h:
            assert not (tmp_path / "hook" / "libvgpu.so").exists()
            capacity, register = node_state(api)
            assert int(capacity[MEMORY]) > 0 and all(count > 0 and ok for count, ok in register)
            assert h.plugin.hook_path is None
            assert h.plugin.metrics_server is not None
            assert "kube_vgpu_hami_core_ready" not in await metrics_text(h.plugin.metrics_server.port)
            assert not node_events(api, HAMI_CORE_MISSING)
    finally:
        nvml.nvmlShutdown()
