"""HTTP routes, kept thin: parse -> auth -> chain -> JSON or SSE.

Order inside a generation route: refuse while draining (503), authenticate (401 before
we read a body we might not want), check the content type and read the body within the
size limit (413), decode and validate it (400 naming the param), check the key may use
the model (403), the engine is loaded and alive (503 `not_ready`, `engine_failed`) and
serves the model (404), then run the chain and send its Reply.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from aiohttp import web

from . import embeddings_api, stored_chat
from .app_state import INFO, REQUEST_ID, RESPONSE_HEADERS, STATE, AppState
from .auth import Principal, account
from .body import read_json as read_json  # route modules elsewhere import it from here
from .chain import Completion, Stream
from .context import RequestContext, Route, header_map
from .engine.base import ModelInfo
from .errors import (
    ModelNotFound,
    ModelNotSupported,
    Unauthorized,
    Unavailable,
    WeirError,
    retry_headers,
    shown,
)
from .inflight import AroundChain, count_abort, counting_cuts, generating, refuse_if_draining
from .inflight import note_usage as note_usage  # (route modules import it here)
from .middleware import ROUTE_OPTS
from .protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    parse_model,
    with_model_defaults,
)
from .streaming import json_response as json_response  # (route modules import it here)
from .streaming import sse, write_sse
from .telemetry import Observations, error_fields, get_logger, labelled

log = get_logger("weir.routes")

_MODELS: dict[Route, type[ChatCompletionRequest] | type[CompletionRequest]] = {
    "chat": ChatCompletionRequest,
    "completion": CompletionRequest,
}


def _state(request: web.Request) -> AppState:
    return request.app[STATE]


def open_generation(request: web.Request, route: str) -> tuple[AppState, Principal]:
    """What every generation route checks first: not draining, a key. The request
    counts under `route` from here on, refused or not (a 401, a 400). What follows, its
    body's read included, runs inside `generating`: a request let in before a drain
    began is one the drain waits for (it saw none while the body was read, and the
    request then ran into the shutdown, its connection dropped)."""
    request[INFO]["route"] = route
    st = _state(request)
    refuse_if_draining(st)
    principal = st.auth.for_generation(request.headers)
    request[INFO]["tenant"] = principal.tenant  # (its line names it, whatever its body)
    return st, principal


def check_model(st: AppState, principal: Principal, model: str) -> None:
    """Once the body parsed: the key may use the model, the engine serves (loaded, not
    failed), and it serves that model; before the chain spends limits or lookups on the
    request. The engine's state is read after the body's checks, as vLLM's server and
    OpenAI answer a malformed body 400 whatever their state: a 503 "retry shortly" had
    the client retry a request that can never be served."""
    principal.check_model(model)
    if st.failed():
        raise Unavailable("The engine has stopped; this server must restart. Retry on "
                          "another replica.", code="engine_failed")
    if not st.terminal.ready():
        raise Unavailable("The model is still loading; retry shortly.", code="not_ready",
                          retry_after=5)
    if not st.terminal.has_model(model):
        emb = st.embedder
        if emb is not None and st.embed_chain is not None and model == emb.model_id:
            # (listed by `/v1/models`: it exists, and is told apart from a wrong name)
            raise ModelNotSupported(
                f"The model `{shown(model)}` is an embedding model: it serves "
                "`/v1/embeddings` only, not text generation.")
        raise ModelNotFound(model)


async def _generate(request: web.Request, route: Route) -> web.StreamResponse:
    st, principal = open_generation(request, route)
    with generating(st, request):  # (its body too: a drain waits for what it admitted)
        data, size = await read_json(request, st.settings.server.max_body_bytes,
                                     account(principal.tenant))
        req = parse_model(_MODELS[route], data)
        info = request[INFO]
        info.update(route=route, tenant=principal.tenant, stream=req.stream)
        check_model(st, principal, req.model)
        info["model"] = req.model  # a metric label: only names the server serves
        ctx = RequestContext(
            route=route,
            request=with_model_defaults(req, st.terminal.sampling_defaults()),
            principal=principal,
            request_id=request[REQUEST_ID],
            headers=header_map(request.headers.items()),
            body_bytes=size,
        )
        request[RESPONSE_HEADERS] = ctx.response_headers  # an error answer carries them
        return await _answer(request, st, ctx, info)


async def _answer(request: web.Request, st: AppState, ctx: RequestContext,
                  info: dict[str, Any]) -> web.StreamResponse:
    with counting_cuts(st, info, ctx), logging_prompt(st, info, ctx):
        reply = await st.chain(ctx)
    store = stored_chat.wanted(ctx)
    told = telling_tier(ctx)
    if isinstance(reply, Completion):
        headers = {**ctx.response_headers, **reply.headers}
        info.update(cache=headers.get("x-weir-cache"), prompt_tokens=ctx.prompt_tokens)
        note_usage(st, info, reply.body)
        body = told(reply.body)
        if store:
            await stored_chat.save(request.app, ctx, body)
        return json_response(body, headers)
    assert isinstance(reply, Stream)
    keep = stored_chat.keep_when_completed(request.app, ctx, reply) if store else None
    frame: Callable[[dict[str, Any]], bytes] = sse  # (each chunk as it is, unless the
    if told is not _as_it_is:  # tier is told)
        frame = lambda chunk: sse(told(chunk))  # noqa: E731
        if keep is not None:
            keep = _keeping_as_sent(keep, told)
    if ctx.request.sequences > 1:
        frame = one_choice_each(frame)

    def stream_headers() -> dict[str, str]:
        headers = {**ctx.response_headers, **reply.headers}
        info.update(cache=headers.get("x-weir-cache"), prompt_tokens=ctx.prompt_tokens)
        return headers

    return await _send_stream(request, st, ctx, reply, stream_headers, info, keep,
                              frame=frame)


#: The tier every request is served in: one engine serves them all alike.
SERVED_TIER = "default"


def _as_it_is(body: dict[str, Any]) -> dict[str, Any]:
    return body


def one_choice_each(frame: Callable[[dict[str, Any]], bytes]
                    ) -> Callable[[dict[str, Any]], bytes]:
    """`frame`, a chunk of several choices (an engine step of n > 1, as made, cached or
    coalesced) sent as one event a choice, as OpenAI's and vLLM's servers send them: many
    clients read only `choices[0]` of an event. Its other fields go with each (the usage
    chunk, with no choices, and a chunk of one go as they are). Only a request of several
    choices frames with it: the one-choice stream's chunks cost nothing more."""

    def framed(chunk: dict[str, Any]) -> bytes:
        choices = chunk.get("choices")
        if not choices or len(choices) == 1:
            return frame(chunk)
        return b"".join([frame({**chunk, "choices": [c]}) for c in choices])

    return framed


def _keeping_as_sent(keep: Callable[[dict[str, Any]], None],
                     told: Callable[[dict[str, Any]], dict[str, Any]]
                     ) -> Callable[[dict[str, Any]], None]:
    """A stored completion is assembled from the chunks as they went out."""
    return lambda chunk: keep(told(chunk))


def telling_tier(ctx: RequestContext) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """What a chat answer (whole, or each chunk) goes out as: where its request set
    `service_tier`, OpenAI's answer names the tier that served it ("When the
    `service_tier` parameter is set, the response body will include the `service_tier`
    value based on the processing mode actually used"), here always `default`, as the
    Responses API's answers say. Added to a copy, as the answer goes out: a cached answer
    is shared by requests that set no tier, or another one. An upstream's own word on
    its tier is kept; its null (a vLLM server's answer has one) names no tier."""
    req = ctx.request
    if not isinstance(req, ChatCompletionRequest) or req.service_tier is None:
        return _as_it_is

    def told(body: dict[str, Any]) -> dict[str, Any]:
        if body.get("service_tier") is not None or "error" in body:
            return body
        return {**body, "service_tier": SERVED_TIER}

    return told


class logging_prompt(AroundChain):  # (lower case: used as the function it was)
    """Around the chain, with `logging.include_prompts` (off by default: prompts are
    user data): the prompt on the access-log line as the chain's sanitizer passed it on,
    its redactions made, and none where the sanitizer refused the request (a `block`, a
    limit): what it keeps from the engine and every store stays out of the log too (the
    prompt as sent was logged, a key it redacted or blocked in it). Without a sanitizer,
    as sent."""

    __slots__ = ()

    def __exit__(self, kind: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        st, ctx = self._st, self._ctx
        if st.settings.logging.include_prompts and (
                ctx.key_request is not None  # (set by the sanitizer as it passes it on)
                or not any(p.name == "sanitizer" for p in st.plugins)):
            self._info["prompt"] = prompt_text(ctx.request)


def prompt_text(req: ChatCompletionRequest | CompletionRequest) -> str:
    """The request's prompt as the access log shows it (`logging.include_prompts`)."""
    if isinstance(req, ChatCompletionRequest):
        return "\n".join(f"{m.role}: {m.text()}" for m in req.messages)
    return "\n".join(p for p in req.prompts() if isinstance(p, str))


class StreamTiming:
    """A stream's time to first token and the gaps between its outputs: the metrics (by
    route and model) and the access log's `ttft_ms`. The gaps are counted as they come
    and added to the histogram in batches, the last when the stream ends (`flush`)."""

    __slots__ = ("_ctx", "_info", "_itl", "_last", "_ttft")

    def __init__(self, st: AppState, ctx: RequestContext, info: dict[str, Any]) -> None:
        route, model = info["route"], info.get("model", "")
        self._ttft = labelled(st.metrics.ttft, route, model)
        self._itl = Observations(labelled(st.metrics.itl, route, model))
        self._ctx, self._info = ctx, info
        self._last = 0.0

    def first(self) -> None:
        """The first byte went out. The first chunk was awaited inside the chain (the
        stream is primed): time from the request's start."""
        ttft = time.monotonic() - self._ctx.started
        self._info["ttft_ms"] = round(ttft * 1000, 2)
        self._ttft.observe(ttft)

    def output(self) -> None:
        """An event carrying output (tokens) goes out."""
        now = time.monotonic()
        if self._last:
            self._itl.observe(now - self._last)
        self._last = now

    def flush(self) -> None:
        """The stream ended (however it did): its gaps held go to the histogram."""
        self._itl.flush()


async def _send_stream(request: web.Request, st: AppState, ctx: RequestContext, reply: Stream,
                       headers: Any, info: dict[str, Any],
                       keep: Callable[[dict[str, Any]], None] | None, *,
                       frame: Callable[[dict[str, Any]], bytes] = sse) -> web.StreamResponse:
    """`keep`: sees every chunk (a stored completion being assembled); `frame`: a
    chunk's bytes."""
    timing = StreamTiming(st, ctx, info)
    usage_chunk: dict[str, Any] = {}

    def chunk(c: dict[str, Any]) -> None:
        if keep is not None:
            keep(c)
        if c.get("choices"):
            timing.output()
        elif c.get("usage"):
            usage_chunk["usage"] = c["usage"]

    srv = st.settings.server
    try:
        return await write_sse(
            request, reply, headers, write_timeout=srv.write_timeout_s,
            keepalive=srv.keepalive_s, on_first=timing.first, on_chunk=chunk, frame=frame,
            on_abort=lambda reason: count_abort(st, request, reason),
            log_error=lambda e: log.error("stream failed", **error_fields(e)))
    finally:
        timing.flush()
        usage = reply.usage or usage_chunk.get("usage")
        if usage:
            note_usage(st, info, {"usage": usage})


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "chat")


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "completion")


def _model_entry(m: Any) -> dict[str, Any]:
    entry = {"id": m.id, "object": "model", "created": m.created, "owned_by": m.owned_by,
             "root": m.root, "parent": None}
    if m.max_model_len:
        entry["max_model_len"] = m.max_model_len
    return entry


def _served_models(st: AppState) -> list[ModelInfo]:
    """The engine's models, and the embedding model where `/v1/embeddings` serves it."""
    models = list(st.terminal.models())
    emb = st.embedder
    if emb is not None and st.embed_chain is not None:
        # (an upstream lists its own embedding model too, often this same one: listed
        # once, as the one `/v1/embeddings` here serves)
        models = [m for m in models if m.id != emb.model_id]
        models.append(ModelInfo(id=emb.model_id, owned_by="weir", root=emb.model_id,
                                created=_STARTED))
    return models


_STARTED = int(time.time())


async def list_models(request: web.Request) -> web.Response:
    st = _state(request)
    principal = st.auth.authenticate(request.headers)
    data = [_model_entry(m) for m in _served_models(st) if principal.may_use(m.id)]
    return web.json_response({"object": "list", "data": data})


async def get_model(request: web.Request) -> web.Response:
    st = _state(request)
    principal = st.auth.authenticate(request.headers)
    model_id = request.match_info["model"]
    for m in _served_models(st):
        if m.id == model_id and principal.may_use(m.id):
            return web.json_response(_model_entry(m))
    raise ModelNotFound(model_id)


async def live(request: web.Request) -> web.Response:
    """200 while the process can serve, loading and draining included; 503 once its
    engine has failed for good (vLLM's engine process died): a restart is the cure, and
    a liveness probe is what restarts it. (It answered 200 for good, and readiness said
    `loading`, a pod out of service that nothing restarted.)"""
    if _state(request).failed():
        return web.json_response({"status": "failed"}, status=503)
    return web.json_response({"status": "ok"})


def _admin_gate(request: web.Request, exposure: str, what: str) -> None:
    """Nothing if `exposure` is open (or auth is open); else 401/403 unless an admin key
    (`admin`: a tenant's too; `operator`: an operator's)."""
    st = _state(request)
    if exposure == "open" or st.auth.open:
        return
    st.auth.require_role(request.headers, "operator" if exposure == "operator" else "admin",
                         what)


async def ready(request: web.Request) -> web.Response:
    """The status and its code are open (probes); the details need an admin key."""
    st = _state(request)
    body = st.readiness()
    status = 200 if body["status"] == "ready" else 503
    headers = retry_headers(5000) if status == 503 else None
    try:
        _admin_gate(request, st.settings.observability.health_details, "Readiness details")
    except WeirError:
        body = {"status": body["status"]}
    return web.json_response(body, status=status, headers=headers)


async def metrics(request: web.Request) -> web.Response:
    st = _state(request)
    _admin_gate(request, st.settings.observability.metrics, "/metrics")
    st.refresh_gauges()
    return web.Response(body=st.metrics.render(),
                        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


_DASHBOARD = Path(__file__).parent / "static" / "dashboard.html"


async def dashboard(request: web.Request) -> web.Response:
    st = _state(request)
    try:
        _admin_gate(request, st.settings.observability.dashboard, "The dashboard")
    except Unauthorized as e:  # a browser asks for the key (as the Basic password)
        e.headers["www-authenticate"] = 'Basic realm="weir dashboard", charset="UTF-8"'
        raise
    return web.Response(body=_DASHBOARD.read_bytes(),
                        headers={"Content-Type": "text/html; charset=utf-8",
                                 "Cache-Control": "no-cache"})


def add_routes(app: web.Application) -> None:
    from .openai_responses import setup as add_responses_api  # it imports read_json from here

    app.router.add_post("/v1/chat/completions", chat_completions, **ROUTE_OPTS)
    app.router.add_post("/v1/completions", completions, **ROUTE_OPTS)
    app.router.add_post("/v1/embeddings", embeddings_api.embeddings, **ROUTE_OPTS)
    app.router.add_get("/v1/models", list_models, **ROUTE_OPTS)
    app.router.add_get("/v1/models/{model:.+}", get_model, **ROUTE_OPTS)
    app.router.add_get("/health/live", live, **ROUTE_OPTS)
    app.router.add_get("/health/ready", ready, **ROUTE_OPTS)
    app.router.add_get("/health", ready, **ROUTE_OPTS)
    app.router.add_get("/metrics", metrics, **ROUTE_OPTS)
    if app[STATE].settings.observability.dashboard != "off":
        app.router.add_get("/dashboard", dashboard, **ROUTE_OPTS)
    add_responses_api(app)
    stored_chat.setup(app)
