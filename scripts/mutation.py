"""Mutation testing (mutmut) of the modules where a silent mistake is a security hole.

Each group names the modules to mutate and the tests that must notice a change in them. The run
happens in a scratch copy of the repository (so the working tree gets no `mutants/` folder and
`pyproject.toml` carries no per-run settings), restricted to the group's tests so that one group
finishes in minutes on a small machine. It prints every surviving mutant with its diff, then the
score per module: killed / mutants (a timeout counts as killed: the tests noticed).

    .venv/bin/python scripts/mutation.py quota            # one group
    .venv/bin/python scripts/mutation.py --list           # the groups
    .venv/bin/python scripts/mutation.py quantity --keep /tmp/m   # keep the copy to inspect mutants

Needs `pip install -e '.[mutation]'`. docs/testing.md has the scores and the equivalent mutants.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Group:
    """Modules mutated together, and the tests run against each mutant."""

    modules: tuple[str, ...]
    tests: tuple[str, ...]


GROUPS: dict[str, Group] = {
    "quantity": Group(
        modules=("src/kube_vgpu/contract/quantity.py",),
        tests=("tests/contract/test_quantity.py",),
    ),
    # The checks that keep a pod inside its limits (test_bypass.py drives the same rules through real
    # HTTPS and both phases, but starts a webhook per test: minutes per mutant on a small machine).
    "isolation": Group(
        modules=(
            "src/kube_vgpu/webhook/admission/isolation.py",
            "src/kube_vgpu/webhook/admission/safety.py",
            "src/kube_vgpu/contract/container_env.py",
        ),
        tests=(
            "tests/webhook/admission/test_isolation.py",
            "tests/webhook/admission/test_safety.py",
            "tests/webhook/admission/test_validation.py",
        ),
    ),
    "booking": Group(
        modules=("src/kube_vgpu/node/deviceplugin/verify.py",),
        tests=(
            "tests/node/deviceplugin/test_verify.py",
            "tests/node/deviceplugin/test_verify_charge.py",
            "tests/node/deviceplugin/test_verify_booking.py",
        ),
    ),
    # The quota's pure arithmetic and decision against the shared reservations.
    "quota": Group(
        modules=(
            "src/kube_vgpu/webhook/quota/charge.py",
            "src/kube_vgpu/webhook/quota/mig_charge.py",
            "src/kube_vgpu/webhook/quota/shared.py",
            "src/kube_vgpu/webhook/quota/claims.py",
        ),
        tests=(
            "tests/webhook/quota/test_charge.py",
            "tests/webhook/quota/test_mig_charge.py",
            "tests/webhook/quota/test_shared.py",
            "tests/webhook/quota/test_claims.py",
            "tests/webhook/quota/test_mig_geometry.py",
        ),
    ),
    # The quota step, the ledger of the cache's pods and how those pods are sized.
    "quota-ledger": Group(
        modules=(
            "src/kube_vgpu/webhook/quota/gate.py",
            "src/kube_vgpu/webhook/quota/ledger.py",
            "src/kube_vgpu/webhook/quota/sizing.py",
        ),
        tests=(
            "tests/webhook/quota/test_gate.py",
            "tests/webhook/quota/test_ledger.py",
            "tests/webhook/quota/test_claims.py",
            "tests/webhook/quota/test_mig_geometry.py",
        ),
    ),
}

# What gets copied into the scratch repository.
_COPY = ("src", "tests", "pyproject.toml")
_KILLED = {"killed", "timeout", "caught by type check"}
_RESULT = re.compile(r"^\s+(?P<name>\S+): (?P<status>.+)$")


def _config(group: Group) -> str:
    def toml_list(items: tuple[str, ...] | list[str]) -> str:
        return "[" + ", ".join(f'"{item}"' for item in items) + "]"

    return (
        "\n[tool.mutmut]\n"
        'source_paths = ["src"]\n'
        f"only_mutate = {toml_list(group.modules)}\n"
        f"pytest_add_cli_args_test_selection = {toml_list(group.tests)}\n"
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "-q"]\n'
        # The node plugin's tests run a real gRPC server: forking from a process that imported
        # grpc is not safe, so workers are forked from a clean server process.
        'process_isolation = "forkserver"\n'
        "use_git_change_detection = false\n"
    )


def _module_of(mutant: str) -> str:
    # "<package>.<module>.x_<function>__mutmut_3" -> "<package>.<module>"
    head = mutant.split("__mutmut_", maxsplit=1)[0]
    return head.rsplit(".", 1)[0]


def run(name: str, group: Group, keep: Path | None, max_children: int | None) -> int:
    """Run one group; 0 when every mutant was killed, 1 when some survived."""
    scratch = keep or Path(tempfile.mkdtemp(prefix="kube-vgpu-mutation-"))
    if scratch.exists():
        shutil.rmtree(scratch)
    scratch.mkdir(parents=True)
    for item in _COPY:
        source = ROOT / item
        if source.is_dir():
            shutil.copytree(
                source, scratch / item, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
            )
        else:
            shutil.copy2(source, scratch / item)
    with (scratch / "pyproject.toml").open("a") as config:
        config.write(_config(group))
    mutmut = [sys.executable, "-m", "mutmut"]
    command = [*mutmut, "run"] + ([f"--max-children={max_children}"] if max_children else [])
    print(f"== {name}: mutmut run in {scratch}", flush=True)
    subprocess.run(command, cwd=scratch, check=False, stdout=subprocess.DEVNULL)
    listing = subprocess.run(
        [*mutmut, "results", "--all", "true"], cwd=scratch, check=True, capture_output=True, text=True
    ).stdout
    statuses: dict[str, Counter[str]] = defaultdict(Counter)
    survivors: list[str] = []
    for line in listing.splitlines():
        match = _RESULT.match(line)
        if match is None:
            continue
        status = match["status"]
        statuses[_module_of(match["name"])][status] += 1
        if status not in _KILLED:
            survivors.append(f"{match['name']} ({status})")
    for survivor in survivors:
        print(f"-- {survivor}")
        shown = subprocess.run(
            [*mutmut, "show", survivor.split(" ")[0]],
            cwd=scratch,
            capture_output=True,
            text=True,
            check=False,
        )
        print(shown.stdout.rstrip())
    print(f"== {name}: score per module (killed / mutants)")
    for module, counts in sorted(statuses.items()):
        total = sum(counts.values())
        killed = sum(n for status, n in counts.items() if status in _KILLED)
        other = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()) if s not in _KILLED)
        print(f"{module}: {killed}/{total} ({100 * killed / total:.1f}%)" + (f"; {other}" if other else ""))
    if keep is None:
        shutil.rmtree(scratch, ignore_errors=True)
    return 1 if survivors else 0


def main() -> int:
    """Parse the arguments and run the groups asked for."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("groups", nargs="*", help=f"groups to run (default: all): {', '.join(GROUPS)}")
    parser.add_argument("--list", action="store_true", help="list the groups and exit")
    parser.add_argument("--keep", type=Path, default=None, help="scratch folder to use and keep (one group)")
    parser.add_argument("--max-children", type=int, default=None, help="parallel mutant runs (default: CPUs)")
    args = parser.parse_args()
    if args.list:
        for name, group in GROUPS.items():
            print(f"{name}: {', '.join(group.modules)}\n    tests: {', '.join(group.tests)}")
        return 0
    unknown = [g for g in args.groups if g not in GROUPS]
    if unknown:
        parser.error(f"unknown group(s) {', '.join(unknown)}; known: {', '.join(GROUPS)}")
    chosen = args.groups or list(GROUPS)
    if args.keep is not None and len(chosen) != 1:
        parser.error("--keep needs exactly one group")
    worst = 0
    for name in chosen:
        worst = max(worst, run(name, GROUPS[name], args.keep, args.max_children))
    return worst


if __name__ == "__main__":
    sys.exit(main())
