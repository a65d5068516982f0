"""aiohttp middlewares: HTTP-level work only, outermost first.

1. `request_id`: honours a sane `x-request-id` or makes one; binds it to the log
   context; echoes it on the response.
2. `access_log`: one structured line per request and the request metrics. It reads
   what the route left in `request["weir"]` (tenant, model, cache result, tokens, TTFT)
   and never logs headers, keys or prompt text.
3. `tracing`: the OpenTelemetry server span (parent: the caller's `traceparent`).
4. `errors`: the outermost handler of exceptions: WeirError -> its OpenAI body and
   status; aiohttp's HTTP exceptions (404, 405, 413) -> OpenAI bodies; anything else ->
   a generic 500 whose details go to the log only.
5. `cors` (`proxy.cors`, only where `server.cors` lists origins): answers a browser's
   preflight; its `on_response_prepare` hook marks every answer to an allowed origin.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

import structlog
from aiohttp import HttpVersion10, HttpVersion11, web
from aiohttp.typedefs import Handler
from opentelemetry import context as otel_context
from opentelemetry.trace import SpanKind, Status, StatusCode

from .app_state import INFO, REQUEST_ID, RESPONSE_HEADERS, STATE
from .errors import (
    ExpectationFailed,
    MethodNotAllowed,
    MethodNotImplemented,
    NotFound,
    PayloadTooLarge,
    RequestTimeout,
    ServerError,
    VersionNotSupported,
    WeirError,
    shown,
)
from .ids import new_hex
from .streaming import (
    ANSWERED,
    ERROR_CODE,
    STREAM_ERROR,
    WRITE_TIMED_OUT,
    cut_by_shutdown,
    note_error,
)
from .telemetry import Metrics, error_fields, get_logger, labelled
from .tracing import extract, tracer, tracing_enabled
from .wire_errors import PARSED_METHODS, answer_in_http_1_1

log = get_logger("weir.http")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


def error_response(err: WeirError, request_id: str | None = None,
                   carried: dict[str, str] | None = None) -> web.Response:
    """`carried`: the request's response headers so far (the error's own win)."""
    headers = {**carried, **err.headers} if carried else dict(err.headers)
    if request_id:
        headers["x-request-id"] = request_id
    return web.json_response(err.to_body(), status=err.status, headers=headers)


async def expect_continue(request: web.Request) -> web.StreamResponse | None:
    """aiohttp's `Expect` handling, with an OpenAI-shaped 417 for what it cannot meet
    (aiohttp's own is plain text): `100-continue` asks the client for its body, once its
    key is known good (every route a body goes to needs one: a request without a valid
    key gets its 401 without being invited to upload) and the body's announced size is
    within the limit; any other expectation ends the connection (its body, if it sends
    one, is not read)."""
    expect = request.headers.get("Expect", "")
    if request.version != HttpVersion11:
        return None
    state = request.app.get(STATE)
    err: WeirError
    if expect.lower() == "100-continue":
        limit = state.settings.server.max_body_bytes if state is not None else None
        refusal = _before_the_body(request)
        if refusal is not None:
            err = refusal
        elif limit is None or request.content_length is None or request.content_length <= limit:
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            request.writer.output_size = 0  # (the answer's size counts from here)
            return None
        else:  # A body over the limit is refused before the client sends it.
            err = PayloadTooLarge(
                f"The request body is larger than the limit of {limit} bytes.")
    else:
        err = ExpectationFailed(
            "Unsupported `Expect` header: only `100-continue` is supported.", param="Expect")
    # Answered before the middlewares run: the request id and the access-log line are
    # given here, as `request_id_middleware` and `access_log` give them.
    rid = _request_id(request)
    resp = _refusal(request, err, rid)
    resp.force_close()
    route = route_label(request)
    if state is not None and route is not None:  # counted as the route counts its refusals
        labelled(state.metrics.requests, route, "", str(resp.status)).inc()
        labelled(state.metrics.latency, route, "", str(resp.status)).observe(0.0)
    if state is None or state.settings.logging.access_log:
        log_request(request, resp.status, 0.0, request_id=rid, error=request[ERROR_CODE])
    return resp


def _before_the_body(request: web.Request) -> WeirError | None:
    """Why a request that would send a body (any method but GET, HEAD and OPTIONS: every
    such route needs a key) is refused before it does: its key is missing or wrong."""
    state = request.app.get(STATE)
    if state is None or request.method in ("GET", "HEAD", "OPTIONS"):
        return None
    try:
        state.auth.authenticate(request.headers)
    except WeirError as e:  # a 401, or a 400 for a malformed caller header
        return e
    return None


#: The generation routes (their POSTs), by path, under their own label in
#: `weir_requests_total` (each sets it as it opens, `routes.open_generation`).
_COUNTED = {"/v1/chat/completions": "chat", "/v1/completions": "completion",
            "/v1/embeddings": "embeddings", "/v1/responses": "responses"}

#: Methods a route's label names as sent; any other is `OTHER` (a method is the client's
#: token, and a `*` route takes every one).
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def route_label(request: web.Request) -> str | None:
    """A request's `route` in `weir_requests_total`: a generation route's own name, else
    the method and the route's template (`GET /v1/responses/{response_id}`, never the
    path sent: ids are the client's), `unmatched` for every path no route serves; None
    for probes, scrapes and the dashboard, no API traffic. Bounded by the routes."""
    resource = route_resource(request)
    if not isinstance(resource, web.AbstractResource):
        # (by the route matched, not the path: `/v1/chat%2Fcompletions` decodes to the
        # chat route's path, which serves no such request; `/healthz` is no probe)
        return "unmatched"
    if resource.canonical in _UNTRACED:
        return None
    if request.method == "POST" and resource.canonical in _COUNTED:
        return _COUNTED[resource.canonical]
    method = request.method if request.method in _METHODS else "OTHER"
    return f"{method} {resource.canonical}"


def _request_id(request: web.Request) -> str:
    """The caller's `x-request-id` where it is sane, does not look like a key and is not
    one of the configured keys (it is written on every log line of the request; a key
    made with `openssl rand -hex 32` has no vendor's shape), else a new one."""
    rid = request.headers.get("x-request-id", "")
    if not _REQUEST_ID.match(rid) or _KEY_LIKE.match(rid) or _KEY_INSIDE.search(rid):
        return new_hex()
    state = request.app.get(STATE)
    return new_hex() if state is not None and _holds_key(rid, state.auth.is_key) else rid


def _holds_key(rid: str, is_key: Callable[[str], bool]) -> bool:
    """Whether `rid` is a configured key, or holds one behind a prefix or before a suffix
    set off by a separator (`x.KEY`, `req-KEY`, `KEY:7`): a hash per separator."""
    if is_key(rid):
        return True
    for m in _SEPARATOR.finditer(rid):
        if is_key(rid[m.end():]) or is_key(rid[:m.start()]):
            return True
    return False


#: A vendor key's shape (OpenAI's `sk-`, Stripe's, GitHub's, Slack's, AWS's, Google's,
#: GitLab's, Hugging Face's, a JWT, or any "key-"/"token_" prefix): a caller who sent its
#: key as a request id must not find it in the logs.
_KEY_LIKE = re.compile(
    r"(?i:(?:sk|pk|rk|ak|key|api|apikey|api_key|token|secret|bearer|pat|ghp|gho|ghu|ghs|ghr|"
    r"github_pat|glpat|xox[abposr]|hf|npm|pypi)[-_]|AKIA|ASIA|AIza|eyJ)")


#: A vendor key's shape after a separator (`req-sk-proj-...`, `trace:ghp_...`): only the
#: distinctive prefixes, each with a key's length of text after it (`orders-api-1`,
#: `task-12345` and `build-npm-2` stay the caller's).
_KEY_INSIDE = re.compile(
    r"[._:\-](?:(?i:sk|rk|ghp|gho|ghu|ghs|ghr|github_pat|glpat|hf|npm)[-_][\w\-]{16}|"
    r"(?i:xox[abposr])-[\w\-]{8}|(?:AKIA|ASIA)[A-Z0-9]{16}|AIza[\w\-]{30}|eyJ[\w\-]{8})")
_SEPARATOR = re.compile(r"[._:\-]")


#: Every route's options: `Expect` handled as above.
ROUTE_OPTS: dict[str, Any] = {"expect_handler": expect_continue}


@web.middleware
async def request_id_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    rid = _request_id(request)
    request[REQUEST_ID] = rid
    request[INFO] = {}
    # bind + reset by token: `bound_contextvars` reads every context variable first,
    # which was a visible share of a cache hit.
    tokens = structlog.contextvars.bind_contextvars(request_id=rid)
    try:
        resp = await handler(request)
    finally:
        structlog.contextvars.reset_contextvars(**tokens)
    if not resp.prepared:
        resp.headers["x-request-id"] = rid
    return resp


async def request_id_header(request: web.Request, response: web.StreamResponse) -> None:
    """The `x-request-id` of an answer whose head goes out inside its handler (a stream),
    before `request_id_middleware` sees it (`on_response_prepare`)."""
    rid = request.get(REQUEST_ID)
    if rid is not None:
        response.headers.setdefault("x-request-id", rid)


def make_access_log(metrics: Metrics, enabled: bool) -> Any:
    @web.middleware
    async def access_log(request: web.Request, handler: Handler) -> web.StreamResponse:
        start = time.perf_counter()
        status = 500
        try:
            resp = await handler(request)
            status = returned_status(request, resp)
            note_outcome(request, resp.headers)
            return resp
        except asyncio.CancelledError as e:
            status = cancelled_status(request, e)
            note_outcome(request, request.get(RESPONSE_HEADERS) or {})
            raise
        finally:
            status = outcome_status(request, status)
            info: dict[str, Any] = request.get(INFO, {})
            if status == 499 and request.get(WRITE_TIMED_OUT):
                info["cut"] = "write_timeout"
            elif status >= 400 and (code := request.get(ERROR_CODE)) is not None:
                info["error"] = code
            elapsed = time.perf_counter() - start
            route = info.get("route") or route_label(request)
            if route is not None:
                model = info.get("model", "")
                labelled(metrics.requests, route, model, str(status)).inc()
                labelled(metrics.latency, route, model, str(status)).observe(elapsed)
            if enabled and not _probe_or_scrape(request):
                log_request(request, status, elapsed,
                            **{k: v for k, v in info.items() if v is not None})

    return access_log


#: What an answer's headers tell the access log and the span: the cache's outcome and the
#: breaker's fallback (an engine failed, or the circuit is open, and a fallback answered).
_TOLD = (("cache", "x-weir-cache"), ("fallback", "x-weir-fallback"))


def note_outcome(request: web.Request, headers: Mapping[str, str]) -> None:
    """The cache's outcome and the fallback that answered, for the access log and the
    span: what the answer's `x-weir-cache` and `x-weir-fallback` say (every route the
    plugins serve, and an error after the cache's lookup, whose answer carries its header
    too), unless the route told it. A handler cancelled before its answer (its client
    gone: a 499) has them in the headers the plugins gave its answer so far."""
    info = request.get(INFO)
    if info is None:
        return
    for field, header in _TOLD:
        if info.get(field) is None:
            told = headers.get(header)
            if told is not None:
                info[field] = told


def cancelled_status(request: web.Request, e: asyncio.CancelledError) -> int:
    """A handler cancelled: a stream's client gone after its whole answer (the SDK closes
    at `[DONE]`), 200; cut by the server's shutdown (told in-band), 503; its client gone,
    499."""
    return 200 if request.get(ANSWERED) else 503 if cut_by_shutdown(request, e) else 499


def returned_status(request: web.Request, resp: web.StreamResponse) -> int:
    """A handler's answer: its status, or 499 when it is yet to be sent and its client's
    connection is closed or closing already (nothing will reach it: a client that sent
    its request and shut its side, which aiohttp closes at EOF, or left, while a fast
    handler ran that no cancellation reached)."""
    if not resp.prepared:
        transport = request.transport
        if transport is None or transport.is_closing():
            return 499
    return resp.status


def outcome_status(request: web.Request, status: int) -> int:
    """What a request is logged and counted as: the status sent, or for a stream (its head
    said 200) the status of the in-band error that ended it (`STREAM_ERROR`: a deadline's
    504, a failed engine's 502). (A shutdown's cut, and a client that left or stopped
    reading, end the handler with a cancellation: 503 and 499, told by the caller.)"""
    inband: int | None = request.get(STREAM_ERROR)
    return inband if status == 200 and inband is not None else status


def log_request(request: web.Request, status: int, elapsed_s: float, **fields: Any) -> None:
    """A request's access-log line (never its headers, keys or prompt text)."""
    log.info("request", method=request.method, path=logged_path(request), status=status,
             latency_ms=round(elapsed_s * 1000, 2), **fields)


def log_refused(status: int, code: str | None, request_id: str) -> None:
    """The access-log line of a request refused before the middlewares could read it
    (aiohttp's parser, a head past `max_head_bytes`): its status and error code, the
    request id its answer carries, and nothing of the request: its bytes are unparsed (a
    key may be in any of them), so no method, path or header."""
    log.info("request", method=None, path="(unparsed)", status=status, latency_ms=0.0,
             request_id=request_id, error=code)


# An id the server made (a stored response's: "resp_" and 48 hex digits): a log line may
# name it. Nothing looser: "sk-" or "key-" and hex is a caller's secret.
_OWN_ID = re.compile(r"resp_[0-9a-f]{48}\Z")


def logged_path(request: web.Request) -> str:
    """The path a log line may hold. A path no route serves is the caller's text
    (`/v1/jane@example.com`), so it is not written; a route's parameters are the
    caller's text too (`/v1/responses/jane@example.com`, `/v1/models/sk-live-...`):
    the route's template is written, with an id the server made put back in."""
    resource = route_resource(request)
    if resource is None:
        return "(no route)"
    params = dict(request.match_info)
    if not params and resource is request.match_info.route.resource:
        return request.path
    info = resource.get_info()
    template = info.get("formatter") or resource.canonical
    for name, value in params.items():
        if _OWN_ID.match(value):
            template = re.sub(r"\{" + re.escape(name) + r"(?::[^}]*)?\}", value, template)
    return template


def route_resource(request: web.Request) -> web.AbstractResource | None:
    """The route a request's path names: the one matched, or for a method that path does
    not serve (a 405) the route's whose path it is (the first registered, as a 405 names
    the methods of every such route). None for a path no route serves. (A 405 was
    logged as `(no route)` and traced as `unmatched`, as though its path were unknown.)"""
    match = request.match_info
    if match.route.resource is not None:
        return match.route.resource
    if not isinstance(getattr(match, "http_exception", None), web.HTTPMethodNotAllowed):
        return None
    path = request.rel_url.path_safe  # (what the router matched)
    for resource in request.app.router.resources():
        info = resource.get_info()
        if isinstance(resource, web.PlainResource):
            if info.get("path") == path:
                return resource
        elif isinstance(resource, web.DynamicResource):
            pattern = info.get("pattern")
            if pattern is not None and pattern.fullmatch(path):
                return resource
    return None


#: The routes of no API traffic (probes, scrapes, the dashboard): not counted nor
#: traced, by the route a request matched (a path no route serves, `/healthz`,
#: `/metricsx`, is a 404 like any other unknown path's).
_UNTRACED = frozenset({"/health", "/health/live", "/health/ready", "/metrics", "/dashboard"})


def _untraced(request: web.Request) -> str | None:
    """The route of no API traffic a request matched (its template), else None."""
    resource = route_resource(request)
    if isinstance(resource, web.AbstractResource) and resource.canonical in _UNTRACED:
        return resource.canonical
    return None


def _probe_or_scrape(request: web.Request) -> bool:
    """A request the access log leaves out: a probe's or a scrape's (the dashboard's is
    logged: a person reads it)."""
    return _untraced(request) not in (None, "/dashboard")


def make_tracing(trust_incoming: bool) -> Any:
    """The server span; its parent is the caller's `traceparent`, if any and trusted
    (`tracing.trust_incoming`: a caller's context also decides whether its trace is
    sampled, and its `tracestate` is kept in the span)."""

    @web.middleware
    async def tracing_middleware(request: web.Request,
                                 handler: Handler) -> web.StreamResponse:
        if _untraced(request) is not None:
            return await handler(request)
        incoming = trust_incoming and "traceparent" in request.headers
        if not tracing_enabled():
            # No tracer provider: the server span would record nothing. What it carried,
            # the caller's trace context for the engine's upstream calls, is attached as
            # it is.
            if not incoming:
                return await handler(request)
            token = otel_context.attach(extract(request.headers))
            try:
                return await handler(request)
            finally:
                otel_context.detach(token)
        return await _server_span(request, handler,
                                  extract(request.headers) if incoming else None)

    return tracing_middleware


async def _server_span(request: web.Request, handler: Handler,
                       parent: otel_context.Context | None) -> web.StreamResponse:
    resource = route_resource(request)
    route = resource.canonical if resource is not None else "unmatched"
    attrs = {"http.request.method": request.method, "http.route": route,
             "weir.request_id": request.get(REQUEST_ID, "")}
    # (no parent: a new trace, sampled by `tracing.sample_ratio`; the span is made in
    # the empty context, not the task's, which holds nothing of the caller's)
    with tracer().start_as_current_span(f"HTTP {request.method} {route}",
                                        context=parent or otel_context.Context(),
                                        kind=SpanKind.SERVER, attributes=attrs) as s:
        status = 499
        try:
            resp = await handler(request)
            status = returned_status(request, resp)  # (as the access log counts it)
            note_outcome(request, resp.headers)
            return resp
        except asyncio.CancelledError as e:
            status = cancelled_status(request, e)  # (as the access log counts it)
            note_outcome(request, request.get(RESPONSE_HEADERS) or {})
            raise
        finally:
            if status == 499 and request.get(ANSWERED):
                status = 200  # (its client left after the whole answer)
            status = outcome_status(request, status)
            s.set_attribute("http.response.status_code", status)
            info = request.get(INFO) or {}
            for key in ("model", "tenant", "cache", "fallback"):
                if info.get(key) is not None:
                    s.set_attribute(f"weir.{key}", str(info[key]))
            code = request.get(ERROR_CODE) if status >= 400 else None
            if code is not None:  # (why: a shed's `overloaded`, a deadline's `timeout`)
                s.set_attribute("error.type", code)
            # As every plugin span tells it (`tracing.ended_by`): a refusal of the
            # client's request by name, a client gone as cancelled, neither an error.
            if status == 499:
                s.set_attribute("weir.cancelled", True)
            elif 400 <= status < 500:
                s.set_attribute("weir.refused", code or str(status))
            if status >= 500:
                s.set_status(Status(StatusCode.ERROR, code))


@web.middleware
async def http_version_middleware(request: web.Request,
                                  handler: Handler) -> web.StreamResponse:
    """A request line naming a version other than HTTP/1.0 and 1.1 (`HTTP/2.0`, `HTTP/0.9`:
    aiohttp's parser takes any `1.x`-free major) was served, its answer's status line
    echoing that version (`HTTP/2.0 200 OK`), which no client of either version reads. It
    gets a 505 that ends the connection, its status line HTTP/1.1 (as nginx answers).
    A method none of `PARSED_METHODS` (RTSP's `DESCRIBE`, which aiohttp's C parser reads
    in an RTSP request line, `RTSP/1.0`, as version 1.0) is the 501 it is in an HTTP
    line, not routed."""
    if request.method not in PARSED_METHODS:
        error: WeirError = MethodNotImplemented(
            "The request method is not implemented by this server.")
    elif request.version in (HttpVersion10, HttpVersion11):
        return await handler(request)
    else:
        error = VersionNotSupported(
            "Unsupported HTTP version in the request line; send HTTP/1.1.")
    answer_in_http_1_1(request)
    resp = _refusal(request, error, request.get(REQUEST_ID))
    resp.force_close()
    return resp


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    rid = request.get(REQUEST_ID)
    try:
        return await handler(request)
    except WeirError as e:
        note_error(request, e)
        resp = error_response(e, rid, request.get(RESPONSE_HEADERS))
        if request.content.exception() is not None or isinstance(e, RequestTimeout):
            # The body broke while being read (its coding refused it), or did not all
            # come: the rest of it cannot be read past (what the client sends next would
            # be read as this body), so this connection ends with this answer (aiohttp
            # would close it after the answer went out, under a client about to reuse it).
            resp.force_close()
        return resp
    except web.HTTPRequestEntityTooLarge:
        return _refusal(request, PayloadTooLarge("The request body is too large."), rid)
    except web.HTTPMethodNotAllowed as e:
        allowed = ", ".join(sorted(e.allowed_methods))
        err: WeirError = MethodNotAllowed(
            f"Method {shown(request.method)} is not allowed on {shown(request.path, 128)}; "
            f"allowed: {allowed}.",
            headers={"Allow": allowed})  # RFC 9110: a 405 says what is allowed
        return _refusal(request, err, rid)
    except web.HTTPNotFound:
        return _unrouted(request, rid)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return _refusal(request, _generic_http(e), rid)
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as e:
        log.error("unhandled error", path=logged_path(request), **error_fields(e))
        return _refusal(request, ServerError(), rid)


def _unrouted(request: web.Request, rid: str | None) -> web.Response:
    """A request no route takes: a 404, but for the two request targets that name no
    resource of this server (RFC 9112 3.2.3, 3.2.4), each a 405 (as nginx answers
    CONNECT). `CONNECT` asks for a tunnel, which Weir (no proxy) gives none: an empty
    `Allow` (RFC 9110 10.2.1: no method), and the connection ends (its client would
    next send the tunnel's bytes). `OPTIONS *` asks about the server, which answers
    OPTIONS on no resource (no CORS): its `Allow` names the methods it serves."""
    if request.method == "CONNECT":
        resp = _refusal(request, MethodNotAllowed(
            "Method CONNECT is not allowed: this server is no proxy.",
            headers={"Allow": ""}), rid)
        resp.force_close()
        return resp
    if request.method == "OPTIONS" and request.raw_path == "*":
        allowed = ", ".join(sorted({r.method for r in request.app.router.routes()}
                                   - {"*", "OPTIONS"}))
        return _refusal(request, MethodNotAllowed(
            f"Method OPTIONS is not allowed; the server serves {allowed}.",
            headers={"Allow": allowed}), rid)
    return _refusal(request, NotFound(
        f"Unknown request URL: {shown(request.method)} {shown(request.path, 128)}.",
        code="unknown_url"), rid)


def _refusal(request: web.Request, err: WeirError, rid: str | None) -> web.Response:
    """`err`'s answer, its code noted for the access log and the span (`note_error`), as
    a handler's error's is: the router's refusals (404, 405, 413) and the 505 too."""
    note_error(request, err)
    return error_response(err, rid)


def _generic_http(e: web.HTTPException) -> WeirError:
    err = WeirError(e.reason or "HTTP error")
    err.status = e.status
    err.type = "invalid_request_error" if e.status < 500 else "server_error"
    return err
