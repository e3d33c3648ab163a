"""`kube-vgpu demo --examples DIR`: a malformed folder or file is named with what it needs."""

from __future__ import annotations

import re
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


NODES = "nodes:\n  - {{name: {name}, mode: hami-core, gpus: [{{model: NVIDIA H200}}]}}\n"


@pytest.mark.parametrize(
    ("kind", "name", "says"),
    [
        # Nodes and pods are DNS subdomains (253 characters), namespaces DNS labels (63), as the API
        # server validates them; a name it would refuse used to surface as its traceback mid-run.
        ("node", "GPU_A100", "nodes[0].name: must be a DNS subdomain"),
        ("node", "a" * 254, "at most 253 characters"),
        ("namespace", "Team_A", "namespaces[0].name: must be a DNS label"),
        ("namespace", "a" * 64, "at most 63 characters"),
        ("namespace", "a.b", "must be a DNS label"),
        ("pod", "Plain_Slice", "01.yaml: metadata.name: must be a DNS subdomain"),
        ("pod", "a" * 254, "at most 253 characters"),
    ],
)
def test_a_name_the_api_server_would_refuse_is_named(tmp_path: Path, kind: str, name: str, says: str) -> None:
    with pytest.raises(ExampleError) as info:
        if kind == "node":
            (tmp_path / "nodes.yaml").write_text(NODES.format(name=name))
            load_nodes(tmp_path / "nodes.yaml")
        elif kind == "namespace":
            (tmp_path / "namespaces.yaml").write_text(f"namespaces: [{{name: {name}}}]\n")
            load_namespaces(tmp_path / "namespaces.yaml")
        else:
            folder = pods_folder(tmp_path, "{demo.kube-vgpu.io/expect: allocated}")
            (folder / "01.yaml").write_text(
                (folder / "01.yaml").read_text().replace("name: p\n", f"name: {name}\n")
            )
            load_pods(folder)
    assert says in str(info.value) and f"got '{name[:20]}" in str(info.value)


def test_the_longest_names_are_accepted(tmp_path: Path) -> None:
    (tmp_path / "nodes.yaml").write_text(NODES.format(name="a." * 125 + "abc"))
    assert len(load_nodes(tmp_path / "nodes.yaml")[0].name) == 253
    (tmp_path / "namespaces.yaml").write_text(f"namespaces: [{{name: {'a' * 63}}}]\n")
    assert load_namespaces(tmp_path / "namespaces.yaml")[0].name == "a" * 63
    folder = pods_folder(tmp_path, "{demo.kube-vgpu.io/expect: allocated}")
    (folder / "01.yaml").write_text(
        (folder / "01.yaml").read_text().replace("name: p\n", f"name: {'b' * 253}\n")
    )
    assert load_pods(folder)[0].manifest["metadata"]["name"] == "b" * 253


def test_a_file_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    folder = pods_folder(tmp_path, "{demo.kube-vgpu.io/expect: allocated}")
    (folder / "01.yaml").write_bytes(b"\xff\xfe")
    with pytest.raises(ExampleError, match=r"01\.yaml: not UTF-8 text"):
        load_pods(folder)


@pytest.mark.parametrize(
    ("old", "new", "says"),
    [
        ("name: p\n", "name: 123\n", "metadata.name: expected a string, got 123"),
        ("namespace: team-a\n", "namespace: [1]\n", "metadata.namespace: expected a string, got [1]"),
        (
            "annotations: {",
            "annotations: {x: 5, ",
            "metadata.annotations: expected a mapping of text to text",
        ),
        ("apiVersion: v1\n", "apiVersion: v2\n", "expected a Pod manifest (apiVersion: v1, kind: Pod)"),
        ("spec:\n", "spec: 5\nx:\n", "spec: expected a mapping, got 5"),
        (
            "  containers: [",
            "  containers: 5\n  initContainers: [",
            "spec.containers: expected a list of containers",
        ),
    ],
)
def test_metadata_of_the_wrong_type_is_named(tmp_path: Path, old: str, new: str, says: str) -> None:
    folder = pods_folder(tmp_path, "{demo.kube-vgpu.io/expect: allocated}")
    (folder / "01.yaml").write_text((folder / "01.yaml").read_text().replace(old, new, 1))
    with pytest.raises(ExampleError, match=r"01\.yaml: ") as info:
        load_pods(folder)
    assert says in str(info.value)


def test_the_example_pods_comments_give_the_memory_they_ask_for() -> None:
    # Memory is booked in MiB: a comment in GiB (or a figure the pod does not ask for) misleads.
    examples = Path(__file__).resolve().parents[2] / "examples"
    quotas = {value for ns in load_namespaces(examples / "namespaces.yaml") for value in ns.labels.values()}
    for path in sorted((examples / "pods").glob("*.yaml")):
        text = path.read_text()
        comments = " ".join(line for line in text.splitlines() if line.lstrip().startswith("#"))
        assert not re.search(r"\d\s*(GiB|GB)\b", comments), f"{path.name}: {comments}"
        asked = set(re.findall(r'vgpu-memory: "?(\d+)"?', text))
        for figure in re.findall(r"(\d[\d,]*) MiB", comments):
            assert figure.replace(",", "") in asked | quotas, f"{path.name}: {figure} MiB is not in the pod"
