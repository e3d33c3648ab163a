"""Bodies sent with `Content-Encoding: gzip` or `deflate`, decoded as they arrive and never past the limit.

A compressed body says nothing about its size once decoded (a 3 kB gzip bomb can decode to
gigabytes), so the decoder stops as soon as the output would pass the limit, having held at most
the limit plus one chunk.
"""

from __future__ import annotations

import zlib
from typing import Final

# What the API server and ordinary clients send; anything else is answered 415.
ENCODINGS: Final = ("gzip", "deflate", "identity")
_GZIP_WBITS: Final = 16 + zlib.MAX_WBITS
# Some clients send raw deflate (no zlib header) as `deflate`; tried when the zlib header is wrong.
_RAW_DEFLATE_WBITS: Final = -zlib.MAX_WBITS


class BodyTooLarge(ValueError):
    """The decoded body would be longer than the limit."""


class BodyUnreadable(ValueError):
    """The body does not decode; `str()` says why."""


class BodyDecoder:
    """Collects one body, decoding `gzip` or `deflate`, refusing more than `limit_bytes` of output."""

    def __init__(self, encoding: str, limit_bytes: int) -> None:
        if encoding not in ENCODINGS:
            raise ValueError(f"unsupported content encoding {encoding!r}")
        self.encoding = encoding
        self.limit_bytes = limit_bytes
        self._parts: list[bytes] = []
        self._size = 0
        self._inflate: zlib._Decompress | None = None
        self._first = True
        if encoding == "gzip":
            self._inflate = zlib.decompressobj(_GZIP_WBITS)
        elif encoding == "deflate":
            self._inflate = zlib.decompressobj(zlib.MAX_WBITS)

    def feed(self, data: bytes) -> None:
        """Add one piece of the body as sent; raises BodyTooLarge or BodyUnreadable."""
        if self._inflate is None:
            self._keep(data)
            return
        try:
            out = self._inflate_piece(data)
        except zlib.error as exc:
            raise BodyUnreadable(f"{self.encoding} data is damaged ({exc})") from None
        self._keep(out)
        if self._inflate.unconsumed_tail:  # stopped at the limit with input left over
            raise BodyTooLarge(f"body is over the {self.limit_bytes}-byte limit (after decompression)")

    def _inflate_piece(self, data: bytes) -> bytes:
        assert self._inflate is not None
        room = self.limit_bytes - self._size + 1
        if self._inflate.eof:
            if data:
                raise BodyUnreadable(f"{self.encoding} data goes on after its end")
            return b""
        if self._first and self.encoding == "deflate":
            self._first = False
            try:
                return self._inflate.decompress(data, room)
            except zlib.error:
                self._inflate = zlib.decompressobj(_RAW_DEFLATE_WBITS)
        self._first = False
        return self._inflate.decompress(data, room)

    def _keep(self, data: bytes) -> None:
        if not data:
            return
        self._size += len(data)
        if self._size > self.limit_bytes:
            raise BodyTooLarge(
                f"body is over the {self.limit_bytes}-byte limit"
                + (" (after decompression)" if self._inflate is not None else "")
            )
        self._parts.append(data)

    def finish(self) -> bytes:
        """The whole decoded body; raises BodyUnreadable when a compressed body ended early."""
        if self._inflate is not None:
            if not self._inflate.eof:
                raise BodyUnreadable(f"{self.encoding} data ends before its end (truncated body)")
            if self._inflate.unused_data:
                raise BodyUnreadable(f"{self.encoding} data goes on after its end")
        parts = self._parts
        return parts[0] if len(parts) == 1 else b"".join(parts)
