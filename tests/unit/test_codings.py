"""`proxy.codings`: a request body's coding decoded whole, or refused."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Callable

import brotli
import pytest
from backports.zstd import compress as zstd_compress

from proxy.codings import TooLarge, Undecodable, decode

RAW = b'{"model": "m", "messages": [{"role": "user", "content": "hi there"}]}'
ENCODERS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": gzip.compress, "deflate": zlib.compress, "br": brotli.compress,
    "zstd": zstd_compress}


def raw_deflate(data: bytes) -> bytes:
    c = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return c.compress(data) + c.flush()


@pytest.mark.parametrize("coding", ENCODERS)
def test_a_whole_stream_is_decoded(coding: str) -> None:
    assert decode(ENCODERS[coding](RAW), coding, len(RAW)) == RAW
    assert decode(b"", coding, 10) == b""


def test_raw_deflate_and_joined_members_and_frames_are_decoded() -> None:
    assert decode(raw_deflate(RAW), "deflate", 1000) == RAW
    assert decode(gzip.compress(RAW) + gzip.compress(RAW), "gzip", 1000) == RAW + RAW
    assert decode(zstd_compress(RAW) + zstd_compress(RAW), "zstd", 1000) == RAW + RAW


@pytest.mark.parametrize("coding", ENCODERS)
@pytest.mark.parametrize("cut", [1, 4, 8])
def test_a_stream_cut_short_is_refused(coding: str, cut: int) -> None:
    """aiohttp checked that a deflate stream ended, no other: a gzip body without its
    trailer was read as what had come."""
    with pytest.raises(Undecodable):
        decode(ENCODERS[coding](RAW)[:-cut], coding, 1000)


@pytest.mark.parametrize("coding", ENCODERS)
def test_bytes_after_the_stream_are_refused(coding: str) -> None:
    with pytest.raises(Undecodable):
        decode(ENCODERS[coding](RAW) + b"garbage", coding, 1000)


def test_a_bad_checksum_is_refused() -> None:
    body = gzip.compress(RAW)
    with pytest.raises(Undecodable):
        decode(body[:-8] + bytes(4) + body[-4:], "gzip", 1000)
    with pytest.raises(Undecodable):  # the length in the trailer
        decode(body[:-4] + bytes(4), "gzip", 1000)


@pytest.mark.parametrize("coding", ENCODERS)
def test_output_is_bounded_by_the_limit(coding: str) -> None:
    bomb = ENCODERS[coding](b"x" * 5_000_000)
    with pytest.raises(TooLarge):
        decode(bomb, coding, 100_000)
    with pytest.raises(TooLarge):
        decode(ENCODERS[coding](RAW), coding, len(RAW) - 1)
