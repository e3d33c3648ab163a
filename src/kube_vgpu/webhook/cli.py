"""`kube-vgpu webhook`: flags, logging, and the exit code; the work is in `webhook.service`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from kube_vgpu.contract.config import ConfigError, load_config
from kube_vgpu.contract.logformat import configure_logging
from kube_vgpu.httpedge.listener import ConnectionLimits
from kube_vgpu.kubeapi.client import KubeConfigError
from kube_vgpu.kubeapi.flags import add_cluster_arguments
from kube_vgpu.webhook.service import Options, serve
from kube_vgpu.webhook.serving.tls import TlsFilesError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The webhook's flags (each also readable from KUBE_VGPU_<FLAG>)."""
    parser.add_argument("--tls-cert-file", required=True, help="PEM serving certificate (reloaded on change)")
    parser.add_argument("--tls-key-file", required=True, help="PEM private key of the serving certificate")
    parser.add_argument("--port", type=int, default=8443, help="HTTPS port")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on")
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=9395,
        help="plain-HTTP port of /metrics, apart from the admission port",
    )
    parser.add_argument("--config", default=None, help="configuration file (YAML); default: every default")
    add_cluster_arguments(parser)
    parser.add_argument(
        "--cert-poll-seconds",
        type=float,
        default=10.0,
        help="how often the TLS files are checked for changes",
    )
    parser.add_argument(
        "--shutdown-timeout",
        type=float,
        default=20.0,
        help="seconds from SIGTERM to exit: requests in flight finish, every connection is closed "
        "(keep the pod's terminationGracePeriodSeconds above it)",
    )
    parser.add_argument(
        "--client-ca-file",
        default=None,
        help="PEM CA bundle; callers must present a client certificate it signed (default: any caller)",
    )
    parser.add_argument(
        "--network-policy",
        choices=["on", "off"],
        default="off",
        help="whether the install put a NetworkPolicy in front of the port (logged and reported as a metric)",
    )
    parser.add_argument(
        "--release-namespace",
        default="default",
        help="namespace of the shared quota reservations (the chart passes the webhook pod's own)",
    )
    limits = ConnectionLimits()
    parser.add_argument(
        "--max-connections",
        type=int,
        default=limits.max_connections,
        help="open connections at most (bounds memory); at the cap the connection longest idle or "
        "longest without completing its request is closed to admit the new one",
    )
    parser.add_argument(
        "--request-timeout",
        type=float,
        default=limits.request_timeout_seconds,
        help="seconds from a new connection's accept (TLS handshake included), or a request's first "
        "byte, until the request has arrived whole",
    )
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=limits.idle_timeout_seconds,
        help="seconds an idle keep-alive connection is kept (above the API server's 90)",
    )
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"], help="how much to log"
    )


def new_event_loop() -> asyncio.AbstractEventLoop:
    """The loop the webhook serves on: uvloop where it is installed (its TLS and transports cost a
    review less CPU than asyncio's; see docs/benchmarks.md), else asyncio's own."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def _run(main: Coroutine[Any, Any, int]) -> int:
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM; 0 on a clean stop, 2 on bad configuration or credentials."""
    configure_logging(args.log_level)
    log = logging.getLogger("kube_vgpu.webhook")
    try:
        check_flags(args)
        config = load_config(args.config)
        options = Options(
            tls_cert_file=Path(args.tls_cert_file),
            tls_key_file=Path(args.tls_key_file),
            port=args.port,
            host=args.host,
            metrics_port=args.metrics_port,
            kubeconfig=args.kubeconfig,
            kube_context=args.context,
            cert_poll_seconds=args.cert_poll_seconds,
            shutdown_timeout_seconds=args.shutdown_timeout,
            limits=ConnectionLimits(
                max_connections=args.max_connections,
                request_timeout_seconds=args.request_timeout,
                idle_timeout_seconds=args.idle_timeout,
            ),
            client_ca_file=Path(args.client_ca_file) if args.client_ca_file else None,
            release_namespace=args.release_namespace,
            network_policy=args.network_policy == "on",
        )
        return _run(serve(options, config))
    except (ConfigError, KubeConfigError, TlsFilesError, OSError, ValueError) as exc:
        log.error("event=webhook_failed error=%r", str(exc))
        return 2


def check_flags(args: argparse.Namespace) -> None:
    """Refuse numbers the server would only trip over later (a port past 65535 fails deep in bind,
    a NaN timeout never fires); raises ValueError naming the flag and the value."""
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be 0-65535 (0: any free port), got {args.port}")
    for flag, value, least in (
        ("--cert-poll-seconds", args.cert_poll_seconds, 0.01),
        ("--shutdown-timeout", args.shutdown_timeout, 0.0),
    ):
        if not (math.isfinite(value) and value >= least):
            raise ValueError(f"{flag} must be a number of seconds, at least {least:g}, got {value}")
    # ConnectionLimits refuses values below zero; NaN and infinity pass its comparisons.
    for flag, value in (("--request-timeout", args.request_timeout), ("--idle-timeout", args.idle_timeout)):
        if not math.isfinite(value):
            raise ValueError(f"{flag} must be a finite number of seconds, got {value}")
