"""A YAML syntax error in any file a user hands kube-vgpu is one line with its line and column."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from kube_vgpu.contract.config import ConfigError, load_config, parse_config
from kube_vgpu.contract.yamltext import safe_load, safe_load_all, yaml_problem
from kube_vgpu.demo.examples import ExampleError, load_nodes, load_pods
from kube_vgpu.kubeapi.client import KubeConfigError, load_api_client
from kube_vgpu.standins.nvml.api import load_simulation
from kube_vgpu.standins.nvml.config import SimulationError


@pytest.mark.parametrize(
    ("text", "where"), [("node: [\n", "(line 2, column 1)"), ("a: b\n  c: d\n", "(line 2, column 4)")]
)
def test_a_config_yaml_error_is_one_line_with_its_place(text: str, where: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, source="config.yaml")
    message = str(info.value)
    assert message.startswith("config.yaml: not valid YAML: ") and message.endswith(where)
    assert "\n" not in message and "^" not in message


DEEP = "a: " + "[" * 5000 + "]" * 5000 + "\n"  # PyYAML's composer recurses once per level
NOT_UTF8 = b"node: \xff\xfe\n"


def _each_loader(tmp_path: Path, content: bytes) -> list[tuple[str, Callable[[], object], type[Exception]]]:
    """Every reader of a user's YAML file, each given `content` the way it reads a file."""
    (tmp_path / "f.yaml").write_bytes(content)
    (tmp_path / "pods").mkdir()
    (tmp_path / "pods" / "01.yaml").write_bytes(content)
    (tmp_path / "home" / ".kube").mkdir(parents=True)
    (tmp_path / "home" / ".kube" / "config").write_bytes(content)
    file = tmp_path / "f.yaml"
    return [
        ("config file", lambda: load_config(file), ConfigError),
        ("simulation file", lambda: load_simulation(file, "n"), SimulationError),
        ("demo nodes.yaml", lambda: load_nodes(file), ExampleError),
        ("demo pod", lambda: load_pods(tmp_path / "pods"), ExampleError),
        ("kubeconfig", lambda: load_api_client(str(tmp_path / "home" / ".kube" / "config")), KubeConfigError),
    ]


@pytest.mark.parametrize(
    ("content", "says"), [(DEEP.encode(), "nested too deeply"), (NOT_UTF8, "not UTF-8 text")]
)
def test_every_yaml_reader_names_a_hostile_file_in_one_line(
    tmp_path: Path, content: bytes, says: str
) -> None:
    # A RecursionError or UnicodeDecodeError used to escape each of them as a traceback.
    for name, load, error in _each_loader(tmp_path, content):
        with pytest.raises(error) as info:
            load()
        message = str(info.value)
        assert says in message and "\n" not in message, (name, message)


def test_deep_nesting_within_the_limit_is_read() -> None:
    assert safe_load("a: " + "[" * 50 + "]" * 50 + "\n") is not None


def _refusal(text: str) -> str:
    with pytest.raises(yaml.YAMLError) as info:
        safe_load(text)
    return yaml_problem(info.value)


def test_a_key_given_twice_is_refused_naming_it_and_both_lines() -> None:
    # PyYAML keeps the last value and says nothing: the first setting would be dropped unseen.
    assert yaml.safe_load("a: 1\nb: 2\na: 3\n") == {"a": 3, "b": 2}
    assert _refusal("a: 1\nb: 2\na: 3\n") == (
        "not valid YAML: key 'a' given twice (lines 1 and 3): keep one of them"
    )
    assert _refusal("top:\n  - {k: 1, k: 2}\n") == (
        "not valid YAML: key 'k' given twice (line 2): keep one of them"
    )


def test_keys_are_compared_as_the_mapping_would_hold_them() -> None:
    assert "key 1 given twice (lines 1 and 2)" in _refusal("1: a\n0x1: b\n")
    assert "key 'a' given twice" in _refusal('"a": 1\na: 2\n')


def test_the_same_key_in_different_mappings_and_a_key_overriding_a_merge_are_read() -> None:
    assert safe_load("webhook: {port: 1}\nnode: {port: 2}\n") == {"webhook": {"port": 1}, "node": {"port": 2}}
    merged = "base: &b {x: 1, y: 1}\nc:\n  <<: *b\n  x: 2\n"
    assert safe_load(merged)["c"] == {"x": 2, "y": 1}
    assert "key 'x' given twice" in _refusal("base: &b {x: 1}\nc:\n  <<: *b\n  x: 2\n  x: 3\n")
    # A mapping merged in a later document is checked too.
    documents = safe_load_all("a: &a {x: 1}\nb: {<<: *a}\n---\na: &a {x: 1, x: 2}\nb: {<<: *a}\n")
    assert next(documents)["b"] == {"x": 1}
    with pytest.raises(yaml.YAMLError, match=r"key 'x' given twice \(line 4\)"):
        next(documents)


def test_a_key_given_twice_inside_a_merged_mapping_is_refused() -> None:
    # PyYAML flattens a merged mapping into the one merging it without constructing it on its own:
    # this was read as migGraceSeconds 5.
    text = "node:\n  <<: {migGraceSeconds: 120, migGraceSeconds: 5}\n"
    assert yaml.safe_load(text) == {"node": {"migGraceSeconds": 5}}
    with pytest.raises(ConfigError) as info:
        parse_config(text, source="config.yaml")
    assert str(info.value) == (
        "config.yaml: not valid YAML: key 'migGraceSeconds' given twice (line 2): keep one of them"
    )
    # Through an alias, and in a list of merged mappings, at any depth.
    assert "key 'x' given twice (lines 2 and 3)" in _refusal("a: &a\n  {x: 1,\n  x: 2}\nc:\n  <<: *a\n")
    assert "key 'y' given twice" in _refusal("c:\n  <<: [{x: 1}, {y: 1, y: 2}]\n")
    assert "key 'z' given twice" in _refusal("c:\n  <<: {<<: {z: 1, z: 2}}\n")


def test_a_second_merge_key_in_one_mapping_is_refused() -> None:
    text = "node:\n  <<: {migGraceSeconds: 120}\n  <<: {migGraceSeconds: 5}\n"
    assert yaml.safe_load(text) == {"node": {"migGraceSeconds": 5}}
    with pytest.raises(ConfigError) as info:
        parse_config(text, source="config.yaml")
    assert str(info.value) == (
        "config.yaml: not valid YAML: merge key '<<' given twice (lines 2 and 3): give one `<<` with a"
        " list of the mappings to merge"
    )
    # One merge key per mapping, in as many mappings as there are, is read; so is a quoted "<<",
    # which is a plain key.
    one_each = "a: &a {x: 1}\nb: {<<: *a}\nc: {<<: *a, y: 2}\n"
    assert safe_load(one_each) == {"a": {"x": 1}, "b": {"x": 1}, "c": {"x": 1, "y": 2}}
    assert safe_load('c: {"<<": 1, x: 2}\n') == {"c": {"<<": 1, "x": 2}}
    assert "key '<<' given twice" in _refusal('c: {"<<": 1, "<<": 2}\n')


def test_merges_give_explicit_keys_and_earlier_merged_mappings_precedence() -> None:
    # yaml.org/type/merge.html: a key of the mapping itself overrides a merged one, and of a list of
    # merged mappings the earlier overrides the later.
    config = parse_config("node:\n  <<: {migGraceSeconds: 120}\n  migGraceSeconds: 5\n", source="c")
    assert config.node.mig_grace_seconds == 5.0
    listed = "a: &a {x: 1, y: 1}\nb: &b {x: 2, z: 2}\nc:\n  <<: [*a, *b]\n  y: 3\n"
    assert safe_load(listed)["c"] == {"x": 1, "y": 3, "z": 2}


def test_a_merged_mapping_keeps_its_own_override_of_its_merge() -> None:
    # PyYAML's flatten_mapping keeps the first of a key's merged pairs: it read `c` as {a: 1}.
    text = "b: &b\n  <<: {a: 1}\n  a: 2\nc:\n  <<: *b\nd:\n  <<: [*b]\n"
    assert yaml.safe_load(text)["c"] == {"a": 1}
    assert safe_load(text) == {"b": {"a": 2}, "c": {"a": 2}, "d": {"a": 2}}


def test_load_all_checks_every_document() -> None:
    assert list(safe_load_all("a: 1\n---\na: 2\n")) == [{"a": 1}, {"a": 2}]
    with pytest.raises(yaml.YAMLError, match=r"key 'b' given twice \(lines 3 and 4\)"):
        list(safe_load_all("a: 1\n---\nb: 1\nb: 2\n"))


def test_a_config_file_setting_a_key_twice_is_refused_naming_the_file(tmp_path: Path) -> None:
    file = tmp_path / "config.yaml"
    file.write_text("node:\n  deviceSplitCount: 4\n  hookPath: /opt/vgpu\n  deviceSplitCount: 20\n")
    with pytest.raises(ConfigError) as info:
        load_config(file)
    assert str(info.value) == (
        f"{file}: not valid YAML: key 'deviceSplitCount' given twice (lines 2 and 4): keep one of them"
    )
    file.write_text("node:\n  deviceSplitCount: 4\n  hookPath: /opt/vgpu\n")
    assert load_config(file).node.device_split_count == 4


def test_every_yaml_reader_refuses_a_key_given_twice_in_one_line(tmp_path: Path) -> None:
    for name, load, error in _each_loader(tmp_path, b"nodes: []\nnodes: []\n"):
        with pytest.raises(error) as info:
            load()
        message = str(info.value)
        assert "key 'nodes' given twice (lines 1 and 2)" in message and "\n" not in message, (name, message)
