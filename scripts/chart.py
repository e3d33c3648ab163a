"""Render or lint the kube-vgpu chart offline, with Helm's own engine (helm-python's bundled libhelm):
what `helm template` and `helm lint --strict` print, with no `helm` binary and no cluster.

    scripts/chart.sh template [-f VALUES.yaml]... [--set KEY=VALUE]... [--kube-version 1.30]
    scripts/chart.sh lint [-f VALUES.yaml]... [--set KEY=VALUE]... [--kube-version 1.30]

Exit codes: 0 done, 1 the chart refused the values or lint found an error, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import helm_python
import yaml
from helm_python import _native

from kube_vgpu.contract.yamltext import safe_load, utf8_problem, yaml_problem

CHART = Path(__file__).resolve().parents[1] / "helm" / "kube-vgpu"
SEVERITY = {0: "UNKNOWN", 1: "INFO", 2: "WARNING", 3: "ERROR"}


class BadInput(Exception):
    """A values file or --set expression that cannot be read; `str()` names it."""


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Helm's merge of two values documents: maps merge key by key, anything else is replaced."""
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def user_values(files: list[str], sets: list[str]) -> dict[str, Any]:
    """The values given with -f (in order) and then --set, as `helm` combines them."""
    values: dict[str, Any] = {}
    for name in files:
        try:
            document = safe_load(Path(name).read_text(encoding="utf-8")) or {}
        except OSError as exc:
            raise BadInput(f"-f {name}: cannot read it ({exc.strerror})") from None
        except UnicodeDecodeError as exc:
            raise BadInput(f"-f {name}: {utf8_problem(exc)}") from None
        except yaml.YAMLError as exc:
            raise BadInput(f"-f {name}: {yaml_problem(exc)}") from None
        if not isinstance(document, dict):
            raise BadInput(f"-f {name}: expected a mapping of values, got {type(document).__name__}")
        values = merge(values, document)
    for expression in sets:
        try:
            values = merge(values, helm_python.parse_set_string(expression))
        except helm_python.HelmError as exc:
            raise BadInput(f"--set {expression}: {exc}") from None
    return values


def template(values: dict[str, Any], args: argparse.Namespace) -> int:
    options = {"name": args.release, "namespace": args.namespace, "is_install": True}
    options["kube_version"] = args.kube_version
    try:
        # Chart.render does not pass the Kubernetes version on; the call beneath it does (like
        # `helm template --kube-version`), and the templates depend on it (matchConditions).
        chart = helm_python.Chart.load(CHART)
        payload = _native.call_string("helm_render", chart._raw(), json.dumps(values), json.dumps(options))  # noqa: SLF001 (helm-python-sdk has no public call for the loaded chart)
    except helm_python.HelmError as exc:
        print(f"chart: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    manifests: dict[str, str] = json.loads(payload)
    for path in sorted(manifests):
        text = manifests[path].strip()
        text = text.removeprefix("---").lstrip("\n")
        if text and not path.endswith("NOTES.txt"):
            sys.stdout.write(f"---\n# Source: {path}\n{text}\n")
    return 0


def lint(values: dict[str, Any], args: argparse.Namespace) -> int:
    report = helm_python.lint(
        CHART, values, strict=True, namespace=args.namespace, kube_version=args.kube_version
    )
    failed = False
    for message in report.get("messages") or []:
        severity = SEVERITY.get(message.get("severity", 0), "UNKNOWN")
        failed |= severity in ("WARNING", "ERROR")  # --strict: warnings fail too
        print(f"[{severity}] {message.get('path', '')}: {message.get('error', '')}")
    for error in report.get("errors") or []:
        failed = True
        print(f"[ERROR] {error}")
    print(f"{CHART.name}: {'lint failed' if failed else 'lint passed'}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/chart.sh", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["template", "lint"])
    parser.add_argument("-f", "--values", action="append", default=[], metavar="FILE", help="values file")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="one value")
    parser.add_argument("--kube-version", default="1.30", help="Kubernetes version the templates assume")
    parser.add_argument("--namespace", default="kube-vgpu", help="release namespace")
    parser.add_argument("--release", default="kube-vgpu", help="release name")
    args = parser.parse_args(argv)
    try:
        values = user_values(args.values, args.set)
    except BadInput as exc:
        print(f"chart: {exc}", file=sys.stderr)
        return 2
    try:
        return template(values, args) if args.action == "template" else lint(values, args)
    except BrokenPipeError:  # `scripts/chart.sh template | head`: the reader left
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
