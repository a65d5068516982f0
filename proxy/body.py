"""Reading a request body: content type, charset and coding, the one size limit, a time limit,
then JSON.

A body may come compressed (`Content-Encoding`: gzip, deflate, br or zstd; the size
limit counts the decoded bytes; two, one over another, are decoded in turn, the last
first); any other coding, or more than two, is a 415, and a body its
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
import codecs
import encodings.aliases
import functools
import pkgutil
import re
from typing import Any

from aiohttp import web
from aiohttp.helpers import parse_mimetype

from .app_state import STATE
from .codings import MAX_CODINGS, TooLarge, Undecodable, decode_all
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

#: The charsets a JSON body is read in as it is (none, or UTF-8 or its subset ASCII).
#: JSON is UTF-8 (RFC 8259 8.1); a body is never transcoded from another charset, as the
#: text read so is not what a UTF-8 reader in front of Weir (a WAF, a logging proxy) saw.
_UTF8 = frozenset({"", "utf-8", "utf8", "us-ascii", "ascii"})


def _label(charset: str) -> str:
    """A charset's name as Python's codec registry normalises it (`ISO-8859-1`:
    `iso_8859_1`; `windows-874`, which it has no alias for, `cp874`)."""
    label = "_".join(re.findall(r"[a-z0-9.]+", charset.lower()))
    windows = re.fullmatch(r"(?:windows|x_cp)_?(\d+)", label)
    return f"cp{windows[1]}" if windows else label


#: The charsets Python knows (`_label`s of its codecs' modules and their aliases): any
#: other is refused without asking its codec registry.
_KNOWN = frozenset(_label(n) for n in (
    *encodings.aliases.aliases, *encodings.aliases.aliases.values(),
    *(m.name for m in pkgutil.iter_modules(encodings.__path__))))

#: The codec families that may read ASCII as ASCII (checked byte by byte: `_over_ascii`).
_FAMILIES = re.compile(
    r"(ascii|utf_8|latin_1|iso8859_\d+|cp\d+|koi8_\w+|mac_\w+|kz1048|ptcp154|tis_620|"
    r"hp_roman8|euc_\w+|gb2312|gbk|gb18030|big5|big5hkscs|shift_jis\w*|johab)")


@functools.cache  # (of `_KNOWN` labels alone: a few hundred at most)
def _over_ascii(label: str) -> bool:
    """Whether a charset reads every ASCII byte as that ASCII character and nothing else:
    the single-byte ones over ASCII (ISO-8859-*, windows-*, KOI8, Mac, DOS code pages)
    and the CJK multi-byte ones. A body all of whose bytes are ASCII is the same text in
    any of them as in UTF-8, so it is read whatever such a charset its Content-Type
    declares (some HTTP clients declare ISO-8859-1 by default for ASCII JSON; OpenAI and
    vLLM ignore the charset). UTF-16/32 (not over ASCII), EBCDIC (`cp037`: other
    letters), and UTF-7, HZ, ISO-2022-* and the escape codecs (other text in ASCII
    bytes: UTF-7's `+ADw-` is `<`) are none of them, nor is a charset Python does not
    know: a body declared in one is always refused."""
    try:
        name = codecs.lookup(label).name
        return (_FAMILIES.fullmatch(_label(name)) is not None
                and all(bytes([b]).decode(name) == chr(b) for b in range(128)))
    except (LookupError, UnicodeDecodeError):
        return False


@functools.cache  # (of `_KNOWN` labels alone, as `_over_ascii`)
def _utf8_label(label: str) -> bool:
    try:
        return codecs.lookup(label).name == "utf-8"
    except LookupError:
        return False


def _is_utf8(charset: str) -> bool:
    """Whether a charset is UTF-8 (or ASCII, its subset) by any name Python's codecs know
    it by: `utf-8`, `utf8`, `u8`, `cp65001` (Windows' name, which .NET and PowerShell
    clients send), each read as UTF-8 whatever its bytes. (`utf-8-sig` is another codec:
    a body with a BOM.) A name Python does not know is no UTF-8."""
    if charset.strip().lower().replace("_", "-") in _UTF8:
        return True
    label = _label(charset)
    return label in _KNOWN and _utf8_label(label)


#: The codings `proxy.codings` decodes (aiohttp's, one at a time).
_CODINGS = frozenset({"gzip", "deflate", "br", "zstd"})

#: Old names a recipient should take as the coding they name (RFC 9110 8.4.1.3:
#: `x-gzip` is gzip; `x-compress` would be compress, which is not decoded here).
_ALIASES = {"x-gzip": "gzip"}


def _codings(request: web.Request) -> list[str]:
    """The body's codings, in the order applied (`Content-Encoding: gzip, br`; several
    header lines are one list: aiohttp would decode by the last one alone), lower-cased;
    `identity` (no coding) and empty list elements are none; `x-gzip` is `gzip`."""
    joined = ",".join(request.headers.getall("Content-Encoding", ())).lower()
    return [_ALIASES.get(c, c) for c in (part.strip() for part in joined.split(","))
            if c not in ("", "identity")]


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
    # (Each `charset` given: aiohttp reads one of several, a reader in front another.)
    declared = _charsets(request)
    others = [c for c in declared if not _is_utf8(c)]
    ascii_only = bool(others)  # (read only where its bytes are ASCII)
    for charset in others:
        if not ((label := _label(charset)) in _KNOWN and _over_ascii(label)):
            raise _charset_refused(charset, ambiguous=False)
    codings = _codings(request)
    if any(c not in _CODINGS for c in codings):
        raise UnsupportedMediaType(
            "Unsupported Content-Encoding; send the body as is, or in one of gzip, "
            "deflate, br or zstd.")
    if len(codings) > MAX_CODINGS:
        raise UnsupportedMediaType(
            f"Unsupported Content-Encoding: a body in {len(codings)} codings, one over "
            f"another; send it in at most {MAX_CODINGS}.")
    transfer = ",".join(request.headers.getall("Transfer-Encoding", ())).strip().lower()
    if transfer not in ("", "chunked"):
        raise UnsupportedTransferCoding(
            "Unsupported Transfer-Encoding; send the body with a Content-Length, or "
            "`Transfer-Encoding: chunked` alone.")
    if request.content_length is not None and request.content_length > limit:
        raise _too_large(limit)
    body = await _read(request, limit, request.app[STATE].settings.server.body_timeout_s,
                       owner, codings)
    if ascii_only and not body.isascii():
        raise _charset_refused(others[0], ambiguous=True)
    return decode_json_object(body), len(body)


def _charsets(request: web.Request) -> list[str]:
    """Every `charset` the Content-Type gives (one, mostly; none: `[]`), aiohttp's reading
    first."""
    found = [request.charset] if request.charset else []
    header = request.headers.get("Content-Type", "")
    if header.lower().count("charset") > 1 or not found:
        found += parse_mimetype(header).parameters.getall("charset", [])
    return found


def _charset_refused(charset: str, ambiguous: bool) -> InvalidRequest:
    """A body declared in a charset other than UTF-8 that Weir cannot read as UTF-8
    without reading other text than that charset says: one that is not ASCII's superset
    (always), or one that is, with bytes outside ASCII (`ambiguous`: the same bytes are
    other characters in it and in UTF-8)."""
    why = (f"A body declared `charset={shown(charset)}` with bytes outside ASCII is "
           "ambiguous" if ambiguous else f"Unsupported charset `{shown(charset)}` in "
           "Content-Type")
    return InvalidRequest(
        f"{why}: a JSON body is UTF-8 (RFC 8259); send it in UTF-8, as `application/json` "
        "or `application/json; charset=utf-8`.",
        code="invalid_content_type",
    )


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


async def _read(request: web.Request, limit: int, timeout: float, owner: str,
                codings: list[str]) -> bytes:
    coding = ", ".join(codings)
    try:
        if request.content.is_eof():  # all here (a small body comes with the headers):
            body = await _received(request, limit, owner)  # nothing to wait for, no timer
        else:
            async with asyncio.timeout(timeout):
                body = await _received(request, limit, owner)
    except TimeoutError:
        raise RequestTimeout(
            f"The request body did not arrive within {timeout:g} s.") from None
    except web.RequestPayloadError:  # a broken body (chunking), or its coding refused it
        raise _undecodable(coding) from None
    # (aiohttp counts what it decoded: where it did not, the body is as it came)
    if codings and request.content.total_compressed_bytes is None:
        try:
            body = decode_all(body, codings, limit)
        except TooLarge:
            raise _too_large(limit) from None
        except Undecodable:
            raise _undecodable(coding) from None
    return body


def _undecodable(coding: str) -> InvalidRequest:
    return InvalidRequest(
        "The request body is malformed." if not coding else
        f"The request body could not be decoded as its Content-Encoding ({shown(coding)}) says.",
        code="invalid_body")
