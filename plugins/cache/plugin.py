"""The cache's policy: which requests it answers, and how it stores and replays them.

Where entries live (L1, Redis, the vector index, caps, purges) is the store's concern
(store.py); this plugin decides, coalesces identical misses, captures and replays.

Per request: decide (bypass when sensitive, non-deterministic, asking for logprobs, or
`Cache-Control: no-cache/no-store`; `max-age=N`: only answers at most N seconds old; see
`request_directives`) -> exact lookup (L1, then L2, whose hit fills L1) ->
semantic lookup (embed the last user message, search the request's own partition, then
the similarity threshold and the near-miss guard) -> on a miss, one generation per key
(concurrent identical misses wait for the leader) -> capture the answer if it ended
normally and store it (L1 at once; Redis, the vector index and the user's cap in the
background, so a miss pays nothing for them).

Responses carry `x-weir-cache: exact | semantic | miss | bypass | stale | coalesced`
and `Age` on a hit, and `x-weir-cache-key` (the key of the entry that answered or is to
hold the answer: a digest, for purges by `key`) wherever it looked up or stored.
`miss`: looked up, not found, generated (and stored where it may be); `bypass`: not
looked up (sensitive, sampled, `no-cache`, `max-age=0`; an answer a client asked fresh
with `no-cache` is still stored in place of what was, unless `no-store`); `coalesced`:
answered by an identical request's generation. A 504 `not_cached`
(`only-if-cached`) says `miss` where nothing was found, `bypass` where the
request may not be answered from the cache. Similarity scores go to metrics and debug
logs only: exposing them would let a client probe what other entries say.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, ClassVar, NamedTuple

from aiohttp import web

from proxy.chain import (
    FALLBACK_HEADER,
    BasePlugin,
    Completion,
    Next,
    Outcome,
    Reply,
    Services,
    Stream,
)
from proxy.context import RequestContext, Within
from proxy.errors import DeadlineExceeded, NotCached
from proxy.protocol import ChatCompletionRequest
from proxy.tasks import detach
from proxy.telemetry import get_logger, labelled

from . import admin
from .config import CacheConfig
from .entry import (
    Entry,
    asked_with,
    capture_body,
    captured_usage,
    choices_ok,
    replay_body,
    replay_order,
    replay_stream,
)
from .keys import (
    asked_digest,
    exact_key,
    prompt_text,
    request_text,
    scope_id,
    semantic_parts,
)
from .metrics import CacheMetrics
from .store import CacheStore, Lookup, SemanticKey

log = get_logger("weir.cache")
HEADER = "x-weir-cache"
#: The key of the entry an answer is (or, once generated, is stored as) in the cache: an
#: opaque digest, never the prompt, which `POST /admin/cache/purge {"key": ...}` takes.
KEY_HEADER = "x-weir-cache-key"
#: A leader's settle value when its client went away: a waiter takes the lead.
ABANDONED = object()
#: What a generation settles for the identical requests waiting on it.
Settle = asyncio.Future[Entry | object | None]


async def _discard(gen: asyncio.Future[Reply]) -> None:
    """Drop a generation nobody will read: cancel it, or close the stream it made (it
    may have made one in the instant it was cancelled). Done to the end in a task of its
    own, even if the caller is cancelled meanwhile: an unclosed stream would hold its
    engine slot, rate-limit lease and breaker permit for good."""
    await asyncio.shield(detach(_drop(gen)))


async def _drop(gen: asyncio.Future[Reply]) -> None:
    gen.cancel()
    await asyncio.wait((gen,))
    if gen.cancelled() or gen.exception() is not None:
        return  # nothing to close
    reply = gen.result()
    if isinstance(reply, Stream):
        await reply.aclose()


async def _take(gen: asyncio.Future[Reply]) -> Reply:
    """`await gen`, but a caller cancelled as `gen` ends does not drop the reply it made
    (awaiting a task that has just finished, the cancellation wins and the result would
    be lost): the reply is discarded properly."""
    try:
        return await asyncio.shield(gen)
    except asyncio.CancelledError:
        await _discard(gen)
        raise


#: Finish reasons of an answer that ended on its own or at its length limit.
_WHOLE = frozenset({"stop", "tool_calls", "length"})


class CachePlugin(BasePlugin[CacheConfig]):
    name: ClassVar[str] = "cache"
    Config = CacheConfig

    def __init__(self, config: CacheConfig, services: Services) -> None:
        super().__init__(config, services)
        self.cfg = config
        self.metrics = CacheMetrics(services.metrics.registry, config.semantic.threshold)
        self.embedder = services.embedder if config.semantic.enabled else None
        if config.semantic.enabled and self.embedder is None:
            log.warning("semantic cache needs `embeddings.enabled: true`; exact only")
        self.store = CacheStore(config, self.metrics, self.embedder)
        self._sensitive = [re.compile(p) for p in config.sensitive_patterns]
        #: The model's sampling defaults are filled into a request before the chain (the
        #: in-process engine's; an upstream applies its own): a penalty left out is 0.
        self._defaults_filled = services.settings.engine.kind != "upstream"
        self._inflight: dict[str, asyncio.Future[Entry | object | None]] = {}
        self._leaders: dict[str, RequestContext] = {}  # key -> its leader's request
        self._active = 0  # requests in flight: none, and the store may embed at leisure
        self.store.idle = lambda: not self._active

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        await self.store.start()

    async def close(self) -> None:
        await self.store.close()

    def routes(self) -> list[tuple[str, str, Callable[[web.Request], Any]]]:
        return admin.routes(self.store, self.in_flight)

    def health(self) -> dict[str, Any] | None:
        redis = self.store.redis
        return {"redis": None if redis is None else (
            "down" if not redis.healthy else "full" if redis.full else "up")}

    def in_flight(self) -> int:
        """Generations other identical requests may be waiting on."""
        return len(self._inflight)

    # ------------------------------------------------------------------ decision

    def _decide(self, ctx: RequestContext) -> Directives:
        """What the request lets the cache do: its own directives, less what its content
        rules out."""
        d = request_directives(ctx.headers)
        req = ctx.request
        never = (ctx.sensitive
                 or (self.cfg.deterministic_only
                     and not (req.greedy_anywhere or req.seed is not None))
                 # cached answers carry no logprobs
                 or (isinstance(req, ChatCompletionRequest) and bool(req.logprobs))
                 or (not isinstance(req, ChatCompletionRequest) and req.logprobs is not None)
                 or self._matches_sensitive(ctx))
        if never:
            return d._replace(read=False, write=False)
        return d._replace(write=d.write and "injection" not in ctx.flags)

    # -------------------------------------------------------------------- request

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        self._active += 1
        try:
            reply = await self._serve(ctx, call_next)
        except BaseException:
            self._settled()
            raise
        if isinstance(reply, Stream):
            reply.on_end(lambda _stream, _outcome: self._settled())
        else:
            self._settled()
        return reply

    def _settled(self) -> None:
        self._active -= 1
        if not self._active:
            self.store.wake()

    async def _serve(self, ctx: RequestContext, call_next: Next) -> Reply:
        d = self._decide(ctx)
        if d.only_if_cached and not d.read:
            ctx.response_headers[HEADER] = "bypass"  # (its 504 carries it)
            raise _not_cached()
        if not d.read and not d.write:
            labelled(self.metrics.lookups, "all", "bypass").inc()
            ctx.response_headers[HEADER] = "bypass"
            return await call_next(ctx)
        if not d.read:
            return await self._look_up(ctx, call_next, d)
        try:
            return await self._look_up(ctx, call_next, d)
        finally:
            # Once per request that read the cache: a hit when a layer answered it
            # (exact, L1 or L2, or semantic), else a miss (an identical request's
            # generation, a stale fallback, the engine, an error or a client gone).
            labelled(self.metrics.lookups, "all", "hit" if ctx.response_headers.get(HEADER)
                     in ("exact", "semantic") else "miss").inc()

    async def _look_up(self, ctx: RequestContext, call_next: Next, d: Directives) -> Reply:
        read, write, max_age = d.read, d.write, d.max_age
        answers = self.services.terminal.answer_digest_for(ctx.model)
        key = exact_key(ctx, self.cfg.scope, answers, defaults_filled=self._defaults_filled)
        ctx.response_headers[KEY_HEADER] = key  # (a hit says its entry's: `_hit`)
        scope = scope_id(ctx.principal, self.cfg.scope)
        if read and (entry := await self.store.get(key, scope, max_age=max_age)) is not None:
            return await self._hit(ctx, entry, "exact")
        sem = (semantic_parts(ctx, self.cfg.scope, answers,
                              defaults_filled=self._defaults_filled)
               if self.embedder is not None else None)
        if sem is not None and not (self.cfg.semantic.min_chars <= len(sem[1])
                                    <= self.cfg.semantic.max_chars):
            sem = None  # never embedded: no lookup, no entry
        look: Lookup | None = None
        qgate: str | None = None
        if read:
            # A generation for this very request under way answers it (below): no lookup.
            qgate = self.store.question_gate(sem) if sem is not None else None
            if sem is not None and not self.store.may_serve(sem[0], qgate):
                labelled(self.metrics.lookups, "semantic", "miss").inc()  # nothing to embed
                self.metrics.gated.inc()
            elif sem is not None and not (write and self._leading(key)):
                look = asyncio.ensure_future(self.store.lookup(
                    sem, scope, question_gate=qgate, max_age=max_age))
                if not write or d.only_if_cached or await self._given_head_start(look):
                    _, entry = await look  # nothing to race: wait (within its deadline)
                    if entry is not None:
                        return await self._semantic_hit(ctx, key, await self._as_asked(
                            ctx, entry),
                                                  write)
                elif self._leading(key):  # one started meanwhile: wait for it instead
                    look.cancel()
                    look = None
        else:  # not read (`no-cache`), but stored in place of what was: still a bypass
            ctx.response_headers[HEADER] = "bypass"
        if d.only_if_cached:  # (read: else refused above) looked up, and nothing found
            if look is not None:
                look.cancel()
            ctx.response_headers[HEADER] = "miss"
            raise _not_cached()
        ctx.response_headers.setdefault(HEADER, "miss")
        if not write:
            return await call_next(ctx)
        joined = time.time()
        while self.cfg.coalesce and (leader := self._inflight.get(key)) is not None:
            if self._behind(ctx, key):
                return await call_next(ctx)
            led = await self._follow(ctx, leader)
            if isinstance(led, Entry):
                now = time.time()
                # The leader's own generation (made after this request came), or an
                # answer from the cache (a paraphrase's hit the leader took) that this
                # request may read: its no-cache or max-age applies to that one.
                if led.created >= joined or (read and led.young(now, max_age)):
                    self.metrics.coalesced.inc()
                    ctx.response_headers[HEADER] = "coalesced"
                    ctx.response_headers["Age"] = str(led.age(now))
                    return await self._reply(ctx, led)
                led = None
            if led is None:
                return await call_next(ctx)  # the leader failed: generate for ourselves
            # ABANDONED: the leader's client went away; the first waiter to get here
            # takes the lead, the others wait on it.
        if look is not None and (done := self.store.just_stored(key, scope, max_age)) is not None:
            # An identical request's generation ended while this one's lookup ran: the
            # lookup (an embedding perhaps not begun) is of no more use.
            look.cancel()
            self.metrics.coalesced.inc()
            ctx.response_headers[HEADER] = "coalesced"
            return await self._reply(ctx, done)
        fut: Settle = asyncio.get_running_loop().create_future()
        if self.cfg.coalesce:
            self._inflight[key] = fut
            self._leaders[key] = ctx
        if look is not None and not look.done():
            return await self._race(ctx, call_next, key, scope, sem, qgate, look, fut)
        return await self._lead(ctx, call_next, key, scope, sem, qgate, look, fut)

    async def _follow(self, ctx: RequestContext, leader: Settle) -> Entry | object | None:
        """The identical request's outcome, waited for within this request's own deadline
        (not the leader's: a follower asking for less time gets its 504 on time)."""
        ctx.waiting()
        try:
            async with Within(ctx.deadline):
                return await asyncio.shield(leader)
        except DeadlineExceeded:
            ctx.cut_at_deadline()  # (counted as one queued for the engine is)
            raise

    def _behind(self, ctx: RequestContext, key: str) -> bool:
        """Whether waiting on `key`'s leader could hold this request behind others: the
        leader is still queued for the engine (admission), and its role, which the queue
        orders by, is another (an admin's identical question must not wait out a user
        queue). It then generates for itself."""
        lead = self._leaders.get(key)
        return (lead is not None and lead.engine_started is None
                and lead.principal.role != ctx.principal.role)

    def _leading(self, key: str) -> bool:
        """Whether a generation for `key` is under way that identical requests wait on."""
        return self.cfg.coalesce and key in self._inflight

    async def _given_head_start(self, look: Lookup) -> bool:
        """Whether the lookup answered within its head start (it is cancelled with us)."""
        try:
            await asyncio.wait((look,), timeout=self.cfg.semantic.head_start_ms / 1000)
        except asyncio.CancelledError:
            look.cancel()
            raise
        return look.done()

    async def _race(self, ctx: RequestContext, call_next: Next, key: str, scope: str,
                    sem: SemanticKey | None, qgate: str | None, look: Lookup, fut: Settle,
                    ) -> Reply:
        """Generate while the semantic lookup (slow: a busy embedder) finishes: a miss
        never waits for it. Whichever answers first wins: a hit drops the generation and
        answers from the cache, with the headers the request had before generating; a
        generation that has its first output (a primed stream, a whole answer) goes out,
        and the lookup only feeds the stored entry its vector. A generation that failed
        before any output waits for the lookup (within its deadline): a hit still serves."""
        headers = dict(ctx.response_headers)
        gen = asyncio.ensure_future(self._lead(ctx, call_next, key, scope, sem, qgate, look,
                                               fut))
        try:
            await asyncio.wait((look, gen), return_when=asyncio.FIRST_COMPLETED)
            if not look.done() and gen.exception() is None:
                labelled(self.metrics.overlapped, "generated").inc()
                return gen.result()
            _, entry = await look  # bounded by the lookup's own deadline
        except BaseException:
            look.cancel()
            await _discard(gen)
            raise
        if entry is None:
            labelled(self.metrics.overlapped, "generated").inc()
            return await _take(gen)
        labelled(self.metrics.overlapped, "cancelled").inc()
        try:
            entry = await self._as_asked(ctx, entry)
        finally:  # (cut meanwhile: the waiters count their own, and the generation ends)
            if not fut.done():
                fut.set_result(entry)  # requests waiting on this generation take the hit
            await _discard(gen)
        ctx.response_headers.clear()
        ctx.response_headers.update(headers)
        return await self._semantic_hit(ctx, key, entry, True)

    async def _lead(self, ctx: RequestContext, call_next: Next, key: str, scope: str,
                    sem: SemanticKey | None, qgate: str | None, look: Lookup | None,
                    fut: Settle) -> Reply:
        """Generate for `key`, settle `fut` (the requests waiting on it) and store the
        answer; the question's vector comes from `look` (or is embedded again), its
        guard gate from the lookup (`qgate`; None: worked out when needed)."""

        def settle(entry: Entry | object | None) -> None:
            if not fut.done():
                fut.set_result(entry)
            if self._inflight.get(key) is fut:
                del self._inflight[key]
                self._leaders.pop(key, None)

        started = time.time()
        try:
            reply = await call_next(ctx)
        except (asyncio.CancelledError, DeadlineExceeded):
            settle(ABANDONED)  # the leader's own client or deadline: not the question's
            raise
        except BaseException:
            settle(None)
            raise
        if FALLBACK_HEADER in reply.headers:
            settle(None)
            return reply
        if isinstance(reply, Completion):
            entry = self._make_entry(ctx, key, scope, capture_body(
                reply.body, ctx.route, reply.order, reply.usages), started)
            settle(entry)
            if entry is not None and self._storable(entry, started):
                self.store.put(entry, sem, look, qgate)
            return reply

        def ended(stream: Stream, outcome: Outcome) -> None:
            if outcome != "completed":
                # Nothing stored. A client gone, or its own deadline, hands the lead to a
                # waiter; a failure lets each waiter generate for itself.
                settle(ABANDONED if outcome == "cancelled"
                       or isinstance(stream.error, DeadlineExceeded) else None)
                return
            captured = None
            usage = captured_usage(stream.usage)
            if stream.answer and usage is not None and choices_ok(stream.answer):
                captured = (stream.answer, usage)
            entry = self._make_entry(ctx, key, scope, captured, started)
            settle(entry)
            if entry is not None and self._storable(entry, started):
                self.store.put(entry, sem, look, qgate)

        reply.on_end(ended)
        return reply

    def _storable(self, entry: Entry, started: float) -> bool:
        if not self.cfg.store_truncated and any(c["finish_reason"] == "length"
                                                for c in entry.choices):
            return False
        return not self.store.purged_since(started, entry)  # across a purge that reaches it

    def _prompt_text(self, ctx: RequestContext) -> str:
        return prompt_text(ctx, self.services.terminal.read_tokens)

    def _matches_sensitive(self, ctx: RequestContext) -> bool:
        """Whether a `sensitive_patterns` entry matches what the model reads of the
        request (`request_text`; read once, not once per pattern: a prompt of token ids
        is decoded to read it)."""
        if not self._sensitive:
            return False
        text = request_text(ctx, self.services.terminal.read_tokens)
        return any(p.search(text) for p in self._sensitive)

    # -------------------------------------------------------------------- replies

    async def _as_asked(self, ctx: RequestContext, entry: Entry) -> Entry:
        """`entry` with the asker's prompt tokens in its usage where its prompt is another
        (a paraphrase: a semantic hit; a repeat with other spaces or look-alike letters,
        which the key reads as one: the stored prompt's were reported, and charged by
        the rate limiter), counted as a miss counts them where the terminal can (a local
        engine's render: what the miss of it pays before the engine); as stored where it
        cannot (an upstream's tokenizer), as LiteLLM reports a cached answer's. A
        completion of several prompts keeps its per-prompt counts as stored."""
        asked = asked_digest(ctx)
        if entry.asked == asked or (not isinstance(ctx.request, ChatCompletionRequest)
                                    and len(ctx.request.prompts()) != 1):
            return entry
        own = await self.services.terminal.count_prompt(ctx.request)
        if own is None:  # (the stored count stands in; the miss's breakdown of it does not)
            return replace(asked_with(entry, entry.usage["prompt_tokens"]), asked=asked)
        if not entry.asked and own == entry.usage["prompt_tokens"]:
            # An entry stored before the digest was kept (read from Redis after an
            # upgrade) counts this prompt's tokens: kept with it (in place, where L1 and
            # the index hold it), so its verbatim repeats are not rendered again. (L1's
            # size of it is short of the digest's 64 characters.)
            entry.asked = asked
            return entry
        return replace(asked_with(entry, own), asked=asked)

    async def _semantic_hit(self, ctx: RequestContext, key: str, entry: Entry, write: bool,
                            ) -> Reply:
        """Serve `entry` (`_as_asked` already) to a paraphrase; kept as its exact alias."""
        if write:
            p = ctx.principal
            self.store.promote(key, entry, self._prompt_text(ctx), (p.tenant, p.role, p.user))
        return await self._hit(ctx, entry, "semantic")

    async def _hit(self, ctx: RequestContext, entry: Entry, layer: str) -> Reply:
        ctx.response_headers[HEADER] = layer
        p = ctx.principal
        if (entry.tenant, entry.role, entry.user) == (p.tenant, p.role, p.user):
            # The caller's own entry: a paraphrase's alias names its original, whose
            # purge by key removes the alias too (`matcher`). Another caller's keeps the
            # request's own key (`_look_up`): the original's is a digest of words this
            # caller never sent (a plain SHA-256, so guessed at offline), and the alias
            # is kept under the request's key, which a purge then reaches.
            ctx.response_headers[KEY_HEADER] = entry.source or entry.key
        ctx.response_headers["Age"] = str(entry.age(time.time()))
        return await self._reply(ctx, entry)

    async def _reply(self, ctx: RequestContext, entry: Entry) -> Reply:
        entry = await self._as_asked(ctx, entry)
        ctx.prompt_tokens = entry.usage["prompt_tokens"]
        if ctx.request.stream:
            stream = Stream(replay_stream(entry, ctx.request), whole=True)
            u = entry.usage
            stream.usage = {**u, "total_tokens": u["prompt_tokens"] + u["completion_tokens"]}
            return stream
        return Completion(replay_body(entry, ctx.request), order=replay_order(entry))

    async def stale(self, ctx: RequestContext) -> Reply | None:
        """An expired entry still inside its grace window, for the breaker's fallback."""
        d = self._decide(ctx)
        read, max_age = d.read, d.max_age
        if self.cfg.stale_grace_s <= 0 or not read:
            return None  # never stored (sensitive, sampled ...) or no-cache: no lookup
        answers = self.services.terminal.answer_digest_for(ctx.model)
        key = exact_key(ctx, self.cfg.scope, answers, defaults_filled=self._defaults_filled)
        scope = scope_id(ctx.principal, self.cfg.scope)
        entry = await self.store.get(key, scope, allow_stale=True, max_age=max_age)
        if entry is None:
            return None
        ctx.response_headers[KEY_HEADER] = key
        reply = await self._hit(ctx, entry, "stale")
        reply.headers[HEADER] = "stale"
        return reply

    # -------------------------------------------------------------------- storing

    def _make_entry(self, ctx: RequestContext, key: str, scope: str,
                    captured: tuple[list[dict[str, Any]], dict[str, int]] | None,
                    started: float) -> Entry | None:
        """The answer as an entry, if it is whole: the requests waiting on this
        generation (the same key: the same parameters, `max_tokens` included) take it,
        stored or not (`_storable`). An answer cut by `max_tokens` is whole for them: it
        is what each of them would generate. Without it each waiter generated anew,
        after waiting out the leader, and took twice as long."""
        if captured is None:
            return None
        choices, usage = captured
        if any(c["finish_reason"] not in _WHOLE or not (c["text"].strip() or c.get("tool_calls"))
               for c in choices):
            return None
        ttl = self.cfg.exact.ttl_s
        now = time.time()
        p = ctx.principal
        return Entry(key=key, route=ctx.route, model=ctx.model, choices=choices, usage=usage,
                     scope=scope, tenant=p.tenant, role=p.role, user=p.user,
                     prompt=self._prompt_text(ctx), created=now, expires=now + ttl,
                     stale_until=now + ttl + self.cfg.stale_grace_s, asked=asked_digest(ctx))


class Directives(NamedTuple):
    """A request's caching directives."""

    read: bool = True  # no-cache, max-age=0: skip the read
    write: bool = True  # no-store: skip the write
    max_age: float | None = None  # the oldest answer, in seconds, the client takes
    only_if_cached: bool = False  # an answer from the cache or a 504, never a generation


def request_directives(headers: Mapping[str, str]) -> Directives:
    """A request's caching directives, as HTTP caches read them (RFC 9111 5.2.1):
    `no-cache` and `max-age=0` skip the read, `no-store` the write, `max-age=N` serves
    only answers at most N seconds old, `only-if-cached` answers from the cache or not at
    all (504 `not_cached`); without `Cache-Control`, `Pragma: no-cache` (HTTP/1.0) skips
    the read. A directive whose value is no number is ignored, as are the ones that do
    not apply to a cache without revalidation (`max-stale`, `min-fresh`, `no-transform`)."""
    value = headers.get("cache-control", "").strip()
    if not value:
        return Directives(read="no-cache" not in headers.get("pragma", "").lower())
    read = write = True
    only = False
    max_age: float | None = None
    for directive in value.split(","):
        name, _, arg = directive.partition("=")
        name = name.strip().lower()
        if name == "no-cache":
            read = False
        elif name == "no-store":
            write = False
        elif name == "only-if-cached":
            only = True
        elif name == "max-age":
            try:
                age = int(arg.strip().strip('"'))
            except ValueError:
                continue
            if age <= 0:
                read = False
            max_age = age if max_age is None else min(age, max_age)
    return Directives(read, write, max_age, only)


def _not_cached() -> NotCached:
    return NotCached("No cached answer for this request (it asked for one only: "
                     "`Cache-Control: only-if-cached`).")
