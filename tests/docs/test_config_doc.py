"""The README's configuration table names every key the program's configuration accepts, so the
docs cannot fall behind the code (kube_vgpu.contract.config_rules is the one list of keys and bounds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kube_vgpu.contract.config_rules import RULES

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
KEYS = [f"{section}.{key}" for section, rules in RULES.items() for key in rules]


@pytest.mark.parametrize("key", KEYS)
def test_every_config_key_has_a_row_in_the_readme(key: str) -> None:
    assert f"| `{key}` |" in README, f"README's configuration table has no row for {key}"
