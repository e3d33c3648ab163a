"""The `--kubeconfig` and `--context` flags every command that talks to a cluster shares, so each
finds the cluster the way kubectl does (see `kubeapi.client.load_api_client`)."""

from __future__ import annotations

import argparse

KUBECONFIG_HELP = (
    "kubeconfig file; default: the files in $KUBECONFIG, else ~/.kube/config, else the in-cluster "
    "service account (kubectl's order)"
)


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `--kubeconfig FILE` and `--context NAME` to `parser`."""
    parser.add_argument("--kubeconfig", default=None, metavar="FILE", help=KUBECONFIG_HELP)
    parser.add_argument(
        "--context",
        default=None,
        metavar="NAME",
        help="kubeconfig context to use; default: the kubeconfig's current-context",
    )
