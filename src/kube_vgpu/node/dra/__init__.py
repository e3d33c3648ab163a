"""kube-vgpu as a DRA driver: ResourceSlices, the kubelet plugin, CDI."""
