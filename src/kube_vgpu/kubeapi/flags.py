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


def given_as(value: str, flag: str) -> str:
    """Where an error says `value` came from: `--flag VALUE`, or `VARIABLE='VALUE'` when the command
    line read it from an environment variable (`KUBE_VGPU_KUBECONFIG`): the parser then hands over a
    `str` that carries the variable's name as `variable` (`cli.main.FromEnv`), and the variable's
    refusals name it so."""
    variable = getattr(value, "variable", None)
    return f"{variable}={str(value)!r}" if isinstance(variable, str) else f"{flag} {value}"


def source_of(value: str, flag: str) -> str:
    """The flag, or the environment variable the command line read `value` from (see `given_as`)."""
    variable = getattr(value, "variable", None)
    return variable if isinstance(variable, str) else flag
