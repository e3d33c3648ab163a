"""Every Kubernetes API call kube-vgpu makes, per component, in one table: the source of its RBAC.

`kubeapi.client.Kube` built with a `component` refuses any call not declared here for it
(`UndeclaredCall`), so a component's tests fail the moment its code makes a call the table lacks;
the chart tests compare the chart's rendered Roles with this table in both directions, so a grant
nothing uses fails too. Adding a call is adding one line below.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final, Literal

Component = Literal["webhook", "node", "certs-create", "certs-patch", "certs-renew"]
COMPONENTS: Final[tuple[Component, ...]] = ("webhook", "node", "certs-create", "certs-patch", "certs-renew")
Verb = Literal["get", "list", "watch", "create", "update", "patch", "delete"]


class UndeclaredCall(RuntimeError):
    """A component called the API in a way `API_CALLS` does not declare (so RBAC would refuse it)."""


@dataclass(frozen=True)
class ApiCall:
    """One verb on one resource (`pods`, `nodes/status`) of one API group, made by one component."""

    component: Component
    verb: Verb
    resource: str
    group: str = ""
    # Which object, when the call is limited to one (a key the chart maps to the rendered name).
    named: str | None = None
    why: str = ""


_OWN_CALLS: Final[tuple[ApiCall, ...]] = (
    # webhook: the cluster cache (list+watch) and, at start, Volcano's MIG geometry; mutation calls
    # nothing, validation only records quota reservations.
    ApiCall("webhook", "list", "nodes", why="GPU inventory"),
    ApiCall("webhook", "watch", "nodes", why="GPU inventory"),
    ApiCall("webhook", "list", "namespaces", why="quota labels, opt-out"),
    ApiCall("webhook", "watch", "namespaces", why="quota labels, opt-out"),
    ApiCall("webhook", "list", "pods", why="quota usage"),
    ApiCall("webhook", "watch", "pods", why="quota usage"),
    ApiCall("webhook", "get", "configmaps", named="device-config", why="MIG slot sizes for quota"),
    # ...and, in the release namespace only, the shared quota reservations (one ConfigMap per quota
    # namespace, `webhook.quota.shared`): names are per namespace, so they cannot be listed in the
    # Role, and `create` cannot be limited by name at all.
    ApiCall("webhook", "get", "configmaps", why="shared quota reservations (release namespace)"),
    ApiCall("webhook", "create", "configmaps", why="shared quota reservations (release namespace)"),
    ApiCall("webhook", "update", "configmaps", why="shared quota reservations (release namespace)"),
    ApiCall("webhook", "delete", "configmaps", why="reservations of a deleted namespace (release namespace)"),
    ApiCall("webhook", "list", "configmaps", why="reservations of namespaces deleted meanwhile (release ns)"),
    # ...and, where DRA classes are configured (`webhook.draDeviceClasses`), the ResourceClaims that
    # count against quota and tell which pods use kube-vgpu's devices.
    ApiCall("webhook", "list", "resourceclaims", "resource.k8s.io", why="DRA: claims count against quota"),
    ApiCall("webhook", "watch", "resourceclaims", "resource.k8s.io", why="DRA: claims count against quota"),
    ApiCall("webhook", "list", "resourceslices", "resource.k8s.io", why="DRA: the largest GPU a claim gets"),
    ApiCall("webhook", "watch", "resourceslices", "resource.k8s.io", why="DRA: the largest GPU a claim gets"),
    ApiCall("webhook", "list", "resourceclaimtemplates", "resource.k8s.io", why="DRA: pods using kube-vgpu"),
    ApiCall("webhook", "watch", "resourceclaimtemplates", "resource.k8s.io", why="DRA: pods using kube-vgpu"),
    # node plugin: its node's registration, labels and capacity; the pods bound to it.
    ApiCall("node", "list", "nodes", why="read its own node (field selector)"),
    ApiCall("node", "watch", "nodes", why="capacity zeroed by the kubelet"),
    ApiCall("node", "patch", "nodes", why="register annotation, labels, node lock"),
    ApiCall("node", "patch", "nodes/status", why="vgpu-memory and vgpu-cores capacity"),
    ApiCall("node", "list", "pods", why="pods bound to the node (field selector)"),
    ApiCall("node", "watch", "pods", why="the order of binds: the kubelet admits pods in it"),
    ApiCall("node", "patch", "pods", why="bind phase, devices-to-allocate"),
    ApiCall("node", "get", "configmaps", named="device-config", why="Volcano's MIG geometry"),
    ApiCall("node", "create", "events", why="refused Allocates (on the pod), GPU health (on the node)"),
    # ...and, as a DRA driver, its node's ResourceSlice pool (node/dra/publisher.py).
    ApiCall("node", "list", "resourceslices", "resource.k8s.io", why="its pool (field selector node+driver)"),
    ApiCall("node", "watch", "resourceslices", "resource.k8s.io", why="its pool deleted or edited by others"),
    ApiCall("node", "create", "resourceslices", "resource.k8s.io", why="publish its pool"),
    ApiCall("node", "update", "resourceslices", "resource.k8s.io", why="a new pool generation"),
    ApiCall("node", "delete", "resourceslices", "resource.k8s.io", why="slices left over, and at uninstall"),
    ApiCall(
        "node", "get", "resourceclaims", "resource.k8s.io", why="DRA: the claim NodePrepareResources prepares"
    ),
    # certificate Jobs.
    ApiCall("certs-create", "get", "secrets", named="tls-secret"),
    ApiCall("certs-create", "create", "secrets", why="names of new objects cannot be limited"),
    ApiCall("certs-create", "update", "secrets", named="tls-secret", why="re-issue"),
    ApiCall("certs-patch", "get", "secrets", named="tls-secret", why="read ca.crt"),
    ApiCall(
        "certs-patch",
        "get",
        "mutatingwebhookconfigurations",
        "admissionregistration.k8s.io",
        "webhook-configuration",
    ),
    ApiCall(
        "certs-patch",
        "patch",
        "mutatingwebhookconfigurations",
        "admissionregistration.k8s.io",
        "webhook-configuration",
        "caBundle",
    ),
    ApiCall(
        "certs-patch",
        "get",
        "validatingwebhookconfigurations",
        "admissionregistration.k8s.io",
        "webhook-configuration",
    ),
    ApiCall(
        "certs-patch",
        "patch",
        "validatingwebhookconfigurations",
        "admissionregistration.k8s.io",
        "webhook-configuration",
        "caBundle",
    ),
)


# The renewal CronJob runs `certs create` then `certs patch` under one service account.
_RENEWAL_CALLS = tuple(
    {
        (c.group, c.resource, c.verb): replace(c, component="certs-renew")
        for c in _OWN_CALLS
        if c.component in ("certs-create", "certs-patch")
    }.values()
)
API_CALLS: Final[tuple[ApiCall, ...]] = (*_OWN_CALLS, *_RENEWAL_CALLS)


def declared(component: Component, verb: Verb, resource: str, group: str) -> bool:
    """Whether `component` may make this call."""
    return any(
        c.component == component and c.verb == verb and c.resource == resource and c.group == group
        for c in API_CALLS
    )
