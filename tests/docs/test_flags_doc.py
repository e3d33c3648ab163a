"""docs/configuration.md lists every flag of every command, under that command's heading (a
subcommand left to its own page in docs/, such as `kube-vgpu node check`, is listed there)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest

from kube_vgpu.cli.main import SUBCOMMANDS, build_parser

DOCS = Path(__file__).resolve().parents[2] / "docs"
# configuration.md first: a command's table is looked for there before the other pages.
PAGES = [(DOCS / "configuration.md").read_text()] + [
    page.read_text() for page in sorted(DOCS.glob("*.md")) if page.name != "configuration.md"
]


def commands() -> Iterator[tuple[str, list[str]]]:
    def walk(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
        yield parser
        for action in parser._actions:  # noqa: SLF001 (argparse has no public list of a parser's actions)
            if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001 (argparse has no public list of a parser's actions)
                for sub in action.choices.values():
                    yield from walk(sub)

    for name in SUBCOMMANDS:
        for sub in walk(build_parser(name)):
            flags = [
                next(o for o in a.option_strings if o.startswith("--"))
                for a in sub._actions  # noqa: SLF001 (argparse has no public list of a parser's actions)
                if a.option_strings and a.dest != "help"
            ]
            if name in sub.prog.split() and flags:
                yield sub.prog, flags


COMMANDS = list(commands())


@pytest.mark.parametrize(("prog", "flags"), COMMANDS, ids=[p for p, _ in COMMANDS])
def test_every_flag_is_in_the_configuration_doc_under_its_command(prog: str, flags: list[str]) -> None:
    heading = f"`{prog}`\n"
    pages = [page for page in PAGES if heading in page]
    assert pages, f"no page in docs/ has a table for {prog}"
    section = pages[0].split(heading, 1)[1].split("\n\n`", 1)[0]
    for flag in flags:
        assert f"| `{flag}` |" in section, f"{prog} {flag} is not in its table"
