"""Namespace GPU quotas: what a pod costs, the usage ledger, the reservations replicas share, metrics."""
