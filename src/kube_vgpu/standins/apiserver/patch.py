"""The three PATCH body types the API server accepts, applied to plain JSON objects.

- `application/json-patch+json`: RFC 6902, applied by the `jsonpatch` package; any failed operation
  (a `test` that does not hold, a missing path) is a 422, as on the real server.
- `application/merge-patch+json`: RFC 7386 (`null` deletes, objects merge, everything else replaces).
- `application/strategic-merge-patch+json`: merge patch, plus the list merging Kubernetes declares in its
  Go struct tags. Simplification: the stand-in has no schemas, so merge keys come from a table of field
  names (`containers` by `name`, `conditions` by `type`, ...); every other list is replaced whole, as in a
  merge patch. The `$patch: delete|replace|merge` directives and `$deleteFromPrimitiveList/<field>` are
  honoured; `$setElementOrder/<field>` and `$retainKeys` are accepted and ignored.
"""

from __future__ import annotations

import json
from typing import Any, Final

import jsonpatch
import jsonpointer

from kube_vgpu.standins.apiserver.errors import bad_request, unprocessable, unsupported_media_type

JSON_PATCH: Final = "application/json-patch+json"
MERGE_PATCH: Final = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH: Final = "application/strategic-merge-patch+json"
PATCH_TYPES: Final = (JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH)

# patchMergeKey of the list fields the stand-in's resources declare with patchStrategy "merge".
MERGE_KEYS: Final[dict[str, str]] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
    "imagePullSecrets": "name",
    "hostAliases": "ip",
    "podIPs": "ip",
    "hostIPs": "ip",
    "conditions": "type",
    "addresses": "type",
    "ownerReferences": "uid",
    "webhooks": "name",
}
# Lists of scalars declared with patchStrategy "merge": the patch's items are added to the existing set.
PRIMITIVE_MERGE_LISTS: Final = frozenset({"finalizers"})


def apply_patch(content_type: str, current: dict[str, Any], body: bytes) -> dict[str, Any]:
    """Apply a PATCH body of the given media type to `current` (not modified); raises StatusError."""
    media_type = content_type.split(";", 1)[0].strip().lower()
    if media_type not in PATCH_TYPES:
        raise unsupported_media_type(content_type, list(PATCH_TYPES))
    try:
        patch = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"error decoding patch: {exc}") from exc
    if media_type == JSON_PATCH:
        return apply_json_patch(current, patch)
    if not isinstance(patch, dict):
        raise bad_request(f"a {media_type} body must be a JSON object, got {type(patch).__name__}")
    if media_type == MERGE_PATCH:
        result = merge_patch(current, patch)
    else:
        result = strategic_merge_patch(current, patch)
    if not isinstance(result, dict):
        raise unprocessable("the patch did not produce an object")
    return result


def apply_json_patch(current: dict[str, Any], operations: Any) -> dict[str, Any]:
    """RFC 6902: apply a list of operations; a failing operation is a 422 like the real server's."""
    if not isinstance(operations, list):
        raise bad_request(f"a json patch must be a JSON array of operations, got {type(operations).__name__}")
    try:
        result = jsonpatch.JsonPatch(operations).apply(current, in_place=False)
    except jsonpatch.InvalidJsonPatch as exc:
        raise bad_request(f"invalid json patch: {exc}") from exc
    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
        raise unprocessable(f"the server rejected our request due to an error in our request: {exc}") from exc
    if not isinstance(result, dict):
        raise unprocessable("the server rejected our request due to an error in our request: not an object")
    return result


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 merge patch; returns a new value and leaves both arguments untouched."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


_DELETE = object()


def strategic_merge_patch(target: Any, patch: dict[str, Any]) -> Any:
    """Strategic merge patch over a JSON object, with the simplifications the module docstring lists."""
    merged = _merge_map(target, patch)
    return {} if merged is _DELETE else merged


def _merge_map(target: Any, patch: dict[str, Any]) -> Any:
    directive = patch.get("$patch")
    if directive == "delete":
        return _DELETE
    if directive == "replace":
        return _strip_directives({k: v for k, v in patch.items() if k != "$patch"})
    if directive not in (None, "merge"):
        raise bad_request(f"unknown patch directive $patch: {directive!r}")
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key in ("$patch", "$retainKeys") or key.startswith("$setElementOrder/"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            if isinstance(result.get(field), list) and isinstance(value, list):
                result[field] = [item for item in result[field] if item not in value]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            merged = _merge_map(result.get(key), value)
            if merged is _DELETE:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list):
            result[key] = _merge_list(key, result.get(key), value)
        else:
            result[key] = value
    return result


def _merge_list(field: str, target: Any, patch: list[Any]) -> list[Any]:
    if any(isinstance(item, dict) and item.get("$patch") == "replace" for item in patch):
        return [
            _strip_directives(item) for item in patch if not (isinstance(item, dict) and "$patch" in item)
        ]
    existing = target if isinstance(target, list) else []
    if field in PRIMITIVE_MERGE_LISTS:
        return existing + [item for item in patch if item not in existing]
    merge_key = MERGE_KEYS.get(field)
    if merge_key is None or not all(isinstance(item, dict) for item in patch):
        return [_strip_directives(item) for item in patch]
    result = list(existing)
    for item in patch:
        if merge_key not in item:
            raise bad_request(f"map in list {field!r} lacks its merge key {merge_key!r}: {item}")
        index = next(
            (
                i
                for i, old in enumerate(result)
                if isinstance(old, dict) and old.get(merge_key) == item[merge_key]
            ),
            None,
        )
        merged = _merge_map(result[index] if index is not None else {}, item)
        if merged is _DELETE:
            if index is not None:
                del result[index]
        elif index is not None:
            result[index] = merged
        else:
            result.append(merged)
    return result


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_directives(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [_strip_directives(item) for item in value]
    return value
