"""`kube-vgpu demo --examples DIR`: a malformed folder or file is named with what it needs."""

from __future__ import annotations

from pathlib import Path

import pytest

from kube_vgpu.demo.examples import ExampleError, load_namespaces, load_nodes, load_pods

POD = """apiVersion: v1
kind: Pod
metadata:
  name: p
  namespace: team-a
  annotations: {annotations}
spec:
  containers: [{{name: c, image: busybox}}]
"""


def pods_folder(tmp_path: Path, annotations: str) -> Path:
    folder = tmp_path / "pods"
    folder.mkdir()
    (folder / "01.yaml").write_text(POD.format(annotations=annotations))
    return folder


def test_a_pod_without_an_expectation_is_told_what_to_add(tmp_path: Path) -> None:
    with pytest.raises(ExampleError) as info:
        load_pods(pods_folder(tmp_path, "{}"))
    message = str(info.value)
    assert "01.yaml" in message and "is missing" in message and "None" not in message
    assert "demo.kube-vgpu.io/expect: allocated" in message and "denied" in message


def test_a_pod_with_a_wrong_expectation_gets_the_choices(tmp_path: Path) -> None:
    with pytest.raises(ExampleError, match="is 'maybe'; it must be allocated, denied or pending"):
        load_pods(pods_folder(tmp_path, "{demo.kube-vgpu.io/expect: maybe}"))


def test_a_folder_without_its_files_names_the_layout(tmp_path: Path) -> None:
    with pytest.raises(
        ExampleError, match=r"nodes\.yaml.*cannot read it.*namespaces\.yaml and pods/\*\.yaml"
    ):
        load_nodes(tmp_path / "nodes.yaml")
    (tmp_path / "pods").mkdir()
    with pytest.raises(ExampleError, match="no example pods"):
        load_pods(tmp_path / "pods")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("namespaces: [{labels: {a: b}}]", "namespaces[0]: needs a name"),
        ("namespaces: [{name: x, labels: [1]}]", "namespaces[0].labels: expected a mapping"),
        ("namespaces: [7]", "namespaces[0]: needs a name"),
    ],
)
def test_namespace_files_are_checked_not_crashed_on(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "namespaces.yaml"
    path.write_text(text)
    with pytest.raises(ExampleError) as info:
        load_namespaces(path)
    assert says in str(info.value)


def test_a_pod_without_a_namespace_is_told_where_namespaces_come_from(tmp_path: Path) -> None:
    folder = tmp_path / "pods"
    folder.mkdir()
    (folder / "01.yaml").write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n")
    with pytest.raises(ExampleError, match=r"namespaces\.yaml"):
        load_pods(folder)
