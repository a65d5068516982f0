"""Answers given below the middlewares, on the connection itself, all OpenAI-shaped:
the guard's whole answers written on the transport (a connection refused at the cap, a
request head past its bound), and aiohttp's own answers to what its parser refuses,
which would otherwise quote the request (an `Authorization` key included)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from aiohttp import HttpVersion11, web
from aiohttp.http_exceptions import (
    BadHttpMessage,
    BadHttpMethod,
    HttpProcessingError,
    PayloadEncodingError,
)

from .app_state import REQUEST_ID
from .errors import MethodNotImplemented, ServerError, WeirError
from .ids import new_hex
from .settings import HTTP_TOKEN


def _answer(status: str, message: str, type_: str, code: str, extra: str = "") -> bytes:
    """A whole answer written on the transport, before (or instead of) aiohttp's."""
    body = json.dumps({"error": {"message": message, "type": type_, "param": None,
                                 "code": code}}).encode()
    head = (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n")
    return head.encode() + body


REFUSAL = _answer("503 Service Unavailable",
                  "The server has too many open connections; retry shortly.",
                  "server_error", "too_many_connections", "Retry-After: 1\r\n")


def heads_full(request_id: str) -> bytes:
    """The 503 of a head growing past the bound on all heads arriving, carrying the id
    its access-log line names (`x-request-id`, as `head_too_large`)."""
    return _answer("503 Service Unavailable",
                   "The server is receiving too many request heads at once; retry shortly.",
                   "server_error", "overloaded",
                   f"Retry-After: 1\r\nx-request-id: {request_id}\r\n")


def head_too_large(request_id: str) -> bytes:
    """The 431 of a request head past its bound, carrying the id its access-log line
    names (`x-request-id`, as every other answer does)."""
    return _answer("431 Request Header Fields Too Large",
                   "The request head (its request line and header fields) is too large.",
                   "invalid_request_error", "request_header_fields_too_large",
                   f"x-request-id: {request_id}\r\n")


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


class OpenAIErrors(web.RequestHandler):
    """aiohttp's protocol, whose own error answers (a malformed request head, before any
    middleware runs) are OpenAI-shaped and never echo the request: aiohttp's quote the
    offending line, an `Authorization` key included. A body its parser refuses as it
    arrives with its head (a malformed chunk; a deflate stream cut short, where aiohttp
    decodes the body) is said to be the body's fault (`invalid_body`), as the route
    says it of one that comes later. `on_refused(status, code, request_id)`: told of
    each request its parser refused (the access log's line), with the id its answer
    carries (`x-request-id`, made here: no middleware gave it one)."""

    __slots__ = ("on_refused",)

    def __init__(self, *args: Any,
                 on_refused: Callable[[int, str | None, str], None] | None = None,
                 **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.on_refused = on_refused

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        self.log_exception("Error handling request", exc_info=exc)  # scrubbed: telemetry
        if request.writer.output_size > 0:
            raise ConnectionError("the response had started; no error answer is possible")
        err: WeirError
        if _unknown_method(exc):
            err = MethodNotImplemented("The request method is not implemented by this server.")
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
        resp.force_close()
        answer_in_http_1_1(request)
        if isinstance(exc, HttpProcessingError) and self.on_refused is not None:
            self.on_refused(status, err.code, rid)  # (a handler's error was logged by its own)
        return resp


def _unknown_method(exc: BaseException | None) -> bool:
    """Whether aiohttp's parser refused the request line for its method alone, a token
    (`FOO`) its C parser (llhttp) knows no method of: RFC 9110 9.1 answers that 501, not
    the 400 of a malformed line. (A method that is no token, `G@T`, or TLS sent to this
    plain port, stays a 400; aiohttp's Python parser takes any token: routed, a 405.)"""
    if not isinstance(exc, BadHttpMethod):
        return False
    quoted = _QUOTED_LINE.search(str(exc.message))  # llhttp's quote of the request line
    return quoted is not None and HTTP_TOKEN.fullmatch(quoted.group(1)) is not None


#: The method in llhttp's quote of the request line (`b'FOO /v1/models HTTP/1.1'`, a
#: byte string's repr: a byte outside printable ASCII is an escape, `\x01`, no token).
_QUOTED_LINE = re.compile(r"""b['"]([^ '"]*)[ '"]""")


def _given_id(request: Any) -> str | None:
    """The request id the middlewares gave `request`, if they ran (None for a request
    its parser refused)."""
    try:
        rid = request.get(REQUEST_ID)
    except (AttributeError, TypeError):
        return None
    return rid if isinstance(rid, str) else None
