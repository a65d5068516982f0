"""A request body's `Content-Encoding` decoded, strictly, within the size limit.

aiohttp's own decoding (as its parser reads) checks only that a deflate stream ended: a
gzip, br or zstd body cut short (its trailer, its CRC, its last block missing) was read
as the part that came, which may itself be valid JSON, so a truncated upload could be
served as a shorter request. `weir serve` has aiohttp leave the body as it came
(`auto_decompress=False`) and decodes it here: every stream must end, gzip members and
zstd frames may follow one another (their contents are joined, as RFC 1952 and RFC 8878
say), and nothing else may follow. Output is bounded as it is produced, so a small body
that expands past the limit (a decompression bomb) costs no more than the limit.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import brotli

try:
    from compression.zstd import (  # type: ignore[import-not-found]
        ZstdDecompressor,
        ZstdError,
    )
except ImportError:  # (before Python 3.14)
    from backports.zstd import ZstdDecompressor, ZstdError


class Undecodable(ValueError):
    """The body is not a whole stream in its coding."""


class TooLarge(ValueError):
    """Decoded, the body is past the limit."""


_GZIP, _ZLIB, _RAW_DEFLATE = 16 + zlib.MAX_WBITS, zlib.MAX_WBITS, -zlib.MAX_WBITS


def _check(out: bytearray, limit: int) -> int:
    """What may still be produced (one byte past the limit tells it was passed)."""
    if len(out) > limit:
        raise TooLarge
    return limit + 1 - len(out)


def _zlib(data: bytes, wbits: int, limit: int, members: bool) -> bytes:
    out = bytearray()
    while True:
        d = zlib.decompressobj(wbits)
        try:
            out += d.decompress(data, _check(out, limit))
            while d.unconsumed_tail and not d.eof:
                out += d.decompress(d.unconsumed_tail, _check(out, limit))
        except zlib.error:
            raise Undecodable from None
        _check(out, limit)
        if not d.eof:
            raise Undecodable  # cut short
        data = d.unused_data
        if not data:
            return bytes(out)
        if not members:
            raise Undecodable  # bytes after the stream's end


def _gzip(data: bytes, limit: int) -> bytes:
    return _zlib(data, _GZIP, limit, members=True)


def _deflate(data: bytes, limit: int) -> bytes:
    # (a raw deflate stream, without zlib's header, is accepted, as aiohttp accepts it)
    wbits = _ZLIB if data and data[0] & 0x0F == 8 else _RAW_DEFLATE
    return _zlib(data, wbits, limit, members=False)


def _br(data: bytes, limit: int) -> bytes:
    out = bytearray()
    d = brotli.Decompressor()
    try:
        out += d.process(data, output_buffer_limit=_check(out, limit))
        while not d.can_accept_more_data():
            out += d.process(b"", output_buffer_limit=_check(out, limit))
    except brotli.error:
        raise Undecodable from None
    _check(out, limit)
    if not d.is_finished():
        raise Undecodable
    return bytes(out)


def _zstd(data: bytes, limit: int) -> bytes:
    out = bytearray()
    while True:
        d = ZstdDecompressor()
        try:
            out += d.decompress(data, _check(out, limit))
            while not d.eof and not d.needs_input:
                out += d.decompress(b"", _check(out, limit))
        except ZstdError:
            raise Undecodable from None
        _check(out, limit)
        if not d.eof:
            raise Undecodable
        data = d.unused_data
        if not data:
            return bytes(out)


_DECODERS: dict[str, Callable[[bytes, int], bytes]] = {
    "gzip": _gzip, "deflate": _deflate, "br": _br, "zstd": _zstd}


def decode(data: bytes, coding: str, limit: int) -> bytes:
    """`data` decoded as `coding` (one of gzip, deflate, br, zstd), or `Undecodable`, or
    `TooLarge` once it passes `limit` bytes. An empty body stays empty."""
    return _DECODERS[coding](data, limit) if data else data
