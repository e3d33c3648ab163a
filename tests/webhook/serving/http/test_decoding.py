"""Compressed request bodies are decoded within the limit, damaged ones named (webhook.http.decoding)."""

from __future__ import annotations

import gzip
import zlib

import pytest

from kube_vgpu.webhook.serving.http.decoding import BodyDecoder, BodyTooLarge, BodyUnreadable

DOC = b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}' * 50


def _fed(encoding: str, data: bytes, limit: int = 1 << 20, piece: int = 7) -> bytes:
    decoder = BodyDecoder(encoding, limit)
    for start in range(0, len(data), piece):
        decoder.feed(data[start : start + piece])
    return decoder.finish()


@pytest.mark.parametrize(
    ("encoding", "data"),
    [
        ("identity", DOC),
        ("gzip", gzip.compress(DOC)),
        ("deflate", zlib.compress(DOC)),  # the zlib wrapper, as RFC 9110 means by deflate
        ("deflate", zlib.compress(DOC, wbits=-zlib.MAX_WBITS)),  # raw deflate, which some clients send
    ],
)
def test_bodies_decode_whatever_pieces_they_arrive_in(encoding: str, data: bytes) -> None:
    assert _fed(encoding, data) == DOC
    assert _fed(encoding, data, piece=len(data)) == DOC


def test_a_bomb_stops_at_the_limit_holding_no_more_than_it() -> None:
    limit = 64 * 1024
    bomb = gzip.compress(b"\0" * (100 * limit))
    decoder = BodyDecoder("gzip", limit)
    with pytest.raises(BodyTooLarge, match="after decompression"):
        decoder.feed(bomb)  # one piece holding the whole bomb
    assert decoder._size <= limit + 1


def test_a_plain_body_over_the_limit_is_too_large() -> None:
    decoder = BodyDecoder("identity", 10)
    decoder.feed(b"0123456789")
    with pytest.raises(BodyTooLarge, match="10-byte limit"):
        decoder.feed(b"x")


@pytest.mark.parametrize(
    ("encoding", "data", "reason"),
    [
        ("gzip", gzip.compress(DOC)[:-4], "ends before its end"),
        ("gzip", gzip.compress(DOC)[:10], "ends before its end"),
        ("gzip", b"", "ends before its end"),
        ("gzip", gzip.compress(DOC) + b"x", "after its end"),
        ("gzip", b"\x1f\x8b garbage", "damaged"),
        ("deflate", b"not deflate", "damaged"),
    ],
)
def test_damaged_compressed_bodies_are_named(encoding: str, data: bytes, reason: str) -> None:
    with pytest.raises(BodyUnreadable, match=reason):
        _fed(encoding, data)


def test_an_unknown_encoding_is_refused_when_the_decoder_is_made() -> None:
    with pytest.raises(ValueError, match="unsupported content encoding 'br'"):
        BodyDecoder("br", 100)


@pytest.mark.parametrize("encoding", ["identity", "gzip", "deflate"])
def test_a_body_decoding_to_exactly_the_limit_is_read_and_one_byte_more_is_refused(encoding: str) -> None:
    limit = 64 * 1024
    compress = {"identity": lambda b: b, "gzip": gzip.compress, "deflate": zlib.compress}[encoding]
    assert _fed(encoding, compress(b"a" * limit), limit=limit, piece=4096) == b"a" * limit
    with pytest.raises(BodyTooLarge, match=f"over the {limit}-byte limit"):
        _fed(encoding, compress(b"a" * (limit + 1)), limit=limit, piece=4096)
