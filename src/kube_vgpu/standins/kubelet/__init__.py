"""LOCAL STAND-IN for the kubelet: its device manager and its pod admission order."""
