"""Shared pytest fixtures; each block is owned by the part of the project it stands in for."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from kube_vgpu.standins.apiserver.server import ApiServerStandin
from tests.support.node import short_tempdir
from tests.support.timeouts import cancel_timer, protocol_finished, set_timer

# Property tests share two cores with servers the suite starts: how fast an example is generated or
# run measures the machine's load, not the code, so neither is a failure (each test's own settings
# still choose how many examples it runs).
settings.register_profile("kube-vgpu", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("kube-vgpu")


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    """A stuck test ends the run with its pending asyncio tasks, its log's tail and, last, its id."""
    return set_timer(item, settings)


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_cancel_timer(item: pytest.Item) -> bool | None:
    """The bound also covers the teardown of a test that failed (pytest-timeout drops it there)."""
    return cancel_timer(item)


def pytest_runtest_logfinish(nodeid: str) -> None:
    protocol_finished(nodeid)


# --- standins.apiserver: the stand-in Kubernetes API server -------------------------------------------


@pytest.fixture
def apiserver() -> Iterator[ApiServerStandin]:
    """A stand-in kube-apiserver on its own thread for the test; stopped (thread joined) at teardown.

    Point product code at it with `apiserver.write_kubeconfig(tmp_path / "kubeconfig")` or
    `apiserver.api_client()`; switch faults with its methods (`set_outage`, `set_hang`, `deny`, ...).
    """
    with ApiServerStandin() as server:
        yield server


# --- end standins.apiserver ----------------------------------------------------------------------------


# --- node plugin tests ---------------------------------------------------------------------------------


@pytest.fixture
def kdir() -> Iterator[Path]:
    """A kubelet device-plugin folder with a short path (unix socket paths are limited to 108 bytes)."""
    with short_tempdir() as path:
        yield path
