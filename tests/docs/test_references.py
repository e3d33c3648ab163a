"""The README and docs/ speak of the repository alone: every relative link and every backticked
repository path names something the repository has, and no page cites a document it does not
contain (the project's internal specification, fact sheets or protocol notes) or a path of the
machine it was written on."""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
# Top-level entries a backticked path may start with to count as a repository path.
TOP = {p.name for p in REPO.iterdir() if not p.name.startswith(".")} | {".ci"}
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\n]+)`")
# Citations of documents outside the repository, and paths of the machine the docs were written on.
FOREIGN = [
    re.compile(r"\bSPEC\b"),
    re.compile(r"\bfacts\b", re.IGNORECASE),
    re.compile(r"§"),
    re.compile(r"protocol Appendix", re.IGNORECASE),
    re.compile(r"\.\./shared"),
    # The checkout's own folder, wherever it is: a page naming it names the machine it was written on.
    re.compile(r"(?<![\w.])" + re.escape(f"{REPO}/")),
]


def links(text: str) -> list[str]:
    """Relative link targets (no scheme, no pure #anchor), without their anchor."""
    return [target.split("#", 1)[0] for target in anchored_links(text) if not target.startswith("#")]


def anchored_links(text: str) -> list[str]:
    """Relative link targets as written (no scheme), anchors kept."""
    return [t for t in LINK.findall(text) if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]


def slugs(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as '-'."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


FENCE = re.compile(r"^ *```[^\n]*\n(.*?)^ *```", re.MULTILINE | re.DOTALL)
# A repository path written in plain prose (outside code and link targets): `helm/kube-vgpu`.
PROSE = re.compile(
    r"(?<![\w./-])(?:\./)?((?:" + "|".join(re.escape(t) for t in sorted(TOP)) + r")/[\w./-]*[\w/])"
)


def _path_word(raw: str) -> str | None:
    """`raw` as a repository path (`./` and trailing punctuation or `:LINE` dropped), or None."""
    word = re.sub(r":\d+$", "", raw.removeprefix("./").rstrip(".,;:)"))
    if "/" in word and word.split("/", 1)[0] in TOP and not re.search(r"[<>{}$*]", word):
        return word
    return None


def repo_paths(text: str) -> list[str]:
    """Paths in the repository a page names: backticked (`scripts/test.sh`), in fenced code blocks
    (`./scripts/chart.sh template -f examples/x.yaml`), or in plain prose."""
    rest = FENCE.sub("", text)
    words = [w for code in CODE.findall(rest) for w in code.split()]
    words += [w for block in FENCE.findall(text) for w in re.split(r"[\s=\"'`,()\[\]]+", block)]
    found = [p for p in map(_path_word, words) if p is not None]
    prose = CODE.sub("", LINK.sub("]", rest))
    return found + [p for p in map(_path_word, PROSE.findall(prose)) if p is not None]


@cache
def _shipped() -> frozenset[str] | None:
    """Every file a clone holds (tracked, or new and not ignored by git) and every folder above one;
    None outside a git checkout. A build output (`.venv/`, `*.egg-info/`) exists here but not in a
    clone, so a page naming one would only look right on the machine it was written on."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=REPO,
            capture_output=True,
            check=True,
        ).stdout.decode()
    except (OSError, subprocess.CalledProcessError):
        return None
    files = [f for f in listed.split("\0") if f]
    return frozenset(files) | {str(Path(f).parents[i]) for f in files for i in range(len(Path(f).parts) - 1)}


def in_repository(target: Path) -> bool:
    """Whether `target` exists and is something a clone of the repository has."""
    if not target.exists():
        return False
    shipped = _shipped()
    try:
        relative = target.resolve().relative_to(REPO)
    except ValueError:
        return True  # outside the checkout (the checker's own self-test pages): existence is all
    return shipped is None or str(relative) in shipped or str(relative) == "."


def missing(page: Path) -> list[str]:
    text = page.read_text(encoding="utf-8")
    problems = [f"link {t}" for t in links(text) if not in_repository(page.parent / t)]
    for target in anchored_links(text):
        path, _, anchor = target.partition("#")
        linked = page.parent / path if path else page
        if anchor and linked.suffix == ".md" and linked.exists() and anchor not in slugs(linked):
            problems.append(f"anchor {target}")
    problems += [f"path `{p}`" for p in repo_paths(text) if not in_repository(REPO / p)]
    problems += [f"cites {m.group(0)!r}" for rule in FOREIGN for m in rule.finditer(text)]
    return problems


# The project's issue tracker is not in the repository either: a user page citing "issue 12" sends the
# reader to something they do not have. docs/benchmarks.md is the dated record of measurements, whose
# sections name the change each figure was taken around, so it alone may.
ISSUE = re.compile(r"\bissues? \d+", re.IGNORECASE)
HISTORY = {REPO / "docs" / "benchmarks.md"}


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_reference_is_in_the_repository(page: Path) -> None:
    assert missing(page) == []
    if page not in HISTORY:
        assert ISSUE.findall(page.read_text(encoding="utf-8")) == []


def test_the_checker_finds_each_kind_of_dangling_reference(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# Top\nSee [x](nope.md), [ok](page.md#top), [web](https://volcano.sh), [gone](#nowhere), "
        "`scripts/nope.sh`, "
        "`scripts/test.sh`, `volcano.sh/vgpu-memory`, SPEC §2, facts `a.md`, protocol Appendix C, "
        f"../shared/perf/x, {REPO / 'README.md'}\n"
        "Run scripts/gone.sh, or helm/kube-vgpu (there).\n"
        "```sh\n./scripts/chart.sh lint -f examples/nope.yaml --set-file x=docs/none.md\n"
        "src/kube_vgpu/cli/main.py:12: fine\n```\n"
    )
    assert missing(page) == [
        "link nope.md",
        "anchor #nowhere",
        "path `scripts/nope.sh`",
        "path `examples/nope.yaml`",
        "path `docs/none.md`",
        "path `scripts/gone.sh`",
        "cites 'SPEC'",
        "cites 'facts'",
        "cites '§'",
        "cites 'protocol Appendix'",
        "cites '../shared'",
        f"cites '{REPO}/'",
    ]


def test_a_path_only_this_checkout_has_is_not_in_the_repository() -> None:
    # `.git` (like `.venv/` or `*.egg-info/`) exists here but is not something a clone is given.
    assert in_repository(REPO / "scripts" / "test.sh") and in_repository(REPO / "examples" / "pods")
    if _shipped() is not None:
        assert (REPO / ".git").exists() and not in_repository(REPO / ".git")
        assert not in_repository(REPO / "tests" / "docs" / "__pycache__")


def test_the_docs_have_a_table_of_contents_listing_every_page() -> None:
    contents = (REPO / "docs" / "README.md").read_text(encoding="utf-8")
    pages = {p.name for p in (REPO / "docs").glob("*.md")} - {"README.md"}
    assert pages == set(links(contents)) & pages, pages - set(links(contents))
    assert "docs/README.md" in links((REPO / "README.md").read_text(encoding="utf-8"))


def test_the_readme_is_short_and_in_the_order_a_platform_engineer_reads() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) < 300
    headings = re.findall(r"^## (.+)$", text, re.MULTILINE)
    assert headings == ["Status", "Install on a cluster", "Quick start", "Configuration", "Troubleshooting"]
    assert "./scripts/demo.sh" in text and "./scripts/test.sh" in text
