"""Readable text for what the demo saw: the patch, the denial, the node and GPUs, the container's start."""

from __future__ import annotations

import json
from collections.abc import Iterator

from kube_vgpu.demo.flow import Outcome

_WIDTH = 100


def _value(value: object) -> str:
    text = json.dumps(value, separators=(",", ":"))
    return text if len(text) <= 70 else text[:67] + "..."


def _pointer(path: str) -> str:
    return path.replace("~1", "/").replace("~0", "~")


def render(outcome: Outcome, problems: list[str]) -> Iterator[str]:
    """Lines describing one pod's journey and whether it matched its expectation."""
    example = outcome.example
    title = f"== {example.key} ({example.source}) "
    yield title + "=" * max(0, _WIDTH - len(title))
    if not outcome.allowed:
        yield f"webhook /{outcome.denied_by}: DENIED: {outcome.message}"
    else:
        yield f"webhook: allowed by /mutate ({len(outcome.patch)} patch operation(s)) and /validate"
        for op in outcome.patch:
            value = f" = {_value(op['value'])}" if "value" in op else ""
            yield f"    {op['op']:<7} {_pointer(op['path'])}{value}"
    for warning in outcome.warnings:
        yield f"    warning: {warning}"
    if outcome.allowed:
        if outcome.node is None:
            yield f"scheduler (local Volcano stand-in): waiting: {outcome.waiting}"
        else:
            yield f"scheduler (local Volcano stand-in): node {outcome.node}"
            yield f"    volcano.sh/vgpu-ids-new={outcome.devices}"
    for allocation in outcome.allocations:
        if allocation.error:
            yield f"kubelet Allocate, container {allocation.container}: FAILED: {allocation.error}"
            continue
        yield f"kubelet Allocate, container {allocation.container} would start with:"
        for name, value in allocation.envs.items():
            yield f"    env   {name}={value}"
        for container_path, host_path, read_only in allocation.mounts:
            yield f"    mount {container_path} <- {host_path} ({'ro' if read_only else 'rw'})"
    expected = example.expect.outcome
    if problems:
        yield f"result: NOT as expected ({expected}):"
        yield from (f"    - {p}" for p in problems)
    else:
        yield f"result: {expected}, as expected"
    yield ""
