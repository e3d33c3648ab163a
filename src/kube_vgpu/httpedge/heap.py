"""glibc's mmap and trim thresholds, pinned at their defaults, so one large request body does not
leave the webhook holding memory for every connection after it.

glibc serves allocations of 128 KiB and more with mmap and returns freed heap memory to the system
past 128 KiB, until a block it had mmapped is freed: then it raises both thresholds to that block's
size (up to 32 MiB). A gzip review inflates to up to 3 MiB, so after the first one freed memory
stayed in the heap and the 256 KiB buffer uvloop gives each new TLS connection came from there,
written, where a fresh mmap is zero pages nobody has touched: 1,000 connections idle after one
1 MiB review each held 349-378 MiB, against 135 MiB with the thresholds pinned (`bench/hostile.py`).
An everyday review costs the same CPU pinned, because no read allocates a large block: the
transport reads into a 64 KiB buffer per thread (`httpedge.edge.BufferedReads`); before that,
uvloop allocated 256 KiB for every TLS read, which pinned went through mmap and munmap (12 % more
CPU a review). A body of several MiB still costs more, since it is assembled in blocks past the
threshold: a 3 MiB plain body 9.6 ms against 8.3 ms unpinned (`bench/large_body_cpu.py`).
An operator's own `MALLOC_MMAP_THRESHOLD_` or `MALLOC_TRIM_THRESHOLD_` wins; other C libraries are
left as they are.
"""

from __future__ import annotations

import ctypes
import os
import platform
from typing import Final

# mallopt's parameter numbers (malloc.h) and glibc's default for both thresholds.
M_TRIM_THRESHOLD: Final = -1
M_MMAP_THRESHOLD: Final = -3
THRESHOLD_BYTES: Final = 128 * 1024
OPERATOR_SETTINGS: Final = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def pin_malloc_thresholds() -> str:
    """Pin both thresholds at glibc's default; what was done, for the log ("pinned", or why not)."""
    for setting in OPERATOR_SETTINGS:
        if setting in os.environ:
            return f"left to {setting}={os.environ[setting][:32]}"
    if platform.libc_ver()[0] != "glibc":
        return "not glibc"
    try:
        libc = ctypes.CDLL(None)  # the symbols the process has loaded, libc's among them
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return "mallopt not found"
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    for parameter in (M_MMAP_THRESHOLD, M_TRIM_THRESHOLD):
        if not mallopt(parameter, THRESHOLD_BYTES):
            return f"mallopt refused parameter {parameter}"
    return "pinned"
