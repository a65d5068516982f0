"""The circuit breaker, next to the engine, with the fallback list.

Every call takes a permit. The call's engine outcome is recorded: failures are engine
errors (5xx, timeouts); a call is slow when the engine took past `slow_call_s` to its
first token, timed from when it took the request (`ctx.engine_started`; vLLM's own
measure where it has one, a whole answer's too): a wait in the admission queue, a shed,
or an answer's length, which the caller sets, is no engine's slowness (one tenant's long
answers or a full queue opened the circuit for all). Local rejections (4xx, 429, a shed
503) and client aborts release the permit without an outcome, so they never open the
breaker; so do a client gone and a request's own deadline (one tenant's 1 ms deadlines
must not open the circuit for all), except that a call cut while the engine had had it
past `slow_call_s` without a first token counts as slow: a hung engine still opens the
breaker, through the slow-call rate. An upstream's whole answer tells no first token:
it is slow past `whole_call_s` while the engine answered nothing else for as long
(a hung upstream answers nothing; one generating a long answer answers others), in
flight as at its end. A stream's outcome is
recorded when it ends (an end hook, not a wrapper); an error before its first chunk
still falls back. There is no timer: every observer sweeps first (a request before it
takes a permit, `/health/ready`, a metrics scrape through the state gauge, collected
before the transitions counter), so each sees the state a timer would have set; with no
observer, nothing acts on it. An open breaker does not make the instance unready.

When the breaker is open, an inner plugin sheds the request, or the engine fails, the
fallbacks are tried in order; their replies carry `x-weir-fallback: <kind>` (so the
cache never stores them). A static text answers neither a shed request nor one it cannot
answer as asked (`fallback.static_fits`). With none left: an open breaker answers 503
`circuit_open` with Retry-After (and `retry-after-ms`) the time left until it half-opens
(a short wait while half-open trials are under way), so a client retrying after it
reaches a trial; a shed request keeps its 503, an engine failure its own error.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, Literal

from prometheus_client import Counter, Gauge

from proxy.chain import FALLBACK_HEADER, BasePlugin, Next, Outcome, Reply, Services, Stream
from proxy.context import RequestContext, Within
from proxy.errors import (
    DeadlineExceeded,
    GatewayFault,
    InvalidRequest,
    Timeout,
    Unavailable,
    WeirError,
    retry_headers,
)
from proxy.settings import UpstreamEngineSettings
from proxy.telemetry import get_logger
from proxy.upstream import Upstream

from .config import BreakerConfig, Fallback
from .fallback import static_fits, static_reply
from .state import Breaker, BreakerPolicy, State, Verdict

log = get_logger("weir.breaker")
_STATE_VALUE = {"closed": 0, "half_open": 1, "open": 2}


def is_engine_failure(e: BaseException) -> bool:
    """Only the engine's own faults count toward opening the breaker (Envoy's rule:
    overflow is not an upstream failure). A request's own deadline, a client gone, a bad
    request, a rate-limit or admission refusal never count: one tenant must not be able
    to open the circuit for everyone."""
    if isinstance(e, asyncio.CancelledError | GeneratorExit | KeyboardInterrupt):
        return False
    if isinstance(e, Unavailable | DeadlineExceeded | GatewayFault):
        # shed, draining, not ready, the caller's deadline: local decisions; a request
        # Weir failed to prepare: its own fault, whatever the request held
        return False
    if isinstance(e, WeirError):
        return e.status >= 500 or isinstance(e, Timeout)
    return True  # anything unexpected from below is the engine's fault


def _failed(stream: Stream, outcome: Outcome) -> bool | None:
    """A stream's end as an engine's outcome: False completed, True the engine's failure,
    None neither (a client gone, a deadline, a refusal: no outcome)."""
    if outcome == "completed":
        return False
    if outcome == "failed" and stream.error is not None and is_engine_failure(stream.error):
        return True
    return None


def _progress(ctx: RequestContext) -> int | None:
    """The tokens the engine says a request under way has made: None where it cannot
    say (or the request just ended), and never a failure here, where every new request
    sweeps."""
    if ctx.engine_progress is None:
        return None
    try:
        return ctx.engine_progress()
    except Exception:  # (vLLM's internals, read where it keeps them)
        return None


def _made_none(ctx: RequestContext) -> bool:
    """Whether the engine says a whole answer under way has made no token yet: a definite
    0 only."""
    return _progress(ctx) == 0


def _cut_at_deadline(ctx: RequestContext, stream: Stream) -> None:
    """A fallback's stream that the request's own deadline ended is counted as admission
    counts its own (not a subclass's: an upstream's time limit)."""
    if type(stream.error) is DeadlineExceeded:
        ctx.cut_at_deadline()


def is_shed(e: BaseException) -> bool:
    return isinstance(e, Unavailable) and e.code in ("overloaded", "queue_timeout")


class BreakerPlugin(BasePlugin[BreakerConfig]):
    name: ClassVar[str] = "breaker"
    Config = BreakerConfig
    placement: ClassVar[Literal["first", "any", "last"]] = "last"
    before: ClassVar[tuple[str, ...]] = ("admission",)

    def __init__(self, config: BreakerConfig, services: Services,
                 clock: Any = time.monotonic) -> None:
        super().__init__(config, services)
        self.cfg = config
        reg = services.metrics.registry
        self.state_gauge = Gauge("weir_breaker_state", "0 closed, 1 half-open, 2 open.",
                                 registry=reg)
        # Read at each scrape: an open breaker half-opens after `open_s` with no request
        # to see it (the gauge said open until one came).
        self.state_gauge.set_function(lambda: _STATE_VALUE[self.health()["state"]])
        self.transitions = Counter("weir_breaker_transitions_total", "State changes.",
                                   ["from_state", "to_state"], registry=reg)
        self.fallbacks = Counter("weir_fallbacks_total", "Fallback replies.",
                                 ["kind", "reason"], registry=reg)
        # Each series at 0 before its first event (rate() and alerts read 0, not nothing)
        for old, new in (("closed", "open"), ("open", "half_open"), ("half_open", "closed"),
                         ("half_open", "open")):
            self.transitions.labels(old, new)
        for f in config.fallback:
            for reason in ("open", "engine", "shed"):
                self.fallbacks.labels(f.kind, reason)
        self.breaker = Breaker(BreakerPolicy(
            window_s=config.window_s, minimum_calls=config.minimum_calls,
            failure_rate=config.failure_rate, slow_call_s=config.slow_call_s,
            slow_call_rate=config.slow_call_rate, open_s=config.open_s,
            half_open_calls=config.half_open_calls,
            half_open_max_wait_s=config.half_open_max_wait_s), clock, self._changed)
        #: permit -> its call, until the call's outcome is told (once).
        self._running: dict[int, RequestContext] = {}
        #: half-open trials answering: permit -> the tokens the engine had made when last
        #: seen (a trial still making them is not stuck)
        self._made: dict[int, int] = {}
        #: Calls told slow while in flight (their outcome in the window), till they end.
        self._told: dict[int, Verdict] = {}
        #: When the engine last showed it generates (monotonic): a whole answer, a
        #: stream's first chunk, a stream completed. An upstream's whole answer tells
        #: nothing until its end, so a hung upstream and a long answer look the same
        #: from the call alone; what tells them apart is the engine: a hung one answers
        #: nothing, one generating at length goes on answering others.
        self.heard_at = -math.inf
        self.upstreams: dict[int, Upstream] = {
            i: Upstream(UpstreamEngineSettings.model_validate({
                "base_url": f.base_url, "api_key": f.api_key, "timeout_s": f.timeout_s,
                "on_behalf_of_secret": f.on_behalf_of_secret, "cache_salt": f.cache_salt}),
                check_models=False)
            for i, f in enumerate(config.fallback) if f.kind == "upstream"}
        #: Each upstream fallback's own breaker (its own thresholds, `Fallback.breaker`;
        #: no slow calls, one trial at a time): one that is down is skipped at once while
        #: open, the next fallback (or the clean error) answering, rather than every
        #: request paying its connect or its `timeout_s` first.
        self.guards: dict[int, Breaker] = {
            i: self._guard(i, config.fallback[i], clock) for i in self.upstreams}

    def _guard(self, i: int, f: Fallback, clock: Any) -> Breaker:
        g = f.breaker
        return Breaker(BreakerPolicy(
            window_s=g.window_s, minimum_calls=g.minimum_calls, failure_rate=g.failure_rate,
            slow_call_s=math.inf, slow_call_rate=1, open_s=g.open_s, half_open_calls=1,
            half_open_max_wait_s=max(f.timeout_s, self.cfg.half_open_max_wait_s)),
            clock, self._guard_changed(i))

    def _changed(self, old: State, new: State) -> None:
        self.transitions.labels(old, new).inc()
        log.warning("breaker state changed", from_state=old, to_state=new)

    def _guard_changed(self, i: int) -> Callable[[State, State], None]:
        def changed(old: State, new: State) -> None:
            log.warning("fallback breaker state changed", fallback=i, from_state=old,
                        to_state=new)
        return changed

    async def start(self) -> None:
        for u in self.upstreams.values():
            await u.start()

    async def close(self) -> None:
        for u in self.upstreams.values():
            await u.close()

    def secret(self) -> str | None:
        """Its first upstream fallback's `on_behalf_of_secret` (None: none has one)."""
        return next((f.on_behalf_of_secret for f in self.config.fallback
                     if f.kind == "upstream" and f.on_behalf_of_secret), None)

    def health(self) -> dict[str, Any]:
        self._sweep()  # (a trial answering at length is not stuck)
        snapshot = self.breaker.snapshot()
        if self.guards:  # each upstream fallback's own breaker, by its place in the list
            snapshot["fallback_states"] = {str(i): g.snapshot()["state"]
                                           for i, g in self.guards.items()}
        return snapshot

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        self._sweep()
        permit = self.breaker.allow()
        if permit is None:
            return await self._fallback(ctx, "open", None)
        self._running[permit] = ctx
        try:
            reply = await call_next(ctx)
            if isinstance(reply, Stream) and reply.primed_at is None:
                await reply.prime()  # an error before the first chunk can still fall back
        except BaseException as e:
            if is_engine_failure(e):
                self._record(permit, failed=True)
                return await self._fallback(ctx, "engine", e)
            self._no_outcome(permit, ctx)
            if is_shed(e):
                return await self._fallback(ctx, "shed", e)
            raise
        if not isinstance(reply, Stream):
            # (an upstream's whole answer tells no first token: its length is the
            # caller's, slow only past `whole_call_s` with the engine silent as long)
            self._record(permit, failed=False, slow=self._slow_by_now(ctx))
            self._heard()
            return reply
        self._heard()  # (its first chunk is in hand)
        # A primed stream's first chunk is in hand: an error before it was raised above
        # (and fell back); the first-token time is what makes a call slow.
        if self.breaker.state == "half_open":  # (a trial: its silence is watched)
            self._alive(permit, _progress(ctx))
        slow = self._slow(ctx, reply.primed_at if reply.primed_at is not None
                          else time.monotonic())

        def ended(stream: Stream, outcome: Outcome) -> None:
            failed = _failed(stream, outcome)
            if failed is None:
                self._no_outcome(permit, ctx)
            else:
                self._record(permit, failed=failed, slow=slow and not failed)
                if not failed:
                    self._heard()

        reply.on_end(ended)
        return reply

    def _heard(self) -> None:
        """The engine showed it generates (see `heard_at`)."""
        self.heard_at = time.monotonic()

    def _slow(self, ctx: RequestContext, first_at: float) -> bool:
        """Whether the engine took past `slow_call_s` to its first token: its own measure
        where it has one, else from when it took the request to `first_at` (an upstream's
        first chunk, or its whole answer). A call no engine took is never slow."""
        if ctx.engine_ttft_s is not None:
            return ctx.engine_ttft_s > self.cfg.slow_call_s
        begun = ctx.engine_started
        return begun is not None and first_at - begun > self.cfg.slow_call_s

    def _slow_by_now(self, ctx: RequestContext) -> bool:
        """Whether a call ending now was slow: past `slow_call_s` to its first token where
        the engine tells one, else (an upstream's whole answer) past `whole_call_s`."""
        now = time.monotonic()
        return self._slow(ctx, now) if ctx.engine_timed else self._whole_slow(ctx, now)

    def _judged_whole(self, ctx: RequestContext) -> bool:
        """Whether `ctx` is a whole answer under way from an engine that tells no first
        token (an upstream's), which `whole_call_s` judges."""
        return (self.cfg.whole_call_s is not None and not ctx.engine_timed
                and not ctx.stream and ctx.engine_started is not None)

    def _whole_slow(self, ctx: RequestContext, now: float) -> bool:
        """Whether a whole answer from an engine that tells no first token (an upstream's)
        has run past `whole_call_s` with the engine silent as long (no answer, no
        stream's first chunk: `heard_at`). Its length alone is the caller's: a healthy
        upstream's long answers, each past `whole_call_s`, opened the breaker though
        the upstream answered all along; a hung one answers nothing, and still does."""
        limit, begun = self.cfg.whole_call_s, ctx.engine_started
        return (self._judged_whole(ctx) and limit is not None and begun is not None
                and now - begun > limit and now - self.heard_at > limit)

    def _no_outcome(self, permit: int, ctx: RequestContext) -> None:
        """The call ended without an engine outcome (client gone, its own deadline, a
        local refusal): the permit goes back, unless the engine was slow all the same (it
        had the request past `slow_call_s` with no first token: hung; an upstream that
        hangs times out, a failure)."""
        if self._slow_by_now(ctx):
            self._record(permit, failed=False, slow=True)
        elif self._running.pop(permit, None) is not None:
            self.breaker.release(permit)
        else:
            self._told.pop(permit, None)

    def _record(self, permit: int, *, failed: bool, slow: bool = False) -> Verdict | None:
        """A call's outcome, once: the sweep may have told it already (slow), and a
        failure at its end then counts too (`Breaker.failed_after`)."""
        if self._running.pop(permit, None) is not None:
            return self.breaker.record(permit, failed=failed, slow=slow)
        told = self._told.pop(permit, None)
        if told is not None and failed:
            self.breaker.failed_after(told)
        return None

    def _alive(self, permit: int, made: int | None) -> None:
        """A trial whose answer has begun gives a sign of life: the engine made tokens
        since it was last seen (`made`: its count, `_progress`; or, where the engine
        cannot say, its first token)."""
        if made is None:
            self.breaker.answering(permit)
        elif self._made.get(permit) != made:
            self._made[permit] = made
            self.breaker.answering(permit, progress=True)

    def _sweep(self) -> None:
        """Calls the engine has had past `slow_call_s` with no first token are slow now,
        not when their deadline or their client ends them: a hung engine opens the
        breaker while requests queue behind it (their waits and sheds count for nothing),
        not minutes later. A stream tells its first token as it comes; a whole answer
        only with its end, so the engine is asked how many it has generated
        (`engine_progress`), where it can say; where it cannot, one cut with no token
        generated is slow when it ends; an upstream's, which tells nothing until its end,
        once it has run `whole_call_s`."""
        now = time.monotonic()
        if self.breaker.state == "half_open":  # a trial's answer under way, begun
            for p, c in self._running.items():
                # (a whole answer tells no first token until its end: the engine's count
                # of its tokens says it has begun)
                made = _progress(c)
                if c.engine_ttft_s is not None or p in self._made or made:
                    self._alive(p, made)
                elif self._judged_whole(c):
                    # (an upstream's whole answer tells nothing until its end: not stuck
                    # by its silence, but slow, a failed trial, past `whole_call_s`)
                    self.breaker.answering(p)
        for p in [p for p in self._made if p not in self._running]:
            del self._made[p]
        # Every new request sweeps every call under way: one the engine has had for less
        # than both limits (`slow_call_s`, and `whole_call_s` that `_whole_slow` reads) is
        # passed over at once (at 64 streams awaiting their first token, the full test of
        # each was ~13 us a request, on the first token's path).
        whole = self.cfg.whole_call_s
        least = self.cfg.slow_call_s if whole is None else min(self.cfg.slow_call_s, whole)
        late = [p for p, c in self._running.items() if c.engine_ttft_s is None
                and c.engine_started is not None and now - c.engine_started > least
                and ((now - c.engine_started > self.cfg.slow_call_s
                      and (c.engine_live or _made_none(c)))
                     or self._whole_slow(c, now))]
        for permit in late:
            told = self._record(permit, failed=False, slow=True)
            if told is not None:
                self._told[permit] = told

    async def _fallback(self, ctx: RequestContext, reason: str,
                        error: BaseException | None) -> Reply:
        """A fallback's answer, within the request's deadline (admission's, which runs
        after this plugin and so never saw a fallback: an upstream's answer came seconds
        past `x-weir-timeout-ms`, as a 200): a 504 past it, and a stream bound by it."""
        left = ctx.remaining()
        if left is not None and left <= 0:  # (a static answer, never awaiting, came late)
            ctx.cut_at_deadline()  # (admission's count: it never had this one cut)
            raise DeadlineExceeded("The request did not finish within its deadline.")
        scope = Within(ctx.deadline)
        try:
            async with scope:
                reply = await self._fall_back(ctx, reason, error)
        except DeadlineExceeded:
            if scope.expired():  # (not an upstream's own time limit)
                ctx.cut_at_deadline()
            raise
        if isinstance(reply, Stream) and ctx.deadline is not None:
            reply.on_end(lambda stream, outcome: _cut_at_deadline(ctx, stream))
        return reply

    async def _fall_back(self, ctx: RequestContext, reason: str,
                         error: BaseException | None) -> Reply:
        refusal: InvalidRequest | None = None  # a fallback's word that the request is bad
        for i, f in enumerate(self.cfg.fallback):
            try:
                reply = await self._try(i, f, ctx, reason)
            except InvalidRequest as e:
                refusal, reply = refusal or e, None
            if reply is not None:
                if isinstance(reply, Stream) and ctx.deadline is not None:
                    reply.deadline = (ctx.deadline if reply.deadline is None
                                      else min(reply.deadline, ctx.deadline))
                reply.headers[FALLBACK_HEADER] = f.kind
                ctx.response_headers[FALLBACK_HEADER] = f.kind
                self.fallbacks.labels(f.kind, reason).inc()
                return reply
            if f.kind == "error":  # the list ends here: the clean error below answers
                self.fallbacks.labels(f.kind, reason).inc()
                break
        if reason == "open":
            if refusal is not None:  # the engine was not asked; the one that was says why
                raise refusal  # (a 503 `circuit_open` hid a request no fallback takes)
            # The time left until a call may pass (it half-opens, or a trial slot
            # frees): a client that waits that long and retries is the one the breaker
            # wants, so no `x-should-retry: false` (OpenAI's SDK obeys it before
            # Retry-After, and gave up at once).
            raise Unavailable("The model is temporarily unavailable; the circuit breaker is "
                              "open.", code="circuit_open", retry_after=None,
                              headers=retry_headers(self.breaker.retry_in() * 1000))
        assert error is not None
        raise error

    async def _upstream(self, i: int, ctx: RequestContext) -> Reply | None:
        """An upstream fallback's answer through its own breaker: None while that is open
        (or its one half-open trial is under way). Its failures are counted as the
        engine's are; a stream's when it ends."""
        guard = self.guards[i]
        permit = guard.allow()
        if permit is None:
            return None
        try:
            reply = await self.upstreams[i](ctx)
        except BaseException as e:
            if is_engine_failure(e):
                guard.record(permit, failed=True)
            else:
                guard.release(permit)
            raise
        if not isinstance(reply, Stream):
            guard.record(permit, failed=False)
            return reply
        if reply.primed_at is not None:
            # A half-open trial whose first chunk came is answering, not stuck however
            # long it streams (a stall is the upstream's `read_timeout_s`: a failure at
            # its end); it was judged stuck near its `timeout_s`.
            guard.answering(permit)

        def ended(stream: Stream, outcome: Outcome) -> None:
            failed = _failed(stream, outcome)
            if failed is None:
                guard.release(permit)
            else:
                guard.record(permit, failed=failed)

        reply.on_end(ended)
        return reply

    async def _try(self, i: int, f: Fallback, ctx: RequestContext,
                   reason: str) -> Reply | None:
        try:
            if f.kind == "stale":
                cache = self.services.plugin("cache")
                stale: Callable[[RequestContext], Awaitable[Reply | None]] | None = getattr(
                    cache, "stale", None)
                return await stale(ctx) if stale is not None else None
            if f.kind == "upstream":
                return await self._upstream(i, ctx)
            if f.kind == "static":
                # A shed request keeps its 503 and Retry-After (clients retry it; a 200
                # "busy" they would take as the answer), as does a request a fixed text
                # cannot answer as asked.
                if reason == "shed" or not static_fits(ctx, f.content):
                    return None
                return static_reply(ctx, f.content)
        except InvalidRequest as e:
            log.warning("fallback failed", kind=f.kind, error=type(e).__name__)
            if e.status in (400, 413, 422):  # the request's own fault, as far as it saw
                raise  # (a 402, a 404 for a model it does not serve: its own limits)
        except WeirError as e:
            log.warning("fallback failed", kind=f.kind, error=type(e).__name__)
        except Exception as e:  # (a bug below it: a 500 hid every fallback after it)
            log.error("fallback failed", kind=f.kind, error=type(e).__name__)
        return None

