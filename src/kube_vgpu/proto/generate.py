"""Compile the kubelet contracts in this folder (`*.proto`) into Python modules and type stubs with
grpcio-tools."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# Each proto file's path below SRC_ROOT is also its import path, so the generated modules import
# each other as `kube_vgpu.proto...`.
PROTOS = (
    "kube_vgpu/proto/deviceplugin_v1beta1.proto",
    "kube_vgpu/proto/dra_v1.proto",
    "kube_vgpu/proto/dra_v1beta1.proto",
    "kube_vgpu/proto/pluginregistration_v1.proto",
)
SRC_ROOT = Path(__file__).resolve().parents[2]


def generate(out_dir: Path) -> list[Path]:
    """Write the generated modules under `out_dir/kube_vgpu/proto/` and return their paths."""
    from grpc_tools import protoc

    bindir = Path(sys.executable).parent
    (out_dir / "kube_vgpu" / "proto").mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{SRC_ROOT}",
        # mypy-protobuf's plugins sit beside this interpreter, which need not be on PATH.
        f"--plugin=protoc-gen-mypy={bindir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bindir / 'protoc-gen-mypy_grpc'}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--mypy_out={out_dir}",
        f"--mypy_grpc_out={out_dir}",
    ]
    written: list[Path] = []
    for proto in PROTOS:
        if protoc.main([*args, str(SRC_ROOT / proto)]) != 0:
            raise RuntimeError(f"protoc failed on {proto}")
        stem = Path(proto).stem
        written += sorted((out_dir / "kube_vgpu" / "proto").glob(f"{stem}_pb2*"))
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--out", type=Path, default=SRC_ROOT, help="folder that holds kube_vgpu/proto/ (default: src/)"
    )
    written = generate(parser.parse_args().out)
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
