"""The one log line format of every kube-vgpu process (webhook, node plugin, certs, demo):
`<time> level=<LEVEL> logger=<name> event=<what> key=value ...`, one event per line on stderr, so
one parser reads all of them."""

from __future__ import annotations

import logging
import sys

LOG_FORMAT = "%(asctime)s level=%(levelname)s logger=%(name)s %(message)s"


def configure_logging(level: int | str) -> None:
    """Log to stderr in LOG_FORMAT at `level` (a name like "info", or a logging constant), unless
    the process already configured logging (tests, an embedding program)."""
    if logging.getLogger().handlers:
        return
    if isinstance(level, str):
        level = level.upper()
    logging.basicConfig(level=level, format=LOG_FORMAT, stream=sys.stderr)
