"""`kube-vgpu demo`: bring up the local installation, carry the example pods through it, report.

Exit code: 0 when every example ended as its file says and `node check` finds every simulated node able
to serve its mode, 1 otherwise, 2 for bad input.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
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
from kube_vgpu.demo.examples import (
    ExampleError,
    check_pod_namespaces,
    load_namespaces,
    load_nodes,
    load_pods,
)
from kube_vgpu.demo.flow import PodFlow, check
from kube_vgpu.demo.nodecheck import node_checks
from kube_vgpu.demo.report import render
from kube_vgpu.demo.workload import start_workloads, usage_report

# The repository's examples/ folder (src/kube_vgpu/demo/cli.py is four levels below it).
DEFAULT_EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
EXAMPLES_CONFIG = "config.yaml"


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


async def _demo(args: argparse.Namespace) -> int:
    examples: Path = args.examples
    nodes = load_nodes(examples / "nodes.yaml")
    namespaces = load_namespaces(examples / "namespaces.yaml")
    pods = load_pods(examples / "pods")
    check_pod_namespaces(pods, namespaces, examples / "pods")
    config_file = examples_config(examples, args.config)
    with tempfile.TemporaryDirectory(prefix="kube-vgpu-demo-") as tmp:
        workdir = Path(tmp)
        cluster = LocalCluster(workdir, demo_config(load_config(config_file), workdir))
        try:
            await cluster.up(nodes, namespaces)
            print(f"kube-vgpu demo: {len(nodes)} simulated node(s), {len(pods)} example pod(s)", flush=True)
            names = ", ".join(cluster.config.resource_names.all())
            print(f"config: {config_file or 'every default'} (resources {names})\n", flush=True)
            checked, failing_nodes = await node_checks(cluster)
            print("$ kube-vgpu node check (on each simulated node)", *checked, "", sep="\n", flush=True)
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
            workloads = start_workloads(cluster, outcomes)
            print("\nUsage read from NVML, each process mapped to its container by its cgroup:", flush=True)
            within = cluster.config.node.register_interval_seconds + 5.0
            print("\n".join(await usage_report(cluster, workloads, within)), flush=True)
            view = await asyncio.to_thread(read_view, cluster.outside_kube(), cluster.config)
            print(f"\n$ kube-vgpu top\n{render_text(view)}", end="", flush=True)
            if not args.once:
                assert cluster.webhook is not None
                print("\nMetrics (Ctrl-C to stop):")
                print(f"  webhook  http://127.0.0.1:{cluster.webhook.metrics_server.port}/metrics")
                for name, node in cluster.nodes.items():
                    port = node.plugin.metrics_server.port if node.plugin.metrics_server else "?"
                    print(f"  node {name}: http://127.0.0.1:{port}/metrics")
                stop = asyncio.Event()
                loop = asyncio.get_running_loop()
                for signum in (signal.SIGINT, signal.SIGTERM):
                    loop.add_signal_handler(signum, stop.set)
                await stop.wait()
            return 1 if failures or failing_nodes else 0
        finally:
            await cluster.down()


def run(args: argparse.Namespace) -> int:
    """Run the demo; see the module docstring for exit codes."""
    configure_logging(logging.INFO if args.verbose else logging.ERROR)
    try:
        return asyncio.run(_demo(args))
    except (ExampleError, ConfigError) as exc:
        print(f"kube-vgpu demo: {exc}", file=sys.stderr)
        return 2
    except DemoError as exc:
        print(f"kube-vgpu demo: the local installation failed: {exc}", file=sys.stderr)
        return 1
