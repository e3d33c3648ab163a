"""The bounds of every configuration key, in JSON Schema terms: the one source for the program's
own validation (src/kube_vgpu/contract/config.py applies them) and the chart's `values.schema.json`, whose
`config` section a test holds equal to `config_schema()`. So a value the chart accepts is one the
program accepts (`deviceSplitCount: 0`, `metricsPort: 99999` are refused by both)."""

from __future__ import annotations

import re
from typing import Any

# `<domain>/<name>`, as Kubernetes checks extended-resource names.
_DOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_RESOURCE_NAME = "^" + _DOMAIN + r"/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"

Rule = dict[str, Any]
# What each pattern means, for error messages a person can act on.
_PATTERN_MEANS = {
    _RESOURCE_NAME: "an extended-resource name <domain>/<name>, e.g. volcano.sh/vgpu-number",
    _DNS_SUBDOMAIN: "a DNS subdomain name (lower-case letters, digits, '-' and '.')",
    _DNS_LABEL: "a DNS label (lower-case letters, digits and '-')",
    "^/": "an absolute path (starting with /)",
}

RULES: dict[str, dict[str, Rule]] = {
    "resourceNames": {
        key: {"type": "string", "pattern": _RESOURCE_NAME, "maxLength": 253}
        for key in ("count", "memory", "memoryPercentage", "cores")
    },
    "webhook": {
        "schedulerName": {"type": "string", "pattern": _DNS_SUBDOMAIN},
        "otherSchedulers": {"type": "string", "enum": ["allow", "deny"]},
        "defaultMode": {"type": "string", "enum": ["hami-core", "mig"]},
        "strictSelectors": {"type": "boolean"},
        "denyPrivileged": {"type": "boolean"},
        "cacheStalenessSeconds": {"type": "number", "exclusiveMinimum": 0},
        "maxSelectorItems": {"type": "integer", "minimum": 1},
        "maxAffinityTerms": {"type": "integer", "minimum": 1},
        "maxAffinityExpressions": {"type": "integer", "minimum": 1},
        "maxContainers": {"type": "integer", "minimum": 1},
        "maxVolumes": {"type": "integer", "minimum": 1},
        "maxMountsPerContainer": {"type": "integer", "minimum": 1},
        "maxEnvPerContainer": {"type": "integer", "minimum": 1},
        "annotationWriters": {"type": "array", "items": {"type": "string", "minLength": 1}},
        "defaultCores": {"type": "integer", "minimum": 0, "maximum": 100},
        "draDeviceClasses": {"type": "array", "items": {"type": "string", "pattern": _DNS_SUBDOMAIN}},
    },
    "node": {
        # At most 1024: each slot is a device in ListAndWatch, and past that a large node's list nears
        # the kubelet's 4 MiB gRPC message limit (a typo like 10^20 hung the plugin building it).
        "deviceSplitCount": {"type": "integer", "minimum": 1, "maximum": 1024},
        "ignoredXids": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "recoveryQuietSeconds": {"type": "number", "minimum": 0},
        "hookPath": {"type": "string", "pattern": "^/"},
        "metricsPort": {"type": "integer", "minimum": 1, "maximum": 65535},
        "registerIntervalSeconds": {"type": "number", "exclusiveMinimum": 0},
        "allocateTimeoutSeconds": {"type": "number", "exclusiveMinimum": 0},
        "migGraceSeconds": {"type": "number", "minimum": 0},
        "deviceConfigNamespace": {"type": "string", "pattern": _DNS_LABEL},
        "deviceConfigName": {"type": "string", "pattern": _DNS_SUBDOMAIN},
        "writeHandshake": {"type": "boolean"},
    },
}


def config_schema() -> dict[str, Any]:
    """The JSON Schema of the configuration document (descriptions are the chart's to add)."""
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            section: {"type": "object", "additionalProperties": False, "properties": rules}
            for section, rules in RULES.items()
        },
    }


def rule_problem(value: Any, rule: Rule) -> str | None:
    """What is wrong with an already type-checked value under a rule, or None; says what is allowed."""
    if "enum" in rule and value not in rule["enum"]:
        return f"one of {', '.join(map(str, rule['enum']))}"
    if "minimum" in rule and value < rule["minimum"]:
        return f"at least {rule['minimum']}"
    if "exclusiveMinimum" in rule and value <= rule["exclusiveMinimum"]:
        return f"more than {rule['exclusiveMinimum']}"
    if "maximum" in rule and value > rule["maximum"]:
        return f"at most {rule['maximum']}"
    if "maxLength" in rule and len(value) > rule["maxLength"]:
        return f"at most {rule['maxLength']} characters"
    if "pattern" in rule and not re.search(rule["pattern"], value):
        return _PATTERN_MEANS.get(rule["pattern"], f"a string matching {rule['pattern']}")
    if "items" in rule:
        for item in value:
            problem = rule_problem(item, rule["items"])
            if problem is not None:
                return f"items {problem} (not {item!r})"
    return None
