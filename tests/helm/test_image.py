"""The container image the chart runs, checked by reading the Dockerfile and .dockerignore.

There is no Docker engine here, so nothing is built: the tests parse the Dockerfile and check it
against pyproject.toml, the chart's values and the build context .dockerignore leaves.
"""

from __future__ import annotations

import functools
import json
import os
import re
import tomllib
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from tests.support.helm_render import CHART_DIR, REPO_ROOT, default_values

BASE_IMAGE = "python:3.11-slim"


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


def parse_dockerfile(text: str) -> list[Stage]:
    """Instructions per build stage; continuation lines joined, comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "Dockerfile ends inside a continued line"
    stages: list[Stage] = []
    for line in logical:
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        args = args.strip()
        if keyword == "FROM":
            match = re.fullmatch(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", args, re.IGNORECASE)
            assert match, f"cannot read FROM {args!r}"
            stages.append(Stage(base=match.group(1), name=match.group(2)))
        else:
            assert stages, f"{keyword} before the first FROM"
            stages[-1].instructions.append((keyword, args))
    return stages


@functools.cache
def _stages() -> tuple[Stage, ...]:
    return tuple(parse_dockerfile((REPO_ROOT / "Dockerfile").read_text()))


@functools.cache
def _pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())


# --- .dockerignore, with the Docker CLI's matching rules -------------------------------------


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if pattern.startswith("**", i):
            out += ".*"
            i += 2
            if pattern.startswith("/", i):
                out += "/?"
                i += 1
            continue
        if char == "*":
            out += "[^/]*"
        elif char == "?":
            out += "[^/]"
        elif char == "[":
            end = pattern.index("]", i)
            out += pattern[i : end + 1]
            i = end
        else:
            out += re.escape(char)
        i += 1
    return re.compile(out)


@functools.cache
def _ignore_rules() -> tuple[tuple[bool, re.Pattern[str]], ...]:
    rules = []
    for raw in (REPO_ROOT / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
        rules.append((negate, _pattern_regex(pattern)))
    return tuple(rules)


def in_build_context(relative: str) -> bool:
    """Whether .dockerignore lets `relative` (a path from the repository root) into the context.

    A pattern matching a folder excludes everything beneath it; the last matching rule wins.
    """
    parts = relative.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for negate, regex in _ignore_rules():
        if any(regex.fullmatch(c) for c in candidates):
            excluded = not negate
    return not excluded


def _context_files() -> list[str]:
    files = []
    for root, dirs, names in os.walk(REPO_ROOT):
        rel_root = os.path.relpath(root, REPO_ROOT)
        dirs[:] = [d for d in dirs if in_build_context(os.path.normpath(os.path.join(rel_root, d)))]
        for name in names:
            rel = os.path.normpath(os.path.join(rel_root, name))
            if in_build_context(rel):
                files.append(rel)
    return files


# === tests ==================================================================================


def test_the_ignore_matcher_follows_docker_rules() -> None:
    assert not in_build_context("tests/helm/test_image.py")
    assert not in_build_context("node/__pycache__/gpus.cpython-311.pyc")
    assert not in_build_context(".venv/bin/python")
    assert in_build_context("src/kube_vgpu/node/nvml/gpus.py")
    assert _pattern_regex("**/*.py[cod]").fullmatch("a/b/c.pyc")
    assert not _pattern_regex("*.egg-info").fullmatch("a/b.egg-info")


def test_every_stage_builds_from_the_slim_python_image_pyproject_allows() -> None:
    stages = _stages()
    names = {s.name for s in stages if s.name}
    for stage in stages:
        assert stage.base == BASE_IMAGE or stage.base in names, stage.base
    assert stages[-1].base == BASE_IMAGE
    requires = _pyproject()["project"]["requires-python"]
    minimum = re.fullmatch(r">=\s*(\d+)\.(\d+)", requires)
    assert minimum, requires
    image = re.search(r":(\d+)\.(\d+)", BASE_IMAGE)
    assert image
    assert (int(image.group(1)), int(image.group(2))) >= (int(minimum.group(1)), int(minimum.group(2)))


def test_the_project_is_pip_installed_from_the_build_context() -> None:
    build = next(s for s in _stages() if any("pip install ." in r for r in s.all("RUN")))
    assert ". ." in build.all("COPY") or any(c.startswith(". ") for c in build.all("COPY"))
    (run,) = [r for r in build.all("RUN") if "pip install ." in r]
    venv = re.search(r"python -m venv (\S+)", run)
    assert venv, run
    # The runtime stage takes the environment whole and puts its scripts first on PATH.
    final = _stages()[-1]
    assert any(c == f"--from={build.name} {venv.group(1)} {venv.group(1)}" for c in final.all("COPY"))
    assert any(f"PATH={venv.group(1)}/bin:" in e for e in final.all("ENV"))


def test_entrypoint_is_the_console_script_pyproject_declares() -> None:
    final = _stages()[-1]
    (entrypoint,) = final.all("ENTRYPOINT")
    assert json.loads(entrypoint) == ["kube-vgpu"]
    scripts = _pyproject()["project"]["scripts"]
    assert scripts["kube-vgpu"] == "kube_vgpu.cli.main:main"
    from kube_vgpu.cli.main import main

    assert callable(main)


def test_runs_as_the_non_root_user_the_chart_expects() -> None:
    final = _stages()[-1]
    (user,) = final.all("USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and gid.isdigit(), "USER must be numeric so the kubelet can verify runAsNonRoot"
    assert int(uid) != 0
    expected = default_values()["nonRootUser"]
    assert (int(uid), int(gid)) == (expected["uid"], expected["gid"])
    created = " ".join(final.all("RUN"))
    assert f"--uid {uid}" in created and f"--gid {gid}" in created
    # USER comes after everything that needs root.
    keywords = [kw for kw, _ in final.instructions]
    assert keywords.index("USER") > max(i for i, kw in enumerate(keywords) if kw == "RUN")


def test_build_context_holds_what_pip_install_reads_and_nothing_else_of_weight() -> None:
    project = _pyproject()
    assert in_build_context("pyproject.toml")
    assert in_build_context(project["project"]["readme"])
    files = _context_files()
    find = project["tool"]["setuptools"]["packages"]["find"]
    (where,) = find["where"]
    for include in find["include"]:
        package = f"{where}/{include.rstrip('*')}"
        assert (REPO_ROOT / package).is_dir(), package
        assert in_build_context(f"{package}/__init__.py"), package
        assert any(f.startswith(f"{package}/") for f in files), package
    for heavy in (".git/HEAD", ".venv/pyvenv.cfg", "tests/helm/test_image.py", "helm/kube-vgpu/Chart.yaml"):
        assert not in_build_context(heavy), heavy
    # The generated gRPC modules are committed, so the image needs no protoc at build time.
    assert in_build_context("src/kube_vgpu/proto/deviceplugin_v1beta1_pb2.py")


def test_chart_app_version_is_the_project_version() -> None:
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert chart["appVersion"] == _pyproject()["project"]["version"]
    assert default_values()["image"]["tag"] == "", "the image tag should follow appVersion"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("RUN true\n", "before the first FROM"),
        ("FROM x\nRUN a \\\n", "continued line"),
    ],
)
def test_the_dockerfile_reader_rejects_what_it_cannot_read(text: str, message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        parse_dockerfile(text)
