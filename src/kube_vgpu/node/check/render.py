"""`kube-vgpu node check`'s report as text for a person: one section per thing checked, the problems
last. Pure: takes the report `node.check.report` builds and returns lines."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def _mig_line(gpu: dict[str, Any]) -> str:
    mode = gpu.get("migMode")
    if mode is None:
        return "MIG: unknown"
    if not isinstance(mode, dict):
        return "MIG: not supported"
    words = {0: "off", 1: "on"}
    current = words.get(mode["current"], mode["current"])
    pending = words.get(mode["pending"], mode["pending"])
    change = "" if mode["current"] == mode["pending"] else f", {pending} after the next GPU reset"
    return f"MIG: capable, mode {current}{change}"


def _gpu_lines(gpu: dict[str, Any]) -> Iterator[str]:
    memory = f"{gpu['memoryMiB']} MiB" if "memoryMiB" in gpu else "memory unknown"
    yield f"GPU {gpu['index']}  {gpu['name']}  {gpu['uuid']}  {memory}"
    yield f"  {_mig_line(gpu)}"
    profiles = gpu.get("profiles")
    if profiles:
        listed = ", ".join(f"{p['name']} {p['memoryMiB']} MiB x{p['instanceCount']}" for p in profiles)
        yield f"  MIG profiles: {listed}"
    if "instances" in gpu:
        devices = [
            f"{c['migUuid']} ({o['profile']}, GI {o['gpuInstanceId']} CI {c['id']}, {c['memoryMiB']} MiB)"
            for o in gpu["instances"]
            for c in o["computeInstances"]
        ]
        yield f"  MIG devices: {', '.join(devices) if devices else 'none'}"
    plans = gpu.get("plans")
    if isinstance(plans, str):
        yield f"  MIG geometry: {plans}"
    elif plans:
        for group, plan in plans.items():
            if isinstance(plan, dict):
                yield f"  MIG geometry {group}: cannot be laid out: {plan['error']}"
            else:
                slots = ", ".join(f"{p[1]}@{p[2]}" for p in plan)
                yield f"  MIG geometry {group}: {slots}"
    if "error" in gpu:
        yield f"  NVML error: {gpu['error']}"


def _hami_lines(hami: dict[str, Any]) -> Iterator[str]:
    need = "needed" if hami["needed"] else "not needed in mig mode"
    state = "usable" if hami["ready"] else "NOT usable"
    yield f"HAMi-core in {hami['folder']} ({need}): {state}"
    for f in hami["files"]:
        if not f["present"]:
            yield f"  {f['name']}: missing"
            continue
        size = "" if f["size"] is None else f", {f['size']} bytes"
        readable = "readable" if f["readable"] else "not readable"
        problem = f": {f['problem']}" if f["problem"] else ""
        yield f"  {f['name']}: present{size}, {readable}{problem}"


def _kubelet_lines(kubelet: dict[str, Any]) -> Iterator[str]:
    if not kubelet["present"]:
        state = "missing"
    else:
        state = "present" if kubelet["isSocket"] else "present but not a socket"
    yield f"kubelet socket {kubelet['socket']}: {state}"
    own = kubelet["pluginSocket"]
    serving = "present (a node plugin is serving)" if own["present"] else "absent (no node plugin serving)"
    yield f"  plugin socket {own['path']}: {serving}"


def _advertise_lines(advertised: dict[str, Any], labels: dict[str, str]) -> Iterator[str]:
    yield "The plugin would advertise:"
    yield (
        f"  {advertised['deviceResource']}: {advertised['devices']} devices "
        f"({advertised['healthyDevices']} healthy) through the kubelet"
    )
    for name, amount in advertised["capacity"].items():
        yield f"  {name}: {amount} (node capacity)"
    yield "  register annotation volcano.sh/node-vgpu-register:"
    for r in advertised["registerRecords"]:
        health = "healthy" if r["healthy"] else "unhealthy"
        yield f"    {r['uuid']}  count {r['count']}  {r['memoryMiB']} MiB  {r['type']}  {r['mode']}  {health}"
    yield "  labels: " + ", ".join(f"{k}={v}" for k, v in sorted(labels.items()))


def _socket_line(label: str, entry: dict[str, Any]) -> str:
    if not entry["present"]:
        state = "absent (no DRA plugin serving)"
    else:
        state = "present" if entry["isSocket"] else "present but not a socket"
    return f"  {label} {entry['path']}: {state}"


def _dra_socket_lines(sockets: dict[str, Any]) -> Iterator[str]:
    registry = sockets["pluginsRegistry"]
    yield f"kubelet plugin registry {registry['path']}: {'present' if registry['present'] else 'missing'}"
    yield _socket_line("registration socket", sockets["registration"])
    yield _socket_line("driver socket", sockets["driver"])


def _device_line(device: dict[str, Any]) -> str:
    capacity = ", ".join(f"{k} {v}" for k, v in device["capacity"].items())
    taints = "; ".join(f"taint {t['key']}={t['value']}:{t['effect']}" for t in device["taints"])
    sharing = "shared" if device["shared"] else "whole"
    return f"    {device['name']}  {device['uuid']}  {sharing}  {capacity}" + (
        f"  {taints}" if taints else ""
    )


def _publish_lines(pool: dict[str, Any]) -> Iterator[str]:
    yield f"The plugin would publish (driver {pool['driver']}, pool {pool['pool']}):"
    if pool["held"]:
        yield f"  every GPU out of service: {pool['held']}"
    yield "  with consumable capacity on (Kubernetes 1.36; 1.34-1.35 with DRAConsumableCapacity):"
    for device in pool["consumableCapacity"]:
        yield _device_line(device)
        for name, policy in device["requestPolicy"].items():
            valid = policy.get("validRange") or {}
            yield (
                f"      {name}: default {policy.get('default')}, from {valid.get('min')} "
                f"to {valid.get('max', 'the capacity')} in steps of {valid.get('step')}"
            )
    yield "  with consumable capacity off (the API server drops it: 1.34-1.35 by default):"
    for device in pool["wholeGpus"]:
        yield _device_line(device)
    if pool["held"]:
        left = pool["withoutDeviceTaints"]
        yield f"  where device taints are off: {left} device(s), the tainted ones left out"


def _cdi_lines(cdi: dict[str, Any]) -> Iterator[str]:
    state = "exists" if cdi["exists"] else "missing (the plugin creates it)"
    yield f"CDI folder {cdi['dir']}: {state}, {'writable' if cdi['writable'] else 'NOT writable'}"
    spec = cdi["gpuSpec"]
    yield f"  GPU spec (kind {spec['kind']}) in {', '.join(spec['dirs'])}:"
    if not spec["files"]:
        yield "    none found"
    for found in spec["files"]:
        if "error" in found:
            yield f"    {found['path']}: unreadable: {found['error']}"
        else:
            yield f"    {found['path']}: devices {', '.join(found['devices'])}"
    for uuid, device in spec["gpus"].items():
        yield f"    {uuid} -> {device or 'NO CDI DEVICE'}"


def render_text(report: dict[str, Any]) -> list[str]:
    """The report as lines of text."""
    api = report.get("api", "deviceplugin")
    serve = "DRA" if api == "dra" else report["mode"]
    shown_api = "api dra, " if api == "dra" else ""
    lines = [
        f"kube-vgpu node check: node {report['node']}, {shown_api}mode {report['mode']}",
        f"NVML: {report['nvml']}",
        f"driver {report['driverVersion']}, NVML {report['nvmlVersion']}, CUDA {report['cudaDriverVersion']}",
        "",
    ]
    for gpu in report["gpus"]:
        lines.extend(_gpu_lines(gpu))
    if not report["gpus"]:
        lines.append("no GPU")
    lines.append("")
    lines.extend(_hami_lines(report["hamiCore"]))
    if "kubelet" in report:
        lines.extend(_kubelet_lines(report["kubelet"]))
    if "draSockets" in report:
        lines.extend(_dra_socket_lines(report["draSockets"]))
    if "cdi" in report:
        lines.extend(_cdi_lines(report["cdi"]))
    if "wouldPublish" in report:
        lines.append("")
        lines.extend(_publish_lines(report["wouldPublish"]))
    if "wouldAdvertise" in report:
        lines.append("")
        lines.extend(_advertise_lines(report["wouldAdvertise"], report["labels"]))
    lines.append("")
    if report["ok"]:
        lines.append(f"OK: this node can serve {serve}")
    else:
        lines.append(f"PROBLEMS ({len(report['problems'])}): this node cannot serve {serve}")
        lines.extend(f"  - {p}" for p in report["problems"])
    return lines
