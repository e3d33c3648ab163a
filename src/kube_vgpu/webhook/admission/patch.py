"""JSONPatch operations written by the rule that decides them, instead of diffing two copies of the pod.

Diffing the whole pod before and after (and deep-copying it to have an "after") cost most of a
review's time; each rule knows the one field it sets, so it says so here. `set` skips a value the
pod already holds, which keeps a second admission of the webhook's own output an empty patch.
The diff (`webhook.admission.review.make_patch`) stays as the reference the property tests compare against.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_MISSING = object()


def pointer(*parts: str | int) -> str:
    """The RFC 6901 JSON pointer to a path (`~` and `/` in keys escaped)."""
    return "/" + "/".join([_escape(part) for part in parts]) if parts else ""


def _escape(part: str | int) -> str:
    text = str(part)
    # Most parts (field names, indexes) hold neither character: no replace, no new string.
    if "~" in text or "/" in text:
        return text.replace("~", "~0").replace("/", "~1")
    return text


class PatchBuilder:
    """The operations of one JSONPatch, in the order the rules decided them."""

    def __init__(self) -> None:
        self.operations: list[dict[str, Any]] = []

    def set(self, parent: Mapping[str, Any], path: tuple[str | int, ...], value: Any) -> None:
        """Make the member `path[-1]` of the object `parent` (found at `path[:-1]`) equal `value`.

        Nothing is written when it already is; a member that exists is replaced, others added.
        """
        current = parent.get(str(path[-1]), _MISSING)
        if current != value:
            op = "add" if current is _MISSING else "replace"
            self.operations.append({"op": op, "path": pointer(*path), "value": value})

    def set_member(self, parent: Mapping[str, Any], at: str, key: str, value: Any) -> None:
        """`set(parent, (*path, key), value)` where `at` is `pointer(*path)`: for setting many keys of
        one object (annotations) without building and escaping the whole path for each."""
        current = parent.get(key, _MISSING)
        if current != value:
            op = "add" if current is _MISSING else "replace"
            self.operations.append({"op": op, "path": at + "/" + _escape(key), "value": value})

    def set_members(self, parent: Mapping[str, Any], at: str, members: Mapping[str, Any]) -> None:
        """`set_member` for each of `members`, in their order (one call for a whole object's keys)."""
        append = self.operations.append
        for key, value in members.items():
            current = parent.get(key, _MISSING)
            if current != value:
                op = "add" if current is _MISSING else "replace"
                append({"op": op, "path": at + "/" + _escape(key), "value": value})

    def remove(self, parent: Mapping[str, Any], path: tuple[str | int, ...]) -> None:
        """Take the member `path[-1]` off the object `parent` (found at `path[:-1]`) if it is there."""
        if str(path[-1]) in parent:
            self.operations.append({"op": "remove", "path": pointer(*path)})
