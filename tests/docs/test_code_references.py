"""Comments and docstrings in the code stand alone: they cite no document the repository does not
contain (the project's internal specification, fact sheets or protocol notes), name no path of the
machine they were written on, and every module or attribute they name (`kube_vgpu.webhook.cache`,
or `webhook.cache` in backticks) exists."""

from __future__ import annotations

import importlib
import io
import re
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
THIS = Path(__file__).resolve()
# This checker and the docs' (tests/docs/test_references.py) hold the forbidden patterns as data, and
# their own tests below prove that each pattern is found.
CHECKERS = {THIS, THIS.with_name("test_references.py")}
SOURCES = sorted(
    p
    for folder in ("src", "tests", "bench", "scripts")
    for p in (REPO / folder).rglob("*.py")
    if "_pb2" not in p.name and p.resolve() not in CHECKERS
)
FOREIGN = [
    re.compile(r"\bSPEC\b"),
    re.compile(r"\bfacts\b(?=[\s`'\"]*[\w.-]*\.md|\s*§| sheet)", re.IGNORECASE),
    re.compile(r"§"),
    re.compile(r"\bprotocol (Appendix|section)\b", re.IGNORECASE),
    re.compile(r"\.\./shared"),
    re.compile(r"(?<![\w.])" + re.escape(f"{REPO}/")),
]
# The subpackages of kube_vgpu: a backticked dotted name starting with one of them and then a module's
# name (lower case; `node.hookPath` is a configuration key) names a module or attribute of the package.
PARTS = sorted(p.name for p in (REPO / "src" / "kube_vgpu").iterdir() if (p / "__init__.py").exists())
DOTTED = re.compile(r"\bkube_vgpu(?:\.\w+)+")
BACKTICKED = re.compile(r"`((?:" + "|".join(PARTS) + r")\.[a-z_][a-z0-9_]*(?:\.\w+)*)(?:\(\))?`")


def prose(source: str) -> list[tuple[int, str]]:
    """The comments and string literals of `source`, with their first line number: the text a
    reader takes as documentation."""
    found: list[tuple[int, str]] = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (tokenize.COMMENT, tokenize.STRING):
            found.append((token.start[0], token.string))
    return found


def resolves(dotted: str) -> bool:
    """Whether `kube_vgpu...` names a module, or an attribute reached from the longest module that
    imports."""
    parts = dotted.rstrip(".").split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(target, name):
                return False
            target = getattr(target, name)
        return True
    return False


def problems(source: str) -> list[str]:
    found: list[str] = []
    for line, text in prose(source):
        found += [f"{line}: cites {m.group(0)!r}" for rule in FOREIGN for m in rule.finditer(text)]
        names = DOTTED.findall(text) + ["kube_vgpu." + n for n in BACKTICKED.findall(text)]
        found += [
            f"{line}: names {name} (no such module or attribute)" for name in names if not resolves(name)
        ]
    return found


@pytest.mark.parametrize("path", SOURCES, ids=[str(p.relative_to(REPO)) for p in SOURCES])
def test_comments_and_docstrings_stand_alone(path: Path) -> None:
    assert problems(path.read_text(encoding="utf-8")) == []


def test_the_checker_finds_each_kind_of_reference_a_reader_cannot_follow() -> None:
    source = (
        '"""Quota (SPEC §2.2), as facts `apiserver-admission.md` says; see kube_vgpu.webhook.cache."""\n'
        "# protocol Appendix C; `webhook.quota_shared` and kube_vgpu.node.selection moved\n"
        f"X = 1  # {REPO}/src and ../shared/perf\n"
        "# fine: `webhook.admission.review`, kube_vgpu.contract.quantity.parse_quantity_value? no\n"
        "# `node.hookPath`, volcano.sh/vgpu-memory, k8s.io/kubelet/pkg/apis/dra/v1/api.proto,\n"
        "# the facts of life\n"
    )
    assert problems(source) == [
        "1: cites 'SPEC'",
        "1: cites 'facts'",
        "1: cites '§'",
        "2: cites 'protocol Appendix'",
        "2: names kube_vgpu.node.selection (no such module or attribute)",
        "2: names kube_vgpu.webhook.quota_shared (no such module or attribute)",
        "3: cites '../shared'",
        f"3: cites '{REPO}/'",
        "4: names kube_vgpu.contract.quantity.parse_quantity_value (no such module or attribute)",
    ]
