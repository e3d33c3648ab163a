"""The kubelet device plugin v1beta1 contract: `deviceplugin_v1beta1.proto` and its generated modules.

Regenerate with `python -m kube_vgpu.proto.generate` (needs grpcio-tools and mypy-protobuf); a test checks
that regenerating changes nothing.
"""
