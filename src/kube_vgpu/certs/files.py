"""Certificate material as files in a directory, replaced atomically so a watcher never reads half a file."""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from kube_vgpu.certs.check import CA_CERT, CA_KEY, FILES, TLS_CERT, TLS_KEY, examine
from kube_vgpu.certs.plan import RENEW_BEFORE, Plan, build, decide

log = logging.getLogger("kube_vgpu.certs")

# Private keys readable by the owner only; certificates are public.
KEY_MODE = 0o600
CERT_MODE = 0o644
# Keys first: a watcher that reloads on a changed certificate then finds the key already in place.
WRITE_ORDER = (CA_KEY, TLS_KEY, CA_CERT, TLS_CERT)


def read_material(directory: Path) -> dict[str, bytes]:
    """The material files present in `directory` (none when it does not exist)."""
    material: dict[str, bytes] = {}
    for name in FILES:
        with contextlib.suppress(FileNotFoundError, IsADirectoryError, NotADirectoryError):
            material[name] = (directory / name).read_bytes()
    return material


def write_atomic(path: Path, data: bytes, mode: int) -> None:
    """Replace `path` with `data`: a temporary file in the same directory, fsynced, then renamed over it.

    A reader sees either the old file or the new one, whole; the mode is set before any byte is written.
    """
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def write_material(directory: Path, material: Mapping[str, bytes]) -> list[Path]:
    """Write every material file into `directory` (created if needed); returns the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for name in WRITE_ORDER:
        if name in material:
            path = directory / name
            write_atomic(path, material[name], KEY_MODE if name.endswith(".key") else CERT_MODE)
            written.append(path)
    # The renames are durable only once the directory entry is on disk too.
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return written


def ensure_files(
    directory: Path,
    hosts: Sequence[str],
    *,
    days: int,
    ca_days: int,
    force: bool = False,
    now: datetime,
) -> Plan:
    """Make `directory` hold a valid CA and serving certificate for `hosts`, as `certs create` does a Secret.

    Valid files are left alone unless `force`, which re-issues the serving certificate (and the CA only
    when it cannot be kept).
    """
    findings = examine(read_material(directory), hosts, now=now, renew_before=RENEW_BEFORE)
    plan = decide(findings, days=days, now=now)
    if force and plan.action == "keep":
        plan = decide(replace(findings, serving_problem="re-issue forced"), days=days, now=now)
    if plan.action != "keep":
        write_material(directory, build(plan, findings, hosts, days=days, ca_days=ca_days, now=now))
    if plan.action == "keep":
        log.info("event=files_valid directory=%s action=keep", directory)
    else:
        log.info("event=files_written directory=%s action=%s reason=%r", directory, plan.action, plan.reason)
    return plan
