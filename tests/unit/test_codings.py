"""`proxy.codings`: a request body's coding decoded whole, or refused."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Callable

import brotli
import pytest
from backports.zstd import compress as zstd_compress

from proxy.codings import TooLarge, Undecodable, decode, decode_all

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


@pytest.mark.parametrize("pad", [1, 7, 512, 10240])
def test_zero_padding_after_the_last_gzip_member_is_decoded(pad: int) -> None:
    """A gzip body padded with zero bytes (a tape block's, a fixed-size buffer's),
    which `gzip -d` decodes (warning "trailing zero bytes ignored") and Python's gzip
    module reads, was refused as bytes after the stream. Zeros after the last member
    are taken; zeros before a member, or with anything after them, are not."""
    body = gzip.compress(RAW)
    assert decode(body + bytes(pad), "gzip", 1000) == RAW
    assert decode(body + body + bytes(pad), "gzip", 1000) == RAW + RAW
    for bad in (body + bytes(pad) + body, body + bytes(pad) + b"x", bytes(pad) + body,
                bytes(pad)):
        with pytest.raises(Undecodable):
            decode(bad, "gzip", 1000)
    for coding in ("deflate", "zstd", "br"):  # (their tools refuse it too)
        with pytest.raises(Undecodable):
            decode(ENCODERS[coding](RAW) + bytes(pad), coding, 1000)


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


class _Counting:
    """A decompressor that counts the bytes it is handed."""

    fed = 0

    def __init__(self, inner: object) -> None:
        self._inner = inner

    def decompress(self, data: bytes, *args: int) -> bytes:
        _Counting.fed += len(data)
        return self._inner.decompress(data, *args)  # type: ignore[attr-defined,no-any-return]

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


@pytest.mark.parametrize("coding", ["gzip", "zstd"])
def test_many_members_cost_what_they_weigh(coding: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Each member's decoder was handed all that followed it (and copied it back as its
    unused data): a body of many empty members cost the square of its size, a 4 MiB one
    of 9-byte zstd frames held the event loop for about 100 s."""
    import proxy.codings as codings

    if coding == "gzip":
        real = zlib.decompressobj
        monkeypatch.setattr(codings.zlib, "decompressobj",
                            lambda *a: _Counting(real(*a)))
    else:
        real_zstd = codings.ZstdDecompressor
        monkeypatch.setattr(codings, "ZstdDecompressor",
                            lambda *a: _Counting(real_zstd(*a)))
    _Counting.fed = 0
    member = ENCODERS[coding](b"")
    body = member * 1000 + ENCODERS[coding](RAW)
    assert decode(body, coding, len(RAW)) == RAW
    assert _Counting.fed <= 8 * len(body)  # (it was about 1000 times)


@pytest.mark.parametrize("coding", ["gzip", "zstd"])
def test_members_past_the_bound_are_refused(coding: str) -> None:
    """(Each member costs a decoder: a zstd one is made in about 17 µs.)"""
    from proxy.codings import MAX_MEMBERS

    member = ENCODERS[coding](b"")
    whole = ENCODERS[coding](RAW)
    assert decode(member * (MAX_MEMBERS - 1) + whole, coding, len(RAW)) == RAW
    with pytest.raises(Undecodable):
        decode(member * MAX_MEMBERS + whole, coding, len(RAW))


def test_codings_one_over_another_are_decoded_last_first_each_within_the_limit() -> None:
    """`gzip, br`: gzipped, then compressed in br; decoded br first. Each layer is held
    to the limit: a bomb in its inner layer is `TooLarge` however small the outer."""
    assert decode_all(brotli.compress(gzip.compress(RAW)), ["gzip", "br"], 1000) == RAW
    with pytest.raises(Undecodable):  # (the other order)
        decode_all(brotli.compress(gzip.compress(RAW)), ["br", "gzip"], 1000)
    bomb = gzip.compress(gzip.compress(b"x" * 10_000_000))
    assert len(bomb) < 2000
    with pytest.raises(TooLarge):
        decode_all(bomb, ["gzip", "gzip"], 100_000)
