"""Render and lint the kube-vgpu chart with the real Helm engine (helm-python's bundled libhelm), offline.

`helm_python.Chart.render` does not expose the Kubernetes version templates see as
`.Capabilities.KubeVersion`; the library call underneath it does (`kube_version` and
`api_versions` in its options, the same as `helm template --kube-version`), so `render` calls it
directly.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python
import yaml
from helm_python import _native

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "helm" / "kube-vgpu"
RELEASE = "kube-vgpu"
NAMESPACE = "gpu-system"

Obj = dict[str, Any]


@dataclass(frozen=True)
class Rendered:
    """What `helm template` would print for one values set and Kubernetes version."""

    kube_version: str
    namespace: str
    objects: tuple[Obj, ...]
    notes: str

    def of_kind(self, kind: str) -> list[Obj]:
        return [obj for obj in self.objects if obj["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> Obj:
        found = [obj for obj in self.of_kind(kind) if name is None or obj["metadata"]["name"] == name]
        if len(found) != 1:
            names = [obj["metadata"]["name"] for obj in self.of_kind(kind)]
            raise AssertionError(f"expected one {kind} named {name!r}, rendered: {names}")
        return found[0]

    def pod_templates(self) -> Iterator[tuple[Obj, Obj]]:
        """(workload, pod template) for every Deployment, DaemonSet and Job."""
        for obj in self.objects:
            if obj["kind"] in ("Deployment", "DaemonSet", "Job"):
                yield obj, obj["spec"]["template"]


@functools.cache
def _chart() -> helm_python.Chart:
    return helm_python.Chart.load(CHART_DIR)


def render_raw(
    values: Mapping[str, Any] | None,
    *,
    kube_version: str,
    release: str = RELEASE,
    namespace: str = NAMESPACE,
    api_versions: tuple[str, ...] = (),
) -> dict[str, str]:
    """Template path -> rendered text; raises helm_python.HelmError on schema or template failure."""
    options: dict[str, Any] = {
        "name": release,
        "namespace": namespace,
        "is_install": True,
        "kube_version": kube_version,
    }
    if api_versions:
        options["api_versions"] = list(api_versions)
    payload = _native.call_string(
        "helm_render",
        _chart()._raw(),  # noqa: SLF001 (helm-python-sdk has no public call for the loaded chart)
        None if values is None else json.dumps(values),
        json.dumps(options),
    )
    manifests: dict[str, str] = json.loads(payload)
    return manifests


def render(
    values: Mapping[str, Any] | None,
    *,
    kube_version: str,
    release: str = RELEASE,
    namespace: str = NAMESPACE,
) -> Rendered:
    """Render the chart and parse every YAML document it produced (NOTES.txt kept as text)."""
    manifests = render_raw(values, kube_version=kube_version, release=release, namespace=namespace)
    objects: list[Obj] = []
    notes = ""
    for path in sorted(manifests):
        text = manifests[path]
        if path.endswith("NOTES.txt"):
            notes = text
            continue
        for doc in yaml.safe_load_all(text):
            if doc is None:
                continue
            if not isinstance(doc, dict):
                raise AssertionError(f"{path} rendered a YAML document that is not a mapping: {doc!r}")
            objects.append(doc)
    return Rendered(kube_version=kube_version, namespace=namespace, objects=tuple(objects), notes=notes)


def lint(
    values: Mapping[str, Any] | None, *, kube_version: str, namespace: str = NAMESPACE
) -> dict[str, Any]:
    """`helm lint --strict` report: {"messages": [{"severity", "path", "error"}], "errors": [...]}."""
    return helm_python.lint(
        CHART_DIR,
        None if values is None else dict(values),
        strict=True,
        namespace=namespace,
        kube_version=kube_version,
    )


def validate_values(values: Mapping[str, Any]) -> None:
    """Check values against values.schema.json; raises helm_python.HelmValuesError."""
    _chart().validate_schema(dict(values))


def default_values() -> dict[str, Any]:
    """The chart's values.yaml as Helm reads it."""
    return _chart().values
