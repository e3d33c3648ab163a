"""HAMi-core's per-container host folders: made with the narrowest mode HAMi-core can use, removed
once their pod has been gone for the grace period, and never followed outside through a symlink."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import stat
from pathlib import Path

import pytest

from kube_vgpu.node.deviceplugin.cache_folders import (
    FOLDER_MODE,
    CacheFolders,
    make_folder,
    plan_sweep,
    pod_uid_of,
)

UID_LIVE = "0b7e8a9c-1d2e-4f30-8a4b-5c6d7e8f9a0b"
UID_GONE = "9f8e7d6c-5b4a-4938-8716-f5e4d3c2b1a0"
GRACE = 600.0


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def hook(tmp_path: Path) -> Path:
    return tmp_path / "hook"


def folders(hook: Path, clock: Clock, removed: list[int] | None = None) -> CacheFolders:
    counter = removed if removed is not None else []
    return CacheFolders(
        str(hook), "node-1", grace_seconds=GRACE, clock=clock, on_removed=lambda: counter.append(1)
    )


def container_folder(hook: Path, uid: str, container: str = "main") -> Path:
    path = hook / "vgpu" / "containers" / f"{uid}_{container}"
    make_folder(str(path))
    (path / "a1b2.cache").write_bytes(b"\0" * 16)
    return path


def test_folder_mode_lets_any_user_create_but_not_list(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b"
    make_folder(str(path))
    mode = stat.S_IMODE(path.stat().st_mode)
    assert mode == FOLDER_MODE == 0o733
    assert mode & stat.S_IWOTH and mode & stat.S_IXOTH  # any UID opens O_CREAT inside
    assert not mode & (stat.S_IROTH | stat.S_IRGRP)  # nobody else lists it
    # No sticky bit: under fs.protected_regular a second UID could not O_CREAT-open the first's file.
    assert not mode & stat.S_ISVTX
    # An existing folder (a restarted container's) keeps its files and gets the mode again.
    (path / "x.cache").write_text("kept")
    os.chmod(path, 0o777)
    make_folder(str(path))
    assert (path / "x.cache").read_text() == "kept"
    assert stat.S_IMODE(path.stat().st_mode) == 0o733


def test_names_of_our_layout_only() -> None:
    assert pod_uid_of(f"{UID_LIVE}_main") == UID_LIVE
    assert pod_uid_of(f"{UID_LIVE}_a-b-9") == UID_LIVE
    for name in (
        "lost+found",
        f"{UID_LIVE}",
        f"{UID_LIVE}_",
        f"{UID_LIVE}_Main",
        f"{UID_LIVE}_-x",
        f"{UID_LIVE}_{'a' * 64}",
        f"{UID_LIVE}_main/../..",
        f"{UID_LIVE}_main\n",
        f"{UID_LIVE.upper()}_main",
        "..",
    ):
        assert pod_uid_of(name) is None, name
    assert pod_uid_of(f"{UID_LIVE}_{'a' * 63}") == UID_LIVE


def test_plan_keeps_live_pods_and_waits_the_grace_period() -> None:
    names = [f"{UID_LIVE}_main", f"{UID_GONE}_main", f"{UID_GONE}_side", "other"]
    first = plan_sweep(names, {UID_LIVE}, {}, 100.0, GRACE)
    assert first.remove == () and first.gone_since == {UID_GONE: 100.0}
    # One tick short of the grace: kept; at the grace: both of its containers go.
    assert plan_sweep(names, {UID_LIVE}, first.gone_since, 100.0 + GRACE - 0.001, GRACE).remove == ()
    due = plan_sweep(names, {UID_LIVE}, first.gone_since, 100.0 + GRACE, GRACE)
    assert due.remove == (f"{UID_GONE}_main", f"{UID_GONE}_side")
    # A pod seen again starts over; one whose folders are gone is forgotten.
    assert plan_sweep(names, {UID_LIVE, UID_GONE}, first.gone_since, 900.0, GRACE).gone_since == {}
    assert plan_sweep([f"{UID_LIVE}_main"], {UID_LIVE}, first.gone_since, 900.0, GRACE).gone_since == {}


def test_gone_pod_removed_after_the_grace_live_pod_kept(hook: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock, removed = Clock(), list[int]()
    sweeper = folders(hook, clock, removed)
    live = container_folder(hook, UID_LIVE)
    gone = container_folder(hook, UID_GONE)
    assert sweeper.sweep({UID_LIVE}) == []  # first missed now
    clock.now += GRACE - 1
    assert sweeper.sweep({UID_LIVE}) == [] and gone.is_dir()  # gone for less than the grace: kept
    clock.now += 1
    with caplog.at_level(logging.INFO, "kube_vgpu.node.deviceplugin.cache_folders"):
        assert sweeper.sweep({UID_LIVE}) == [f"{UID_GONE}_main"]
    assert not gone.exists() and live.is_dir() and (live / "a1b2.cache").exists()
    assert removed == [1]
    (line,) = [r.getMessage() for r in caplog.records if "cache_folder_removed" in r.getMessage()]
    assert f"pod_uid={UID_GONE}" in line and "missed_seconds=600" in line and "node=node-1" in line
    # The live pod's folder stays however long it lives.
    clock.now += 10 * GRACE
    assert sweeper.sweep({UID_LIVE}) == [] and live.is_dir()


def test_pod_seen_again_within_the_grace_starts_over(hook: Path) -> None:
    clock = Clock()
    sweeper = folders(hook, clock)
    path = container_folder(hook, UID_GONE)
    sweeper.sweep(set())  # missed (a list taken before the pod was bound, say)
    clock.now += GRACE - 1
    sweeper.sweep({UID_GONE})  # there after all
    clock.now += GRACE - 1
    assert sweeper.sweep(set()) == [] and path.is_dir()
    clock.now += GRACE
    assert sweeper.sweep(set()) == [f"{UID_GONE}_main"]


def test_no_folder_yet_and_foreign_names_are_left_alone(hook: Path) -> None:
    clock = Clock()
    sweeper = folders(hook, clock)
    assert sweeper.sweep(set()) == []  # the containers folder does not exist yet
    root = hook / "vgpu" / "containers"
    root.mkdir(parents=True)
    (root / "notes.txt").write_text("an admin's")
    (root / "lost+found").mkdir()
    sweeper.sweep(set())
    clock.now += 2 * GRACE
    assert sweeper.sweep(set()) == []
    assert (root / "notes.txt").exists() and (root / "lost+found").is_dir()


def test_symlinks_are_removed_never_followed(hook: Path, tmp_path: Path) -> None:
    outside = tmp_path / "host-etc"
    outside.mkdir()
    (outside / "shadow").write_text("precious")
    clock = Clock()
    sweeper = folders(hook, clock)
    # The container owns its folder's contents: a link inside to the host, and a nested folder
    # holding one more.
    path = container_folder(hook, UID_GONE)
    (path / "escape").symlink_to(outside)
    (path / "nested").mkdir()
    (path / "nested" / "deeper").symlink_to(outside / "shadow")
    # A folder name that is itself a link (not made by the plugin, but possible on a shared host).
    root = hook / "vgpu" / "containers"
    (root / f"{UID_GONE}_linked").symlink_to(outside)
    sweeper.sweep(set())
    clock.now += GRACE
    assert sorted(sweeper.sweep(set())) == [f"{UID_GONE}_linked", f"{UID_GONE}_main"]
    assert not path.exists() and not (root / f"{UID_GONE}_linked").is_symlink()
    assert (outside / "shadow").read_text() == "precious"
    assert sorted(p.name for p in outside.iterdir()) == ["shadow"]


def test_a_folder_that_cannot_be_removed_is_logged_and_tried_again(
    hook: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock, removed = Clock(), list[int]()
    sweeper = folders(hook, clock, removed)
    path = container_folder(hook, UID_GONE)
    sweeper.sweep(set())
    clock.now += GRACE
    real_rmtree = shutil.rmtree

    def busy(path: str, *args: object, **kwargs: object) -> None:
        raise OSError(errno.EBUSY, "Device or resource busy", path)

    busy.avoids_symlink_attacks = True  # type: ignore[attr-defined]
    monkeypatch.setattr(shutil, "rmtree", busy)
    with caplog.at_level(logging.WARNING, "kube_vgpu.node.deviceplugin.cache_folders"):
        assert sweeper.sweep(set()) == []
    assert any("cache_folder_remove_failed" in r.getMessage() for r in caplog.records)
    assert removed == [] and path.is_dir()
    monkeypatch.setattr(shutil, "rmtree", real_rmtree)
    assert sweeper.sweep(set()) == [f"{UID_GONE}_main"] and removed == [1]
