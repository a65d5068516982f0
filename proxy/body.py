"""Reading a request body: content type, charset and coding, the one size limit, a time limit,
then JSON.

A body may come compressed (`Content-Encoding`: gzip, deflate, br or zstd; the size
limit counts the decoded bytes); any other coding, or several, is a 415, and a body its
coding cannot decode, or that its stream does not end (`proxy.codings`), a 400. `weir
serve` has aiohttp leave the body as it came, decoded here; a server that lets aiohttp
decode it (aiohttp's test server) gets it decoded, less strictly. Its transfer coding
may be `chunked` alone: aiohttp frames a body by its last coding and ignores the others
(`gzip, chunked` would be read undecoded), so any other is a 501, as nginx and Envoy
answer.

`server.max_body_bytes` is the only body-size limit (aiohttp's `client_max_size` is set
from it, and routes pass it here); `server.body_timeout_s` bounds how long a client may
take to send the body, so a stalled upload cannot hold a handler forever.

The bodies being read at once take at most about `server.max_body_bytes_in_flight`
(`app_state.BodyBudget`): every connection a client could open (thousands) sending a
full body slowly held it all, 6 MB each in memory, before any limit or queue downstream
saw the request. A body counts the bytes read of it so far, as they arrive (not its
`Content-Length`, which a client may announce and never send, nor the limit for a
chunked one: either held the budget for bytes nobody sent, and a few stalled uploads
refused every other tenant's body). Past the budget, a tenant holding an even share or
more of it is refused a 503 `overloaded`; another's body is still read, up to twice the
budget. A body that came whole with its head is held already: refusing it would free
nothing, so it is not counted.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from .app_state import STATE
from .codings import TooLarge, Undecodable, decode
from .errors import (
    InvalidRequest,
    PayloadTooLarge,
    RequestTimeout,
    Unavailable,
    UnsupportedMediaType,
    UnsupportedTransferCoding,
    shown,
)
from .jsonbody import decode_json_object

#: The charsets a JSON body may be declared in (none, or UTF-8 or its subset ASCII). A
#: body declared in another is refused, not transcoded: JSON is UTF-8 (RFC 8259 8.1), and
#: text read by another charset is not what a UTF-8 reader in front of Weir (a WAF, a
#: logging proxy) saw; read as UTF-8 regardless, a Latin-1 body was mojibake, in silence.
_UTF8 = frozenset({"", "utf-8", "utf8", "us-ascii", "ascii"})

#: The codings aiohttp decodes (one at a time), and `identity`.
_CODINGS = frozenset({"", "identity", "gzip", "deflate", "br", "zstd"})


async def read_json(request: web.Request, limit: int, owner: str = "",
                    ) -> tuple[dict[str, Any], int]:
    """The body as a JSON object and its size in bytes, or a 400 / 408 / 413, or a 503
    where too many bodies are being read at once (`BodyBudget`; `owner`: the caller's
    account)."""
    # (aiohttp reads a missing Content-Type as application/octet-stream: say none)
    ctype = request.content_type if "Content-Type" in request.headers else ""
    if ctype != "application/json" and not ctype.endswith("+json"):
        raise InvalidRequest(
            f"Unsupported content type `{shown(ctype or 'none')}`; send `application/json`.",
            code="invalid_content_type",
        )
    charset = (request.charset or "").strip().lower().replace("_", "-")
    if charset not in _UTF8:
        raise InvalidRequest(
            f"Unsupported charset `{shown(request.charset)}` in Content-Type: a JSON body is "
            "UTF-8 (RFC 8259); send it in UTF-8, as `application/json` or "
            "`application/json; charset=utf-8`.",
            code="invalid_content_type",
        )
    # (Several headers are several codings: aiohttp would decode by the last one alone.)
    coding = ",".join(request.headers.getall("Content-Encoding", ())).strip().lower()
    if coding not in _CODINGS:
        raise UnsupportedMediaType(
            "Unsupported Content-Encoding; send the body as is, or in one of gzip, "
            "deflate, br or zstd.")
    transfer = ",".join(request.headers.getall("Transfer-Encoding", ())).strip().lower()
    if transfer not in ("", "chunked"):
        raise UnsupportedTransferCoding(
            "Unsupported Transfer-Encoding; send the body with a Content-Length, or "
            "`Transfer-Encoding: chunked` alone.")
    if request.content_length is not None and request.content_length > limit:
        raise _too_large(limit)
    body = await _read(request, limit, request.app[STATE].settings.server.body_timeout_s,
                       owner)
    return decode_json_object(body), len(body)


async def _received(request: web.Request, limit: int, owner: str) -> bytes:
    """The body as it came, its bytes counted in the budget as they arrive (given back
    once it is all here); 413 past `limit`, 503 past the budget."""
    bodies = request.app[STATE].bodies
    if request.content.is_eof():  # a small body comes with the headers: held already
        body = await request.content.read()
        if len(body) > limit:
            raise _too_large(limit)
        return body
    held = bytearray()
    try:
        while piece := await request.content.readany():
            if len(held) + len(piece) > limit:
                raise _too_large(limit)
            if not bodies.take(owner, len(piece)):
                raise Unavailable("Too many request bodies are being received at once; "
                                  "retry shortly.", code="overloaded")
            held += piece
    finally:
        bodies.give(owner, len(held))
    return bytes(held)


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"The request body is larger than the limit of {limit} bytes.")


async def _read(request: web.Request, limit: int, timeout: float, owner: str) -> bytes:
    coding = ",".join(request.headers.getall("Content-Encoding", ())).strip().lower()
    try:
        async with asyncio.timeout(timeout):
            body = await _received(request, limit, owner)
    except TimeoutError:
        raise RequestTimeout(
            f"The request body did not arrive within {timeout:g} s.") from None
    except web.RequestPayloadError:  # a broken body (chunking), or its coding refused it
        raise _undecodable(coding) from None
    # (aiohttp counts what it decoded: where it did not, the body is as it came)
    if coding not in ("", "identity") and request.content.total_compressed_bytes is None:
        try:
            body = decode(body, coding, limit)
        except TooLarge:
            raise _too_large(limit) from None
        except Undecodable:
            raise _undecodable(coding) from None
    return body


def _undecodable(coding: str) -> InvalidRequest:
    return InvalidRequest(
        "The request body is malformed." if coding in ("", "identity") else
        f"The request body could not be decoded as its Content-Encoding ({shown(coding)}) says.",
        code="invalid_body")
