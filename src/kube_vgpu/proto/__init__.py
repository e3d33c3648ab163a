"""The kubelet's gRPC contracts, authored here: deviceplugin v1beta1, DRA plugin v1 and v1beta1, plugin
registration v1 (`*.proto`), and their generated modules.

Regenerate with `python -m kube_vgpu.proto.generate` (needs grpcio-tools and mypy-protobuf); a test checks
that regenerating changes nothing.
"""
