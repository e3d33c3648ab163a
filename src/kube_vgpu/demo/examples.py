"""The demo's inputs: simulated nodes, namespaces, and example pods with the outcome each expects.

Expectations ride on the pods as `demo.kube-vgpu.io/*` annotations, so each example is one readable
manifest: `expect` is `allocated`, `denied` or `pending`; `expect-node`, `expect-message` (a
substring of the denial, or of the scheduler's reason for a pending pod) and `expect-env` (comma list
of `NAME=prefix`) refine it.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from kube_vgpu.contract.names import MODES
from kube_vgpu.contract.yamltext import safe_load, utf8_problem, yaml_problem
from kube_vgpu.standins.nvml.config import SimulationError, parse_simulation

EXPECT_PREFIX = "demo.kube-vgpu.io/"
# What an examples folder holds; every error about a missing or malformed file repeats it.
LAYOUT = "an examples folder holds nodes.yaml, namespaces.yaml and pods/*.yaml (see examples/)"
Expected = Literal["allocated", "denied", "pending"]
_OUTCOMES: dict[str, Expected] = {"allocated": "allocated", "denied": "denied", "pending": "pending"}
_NODE_KEYS = ("name", "mode", "gpus", "events")
# Names as the API server validates them: a namespace is an RFC 1123 label, a node or a pod an RFC
# 1123 subdomain. Checked here, so a name it would refuse is named before anything starts.
_DNS_LABEL = (
    re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"),
    63,
    "a DNS label (lower-case letters, digits, '-')",
)
_DNS_SUBDOMAIN = (
    re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"),
    253,
    "a DNS subdomain (lower-case letters, digits, '-', '.')",
)


class ExampleError(ValueError):
    """An example file is malformed; the message names the file and the key."""


@dataclass(frozen=True)
class NodeSpec:
    """One simulated node: its name, mode and the `--simulate` document of its GPUs."""

    name: str
    mode: str
    simulation: Mapping[str, Any]


@dataclass(frozen=True)
class NamespaceSpec:
    """A namespace and its labels (quota labels among them)."""

    name: str
    labels: Mapping[str, str]


@dataclass(frozen=True)
class Expectation:
    """How an example pod should end."""

    outcome: Expected
    node: str | None = None
    message: str | None = None
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ExamplePod:
    """A pod manifest from `pods/`, with its expectation."""

    source: str
    manifest: Mapping[str, Any]
    expect: Expectation

    @property
    def key(self) -> str:
        """`namespace/name`."""
        meta = self.manifest["metadata"]
        return f"{meta['namespace']}/{meta['name']}"


def _check_name(name: str, where: str, rule: tuple[re.Pattern[str], int, str]) -> None:
    pattern, limit, what = rule
    if len(name) > limit or pattern.fullmatch(name) is None:
        raise ExampleError(f"{where}: must be {what} of at most {limit} characters, got {name!r}")


def _load(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ExampleError(f"{path}: cannot read it ({exc.strerror}); {LAYOUT}") from None
    except UnicodeDecodeError as exc:
        raise ExampleError(f"{path}: {utf8_problem(exc)}") from None
    try:
        return safe_load(text)
    except yaml.YAMLError as exc:
        raise ExampleError(f"{path}: {yaml_problem(exc)}") from None


def load_nodes(path: Path) -> list[NodeSpec]:
    """Read `nodes.yaml`."""
    doc = _load(path)
    nodes = doc.get("nodes") if isinstance(doc, Mapping) else None
    if not isinstance(nodes, list) or not nodes:
        raise ExampleError(f"{path}: expected a non-empty `nodes:` list")
    specs: list[NodeSpec] = []
    for i, raw in enumerate(nodes):
        where = f"{path}: nodes[{i}]"
        if not isinstance(raw, Mapping) or not isinstance(raw.get("name"), str):
            raise ExampleError(f"{where}: needs a name")
        _check_name(raw["name"], f"{where}.name", _DNS_SUBDOMAIN)
        unknown = sorted(str(k) for k in raw if k not in _NODE_KEYS)
        if unknown:
            raise ExampleError(f"{where}: unknown key {unknown[0]!r} (allowed: {', '.join(_NODE_KEYS)})")
        if raw.get("mode") not in MODES:
            raise ExampleError(f"{where}.mode: expected one of {', '.join(MODES)}, got {raw.get('mode')!r}")
        if not isinstance(raw.get("gpus"), list):
            raise ExampleError(f"{where}.gpus: expected a list")
        simulation = {"gpus": raw["gpus"], "events": raw.get("events", [])}
        try:
            # Checked here, as the node plugin's --simulate file is, so a typo is named with its file
            # and node before anything starts (rather than failing inside a running plugin).
            parse_simulation(simulation, raw["name"])
        except SimulationError as exc:
            raise ExampleError(f"{where} (node {raw['name']}): {exc}") from None
        specs.append(NodeSpec(raw["name"], raw["mode"], simulation))
    names = [spec.name for spec in specs]
    duplicate = next((name for name in names if names.count(name) > 1), None)
    if duplicate is not None:
        raise ExampleError(f"{path}: node name {duplicate!r} appears twice; each node needs its own")
    return specs


def load_namespaces(path: Path) -> list[NamespaceSpec]:
    """Read `namespaces.yaml`."""
    doc = _load(path)
    items = doc.get("namespaces") if isinstance(doc, Mapping) else None
    if not isinstance(items, list):
        raise ExampleError(f"{path}: expected a `namespaces:` list")
    specs: list[NamespaceSpec] = []
    for i, item in enumerate(items):
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            raise ExampleError(
                f"{path}: namespaces[{i}]: needs a name, e.g. {{name: team-a, labels: {{...}}}}"
            )
        _check_name(item["name"], f"{path}: namespaces[{i}].name", _DNS_LABEL)
        labels = item.get("labels") or {}
        if not isinstance(labels, Mapping):
            raise ExampleError(f"{path}: namespaces[{i}].labels: expected a mapping of label to value")
        specs.append(NamespaceSpec(item["name"], {str(k): str(v) for k, v in labels.items()}))
    return specs


def check_pod_namespaces(pods: list[ExamplePod], namespaces: list[NamespaceSpec], folder: Path) -> None:
    """Refuse a pod whose namespace `namespaces.yaml` does not list (the API server would refuse to
    create it, so the webhook would never see it)."""
    known = [spec.name for spec in namespaces]
    for pod in pods:
        check_namespace(str(folder / pod.source), pod.manifest["metadata"]["namespace"], known)


def check_namespace(
    where: str, namespace: str, listed: Collection[str], *, default: str | None = None
) -> None:
    """Refuse a pod's `namespace` unless `namespaces.yaml` lists it (or it is `default`, where a pod
    that names none goes)."""
    if namespace in listed or (default is not None and namespace == default):
        return
    also = f" and is not {default!r}" if default is not None else ""
    raise ExampleError(
        f"{where}: metadata.namespace {namespace!r} is not in namespaces.yaml "
        f"(which lists {', '.join(sorted(listed)) or 'none'}){also}; add it there or change the pod"
    )


def _expectation(source: str, annotations: Mapping[str, str]) -> Expectation:
    raw = annotations.get(EXPECT_PREFIX + "expect")
    outcome = _OUTCOMES.get(raw or "")
    if outcome is None:
        found = "is missing" if raw is None else f"is {raw!r}"
        raise ExampleError(
            f"{source}: annotation {EXPECT_PREFIX}expect {found}; it must be allocated, denied or "
            f"pending. Every example pod says how it must end in metadata.annotations: "
            f"{EXPECT_PREFIX}expect: allocated (it starts; optionally "
            f"expect-node and expect-env: NAME=prefix,...) or denied (the webhook refuses it; "
            f"optionally expect-message: a part of the denial) or pending (admitted, and the scheduler "
            f"finds no GPU for it; optionally expect-message: a part of its reason)"
        )
    env: list[tuple[str, str]] = []
    for item in filter(None, (annotations.get(EXPECT_PREFIX + "expect-env") or "").split(",")):
        name, sep, prefix = item.partition("=")
        if not sep:
            raise ExampleError(f"{source}: expect-env item {item!r} is not NAME=prefix")
        env.append((name.strip(), prefix.strip()))
    return Expectation(
        outcome,
        annotations.get(EXPECT_PREFIX + "expect-node"),
        annotations.get(EXPECT_PREFIX + "expect-message"),
        tuple(env),
    )


def check_pod_manifest(
    where: str, manifest: Mapping[str, Any], *, namespaced: bool = True
) -> Mapping[str, str]:
    """The shapes the API server's decoder needs before any webhook sees a pod (what it refuses beyond
    them is named when the pod is created); returns its annotations. `namespaced`: whether the pod
    must name its namespace (an example of `dra/` may leave it to `default`)."""
    spec = manifest.get("spec")
    if spec is not None and not isinstance(spec, Mapping):
        raise ExampleError(f"{where}: spec: expected a mapping, got {spec!r}")
    for group in ("initContainers", "containers", "ephemeralContainers"):
        listed = (spec or {}).get(group)
        if listed is not None and not isinstance(listed, list):
            raise ExampleError(f"{where}: spec.{group}: expected a list of containers, got {listed!r}")
    meta = manifest.get("metadata") or {}
    if not isinstance(meta, Mapping) or not meta.get("name") or (namespaced and not meta.get("namespace")):
        required = (
            "metadata.name and metadata.namespace are required (the namespace must be one of namespaces.yaml)"
            if namespaced
            else "metadata.name is required"
        )
        raise ExampleError(f"{where}: {required}")
    for key in ("name", "namespace"):
        if key in meta and not isinstance(meta[key], str):
            raise ExampleError(f"{where}: metadata.{key}: expected a string, got {meta[key]!r}")
    _check_name(meta["name"], f"{where}: metadata.name", _DNS_SUBDOMAIN)
    annotations = meta.get("annotations") or {}
    if not isinstance(annotations, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in annotations.items()
    ):
        raise ExampleError(
            f"{where}: metadata.annotations: expected a mapping of text to text (quote numbers), "
            f"got {annotations!r}"
        )
    return annotations


def load_pods(folder: Path) -> list[ExamplePod]:
    """Every `*.yaml` pod in `folder`, in file-name order."""
    pods: list[ExamplePod] = []
    for path in sorted(folder.glob("*.yaml")):
        manifest = _load(path)
        if not isinstance(manifest, Mapping) or (manifest.get("apiVersion"), manifest.get("kind")) != (
            "v1",
            "Pod",
        ):
            raise ExampleError(f"{path}: expected a Pod manifest (apiVersion: v1, kind: Pod)")
        annotations = check_pod_manifest(str(path), manifest)
        pods.append(ExamplePod(path.name, manifest, _expectation(path.name, annotations)))
    if not pods:
        raise ExampleError(f"{folder}: no example pods (*.yaml); {LAYOUT}")
    return pods
