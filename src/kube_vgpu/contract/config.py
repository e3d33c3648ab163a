"""The one configuration file both the webhook and the node plugin read, with every default.

The Helm chart renders it into a ConfigMap; `--config FILE` points a process at it. Unknown keys
and wrong types are refused with a message naming the key, so a typo never silently falls back
to a default.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

from kube_vgpu.contract.config_rules import RULES, rule_problem
from kube_vgpu.contract.names import HAMI_CORE, MODES, Mode
from kube_vgpu.contract.yamltext import safe_load, utf8_problem, yaml_problem

OtherSchedulerPolicy = Literal["allow", "deny"]
_Section = TypeVar("_Section")


class ConfigError(ValueError):
    """The configuration file is unreadable or holds a bad value; the message names the key."""


@dataclass(frozen=True)
class ResourceNames:
    """The extended-resource names users write in container limits."""

    count: str = "volcano.sh/vgpu-number"
    memory: str = "volcano.sh/vgpu-memory"
    memory_percentage: str = "volcano.sh/vgpu-memory-percentage"
    cores: str = "volcano.sh/vgpu-cores"

    def all(self) -> tuple[str, str, str, str]:
        """The four names, count first."""
        return (self.count, self.memory, self.memory_percentage, self.cores)


@dataclass(frozen=True)
class WebhookConfig:
    """Admission behaviour of the webhook."""

    scheduler_name: str = "volcano"
    # What to do with a vGPU pod that names a scheduler other than default-scheduler/ours.
    other_schedulers: OtherSchedulerPolicy = "allow"
    default_mode: Mode = HAMI_CORE
    strict_selectors: bool = False
    # Bounded work per review: items in each GPU selector list, and the size of
    # the required node affinity after the pod's own terms are multiplied by the selectors' terms.
    max_selector_items: int = 128
    max_affinity_terms: int = 128
    max_affinity_expressions: int = 2048
    # Bounded work per review: containers (init, app and ephemeral together), volumes,
    # volumeMounts plus volumeDevices per container, env entries per container. Every rule walks
    # these lists; the limits are checked, by their lengths alone, before any rule does.
    max_containers: int = 256
    max_volumes: int = 1024
    max_mounts_per_container: int = 256
    max_env_per_container: int = 1024
    deny_privileged: bool = True
    # /readyz turns false, and quota decisions are refused, when the cluster cache has heard nothing
    # from the API for this long; a quota reservation whose pod the cache has not shown lives exactly
    # as long, so a reservation can never expire while the cache still looks fresh (issue 12).
    cache_staleness_seconds: float = 120.0
    # Who may add, change or remove the scheduler-owned pod annotations.
    annotation_writers: tuple[str, ...] = ("system:serviceaccount:volcano-system:volcano-scheduler",)
    # 1-100: /mutate writes this vgpu-cores into vGPU containers that state none; 0: it does not,
    # and such a container is charged a whole GPU's cores (100 per vGPU) against a cores quota.
    default_cores: int = 0
    # DeviceClasses whose ResourceClaims count against namespace GPU quotas and make a pod that uses
    # them a vGPU pod. Empty: the webhook neither watches nor judges ResourceClaims (clusters without
    # DRA node groups, where it may not read resource.k8s.io at all); the chart sets kube-vgpu's
    # class when DRA is enabled.
    dra_device_classes: tuple[str, ...] = ()


@dataclass(frozen=True)
class NodeConfig:
    """Node plugin behaviour."""

    device_split_count: int = 10
    ignored_xids: tuple[int, ...] = (13, 31, 43, 45, 68, 109)
    # A GPU marked unhealthy by an XID recovers after answering NVML normally this long.
    recovery_quiet_seconds: float = 60.0
    hook_path: str = "/usr/local/vgpu"
    metrics_port: int = 9394
    register_interval_seconds: float = 30.0
    # Allocate answers within this bound even if the API server hangs.
    allocate_timeout_seconds: float = 10.0
    # MIG instances no live pod holds are destroyed after this grace period.
    mig_grace_seconds: float = 120.0
    device_config_namespace: str = "kube-system"
    device_config_name: str = "volcano-vgpu-device-config"
    # Legacy liveness annotation for Volcano v1.12-v1.14.2 and v1.15.0 (removed from Volcano by PRs #5388 and
    # #5392).
    write_handshake: bool = False


@dataclass(frozen=True)
class Config:
    """Everything configurable, with the defaults users get when the file is absent."""

    resource_names: ResourceNames = field(default_factory=ResourceNames)
    webhook: WebhookConfig = field(default_factory=WebhookConfig)
    node: NodeConfig = field(default_factory=NodeConfig)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _check_value(where: str, value: Any, annotation: str) -> Any:
    """Validate one scalar against its dataclass field annotation (as written in this module)."""
    if annotation == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if annotation == "int":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"{where}: expected a non-negative integer, got {value!r}")
        return value
    if annotation == "float":
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ConfigError(f"{where}: expected a non-negative number, got {value!r}")
        return float(value)
    if annotation == "str":
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{where}: expected a non-empty string, got {value!r}")
        return value
    if annotation == "tuple[int, ...]":
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            raise ConfigError(f"{where}: expected a list of integers, got {value!r}")
        return tuple(value)
    if annotation == "tuple[str, ...]":
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise ConfigError(f"{where}: expected a list of non-empty strings, got {value!r}")
        return tuple(value)
    if annotation == "Mode":
        if value not in MODES:
            raise ConfigError(f"{where}: expected one of {', '.join(MODES)}, got {value!r}")
        return value
    if annotation == "OtherSchedulerPolicy":
        if value not in ("allow", "deny"):
            raise ConfigError(f"{where}: expected allow or deny, got {value!r}")
        return value
    raise AssertionError(f"unhandled config annotation {annotation}")


def _build_section(cls: type[_Section], where: str, raw: Any) -> _Section:
    if raw is None:
        return cls()
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {raw!r}")
    fields = {_camel(f.name): f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(map(str, unknown))}; known: {', '.join(fields)}"
        )
    values = {
        fields[key].name: _check_rule(
            f"{where}.{key}", _check_value(f"{where}.{key}", value, str(fields[key].type))
        )
        for key, value in raw.items()
    }
    return cls(**values)


def _check_rule(where: str, value: Any) -> Any:
    """Apply the key's bounds from contract.config_rules (the chart's schema holds the same)."""
    section, _, key = where.rpartition(": ")[2].partition(".")
    rule = RULES.get(section, {}).get(key)
    problem = None if rule is None else rule_problem(list(value) if isinstance(value, tuple) else value, rule)
    if problem is not None:
        raise ConfigError(f"{where}: expected {problem}, got {value!r}")
    return value


def parse_config(text: str, *, source: str = "config") -> Config:
    """Parse the YAML configuration document; an empty document means every default."""
    try:
        raw = safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: {yaml_problem(exc)}") from None
    if raw is None:
        return Config()
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(raw).__name__}")
    sections = {"resourceNames": ResourceNames, "webhook": WebhookConfig, "node": NodeConfig}
    unknown = sorted(set(raw) - set(sections))
    if unknown:
        raise ConfigError(
            f"{source}: unknown key(s) {', '.join(map(str, unknown))}; known: {', '.join(sections)}"
        )
    config = Config(
        resource_names=_build_section(ResourceNames, f"{source}: resourceNames", raw.get("resourceNames")),
        webhook=_build_section(WebhookConfig, f"{source}: webhook", raw.get("webhook")),
        node=_build_section(NodeConfig, f"{source}: node", raw.get("node")),
    )
    if config.webhook.default_cores > 100:
        raise ConfigError(
            f"{source}: webhook.defaultCores: expected 0 (off) to 100 (percent of one GPU), "
            f"got {config.webhook.default_cores}"
        )
    names = config.resource_names.all()
    if len(set(names)) != len(names):
        raise ConfigError(f"{source}: resourceNames must be four different names, got {list(names)}")
    return config


def load_config(path: str | Path | None) -> Config:
    """Read the configuration file at `path`; None means every default."""
    if path is None:
        return Config()
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: {utf8_problem(exc)}") from None
    return parse_config(text, source=str(path))
