"""`kube-vgpu node check`: a read-only report of what the node plugin would see and offer on this node."""
