"""glibc's thresholds stay where `pin_malloc_thresholds` puts them, so a large block freed does not
move later large allocations onto the heap (where calloc writes their pages)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from kube_vgpu.httpedge.heap import OPERATOR_SETTINGS, pin_malloc_thresholds

# In a fresh process: free one 4 MiB block (glibc then raises both thresholds), then either allocate
# 200 zeroed blocks of 256 KiB (as uvloop does for each TLS connection) and report how much of them
# became resident ("mmap"), or write 6 MiB in blocks of 100 KiB, free them, and report how much stays
# resident ("trim").
_PROBE = """
import json, sys
from kube_vgpu.httpedge.heap import pin_malloc_thresholds
outcome = pin_malloc_thresholds() if sys.argv[1] == "pin" else "unpinned"
def rss_kib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
block = bytes(4 << 20)
del block
before = rss_kib()
if sys.argv[2] == "mmap":
    held = [bytes(256 * 1024) for _ in range(200)]
else:
    written = [bytearray(100 * 1024) for _ in range(60)]
    del written
print(json.dumps({"outcome": outcome, "resident_mib": (rss_kib() - before) / 1024}))
"""

needs_glibc = pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc" or not os.path.exists("/proc/self/status"), reason="glibc on Linux"
)


def _probe(mode: str, env: dict[str, str] | None = None, kind: str = "mmap") -> tuple[str, float]:
    """(what `pin_malloc_thresholds` said, MiB resident after the `kind` experiment) in a fresh process."""
    clean = {k: v for k, v in os.environ.items() if k not in OPERATOR_SETTINGS}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, mode, kind],
        env={**clean, **(env or {})},
        capture_output=True,
        check=True,
    )
    result = json.loads(done.stdout)
    return str(result["outcome"]), float(result["resident_mib"])


@needs_glibc
def test_after_a_large_block_is_freed_zeroed_blocks_stay_untouched_once_pinned() -> None:
    _, unpinned = _probe("unpinned")
    outcome, pinned = _probe("pin")
    assert outcome == "pinned"
    # Unpinned, the 50 MiB of zeroed blocks come from the heap, where calloc writes zeros into much of
    # them (27 MiB resident here); pinned, each is a fresh mmap that nobody has touched (1 MiB).
    assert unpinned > 15
    assert pinned < 5


@needs_glibc
def test_after_a_large_block_is_freed_freed_heap_memory_goes_back_once_pinned() -> None:
    _, unpinned = _probe("unpinned", kind="trim")
    outcome, pinned = _probe("pin", kind="trim")
    assert outcome == "pinned"
    # Unpinned, 6 MiB freed at the top of the heap is under the raised trim threshold and stays.
    assert unpinned > 4
    assert pinned < 1


@needs_glibc
@pytest.mark.parametrize("setting", OPERATOR_SETTINGS)
def test_an_operators_own_threshold_is_left_as_it_is(setting: str) -> None:
    outcome, _ = _probe("pin", {setting: "65536"})
    assert outcome == f"left to {setting}=65536"


def test_off_glibc_nothing_is_called(monkeypatch: pytest.MonkeyPatch) -> None:
    for setting in OPERATOR_SETTINGS:
        monkeypatch.delenv(setting, raising=False)
    monkeypatch.setattr(platform, "libc_ver", lambda: ("musl", "1.2"))
    assert pin_malloc_thresholds() == "not glibc"
