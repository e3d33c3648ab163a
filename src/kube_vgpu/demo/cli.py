"""`kube-vgpu demo`: bring up the local installation, carry the example pods through it, report.

Exit code: 0 when every example ended as its file says and `node check` finds every simulated node able
to serve its mode, 1 otherwise, 2 for bad input, 130 when interrupted (Ctrl-C, at any moment: one line
on stderr, every part stopped first).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import tempfile
from pathlib import Path

import aiohttp

from kube_vgpu.cli.top import read_view
from kube_vgpu.cli.top_view import render_text
from kube_vgpu.contract.config import ConfigError, load_config
from kube_vgpu.contract.logformat import configure_logging
from kube_vgpu.demo.cluster import DemoError, LocalCluster, demo_config
from kube_vgpu.demo.dra import (
    DRA_EXAMPLES,
    DraDemoError,
    DraExample,
    check_dra_namespaces,
    load_dra_examples,
    pool_summary,
    render_dra,
    run_dra_example,
    start_dra_node,
)
from kube_vgpu.demo.examples import (
    ExampleError,
    check_pod_namespaces,
    load_namespaces,
    load_nodes,
    load_pods,
)
from kube_vgpu.demo.flow import PodFlow, check
from kube_vgpu.demo.nodecheck import dra_node_check, node_checks
from kube_vgpu.demo.report import render
from kube_vgpu.demo.workload import start_workloads, usage_report
from kube_vgpu.standins.apiserver.admission_chain import AdmissionChain, WebhookHttpError

# The repository's examples/ folder (src/kube_vgpu/demo/cli.py is four levels below it).
DEFAULT_EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
EXAMPLES_CONFIG = "config.yaml"
INTERRUPTED = 130  # what a shell reports for a command ended by SIGINT
INTERRUPTED_LINE = "kube-vgpu demo: interrupted\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo's flags."""
    parser.add_argument(
        "--examples",
        type=Path,
        default=DEFAULT_EXAMPLES,
        help="folder with nodes.yaml, namespaces.yaml and pods/",
    )
    parser.add_argument(
        "--config",
        default=None,
        help="configuration file (YAML); default: config.yaml in the examples folder if there is one, "
        "else every default",
    )
    parser.add_argument(
        "--once", action="store_true", help="exit after the examples instead of serving until Ctrl-C"
    )
    parser.add_argument("--verbose", action="store_true", help="show the parts' own logs")


def examples_config(examples: Path, given: str | None) -> Path | None:
    """The configuration the examples run with: `--config`, else their folder's config.yaml, else none.

    An examples folder written for other resource names carries the config that names them, so its
    pods are not run against a config they do not fit.
    """
    if given is not None:
        return Path(given)
    beside = examples / EXAMPLES_CONFIG
    return beside if beside.is_file() else None


async def _node_checks(cluster: LocalCluster) -> int:
    """Print `node check` on each simulated node; returns how many cannot serve."""
    checked, failing = await node_checks(cluster)
    if cluster.dra is not None:
        dra_checked, dra_failing = await dra_node_check(cluster, cluster.dra)
        checked += dra_checked
        failing += dra_failing
    print("$ kube-vgpu node check (on each simulated node)", *checked, "", sep="\n", flush=True)
    return failing


async def _serve(cluster: LocalCluster) -> None:
    """Print the metrics addresses and serve until Ctrl-C."""
    assert cluster.webhook is not None
    print("\nMetrics (Ctrl-C to stop):", flush=True)
    print(f"  webhook  http://127.0.0.1:{cluster.webhook.metrics_server.port}/metrics")
    for name, node in cluster.nodes.items():
        port = node.plugin.metrics_server.port if node.plugin.metrics_server else "?"
        print(f"  node {name}: http://127.0.0.1:{port}/metrics", flush=True)
    if cluster.dra is not None and cluster.dra.plugin.metrics_server is not None:
        print(
            f"  node {cluster.dra.name} (DRA): http://127.0.0.1:{cluster.dra.plugin.metrics_server.port}/metrics",
            flush=True,
        )
    # Ctrl-C cancels this wait (asyncio.run's handler) like any other; SIGTERM ends the demo with
    # its verdict.
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()


async def _start_dra(cluster: LocalCluster, workdir: Path) -> None:
    """The DRA node group's node, beside the Volcano nodes."""
    try:
        cluster.dra = await start_dra_node(cluster.apiserver, workdir, cluster.config, cluster.kube("node"))
    except DraDemoError as exc:
        raise DemoError(str(exc)) from None


async def _run_dra(cluster: LocalCluster, examples: list[DraExample], session: aiohttp.ClientSession) -> int:
    """Carry the DRA examples from admission to CDI edits, print each; returns how many did not end
    as expected."""
    if cluster.dra is None or cluster.webhook is None:
        return 0
    print("", *pool_summary(cluster.apiserver, cluster.dra), "", sep="\n", flush=True)
    chain = AdmissionChain(session, f"https://127.0.0.1:{cluster.webhook.port}", cluster.ca_pem)
    failures = 0
    for example in examples:
        try:
            outcome = await run_dra_example(cluster.apiserver, cluster.dra, example, chain)
        except WebhookHttpError as exc:
            raise DemoError(str(exc)) from None
        failures += not outcome.ok
        for line in render_dra(outcome):
            print(line, flush=True)
    print(f"{len(examples) - failures} of {len(examples)} DRA examples ended as expected.", flush=True)
    return failures


async def _demo(args: argparse.Namespace) -> int:
    examples: Path = args.examples
    nodes = load_nodes(examples / "nodes.yaml")
    namespaces = load_namespaces(examples / "namespaces.yaml")
    pods = load_pods(examples / "pods")
    check_pod_namespaces(pods, namespaces, examples / "pods")
    dra_examples = load_dra_examples(examples / DRA_EXAMPLES) if (examples / DRA_EXAMPLES).is_dir() else []
    check_dra_namespaces(dra_examples, [ns.name for ns in namespaces])
    config_file = examples_config(examples, args.config)
    with tempfile.TemporaryDirectory(prefix="kube-vgpu-demo-") as tmp:
        workdir = Path(tmp)
        cluster = LocalCluster(
            workdir, demo_config(load_config(config_file), workdir, dra=bool(dra_examples))
        )
        try:
            await cluster.up(nodes, namespaces)
            if dra_examples:
                await _start_dra(cluster, workdir)
            dra_text = f", 1 DRA node with {len(dra_examples)} example pod(s)" if cluster.dra else ""
            print(
                f"kube-vgpu demo: {len(nodes)} simulated node(s), {len(pods)} example pod(s){dra_text}",
                flush=True,
            )
            names = ", ".join(cluster.config.resource_names.all())
            print(f"config: {config_file or 'every default'} (resources {names})\n", flush=True)
            failing_nodes = await _node_checks(cluster)
            failures = 0
            outcomes = []
            async with aiohttp.ClientSession() as session:
                flow = PodFlow(cluster, session)
                for example in pods:
                    outcome = await flow.run(example)
                    outcomes.append(outcome)
                    problems = check(outcome)
                    failures += bool(problems)
                    for line in render(outcome, problems):
                        print(line, flush=True)
                print(f"{len(pods) - failures} of {len(pods)} examples ended as expected.", flush=True)
                failures += await _run_dra(cluster, dra_examples, session)
            workloads = start_workloads(cluster, outcomes)
            print("\nUsage read from NVML, each process mapped to its container by its cgroup:", flush=True)
            within = cluster.config.node.register_interval_seconds + 5.0
            print("\n".join(await usage_report(cluster, workloads, within)), flush=True)
            view = await asyncio.to_thread(read_view, cluster.outside_kube(), cluster.config)
            print(f"\n$ kube-vgpu top\n{render_text(view)}", end="", flush=True)
            if not args.once:
                await _serve(cluster)
            return 1 if failures or failing_nodes else 0
        finally:
            await cluster.down()


def run(args: argparse.Namespace) -> int:
    """Run the demo; see the module docstring for exit codes."""
    configure_logging(logging.INFO if args.verbose else logging.ERROR)
    try:
        # The first Ctrl-C cancels the demo's task (asyncio.run's own handler): every part is
        # stopped (`LocalCluster.down`), then asyncio.run raises KeyboardInterrupt.
        code = asyncio.run(_demo(args))
    except KeyboardInterrupt:
        code = INTERRUPTED
    except (ExampleError, ConfigError) as exc:
        print(f"kube-vgpu demo: {exc}", file=sys.stderr)
        code = 2
    except DemoError as exc:
        print(f"kube-vgpu demo: the local installation failed: {exc}", file=sys.stderr)
        code = 1
    if code == INTERRUPTED:
        sys.stderr.write(INTERRUPTED_LINE)
        sys.stderr.flush()
    signal.signal(signal.SIGINT, _interrupted_while_exiting if code != INTERRUPTED else _exit_interrupted)
    return code


def _interrupted_while_exiting(signum: int, frame: object) -> None:
    """Ctrl-C once the demo has stopped its parts, while the process exits: the same line and code.
    Written with os.write: a handler runs between two bytecodes, maybe inside a print."""
    os.write(sys.stderr.fileno(), INTERRUPTED_LINE.encode())
    _exit_interrupted(signum, frame)


def _exit_interrupted(signum: int, frame: object) -> None:
    os._exit(INTERRUPTED)
