"""The README's configuration table names every key the program's configuration accepts, so the
docs cannot fall behind the code (kube_vgpu.contract.config_rules is the one list of keys and bounds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kube_vgpu.contract.config_rules import RULES

ROOT = Path(__file__).resolve().parents[2]
# The README's table, or a table of the docs/ page that describes the key.
DOCS = "\n".join(path.read_text() for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
KEYS = [f"{section}.{key}" for section, rules in RULES.items() for key in rules]


@pytest.mark.parametrize("key", KEYS)
def test_every_config_key_has_a_row_in_the_docs(key: str) -> None:
    assert f"| `{key}` |" in DOCS, f"no row for {key} in README or docs/"
