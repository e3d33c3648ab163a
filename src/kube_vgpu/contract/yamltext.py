"""One-line descriptions of YAML syntax errors: PyYAML's own spread over several lines, with a
caret drawing, and every user-input error kube-vgpu prints must fit on one line."""

from __future__ import annotations

import yaml


def yaml_problem(exc: yaml.YAMLError) -> str:
    """`not valid YAML: <problem> (line L, column C)`, from PyYAML's error."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    return "not valid YAML: " + " ".join(f"{problem}{where}".split())
