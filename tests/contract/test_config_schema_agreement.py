"""The program's config validation and the chart's values schema agree, from one source
(src/kube_vgpu/contract/config_rules.py): the chart's `config` schema is exactly `config_schema()`, and every
bound refuses and admits the same values in both."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from kube_vgpu.contract.config import ConfigError, parse_config
from kube_vgpu.contract.config_rules import RULES, config_schema
from tests.support.helm_render import CHART_DIR, default_values, validate_values


def without_descriptions(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: without_descriptions(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [without_descriptions(v) for v in node]
    return node


def test_the_charts_config_schema_is_the_programs() -> None:
    chart = json.loads((CHART_DIR / "values.schema.json").read_text())["properties"]["config"]
    assert without_descriptions(chart) == config_schema()


def probes() -> Iterator[tuple[str, str, Any, bool]]:
    """(section, key, value, allowed) at and across each bound a rule sets."""
    for section, rules in RULES.items():
        for key, rule in rules.items():
            if "minimum" in rule:
                yield section, key, rule["minimum"], True
                yield section, key, rule["minimum"] - 1, False
            if "exclusiveMinimum" in rule:
                yield section, key, rule["exclusiveMinimum"], False
                yield section, key, rule["exclusiveMinimum"] + 0.5, True
            if "maximum" in rule:
                yield section, key, rule["maximum"], True
                yield section, key, rule["maximum"] + 1, False
            if "enum" in rule:
                yield section, key, rule["enum"][0], True
                yield section, key, "other", False
            if "pattern" in rule:
                yield section, key, "Not Valid!", False
            if "minimum" in rule.get("items", {}):
                yield section, key, [rule["items"]["minimum"] - 1], False
            if "minLength" in rule.get("items", {}):
                yield section, key, [""], False
                yield section, key, ["x" * rule["items"]["minLength"]], True


PROBES = list(probes())


@pytest.mark.parametrize(
    ("section", "key", "value", "allowed"), PROBES, ids=[f"{s}.{k}={v!r}" for s, k, v, _ in PROBES]
)
def test_program_and_chart_refuse_and_admit_the_same_values(
    section: str, key: str, value: Any, allowed: bool
) -> None:
    document = {section: {key: value}}
    try:
        parse_config(yaml.safe_dump(document), source="config.yaml")
        program_allows = True
    except ConfigError as exc:
        program_allows = False
        assert f"{section}.{key}" in str(exc)
    values = copy.deepcopy(default_values())
    values["config"].setdefault(section, {})[key] = value
    try:
        validate_values(values)
        chart_allows = True
    except Exception:
        chart_allows = False
    assert (program_allows, chart_allows) == (allowed, allowed)


@pytest.mark.parametrize(
    ("document", "says"),
    [
        # the two surprises: a split count of 0 hung the demo, port 99999 was accepted
        ("node: {deviceSplitCount: 0}", "node.deviceSplitCount: expected at least 1, got 0"),
        ("node: {metricsPort: 99999}", "node.metricsPort: expected at most 65535, got 99999"),
        ("node: {hookPath: usr/local/vgpu}", "an absolute path"),
        ("resourceNames: {count: gpus}", "e.g. volcano.sh/vgpu-number"),
    ],
)
def test_refusals_say_what_to_write(document: str, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(document, source="config.yaml")
    assert says in str(info.value)
