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
    """`yaml.SafeLoader` that refuses a key given twice in one mapping, and a second `<<` merge key.

    Keys are compared after construction, as the mapping would hold them (`1` and `0x1` are the same
    key). Every mapping is checked before PyYAML flattens its merges into it (`flatten_mapping`, which
    also runs on each merged mapping, one that is never constructed on its own: `<<: {a: 1, a: 2}`).
    A key written next to a merge, or given by two merged mappings, is no duplicate: the YAML merge
    key spec (https://yaml.org/type/merge.html) has the explicit key override the merged ones, and an
    earlier mapping of a merged list override a later one.
    """

    def __init__(self, stream: str | IO[str]) -> None:
        super().__init__(stream)
        # Mappings already checked: flattening rewrites a mapping's pairs in place (the merged ones
        # first), so a mapping merged twice (`<<: *base` in two places) must be checked only once.
        self._checked: set[MappingNode] = set()

    def construct_document(self, node: Node) -> Any:
        try:
            return super().construct_document(node)
        finally:
            self._checked.clear()

    def flatten_mapping(self, node: MappingNode) -> None:
        if node not in self._checked:
            self._checked.add(node)
            self._check_unique(node)
        super().flatten_mapping(node)
        self._keep_last(node)

    def _keep_last(self, node: MappingNode) -> None:
        """Leave one pair per key in a flattened mapping, the last: its own pairs follow the merged
        ones. PyYAML's `flatten_mapping` (yaml/constructor.py) keeps the first pair of a key among the
        merged ones, so merging a mapping that overrides a key of its own merge (`b: &b {<<: *a, x: 2}`,
        then `<<: *b`) would take the value `b` overrode."""
        at: dict[Hashable, int] = {}
        dropped: set[int] = set()
        for index, (key_node, _) in enumerate(node.value):
            try:
                key = self.construct_object(key_node, deep=True)
                if key in at:
                    dropped.add(at[key])
                at[key] = index
            except TypeError:
                continue  # unhashable: SafeLoader's own construct_mapping refuses it
        if dropped:
            node.value = [pair for index, pair in enumerate(node.value) if index not in dropped]

    def _check_unique(self, node: MappingNode) -> None:
        seen: dict[Hashable, Node] = {}
        merge: Node | None = None
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                if merge is not None:
                    raise DuplicateKey(
                        problem=f"merge key '<<' given twice ({_lines(merge, key_node)}): give one "
                        "`<<` with a list of the mappings to merge",
                        problem_mark=key_node.start_mark,
                    )
                merge = key_node
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node)
            except TypeError:
                continue  # unhashable: SafeLoader's own construct_mapping refuses it
            if first is not key_node:
                raise DuplicateKey(
                    problem=f"key {key!r} given twice ({_lines(first, key_node)}): keep one of them",
                    problem_mark=key_node.start_mark,
                )


def _lines(first: Node, second: Node) -> str:
    one, two = first.start_mark.line + 1, second.start_mark.line + 1
    return f"line {one}" if one == two else f"lines {one} and {two}"


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
    # A key given twice names both of its lines already.
    mark = None if isinstance(exc, DuplicateKey) else getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    return "not valid YAML: " + " ".join(f"{problem}{where}".split())
