"""An in-memory object store with the API server's contract for the calls the shared quota
reservations make (`kube_vgpu.webhook.quota.shared_store.ObjectApi`): every write gets a new
resourceVersion; a write or delete carrying a stale one is refused 409 Conflict; a create of an
existing name 409 AlreadyExists; a replace of a missing object 404 NotFound; a body naming
another namespace than the call 400 BadRequest. Unit tests run the
production quota path (`SharedReservations`) over it; tests/webhook/quota/test_memory_store.py holds
it to the same contract as the stand-in API server.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Mapping
from typing import Any

from kube_vgpu.kubeapi.client import ApiError, Kind

Timeout = float | tuple[float, float] | None


class MemoryStore:
    """Objects by (kind, namespace, name), safe to call from several threads (`asyncio.to_thread`)."""

    def __init__(self) -> None:
        self._objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._version = 0
        self._lock = threading.Lock()
        # Called with the call's name before it is served (inside no lock): a test raises from it
        # to make the API fail, or writes through another client to make a call meet a conflict.
        self.before: Callable[[str], None] | None = None
        self.calls: list[str] = []

    def _enter(self, call: str) -> None:
        self.calls.append(call)
        if self.before is not None:
            self.before(call)

    @staticmethod
    def _check_namespace(obj: Mapping[str, Any], namespace: str | None) -> None:
        given = obj["metadata"].get("namespace")
        if given is not None and given != (namespace or ""):
            raise ApiError(
                400,
                "BadRequest",
                "the namespace of the provided object does not match the namespace sent on the request",
            )

    def _bump(self, obj: dict[str, Any]) -> dict[str, Any]:
        self._version += 1
        obj["metadata"]["resourceVersion"] = str(self._version)
        return copy.deepcopy(obj)

    def get(
        self, kind: Kind, name: str, *, namespace: str | None = None, timeout: Timeout = None
    ) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        self._enter("get")
        with self._lock:
            found = self._objects.get((kind, namespace or "", name))
            return copy.deepcopy(found) if found is not None else None

    def create(
        self, kind: Kind, body: Mapping[str, Any], *, namespace: str | None = None, timeout: Timeout = None
    ) -> dict[str, Any]:
        """Store a new object; 409 AlreadyExists when the name is taken."""
        self._enter("create")
        obj = copy.deepcopy(dict(body))
        self._check_namespace(obj, namespace)
        name = str(obj["metadata"]["name"])
        key = (kind, namespace or "", name)
        with self._lock:
            if key in self._objects:
                raise ApiError(409, "AlreadyExists", f'{kind} "{name}" already exists')
            obj["metadata"].pop("resourceVersion", None)
            self._objects[key] = obj
            return self._bump(obj)

    def replace(
        self,
        kind: Kind,
        name: str,
        body: Mapping[str, Any],
        *,
        namespace: str | None = None,
        timeout: Timeout = None,
    ) -> dict[str, Any]:
        """Replace an object; 409 Conflict when the body's resourceVersion is not the stored one."""
        self._enter("replace")
        obj = copy.deepcopy(dict(body))
        self._check_namespace(obj, namespace)
        key = (kind, namespace or "", name)
        with self._lock:
            stored = self._objects.get(key)
            if stored is None:
                raise ApiError(404, "NotFound", f'{kind} "{name}" not found')
            wanted = obj["metadata"].get("resourceVersion")
            if wanted is not None and wanted != stored["metadata"]["resourceVersion"]:
                raise ApiError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {kind} "{name}": the object has been modified; '
                    "please apply your changes to the latest version and try again",
                )
            self._objects[key] = obj
            return self._bump(obj)

    def delete(
        self,
        kind: Kind,
        name: str,
        *,
        namespace: str | None = None,
        resource_version: str | None = None,
        timeout: Timeout = None,
    ) -> bool:
        """Delete an object; whether it existed; 409 when `resource_version` is not the stored one."""
        self._enter("delete")
        key = (kind, namespace or "", name)
        with self._lock:
            stored = self._objects.get(key)
            if stored is None:
                return False
            if resource_version is not None and resource_version != stored["metadata"]["resourceVersion"]:
                raise ApiError(
                    409,
                    "Conflict",
                    f"Precondition failed: ResourceVersion in precondition: {resource_version}",
                )
            del self._objects[key]
            return True

    def list(
        self,
        kind: Kind,
        *,
        namespace: str | None = None,
        field_selector: str | None = None,
        label_selector: str | None = None,
        timeout: Timeout = None,
        limit: int | None = None,
        continue_token: str | None = None,
    ) -> dict[str, Any]:
        """The objects of `kind` in `namespace` matching an equality `label_selector` (`k=v,...`),
        by name, `limit` per page; `metadata.continue` names the next page."""
        self._enter("list")
        wanted = dict(part.split("=", 1) for part in label_selector.split(",")) if label_selector else {}
        with self._lock:
            items = [
                copy.deepcopy(obj)
                for (k, ns, _), obj in sorted(self._objects.items())
                if k == kind
                and (namespace is None or ns == namespace)
                and all((obj["metadata"].get("labels") or {}).get(k2) == v for k2, v in wanted.items())
            ]
            version = str(self._version)
        start = int(continue_token) if continue_token else 0
        end = len(items) if limit is None else start + limit
        metadata: dict[str, Any] = {"resourceVersion": version}
        if end < len(items):
            metadata["continue"] = str(end)
        return {"kind": "List", "items": items[start:end], "metadata": metadata}
