"""The real API server's create-time checks on a core v1 Event (`legacyValidateEvent` in
kubernetes `pkg/apis/core/validation/events.go`), the part a recorder can trip over.

Without `eventTime` (the shape `kubectl describe` lists and client-go's legacy recorder writes), the
event's namespace must equal `involvedObject.namespace`, or be `default` (or empty) for a
cluster-scoped object such as a Node. With `eventTime`, a cluster-scoped object's event lives in
`default` or `kube-system`, and `reportingComponent` (a qualified name) and `reportingInstance` are
required. The reason is at most 128 characters in either shape.
"""

from __future__ import annotations

import re
from typing import Any

from kube_vgpu.standins.apiserver import errors

_REASON_LIMIT = 128
_INSTANCE_LIMIT = 128
# IsQualifiedName: an optional DNS-subdomain prefix and '/', then a name of at most 63 characters.
_QUALIFIED = re.compile(
    r"^(?:[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)


def validate_event(obj: dict[str, Any]) -> None:
    """Raise 422 Invalid, with the real server's field paths, for an Event it would refuse."""
    metadata = obj["metadata"]
    namespace = str(metadata.get("namespace") or "")
    involved = obj.get("involvedObject") or {}
    involved_ns = str(involved.get("namespace") or "") if isinstance(involved, dict) else ""
    causes: list[str] = []
    mismatch = f'involvedObject.namespace: Invalid value: "{involved_ns}": does not match event.namespace'
    if not obj.get("eventTime"):
        allowed = (involved_ns,) if involved_ns else ("", "default")
        if namespace not in allowed:
            causes.append(mismatch)
    else:
        if involved_ns == "" and namespace not in ("default", "kube-system"):
            causes.append(mismatch)
        component = str(obj.get("reportingComponent") or "")
        if not component:
            causes.append("reportingComponent: Required value")
        elif not _QUALIFIED.match(component):
            causes.append(f'reportingComponent: Invalid value: "{component}": must be a qualified name')
        instance = str(obj.get("reportingInstance") or "")
        if not instance:
            causes.append("reportingInstance: Required value")
        elif len(instance) > _INSTANCE_LIMIT:
            causes.append(f"reportingInstance: Invalid value: can have at most {_INSTANCE_LIMIT} characters")
    if len(str(obj.get("reason") or "")) > _REASON_LIMIT:
        causes.append(f"reason: Invalid value: can have at most {_REASON_LIMIT} characters")
    if causes:
        raise errors.invalid("Event", str(metadata.get("name") or ""), causes)
