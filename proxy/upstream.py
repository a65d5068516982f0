"""The upstream terminal: any OpenAI-compatible server (another Weir, a vLLM server, a
central cluster) behind Weir, as `engine.kind: upstream` or as a breaker fallback.
It serves at the OpenAI level, not on token ids (so it lives beside `LocalServing`, not
in the engine package): the request is forwarded as JSON through
one pooled aiohttp session, with connect and total timeouts, the W3C `traceparent`
passed on, and streams relayed chunk by chunk. An upstream 4xx is the client's error and
is passed through (status, message, type, and `param` and `code` as strings), except
where it is about Weir's own standing with the upstream: a 401 or 403 (Weir's key) is an
engine failure, and a 429 (Weir's quota) is a 429 in Weir's words (the upstream's names
the account). A 5xx, a redirect, a timeout, a refused connection, an unreadable answer
or a stream that ends before its answer does is an engine failure (502/504), which the
breaker counts. A stream that closes cleanly once each of its choices has ended (its
`finish_reason` came) is whole, its `[DONE]` and its usage sent or not (its usage then
not known); one whose connection breaks is whole only once its usage came too.

Streams are asked for their usage (`stream_options.include_usage`) whether or not the
client asked: the rate limiter and the cache count with it. The usage goes on to the
client only when it asked for it, as OpenAI sends it (a last chunk of its own, with no
choices), wherever the upstream put it (its own chunk, the last answer chunk, every
chunk, Groq's `x_groq`). An upstream that sends none (it ignores the option) leaves it
unknown: Weir holds no tokenizer for an upstream's model, and the chunks relayed count
pieces of text, not tokens, so any number would be an estimate, which OpenAI's usage has
no way to mark as one; a client would bill or budget with it as a count. So the client
that asked gets no usage chunk (as from such an upstream directly), the rate limiter
keeps the request's reservation (its prompt's estimate and its output limit), the token
metrics and the access log count nothing for it, and the operator is warned once (as
of a whole answer without usage, counted so too).

A choice is over at its finish reason, as OpenAI's streams have it: what an upstream
sends for it after that (text, calls, reasoning, logprobs) is dropped, neither relayed
nor kept in the answer the cache stores (its first finish reason stands; an entry that
carries nothing passes), and the operator is warned once. Its usage is passed on as it
came (it may count what was dropped: it is what the upstream spent).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Literal, get_args
from urllib.parse import urlsplit

import aiohttp

from .auth import ON_BEHALF_OF, caller_digest, tenant_salt
from .chain import Completion, Outcome, Reply, Stream
from .context import RequestContext
from .engine.answering import answer_digest
from .engine.base import EngineStats, ModelInfo
from .errors import (
    DeadlineExceeded,
    EngineError,
    GatewayFault,
    InvalidRequest,
    ModelNotFound,
    NotCached,
    RateLimited,
    Timeout,
    Unavailable,
    WeirError,
    retry_headers,
)
from .generation import EngineSpan
from .preparing import EchoAsSent
from .protocol import ChatCompletionRequest, CompletionRequest, ServiceTier, continuous_usage
from .rendering import ChatAssembly, ChunkAssembler, as_count, is_count, usage_ok, whole_usage
from .responses import completion_body, completion_choice, new_id, now
from .settings import UpstreamEngineSettings
from .streaming import SHUTDOWN
from .tasks import cancel_and_wait
from .telemetry import error_fields, get_logger
from .tools import new_call_id

_PATHS = {"chat": "/chat/completions", "completion": "/completions"}
#: A route's answer's `object`, whole and streamed, and its id's prefix.
_OBJECTS = {"chat": ("chat.completion", "chat.completion.chunk", "chatcmpl"),
            "completion": ("text_completion", "text_completion", "cmpl")}
#: The client's headers an upstream (a Weir with a cache) must hear as this one did:
#: `no-store`, `no-cache`, `max-age`, `only-if-cached`.
_PASSED_ON = ("cache-control", "pragma")
log = get_logger("weir.upstream")
#: While the upstream names no models (down at start): asked again after this long,
#: doubling up to the most.
DISCOVERY_FIRST_S = 1.0
DISCOVERY_MAX_S = 30.0
#: How often an upstream whose models Weir asked for is asked again once it named them:
#: what serves each (its `root`, its context length) is in the answer digest, and a
#: checkpoint loaded behind the same name since Weir started answers otherwise (its
#: digest was taken at start only: the old model's answers were replayed for a day).
MODELS_REFRESH_S = 60.0

#: The most an upstream's stream may send without ending an event (a whole answer in one
#: chunk, with its logprobs, is well under it), and the most an answer may hold, whole or
#: as a stream's events together (n long choices with their top logprobs come to tens of
#: MiB): past either, the answer is not relayed (`AnswerTooLarge`; a stream under way
#: ends with it in-band).
MAX_EVENT_BYTES = 16 << 20
MAX_ANSWER_BYTES = 64 << 20
#: The most an upstream's model list (`/models`) may hold.
MAX_MODELS_BYTES = 16 << 20
#: The longest an upstream's `Retry-After` is passed on as (a later one is this long).
MAX_RETRY_AFTER_S = 3600
#: Longest an error's body (a 429's, a 504's, a 4xx's) is waited for once its status
#: came: the status alone decides the answer, the body only refines it (a 429's kind, a
#: 504's `not_cached`, a 400's message). Read within the request's whole `timeout_s`, a
#: body that stalled held the client's 429 that long (ten minutes by default). Shorter
#: where the upstream's `read_timeout_s` is (`Upstream._error_body_s`): a body no byte of
#: came for that long has stalled, by the operator's own measure.
ERROR_BODY_S = 5.0


class UpstreamError(InvalidRequest):
    """An upstream 4xx, passed through as it came: the client's error, as an invalid
    request is (a route renames its params as for its own; a fallback passes it on)."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        raw = body.get("error")
        err: dict[str, Any] = raw if isinstance(raw, dict) else {}
        super().__init__(str(err.get("message") or "Upstream rejected the request."),
                         param=_text(err.get("param")), code=_text(err.get("code")))
        self.status = status
        kind = err.get("type")
        # (OpenAI's words, `invalid_request_error`; vLLM's server names its exception
        # class, `BadRequestError`, which no OpenAI client knows)
        self.type = kind if isinstance(kind, str) and _OPENAI_TYPE.fullmatch(kind) else (
            "invalid_request_error")

    @classmethod
    def in_band(cls, chunk: dict[str, Any]) -> UpstreamError | None:
        """An error event that opens an upstream's stream, where it is the client's (a
        4xx): vLLM's server checks a request's sampling values (token ids in
        `logit_bias`, `top_logprobs` past its limit, a schema its grammar compiler
        refuses) only as its stream starts, and says so in the stream. None where the
        upstream failed. (Once an answer came, an error is the upstream's: vLLM's server
        calls any exception in generation, a detokenizer's, a 400.)"""
        err = chunk.get("error")
        if not isinstance(err, dict):
            return None
        code, kind = err.get("code"), err.get("type")
        if isinstance(code, int) and not isinstance(code, bool):
            status = code if 400 <= code < 500 and code not in (401, 403, 429) else None
        else:
            status = 400 if kind in ("invalid_request_error", "BadRequestError") else None
        return None if status is None else cls(status, chunk)


class UpstreamUnavailable(EngineError):
    """An upstream 503 (overloaded, draining, no backend behind its balancer): an engine
    failure the breaker counts, passed on as a 503 with the upstream's `Retry-After`, so
    clients back off as it asked."""

    status = 503
    default_code = "upstream_unavailable"

    def __init__(self, headers: Mapping[str, str]) -> None:
        super().__init__("The upstream is unavailable; retry after the time given in "
                         "Retry-After.")
        self.headers.update(_retry_headers(headers))


class AnswerTooLarge(GatewayFault):
    """An upstream answer past what Weir relays. Not the engine's failure (the breaker
    does not count it: any tenant may ask for a long answer), nor the client's."""

    status = 502
    default_code = "answer_too_large"

    def __init__(self, limit: int) -> None:
        super().__init__(f"The upstream's answer is larger than this gateway relays "
                         f"({limit >> 20} MiB); ask for fewer choices, tokens or logprobs.")


class ChoicesMissing(GatewayFault):
    """An upstream answer with fewer choices than asked (`n`; a completion's n per
    prompt), each that came whole: an upstream that does not take `n` (some ignore it),
    which no retry changes. A 502 streamed or not (a whole answer was a 200 with fewer
    choices, cached so; a stream a counted failure), never cached, and not counted by the
    breaker: one tenant's `n: 2` must not open the circuit for every tenant while the
    upstream answers everything else."""

    status = 502
    default_code = "upstream_choices_missing"

    def __init__(self, got: int, asked: int) -> None:
        super().__init__(f"The upstream answered {got} of the {asked} choices asked; it may "
                         f"not support `n`.")


class UpstreamDeadline(DeadlineExceeded):
    """A stream cut at `timeout_s` while its bytes kept coming (a stalled one times out
    at `read_timeout_s`): its length is the caller's, not the upstream's failure, so the
    breaker does not count it."""

    def __init__(self) -> None:
        super().__init__("The upstream's answer ran past the time this gateway gives one; "
                         "ask for fewer tokens.")


class _PoolWait:
    """One request's place in the wait for a pooled connection (told by aiohttp's trace):
    `waiting` while it waits for one. `timed`: the stream whose first token the breaker
    times (`RequestContext.engine_live`): a wait for a connection is this gateway's load,
    not the upstream's slowness, so its time starts again when it has one."""

    __slots__ = ("timed", "waiting")

    def __init__(self, timed: RequestContext | None = None) -> None:
        self.waiting = False
        self.timed = timed
        if timed is not None:
            timed.engine_live = timed.engine_timed = True


async def _queued(session: aiohttp.ClientSession, ctx: Any,
                  params: aiohttp.TraceConnectionQueuedStartParams) -> None:
    if isinstance(wait := ctx.trace_request_ctx, _PoolWait):
        wait.waiting = True
        if wait.timed is not None:
            wait.timed.engine_live = wait.timed.engine_timed = False


async def _dequeued(session: aiohttp.ClientSession, ctx: Any,
                    params: aiohttp.TraceConnectionQueuedEndParams) -> None:
    if isinstance(wait := ctx.trace_request_ctx, _PoolWait):
        wait.waiting = False
        if wait.timed is not None:
            wait.timed.engine_started = time.monotonic()
            wait.timed.engine_live = wait.timed.engine_timed = True


#: What a model list's entry says serves its model, for cache keys (vLLM's: `root`, the
#: checkpoint or adapter's path; `parent`, an adapter's base model; `max_model_len`,
#: where an answer with no `max_tokens` stops). Never the rest: vLLM's `created` is the
#: listing's time and its `permission` a new id each listing; another server's load
#: state comes and goes.
_SERVES = ("root", "parent", "max_model_len")


def served_digests(listed: list[dict[str, Any]]) -> dict[str, str]:
    """Each listed model's answer digest, of its own entry (`_SERVES`) and, for an
    adapter, its base model's (`parent`, where listed: the adapter's answers come from
    those weights too). A model loaded, another one's adapter or checkpoint, moves no
    other model's (one digest of the whole list moved every model's cache keys at
    once). None for one whose entry tells none of `_SERVES`."""
    told: dict[str, list[dict[str, Any]]] = {}
    for m in listed:
        told.setdefault(m["id"], []).append(
            {k: m[k] for k in _SERVES if m.get(k) is not None})

    own: dict[str, str] = {}  # a model's entries' digest, each made once

    def entry(model: str) -> str:  # (a name listed twice: both)
        if model not in own:
            own[model] = answer_digest({"entry": sorted(
                told.get(model, ()), key=lambda e: sorted(map(repr, e.items())))})
        return own[model]

    digests: dict[str, str] = {}
    for model, entries in told.items():
        if not any(entries):
            continue
        # (vLLM's adapters sit on a base model, one level deep) Its bases' digests, not
        # their entries: a list naming many models many times, each with many parents,
        # was digested in the cube of its length.
        bases = sorted({p for e in entries if isinstance(p := e.get("parent"), str)} - {model})
        digests[model] = answer_digest({"upstream": [[m, entry(m)] for m in [model, *bases]]})
    return digests


class Upstream:
    """A Terminal over an upstream server. `check_models=False` (a fallback target)
    forwards whatever model the request names."""

    def __init__(self, settings: UpstreamEngineSettings, *, check_models: bool = True) -> None:
        self.settings = settings
        self.check_models = check_models
        self.base = settings.base_url.rstrip("/")
        self._session: aiohttp.ClientSession | None = None
        self._models = list(settings.models)
        self._ready = False
        self._created = int(time.time())
        self.in_flight = 0
        self._discovery: asyncio.Task[None] | None = None
        self._refresh: asyncio.Task[None] | None = None  # (`MODELS_REFRESH_S`)
        self._answer_digests: dict[str, str] = {}  # (`answer_digest_for`: model list's)
        #: What its warnings name it by: host and port, never the credentials a
        #: `base_url` may hold (a primary and a fallback may serve one model name).
        where = urlsplit(self.base)
        host = f"[{where.hostname}]" if ":" in (where.hostname or "") else where.hostname
        self.named = f"{host}:{where.port or (443 if where.scheme == 'https' else 80)}"
        self._told_no_usage = False  # (an answer without usage is warned of once)
        self._told_past_finish = False  # (a choice going on after its end: once)
        self._told_finish = False  # (a finish reason outside the spec's: once)
        # `connect` bounds the wait for a pooled connection and its connect together,
        # `sock_connect` the connect alone: a request timed out while still waiting for
        # a connection (the trace tells) was shed here, the upstream never asked.
        self._timeout = aiohttp.ClientTimeout(
            total=settings.timeout_s, connect=settings.connect_timeout_s,
            sock_connect=settings.connect_timeout_s)
        # A stream's: no byte for `read_timeout_s` is a stalled upstream, while its
        # `timeout_s` running out with bytes still coming is the answer's length.
        self._stream_timeout = aiohttp.ClientTimeout(
            total=settings.timeout_s, connect=settings.connect_timeout_s,
            sock_connect=settings.connect_timeout_s,
            sock_read=min(settings.read_timeout_s, settings.timeout_s))

    async def start(self) -> None:
        s = self.settings
        pool = aiohttp.TraceConfig()
        pool.on_connection_queued_start.append(_queued)
        pool.on_connection_queued_end.append(_dequeued)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=s.max_connections),
            timeout=self._timeout, trace_configs=[pool])
        if self.check_models and not self._models and (why := await self._discover()):
            # Not ready until the upstream names its models: one unknown would take any
            # name a client sends (each a new metric label), and answer nothing.
            self._discovery = asyncio.create_task(self._discover_until_found(why))
            return
        self._ready = True
        self._keep_asking()

    def _keep_asking(self) -> None:
        """Ask again every `MODELS_REFRESH_S` which models it serves (only where Weir
        asked at start: `models` configured are the operator's)."""
        if self.check_models and not self.settings.models and self._refresh is None:
            self._refresh = asyncio.create_task(self._refresh_models())

    async def _refresh_models(self) -> None:
        """One not answered keeps what it last said (a blip is no new model). Said once
        when the list stops coming and once when it comes again: an upstream down for a
        night logged a line (and an unexpected error its traceback) every minute."""
        failing: str | None = None
        while True:
            await asyncio.sleep(MODELS_REFRESH_S)
            why = await self._discover(log_errors=failing is None)
            if why is not None and failing is None:
                log.warning("upstream model list not refreshed: the last one stands",
                            reason=why, every_s=MODELS_REFRESH_S)
            elif why is None and failing is not None:
                log.info("upstream model list refreshed again", was=failing)
            failing = why

    async def _discover(self, log_errors: bool = True) -> str | None:
        """Ask the upstream which models it serves: None once it named some, else why not
        (for the log: a status, an error's type; never a body, which may quote the key).
        Whatever fails is a reason to ask again: an exception here stopped Weir starting,
        or ended the task that asks again unseen (Weir `loading` for good)."""
        try:
            return await self._ask_models()
        except Exception as e:  # (its type and place: its message may quote a secret)
            if log_errors:
                log.error("upstream model discovery failed", **error_fields(e))
            return type(e).__name__

    async def _ask_models(self) -> str | None:
        assert self._session is not None
        try:
            async with self._session.get(f"{self.base}/models", headers=self._auth(),
                                         timeout=aiohttp.ClientTimeout(
                                             total=self.settings.connect_timeout_s * 2)) as r:
                if r.status != 200:
                    return f"status {r.status}"
                raw = await _body(r, MAX_MODELS_BYTES)
            if raw is None:
                return "model list too large"
            data = upstream_json(raw)
            listed = [m for m in data.get("data", [])
                      if isinstance(m, dict) and isinstance(m.get("id"), str)]
        except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError, TypeError) as e:
            return type(e).__name__
        if not listed:
            return "no models listed"
        self._models = [m["id"] for m in listed]
        self._answer_digests = served_digests(listed)
        return None

    async def _discover_until_found(self, first: str) -> None:
        delay = DISCOVERY_FIRST_S
        why: str | None = first
        while why:
            log.warning("upstream named no models: not ready (or set engine.models)",
                        reason=why, retry_in_s=delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, DISCOVERY_MAX_S)
            why = await self._discover()
        self._ready = True
        log.info("upstream models found: ready", models=len(self._models))
        self._keep_asking()

    async def close(self) -> None:
        self._ready = False
        if self._discovery is not None:
            await cancel_and_wait(self._discovery)
        if self._refresh is not None:
            await cancel_and_wait(self._refresh)
        if self._session is not None:
            await self._session.close()

    def ready(self) -> bool:
        return self._ready

    def failed(self) -> bool:
        """Never: an upstream that went away may come back (it is then not ready)."""
        return False

    def models(self) -> list[ModelInfo]:
        return [ModelInfo(id=m, owned_by=self.settings.owned_by, root=m,  # not its address
                          created=self._created) for m in self._models]

    def stats(self) -> EngineStats:
        return EngineStats(running=self.in_flight)

    def _auth(self) -> dict[str, str]:
        key = self.settings.api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _headers(self, ctx: RequestContext, span: EngineSpan) -> dict[str, str]:
        h = {**self._auth(), "Content-Type": "application/json"}
        h["x-request-id"] = ctx.request_id  # (the client's own only where it was kept)
        if (secret := self.settings.on_behalf_of_secret) is not None:
            h[ON_BEHALF_OF] = caller_digest(ctx.principal, secret)  # (a Weir upstream
            # whose key is marked `on_behalf_of` keeps this gateway's tenants apart)
        for name in _PASSED_ON:  # what the client asked of caches holds there too
            if name in ctx.headers:
                h[name] = ctx.headers[name]
        # The call's span, when tracing is on, becomes the upstream's parent; without a
        # tracer, the caller's context as the server took it (none from a caller it does
        # not trust: `tracing.trust_incoming`).
        span.inject(h)
        return h

    def routes(self) -> list[tuple[str, str, Any]]:
        return []

    def sampling_defaults(self) -> Mapping[str, Any]:
        return {}  # (the upstream applies its model's own)

    def read_tokens(self, token_ids: list[int]) -> str | None:
        return None  # (the upstream holds the tokenizer)

    def answer_digest_for(self, model: str) -> str | None:
        """What the upstream said serves `model` (its entry's `root`, `parent` and
        `max_model_len`, as vLLM lists them; an adapter's base model's too) when Weir
        last asked it (at start, then every `MODELS_REFRESH_S`): `served_digests`. None
        where it was not asked (`models` configured), does not list `model`, or told
        none of them. Its own template, tool parser and the like it keeps to itself."""
        return self._answer_digests.get(model)

    async def count_prompt(self, request: ChatCompletionRequest | CompletionRequest,
                           ) -> int | None:
        return None  # (the upstream holds the tokenizer and the template)

    async def prepare(self, ctx: RequestContext) -> None:
        return None  # (the upstream prepares its own)

    def prepares_ahead(self, ctx: RequestContext) -> bool:
        return False

    def has_model(self, model: str) -> bool:
        return not self.check_models or model in self._models

    async def __call__(self, ctx: RequestContext) -> Reply:
        """Forward the request (after checking the model, unless told not to), inside an
        `engine.generate` span (when tracing is on), the upstream's parent."""
        if not self.has_model(ctx.model):
            raise ModelNotFound(ctx.model)
        assert self._session is not None, "Upstream.start() was not called"
        span = EngineSpan(ctx.model)
        try:
            reply = await self._forward(ctx, span)
        except BaseException as e:
            span.end(None, None, e)  # (what it spent is not known)
            raise
        if isinstance(reply, Completion):
            span.end(*_tokens(reply.body.get("usage")), None)
            if reply.body.get("usage") is None:
                self._tell_no_usage(ctx.model, streamed=False)
            return reply
        if not span.recording:
            return reply
        span.first_token()  # (primed: its first chunk is in hand)

        def ended(stream: Stream, outcome: Outcome) -> None:
            span.end(*_tokens(stream.usage),
                     stream.error if outcome != "completed" else None)

        reply.on_end(ended)
        return reply

    async def _forward(self, ctx: RequestContext, span: EngineSpan) -> Reply:
        assert self._session is not None
        # The breaker times the call from here: a stream's first chunk is its first token,
        # so one none came to for `slow_call_s` is slow as the in-process engine's is (a
        # hung upstream opens the breaker, though each request's own deadline cuts it
        # before `read_timeout_s`). A whole answer's wait holds its length: not timed.
        timed = ctx.engine_started is None and ctx.request.stream
        if ctx.engine_started is None:
            ctx.engine_started = time.monotonic()
        ctx.waiting()
        # What the client sent (as the chain left it), not the defaults Weir's models
        # fill in: an OpenAI-compatible server may refuse a field it does not know
        # (OpenAI's own refuses `ignore_eos`, `min_tokens`), and a null the client sent
        # means what it means there.
        body = ctx.request.model_dump(by_alias=True, exclude_unset=True)
        # Weir keeps what its clients store (per tenant): the upstream, which sees every
        # tenant under one key, is not asked to keep it too.
        body.pop("store", None)
        body.pop("metadata", None)
        # Greedy, as the local engine decodes it: vLLM refuses `top_p: 0`, and samples a
        # temperature of 1e-6 at 0.01 (with `n` > 1, which vLLM refuses at temperature 0,
        # such a temperature is the upstream's to read).
        if body.get("top_p") == 0 or (ctx.request.greedy and ctx.request.n == 1):
            body["temperature"], body["top_p"] = 0, 1
        if ctx.output_ceiling is not None and all(
                body.get(k) is None for k in ("max_tokens", "max_completion_tokens")):
            # The operator's, as the local engine applies it (chat's current name for it:
            # OpenAI's reasoning models refuse `max_tokens`), under the request's own
            # default where it has one (a completion's 16, which OpenAI's applies too).
            # A limit the client named is within it already (the sanitizer's check).
            body.pop("max_tokens", None)  # (a null the client sent)
            limit = ctx.request.output_limit
            body["max_completion_tokens" if ctx.route == "chat" else "max_tokens"] = (
                ctx.output_ceiling if limit is None else min(limit, ctx.output_ceiling))
        if ctx.request.stream:
            body["stream_options"] = {**(body.get("stream_options") or {}),
                                      "include_usage": True}
        if self.settings.cache_salt:
            body["cache_salt"] = tenant_salt(ctx.principal.tenant,
                                             self.settings.on_behalf_of_secret)
        url = self.base + _PATHS[ctx.route]
        self.in_flight += 1
        wait = _PoolWait(ctx if timed else None)
        try:
            resp = await self._session.post(
                url, data=json.dumps(body), allow_redirects=False,
                headers=self._headers(ctx, span),
                trace_request_ctx=wait,
                timeout=self._stream_timeout if ctx.request.stream else self._timeout)
        except TimeoutError:
            self.in_flight -= 1
            if wait.waiting:  # every connection busy: this gateway's load, not a failure
                raise Unavailable("Every connection to the upstream is busy; retry shortly.",
                                  code="overloaded") from None
            raise Timeout("The upstream did not answer in time.") from None
        except aiohttp.ClientResponseError:  # (its head, or a body's first chunk size)
            # It answered, in no HTTP aiohttp reads (a garbage status line, a bad header,
            # a broken chunked encoding): not unreachable, and its words are not quoted.
            self.in_flight -= 1
            raise EngineError(f"The upstream ({self.named}) sent an unreadable answer: "
                              "its HTTP could not be parsed.") from None
        except aiohttp.ClientError:
            self.in_flight -= 1
            raise EngineError("The upstream is unreachable.") from None
        except asyncio.CancelledError as e:
            self.in_flight -= 1
            _left(ctx, e)
            raise
        except BaseException:  # (one it does not map, e.g. aiohttp's ValueError for a
            self.in_flight -= 1  # request it will not build: still no call running)
            raise
        if (resp.status == 200 and not ctx.request.stream
                and resp.content_type == "text/event-stream"):
            try:  # (the relay ends the call's count and releases `resp`)
                return await self._whole_of_events(resp, ctx)
            except asyncio.CancelledError as e:
                _left(ctx, e)
                raise
        if resp.status != 200 or not ctx.request.stream:
            try:
                answer = await self._whole(resp, ctx.route, ctx.request.sequences,
                                           _only_if_cached(ctx))
                self._spec_finishes(answer.body["choices"], ctx.route, ctx.model, whole=True)
                _own_head(answer.body, _head(ctx), whole=True)
                EchoAsSent(ctx.request, ctx.sent)(answer.body["choices"])
                return answer
            except asyncio.CancelledError as e:
                _left(ctx, e)
                raise
            finally:
                self.in_flight -= 1
                resp.release()
        stream = Stream()
        stream.attach(self._relay(resp, ChunkAssembler(ctx.route), stream,
                                  usage=ctx.request.include_usage,
                                  running=continuous_usage(ctx.request),
                                  choices=ctx.request.sequences, head=_head(ctx),
                                  echo=EchoAsSent(ctx.request, ctx.sent)))
        primed = await stream.prime()
        if timed and stream.primed_at is not None and ctx.engine_started is not None:
            ctx.engine_ttft_s = stream.primed_at - ctx.engine_started
        return primed

    async def _whole(self, resp: aiohttp.ClientResponse, route: str, choices: int,
                     only_if_cached: bool = False) -> Completion:
        """The answer (of `choices` choices), or the error its status says (told by the
        status first: an error page need not be JSON)."""
        status = resp.status
        if 300 <= status < 400:
            raise EngineError(f"The upstream redirected the request ({status}).")
        if status == 503:
            raise UpstreamUnavailable(resp.headers)
        if status == 504:
            raise await _upstream_timeout(resp, only_if_cached, self._error_body_s())
        if status >= 500:
            raise EngineError(f"The upstream failed ({status}).")
        if status in (401, 403):  # Weir's key, not the client's: an operator's fault
            raise EngineError(f"The upstream refused this gateway's credentials ({status}).")
        if status == 429:  # Weir's quota there; its message names the account
            kind, final, too_large = await _limit_kind(resp, self._error_body_s())
            if too_large:  # (no wait lets it through: told so, as the upstream tells it)
                raise RateLimited("Request too large for the upstream's tokens per minute "
                                  "limit; no wait lets it through: reduce the input or "
                                  "the output limit.", kind="tokens",
                                  headers={"x-should-retry": "false"})
            if final:
                raise RateLimited("The upstream's rate limit refused the request and says "
                                  "not to retry it.", kind=kind,
                                  headers={"x-should-retry": "false"})
            raise RateLimited("The upstream's rate limit was reached; retry after the time "
                              "given in Retry-After.", kind=kind,
                              headers=_retry_headers(resp.headers))
        try:
            raw = await _body(resp, MAX_ANSWER_BYTES, self._error_body_s())
            if raw is None:
                raise AnswerTooLarge(MAX_ANSWER_BYTES)
            data = upstream_json(raw)
        except TimeoutError:
            if status >= 400:  # (its body stalled: the status is the answer)
                raise UpstreamError(status, {}) from None
            raise Timeout("The upstream did not answer in time.") from None
        except (aiohttp.ClientError, ValueError):
            if status >= 400:  # the client's error, in a page that says no more
                raise UpstreamError(status, {}) from None
            raise EngineError("The upstream sent an unreadable answer.") from None
        if status >= 400:
            raise UpstreamError(status, data if isinstance(data, dict) else {})
        if isinstance(data, dict):
            _drop_empty_error(data)
        if isinstance(data, dict) and "error" in data:  # an error said with a 200
            raise _error_in_200(data)
        if isinstance(data, dict) and "usage" in data and (
                data["usage"] is None or _uncounted(data["usage"])):
            # No usage, as a stream's `{}` is (not known: no count to pass on, charge or
            # cache with), and absent as OpenAI's whole answer has it (never null).
            del data["usage"]
        if not _answer_ok(data, "message" if route == "chat" else "text"):
            raise EngineError("The upstream sent an unreadable answer.")
        if data.get("usage") is not None:  # (its total, as a stream's: their sum)
            data["usage"] = whole_usage(data["usage"])
        got = {c["index"] for c in data["choices"]}
        if not set(range(choices)) <= got:
            raise ChoicesMissing(len(got & set(range(choices))), choices)
        if len(data["choices"]) != choices:  # (one not asked for, or an index twice)
            raise EngineError("The upstream sent an unreadable answer.")
        if route == "chat":
            for c in data["choices"]:
                if _nameless(c["message"].get("tool_calls") or ()):
                    raise NamelessCall()
                _own_ids(c["message"].get("tool_calls") or ())
        return Completion(data)

    async def _whole_of_events(self, resp: aiohttp.ClientResponse,
                               ctx: RequestContext) -> Completion:
        """The whole answer to a request that asked for none streamed, from an upstream
        that streamed it all the same (a 502 "unreadable answer" before): its events read
        as a stream's are (`_relay`: the same checks, ids, finish reasons and echo), and
        put together as a stored chat's stream is (`ChatAssembly`: text, refusal, calls,
        logprobs, its chunks' head), a chat's reasoning and a completion's text and
        logprobs beside it (`_Extras`), with its usage where one came."""
        stream, head = Stream(), _head(ctx)
        chat, extras = ChatAssembly(), _Extras(ctx.route)
        try:
            async with contextlib.aclosing(self._relay(
                    resp, ChunkAssembler(ctx.route), stream, usage=False, running=False,
                    choices=ctx.request.sequences, head=head,
                    echo=EchoAsSent(ctx.request, ctx.sent))) as chunks:
                async for chunk in chunks:
                    try:
                        if ctx.route == "chat":
                            chat.add(chunk)
                        extras.feed(chunk)
                    except (KeyError, TypeError, ValueError, AttributeError):
                        raise EngineError("The upstream sent an unreadable chunk.") from None
        except UpstreamDeadline:  # (a whole answer's wait, no `read_timeout_s`: `_whole`'s)
            raise Timeout("The upstream did not answer in time.") from None
        if not stream.answer:  # (`_finished` raised for an answer not whole)
            raise EngineError("The upstream sent an unreadable answer.")
        if ctx.route == "chat":
            body = chat.completion(stream.usage)
            assert body is not None  # (an answer came: its head with it)
        else:
            body = completion_body(
                id=head["id"], model=head["model"], created=head["created"],
                usage_=stream.usage,
                choices=[completion_choice(c["index"], c["text"], c["finish_reason"], None,
                                           c.get("stop_reason")) for c in stream.answer])
            if stream.usage is None:  # (absent, as a whole answer's with none is)
                body.pop("usage", None)
        extras.put(body["choices"])
        return Completion(body)

    def _error_body_s(self) -> float:
        """How long an error's body is waited for once its status came: `ERROR_BODY_S`,
        or the upstream's `read_timeout_s` where that is shorter (no byte for it: a
        stall, as a stream's is; with `read_timeout_s: 1` a stalled 429 body held the
        client 5 s)."""
        return min(ERROR_BODY_S, self.settings.read_timeout_s)

    def _tell_no_usage(self, model: str, *, streamed: bool) -> None:
        """An answer came without usage (a stream's: the upstream ignores
        `stream_options.include_usage`; a whole answer's: it sends none, or `{}`)."""
        if not self._told_no_usage:
            self._told_no_usage = True
            log.warning("upstream sent no usage for an answer (a stream's: it ignores "
                        "stream_options.include_usage): such answers' tokens go uncounted "
                        "(no usage for the client, none in weir_tokens_total; the rate "
                        "limiter keeps their reservations); told once", model=model,
                        streamed=streamed, upstream=self.named)

    def _spec_finishes(self, choices: Any, route: str, model: str, *,
                       whole: bool = False) -> None:
        """Each of `choices`' finish reason (a stream chunk's or a whole answer's) as
        the spec's enum has it (`spec_finish`), in place; one unknown is told once. A
        whole answer's choice ended: one with none (null, `""`, left out: the spec's
        enum has no null there) is `stop`, told as unknown."""
        for c in choices if isinstance(choices, list) else ():
            if not isinstance(c, dict):
                continue
            reason = c.get("finish_reason")
            if whole and not reason:  # (None or "": `_answer_ok` took no other)
                reason = "null"
            if isinstance(reason, str):
                c["finish_reason"], known = spec_finish(reason, route)
                if not known and not self._told_finish:
                    self._told_finish = True
                    log.warning("upstream sent a finish_reason outside OpenAI's enum: "
                                "relayed as stop; told once", model=model,
                                finish_reason=reason[:32], upstream=self.named)

    def _tell_past_finish(self, model: str) -> None:
        if not self._told_past_finish:
            self._told_past_finish = True
            log.warning("upstream streamed a choice on after its finish_reason: what came "
                        "after is dropped (not relayed nor cached); told once", model=model,
                        upstream=self.named)

    async def _relay(self, resp: aiohttp.ClientResponse, asm: ChunkAssembler,
                     stream: Stream, *, usage: bool, running: bool, choices: int,
                     head: dict[str, Any], echo: EchoAsSent,
                     ) -> AsyncGenerator[dict[str, Any], None]:
        """The upstream's chunks, until its `[DONE]`; `usage`: the client asked for the
        usage chunk (it is always asked of the upstream); `running`: it asked for the
        usage on every chunk too (vLLM's `continuous_usage_stats`); `choices`: how many
        the answer has (each must have ended by the `[DONE]`); `head`: what a chunk that
        lacks its id, object, created or model goes out with (`_own_head`); `echo`: a
        completion's echoed prompts, as sent.

        The usage goes out as OpenAI sends it, whatever the upstream did: in a last chunk
        of its own with no choices where the client asked for it (made here from the
        upstream's usage where it came on an answer chunk, as some servers send it), on
        no answer chunk unless it asked for the running usage (some servers send that
        unasked), nowhere where it did not ask."""
        done = relayed = False
        last: dict[str, Any] | None = None  # the upstream's usage chunk, held to the end
        text = head["objects"][0] == "text_completion"
        size = 0  # of the events so far: the answer's, as a whole answer's body is counted
        events = SseEvents()
        # (a JSON-typed body, until an event comes: some servers send their events under
        # JSON's type; one with none is a JSON body, `_json_to_stream`)
        body = bytearray() if resp.content_type == "application/json" else None
        numbered: dict[int, tuple[int, str]] = {}  # a choice's last tool call
        ids: dict[tuple[int, int], str] = {}  # (choice, call) -> the id it goes out with
        try:
            async for piece in _with_end(resp.content.iter_any()):
                if body is not None:
                    body += piece
                    if len(body) > MAX_ANSWER_BYTES:
                        raise AnswerTooLarge(MAX_ANSWER_BYTES)
                for data in events.feed(piece) if piece else events.end():
                    body = None  # (an event: a stream)
                    size += len(data)
                    if size > MAX_ANSWER_BYTES:  # (its text is kept, for the plugins)
                        raise AnswerTooLarge(MAX_ANSWER_BYTES)
                    if data == b"[DONE]":
                        if not asm.ended():  # (none came, or one came and never ended)
                            raise EngineError("The upstream's stream ended before its "
                                              "answer finished.")
                        done = _finished(asm, stream, choices)
                        break
                    chunk = upstream_json(data)
                    if not isinstance(chunk, dict):
                        raise EngineError("The upstream failed mid-stream.")
                    _drop_empty_error(chunk)
                    if "error" in chunk:  # the client's only before any answer came
                        raise ((UpstreamError.in_band(chunk) if not relayed else None)
                               or EngineError("The upstream failed mid-stream."))
                    _usage_in_place(chunk)
                    try:
                        dropped, nothing_left = _past_finish(chunk, asm.reasons)
                        if dropped:
                            self._tell_past_finish(head["model"])
                        if nothing_left:
                            continue
                        _own_head(chunk, head, whole=False)
                        self._spec_finishes(chunk.get("choices"), asm.route, head["model"])
                        _number_calls(chunk, numbered)
                        _own_delta_ids(chunk, ids)
                        echo(chunk.get("choices"))
                        asm.feed(chunk)
                        ended_nameless = any(
                            c.get("finish_reason") and c["index"] in asm.calls
                            and _nameless(asm.calls[c["index"]].result())
                            for c in chunk.get("choices") or ())
                    except (KeyError, TypeError, ValueError, AttributeError):
                        raise EngineError("The upstream sent an unreadable chunk.") from None
                    if ended_nameless:  # (before its end goes out: the answer is no whole)
                        raise NamelessCall()
                    shown = _usage_shown(chunk, usage=usage, running=running, text=text)
                    if shown == "hold":  # the usage chunk: out last (made below)
                        last = chunk
                    if shown != "send":
                        continue
                    relayed = True
                    yield chunk
                if done:
                    break
            # Closed cleanly with no `[DONE]` (some servers never send it): an answer each
            # of whose choices ended is whole all the same, its usage where it came, else
            # not known (as from an upstream that ignores `stream_options`: the cache
            # stores no answer without its usage, the rate limiter keeps its reservation).
            # One closed before a choice ended is a failure.
            if body is not None and (told := _json_to_stream(body)) is not None:
                raise told
            if not done and not asm.ended():
                raise EngineError("The upstream's stream ended before it finished.")
            done = done or _finished(asm, stream, choices)
        except aiohttp.SocketTimeoutError:  # no byte for `read_timeout_s`: stalled
            raise Timeout("The upstream's stream stalled.") from None
        except TimeoutError:  # `timeout_s`, with bytes coming: the answer's length
            raise UpstreamDeadline() from None
        except aiohttp.ClientPayloadError:  # the connection closed mid-body
            if not _broken_after_usage(asm):
                raise EngineError("The upstream stream broke.") from None
            done = _finished(asm, stream, choices)  # (after its answer: whole)
        except (aiohttp.ClientError, ValueError):
            raise EngineError("The upstream stream broke.") from None
        finally:
            if not done:
                asm.cut(stream)
            self.in_flight -= 1
            resp.release()
        if stream.usage is None:
            self._tell_no_usage(head["model"], streamed=True)
        if usage and stream.usage is not None:
            # OpenAI's shape, once, after every answer chunk: the upstream's last usage
            # chunk (each held, however early or often it came), or one made where its
            # usage came on an answer chunk
            yield {**(last or {"id": head["id"], "object": head["objects"][1],
                               "created": head["created"], "model": head["model"]}),
                   "choices": [], "usage": whole_usage(stream.usage)}


def _usage_shown(chunk: dict[str, Any], *, usage: bool, running: bool, text: bool,
                 ) -> Literal["send", "hold", "drop"]:
    """What becomes of an upstream's chunk (its usage in place: `_usage_in_place`), its
    usage as OpenAI shows it (`_relay`'s `usage`, `running`; `text`: a completion's): a
    chunk to send, its usage made so; the usage chunk, held to the end; or nothing to
    send (a usage chunk the client did not ask for, or one with none)."""
    if not usage:  # the client did not ask: its stream shows none
        if not chunk.get("choices") and "usage" in chunk:
            return "drop"  # the usage chunk (or one with none: nothing)
        chunk.pop("usage", None)  # (`null` on every other chunk)
    elif not chunk.get("choices"):
        if chunk.get("usage"):
            return "hold"
        if "usage" in chunk:  # a usage chunk with none: nothing to send
            return "drop"
    elif "usage" in chunk and not (running and chunk["usage"] is not None):
        # (kept: the usage chunk made at the end; the running usage where it was asked
        # and came) A chat chunk has it null, a completion's none (OpenAI's schema: not
        # nullable), running usage asked or not.
        if text:
            del chunk["usage"]
        else:
            chunk["usage"] = None
    elif chunk.get("usage"):  # the running usage asked for: with its total
        chunk["usage"] = whole_usage(chunk["usage"])
    return "send"


#: What a stream choice's entry holds that says nothing once its content is none.
_BARE_ENTRY = frozenset({"index", "delta", "finish_reason", "logprobs", "text"})


def _past_finish(chunk: dict[str, Any], ended: Mapping[int, str]) -> tuple[bool, bool]:
    """Take out of an upstream's chunk what it sends for a choice after that choice's
    finish reason (`ended`: each ended choice's), which OpenAI's never does: an entry
    with text, calls, reasoning or logprobs is not relayed, nor kept in the choice's
    answer (the cache stores what the client got), nor a finish reason given again (a
    choice's ends once in OpenAI's streams; a client counting them saw two). One that
    carries something else (Azure's content-filter results) passes without it. Whether
    an entry was dropped, and whether nothing is left to send (the chunk had choices,
    none is left, nor a usage).
    (An index that is no count is left for the assembler to refuse: `true` would match
    choice 1.)"""
    choices = chunk.get("choices")
    # (every chunk of one entry until a choice's finish: nothing to look at, per chunk;
    # a chunk of several may end a choice in one entry and go on with it in the next)
    if not isinstance(choices, list) or not choices or (not ended and len(choices) < 2):
        return False, False
    kept = []
    closing: set[int] = set()  # (the choices an entry of this chunk ended)
    for c in choices:
        if not (isinstance(c, dict) and is_count(i := c.get("index"))
                and (i in ended or i in closing)):
            kept.append(c)
            if isinstance(c, dict) and is_count(c.get("index")) and c.get("finish_reason"):
                closing.add(c["index"])
            continue
        delta = c.get("delta")
        if (c.get("text") or c.get("logprobs") is not None or (isinstance(delta, dict) and any(
                v for k, v in delta.items() if k != "role")) or not isinstance(delta or {}, dict)):
            continue
        if c.get("finish_reason") is not None:  # (given again: it went out once)
            c["finish_reason"] = None
            if c.keys() <= _BARE_ENTRY:  # (nothing else to pass on)
                continue
        kept.append(c)
    if len(kept) == len(choices):
        return False, False
    chunk["choices"] = kept
    return True, not kept and not chunk.get("usage")


#: The finish reasons OpenAI's spec names, by route (`function_call`: chat's, deprecated).
_SPEC_FINISH = {"chat": frozenset({"stop", "length", "tool_calls", "content_filter",
                                   "function_call"}),
                "completions": frozenset({"stop", "length", "content_filter"})}

#: Other servers' finish reasons (lowercased) as the spec's: Anthropic's, Gemini's,
#: Cohere's, Mistral's, Hugging Face's TGI, Bedrock's (as LiteLLM maps them).
_FINISH_ALIASES = {
    "end_turn": "stop", "stop_sequence": "stop", "eos": "stop", "eos_token": "stop",
    "complete": "stop", "finish_reason_unspecified": "stop", "pause_turn": "stop",
    "max_tokens": "length", "max_length": "length", "model_length": "length",
    "max_output_tokens": "length", "token_limit": "length", "compaction": "length",
    "model_context_window_exceeded": "length", "error_limit": "length",
    "tool_use": "tool_calls", "tool_call": "tool_calls", "function_call": "tool_calls",
    "malformed_function_call": "stop", "unexpected_tool_call": "stop",
    "too_many_tool_calls": "stop", "malformed_response": "stop",
    "missing_thought_signature": "stop",
    "safety": "content_filter", "recitation": "content_filter", "blocklist": "content_filter",
    "prohibited_content": "content_filter", "spii": "content_filter",
    "content_filtered": "content_filter", "guardrail_intervened": "content_filter",
    "refusal": "content_filter", "error_toxic": "content_filter", "sensitive": "content_filter",
    "language": "content_filter", "other": "content_filter", "escalation": "content_filter",
    "image_safety": "content_filter", "image_prohibited_content": "content_filter",
    "image_recitation": "content_filter", "image_other": "content_filter",
    "no_image": "content_filter",
}

#: Finish reasons that end a choice cut by the upstream's own failure (vLLM's `abort` and
#: `error`, Cohere's `ERROR`, `TIMEOUT`, `USER_CANCEL`, DeepSeek's
#: `insufficient_system_resource`, Zhipu's `network_error`): no answer to relay as
#: `stop`, nor for the cache to store as whole.
_FAILED_FINISH = frozenset({"abort", "error", "insufficient_system_resource", "network_error",
                            "timeout", "user_cancel"})


def spec_finish(reason: str, route: str) -> tuple[str | None, bool]:
    """An upstream's finish reason as OpenAI's spec has it for `route`, and whether it
    was one known: the spec's own (any case: Gemini's `STOP`), a known alias
    (`end_turn` -> `stop`, `max_tokens` -> `length`, `tool_use` -> `tool_calls`), else
    `stop` (SDKs that check the enum refused the chunk). `""` is none (not ended).
    A completion has no calls: its `tool_calls` is `stop`. One that says the upstream
    failed (`_FAILED_FINISH`) is an `EngineError`."""
    if not reason:
        return None, True
    allowed = _SPEC_FINISH["chat" if route == "chat" else "completions"]
    low = reason.strip().lower()
    if low in _FAILED_FINISH:
        raise EngineError("The upstream ended a choice in failure.")
    if low in allowed:
        return low, True
    mapped = _FINISH_ALIASES.get(low)
    if mapped is None and low in _SPEC_FINISH["chat"]:  # (a chat reason on completions)
        mapped = "stop"
    if mapped is not None:
        return (mapped if mapped in allowed else "stop"), True
    return "stop", False


def _broken_after_usage(asm: ChunkAssembler) -> bool:
    """Whether a stream whose connection broke (no clean end, no `[DONE]`) had sent all
    it was asked for: each choice's `finish_reason`, then its usage (always asked of the
    upstream, and sent after them). Broken between the two, what the upstream meant to
    send is not known (its usage, or more): a failure. A clean close is judged by its
    choices alone (`_relay`)."""
    return asm.ended() and asm.usage is not None


def _finished(asm: ChunkAssembler, stream: Stream, choices: int) -> bool:
    """A stream whose choices that came have all ended: whole (its answer and usage left
    on `stream`), or a `ChoicesMissing` where some of the `choices` asked never came, an
    `EngineError` where one not asked for came (an index past them)."""
    came = asm.came(choices)  # (each ended: it ignored `n`)
    if came is not None:
        raise ChoicesMissing(came, choices)
    if asm.texts.keys() - range(choices):  # (a choice not asked for: not stored either)
        raise EngineError("The upstream sent an unreadable chunk.")
    asm.finish(stream)
    return True


class SseEvents:
    """Server-sent events' data out of a byte stream, as the SSE spec reads them: lines
    end in LF, CRLF or CR; `data:` with or without its space; the data lines of one event
    joined by LF; comments and other fields skipped. An event left unfinished past
    `MAX_EVENT_BYTES` is not relayed (`AnswerTooLarge`). Each piece is scanned once and
    a line's pieces are kept until its end, not joined again per piece (a long line in
    small pieces took time in the square of its length)."""

    def __init__(self) -> None:
        self._line = bytearray()  # the line under way
        self._after_cr = False  # the last piece ended a line with a CR: an LF next is its
        self._data: list[bytes] = []
        self._size = 0  # of `_data`

    def feed(self, piece: bytes) -> list[bytes]:
        """The data of each event that `piece` completes."""
        out: list[bytes] = []
        at = 0
        if not piece:
            return out
        if self._after_cr:
            self._after_cr = False
            if piece.startswith(b"\n"):  # (a CRLF split between two pieces)
                at = 1
        for end in _LINE_END.finditer(piece, at):
            if self._line:
                self._line += piece[at:end.start()]
                line = bytes(self._line)
                self._line.clear()
            else:
                line = piece[at:end.start()]
            self._line_done(line, out)
            at = end.end()
        if at < len(piece):
            self._line += piece[at:]
        elif piece.endswith(b"\r"):
            self._after_cr = True
        if self._size + len(self._line) > MAX_EVENT_BYTES:
            raise AnswerTooLarge(MAX_EVENT_BYTES)
        return out

    def _line_done(self, line: bytes, out: list[bytes]) -> None:
        if not line:
            data = b"\n".join(self._data).strip()
            if data:  # (an event of empty data is not dispatched)
                out.append(data)
            self._data, self._size = [], 0
        elif line.startswith(b"data:"):
            value = line[5:]
            self._data.append(value[1:] if value.startswith(b" ") else value)
            self._size += len(value)
            if self._size > MAX_EVENT_BYTES:
                raise AnswerTooLarge(MAX_EVENT_BYTES)

    def end(self) -> list[bytes]:
        """The body ended (a last line with no end is no line: nothing more)."""
        return []


#: A line's end in an event stream: CRLF, LF or CR.
_LINE_END = re.compile(rb"\r\n|\n|\r")


async def _with_end(pieces: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """`pieces`, then an empty one for the end."""
    async for piece in pieces:
        yield piece
    yield b""


def _number_calls(chunk: dict[str, Any], last: dict[int, tuple[int, str]]) -> None:
    """Give each tool call delta its `index` where the upstream left it out (some servers
    send each call whole, unnumbered, in a chunk of its own; some repeat its id on every
    piece): a delta with an id other than the last call's starts the next call, any other
    goes on with the last. `last`: each choice's last call (index, id). An index given
    that is no count (`true`, `-1`, `0.5`) is a `TypeError`: the chunk is unreadable."""
    for c in chunk.get("choices") or ():
        choice = c["index"]
        for d in (c.get("delta") or {}).get("tool_calls") or ():
            before, before_id = last.get(choice, (-1, ""))
            call_id = d.get("id") or ""
            if d.get("index") is not None:  # (a count, or the chunk is unreadable)
                if not is_count(i := d["index"]):
                    raise TypeError("a tool call's index")
            elif before < 0 or (call_id and call_id != before_id):
                i = before + 1
            else:
                i = before
            d["index"] = i
            last[choice] = (i, call_id or (before_id if i == before else ""))
            _no_nulls(d)


def _no_nulls(call: dict[str, Any]) -> None:
    """A tool call delta without the nulls some servers send for what a piece lacks
    (`function: null`, `type: null`, a function's `name: null`): the spec's chunk has
    them absent, never null (an SDK checking it refused the chunk). Its `id` is
    `_own_delta_ids`'."""
    for key in ("type", "function"):
        if key in call and call[key] is None:
            del call[key]
    fn = call.get("function")
    if isinstance(fn, dict):
        for key in ("name", "arguments"):
            if key in fn and fn[key] is None:
                del fn[key]


async def _body(resp: aiohttp.ClientResponse, most: int,
                error_s: float | None = None) -> bytearray | None:
    """The response's body, as its pieces come; None past `most` bytes (read no further).
    An error's (status 400 or more) within `error_s` (`ERROR_BODY_S` where not given;
    TimeoutError past it)."""
    raw = bytearray()
    if error_s is None:
        error_s = ERROR_BODY_S
    async with asyncio.timeout(error_s if resp.status >= 400 else None):
        async for piece in resp.content.iter_any():
            raw += piece
            if len(raw) > most:
                return None
    return raw


def retry_after_s(value: str, default: int = 1) -> int:
    """An upstream's `Retry-After` in whole seconds: ASCII digits or an HTTP date (from
    now), at most `MAX_RETRY_AFTER_S`; anything else (`²`, Arabic-Indic digits, a number
    or a date that does not parse), and a wait of none (`0`, a date passed), is
    `default`: told on as `Retry-After: 0`, clients retried at once, in a loop (OpenAI's
    SDK reads a wait of none as none given, and waits its own backoff)."""
    value = value.strip()
    if value.isascii() and value.isdigit():
        digits = value.lstrip("0")  # (a number of any length: not read whole)
        if not digits:
            return default
        return MAX_RETRY_AFTER_S if len(digits) > 9 else min(int(digits), MAX_RETRY_AFTER_S)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return default
    if when.tzinfo is None:  # (`-0000`: UTC, as HTTP dates are)
        when = when.replace(tzinfo=UTC)
    left = math.ceil((when - datetime.now(UTC)).total_seconds())
    return default if left <= 0 else min(left, MAX_RETRY_AFTER_S)


def _tokens(usage: Any) -> tuple[int | None, int | None]:
    """An upstream's usage as (prompt, completion) tokens; None where it said none (not
    0: a span would show it as counted)."""
    u = usage if isinstance(usage, dict) else {}
    prompt, completion = u.get("prompt_tokens"), u.get("completion_tokens")
    return as_count(prompt), as_count(completion)


def _usage_in_place(chunk: dict[str, Any]) -> None:
    """An upstream's chunk with its usage where OpenAI's has it, its `usage`: none for
    one that counts nothing (`{}`, as `null` is), Groq's (its `x_groq.usage`) where it
    has none of its own."""
    if _uncounted(chunk.get("usage")):
        chunk["usage"] = None
    groq = chunk.get("x_groq")
    if chunk.get("usage") is None and isinstance(groq, dict) and usage_ok(groq.get("usage")):
        chunk["usage"] = groq["usage"]


def _uncounted(usage: Any) -> bool:
    """Whether an upstream's usage is a dict that counts nothing, neither the prompt's
    tokens nor the completion's (`{}`): no usage, as `null` is, where one that holds a
    count must be whole (`usage_ok`)."""
    return isinstance(usage, dict) and not {"prompt_tokens", "completion_tokens"} & set(usage)


def _retry_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """`Retry-After` and `retry-after-ms` (the OpenAI SDK reads it first) for an
    upstream's: its `retry-after-ms` where it sends one (a Weir upstream, OpenAI's API:
    the finer; one sent alone was dropped, and a wait of 2.5 s told as 1 s brought the
    client back early), else its `Retry-After` (`retry_after_s`). A `retry-after-ms` of
    none (`0`), or one that is no number (`-5`, `soon`), is as none sent. Formed as every
    other wait Weir tells (`errors.retry_headers`: never under 1 s)."""
    wait = _decimal(headers.get("retry-after-ms", ""))
    if wait > 0:
        return retry_headers(min(wait, MAX_RETRY_AFTER_S * 1000))
    # (`Retry-After: 1.5`, outside RFC 9110's digits but sent by some servers: 1.5 s, not
    # the default 1 s that had the client back early; told rounded up)
    seconds = headers.get("retry-after", "")
    if "." in seconds and (wait := _decimal(seconds)) > 0:
        return retry_headers(min(wait * 1000, MAX_RETRY_AFTER_S * 1000))
    return retry_headers(retry_after_s(seconds) * 1000)


def _decimal(value: str) -> float:
    """A header's plain decimal number (`2500`, `0.2`: ASCII digits, one point), 0 where
    it is none (`-5`, `soon`, `1e3`); one of more than 12 whole digits is infinite."""
    value = value.strip()
    whole, _, part = value.partition(".")
    if not (whole.isascii() and whole.isdigit() and (not part or (part.isascii()
                                                                  and part.isdigit()))):
        return 0.0
    return float(value) if len(whole) <= 12 else math.inf


def _error_in_200(data: dict[str, Any]) -> WeirError:
    """What an answer with an `error` (`_drop_empty_error`'d) said with a 200 is: the
    client's error where it says so (`UpstreamError.in_band`), else the upstream's."""
    return UpstreamError.in_band(data) or EngineError("The upstream failed (an error in a "
                                                      "200 answer).")


def _json_to_stream(body: bytes | bytearray) -> WeirError | None:
    """What a JSON body with no event in it, sent to a stream request, says: an error
    said with a 200 (`_error_in_200`), or a whole answer from a server that ignores
    `stream`; None where it is no JSON object (a stream that ended before it began)."""
    try:
        data = upstream_json(body)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    _drop_empty_error(data)
    if "error" in data:
        return _error_in_200(data)
    return EngineError("The upstream answered a stream request with a whole answer.")


def _drop_empty_error(data: dict[str, Any]) -> None:
    """An answer's or chunk's `error` of none (`null`, `{}`, `""`, `false`: some proxies
    always send the key) left out: no error, as OpenAI's SDK reads only a truthy one as
    an error, and not passed on."""
    if "error" in data and not data["error"]:
        del data["error"]


def upstream_json(raw: bytes | bytearray) -> Any:
    """JSON from the upstream, decoded: any failure to decode it (not JSON, not UTF-8,
    nested past what the decoder's recursion takes) is a `ValueError`, which each caller
    reads as an unreadable answer."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def _only_if_cached(ctx: RequestContext) -> bool:
    return "only-if-cached" in ctx.headers.get("cache-control", "").lower()


async def _limit_kind(resp: aiohttp.ClientResponse, error_s: float
                      ) -> tuple[str, bool, bool]:
    """An upstream 429's kind, `tokens` or `requests` (OpenAI's type), as its body says;
    `requests` where it says neither (its message, naming its account, is not passed on).
    Then whether no wait lets it through: it says not to retry (`x-should-retry: false`,
    as a Weir upstream and the OpenAI API send it), or it refused a request larger than
    its limit on its own ("Request too large ...", Weir's and OpenAI's message: the
    third value). `error_s`: how long its body is waited for (`_body`)."""
    final = resp.headers.get("x-should-retry", "").strip().lower() == "false"
    too_large = False
    try:
        raw = await _body(resp, 1 << 16, error_s)  # (an error's body: small, or none of ours)
        err = upstream_json(raw or b"").get("error") or {}
        kind = err.get("type")
        message = err.get("message")
        too_large = isinstance(message, str) and message.startswith("Request too large")
    except (aiohttp.ClientError, ValueError, AttributeError, TimeoutError):
        kind = None
    return ("tokens" if kind == "tokens" else "requests"), final or too_large, too_large


async def _upstream_timeout(resp: aiohttp.ClientResponse, only_if_cached: bool,
                            error_s: float) -> Timeout:
    """An upstream 504: its own `not_cached` (a Weir upstream asked `only-if-cached`, the
    client's `Cache-Control` passed on), or any 504 to a request that asked for a cached
    answer only (an HTTP cache on the way says so in its own words), is the client's
    answer, which the breaker does not count; any other is the upstream timing out.
    `error_s`: how long its body is waited for (`_body`)."""
    try:
        raw = await _body(resp, 1 << 16, error_s)  # (an error's body: small, or none of ours)
        err = upstream_json(raw or b"").get("error") or {}
        code = err.get("code")
    except (aiohttp.ClientError, ValueError, AttributeError, TimeoutError):
        code = None
    if code == "not_cached":
        return NotCachedUpstream(str(err.get("message") or "No cached answer upstream."))
    if only_if_cached:
        return NotCachedUpstream("No cached answer upstream for this request (it asked for "
                                 "one only: `Cache-Control: only-if-cached`).")
    return Timeout("The upstream timed out (504).")


class NotCachedUpstream(NotCached):
    """An upstream Weir had no cached answer for a request that asked for one only: the
    client's own choice (its `Cache-Control: only-if-cached`), never the engine's fault."""


class _Extras:
    """What `ChatAssembly` does not keep of a streamed answer put together whole
    (`Upstream._whole_of_events`): a chat choice's reasoning (`reasoning_content`,
    `reasoning`, as vLLM's whole answer carries it), a completion choice's logprobs (its
    `tokens`, `token_logprobs`, `top_logprobs` and `text_offset` joined)."""

    _LISTS = ("tokens", "token_logprobs", "top_logprobs", "text_offset")
    _TEXTS = ("reasoning_content", "reasoning")

    def __init__(self, route: str) -> None:
        self.chat = route == "chat"
        self.logprobs: dict[int, dict[str, list[Any]]] = {}
        self.texts: dict[int, dict[str, list[str]]] = {}

    def feed(self, chunk: dict[str, Any]) -> None:
        for c in chunk.get("choices") or ():
            i = c["index"]
            if not self.chat and (lp := c.get("logprobs")) is not None:
                if not isinstance(lp, dict):
                    raise TypeError("a choice's logprobs")
                kept = self.logprobs.setdefault(i, {})
                for key in self._LISTS:
                    if (part := lp.get(key)) is not None:
                        if not isinstance(part, list):
                            raise TypeError("a choice's logprobs")
                        kept.setdefault(key, []).extend(part)
            delta = (c.get("delta") or {}) if self.chat else {}
            for key in self._TEXTS:
                if (piece := delta.get(key)) is not None:
                    if not isinstance(piece, str):
                        raise TypeError("a delta's text")
                    self.texts.setdefault(i, {}).setdefault(key, []).append(piece)

    def put(self, choices: list[dict[str, Any]]) -> None:
        """Give each of `choices` (the whole answer's) what came for it."""
        for c in choices:
            i = c["index"]
            if i in self.logprobs:
                c["logprobs"] = {key: self.logprobs[i].get(key, []) for key in self._LISTS}
            for key, pieces in self.texts.get(i, {}).items():
                c["message"][key] = "".join(pieces)


def _nameless(calls: Any) -> bool:
    """Whether a tool call of `calls` (a whole answer's, or a choice's put together from
    its stream) has no name: a call naming no function is no call a client can run, so
    the answer is unusable (a 502, relayed whole nowhere and never cached)."""
    return any(not (call.get("function") or {}).get("name") for call in calls)


class NamelessCall(GatewayFault):
    """An answer holding a tool call without a name (`_nameless`): a 502 `engine_error`,
    never cached, but not counted by the breaker: what the model calls is the request's
    to steer (its tools, its prompt), so one tenant's requests must not open the circuit
    for every tenant while the upstream answers everything else (as `ChoicesMissing`)."""

    status = 502
    default_code = "engine_error"

    def __init__(self) -> None:
        super().__init__("The upstream sent a tool call without a name.")


def _own_ids(calls: Any) -> None:
    """A whole answer's calls each with an id of its own: an empty or repeated one (some
    servers' parsers make them so) is replaced, or the client sending the turn back would
    be refused (a call id is one call: OpenAI's rule, and Weir's)."""
    seen: set[str] = set()
    for call in calls:
        if isinstance(call, dict):
            if not isinstance(call.get("id"), str) or not call["id"] or call["id"] in seen:
                call["id"] = new_call_id()
            seen.add(call["id"])


def _own_delta_ids(chunk: dict[str, Any], ids: dict[tuple[int, int], str]) -> None:
    """`_own_ids` for a stream: a call's id (it may come again on each of its pieces) is
    replaced where empty or another call's of the choice, the same way each time; a call
    whose first piece has none gets one."""
    for c in chunk.get("choices") or ():
        for d in (c.get("delta") or {}).get("tool_calls") or ():
            place = (c["index"], d["index"])
            if "id" not in d:  # (a call's later pieces need none; its first does)
                if place not in ids:
                    ids[place] = d["id"] = new_call_id()
                continue
            given = d["id"] if isinstance(d["id"], str) else ""
            if place not in ids:
                taken = {v for (choice, _), v in ids.items() if choice == place[0]}
                ids[place] = given if given and given not in taken else new_call_id()
            d["id"] = ids[place]


def _head(ctx: RequestContext) -> dict[str, Any]:
    """What an answer to `ctx` that lacks its own id, created or model goes out with."""
    whole, chunk, prefix = _OBJECTS[ctx.route]
    return {"id": new_id(prefix), "created": now(), "model": ctx.model,
            "objects": (whole, chunk)}


#: The tiers OpenAI's schema lists for an answer's `service_tier` (null aside).
_TIERS = frozenset(get_args(ServiceTier))


def _own_head(data: dict[str, Any], head: dict[str, Any], *, whole: bool) -> None:
    """Give an upstream's answer (or chunk) the id, object, created and model OpenAI's
    schema requires of it, where the upstream left one out or sent another type, and
    the nullable fields it requires (`finish_reason`, `logprobs`, `refusal`) as null
    where left out: an OpenAI-compatible server may omit them (the SDK's models, a
    cache's replay and a stored completion read them). A stream's chunks take the
    first's, as OpenAI's share one id; `object` is always the route's. A
    `system_fingerprint` that is no string (vLLM's null) and a `service_tier` outside
    the spec's enum (null aside) are dropped: the schema refuses both. (A whole
    answer's choices were checked by `_answer_ok`; a chunk's are in the relay's check.)"""
    data["object"] = head["objects"][0 if whole else 1]
    if "system_fingerprint" in data and not isinstance(data["system_fingerprint"], str):
        del data["system_fingerprint"]
    tier = data.get("service_tier")
    if tier is not None and not (isinstance(tier, str) and tier in _TIERS):
        del data["service_tier"]
    first = not head.get("seen")
    head["seen"] = True
    for key, kind in (("id", str), ("created", int), ("model", str)):
        value = data.get(key)
        if type(value) is kind and value != "":
            if first:  # the later chunks that lack it take the first's
                head[key] = value
        else:
            data[key] = head[key]
    text = head["objects"][0] == "text_completion"
    for c in data.get("choices") or ():  # (their nullable fields OpenAI's schema requires)
        c.setdefault("finish_reason", None)
        if not whole and not text:
            if not c.get("delta"):  # (required: an object; `null`, `[]`, `""` are none)
                c["delta"] = {}
            elif isinstance(delta := c["delta"], dict):  # (absent in the spec, not null)
                for key in ("role", "tool_calls"):
                    if key in delta and delta[key] is None:
                        del delta[key]
                if delta.get("role", "assistant") != "assistant":  # (an answer's: `model`)
                    delta["role"] = "assistant"
        if whole or text:
            c.setdefault("logprobs", None)
        if whole and not text:
            m = c["message"]
            m.setdefault("content", None)
            m.setdefault("refusal", None)
            # (what some servers leave out or send null that the spec requires, or has
            # absent: the role, a call's type, `tool_calls: null`; a role not the
            # answer's, `model`, is the answer's all the same)
            if m.get("role") != "assistant":
                m["role"] = "assistant"
            if "tool_calls" in m and m["tool_calls"] is None:
                del m["tool_calls"]
            for call in m.get("tool_calls") or ():
                if call.get("type") is None:
                    call["type"] = "function"


def _answer_ok(data: Any, kind: str) -> bool:
    """Whether a whole answer has OpenAI's shape where Weir reads it (its choices, their
    text or message, and its usage): what a cache stores and replays, and a relay passes
    on as an answer. `kind`: `message` (chat) or `text` (completions)."""
    if not isinstance(data, dict) or "error" in data:
        return False
    choices, usage = data.get("choices"), data.get("usage")
    if not isinstance(choices, list) or not choices or not (usage is None or usage_ok(usage)):
        return False
    for c in choices:
        if not isinstance(c, dict) or not is_count(c.get("index")):
            return False
        if not isinstance(c.get("finish_reason", ""), str | None):  # (`false`: no none)
            return False
        if kind == "text":
            if not isinstance(c.get("text"), str):
                return False
            continue
        m = c.get("message")
        if not isinstance(m, dict) or not isinstance(m.get("content"), str | None):
            return False
        calls = m.get("tool_calls") or []
        if not isinstance(calls, list) or not all(
                isinstance(t, dict) and isinstance(t.get("id"), str)
                and isinstance(t.get("function"), dict)
                and isinstance(t["function"].get("name"), str | None)  # (`_nameless`)
                and isinstance(t["function"].get("arguments"), str) for t in calls):
            return False
    return True


#: An error type in OpenAI's words (`invalid_request_error`, `not_found_error`, ...).
_OPENAI_TYPE = re.compile(r"[a-z]+(?:_[a-z]+)*_error")


def _text(value: Any) -> str | None:
    """An upstream error's `param` or `code` as OpenAI's schema has them: a string."""
    return None if value is None else str(value)


def _left(ctx: RequestContext, e: asyncio.CancelledError) -> None:
    """A request cut (its client gone, its deadline) while the upstream had it: what it
    spent comes only with the whole answer, which is never read, so the rate limiter
    charges its reservation (OpenAI bills an answer whose client left). A drain's cut is
    a 503 that says to retry elsewhere: nothing is charged."""
    if e.args != (SHUTDOWN,):
        ctx.spent_unknown = True
