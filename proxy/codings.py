"""A request body's `Content-Encoding` decoded, strictly, within the size limit.

aiohttp's own decoding (as its parser reads) checks only that a deflate stream ended: a
gzip, br or zstd body cut short (its trailer, its CRC, its last block missing) was read
as the part that came, which may itself be valid JSON, so a truncated upload could be
served as a shorter request. `weir serve` has aiohttp leave the body as it came
(`auto_decompress=False`) and decodes it here: every stream must end, gzip members and
zstd frames may follow one another (their contents are joined, as RFC 1952 and RFC 8878
say; up to `MAX_MEMBERS` of them, each handed about its own bytes), and nothing else
may follow, but zero bytes after a gzip body's last member (padding, which `gzip -d`
and Python's gzip module take). Output is bounded as it is produced, so a small body
that expands past the limit (a decompression bomb) costs no more than the limit. A body
may be in up to `MAX_CODINGS` codings, one over another (`gzip, br`: RFC 9110 8.4),
each layer decoded within the limit.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import Protocol

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


class _Decoder(Protocol):
    """zlib's decompressobj, or a ZstdDecompressor."""

    @property
    def eof(self) -> bool: ...

    @property
    def unused_data(self) -> bytes: ...

    def decompress(self, data: bytes | memoryview, max_length: int = ...) -> bytes: ...


_GZIP, _ZLIB, _RAW_DEFLATE = 16 + zlib.MAX_WBITS, zlib.MAX_WBITS, -zlib.MAX_WBITS


def _check(out: bytearray, limit: int) -> int:
    """What may still be produced (one byte past the limit tells it was passed)."""
    if len(out) > limit:
        raise TooLarge
    return limit + 1 - len(out)


#: The first piece of the body a member's decoder is handed; each next is twice as long.
#: A decoder keeps what follows its member's end (`unused_data`, a copy): handed the
#: whole rest of the body, a body of many small members (gzip members, zstd frames of a
#: few bytes each) cost the square of its size (a 4 MiB one held the event loop for
#: about 100 s); so each member costs about what it weighs.
_FIRST_PIECE = 64
#: How many gzip members or zstd frames a body may hold: each costs a decoder (a zstd
#: one, about 17 µs to make: 4 MiB of empty frames was seconds of the event loop). A
#: compressor writes one, or a few of up to a block's size (bgzip: 64 KiB).
MAX_MEMBERS = 1024


def _members(data: bytes, new: Callable[[], _Decoder], limit: int, members: bool,
             padded: bool = False) -> bytes:
    """`data` decoded as a stream's members, one after another (`members`), or as one;
    `padded`: zero bytes may follow the last member (no member starts with one)."""
    view, pos, out = memoryview(data), 0, bytearray()
    for _ in range(MAX_MEMBERS):
        d, piece = new(), _FIRST_PIECE
        while True:  # this member, handed to its decoder piece by piece
            chunk = view[pos:pos + piece]
            out += d.decompress(chunk, _check(out, limit))
            # (A decoder stops short of what it was handed only at `max_length`, one
            # byte past the limit: under it, it took all, or its member ended.)
            _check(out, limit)
            if d.eof:
                pos += len(chunk) - len(d.unused_data)
                break
            pos += len(chunk)
            if pos >= len(view):
                raise Undecodable  # cut short
            piece *= 2
        if pos >= len(view) or (padded and data[pos] == 0 and _zeros(data, pos)):
            return bytes(out)
        if not members:
            raise Undecodable  # bytes after the stream's end
    raise Undecodable  # more members than any compressor writes


def _zeros(data: bytes, pos: int) -> bool:
    """Whether `data` holds only zero bytes from `pos` on: counted once, where a member
    would start (no member starts with a zero byte: the next one would be refused)."""
    return data.count(0, pos) == len(data) - pos


def _zlib(data: bytes, wbits: int, limit: int, members: bool, padded: bool = False) -> bytes:
    try:
        return _members(data, lambda: zlib.decompressobj(wbits), limit, members, padded)
    except zlib.error:
        raise Undecodable from None


def _gzip(data: bytes, limit: int) -> bytes:
    return _zlib(data, _GZIP, limit, members=True, padded=True)


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
    try:
        return _members(data, ZstdDecompressor, limit, members=True)
    except ZstdError:
        raise Undecodable from None


_DECODERS: dict[str, Callable[[bytes, int], bytes]] = {
    "gzip": _gzip, "deflate": _deflate, "br": _br, "zstd": _zstd}


def decode(data: bytes, coding: str, limit: int) -> bytes:
    """`data` decoded as `coding` (one of gzip, deflate, br, zstd), or `Undecodable`, or
    `TooLarge` once it passes `limit` bytes. An empty body stays empty."""
    return _DECODERS[coding](data, limit) if data else data


#: How many codings a body may be in, one applied over another (`gzip, br`): each layer
#: costs a pass within the size limit. No client stacks more than two (a gzipped file
#: sent by a client that compresses what it sends).
MAX_CODINGS = 2


def decode_all(data: bytes, codings: Sequence[str], limit: int) -> bytes:
    """`data` decoded as `codings` say (each one of gzip, deflate, br, zstd; at most
    `MAX_CODINGS`), listed in the order they were applied: the last is decoded first.
    Each layer is `Undecodable` where its stream is, `TooLarge` past `limit`."""
    assert len(codings) <= MAX_CODINGS
    for coding in reversed(codings):
        data = decode(data, coding, limit)
    return data
