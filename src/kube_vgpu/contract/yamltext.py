"""One-line descriptions of YAML syntax errors: PyYAML's own spread over several lines, with a
caret drawing, and every user-input error kube-vgpu prints must fit on one line."""

from __future__ import annotations

from typing import IO, Any

import yaml


class TooDeep(yaml.YAMLError):
    """A document nested past what PyYAML's recursive composer can follow."""


def safe_load(stream: str | IO[str]) -> Any:
    """`yaml.safe_load`, with a document nested too deeply for the parser's recursion (a hostile
    `[[[[...]]]]`) raised as a YAMLError instead of a RecursionError."""
    try:
        return yaml.safe_load(stream)
    except RecursionError:
        raise TooDeep("nested too deeply") from None


def utf8_problem(exc: UnicodeDecodeError) -> str:
    """`not UTF-8 text (byte N: reason)`, N the offset of the first undecodable byte."""
    return f"not UTF-8 text (byte {exc.start}: {exc.reason})"


def yaml_problem(exc: yaml.YAMLError) -> str:
    """`not valid YAML: <problem> (line L, column C)`, from PyYAML's error."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    return "not valid YAML: " + " ".join(f"{problem}{where}".split())
