"""Rate limits per API key, user, tenant, role and model: requests and tokens per minute,
and concurrent requests.

Longer than most plugin shells on purpose: besides the decision it owns the leases'
life (which store granted each, renewal, orphans after a store timeout), which must
stay in one place to release every slot exactly once.

On admission, every rule's buckets are checked and charged in one atomic step: one
request, and the tokens it may use (its prompt, estimated from its text, once, plus its
`max_tokens` or `default_max_tokens` for each choice of each prompt), and a concurrency
lease. When the answer ends the
token charge is settled against the real usage and the lease released: a stream cut
short (its client gone, its deadline, an engine fault) is charged the tokens generated
until then, and so is any answer its client or deadline cut once the engine had it (its
prompt and what was generated until the cut); an answer that failed gets its tokens back.

Over a limit: 429 `rate_limit_exceeded` (type `requests` or `tokens`, as OpenAI's) with
an integer `Retry-After` and `retry-after-ms`; a request larger than a minute's tokens on
its own (what it fixes itself: not an estimate) is refused up front, with no Retry-After
(`_too_large`). Every answer carries
OpenAI's `x-ratelimit-limit-requests`, `-remaining-requests`, `-reset-requests` and the
`-tokens` variants (the tightest of the caller's own rules: a `global` or `model` rule
counts every tenant's requests, so its counts show in no header: a 429 it gives carries
the retry headers and the caller's own rules' counts, never its own).

Store failures: `fail_open` falls back to a local in-memory limiter (per replica) with
a metric and a log line, and uses Redis again as soon as a call succeeds; `fail_closed`
answers 503 `rate_limiter_unavailable` (Retry-After 1 s), and the replica stays ready:
the Redis is every replica's, so taking this one out of the balancer helps no request,
and with every replica out the routes that need no limiter (models, stored responses)
went too and clients got the balancer's bare 503 instead of this one. A Redis full at
its `maxmemory` (noeviction) answers but records nothing: that is no outage that a
success elsewhere ends, but the same want of a shared store until a write lands (tried
every second meanwhile), so the limiter decides alike (locally, or 503 with
`fail_closed`), charges locally what Redis refused to record, says `full` in health and
logs it once. It used to admit through Redis where the script's
writes happened to pass while every token charge failed: TPM went unenforced fleet-wide,
and health and the log flapped between down and back.

A concurrency lease is released in the store that granted it, exactly once on every path
(answer, error, cancellation, a store call that timed out); leases are short and renewed
while their request runs. When the local limiter takes over (Redis full or down), it
also counts the leases Redis granted to requests still running (or a full concurrency
limit let as many again in). A renewal renews only the leases Redis still holds (one
released as the renewal was on its way stays released), but for those that may have
lapsed there while their request ran (Redis full or down meanwhile, or a renewal found
one gone): those it writes back, unless their release, which bars them, came first. A
lease whose request ended never comes back. (Redis refuses a script only at its first
write, before it wrote anything: none is refused partway, leaving a lease behind.)
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable
from typing import Any, ClassVar, NamedTuple

from prometheus_client import Counter

from proxy.auth import key_part
from proxy.chain import BasePlugin, Completion, Next, Outcome, Reply, Services, Stream
from proxy.context import RequestContext
from proxy.errors import RateLimited, Unavailable, retry_headers
from proxy.ids import new_hex
from proxy.protocol import ChatCompletionRequest, CompletionRequest
from proxy.tasks import background, cancel_and_wait, detach, run_now
from proxy.telemetry import OutageLog, error_fields, get_logger
from proxy.tools import tool_chars

from .config import Limits, RateLimitConfig
from .gcra import (
    Bucket,
    BucketState,
    Decision,
    MemoryStore,
    RedisStore,
    Store,
    StoreError,
    StoreFull,
)

log = get_logger("weir.rate_limit")


def _dimension(ctx: RequestContext, per: str) -> tuple[str, str]:
    """(the value as a rule's overrides name it, `acme/alice`; the bucket's name, its
    names escaped: tenant `a/b` with user `c` and tenant `a` with user `b/c` are two
    buckets, not one)."""
    p = ctx.principal
    if per == "key":
        return p.key_id, p.key_id
    if per == "user":
        return f"{p.tenant}/{p.user}", f"{key_part(p.tenant)}/{key_part(p.user)}"
    if per == "tenant":
        return p.tenant, key_part(p.tenant)
    if per == "role":
        return f"{p.tenant}/{p.role}", f"{key_part(p.tenant)}/{key_part(p.role)}"
    value = ctx.model if per == "model" else "*"
    return value, value


#: Rules whose buckets every tenant's requests share (the server's, a model's): their
#: counts are everyone's traffic, so no `x-ratelimit-*` header shows them (a tenant
#: would watch the others' usage there); a 429 one gives says only that, and when to
#: retry (LiteLLM reports a key's own limits alike; Kong can hide the headers).
SHARED = frozenset({"global", "model"})


def estimate_tokens(ctx: RequestContext) -> int:
    """The prompt's tokens, estimated: each message's and each text prompt's characters
    / 4, and a token more for each (256 prompts of "x" are 256 prompts to read, not 65
    tokens as their characters summed said); a prompt of token ids is its count, and a
    request at least a token."""
    req = ctx.request
    if isinstance(req, ChatCompletionRequest):
        return (sum(len(m.text()) // 4 for m in req.messages) + tool_chars(req) // 4
                + max(1, len(req.messages)))
    texts = [p for p in req.prompts() if isinstance(p, str)]
    return (sum(len(p) // 4 for p in texts) + max(1, len(texts))
            + sum(len(p) for p in req.prompts() if not isinstance(p, str)))


def _fixed_prompt_tokens(req: ChatCompletionRequest | CompletionRequest) -> int:
    """The prompt tokens a request names itself, its prompts of token ids (a text's are
    only estimated, `estimate_tokens`)."""
    if isinstance(req, ChatCompletionRequest):
        return 0
    return sum(len(p) for p in req.prompts() if not isinstance(p, str))


_WHOSE = {"key": "this API key", "user": "this user", "tenant": "this tenant",
          "role": "this role in its tenant", "model": "this model", "global": "this server",
          "any": "this request's limits"}
_LIMITS = {"rpm": "requests per minute", "tpm": "tokens per minute",
           "concurrent": "concurrent requests"}


def fmt_reset(ms: float) -> str:
    """OpenAI's reset format: '20ms', '1s', '6m0s'."""
    if ms < 1000:
        return f"{max(0, math.ceil(ms))}ms"
    s = math.ceil(ms / 1000)
    return f"{s // 60}m{s % 60}s" if s >= 60 else f"{s}s"


class RateLimitPlugin(BasePlugin[RateLimitConfig]):
    name: ClassVar[str] = "rate_limit"
    serves: ClassVar[frozenset[str]] = frozenset({"chat", "completion", "embeddings"})
    Config = RateLimitConfig
    #: How often Redis is tried while it is full or down (`_watch`): a full one is not
    #: tried by requests (it would record nothing), and `fail_closed` answers them 503
    #: with a Retry-After of 1 s meanwhile. (At most `lease_s / 3`, the renewal's round.)
    PROBE_S: ClassVar[float] = 1.0
    #: Redis connections opened at start, the scripts loaded with them (`_warm`), within
    #: `WARM_S`: a first burst's requests each opened one and loaded the script past the
    #: per-call timeout, and were decided by the local fallback.
    WARM_CONNECTIONS: ClassVar[int] = 16
    WARM_S: ClassVar[float] = 1.0
    #: The orphan reaper's first wait while Redis does not answer (doubled each round,
    #: at most `lease_s / 3`); Redis seen back ends the wait at once (`_store_ok`).
    REAP_FIRST_S: ClassVar[float] = 0.05

    def __init__(self, config: RateLimitConfig, services: Services,
                 clock: Any = None) -> None:
        super().__init__(config, services)
        self.cfg = config
        #: per rule: its overrides merged over its own limits
        self._overrides = [rule.limits_for() for rule in config.rules]
        #: (key id, tenant, user, role, model) -> that caller's buckets (`_plan`)
        self._plans: dict[tuple[str, str, str, str, str], _Plan] = {}
        self.local = MemoryStore(clock)
        self.remote = (RedisStore(config.redis.url, config.redis.timeout_s,
                                  config.redis.key_prefix)
                       if config.store == "redis" and config.redis.url else None)
        reg = services.metrics.registry
        self.rejected = Counter("weir_rate_limit_rejections_total", "429s.", ["per", "limit"],
                                registry=reg)
        # Each rule's series at 0 before its first 429, as admission's and the breaker's:
        # rate() and alerts on them read 0, not nothing, until a client is refused.
        for rule, merged in zip(config.rules, self._overrides, strict=True):
            for limits in (rule, *merged.values()):
                for limit in _LIMITS:
                    if getattr(limits, limit):
                        self.rejected.labels(rule.per, limit)
        self.store_errors = Counter("weir_rate_limit_store_errors_total",
                                    "Store calls that failed (reason: unavailable, or full: "
                                    "a write Redis refused at its maxmemory).",
                                    ["reason"], registry=reg)
        if self.remote is not None:  # (at 0 from the start, as the rejections are)
            for reason in ("unavailable", "full"):
                self.store_errors.labels(reason)
        self._degraded = False
        self._outage = OutageLog()
        #: Redis refused a write at its `maxmemory`: decided without it until a write lands
        self._full = False
        self._full_log = OutageLog()
        #: lease -> (the store that granted it, its concurrency keys), while it runs.
        self._active: dict[str, tuple[Store, list[str]]] = {}
        #: lease -> (keys, until): leases Redis may hold that no running request owns,
        #: until they expire there on their own (no one renews them): past that, there is
        #: nothing to release (a long outage adds one per request, and they had piled up).
        self._orphans: dict[str, tuple[list[str], float]] = {}
        #: leases Redis granted whose copy there may have lapsed while their request runs
        #: (Redis full or down meanwhile): renewals write them back, and their release
        #: bars them, so that a renewal landing after it does not.
        self._restore: set[str] = set()
        self._renewer: asyncio.Task[None] | None = None
        self._reaper: asyncio.Task[None] | None = None
        #: set when Redis is seen back: the reaper's backoff ends (`_reap`)
        self._back = asyncio.Event()
        self._prober: asyncio.Task[None] | None = None
        #: the epoch of Redis's lease sets last seen (0: none yet), the task writing this
        #: replica's running leases back there when a new one is seen (`_rewrite_leases`),
        #: and how many such rewrites have ended
        self._epoch = 0
        self._rewrite: asyncio.Task[None] | None = None
        self._rewritten = 0
        #: every rewrite not yet ended: each waits on the one before it, so close
        #: cancels them all (the last alone left the earlier ones writing past close)
        self._rewrites: set[asyncio.Task[None]] = set()
        self._epoch_watch: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self.remote is not None:
            try:
                await self.remote.warm(self.WARM_CONNECTIONS, self.WARM_S)
            except StoreError as e:  # (out of reach: seen so at once, as a request would)
                self._store_failed(e)
        self._renewer = asyncio.create_task(self._renew_loop())
        if self.remote is not None:
            self._epoch_watch = asyncio.create_task(self._watch_epoch())

    async def close(self) -> None:
        await cancel_and_wait(self._renewer, self._reaper, self._prober, self._epoch_watch,
                              *self._rewrites)
        if self.remote is not None:
            await self._retry_orphans()
            await self.remote.close()

    def health(self) -> dict[str, Any] | None:
        if self.remote is None:
            return None
        # (`fail_closed` falls back to nothing: its requests are refused meanwhile)
        if self._degraded:
            return {"store": "unavailable" if self.cfg.on_store_error == "fail_closed"
                    else "local-fallback"}
        return {"store": "full" if self._full else "redis"}

    # -------------------------------------------------------------- store calls
    #
    # A concurrency lease lives in the store that granted it, and is released there,
    # exactly once, on every path. A Redis call that timed out may still run once Redis
    # wakes up: the lease it would have taken is an orphan, released in Redis in the
    # background until that succeeds (ZREM of a lease never taken is a no-op), and barred
    # there, so an admission that Redis runs after that release takes nothing. Leases
    # are short (`lease_s`) and renewed while their request runs, so one that every
    # release missed (a crash) frees itself soon.

    def _store_failed(self, e: StoreError) -> None:
        if isinstance(e, StoreFull):
            self._store_full()
            return
        self.store_errors.labels("unavailable").inc()
        if not self._degraded:
            self._hold_locally()
            # An outage begins: Redis seen back before it (set then with no orphans,
            # so no reaper cleared it) must not end this one's first backoff at once.
            self._back.clear()
        self._degraded = True
        self._watch()
        if self._outage.down():
            # The failed call's type, never a message: a Redis reply's text may quote
            # what it stored, a connection error's its URL (with a password in it).
            log.warning("rate-limit store unavailable",
                        error=type(e.__context__ or e).__name__,
                        fallback=self.cfg.on_store_error)

    def _store_full(self) -> None:
        if not self._full:
            self._hold_locally()
        self._full = True
        self._watch()
        self.store_errors.labels("full").inc()
        if self._full_log.down():
            log.warning("rate-limit store is full (maxmemory): deciding without it",
                        fallback=self.cfg.on_store_error)

    def _hold_locally(self) -> None:
        """The local limiter is to decide: it counts the leases Redis granted to requests
        still running (each released there too when it ends), or a full concurrency limit
        let as many again in while Redis cannot."""
        for lease, (store, keys) in self._active.items():
            if store is self.remote:
                self.local.hold(keys, lease, self.cfg.lease_s * 1000)
                self._restore.add(lease)

    def _store_ok(self) -> None:
        if self._degraded:
            self._degraded = False
            self._back.set()  # (the orphans' releases, now: `_reap`)
            self._adopt_local()
            if self._outage.back():
                log.info("rate-limit store is back")
            # The leases of requests that ran through the outage may have lapsed there:
            # written back at once, as after a full Redis (the next renewal round was up
            # to `lease_s / 3` away, Redis deciding without them meanwhile), and an
            # admission Redis decided before that is counted again (`_recount`).
            if self._restore:
                self._start_rewrite()

    def _adopt_local(self) -> None:
        """Redis decides again: the leases the local limiter granted meanwhile, whose
        requests still run, are Redis's from now on (written there by the renewal that
        follows, `_restore`, and released there too, as well as locally). Redis counted
        none of them: every replica's requests admitted over the outage let as many
        again in through Redis until they ended (minutes, for a long stream)."""
        for lease, (store, keys) in self._active.items():
            if store is self.local and keys:
                self._active[lease] = (self.remote, keys)  # type: ignore[assignment]
                self._restore.add(lease)

    async def _admit(self, buckets: list[Bucket], conc: list[tuple[str, int]],
                     lease: str) -> tuple[Decision, Store]:
        lease_ms = self.cfg.lease_s * 1000
        if self.remote is not None:
            if not self._full:  # (full: it would record nothing of what it admits)
                before = self._rewritten
                try:
                    decision = await self.remote.admit(buckets, conc, lease, lease_ms)
                    self._store_ok()
                    if decision.epoch and (decision.epoch != self._epoch
                                           or self._rewritten != before
                                           or self._rewrite is not None):
                        decision = await self._recount(decision, buckets, conc, lease,
                                                       before)
                except StoreError as e:
                    # it may still take the lease: its release bars it (a full Redis
                    # refused the script's first write: it took nothing)
                    if conc and not isinstance(e, StoreFull):
                        self._orphan(lease, [k for k, _ in conc])
                    self._store_failed(e)
                else:
                    return decision, self.remote
            if self.cfg.on_store_error == "fail_closed":
                raise Unavailable("Rate limiting is unavailable; retry shortly.",
                                  code="rate_limiter_unavailable")
        return await self.local.admit(buckets, conc, lease, lease_ms), self.local

    async def _recount(self, decision: Decision, buckets: list[Bucket],
                       conc: list[tuple[str, int]], lease: str, before: int) -> Decision:
        """An admission Redis decided with a new epoch of its lease sets (it lost its data,
        a restart or FLUSHALL, and with it the leases of the requests still running: a
        concurrency limit let as many again in until each lease's next renewal), or
        before this replica's running leases were written back after one: they are
        written back (`_rewrite_leases`, once per epoch), and a lease set now past its
        limit refuses this request after all (its lease released, its charges
        refunded). (The first epoch a replica sees needs no rewrite of its own: no lease
        of its ran through Redis before; the local limiter's, Redis back, have theirs.)"""
        assert self.remote is not None
        if decision.epoch != self._epoch:
            first, self._epoch = not self._epoch, decision.epoch
            if not first:
                self._start_rewrite()
        if self._rewrite is not None:
            rewrite = self._rewrite
            await asyncio.shield(rewrite)
            if self._rewrite is rewrite:
                self._rewrite = None
        if not decision.allowed or self._rewritten == before:
            return decision
        keys = [k for k, _ in conc]
        held = await self.remote.count(keys)
        over = tuple(j for j, ((_, limit), n) in enumerate(zip(conc, held, strict=True))
                     if n > limit)
        if not over:
            return decision
        try:
            states = await self.remote.adjust([Bucket(b.key, b.limit, -min(b.cost, b.limit))
                                               for b in buckets])
        finally:  # (the lease is Redis's whatever the refund did: a full Redis takes no orphan)
            try:
                await self.remote.release(keys, lease)
            except StoreError as e:
                self._orphan(lease, keys)
                self._store_failed(e)
        return Decision(False, 1000.0, states, over, decision.epoch)

    async def _watch_epoch(self) -> None:
        """While Redis holds leases of this replica's running requests, read its lease
        sets' epoch every `PROBE_S`: a new one (Redis lost its data) has them written
        back within a second, where this replica admits nothing meanwhile (its
        admissions see it at once) and another's admission counts without them."""
        assert self.remote is not None
        every = min(self.PROBE_S, self.cfg.lease_s / 3)
        while True:
            await asyncio.sleep(every)
            # (with no epoch seen yet too: leases Redis took over from the local limiter,
            # `_adopt_local`, with no admission of this replica's decided there since;
            # the first epoch read has them written back again, in case it is new)
            if (self._degraded or self._full
                    or not any(store is self.remote for store, _ in self._active.values())):
                continue
            try:
                epoch = await self.remote.epoch()
            except StoreError:
                continue  # (an outage: the requests and the prober see it)
            except Exception as e:  # (the next round tries again)
                log.error("rate-limit epoch read failed", **error_fields(e))
                continue
            if epoch != self._epoch:
                self._epoch = epoch
                self._start_rewrite()

    def _start_rewrite(self) -> None:
        """`_rewrite_leases`, once more (one under way may have read the running leases
        before those that need it now): the admissions Redis decided before it ends
        await it and count again (`_recount`)."""
        previous = self._rewrite
        self._rewrite = task = background(self._rewrite_leases(previous))
        self._rewrites.add(task)
        task.add_done_callback(self._rewrites.discard)

    async def _rewrite_leases(self, previous: asyncio.Task[None] | None = None) -> None:
        """Write this replica's running leases back into Redis, which lost them or never
        had them (unless their release came first: `_restore`)."""
        if previous is not None and not previous.done():
            await asyncio.shield(previous)  # (one at a time, in order)
        try:
            running = {lease: keys for lease, (store, keys) in self._active.items()
                       if store is self.remote}
            if running and self.remote is not None:
                self._restore |= running.keys()
                await self.remote.renew(running, self.cfg.lease_s * 1000, running.keys())
        except StoreError as e:
            self._store_failed(e)
        except Exception as e:  # (the next renewal round tries again)
            log.error("rate-limit lease renewal failed", **error_fields(e))
        finally:
            self._rewritten += 1

    async def _settle_shielded(self, store: Store, tpm: list[Bucket], reserve: int,
                               used: int | None, conc_keys: list[str], lease: str
                               ) -> dict[str, BucketState]:
        """`_settle`, safe from cancellation. Only Redis can suspend it: the memory
        store never yields to the loop, so nothing can cut it short and it needs no
        task of its own (one task per request was a visible share of a cache hit)."""
        settle = self._settle(store, tpm, reserve, used, conc_keys, lease)
        if store is self.remote:
            return await asyncio.shield(detach(settle))
        return await settle

    def _undo(self, admit: asyncio.Future[tuple[Decision, Store]], tpm: list[Bucket],
              reserve: int, conc_keys: list[str], lease: str) -> None:
        """Give back what an admission whose client left granted (a store error already
        orphaned its lease)."""
        if admit.cancelled() or admit.exception() is not None:
            return
        decision, store = admit.result()
        if decision.allowed:
            detach(self._settle(store, tpm, reserve, 0, conc_keys, lease))

    async def _settle(self, store: Store, tpm: list[Bucket], reserve: int, used: int | None,
                      conc_keys: list[str], lease: str) -> dict[str, BucketState]:
        """Settle the token reservation and release the lease; the token buckets it
        changed, as they stand after that (key -> state)."""
        running = self._active.pop(lease, None)
        # The store that holds its lease: the one that granted it, or Redis, which took
        # over the lease the local limiter granted over an outage (`_adopt_local`).
        holder = store if running is None else running[0]
        barred = lease in self._restore  # (a renewal may write it back: bar it)
        self._restore.discard(lease)
        after: dict[str, BucketState] = {}
        # Each bucket took the reservation up to its limit (a request may reserve more
        # than a minute's budget, and still be let in): it is settled from what it took.
        # A measured usage is charged whole; the reservation standing for an unknown one
        # (a cut upstream answer, a stream without usage) is charged what was taken.
        try:  # (a charge that fails in a way of its own still frees the lease)
            owed = [Bucket(b.key, b.limit, d) for b in tpm
                    if used is not None and (d := _owed(b.limit, reserve, used))]
            if owed:
                try:
                    states = await store.adjust(owed)
                except StoreError as e:  # tokens only: the reservation stands
                    self._store_failed(e)
                    if isinstance(e, StoreFull):  # the local limiter decides meanwhile
                        states = await self.local.adjust(owed)
                    else:
                        states = []
                after = {b.key: s for b, s in zip(owed, states, strict=False)}
        finally:
            if conc_keys:
                if holder is self.remote:  # (held there too while Redis could not decide)
                    await self.local.release(conc_keys, lease)
                try:
                    if barred and isinstance(holder, RedisStore):
                        await holder.release_barred(conc_keys, lease, self.cfg.lease_s * 1000)
                    else:
                        await holder.release(conc_keys, lease)
                except StoreError as e:
                    self._orphan(lease, conc_keys)
                    self._store_failed(e)
                else:
                    if holder is self.remote:
                        self._orphans.pop(lease, None)
        return after

    def _orphan(self, lease: str, keys: list[str]) -> None:
        """Remember a lease Redis may hold, and start releasing it at once (retried with
        backoff until Redis answers; the renewal loop retries too)."""
        self._orphans[lease] = (keys, time.monotonic() + self.cfg.lease_s)
        if self._reaper is None or self._reaper.done():
            self._reaper = background(self._reap())

    async def _reap(self) -> None:
        delay = self.REAP_FIRST_S
        while self._orphans:
            await self._retry_orphans()
            if not self._orphans or all(lease in self._active for lease in self._orphans):
                return
            # Backing off while Redis does not answer, until it is seen back: the
            # admissions it ran late (their timeout given up on) hold slots meanwhile,
            # and their releases were cut one by one (waiting out a backoff of up to
            # `lease_s / 3` with Redis back refused every request on those slots).
            try:
                async with asyncio.timeout(delay):
                    await self._back.wait()
            except TimeoutError:
                delay = min(delay * 2, self.cfg.lease_s / 3)
            else:
                delay = self.REAP_FIRST_S
            self._back.clear()

    def idle(self) -> bool:
        """No lease held by a running request, and none left to release in Redis."""
        return not self._active and not self._orphans

    async def _renew_loop(self) -> None:
        period = self.cfg.lease_s / 3
        while True:
            if self.cfg.on_store_error == "fail_closed":  # (health shows it: `health`)
                await self._check_reachable()
            await asyncio.sleep(period)
            try:
                await self._renew()
                await self._retry_orphans()
            except Exception as e:  # keep renewing: a missed round only shortens leases
                log.error("rate-limit lease renewal failed", **error_fields(e))

    async def _check_reachable(self) -> None:
        """Ping the store while it is thought up (`_probe` does while it is down), so
        that one gone out of reach is seen with no request refused on it."""
        if self.remote is None or self._degraded or self._full:
            return
        try:
            await self.remote.ping()
        except StoreError as e:
            self._store_failed(e)
        except Exception as e:  # (the next round tries again)
            log.error("rate-limit store ping failed", **error_fields(e))
        else:
            self._store_ok()

    def _watch(self) -> None:
        """Redis is full or down: try it every `PROBE_S` until it is back (one task,
        ended then). Tried only in the renewal's round (`lease_s / 3`, 10 s by default),
        a Redis full meanwhile stayed unused that long once it took writes again: with
        `fail_closed` every request was a 503 whose Retry-After said 1 s."""
        if self.remote is not None and (self._prober is None or self._prober.done()):
            self._prober = background(self._probe_until_back())

    async def _probe_until_back(self) -> None:
        every = min(self.PROBE_S, self.cfg.lease_s / 3)
        while self._full or self._degraded:
            await asyncio.sleep(every)
            try:
                await self._probe()
            except Exception as e:  # keep trying: it is back at the next success
                log.error("rate-limit store probe failed", **error_fields(e))

    async def _probe(self) -> None:
        """On the local fallback, see whether Redis is back (health says so then, not
        only after the next request's admission succeeds); while it is full, whether it
        takes a write again."""
        if self._full and self.remote is not None:
            try:
                await self.remote.write_probe(f"{self.cfg.redis.key_prefix}probe")
            except StoreError:
                return
            self._full = False
            self._adopt_local()
            if self._full_log.back():
                log.info("rate-limit store takes writes again")
            # its running leases back at once (they may have lapsed, or never been there)
            self._start_rewrite()
            await asyncio.shield(self._rewrite)  # type: ignore[arg-type]
        if self._degraded and self.remote is not None:
            try:
                await self.remote.ping()
            except StoreError:
                return
            self._store_ok()

    async def _renew(self) -> None:
        """Push every running lease's expiry on, where its store still holds it (one
        released meanwhile stays so). Redis writes back those it may have lost while
        their request runs (`_restore`), unless their release came first; one a renewal
        finds gone while its request still runs lapsed there (a round missed): it joins
        them, written back at once."""
        lease_ms = self.cfg.lease_s * 1000
        by_store: dict[int, tuple[Store, dict[str, list[str]]]] = {}
        for lease, (store, keys) in list(self._active.items()):
            by_store.setdefault(id(store), (store, {}))[1][lease] = keys
        for store, leases in by_store.values():
            if store is not self.remote:
                await store.renew(leases, lease_ms)
                continue
            await self.local.renew(leases, lease_ms)  # (those held locally)
            try:
                gone = await store.renew(leases, lease_ms, self._restore)
                # (a request that ended meanwhile was released: it stays so)
                lapsed = {lease for lease in gone if lease in self._active}
                if lapsed:
                    self._restore |= lapsed
                    await store.renew({lease: leases[lease] for lease in lapsed}, lease_ms,
                                      lapsed)
            except StoreError as e:
                self._store_failed(e)

    async def _retry_orphans(self) -> None:
        if self.remote is None or not self._orphans:
            return
        now = time.monotonic()
        for lease, (keys, until) in list(self._orphans.items()):
            if now >= until:  # expired in Redis by now: nothing left to release
                self._orphans.pop(lease, None)
                continue
            if lease in self._active:
                continue  # still running: released when it ends
            try:
                await self.remote.release_barred(keys, lease, self.cfg.lease_s * 1000)
            except StoreError:
                return  # still down: the next round tries again
            self._orphans.pop(lease, None)

    # ------------------------------------------------------------------- request

    def _plan(self, ctx: RequestContext) -> _Plan:
        """The caller's buckets under every rule, as its key, user, tenant, role and
        model name them: the same for each of its requests (the rules are fixed for the
        plugin's life), so built once per caller and kept (at most `_PLANS`, the oldest
        going first)."""
        p = ctx.principal
        who = (p.key_id, p.tenant, p.user, p.role, ctx.model)
        plan = self._plans.get(who)
        if plan is not None:
            return plan
        rpm, tpm, conc = [], [], []
        per_of: dict[str, str] = {}
        for i, rule in enumerate(self.cfg.rules):
            value, bucket = _dimension(ctx, rule.per)
            lim: Limits = self._overrides[i].get(value, rule)
            base = f"{self.cfg.redis.key_prefix}{i}:{rule.per}:{bucket}"
            if lim.rpm:
                rpm.append(Bucket(base + ":r", lim.rpm, 1))
                per_of[base + ":r"] = f"{rule.per}:rpm"
            if lim.tpm:
                tpm.append((base + ":t", lim.tpm))
                per_of[base + ":t"] = f"{rule.per}:tpm"
            if lim.concurrent:
                conc.append((base + ":c", lim.concurrent))
                per_of[base + ":c"] = f"{rule.per}:concurrent"
        own = {}
        for key, rule_limit in per_of.items():
            per, limit = rule_limit.split(":")
            if per not in SHARED and limit in ("rpm", "tpm"):
                own[key] = limit
        plan = _Plan(rpm, tpm, conc, [k for k, _ in conc], per_of, own)
        if len(self._plans) >= _PLANS:
            self._plans.pop(next(iter(self._plans)))
        self._plans[who] = plan
        return plan

    @staticmethod
    def _headers(buckets: list[Bucket], states: list[BucketState],
                 own: dict[str, str]) -> dict[str, str]:
        """OpenAI's `x-ratelimit-*` headers: the tightest of the caller's own buckets (a
        shared rule's, `SHARED`, counts other tenants' traffic: it shows in none; `own`:
        the kind, rpm or tpm, of each of the caller's own buckets)."""
        h: dict[str, str] = {}
        tight: dict[str, BucketState] = {}
        for b, state in zip(buckets, states, strict=True):
            limit = own.get(b.key)
            if limit is not None and ((t := tight.get(limit)) is None
                                      or state.remaining < t.remaining):
                tight[limit] = state
        for limit, kind in (("rpm", "requests"), ("tpm", "tokens")):
            if (least := tight.get(limit)) is not None:
                h[f"x-ratelimit-limit-{kind}"] = str(least.limit)
                h[f"x-ratelimit-remaining-{kind}"] = str(max(0, least.remaining))
                h[f"x-ratelimit-reset-{kind}"] = fmt_reset(least.reset_ms)
        return h

    async def _standing(self, plan: _Plan) -> dict[str, str]:
        """The `x-ratelimit-*` headers of the caller's own buckets as they stand, none
        touched (a request refused before its admission: `_too_large`); none where the
        store does not answer (the refusal needs no store)."""
        peek = [Bucket(b.key, b.limit, 0) for b in plan.rpm if b.key in plan.own]
        peek += [Bucket(key, limit, 0) for key, limit in plan.tpm if key in plan.own]
        if not peek:
            return {}
        if self.remote is not None:  # (as `_admit` asks it)
            if not self._full:
                try:  # (a charge of nothing: each bucket's state, unchanged)
                    states = await self.remote.adjust(peek)
                except StoreError as e:
                    self._store_failed(e)
                else:
                    self._store_ok()
                    return self._headers(peek, states, plan.own)
            if self.cfg.on_store_error == "fail_closed":  # (no limiter counts meanwhile)
                return {}
        return self._headers(peek, await self.local.adjust(peek), plan.own)

    def _too_large(self, bucket: Bucket, least: int, per_of: dict[str, str],
                   headers: dict[str, str]) -> None:
        """OpenAI's 429 for a request larger than a minute's tokens: type `tokens`, the
        limit and what it asked for, no Retry-After (no wait lets it through: it would
        be a lie) and `x-should-retry: false` (the OpenAI SDKs would retry a 429), with
        the caller's own `x-ratelimit-*` headers as every other 429 of the limiter (a
        shared rule's limit is named in the message, what the request must fit, but its
        counts are in no header)."""
        per = per_of[bucket.key].split(":")[0]
        self.rejected.labels(per, "tpm").inc()
        raise RateLimited(
            f"Request too large for {_WHOSE[per]} on tokens per minute: Limit "
            f"{bucket.limit}, Requested {least}. The input or the output limit (the most "
            "tokens it may generate) must be reduced for it to run; no wait lets it through.",
            kind="tokens", headers={**headers, "x-should-retry": "false"})

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        req = ctx.request
        prompts = len(req.prompts()) if isinstance(req, CompletionRequest) else 1
        # Every prompt of a completion gets its own n choices, each up to the limit.
        # (`max_tokens: 0` with `echo` generates one token, not shown) Its prompts are
        # read once whatever `n` is, and counted once in its usage (OpenAI's, vLLM's,
        # Weir's engine: each prompt's tokens, not each choice's): the estimate, which
        # counts every prompt, is reserved once.
        most = req.output_limit
        out = (self.cfg.default_max_tokens if most is None else max(most, 1)) * prompts
        reserve = estimate_tokens(ctx) + out * max(1, req.n)
        plan = self._plan(ctx)
        rpm, conc, per_of = plan.rpm, plan.conc, plan.per_of
        tpm = [Bucket(key, limit, reserve) for key, limit in plan.tpm]
        # What it asked for at least past a minute's tokens can never be served within
        # the limit: refused before any bucket is touched, as OpenAI's "Request too
        # large". Only what the request fixes itself counts: each choice's `max_tokens`
        # (one token where it set none: the default reservation is Weir's guess; none
        # for an embedding) and its prompts of token ids. A text's estimate (its
        # characters / 4) overstates some text many times over (a run of spaces): it
        # refuses nothing for good. The message names the whole, estimate and all.
        asked = 0 if ctx.route == "embeddings" else (
            (out if most is not None else prompts) * max(1, req.n))
        if over := [b for b in tpm if _fixed_prompt_tokens(req) + asked > b.limit]:
            self._too_large(min(over, key=lambda b: b.limit), estimate_tokens(ctx) + asked,
                            per_of, await self._standing(plan))
        lease = new_hex()
        conc_keys = plan.conc_keys
        if self.remote is None:  # the memory store decides without yielding
            decision, store = await self._admit(rpm + tpm, conc, lease)
        else:
            # Redis decides in a task of its own: a client that leaves meanwhile does
            # not cut the call short, so what it granted is known and given back (and
            # only that: a refusal took nothing, and a refund then would refill the
            # bucket), after it ran (a release sent beside it could run first).
            admit = detach(self._admit(rpm + tpm, conc, lease))
            try:
                decision, store = await asyncio.shield(admit)
            except asyncio.CancelledError:
                admit.add_done_callback(
                    lambda t: self._undo(t, tpm, reserve, conc_keys, lease))
                raise
        states = decision.states
        headers = self._headers(rpm + tpm, states, plan.own)
        if not decision.allowed:
            culprit = _culprit(states, rpm + tpm, per_of)
            if culprit is None:  # no bucket lacked room: a concurrency limit refused it
                culprit = (per_of[conc[decision.full[0]][0]] if decision.full
                           else "any:concurrent")
            per, limit = culprit.split(":")
            self.rejected.labels(per, limit).inc()
            raise RateLimited(
                f"Rate limit reached ({_LIMITS[limit]} for {_WHOSE[per]}); retry after "
                "the time given in Retry-After.", kind="tokens" if limit == "tpm" else "requests",
                headers={**headers, **retry_headers(decision.retry_after_ms)})
        ctx.response_headers.update(headers)
        if conc_keys:
            self._active[lease] = (store, conc_keys)
            if store is self.remote and (self._full or self._degraded):
                # Redis admitted it as another call found Redis full or down (the two
                # crossed): `_hold_locally` ran before this lease was known.
                self.local.hold(conc_keys, lease, self.cfg.lease_s * 1000)
                self._restore.add(lease)
            elif (store is not self.remote and self.remote is not None
                  and not (self._full or self._degraded)):
                # The local limiter admitted it as Redis was seen back (the two crossed):
                # `_adopt_local` ran before this lease was known. Redis's from now on.
                self._active[lease] = (self.remote, conc_keys)
                self._restore.add(lease)
                self._start_rewrite()
        try:
            reply = await call_next(ctx)
        except BaseException:
            # Refunded, but for what a request cut (client gone, deadline) after the
            # engine had it spent until the cut. Shielded: a second cancellation must not
            # leave the lease behind.
            spent = (reserve if ctx.spent_unknown
                     else (ctx.usage_so_far or {}).get("total_tokens", 0))
            after = await self._settle_shielded(store, tpm, reserve, spent, conc_keys,
                                                lease)
            # Its error answer shows the token buckets after that refund (a request the
            # engine refused spent nothing), not its reservation taken at admission.
            ctx.response_headers.update(self._headers(tpm, [
                after.get(b.key, s) for b, s in zip(tpm, states[len(rpm):], strict=True)],
                plan.own))
            raise
        if isinstance(reply, Completion):
            used = (reply.body.get("usage") or {}).get("total_tokens")
            await self._settle_shielded(store, tpm, reserve, used, conc_keys, lease)
            return reply
        assert isinstance(reply, Stream)

        def ended(stream: Stream, outcome: Outcome) -> Awaitable[Any] | None:
            # A stream cut short reports the usage generated until the cut; without any
            # report the reservation stands (it completed) or is refunded (it did not).
            usage = stream.usage or {}
            used = usage.get("total_tokens")
            if used is None:
                used = reserve if outcome == "completed" else 0
            elif outcome != "completed" and not usage.get("prompt_tokens"):
                used += estimate_tokens(ctx)  # a relay cut before the upstream counted it
            settle = self._settle_shielded(store, tpm, reserve, used, conc_keys, lease)
            if store is self.remote:
                return settle  # (the stream awaits it, in a task of its own)
            # The memory store settles without pausing: here, at once, so the stream
            # needs no task to end (`Stream.end_shielded`).
            return run_now(settle)

        reply.on_end(ended)
        return reply


class _Plan(NamedTuple):
    """A caller's buckets (`RateLimitPlugin._plan`), its token buckets without their
    cost (each request's reservation)."""
    rpm: list[Bucket]
    tpm: list[tuple[str, int]]
    conc: list[tuple[str, int]]
    conc_keys: list[str]
    per_of: dict[str, str]  # bucket key -> "per:limit", its rule's
    own: dict[str, str]  # the caller's own buckets' keys (not `SHARED`) -> rpm or tpm


_PLANS = 4096  # callers whose plan is kept


def _owed(limit: int, reserve: int, used: int) -> int:
    """What settling adds to (or takes from) a token bucket that took `reserve` up to its
    `limit`: a measured `used` is charged whole, the reservation itself (an estimate
    standing for an unknown usage) what was taken."""
    taken = min(reserve, limit)
    return (taken if used == reserve else used) - taken


def _culprit(states: list[BucketState], buckets: list[Bucket],
             per_of: dict[str, str]) -> str | None:
    """The rule (`per:limit`) of a bucket that refused: one left empty first, then one
    with room for less than this request's cost (a token reservation larger than what is
    left); None when every bucket had room (a concurrency limit refused)."""
    pairs = list(zip(states, buckets, strict=True))
    for s, b in pairs:
        if s.remaining <= 0 and b.cost <= s.limit:
            return per_of[b.key]
    for s, b in pairs:
        if min(b.cost, s.limit) > s.remaining:
            return per_of[b.key]
    return None
