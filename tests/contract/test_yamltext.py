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
        "not valid YAML: key 'a' given twice, on lines 1 and 3 (line 3, column 1)"
    )
    assert _refusal("top:\n  - {k: 1, k: 2}\n") == (
        "not valid YAML: key 'k' given twice, on line 2 (line 2, column 12)"
    )


def test_keys_are_compared_as_the_mapping_would_hold_them() -> None:
    assert "key 1 given twice, on lines 1 and 2" in _refusal("1: a\n0x1: b\n")
    assert "key 'a' given twice" in _refusal('"a": 1\na: 2\n')


def test_the_same_key_in_different_mappings_and_a_key_overriding_a_merge_are_read() -> None:
    assert safe_load("webhook: {port: 1}\nnode: {port: 2}\n") == {"webhook": {"port": 1}, "node": {"port": 2}}
    merged = "base: &b {x: 1, y: 1}\nc:\n  <<: *b\n  x: 2\n"
    assert safe_load(merged)["c"] == {"x": 2, "y": 1}
    assert "key 'x' given twice" in _refusal("base: &b {x: 1}\nc:\n  <<: *b\n  x: 2\n  x: 3\n")


def test_load_all_checks_every_document() -> None:
    assert list(safe_load_all("a: 1\n---\na: 2\n")) == [{"a": 1}, {"a": 2}]
    with pytest.raises(yaml.YAMLError, match="key 'b' given twice, on lines 3 and 4"):
        list(safe_load_all("a: 1\n---\nb: 1\nb: 2\n"))


def test_a_config_file_setting_a_key_twice_is_refused_naming_the_file(tmp_path: Path) -> None:
    file = tmp_path / "config.yaml"
    file.write_text("node:\n  deviceSplitCount: 4\n  hookPath: /opt/vgpu\n  deviceSplitCount: 20\n")
    with pytest.raises(ConfigError) as info:
        load_config(file)
    assert str(info.value) == (
        f"{file}: not valid YAML: key 'deviceSplitCount' given twice, on lines 2 and 4 (line 4, column 3)"
    )
    file.write_text("node:\n  deviceSplitCount: 4\n  hookPath: /opt/vgpu\n")
    assert load_config(file).node.device_split_count == 4


def test_every_yaml_reader_refuses_a_key_given_twice_in_one_line(tmp_path: Path) -> None:
    for name, load, error in _each_loader(tmp_path, b"nodes: []\nnodes: []\n"):
        with pytest.raises(error) as info:
            load()
        message = str(info.value)
        assert "key 'nodes' given twice, on lines 1 and 2" in message and "\n" not in message, (name, message)
