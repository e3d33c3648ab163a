"""A YAML syntax error in any file a user hands kube-vgpu is one line with its line and column."""

from __future__ import annotations

import pytest

from kube_vgpu.contract.config import ConfigError, parse_config


@pytest.mark.parametrize(
    ("text", "where"), [("node: [\n", "(line 2, column 1)"), ("a: b\n  c: d\n", "(line 2, column 4)")]
)
def test_a_config_yaml_error_is_one_line_with_its_place(text: str, where: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, source="config.yaml")
    message = str(info.value)
    assert message.startswith("config.yaml: not valid YAML: ") and message.endswith(where)
    assert "\n" not in message and "^" not in message
