"""A stand-in for kube-scheduler's DRA side: structured allocation of ResourceClaims from ResourceSlices."""
