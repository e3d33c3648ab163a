"""A YAML syntax error in any file a user hands kube-vgpu is one line with its line and column."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from kube_vgpu.contract.config import ConfigError, load_config, parse_config
from kube_vgpu.contract.yamltext import safe_load
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
