"""docs/configuration.md's "Every flag" lists every flag of every command and subcommand, each under
its command's heading, with its short form; no row names a flag the command does not have. A page
of its own that repeats a command's table (docs/node.md for `kube-vgpu node check`) is held to the
same."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from kube_vgpu.cli.main import SUBCOMMANDS, build_parser

DOCS = Path(__file__).resolve().parents[2] / "docs"
CONFIGURATION = (DOCS / "configuration.md").read_text()
OTHER_PAGES = {
    page.name: page.read_text() for page in sorted(DOCS.glob("*.md")) if page.name != "configuration.md"
}


def _walk(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:  # noqa: SLF001 (argparse has no public list of a parser's actions)
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001 (argparse has no public list of a parser's actions)
            for sub in action.choices.values():
                yield from _walk(sub)


def commands() -> Iterator[tuple[str, list[list[str]]]]:
    """(prog, the option strings of each of its flags) of the top level and every subcommand."""
    seen: set[str] = set()
    for name in SUBCOMMANDS:
        for sub in _walk(build_parser(name)):
            if sub.prog in seen or (sub.prog != "kube-vgpu" and name not in sub.prog.split()):
                continue
            seen.add(sub.prog)
            flags = [list(a.option_strings) for a in sub._actions if a.option_strings and a.dest != "help"]  # noqa: SLF001 (argparse has no public list of a parser's actions)
            if flags:
                yield sub.prog, flags


COMMANDS = list(commands())


def table(page: str, prog: str) -> str | None:
    """The flag table under a line holding just `prog` in backticks, or None."""
    heading = f"\n`{prog}`\n"
    if heading not in page:
        return None
    return page.split(heading, 1)[1].split("\n\n`", 1)[0]


def check_table(section: str, prog: str, flags: list[list[str]]) -> None:
    for strings in flags:
        cell = ", ".join(f"`{s}`" for s in sorted(strings, key=len))
        assert f"\n| {cell} |" in section, f"{prog}: no row starting | {cell} |"
    known = {s for strings in flags for s in strings}
    for row in re.findall(r"^\| (`-[^|]*) \|", section, re.MULTILINE):
        named = set(re.findall(r"`(-[^`]+)`", row))
        assert named <= known, f"{prog}: the row {row} names {sorted(named - known)}, not a flag of it"


def test_the_top_level_and_every_subcommand_are_covered() -> None:
    progs = [prog for prog, _ in COMMANDS]
    assert "kube-vgpu" in progs and "kube-vgpu node check" in progs and "kube-vgpu certs write" in progs


@pytest.mark.parametrize(("prog", "flags"), COMMANDS, ids=[p for p, _ in COMMANDS])
def test_every_flag_is_in_the_configuration_doc_under_its_command(prog: str, flags: list[list[str]]) -> None:
    section = table(CONFIGURATION, prog)
    assert section is not None, f"docs/configuration.md has no table for {prog}"
    check_table(section, prog, flags)


@pytest.mark.parametrize(("prog", "flags"), COMMANDS, ids=[p for p, _ in COMMANDS])
def test_a_page_that_repeats_a_commands_table_repeats_all_of_it(prog: str, flags: list[list[str]]) -> None:
    for name, page in OTHER_PAGES.items():
        section = table(page, prog)
        if section is not None and "| flag |" in section:
            check_table(section, f"{name}: {prog}", flags)


def test_a_missing_flag_and_a_stale_row_are_caught() -> None:
    section = "\n| flag | default | meaning |\n|---|---|---|\n| `--a` | | x |\n| `--gone` | | y |"
    with pytest.raises(AssertionError, match="no row starting"):
        check_table(section, "p", [["--a"], ["-b", "--bee"]])
    with pytest.raises(AssertionError, match="names \\['--gone'\\]"):
        check_table(section, "p", [["--a"]])


def test_the_node_commands_summary_names_both_apis() -> None:
    """`kube-vgpu --help` and `kube-vgpu node --help` say the node plugin is a device plugin or,
    with --api dra, the DRA driver (hami-core only), matching the flag's choices."""
    summary = SUBCOMMANDS["node"][1]
    assert "kubelet device plugin" in summary and "--api dra" in summary
    assert "DRA driver vgpu.kube-vgpu.io (hami-core mode only)" in summary
    (node,) = [p for p in _walk(build_parser("node")) if p.prog == "kube-vgpu node"]
    (api,) = [a for a in node._actions if "--api" in a.option_strings]  # noqa: SLF001 (argparse has no public list of a parser's actions)
    assert node.description == summary
    assert list(api.choices or []) == ["deviceplugin", "dra"]
