"""Fixtures shared by the admission tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kube_vgpu.webhook.admission import isolation


@pytest.fixture(autouse=True)
def fresh_isolation_guards() -> Iterator[None]:
    """Each test prepares the protected paths itself: `isolation._guards` caches them per hook path,
    and a cache filled by an earlier test would hide a change to how they are prepared (mutation
    testing runs many tests in one process)."""
    isolation._guards.cache_clear()  # noqa: SLF001 (our own memo, cleared between tests)
    yield
