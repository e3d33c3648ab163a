"""Atomic file replacement: readers see whole files, failed writes leave the old ones, keys are private."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from kube_vgpu.certs.files import read_material, write_atomic, write_material


def test_material_files_get_their_modes_and_read_back(tmp_path: Path) -> None:
    material = {"ca.crt": b"ca", "ca.key": b"cakey", "tls.crt": b"crt", "tls.key": b"key", "other": b"x"}
    written = write_material(tmp_path / "new" / "dir", material)
    assert sorted(p.name for p in written) == ["ca.crt", "ca.key", "tls.crt", "tls.key"]
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in written}
    assert modes == {"ca.crt": 0o644, "ca.key": 0o600, "tls.crt": 0o644, "tls.key": 0o600}
    assert read_material(tmp_path / "new" / "dir") == {k: v for k, v in material.items() if k != "other"}
    assert read_material(tmp_path / "missing") == {}


def test_a_reader_holding_the_old_file_keeps_reading_it_whole(tmp_path: Path) -> None:
    path = tmp_path / "tls.crt"
    path.write_bytes(b"old" * 1000)
    with path.open("rb") as reader:
        write_atomic(path, b"new" * 1000, 0o644)
        assert reader.read() == b"old" * 1000
    assert path.read_bytes() == b"new" * 1000
    assert os.listdir(tmp_path) == ["tls.crt"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "tls.key"
    path.write_bytes(b"old")

    def broken_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="No space left"):
        write_atomic(path, b"new", 0o600)
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["tls.key"]


def test_a_symlinked_file_is_replaced_by_a_regular_file(tmp_path: Path) -> None:
    (tmp_path / "target").write_bytes(b"old")
    link = tmp_path / "tls.crt"
    link.symlink_to(tmp_path / "target")
    write_atomic(link, b"new", 0o644)
    assert not link.is_symlink()
    assert link.read_bytes() == b"new"
    assert (tmp_path / "target").read_bytes() == b"old"
