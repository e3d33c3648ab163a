"""docs/configuration.md's table names every key the program's configuration accepts, so the docs
cannot fall behind the code (kube_vgpu.contract.config_rules is the one list of keys and bounds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kube_vgpu.contract.config_rules import RULES

DOC = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
KEYS = [f"{section}.{key}" for section, rules in RULES.items() for key in rules]


@pytest.mark.parametrize("key", KEYS)
def test_every_config_key_has_a_row_in_the_configuration_doc(key: str) -> None:
    assert f"| `{key}` |" in DOC, f"docs/configuration.md's table has no row for {key}"
