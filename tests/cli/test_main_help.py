"""`--help` of every command and subcommand shows every flag's default."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

import pytest

from kube_vgpu.cli.main import SUBCOMMANDS, build_parser


def parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:  # noqa: SLF001 (argparse has no public list of a parser's actions)
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001 (argparse has no public list of a parser's actions)
            for sub in action.choices.values():
                yield from parsers(sub)


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_every_default_is_in_the_help(command: str) -> None:
    parser = build_parser(command)
    checked = 0
    for sub in parsers(parser):
        if command not in sub.prog.split():
            continue
        text = " ".join(sub.format_help().split())
        for action in sub._actions:  # noqa: SLF001 (argparse has no public list of a parser's actions)
            default = action.default
            if not action.option_strings or default in (None, False, argparse.SUPPRESS) or default == []:
                continue
            shown = ",".join(map(str, default)) if isinstance(default, list | tuple) else str(default)
            where = f"{sub.prog} {action.option_strings[0]}: {default!r}"
            assert re.search(rf"default:? {re.escape(shown)}\b", text), where
            checked += 1
    assert checked, f"{command}: no flag with a default found"


def test_a_default_is_shown_once() -> None:
    sub = next(p for p in parsers(build_parser("certs")) if p.prog.endswith("certs create"))
    assert " ".join(sub.format_help().split()).count("3650") == 1
