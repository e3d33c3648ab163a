"""The README's configuration table names every key the program's configuration accepts, so the
docs cannot fall behind the code (contract/config_rules.py is the one list of keys and bounds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from contract.config_rules import RULES

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
KEYS = [f"{section}.{key}" for section, rules in RULES.items() for key in rules]


@pytest.mark.parametrize("key", KEYS)
def test_every_config_key_has_a_row_in_the_readme(key: str) -> None:
    assert f"| `{key}` |" in README, f"README's configuration table has no row for {key}"
