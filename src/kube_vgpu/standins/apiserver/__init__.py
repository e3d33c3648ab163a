"""LOCAL STAND-IN for kube-apiserver: REST paths, storage, watch, admission order, quantities."""
