"""One-line descriptions of YAML syntax errors: PyYAML's own spread over several lines, with a
caret drawing, and every user-input error kube-vgpu prints must fit on one line.

Every YAML file kube-vgpu reads goes through `safe_load` here, which also refuses a mapping that
gives a key twice: PyYAML keeps the last value silently, so a setting written twice would take
effect from wherever it was written last, unnoticed.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import IO, Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node

# The tag PyYAML's resolver gives a `<<` merge key.
_MERGE_TAG = "tag:yaml.org,2002:merge"


class TooDeep(yaml.YAMLError):
    """A document nested past what PyYAML's recursive composer can follow."""


class DuplicateKey(ConstructorError):
    """A mapping that gives the same key twice; the mark is the second one."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that refuses a key given twice in one mapping.

    Keys are compared after construction, as the mapping would hold them (`1` and `0x1` are the same
    key). A merge (`<<: *base`) is left out of the check: a key written next to a merge overriding
    the merged one is what merges are for.
    """

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        if isinstance(node, MappingNode):
            seen: dict[Hashable, Node] = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node)
                except TypeError:
                    continue  # unhashable: SafeLoader's own construct_mapping refuses it
                if first is not key_node:
                    one, two = first.start_mark.line + 1, key_node.start_mark.line + 1
                    where = f"on line {one}" if one == two else f"on lines {one} and {two}"
                    raise DuplicateKey(
                        problem=f"key {key!r} given twice, {where}", problem_mark=key_node.start_mark
                    )
        return super().construct_mapping(node, deep=deep)


def safe_load(stream: str | IO[str]) -> Any:
    """`yaml.safe_load`, refusing a key given twice in a mapping (DuplicateKey), and with a
    document nested too deeply for the parser's recursion (a hostile `[[[[...]]]]`) raised as a
    YAMLError instead of a RecursionError."""
    try:
        return yaml.load(stream, Loader=_UniqueKeyLoader)
    except RecursionError:
        raise TooDeep("nested too deeply") from None


def safe_load_all(stream: str | IO[str]) -> Iterator[Any]:
    """`yaml.safe_load_all` with `safe_load`'s checks, one document at a time."""
    try:
        yield from yaml.load_all(stream, Loader=_UniqueKeyLoader)
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
