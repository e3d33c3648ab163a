"""Every value of the chart is described, in values.yaml (a `# --` comment, what `helm show values`
prints) and in values.schema.json (a `description`); a node selector given replaces the default; and
the documented offline render/lint command works with what the project installs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from tests.support.helm_render import CHART_DIR, REPO_ROOT, render

VALUES = CHART_DIR / "values.yaml"
KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[^\s#:-][^:#]*?|\"[^\"]+\"):(\s|$)")


def described_paths(text: str) -> set[str]:
    """Key paths of values.yaml whose line follows a comment block holding a `# --` line (helm-docs).

    Lines inside list items are skipped: a described list describes its items.
    """
    described: set[str] = set()
    stack: list[tuple[int, str]] = []
    comments: list[str] = []
    list_indent: int | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            comments.append(stripped)
            continue
        if not stripped:
            comments = []
            continue
        indent = len(line) - len(line.lstrip(" "))
        if list_indent is not None and indent > list_indent:
            comments = []
            continue
        list_indent = None
        if stripped.startswith("- "):
            list_indent = indent
            comments = []
            continue
        match = KEY_LINE.match(line)
        if match is None:
            comments = []
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match["key"].strip('"')))
        if any(c.startswith("# --") for c in comments):
            described.add(".".join(key for _, key in stack))
        comments = []
    return described


def leaves(node: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Paths of the values: scalars, lists and empty maps are leaves; maps are walked into."""
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from leaves(value, (*path, str(key)))
    else:
        yield path


def under_described(path: tuple[str, ...], described: set[str]) -> bool:
    return any(".".join(path[:n]) in described for n in range(1, len(path) + 1))


DEFAULTS = yaml.safe_load(VALUES.read_text())
LEAVES = [".".join(p) for p in leaves(DEFAULTS)]


@pytest.mark.parametrize("leaf", LEAVES)
def test_every_value_has_a_description_in_values_yaml(leaf: str) -> None:
    described = described_paths(VALUES.read_text())
    assert under_described(tuple(leaf.split(".")), described), (
        f"{leaf} (or a map above it) has no '# --' description in values.yaml"
    )


def schema_description(schema: dict[str, Any], path: tuple[str, ...]) -> bool:
    node = schema
    for key in path:
        if "description" in node:
            return True
        properties = node.get("properties") or {}
        if key not in properties:
            return False
        node = properties[key]
    return "description" in node


@pytest.mark.parametrize("leaf", LEAVES)
def test_every_value_has_a_description_in_the_schema(leaf: str) -> None:
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    # The root's own description is for the whole file, not for each value.
    schema = {k: v for k, v in schema.items() if k != "description"}
    assert schema_description(schema, tuple(leaf.split("."))), f"{leaf} has no description in the schema"


def test_the_checker_sees_a_missing_description() -> None:
    text = "a:\n  # -- described\n  b: 1\n  c: 2\n# -- all of d\nd:\n  e: 1\nf:\n  - x: 1\n"
    described = described_paths(text)
    assert described == {"a.b", "d"}
    missing = [p for p in leaves(yaml.safe_load(text)) if not under_described(p, described)]
    assert missing == [("a", "c"), ("f",)]


def test_a_node_selector_replaces_the_default_instead_of_merging_with_it() -> None:
    given = render({"node": {"nodeSelector": {"pool": "gpu"}}}, kube_version="1.30")
    (ds,) = given.of_kind("DaemonSet")
    assert ds["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "gpu"}
    (default,) = render(None, kube_version="1.30").of_kind("DaemonSet")
    assert default["spec"]["template"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.present": "true"}


@pytest.mark.parametrize("empty", [None, {}])
def test_an_empty_or_null_node_selector_keeps_the_default(empty: dict[str, str] | None) -> None:
    # What values.yaml and docs/install.md say: `node.nodeSelector: null` (Helm's way of removing a
    # value) or `{}` leaves the GPU-node default in place; neither selects every node.
    (ds,) = render({"node": {"nodeSelector": empty}}, kube_version="1.30").of_kind("DaemonSet")
    assert ds["spec"]["template"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.present": "true"}


def test_a_groups_empty_selector_selects_every_node_and_null_is_refused() -> None:
    # A group's own `nodeSelector: {}` gives its DaemonSet no selector at all (every node its
    # tolerations allow); `null` there is refused by the schema, naming the field.
    group = {"name": "default", "mode": "hami-core", "nodeSelector": {}}
    (ds,) = render({"node": {"groups": [group]}}, kube_version="1.30").of_kind("DaemonSet")
    assert "nodeSelector" not in ds["spec"]["template"]["spec"]
    with pytest.raises(helm_python.HelmError, match="/node/groups/0/nodeSelector': got null, want object"):
        render({"node": {"groups": [{**group, "nodeSelector": None}]}}, kube_version="1.30")


def chart(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "chart.py"), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_offline_render_prints_what_helm_template_would(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text("webhook:\n  replicas: 3\n")
    result = chart("template", "-f", str(values), "--set", "webhook.port=9443", "--kube-version", "1.30")
    assert result.returncode == 0, result.stderr
    objects = [d for d in yaml.safe_load_all(result.stdout) if d]
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 3
    assert "--port=9443" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "# Source: kube-vgpu/templates/webhook-deployment.yaml" in result.stdout


def test_the_offline_lint_passes_and_bad_values_are_one_line() -> None:
    lint = chart("lint")
    assert lint.returncode == 0 and "lint passed" in lint.stdout, lint.stdout + lint.stderr
    refused = chart("template", "--set", "webhook.replicas=zero")
    assert refused.returncode == 1 and refused.stdout == ""
    assert "/webhook/replicas" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    unreadable = chart("template", "-f", "no-such-values.yaml")
    assert unreadable.returncode == 2 and "-f no-such-values.yaml: cannot read it" in unreadable.stderr


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (("a: " + "[" * 5000 + "]" * 5000 + "\n").encode(), "not valid YAML: nested too deeply"),
        (b"webhook: \xff\xfe\n", "not UTF-8 text"),
    ],
)
def test_a_hostile_values_file_is_one_line(tmp_path: Path, content: bytes, says: str) -> None:
    # Both used to end the offline render in a RecursionError or UnicodeDecodeError traceback.
    values = tmp_path / "values.yaml"
    values.write_bytes(content)
    result = chart("template", "-f", str(values))
    assert result.returncode == 2 and result.stdout == "", result.stderr
    assert f"-f {values}: {says}" in result.stderr and len(result.stderr.strip().splitlines()) == 1
