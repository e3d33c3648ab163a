"""What each API verb does to the store, with the real server's rules: metadata the server owns,
defaulting, optimistic concurrency, the status subresource, finalizers and graceful deletion, binding.

Both the HTTP handlers and the tests' direct state access go through these functions, so a write made
either way is versioned and watched alike. Objects handled here are "bare": without kind/apiVersion.
"""

from __future__ import annotations

import base64
import binascii
import json
import random
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from kube_vgpu.standins.apiserver import dra, errors
from kube_vgpu.standins.apiserver.defaults import (
    bare_object,
    check_namespace,
    check_preconditions,
    default,
    validate,
)
from kube_vgpu.standins.apiserver.patch import apply_patch
from kube_vgpu.standins.apiserver.resources import (
    NAMESPACES,
    PODS,
    ResourceType,
    field_value,
    lookup,
    lookup_object,
    name_problem,
)
from kube_vgpu.standins.apiserver.selectors import FieldSelector, LabelSelector
from kube_vgpu.standins.apiserver.store import ObjectKey, Store, Stored

# Which part of an object a write may change: the main resource leaves status alone, `/status` changes
# only status, and tests' direct writes change everything.

Scope = Literal["main", "status", "all"]


_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # the real server's: no vowels, no look-alikes


_SERVER_OWNED = ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation")


def timestamp(moment: datetime | None = None) -> str:
    """RFC 3339 in UTC with second precision, as metadata timestamps are written."""
    return (moment or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


def with_type(rt: ResourceType, obj: Mapping[str, Any]) -> dict[str, Any]:
    """A bare object with its kind and apiVersion in front, as single objects are answered."""
    return {"kind": rt.kind, "apiVersion": rt.api_version, **obj}


@dataclass(frozen=True)
class ListPage:
    """One answer to a list: matching objects, the revision read at, and how to continue."""

    items: list[Stored]
    rv: int
    continue_token: str | None
    remaining: int | None


@dataclass(frozen=True)
class Deleted:
    """The outcome of a delete: the object's last state, and whether it is gone or only marked."""

    stored: Stored
    removed: bool


class Operations:
    """The verbs of the API over one store."""

    def __init__(
        self,
        store: Store,
        *,
        graceful_pod_deletion: bool = False,
        feature_gates: dra.FeatureGates | None = None,
    ) -> None:
        self.store = store
        self.graceful_pod_deletion = graceful_pod_deletion
        # The DRA feature gates of the server imitated (what it drops from resource.k8s.io objects).
        self.feature_gates = feature_gates if feature_gates is not None else dra.FeatureGates()
        # The clock creationTimestamp is read from (one-second resolution); tests may set it.
        self.clock: Callable[[], datetime] = lambda: datetime.now(UTC)

    # -- reads --------------------------------------------------------------------------------------

    def get(self, rt: ResourceType, namespace: str, name: str) -> Stored:
        """The current object; 404 when there is none."""
        stored = self.store.get(rt, namespace, name)
        if stored is None:
            raise errors.not_found(rt.plural, name, rt.group)
        return stored

    def list(
        self,
        rt: ResourceType,
        namespace: str | None,
        *,
        labels: LabelSelector | None = None,
        fields: FieldSelector | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
        exact_rv: int | None = None,
    ) -> ListPage:
        """Objects in key order matching the selectors, `limit` at a time, consistent across pages."""
        labels = labels or LabelSelector()
        fields = fields or FieldSelector()
        with self.store.lock:
            if continue_token:
                rv, after = _decode_continue(continue_token)
                if rv == -1:
                    # The token of an expired one (its 410 hands it out): the rest at the latest
                    # revision, knowingly inconsistent, as kube-apiserver serves it.
                    rv = self.store.rv
                    items = self.store.items(rt, namespace, after)
                else:
                    items = self.store.items_at(rt, rv, namespace, after)
            elif exact_rv is not None:
                rv = exact_rv
                items = self.store.items_at(rt, rv, namespace)
            else:
                rv = self.store.rv
                items = self.store.items(rt, namespace)
        selecting = not (labels.empty and fields.empty)
        matched: list[Stored] = []
        for index, stored in enumerate(items):
            if selecting and not selected(stored.obj, labels, fields):
                continue
            if limit and len(matched) == limit:
                # The real server only estimates the remainder when nothing is filtered out.
                remaining = None if selecting else len(items) - index
                return ListPage(matched, rv, _encode_continue(rv, matched[-1].key), remaining)
            matched.append(stored)
        return ListPage(matched, rv, None, None)

    # -- writes -------------------------------------------------------------------------------------

    def create(
        self, rt: ResourceType, namespace: str, body: Any, *, dry_run: bool = False, direct: bool = False
    ) -> Stored:
        """POST: a new object with server-set metadata; 409 AlreadyExists, 404 for a missing namespace.
        `direct` (tests' own writes) keeps the status, uid and creationTimestamp given and skips the
        namespace check."""
        obj = bare_object(rt, body)
        metadata = obj["metadata"]
        check_namespace(rt, metadata, namespace)
        with self.store.lock:
            if rt.namespaced and not direct and self.store.get(NAMESPACES, "", namespace) is None:
                raise errors.not_found("namespaces", namespace)
            if not metadata.get("name") and metadata.get("generateName"):
                metadata["name"] = self._generated_name(rt, namespace, str(metadata["generateName"]))
            name = str(metadata.get("name") or "")
            if not name:
                raise errors.invalid(
                    rt.kind, "", ["metadata.name: Required value: name or generateName is required"], rt.group
                )
            problem = name_problem(rt, name)
            if problem:
                raise errors.invalid(
                    rt.kind, name, [f'metadata.name: Invalid value: "{name}": {problem}'], rt.group
                )
            if self.store.get(rt, namespace, name) is not None:
                raise errors.already_exists(rt.plural, name, rt.group)
            # A test's direct write may carry the system metadata an admission chain already filled
            # (validating webhooks see the uid that gets stored).
            kept = {k: metadata[k] for k in ("uid", "creationTimestamp") if direct and metadata.get(k)}
            for owned in (*_SERVER_OWNED, "resourceVersion"):
                metadata.pop(owned, None)
            metadata["uid"] = kept.get("uid") or str(uuid.uuid4())
            metadata["creationTimestamp"] = kept.get("creationTimestamp") or timestamp(self.clock())
            if rt.has_generation:
                metadata["generation"] = 1
            default(rt, obj, creating=not direct)
            validate(rt, obj)
            if dra.is_dra(rt):
                dra.prepare(rt, obj, None, self.feature_gates, scope="all" if direct else "main")
                dra.validate(rt, obj, None, self._namespace_labels, self.feature_gates)
            if dry_run:
                return Stored(obj, self.store.rv)
            return self.store.commit(rt, "ADDED", obj, None)

    def replace(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        body: Any,
        *,
        scope: Scope = "main",
        dry_run: bool = False,
    ) -> Stored:
        """PUT: replace the object; 409 Conflict when body's resourceVersion is stale."""
        obj = bare_object(rt, body)
        metadata = obj["metadata"]
        check_namespace(rt, metadata, namespace)
        if metadata.get("name", name) != name:
            raise errors.bad_request(
                f"the name of the object ({metadata.get('name')}) does not match the name on the URL ({name})"
            )
        metadata["name"] = name
        with self.store.lock:
            current = self.store.get(rt, namespace, name)
            if current is None:
                if rt.create_on_update and scope != "status":
                    return self.create(rt, namespace, obj, dry_run=dry_run)
                raise errors.not_found(rt.plural, name, rt.group)
            return self._write(rt, current, obj, scope=scope, dry_run=dry_run)

    def patch(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        content_type: str,
        body: bytes,
        *,
        scope: Scope = "main",
        dry_run: bool = False,
    ) -> Stored:
        """PATCH with a JSON, merge or strategic merge patch; a resourceVersion in the patch is a
        precondition (409 when stale)."""
        with self.store.lock:
            current = self.get(rt, namespace, name)
            patched = apply_patch(content_type, current.copy(), body)
            if not isinstance(patched.get("metadata"), dict):
                raise errors.invalid(rt.kind, name, ["metadata: Required value"], rt.group)
            patched["metadata"]["name"] = name
            if rt.namespaced:
                patched["metadata"]["namespace"] = namespace
            return self._write(rt, current, patched, scope=scope, dry_run=dry_run)

    def delete(
        self, rt: ResourceType, namespace: str, name: str, options: Any = None, *, dry_run: bool = False
    ) -> Deleted:
        """DELETE: remove the object, or only mark it (deletionTimestamp) while finalizers remain or a
        scheduled pod is terminating gracefully; a namespace takes its contents with it."""
        options = options if isinstance(options, dict) else {}
        grace = options.get("gracePeriodSeconds")
        with self.store.lock:
            current = self.get(rt, namespace, name)
            check_preconditions(rt, current, options.get("preconditions"))
            obj = current.copy()
            metadata = obj["metadata"]
            if rt is NAMESPACES:
                metadata.setdefault("deletionTimestamp", timestamp())
                obj.setdefault("status", {})["phase"] = "Terminating"
                if not dry_run:
                    self._delete_namespace_contents(name)
                    return Deleted(self.store.commit(rt, "DELETED", obj, current), True)
                return Deleted(Stored(obj, current.rv), True)
            graceful = self._graceful_seconds(rt, obj, grace)
            if metadata.get("finalizers") or graceful:
                if metadata.get("deletionTimestamp"):
                    return Deleted(current, False)
                metadata["deletionTimestamp"] = timestamp(datetime.now(UTC) + timedelta(seconds=graceful))
                if graceful:
                    metadata["deletionGracePeriodSeconds"] = graceful
                if dry_run:
                    return Deleted(Stored(obj, current.rv), False)
                return Deleted(self.store.commit(rt, "MODIFIED", obj, current), False)
            if dry_run:
                return Deleted(current, True)
            return Deleted(self.store.commit(rt, "DELETED", obj, current), True)

    def bind(self, namespace: str, name: str, binding: Any, *, dry_run: bool = False) -> Stored:
        """pods/binding: set spec.nodeName and merge the binding's annotations into the pod, as the
        scheduler's bind does; 409 when the pod is already bound or being deleted."""
        if not isinstance(binding, dict):
            raise errors.bad_request("a Binding must be a JSON object")
        metadata = _mapping(binding.get("metadata"))
        if metadata.get("name", name) != name:
            raise errors.bad_request(
                f"the name of the object ({metadata.get('name')}) does not match the name on the URL ({name})"
            )
        target = _mapping(binding.get("target"))
        node = target.get("name")
        if not node or not isinstance(node, str):
            raise errors.invalid("Binding", name, ["target.name: Required value"])
        if target.get("kind", "Node") not in ("", "Node"):
            raise errors.invalid(
                "Binding",
                name,
                [f"target.kind: Invalid value: \"{target['kind']}\": must be empty or 'Node'"],
            )
        annotations = metadata.get("annotations") or {}
        if not isinstance(annotations, dict):
            raise errors.bad_request("metadata.annotations of a Binding must be an object")
        with self.store.lock:
            current = self.get(PODS, namespace, name)
            pod = current.copy()
            spec = pod.setdefault("spec", {})
            if pod["metadata"].get("deletionTimestamp"):
                raise errors.conflict(
                    "pods/binding", name, why=f"pod {name} is being deleted, cannot be assigned to a host"
                )
            if spec.get("nodeName"):
                raise errors.conflict(
                    "pods/binding", name, why=f'pod {name} is already assigned to node "{spec["nodeName"]}"'
                )
            spec["nodeName"] = node
            if annotations:
                pod["metadata"]["annotations"] = {**(pod["metadata"].get("annotations") or {}), **annotations}
            conditions = [
                c
                for c in pod.setdefault("status", {}).get("conditions") or []
                if c.get("type") != "PodScheduled"
            ]
            conditions.append(
                {
                    "type": "PodScheduled",
                    "status": "True",
                    "lastProbeTime": None,
                    "lastTransitionTime": timestamp(),
                }
            )
            pod["status"]["conditions"] = conditions
            if dry_run:
                return Stored(pod, current.rv)
            return self.store.commit(PODS, "MODIFIED", pod, current)

    def put(self, obj: Mapping[str, Any]) -> Stored:
        """Tests' direct create-or-replace of a whole object (status included), without preconditions."""
        rt = _resource_of(obj)
        metadata = _mapping(obj.get("metadata"))
        namespace = str(metadata.get("namespace") or ("default" if rt.namespaced else ""))
        copied = json.loads(json.dumps(obj))
        with self.store.lock:
            current = self.store.get(rt, namespace, str(metadata.get("name") or ""))
            if current is None:
                return self.create(rt, namespace, copied, direct=True)
            copied["metadata"].pop("resourceVersion", None)
            return self._write(rt, current, bare_object(rt, copied), scope="all", dry_run=False)

    # -- helpers ------------------------------------------------------------------------------------

    def _write(
        self, rt: ResourceType, current: Stored, obj: dict[str, Any], *, scope: Scope, dry_run: bool
    ) -> Stored:
        metadata = obj["metadata"]
        wanted_rv = metadata.get("resourceVersion")
        if wanted_rv not in (None, "") and str(wanted_rv) != str(current.rv):
            raise errors.conflict(rt.plural, current.key[1], rt.group)
        old = current.obj
        if rt.has_status and scope == "main":
            _set_or_drop(obj, "status", old.get("status"))
        elif scope == "status":
            status = obj.get("status")
            obj = current.copy()
            _set_or_drop(obj, "status", status)
            metadata = obj["metadata"]
        for owned in _SERVER_OWNED:
            _set_or_drop(metadata, owned, old["metadata"].get(owned))
        metadata["namespace"] = old["metadata"].get("namespace")
        if not rt.namespaced:
            metadata.pop("namespace", None)
        default(rt, obj, creating=False)
        validate(rt, obj)
        if dra.is_dra(rt):
            dra.prepare(rt, obj, old, self.feature_gates, scope=scope)
            dra.validate(rt, obj, old, self._namespace_labels, self.feature_gates)
        if rt.has_generation and _spec_part(obj) != _spec_part(old):
            metadata["generation"] = int(old["metadata"].get("generation") or 0) + 1
        metadata["resourceVersion"] = str(current.rv)
        if obj == old:
            # A write that changes nothing keeps the resourceVersion and emits no event, like the real one.
            return current
        if dry_run:
            return Stored(obj, current.rv)
        # The last finalizer is gone; a pod in its grace period waits for its kubelet's final delete.
        in_grace = rt is PODS and metadata.get("deletionGracePeriodSeconds")
        if metadata.get("deletionTimestamp") and not metadata.get("finalizers") and not in_grace:
            return self.store.commit(rt, "DELETED", obj, current)
        return self.store.commit(rt, "MODIFIED", obj, current)

    def _namespace_labels(self, name: str) -> dict[str, str] | None:
        stored = self.store.get(NAMESPACES, "", name)
        if stored is None:
            return None
        labels = stored.obj["metadata"].get("labels")
        return dict(labels) if isinstance(labels, dict) else {}

    def _graceful_seconds(self, rt: ResourceType, pod: dict[str, Any], grace: Any) -> int:
        if rt is not PODS or not self.graceful_pod_deletion:
            return 0
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        # Unscheduled and finished pods have no kubelet to wait for; the real server deletes them at once.
        if not spec.get("nodeName") or status.get("phase") in ("Succeeded", "Failed"):
            return 0
        if grace is None:
            grace = spec.get("terminationGracePeriodSeconds", 30)
        if not isinstance(grace, int) or grace < 0:
            raise errors.bad_request(f"gracePeriodSeconds must be a non-negative integer, got {grace!r}")
        return grace

    def _delete_namespace_contents(self, namespace: str) -> None:
        for key in list(self.store.kinds()):
            rt = lookup(key)
            if not rt.namespaced:
                continue
            for stored in self.store.items(rt, namespace):
                self.store.commit(rt, "DELETED", stored.copy(), stored)

    def _generated_name(self, rt: ResourceType, namespace: str, prefix: str) -> str:
        # The real server truncates the prefix so that the name fits 63 characters.
        prefix = prefix[:58]
        for _ in range(100):
            name = prefix + "".join(random.choices(_GENERATE_ALPHABET, k=5))
            if self.store.get(rt, namespace, name) is None:
                return name
        raise errors.already_exists(rt.plural, prefix, rt.group)


def _resource_of(obj: Mapping[str, Any]) -> ResourceType:
    try:
        return lookup_object(obj)
    except LookupError as exc:
        raise ValueError(str(exc)) from exc


def selected(obj: dict[str, Any], labels: LabelSelector, fields: FieldSelector) -> bool:
    """Whether a bare object is selected by both selectors."""
    if not labels.empty and not labels.matches((obj.get("metadata") or {}).get("labels")):
        return False
    return fields.empty or fields.matches(obj, field_value)


def _encode_continue(rv: int, after: ObjectKey) -> str:
    token = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": list(after)})
    return base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")


def _decode_continue(token: str) -> tuple[int, ObjectKey]:
    try:
        decoded = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        namespace, name = decoded["start"]
        return int(decoded["rv"]), (str(namespace), str(name))
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise errors.bad_request(f"continue key is not valid: {exc}") from exc


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _set_or_drop(target: dict[str, Any], key: str, value: Any) -> None:
    if value is None:
        target.pop(key, None)
    else:
        target[key] = value


def _spec_part(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}
