"""Finding the cluster as kubectl does: `--kubeconfig`, then `$KUBECONFIG` (a path list), then
`~/.kube/config`, then the in-cluster service account; `--context` picks a context; the error when
none works names every place tried. Driven through `kube-vgpu top` against the stand-in API server,
with a temporary HOME and `$KUBECONFIG`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from kube_vgpu.cli.main import main
from kube_vgpu.standins.apiserver.server import ApiServerStandin

DEAD = "https://127.0.0.1:1"  # nothing listens: a kubeconfig pointing here fails to read the cluster


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty HOME, no $KUBECONFIG, and no in-cluster service environment."""
    folder = tmp_path / "home"
    folder.mkdir()
    monkeypatch.setenv("HOME", str(folder))
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name in [n for n in os.environ if n.startswith("KUBE_VGPU_")]:
        monkeypatch.delenv(name)
    return folder


def config(api: ApiServerStandin, *, server: str | None = None, context: str = "standin") -> dict[str, Any]:
    """The stand-in's kubeconfig, optionally pointing elsewhere or with its names changed."""
    document = api.kubeconfig()
    if server is not None:
        document["clusters"][0]["cluster"]["server"] = server
    if context != "standin":
        document["clusters"][0]["name"] = document["users"][0]["name"] = context
        document["contexts"] = [{"name": context, "context": {"cluster": context, "user": context}}]
        document["current-context"] = context
    return document


def write(path: Path, document: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document))
    return path


def live_then_dead(api: ApiServerStandin, folder: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """$KUBECONFIG naming two files: the stand-in as context `live`, then a dead server as `dead`."""
    first = write(folder / "a.yaml", config(api, context="live"))
    second = write(folder / "b.yaml", config(api, server=DEAD, context="dead"))
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(first), str(second)]))
    return first, second


def top(capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, str]:
    code = main(["top", "-o", "json", *flags])
    return code, capsys.readouterr().err


def test_home_kube_config_is_read_when_nothing_else_is_given(
    apiserver: ApiServerStandin, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(home / ".kube" / "config", config(apiserver))
    assert top(capsys) == (0, "")


def test_kubeconfig_variable_is_a_path_list_and_hides_the_home_file(
    apiserver: ApiServerStandin,
    home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    write(home / ".kube" / "config", config(apiserver, server=DEAD))
    live = write(tmp_path / "live.yaml", config(apiserver))
    # A missing file in the list is skipped, as kubectl skips it.
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(tmp_path / "missing.yaml"), str(live)]))
    assert top(capsys) == (0, "")


def test_the_first_file_in_kubeconfig_sets_the_current_context(
    apiserver: ApiServerStandin,
    home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    live_then_dead(apiserver, tmp_path, monkeypatch)
    assert top(capsys) == (0, "")
    # Merged, the second file's context can still be chosen by name.
    code, err = top(capsys, "--context", "dead")
    assert code == 1 and "cannot read the cluster" in err


def test_the_flag_wins_over_the_variable(
    apiserver: ApiServerStandin,
    home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(write(tmp_path / "dead.yaml", config(apiserver, server=DEAD))))
    live = write(tmp_path / "live.yaml", config(apiserver))
    assert top(capsys, "--kubeconfig", str(live)) == (0, "")


def test_context_picks_a_context_and_an_unknown_one_is_named(
    apiserver: ApiServerStandin, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    document = config(apiserver)
    dead = config(apiserver, server=DEAD, context="dead")
    document["clusters"] += dead["clusters"]
    document["users"] += dead["users"]
    document["contexts"] += dead["contexts"]
    document["current-context"] = "dead"
    write(home / ".kube" / "config", document)
    assert top(capsys, "--context", "standin") == (0, "")
    code, err = top(capsys, "--context", "nope")
    assert code == 2 and err.strip().endswith(
        f"context 'nope' (from --context) is not in kubeconfig {home / '.kube' / 'config'} (from"
        " ~/.kube/config); its contexts: standin, dead"
    ), err
    assert "Invalid kube-config" not in err and len(err.strip().splitlines()) == 1


def test_an_unknown_context_from_the_variable_names_the_variable_and_every_file(
    apiserver: ApiServerStandin,
    home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    first, second = live_then_dead(apiserver, tmp_path, monkeypatch)
    monkeypatch.setenv("KUBE_VGPU_CONTEXT", "nope")
    code, err = top(capsys)
    assert code == 2 and err.strip().endswith(
        f"context 'nope' (from KUBE_VGPU_CONTEXT) is not in kubeconfig {first}{os.pathsep}{second} (from"
        " $KUBECONFIG); its contexts: live, dead"
    ), err
    # A context either file gives is found.
    monkeypatch.setenv("KUBE_VGPU_CONTEXT", "live")
    assert top(capsys) == (0, "")


def test_a_current_context_the_kubeconfig_lacks_is_named(
    apiserver: ApiServerStandin, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    document = config(apiserver)
    document["current-context"] = "gone"
    write(home / ".kube" / "config", document)
    code, err = top(capsys)
    assert code == 2 and err.strip().endswith(
        f"current-context 'gone' is not in kubeconfig {home / '.kube' / 'config'} (from ~/.kube/config);"
        " its contexts: standin"
    ), err
    assert top(capsys, "--context", "standin") == (0, "")
    document["contexts"] = []
    write(home / ".kube" / "config", document)
    code, err = top(capsys, "--context", "standin")
    assert code == 2 and err.strip().endswith("; it has no contexts"), err


def test_a_kubeconfig_with_many_contexts_lists_ten_of_them(
    apiserver: ApiServerStandin, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    document = config(apiserver)
    document["contexts"] += [{"name": f"c{i}", "context": {"cluster": "x", "user": "x"}} for i in range(10)]
    write(home / ".kube" / "config", document)
    code, err = top(capsys, "--context", "nope")
    assert code == 2 and err.strip().endswith(
        "its contexts: standin, c0, c1, c2, c3, c4, c5, c6, c7, c8, … (11 in all)"
    )
    # Ten are listed whole.
    document["contexts"].pop()
    write(home / ".kube" / "config", document)
    code, err = top(capsys, "--context", "nope")
    assert code == 2 and err.strip().endswith("its contexts: standin, c0, c1, c2, c3, c4, c5, c6, c7, c8"), (
        err
    )


def test_nothing_found_names_every_place_tried(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = top(capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    for tried in (
        "--kubeconfig (not given)",
        "$KUBECONFIG (not set)",
        f"{home / '.kube' / 'config'} (no such file)",
        "in-cluster service account (Service host/port is not set.)",
    ):
        assert tried in err, err


def test_a_variable_naming_only_missing_files_is_named(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "gone.yaml"))
    code, err = top(capsys)
    assert code == 2 and f"$KUBECONFIG {tmp_path / 'gone.yaml'} (no such file)" in err


def test_a_missing_kubeconfig_flag_file_is_an_error_not_a_fallback(
    apiserver: ApiServerStandin, home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(home / ".kube" / "config", config(apiserver))
    code, err = top(capsys, "--kubeconfig", str(tmp_path / "typo.yaml"))
    assert code == 2 and f"--kubeconfig {tmp_path / 'typo.yaml'}: no such file" in err


def test_a_context_without_any_kubeconfig_is_refused(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = top(capsys, "--context", "prod")
    assert code == 2 and "--context prod needs a kubeconfig" in err


def test_in_cluster_is_the_last_resort(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # With the service environment set, the in-cluster loader is what answers (here: no token file).
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    code, err = top(capsys)
    assert code == 2 and "in-cluster service account (Service token file does not exist.)" in err


@pytest.mark.parametrize("argv", [["webhook"], ["node"], ["certs", "create"], ["certs", "patch"], ["top"]])
def test_every_command_that_talks_to_a_cluster_takes_context(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--context NAME" in out and "$KUBECONFIG, else ~/.kube/config" in out


def test_a_broken_kubeconfig_is_one_line_naming_it(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (home / ".kube").mkdir()
    (home / ".kube" / "config").write_text("clusters: [\n")
    code, err = top(capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"kubeconfig {home / '.kube' / 'config'}: not valid YAML:" in err and "(line 2, column 1)" in err


@pytest.mark.parametrize(
    ("server", "says"),
    [
        (None, "its cluster 'standin' has no server"),
        ("not a url", "its cluster 'standin' has server 'not a url', not a URL like https://HOST:PORT"),
        ("https://", "its cluster 'standin' has server 'https:"),  # the client drops the trailing /
    ],
)
def test_a_cluster_without_a_usable_server_is_named(
    apiserver: ApiServerStandin, home: Path, capsys: pytest.CaptureFixture[str], server: str | None, says: str
) -> None:
    # client-go refuses these before any request ("no server found for cluster"); the Python client
    # used to try them and fail with urllib3's own words after a FutureWarning.
    document = config(apiserver)
    if server is None:
        del document["clusters"][0]["cluster"]["server"]
    else:
        document["clusters"][0]["cluster"]["server"] = server
    write(home / ".kube" / "config", document)
    code, err = top(capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert says in err and str(home / ".kube" / "config") in err


def test_a_kubeconfig_that_is_not_a_mapping_is_named(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (home / ".kube").mkdir()
    (home / ".kube" / "config").write_text("[1, 2]\n")
    code, err = top(capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"kubeconfig {home / '.kube' / 'config'}: expected a mapping (kind: Config), got a list" in err


@pytest.mark.parametrize("from_variable", [False, True])
def test_a_missing_kubeconfig_names_the_flag_or_the_variable_it_came_from(
    home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    *,
    from_variable: bool,
) -> None:
    typo = tmp_path / "typo.yaml"
    if from_variable:
        monkeypatch.setenv("KUBE_VGPU_KUBECONFIG", str(typo))
        code, err = top(capsys)
        assert code == 2 and f"KUBE_VGPU_KUBECONFIG={str(typo)!r}: no such file" in err
        assert "--kubeconfig" not in err
    else:
        code, err = top(capsys, "--kubeconfig", str(typo))
        assert code == 2 and f"--kubeconfig {typo}: no such file" in err
        assert "KUBE_VGPU_KUBECONFIG" not in err


@pytest.mark.parametrize("source", ["--kubeconfig", "KUBE_VGPU_KUBECONFIG"])
def test_an_unusable_kubeconfig_names_where_it_came_from(
    apiserver: ApiServerStandin,
    home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    *,
    source: str,
) -> None:
    document = config(apiserver)
    del document["clusters"][0]["cluster"]["server"]
    file = write(tmp_path / "kc.yaml", document)
    if source == "--kubeconfig":
        code, err = top(capsys, "--kubeconfig", str(file))
    else:
        monkeypatch.setenv("KUBE_VGPU_KUBECONFIG", str(file))
        code, err = top(capsys)
    assert code == 2 and f"cannot use kubeconfig {file} (from {source}): its cluster" in err, err


def test_the_kubeconfig_variable_is_read_and_the_flag_wins_over_it(
    apiserver: ApiServerStandin,
    home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    live = write(tmp_path / "live.yaml", config(apiserver))
    monkeypatch.setenv("KUBE_VGPU_KUBECONFIG", str(live))
    assert top(capsys) == (0, "")
    monkeypatch.setenv("KUBE_VGPU_KUBECONFIG", str(tmp_path / "typo.yaml"))
    assert top(capsys, "--kubeconfig", str(live)) == (0, "")


def test_a_context_from_the_variable_without_any_kubeconfig_names_the_variable(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KUBE_VGPU_CONTEXT", "prod")
    code, err = top(capsys)
    assert code == 2 and "KUBE_VGPU_CONTEXT='prod' needs a kubeconfig" in err and "--context" not in err
