"""Every chart value and configuration key the README and docs/ name in code (`webhook.metricsPort`,
`--set node.mig.privileged=false`) exists, so a page cannot send a user to a value the chart does
not have (docs/monitoring.md once named a `webhook.clientCA` that never existed)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from kube_vgpu.contract.config_rules import RULES

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "kube-vgpu"
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
CODE = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(r"^([a-z][A-Za-z0-9]*(?:\.[A-Za-z0-9_]+)+)(?:=|$)")
FILE_SUFFIXES = (".yaml", ".yml", ".json", ".md", ".py", ".sh", ".txt")


def _value_paths(document: Any, prefix: tuple[str, ...] = ()) -> set[str]:
    found = {".".join(prefix)}
    if isinstance(document, dict):
        for key, value in document.items():
            found |= _value_paths(value, (*prefix, str(key)))
    return found


def _schema_paths(schema: dict[str, Any], prefix: tuple[str, ...] = ()) -> set[str]:
    found = {".".join(prefix)}
    for key, sub in (schema.get("properties") or {}).items():
        found |= _schema_paths(sub, (*prefix, key))
    if isinstance(schema.get("items"), dict):  # a list's items: node.groups[].nodeSelector
        found |= _schema_paths(schema["items"], prefix)
    return found


VALUES = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
KNOWN = (
    _value_paths(VALUES)
    | _schema_paths(json.loads((CHART / "values.schema.json").read_text(encoding="utf-8")))
    | {f"{section}.{key}" for section, rules in RULES.items() for key in rules}  # config-file keys
    | set(RULES)
)
# Under `config:` the chart holds the configuration file, which the docs name without the prefix.
KNOWN |= {p.removeprefix("config.") for p in KNOWN if p.startswith("config.")}


def _module(name: str) -> bool:
    """Whether `name` is a module of the package (`webhook.quota.gate`), which docs name too."""
    base = REPO / "src" / "kube_vgpu" / Path(*name.split("."))
    return base.with_suffix(".py").is_file() or base.is_dir()


def unknown_values(text: str) -> list[str]:
    """Dotted names in code that start like a chart value but are neither a value nor a key."""
    found = []
    for code in CODE.findall(text):
        for word in code.split():
            match = DOTTED.match(word.removeprefix("--set").lstrip("="))
            if match is None:
                continue
            name = match.group(1)
            if name.split(".", 1)[0] not in VALUES or name.endswith(FILE_SUFFIXES) or _module(name):
                continue
            if name not in KNOWN:
                found.append(name)
    return found


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_value_a_page_names_exists(page: Path) -> None:
    assert unknown_values(page.read_text(encoding="utf-8")) == []


def test_the_checker_finds_a_value_that_does_not_exist() -> None:
    text = (
        "Set `webhook.clientCA`, `--set node.mig.privileged=false`, `webhook.metricsPort` (9395), "
        "`webhook.cacheStalenessSeconds`, `webhook.annotationWriters`, "
        "`monitoring.grafanaDashboard.enabled=true`, "
        "`node.metricPort`, `webhook.quota.gate`, `config.yaml`, `volcano.sh/vgpu-memory`.\n"
    )
    assert unknown_values(text) == ["webhook.clientCA", "node.metricPort"]
