"""The `kube-vgpu` command: one entry point, one subcommand per part.

Every flag can also be given as an environment variable `KUBE_VGPU_<FLAG>` (upper case, `-` as
`_`, e.g. `KUBE_VGPU_NODE_NAME`); a flag on the command line wins over the variable.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, Protocol

ENV_PREFIX = "KUBE_VGPU_"

# subcommand -> module providing `add_arguments(parser)` and `run(args) -> int`.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "webhook": ("kube_vgpu.webhook.cli", "serve the admission webhook (/mutate and /validate) over HTTPS"),
    "node": (
        "kube_vgpu.cli.node",
        "run the node plugin on a GPU node: the kubelet device plugin Volcano places pods through, or "
        "with --api dra the DRA driver vgpu.kube-vgpu.io (hami-core mode only)",
    ),
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


def _use_defaults_formatter(parser: Parser) -> None:
    # Subparsers do not inherit the formatter: set it on every level.
    parser.formatter_class = DefaultsHelpFormatter
    for sub in parser.subparsers():
        _use_defaults_formatter(sub)


class Subcommand(Protocol):
    """What each part's `cli` module provides."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


class FromEnv(str):
    """A flag's default read from its environment variable: the variable's text, remembering its name.

    argparse converts a string default through the flag's `type` only when the flag is not given, so
    a variable that the command line overrides is never read: `KUBE_VGPU_PORT=tcp://10.96.0.5:443`
    (the service link Kubernetes injects for a Service named kube-vgpu) does not matter with `--port`.
    """

    variable: str

    def __new__(cls, text: str, variable: str) -> FromEnv:
        made = super().__new__(cls, text)
        made.variable = variable
        return made


def _env_reader(action: argparse.Action) -> Callable[[str], object]:
    """The flag's `type`, which reads a FromEnv default as the flag would read its value, checking
    choices (argparse checks them for given values only) and naming the variable when it refuses."""
    original: Callable[[str], object] | None = action.type if callable(action.type) else None
    flag = action.option_strings[-1]
    boolean = action.nargs == 0 and isinstance(action.const, bool)  # store_true/store_false

    def refuse(text: FromEnv, expected: str) -> argparse.ArgumentTypeError:
        hint = ""
        if text.startswith("tcp://"):
            hint = (
                "; it looks like a Kubernetes service link for a Service named kube-vgpu: give "
                f"{flag} on the command line, or set enableServiceLinks: false on the pod"
            )
        return argparse.ArgumentTypeError(f"{text.variable}={str(text)!r}: expected {expected}{hint}")

    def one(text: FromEnv, item: str) -> object:
        try:
            value = original(item) if original is not None else item
        except (TypeError, ValueError, argparse.ArgumentTypeError):
            name = getattr(original, "__name__", "")
            raise refuse(text, {"int": "an integer", "float": "a number"}.get(name, f"a {name}")) from None
        if action.choices is not None and value not in action.choices:
            raise refuse(text, f"one of {', '.join(map(str, action.choices))}")
        return value

    def read(value: str) -> object:
        if not isinstance(value, FromEnv):
            return original(value) if original is not None else value
        if boolean:
            word = value.strip().lower()
            if word not in _TRUE + _FALSE:
                raise refuse(value, "true or false (or 1/0, yes/no, on/off)")
            return (word in _TRUE) == action.const
        if action.nargs in ("+", "*"):
            items = [one(value, item) for item in value.split(",") if item]
            if action.nargs == "+" and not items:
                raise refuse(value, "one value or more, separated by commas")
            return items
        return one(value, value)

    # argparse names the type in its own messages ("invalid int value").
    read.__name__ = getattr(original, "__name__", "str")
    return read


def apply_env_defaults(parser: Parser, environ: os._Environ[str] | dict[str, str]) -> None:
    """Make every optional flag of `parser` (and its subparsers) default to its environment variable,
    read (and checked) only when the flag is not given."""
    for sub in parser.subparsers():
        apply_env_defaults(sub, environ)
    for action in parser.actions:
        if action.nargs == argparse.PARSER:
            continue
        long_flags = [s for s in action.option_strings if s.startswith("--")]
        if not long_flags or action.dest in ("help", "version"):
            continue
        variable = ENV_PREFIX + long_flags[0][2:].upper().replace("-", "_")
        # A flag that defaults to nothing repeats one of its parent's (`node check --mode`): the
        # parent reads the variable, and the repeat must not overwrite a flag given before it.
        if variable in environ and action.default is not argparse.SUPPRESS:
            action.default = FromEnv(environ[variable], variable)
            action.type = _env_reader(action)
            action.required = False
        if action.help and action.help is not argparse.SUPPRESS:
            action.help = f"{action.help} [env {variable}]"


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (the error and where to read more, not the whole usage), and a
    record of the actions `add_argument` and `add_subparsers` made: argparse keeps its own list
    private, and the environment defaults and the help formatter walk every flag of every level.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Set before argparse's own __init__, which adds --help through add_argument.
        self.actions: list[argparse.Action] = []
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        self.actions.append(action)
        return action

    def add_subparsers(self, *args: Any, **kwargs: Any) -> Any:
        # Subparsers are made with the parent's class (argparse's default parser_class), so they
        # keep their own record too.
        action = super().add_subparsers(*args, **kwargs)
        self.actions.append(action)
        return action

    def subparsers(self) -> list[Parser]:
        """The parsers of this parser's subcommands."""
        return [
            sub
            for action in self.actions
            if action.nargs == argparse.PARSER and isinstance(action.choices, dict)
            for sub in action.choices.values()
            if isinstance(sub, Parser)
        ]

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(only: str | None = None) -> Parser:
    """The parser; with `only`, just that subcommand's module is imported (the others stay listed).

    Importing one part per run keeps start-up light (`certs` need not load gRPC) and keeps one
    part's import problem from stopping the others.
    """
    parser = Parser(prog="kube-vgpu", description="GPU sharing for Kubernetes.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, summary) in SUBCOMMANDS.items():
        sub = subparsers.add_parser(name, help=summary, description=summary)
        if only is not None and name != only:
            continue
        module: Subcommand = importlib.import_module(module_name)
        module.add_arguments(sub)
        sub.set_defaults(run_command=module.run)
    _use_defaults_formatter(parser)
    return parser


def _version() -> str:
    """The installed distribution's version (pyproject.toml's, once installed)."""
    try:
        return importlib.metadata.version("kube-vgpu")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed: no package metadata)"


def _chosen(argv: Sequence[str]) -> str | None:
    """The subcommand named in argv, if it is the first argument that is not an option."""
    first = next((a for a in argv if not a.startswith("-")), None)
    return first if first in SUBCOMMANDS else None


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments and run the chosen subcommand; returns the process exit code."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        # Importing a part takes a moment (gRPC, the Kubernetes client): Ctrl-C may come meanwhile.
        parser = build_parser(_chosen(arguments))
        apply_env_defaults(parser, os.environ)
        args = parser.parse_args(arguments)
        code: int = args.run_command(args)
    except KeyboardInterrupt:
        print("kube-vgpu: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return _stdout_closed()
    return code


def _stdout_closed() -> int:
    """The reader of stdout went away (`kube-vgpu demo | head`): end quietly, as `cat` does.

    Python would otherwise report the failed flush of stdout again at exit; pointing stdout at
    /dev/null lets that flush succeed. 141 is what a shell reports for a process ended by SIGPIPE.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 141


if __name__ == "__main__":
    sys.exit(main())
