"""The `kube-vgpu` command: one entry point, one subcommand per part.

Every flag can also be given as an environment variable `KUBE_VGPU_<FLAG>` (upper case, `-` as
`_`, e.g. `KUBE_VGPU_NODE_NAME`); a flag on the command line wins over the variable.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Protocol

ENV_PREFIX = "KUBE_VGPU_"

# subcommand -> module providing `add_arguments(parser)` and `run(args) -> int`.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "webhook": ("kube_vgpu.webhook.cli", "serve the admission webhook (/mutate and /validate) over HTTPS"),
    "node": ("kube_vgpu.node.cli", "run the kubelet device plugin on a GPU node"),
    "certs": ("kube_vgpu.certs.cli", "create, patch or write the webhook's certificates"),
    "demo": ("kube_vgpu.demo.cli", "run every part locally on simulated GPUs and admit the example pods"),
    "top": (
        "kube_vgpu.cli.top",
        "show the cluster's GPUs, what is booked on them and each namespace's quota",
    ),
}


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Help that ends every flag's line with its default, unless the help already names it or
    there is none to name (None, False, an empty list)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            not action.option_strings
            or default in (None, False, argparse.SUPPRESS)
            or default == []
            or "%(default)" in text
            or re.search(r"\bdefault[: ]", text, re.IGNORECASE)
        ):
            return action.help
        return f"{text} (default: %(default)s)"


def _use_defaults_formatter(parser: argparse.ArgumentParser) -> None:
    # Subparsers do not inherit the formatter: set it on every level.
    parser.formatter_class = DefaultsHelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _use_defaults_formatter(sub)


class Subcommand(Protocol):
    """What each part's `cli` module provides."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


def apply_env_defaults(parser: argparse.ArgumentParser, environ: os._Environ[str] | dict[str, str]) -> None:
    """Make every optional flag of `parser` (and its subparsers) default to its environment variable."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                apply_env_defaults(sub, environ)
            continue
        long_flags = [s for s in action.option_strings if s.startswith("--")]
        if not long_flags or action.dest == "help":
            continue
        variable = ENV_PREFIX + long_flags[0][2:].upper().replace("-", "_")
        # A flag that defaults to nothing repeats one of its parent's (`node check --mode`): the
        # parent reads the variable, and the repeat must not overwrite a flag given before it.
        if variable in environ and action.default is not argparse.SUPPRESS:
            value = environ[variable]
            if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
                action.default = value.lower() in ("1", "true", "yes", "on")
            elif action.nargs in ("+", "*"):
                action.default = [
                    action.type(v) if callable(action.type) else v for v in value.split(",") if v
                ]
                action.required = False
            else:
                convert: Callable[[str], object] = action.type if callable(action.type) else str
                action.default = convert(value)
                action.required = False
        if action.help and action.help is not argparse.SUPPRESS:
            action.help = f"{action.help} [env {variable}]"


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser; with `only`, just that subcommand's module is imported (the others stay listed).

    Importing one part per run keeps start-up light (`certs` need not load gRPC) and keeps one
    part's import problem from stopping the others.
    """
    parser = argparse.ArgumentParser(prog="kube-vgpu", description="GPU sharing for Kubernetes.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, summary) in SUBCOMMANDS.items():
        sub = subparsers.add_parser(name, help=summary, description=summary)
        if only is not None and name != only:
            continue
        module: Subcommand = importlib.import_module(module_name)
        module.add_arguments(sub)
        sub.set_defaults(_run=module.run)
    _use_defaults_formatter(parser)
    return parser


def _chosen(argv: Sequence[str]) -> str | None:
    """The subcommand named in argv, if it is the first argument that is not an option."""
    first = next((a for a in argv if not a.startswith("-")), None)
    return first if first in SUBCOMMANDS else None


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments and run the chosen subcommand; returns the process exit code."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(_chosen(arguments))
    apply_env_defaults(parser, os.environ)
    args = parser.parse_args(arguments)
    try:
        code: int = args._run(args)
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
