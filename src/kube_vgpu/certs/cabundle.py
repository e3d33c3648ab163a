"""The JSON patch that puts a CA bundle into every webhook of a MutatingWebhookConfiguration.

Pure: the configuration as read and the CA's PEM in, patch operations out (empty when every webhook
already carries this CA).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any


def encode_ca_bundle(ca_pem: bytes) -> str:
    """`clientConfig.caBundle` as the API stores it: the PEM bytes, base64-encoded."""
    return base64.b64encode(ca_pem).decode("ascii")


def _decoded(value: object) -> bytes | None:
    if not isinstance(value, str):
        return None
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None


def ca_bundle_patch(configuration: Mapping[str, Any], ca_pem: bytes) -> list[dict[str, Any]]:
    """JSON-patch operations setting `caBundle` on each webhook whose bundle differs from `ca_pem`.

    Each change is guarded by a `test` on that webhook's name, so a list reordered or edited since it
    was read makes the server refuse the whole patch instead of writing a bundle into the wrong webhook.
    """
    operations: list[dict[str, Any]] = []
    encoded = encode_ca_bundle(ca_pem)
    for index, webhook in enumerate(configuration.get("webhooks") or []):
        client_config = webhook.get("clientConfig") or {}
        if _decoded(client_config.get("caBundle")) == ca_pem:
            continue
        operations.append({"op": "test", "path": f"/webhooks/{index}/name", "value": webhook.get("name")})
        # `add` on an object member sets it whether or not it is there already.
        operations.append({"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle", "value": encoded})
    return operations
