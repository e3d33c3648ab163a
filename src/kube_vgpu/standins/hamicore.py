"""A stand-in for HAMi-core's files in a node's hookPath, for the demo and tests, which run no CUDA.

The real files come from the chart's installer (an image that carries HAMi-core); here two small
files stand in for them, shaped as the node plugin's check reads them: a library that starts with
an ELF header (and is nothing more) and an `ld.so.preload` naming the library's in-container path.
No process ever loads them.
"""

from __future__ import annotations

from pathlib import Path

LIBRARY_PATH_IN_CONTAINER = "/usr/local/vgpu/libvgpu.so"
# An ELF identification block (64-bit, little-endian, current version), then a note to whoever
# opens the file: it is no library.
PLACEHOLDER_LIBRARY = b"\x7fELF\x02\x01\x01" + b"\x00" * 9 + b"kube-vgpu stand-in, not HAMi-core\n"


def install_placeholder(folder: Path) -> None:
    """Write the stand-in `libvgpu.so` and `ld.so.preload` into `folder` (created), world-readable."""
    folder.mkdir(parents=True, exist_ok=True)
    library, preload = folder / "libvgpu.so", folder / "ld.so.preload"
    library.write_bytes(PLACEHOLDER_LIBRARY)
    preload.write_text(LIBRARY_PATH_IN_CONTAINER + "\n", encoding="utf-8")
    for path in (library, preload):
        path.chmod(0o644)
