"""Answers given below the middlewares, on the connection itself, all OpenAI-shaped:
the guard's whole answers written on the transport (a connection refused at the cap, a
request head past its bound), and aiohttp's own answers to what its parser refuses,
which would otherwise quote the request (an `Authorization` key included)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from aiohttp import HttpVersion11, http_parser, web
from aiohttp.http_exceptions import (
    BadHttpMessage,
    BadHttpMethod,
    BadStatusLine,
    HttpProcessingError,
    PayloadEncodingError,
)
from aiohttp.http_parser import HttpRequestParserPy

from .app_state import REQUEST_ID
from .errors import (
    MethodNotImplemented,
    ServerError,
    VersionNotSupported,
    WeirError,
    retry_headers,
)
from .ids import new_hex
from .settings import HTTP_TOKEN


def _answer(status: str, message: str, type_: str, code: str, extra: str = "") -> bytes:
    """A whole answer written on the transport, before (or instead of) aiohttp's."""
    body = json.dumps({"error": {"message": message, "type": type_, "param": None,
                                 "code": code}}).encode()
    head = (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n")
    return head.encode() + body


#: The headers `server.cors` gives an answer written below the app (`Cors.wire_grant`).
Grant = Sequence[tuple[str, str]]


def header_lines(headers: Grant) -> str:
    return "".join(f"{name}: {value}\r\n" for name, value in headers)


def _retry_lines(wait_ms: float) -> str:
    """`Retry-After` and `retry-after-ms` as `errors.retry_headers` forms them."""
    return header_lines(tuple(retry_headers(wait_ms).items()))


def refusal(grant: Grant = ()) -> bytes:
    """The 503 of a connection refused at the cap (`grant`: `server.cors`'s headers)."""
    return _answer("503 Service Unavailable",
                   "The server has too many open connections; retry shortly.",
                   "server_error", "too_many_connections",
                   _retry_lines(1000) + header_lines(grant))


def heads_full(request_id: str, grant: Grant = ()) -> bytes:
    """The 503 of a head growing past the bound on all heads arriving, carrying the id
    its access-log line names (`x-request-id`, as `head_too_large`)."""
    return _answer("503 Service Unavailable",
                   "The server is receiving too many request heads at once; retry shortly.",
                   "server_error", "overloaded",
                   _retry_lines(1000) + f"x-request-id: {request_id}\r\n"
                   + header_lines(grant))


def head_too_large(request_id: str, grant: Grant = ()) -> bytes:
    """The 431 of a request head past its bound, carrying the id its access-log line
    names (`x-request-id`, as every other answer does)."""
    return _answer("431 Request Header Fields Too Large",
                   "The request head (its request line and header fields) is too large.",
                   "invalid_request_error", "request_header_fields_too_large",
                   f"x-request-id: {request_id}\r\n" + header_lines(grant))


def answer_in_http_1_1(request: web.BaseRequest) -> None:
    """Have the answer's status line say HTTP/1.1: aiohttp writes it in the request's
    version (a cached property), which is 1.0 for a request its parser refused (whatever
    its line said) and whatever the line said for one in another version. aiohttp has
    no public way to choose it: its private fields are set, held by
    tests/unit/test_wire_errors.py to the status line aiohttp writes; should they go,
    the answer keeps the request's version, rather than being lost to the error."""
    try:
        request._version = HttpVersion11
        request._cache.pop("version", None)
    except AttributeError:
        pass


def _body_fault(exc: BaseException | None) -> bool:
    """Whether aiohttp's parser refused the body rather than the head: a payload error of
    its Python parser, or (its C parser, llhttp, raises a plain `BadHttpMessage` there)
    one whose reason (before the quote of the bytes at fault, which may be a header line
    naming `chunked`) says a chunk is at fault."""
    return isinstance(exc, PayloadEncodingError) or (
        isinstance(exc, BadHttpMessage) and "chunk" in str(exc.message).split(":")[0].lower())


#: aiohttp's C parser (llhttp); None where it has none (`AIOHTTP_NO_EXTENSIONS`).
_PARSER_C = getattr(http_parser, "HttpRequestParserC", None)


class OpenAIErrors(web.RequestHandler):
    """aiohttp's protocol, whose own error answers (a malformed request head, before any
    middleware runs) are OpenAI-shaped and never echo the request: aiohttp's quote the
    offending line, an `Authorization` key included. A body its parser refuses as it
    arrives with its head (a malformed chunk; a deflate stream cut short, where aiohttp
    decodes the body) is said to be the body's fault (`invalid_body`), as the route
    says it of one that comes later. `on_refused(status, code, request_id)`: told of
    each request its parser refused (the access log's line), with the id its answer
    carries (`x-request-id`, made here: no middleware gave it one)."""

    __slots__ = ("on_refused", "wire_grant")

    def __init__(self, *args: Any,
                 on_refused: Callable[[int, str | None, str], None] | None = None,
                 wire_grant: Callable[[Any], Grant] | None = None,
                 **kw: Any) -> None:
        """`wire_grant(transport)`: `server.cors`'s headers for an answer to what the
        parser refused on that connection (`ConnectionGuard.wire_grant`)."""
        super().__init__(*args, **kw)
        self.on_refused = on_refused
        self.wire_grant = wire_grant
        if type(self._parser) is HttpRequestParserPy:  # (AIOHTTP_NO_EXTENSIONS, no C)
            self._parser.__class__ = _LlhttpMethods
        elif type(self._parser) is _PARSER_C:  # (llhttp, as `weir serve` runs)
            self._parser = _HttpOnly(self._parser)  # type: ignore[assignment]

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        self.log_exception("Error handling request", exc_info=exc)  # scrubbed: telemetry
        if request.writer.output_size > 0:
            raise ConnectionError("the response had started; no error answer is possible")
        err: WeirError
        if _unknown_method(exc):
            err = MethodNotImplemented("The request method is not implemented by this server.")
            status = err.status
        elif _unsupported_version(exc):
            err = VersionNotSupported(
                "Unsupported HTTP version in the request line; send HTTP/1.1.")
            status = err.status
        else:
            err = (ServerError() if status >= 500 else
                   WeirError("The request body is malformed (its chunked framing or its "
                             "Content-Encoding could not be decoded).", code="invalid_body")
                   if _body_fault(exc) else
                   WeirError("The HTTP request could not be parsed (its request line or a "
                             "header is malformed or too long).", code="invalid_http_request"))
            err.type = "invalid_request_error" if status < 500 else "server_error"
        err.status = status
        # (a handler's error past the middlewares has the id they gave it)
        rid = _given_id(request) or new_hex()
        resp = web.json_response(err.to_body(), status=status,
                                 headers={**err.headers, "x-request-id": rid})
        if isinstance(exc, HttpProcessingError) and self.wire_grant is not None:
            # (no middleware, no `on_response_prepare` hook runs for it: `server.cors`'s
            # headers are given here, by the Origin line of the head as it came)
            for name, value in self.wire_grant(self.transport):
                resp.headers.add(name, value)
        resp.force_close()
        answer_in_http_1_1(request)
        if isinstance(exc, HttpProcessingError) and self.on_refused is not None:
            self.on_refused(status, err.code, rid)  # (a handler's error was logged by its own)
        return resp


def _unknown_method(exc: BaseException | None) -> bool:
    """Whether aiohttp's parser refused the request line for its method alone, a token
    (`FOO`, `get`, RTSP's `DESCRIBE`) that is none of `PARSED_METHODS`: RFC 9110 9.1
    answers that 501, not the 400 of a malformed line. (A method that is no token,
    `G@T`, or TLS sent to this plain port, stays a 400.) Its C parser (llhttp) says so
    in its reason and its quote of the request line, held by
    tests/integration/test_hostile_connections.py; its Python parser, made to read the
    same methods (`_LlhttpMethods`), by the error's type."""
    if isinstance(exc, UnknownMethod):
        return True
    if not isinstance(exc, BadStatusLine):
        return False
    message = str(exc.message)
    if not isinstance(exc, BadHttpMethod) and _RTSP_METHOD not in message:
        return False
    quoted = _QUOTED_LINE.search(message)  # llhttp's quote of the request line
    return quoted is not None and HTTP_TOKEN.fullmatch(quoted.group(1)) is not None


def _unsupported_version(exc: BaseException | None) -> bool:
    """Whether aiohttp's C parser (llhttp) refused the request line for its version
    alone, one of HTTP's syntax (`HTTP/1.2`, `HTTP/3.0`) but not 1.0, 1.1, 2.0 or 0.9
    (which it reads, for `http_version_middleware`'s 505): the same 505 as those, and as
    its Python parser (which reads any) gives. (`HTTP/1.10`, `http/1.1` stay a 400.)"""
    return (isinstance(exc, BadStatusLine) and _BAD_VERSION in str(exc.message)
            and _QUOTED_VERSION.search(str(exc.message)) is not None)


#: What llhttp says of a request line's version it does not read, and its quote of the
#: line ending in a version of HTTP's syntax.
_BAD_VERSION = "Invalid HTTP version"
_QUOTED_VERSION = re.compile(r"""b['"][^ '"]+ +[^ '"]+ +HTTP/[0-9]\.[0-9]['"]\n""")

#: What llhttp says of a method it knows of another protocol (RTSP's) in an HTTP line.
_RTSP_METHOD = "Invalid method for HTTP/x.x request"

#: The methods aiohttp's C parser (llhttp's HTTP methods) reads in a request line, case
#: and all; it refuses any other (`get` included): a 501 for a token (`_unknown_method`),
#: and a 400 for `PRI` (HTTP/2's preface, which it expects to go on as one).
PARSED_METHODS = frozenset({
    "DELETE", "GET", "HEAD", "POST", "PUT", "CONNECT", "OPTIONS", "TRACE", "COPY", "LOCK",
    "MKCOL", "MOVE", "PROPFIND", "PROPPATCH", "SEARCH", "UNLOCK", "BIND", "REBIND",
    "UNBIND", "ACL", "REPORT", "MKACTIVITY", "CHECKOUT", "MERGE", "M-SEARCH", "NOTIFY",
    "SUBSCRIBE", "UNSUBSCRIBE", "PATCH", "PURGE", "MKCALENDAR", "LINK", "UNLINK",
    "SOURCE", "QUERY"})


class UnknownMethod(BadHttpMethod):
    """A request line's method is a token but none of `PARSED_METHODS`."""


class _LlhttpMethods(HttpRequestParserPy):
    """aiohttp's Python parser reading the methods its C parser reads: it took any token
    (and upper-cased it: `get` was served as GET), so under `AIOHTTP_NO_EXTENSIONS` the
    `FOO` that is a 501 in C was routed (a 405 or a 404). HTTP/0.9's line (`GET /`, no
    version) it refused as a bad method: it reads it as llhttp does, as version 0.9 (a
    505). Any other line it reads as it did (a method that is no token is its own 400)."""

    def parse_message(self, lines: list[bytes]) -> Any:
        if not lines[0].isascii():  # (a byte past ASCII in its target: llhttp's 400;
            # this parser routed it, a 404 quoting it)
            raise BadStatusLine(error="Invalid request line")  # (quoting nothing)
        method, space, target = lines[0].partition(b" ")
        name = method.decode("latin-1")
        if space and target and b" " not in target and name in PARSED_METHODS:
            # HTTP/0.9's line (no version): llhttp reads it as 0.9, a 505 (this parser
            # refused it as a bad method, a 400)
            lines = [lines[0] + b" HTTP/0.9", *lines[1:]]
        if space and name not in PARSED_METHODS and HTTP_TOKEN.fullmatch(name):
            if method == b"PRI":
                raise BadStatusLine(error="Expected HTTP/2 Connection Preface")
            raise UnknownMethod(error="Unknown method")  # (quoting nothing of the line)
        message = super().parse_message(lines)
        # `chunked` named twice (RFC 9112 6.1: never applied more than once): llhttp
        # refuses the head, a 400; this parser framed the body as chunked and went on
        transfer = ",".join(message.headers.getall("Transfer-Encoding", ())).lower()
        if [c.strip() for c in transfer.split(",")].count("chunked") > 1:
            raise BadHttpMessage("Transfer-Encoding: chunked more than once")  # (a head fault)
        # a length past 64 bits: llhttp's overflow, a 400 (this parser's int took it: the
        # route's 413)
        length = message.headers.get("Content-Length", "")
        if len(length) >= 20 and int(length) >= 2**64:
            raise BadHttpMessage("Content-Length: too large a number")
        return message


#: How many of the bytes last fed `_HttpOnly` keeps (a request line is 8,190 at most,
#: aiohttp's bound), to find a request line that came in pieces.
_KEPT = 16384

#: How many pieces `_HttpOnly` keeps before joining them into one (a client sending its
#: head a byte at a time would otherwise have it kept as thousands of objects).
_PIECES = 32


class _HttpOnly:
    """aiohttp's C parser (llhttp), refusing a request line that is no HTTP/1.x line of
    RFC 9112's grammar: llhttp reads RTSP's (`GET /v1/models RTSP/1.0`) and Icecast's
    (`ICE/1.0`) as HTTP (1.0, or 1.1 for `RTSP/1.1`), and a line whose spaces are doubled
    (`GET  /  HTTP/1.1`) as the line with single ones, and says nothing of it in what it
    parsed, so such a line was served (aiohttp's Python parser refuses each). Only the lines of the
    requests it parsed are looked for, by their method and target (`GET /v1/models
    HTTP/`), among the bytes of this piece and the last ones kept, and only where that
    request's HTTP line is not there: no body is scanned (a chunk of a JSON body ending
    in `GET / RTSP/1.0` is no request line). A request whose line is where it should be
    costs one comparison, in place, and the pieces fed are kept by reference (no copy;
    a large read's tail alone, and past `_PIECES` small ones their last `_KEPT` bytes,
    joined: at most three times `_KEPT` held) until a line must be looked for across
    them. Refused as aiohttp's Python parser
    refuses it: a 400, or the 501 of a method none of `PARSED_METHODS`. A line not
    found at all (split past `_KEPT`) is served as llhttp read it."""

    __slots__ = ("_kept", "_parser", "_size", "_start")

    def __init__(self, parser: Any) -> None:
        self._parser = parser
        # the last pieces fed (`_KEPT` to three times that bytes, from `_start` in the first),
        # since the last request line found
        self._kept: list[bytes] = []
        self._start = 0
        self._size = 0

    def feed_data(self, data: bytes) -> Any:
        parsed = self._parser.feed_data(data)
        messages = parsed[0]  # (the heads that ended here)
        if not messages:
            self._keep(data)
            return parsed
        pos = 0  # (each request's line comes after the one before: searched from there)
        first = True
        for message, _ in messages:
            line = f"{message.method} {message.path} HTTP/".encode("utf-8", "surrogateescape")
            if data.startswith(line, pos):  # (where it is, most often: no search)
                pos += len(line)
            elif (at := data.find(line, pos)) >= 0:
                pos = at + len(line)
            else:
                self._check_line(message.method, line[:-5], data, pos, first)
            first = False
        if len(data) - pos > _KEPT:
            pos = len(data) - _KEPT
        self._kept, self._start, self._size = [data], pos, len(data) - pos
        if len(data) > 2 * _KEPT:  # (a large read is not held whole: its tail, copied)
            self._kept, self._start = [data[pos:]], 0
        return parsed

    def _keep(self, data: bytes) -> None:
        """`data` kept after the pieces before it, of which the last `_KEPT` bytes (or
        more, up to a few times that) are held: a large piece's tail alone, copied; the
        pieces, past `_PIECES`, joined into their last `_KEPT` bytes."""
        if len(data) >= _KEPT:  # (nothing before it is looked for again)
            tail = data if len(data) <= 2 * _KEPT else data[-_KEPT:]
            self._kept, self._start, self._size = [tail], 0, len(tail)
            return
        kept = self._kept
        kept.append(data)
        self._size += len(data)
        while len(kept) > 1 and self._size - (len(kept[0]) - self._start) >= _KEPT:
            self._size -= len(kept[0]) - self._start
            del kept[0]
            self._start = 0
        if len(kept) > _PIECES:
            tail = b"".join(kept)[self._start:][-_KEPT:]
            self._kept, self._start, self._size = [tail], 0, len(tail)

    def _check_line(self, method: str, line: bytes, data: bytes, pos: int,
                    first: bool) -> None:
        """The request's own HTTP line is not at `pos` or past it in `data`: the first
        request's may have begun in the bytes kept (its line split across). Otherwise its
        line in another protocol, or with its spaces doubled, is refused."""
        joint = b""
        if first:
            kept = b"".join(self._kept)[self._start:]
            joint = kept[-_KEPT:] + data[:_KEPT]
            if line + b"HTTP/" in joint:
                return
        name, target = line[:len(method)], line[len(method) + 1:-1]
        other = re.compile(re.escape(name) + b" +" + re.escape(target)
                           + b" +(?:HTTP|RTSP|ICE)/")
        if other.search(data, pos) is None and other.search(joint) is None:
            return
        if method not in PARSED_METHODS:
            raise UnknownMethod(error="Unknown method")  # (quoting nothing)
        raise BadStatusLine(error="Expected HTTP/")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._parser, name)


#: The method in llhttp's quote of the request line (`b'FOO /v1/models HTTP/1.1'`, a
#: byte string's repr: a byte outside printable ASCII is an escape, `\x01`, no token),
#: before its space (a line of one word, `FOO`, is no request line: a 400).
_QUOTED_LINE = re.compile(r"""b['"]([^ '"]*) """)


def _given_id(request: Any) -> str | None:
    """The request id the middlewares gave `request`, if they ran (None for a request
    its parser refused)."""
    try:
        rid = request.get(REQUEST_ID)
    except (AttributeError, TypeError):
        return None
    return rid if isinstance(rid, str) else None
