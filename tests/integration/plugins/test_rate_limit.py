"""Rate limits: one suite against both stores (memory and a real Redis), the HTTP
headers and 429s, two replicas sharing Redis under a burst, and Redis going away."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from bench.redis_server import RedisServer
from plugins.rate_limit.config import RateLimitConfig
from plugins.rate_limit.gcra import Bucket, MemoryStore, RedisStore
from plugins.rate_limit.plugin import RateLimitPlugin, fmt_reset
from proxy.app_state import STATE
from proxy.auth import Principal
from proxy.chain import Completion, Reply, Services, Stream
from proxy.context import RequestContext
from proxy.errors import RateLimited, Unavailable
from proxy.protocol import ChatCompletionRequest, CompletionRequest
from proxy.settings import Settings
from proxy.telemetry import Metrics
from tests.conftest import MakeClient, make_settings
from tests.fakes import FakeEngine, HoldingEngine
from tests.openai_spec import validate
from tests.sse import streams_cut_until_refused
from tests.waiting import eventually


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest, redis_server: RedisServer
                ) -> AsyncIterator[Any]:
    if request.param == "memory":
        yield MemoryStore()
        return
    s = RedisStore(redis_server.url, timeout_s=1.0)
    yield s
    await s.close()


def key() -> str:
    return f"weir:rltest:{uuid.uuid4().hex}"


async def test_burst_up_to_the_limit_then_refused(store: Any) -> None:
    b = key()
    got = [(await store.admit([Bucket(b, 5, 1)], [], "l", 1000)).allowed for _ in range(8)]
    assert got == [True] * 5 + [False] * 3
    d = await store.admit([Bucket(b, 5, 1)], [], "l", 1000)
    assert not d.allowed and 11_000 <= d.retry_after_ms <= 12_100  # one slot per 12 s


async def test_remaining_and_reset(store: Any) -> None:
    b = key()
    d = await store.admit([Bucket(b, 10, 1)], [], "l", 1000)
    assert d.states[0].limit == 10 and d.states[0].remaining == 9
    assert 5900 <= d.states[0].reset_ms <= 6100


@pytest.mark.parametrize("limit", [200_000_000, 10**12])
async def test_remaining_never_exceeds_the_limit_at_huge_limits(store: Any, limit: int) -> None:
    """At 200M tokens a minute one token is 0.0003 ms, under the clock's rounding
    allowance: the remaining count once read the limit plus 25."""
    b = key()
    for cost in (8, 1, 500):
        d = await store.admit([Bucket(b, limit, cost)], [], "l", 1000)
        assert d.allowed and 0 <= d.states[0].remaining <= limit - cost, d.states[0]
        await store.adjust([Bucket(b, limit, -cost)])  # a refund never lifts it past full
    d = await store.admit([Bucket(b, limit, 3)], [], "l", 1000)
    assert d.allowed and d.states[0].remaining <= limit - 3


async def test_token_costs_and_settling(store: Any) -> None:
    b = key()
    assert (await store.admit([Bucket(b, 1000, 800)], [], "l", 1000)).allowed
    assert not (await store.admit([Bucket(b, 1000, 300)], [], "l", 1000)).allowed
    await store.adjust([Bucket(b, 1000, -600)])  # the answer used 200, not 800
    d = await store.admit([Bucket(b, 1000, 300)], [], "l", 1000)
    assert d.allowed and 490 <= d.states[0].remaining <= 500


async def test_a_refused_request_reports_the_buckets_as_they_stand(store: Any) -> None:
    """A refused request takes nothing: every bucket's remaining count is what it was
    (those with room had reported what they would have had left after it)."""
    rpm, tpm = key(), key()
    assert (await store.admit([Bucket(rpm, 2, 1), Bucket(tpm, 1000, 30)], [], "l",
                              1000)).allowed
    assert (await store.admit([Bucket(rpm, 2, 1), Bucket(tpm, 1000, 30)], [], "l",
                              1000)).allowed
    d = await store.admit([Bucket(rpm, 2, 1), Bucket(tpm, 1000, 30)], [], "l", 1000)
    assert not d.allowed
    assert d.states[0].remaining == 0 and d.states[1].remaining == 940


async def test_all_buckets_or_none(store: Any) -> None:
    wide, narrow = key(), key()
    assert (await store.admit([Bucket(narrow, 1, 1)], [], "l", 1000)).allowed
    d = await store.admit([Bucket(wide, 100, 1), Bucket(narrow, 1, 1)], [], "l", 1000)
    assert not d.allowed
    d = await store.admit([Bucket(wide, 100, 1)], [], "l", 1000)
    assert d.states[0].remaining == 99  # the refused request charged nothing


async def test_concurrency_leases(store: Any) -> None:
    c = key()
    assert (await store.admit([], [(c, 2)], "a", 60_000)).allowed
    assert (await store.admit([], [(c, 2)], "b", 60_000)).allowed
    assert not (await store.admit([], [(c, 2)], "c", 60_000)).allowed
    await store.release([c], "a")
    assert (await store.admit([], [(c, 2)], "c", 60_000)).allowed


async def test_a_refusal_names_the_concurrency_limits_that_were_full(store: Any) -> None:
    wide, narrow = key(), key()
    assert (await store.admit([], [(wide, 5), (narrow, 1)], "a", 60_000)).allowed
    d = await store.admit([Bucket(key(), 10, 1)], [(wide, 5), (narrow, 1)], "b", 60_000)
    assert not d.allowed and d.full == (1,) and d.states[0].remaining == 10
    assert (await store.admit([], [(wide, 5), (narrow, 2)], "c", 60_000)).full == ()


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_a_concurrency_429_names_the_rule_that_was_full(
        backend: str, redis_server: RedisServer) -> None:
    """Two rules limit concurrency; the tenant's (2) is full, the key's (64) is not: the
    429 and its metric name the tenant's (they said "this request's limits", `any`)."""
    p = plugin(redis_server.url if backend == "redis" else None,
               rules=[{"per": "key", "concurrent": 64}, {"per": "tenant", "concurrent": 2}])
    hold, entered = asyncio.Event(), asyncio.Semaphore(0)

    async def held(c: RequestContext) -> Reply:
        entered.release()
        await hold.wait()
        return Completion({"usage": {"total_tokens": 5}})

    running = [asyncio.ensure_future(p(ctx(), held)) for _ in range(2)]
    for _ in running:
        await entered.acquire()
    with pytest.raises(RateLimited) as e:
        await p(ctx(), answer)
    assert "concurrent requests for this tenant" in e.value.message
    reg = p.services.metrics.registry
    assert reg.get_sample_value("weir_rate_limit_rejections_total",
                                {"per": "tenant", "limit": "concurrent"}) == 1
    hold.set()
    await asyncio.gather(*running)
    await p.close()


async def test_leases_expire(store: Any) -> None:
    c = key()
    assert (await store.admit([], [(c, 1)], "a", 50)).allowed
    await asyncio.sleep(0.12)  # the lease's own expiry is what is tested here
    assert (await store.admit([], [(c, 1)], "b", 50)).allowed


def test_memory_refill_with_an_injected_clock() -> None:
    now = [0.0]
    s = MemoryStore(lambda: now[0])
    b = key()

    async def admit() -> bool:
        return (await s.admit([Bucket(b, 60, 1)], [], "l", 1000)).allowed

    assert all(asyncio.run(_many(admit, 60)))
    assert not asyncio.run(admit())
    now[0] += 1000  # one second: one request back
    assert asyncio.run(admit()) and not asyncio.run(admit())


async def test_lost_releases_never_hold_a_memory_limit_nor_pile_up() -> None:
    now = [0.0]
    s = MemoryStore(lambda: now[0])
    c = key()
    for i in range(10):  # rounds of leases whose release never comes
        for j in range(3):
            assert (await s.admit([], [(c, 3)], f"{i}-{j}", 50)).allowed
        assert not (await s.admit([], [(c, 3)], f"{i}-x", 50)).allowed
        assert s.in_flight() == 3
        now[0] += 100  # every lease of the round has expired
        assert s.in_flight() == 0
    assert len(s._leases[c]) <= 3


async def test_the_memory_store_forgets_what_has_expired() -> None:
    """Every key ever seen stayed in the memory store (a bucket long full again, an empty
    lease set): a gateway's callers (`on_behalf_of`), each a tenant and a user of its own,
    grew it without end (200,000 callers: 164 MB). What has expired goes now; what has
    not still holds."""
    now = [0.0]
    s = MemoryStore(lambda: now[0])
    held = key()
    for _ in range(2):  # a bucket emptied a moment ago, and a lease still running
        assert (await s.admit([Bucket(held + ":r", 2, 1)], [], "x", 1000)).allowed
    assert (await s.admit([], [(held + ":c", 1)], "x", 1e9)).allowed
    for i in range(50_000):  # one new caller a millisecond, each gone after its request
        now[0] += 1
        c = f"{key()}:{i}"
        assert (await s.admit([Bucket(c + ":r", 120, 1), Bucket(c + ":t", 10**5, 300)],
                              [(c + ":c", 4)], f"l{i}", 30_000)).allowed
        await s.release([c + ":c"], f"l{i}")
    assert len(s._tat) + len(s._leases) < 20_000  # (it held 150,000)
    # (what has not expired holds: the lease, and the bucket while it is not yet full)
    assert not (await s.admit([], [(held + ":c", 1)], "y", 1000)).allowed
    now[0] = 0
    assert not (await s.admit([Bucket(held + ":r", 2, 1)], [], "z", 1000)).allowed


@pytest.mark.parametrize("limit", [1, 3, 7, 10, 13, 22, 100, 1000])
async def test_a_full_bucket_admits_exactly_its_limit_whatever_the_clock_reads(
        limit: int) -> None:
    """Float milliseconds lose their last bits at large clock values (a monotonic clock
    after days, Redis TIME always); a full bucket must still admit `limit` requests,
    counting remaining down to 0, then refuse, and a request costing the whole bucket
    must be admitted."""
    import random

    rng = random.Random(limit)
    for _ in range(200):
        now = rng.uniform(1e5, 1e13)
        s = MemoryStore(lambda now=now: now)  # type: ignore[misc]
        got = [await s.admit([Bucket("k", limit, 1)], [], "l", 1000) for _ in range(limit + 1)]
        assert [d.allowed for d in got] == [True] * limit + [False], now
        assert [d.states[0].remaining for d in got[:limit]] == list(range(limit - 1, -1, -1))
        whole = await s.admit([Bucket("whole", limit, limit)], [], "l", 1000)
        assert whole.allowed and whole.states[0].remaining == 0, now


async def test_redis_a_request_costing_the_whole_bucket_is_admitted(
        redis_server: RedisServer) -> None:
    """An empty bucket's first request reserving all of it (limit x T ms ahead: the
    period, up to the last bits) is admitted with nothing left, for every limit. (Redis
    TIME moves on between calls by far more than the rounding, so the memory store's
    fixed clocks above are where the rounding itself is pinned down.)"""
    s = RedisStore(redis_server.url, timeout_s=1.0)
    try:
        refused = []
        for limit in range(1, 301):
            d = await s.admit([Bucket(key(), limit, limit)], [], "l", 1000)
            if not d.allowed or d.states[0].remaining != 0:
                refused.append(limit)
        assert refused == []
    finally:
        await s.close()


@pytest.mark.parametrize("poison", ["garbage", "nan", "inf", "1e300", "hash", "far"])
async def test_what_redis_holds_that_no_admission_wrote_is_an_empty_bucket(
        redis_server: RedisServer, poison: str) -> None:
    """Anything may sit under the limiter's keys (garbage, another type, a time no clock
    reads, one without the expiry every write sets): the bucket reads as empty, and is
    written over. It had failed every admission of the bucket (a 503 with fail_closed)
    or refused each with a 1 ms Retry-After, and such a key never expires."""
    import redis.asyncio as aioredis

    r = aioredis.from_url(redis_server.url)
    s = RedisStore(redis_server.url, timeout_s=1.0)
    bucket, leases = key(), key()
    try:
        if poison == "hash":
            await r.hset(bucket, "a", "b")
        elif poison == "far":  # a time an hour ahead, with no expiry
            now = await r.time()
            await r.set(bucket, repr((now[0] + 3600) * 1000.0))
        else:
            await r.set(bucket, poison)
        await r.set(leases, "garbage")
        d = await s.admit([Bucket(bucket, 10, 1)], [(leases, 1)], "a", 60_000)
        assert d.allowed and d.states[0].remaining == 9
        assert not (await s.admit([], [(leases, 1)], "b", 60_000)).allowed
        await s.adjust([Bucket(bucket, 10, 1)])
        await s.renew({"a": [leases]}, 60_000)
        await s.release([leases], "a")
        d = await s.admit([Bucket(bucket, 10, 1)], [(leases, 1)], "b", 60_000)
        assert d.allowed and d.states[0].remaining == 7
        assert 0 < await r.pttl(bucket) <= 60_000 + 2000
    finally:
        await s.close()
        await r.aclose()


async def _many(fn: Any, n: int) -> list[bool]:
    return [await fn() for _ in range(n)]


def test_reset_format() -> None:
    assert [fmt_reset(x) for x in (20, 999.2, 1000, 59_500, 360_000)] == [
        "20ms", "1000ms", "1s", "1m0s", "6m0s"]


# ------------------------------------------------------------------ the plugin


def ctx(principal: Principal | None = None, **kw: Any) -> RequestContext:
    req = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "x" * 40}], "max_tokens": 10,
         **kw})
    return RequestContext(route="chat", request=req, request_id="r",
                          principal=principal or Principal("t", "user", "u", key_id="k1"))


def plugin(redis_url: str | None = None, **cfg: Any) -> RateLimitPlugin:
    if redis_url:
        cfg = {"store": "redis", "redis": {"url": redis_url, "key_prefix": key() + ":",
                                           "timeout_s": 0.2}, **cfg}
    services = Services(terminal=FakeEngine(), settings=Settings(), metrics=Metrics())
    return RateLimitPlugin(RateLimitConfig.model_validate(cfg), services)


async def answer(c: RequestContext) -> Reply:
    return Completion({"usage": {"total_tokens": 5}})


class Holding:
    """A handler whose requests run until `release` is set, counting those running."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.running = 0

    async def __call__(self, c: RequestContext) -> Reply:
        self.running += 1
        try:
            await self.release.wait()
        finally:
            self.running -= 1
        return Completion({})


def patient_plugin(redis_url: str, **cfg: Any) -> RateLimitPlugin:
    """A Redis-backed plugin whose Redis calls no busy machine cuts (`timeout_s` 5)."""
    return plugin(redis_url, redis={"url": redis_url, "key_prefix": key() + ":",
                                    "timeout_s": 5.0}, **cfg)


def held_until(release: asyncio.Event) -> Callable[[RequestContext], Awaitable[Reply]]:
    """A handler whose request runs until `release` is set."""
    async def held(c: RequestContext) -> Reply:
        await release.wait()
        return Completion({})
    return held


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_plugin_429_headers(backend: str, redis_server: RedisServer) -> None:
    p = plugin(redis_server.url if backend == "redis" else None,
               rules=[{"per": "key", "rpm": 2, "tpm": 1000}])
    c = ctx()
    await p(c, answer)
    assert c.response_headers["x-ratelimit-limit-requests"] == "2"
    assert c.response_headers["x-ratelimit-remaining-requests"] == "1"
    assert c.response_headers["x-ratelimit-limit-tokens"] == "1000"
    await p(ctx(), answer)
    with pytest.raises(RateLimited) as e:
        await p(ctx(), answer)
    h = e.value.headers
    assert e.value.status == 429 and e.value.code == "rate_limit_exceeded"
    assert int(h["retry-after"]) >= 1 and int(h["retry-after-ms"]) > 0
    assert h["x-ratelimit-remaining-requests"] == "0"
    other = ctx(Principal("t", "user", "u2", key_id="k2"))
    await p(other, answer)  # another key has its own bucket
    await p.close()


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_plugin_releases_on_every_outcome(backend: str, redis_server: RedisServer) -> None:
    p = plugin(redis_server.url if backend == "redis" else None,
               rules=[{"per": "tenant", "concurrent": 3}])

    async def boom(c: RequestContext) -> Reply:
        raise RuntimeError("engine")

    async def stream(c: RequestContext) -> Reply:
        async def chunks() -> AsyncIterator[dict[str, Any]]:
            yield {"choices": []}
            yield {"choices": [], "usage": {"total_tokens": 3}}
        return Stream(chunks())

    for i in range(60):
        handler = (answer, boom, stream)[i % 3]
        try:
            reply = await p(ctx(), handler)
        except RuntimeError:
            continue
        if isinstance(reply, Stream):
            async for _ in reply:
                if i % 2:
                    break
            await reply.aclose()
    c = ctx()
    for _ in range(3):  # all three slots are free again
        await p(c, answer)
    if backend == "memory":
        assert p.local.in_flight() == 0
    else:
        assert p.remote is not None
        keys = await p.remote.client.keys(p.cfg.redis.key_prefix + "*:c")
        for k in keys:
            assert await p.remote.client.zcard(k) == 0
    await p.close()


async def test_fail_open_and_fail_closed(tmp_path: Path) -> None:
    server = RedisServer(tmp_path).start()
    url = server.url
    server.stop()
    p = plugin(url, rules=[{"per": "key", "rpm": 1}])
    await p(ctx(), answer)  # Redis is down: the local limiter decides
    with pytest.raises(RateLimited):
        await p(ctx(), answer)
    assert p.health() == {"store": "local-fallback"}
    closed = plugin(url, on_store_error="fail_closed", rules=[{"per": "key", "rpm": 1}])
    with pytest.raises(Unavailable):
        await closed(ctx(), answer)
    assert closed.health() == {"store": "unavailable"}  # it falls back to nothing
    again = RedisServer(tmp_path, port=server.port).start()
    try:
        await p(ctx(Principal("t", "user", "u", key_id="fresh")), answer)
        assert p.health() == {"store": "redis"}
    finally:
        again.stop()
        await p.close()
        await closed.close()


async def test_two_replicas_share_one_limit(make_client: MakeClient, redis_server: RedisServer
                                            ) -> None:
    prefix = key() + ":"
    # A generous store timeout: this test is about sharing one limit, and a busy machine
    # must not push a replica onto its local fallback mid-burst.
    cfg = {"store": "redis", "redis": {"url": redis_server.url, "key_prefix": prefix,
                                       "timeout_s": 3},
           "rules": [{"per": "tenant", "rpm": 20}]}
    clients = []
    for _ in range(2):
        settings = make_settings(plugins=[{"name": "rate_limit", "config": cfg}])
        clients.append(await make_client(settings, engine=FakeEngine()))
    body = {"model": "fake-model", "max_tokens": 1,
            "messages": [{"role": "user", "content": "hi"}]}
    replies = await asyncio.gather(*(clients[i % 2].post("/v1/chat/completions", json=body)
                                     for i in range(80)))
    statuses = [r.status for r in replies]
    ok = statuses.count(200)
    assert 20 <= ok <= 21  # the limit, plus at most one refill during the burst
    assert statuses.count(429) == 80 - ok
    rejected = next(r for r in replies if r.status == 429)
    validate("ErrorResponse", await rejected.json())
    assert int(rejected.headers["Retry-After"]) >= 1
    accepted = next(r for r in replies if r.status == 200)
    assert accepted.headers["x-ratelimit-limit-requests"] == "20"
    for c in clients:
        rl = next(p for p in c.app[STATE].plugins if p.name == "rate_limit")
        assert not rl._degraded


async def test_client_gone_during_admit_leaves_no_lease(redis_server: RedisServer) -> None:
    p = plugin(redis_server.url, rules=[{"per": "tenant", "concurrent": 1, "tpm": 10_000}])
    assert p.remote is not None
    real_admit = p.remote.admit
    decided, reply, settled = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def admit_then_reply_late(*args: Any) -> Any:
        d = await real_admit(*args)  # the script ran on Redis: the lease is taken
        decided.set()
        await reply.wait()  # ... and its reply arrives after the client left
        return d

    real_settle = p._settle

    async def settle(*args: Any) -> None:
        await real_settle(*args)
        settled.set()

    p.remote.admit = admit_then_reply_late  # type: ignore[method-assign]
    p._settle = settle  # type: ignore[method-assign]
    task = asyncio.create_task(p(ctx(), answer))
    await decided.wait()
    task.cancel()  # the client hangs up
    with pytest.raises(asyncio.CancelledError):
        await task
    reply.set()
    await settled.wait()  # what the admission granted is given back once it is known
    p.remote.admit = real_admit  # type: ignore[method-assign]
    await p(ctx(), answer)  # the single slot is free again
    for key in await p.remote.client.keys(p.cfg.redis.key_prefix + "*:c"):
        assert await p.remote.client.zcard(key) == 0
    await p.close()


async def test_client_gone_during_a_refused_admit_is_refunded_nothing(
        redis_server: RedisServer) -> None:
    """Redis refused the request (its bucket was full) while its client left: nothing was
    taken, so nothing is given back. A refund there refilled the bucket: a tenant at its
    limit could reset it by sending large requests and hanging up at once."""
    p = plugin(redis_server.url, rules=[{"per": "key", "tpm": 1000}])
    assert p.remote is not None

    async def heavy(c: RequestContext) -> Reply:
        return Completion({"usage": {"total_tokens": 990}})

    await p(ctx(), heavy)  # 990 of 1,000 charged
    with pytest.raises(RateLimited):
        await p(ctx(max_tokens=500), answer)
    real_admit, real_decide = p.remote.admit, p._admit
    decided, reply, returned = asyncio.Event(), asyncio.Event(), asyncio.Event()
    refused: list[bool] = []

    async def refused_late(*args: Any) -> Any:
        d = await real_admit(*args)
        refused.append(not d.allowed)
        decided.set()
        await reply.wait()
        return d

    async def decide(*args: Any) -> Any:
        try:
            return await real_decide(*args)
        finally:
            returned.set()

    p.remote.admit = refused_late  # type: ignore[method-assign]
    p._admit = decide  # type: ignore[method-assign]
    task = asyncio.create_task(p(ctx(max_tokens=900), answer))  # (within a minute's)
    await decided.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    reply.set()
    await returned.wait()
    assert refused == [True]
    p.remote.admit = real_admit  # type: ignore[method-assign]
    with pytest.raises(RateLimited):
        await p(ctx(max_tokens=500), answer)  # the bucket is as full as it was
    await p.close()


async def test_names_holding_a_separator_keep_their_own_buckets() -> None:
    """Tenant `a/b` with user `c` and tenant `a` with user `b/c` joined to one bucket name
    (`a/b/c`): two callers drew on one limit. Overrides still name users as `tenant/user`,
    an e-mail address included."""
    p = plugin(None, rules=[{"per": "user", "rpm": 1, "overrides": {
        "acme/alice@example.com": {"rpm": 2}}}])
    await p(ctx(Principal("a/b", "user", "c", key_id="k1")), answer)
    await p(ctx(Principal("a", "user", "b/c", key_id="k2")), answer)  # a bucket of its own
    with pytest.raises(RateLimited):
        await p(ctx(Principal("a", "user", "b/c", key_id="k2")), answer)
    alice = Principal("acme", "user", "alice@example.com", key_id="k3")
    await p(ctx(alice), answer)
    await p(ctx(alice), answer)  # her override's 2
    with pytest.raises(RateLimited):
        await p(ctx(alice), answer)
    await p.close()


async def test_every_prompt_of_a_completion_reserves_its_own_output() -> None:
    """256 prompts x n 8 is 2,048 generations: the reservation is theirs, not one's."""
    from proxy.protocol import CompletionRequest

    p = plugin(None, rules=[{"per": "key", "tpm": 1000}])

    def completion(prompts: int) -> RequestContext:
        req = CompletionRequest.model_validate({"model": "m", "prompt": ["x"] * prompts,
                                                "n": 2, "max_tokens": 100})
        return RequestContext(route="completions", request=req,
                              principal=Principal("t", "user", "u", key_id="k"),
                              request_id="r")

    async def unsettled(c: RequestContext) -> Reply:
        return Completion({})  # no usage: the reservation stands

    c = completion(1)
    await p(c, unsettled)  # 1 token of prompt + 100 x 2 choices = 201
    assert c.response_headers["x-ratelimit-remaining-tokens"] == str(1000 - 201)
    with pytest.raises(RateLimited):
        await p(completion(4), unsettled)  # 2 + 400 x 2 = 802 > 799 left
    await p(completion(3), unsettled)  # 1 + 300 x 2 = 601
    await p.close()


@pytest.mark.parametrize("route", ["chat", "completions"])
async def test_a_prompt_is_reserved_once_whatever_its_choices(route: str) -> None:
    """`n` choices of one prompt read it once: the usage counts its tokens once (OpenAI's,
    vLLM's, Weir's engine), each prompt of a completion once, not once per choice. The
    reservation took the prompt's estimate n times over: a long prompt with `n: 4`
    reserved four prompts, and a caller with room for it was refused."""
    from proxy.protocol import CompletionRequest

    p = plugin(None, rules=[{"per": "key", "tpm": 1000}])
    text = "x" * 1596  # an estimate of 400 tokens, 200 for each of two prompts
    if route == "chat":
        c = ctx(messages=[{"role": "user", "content": text}], n=4, max_tokens=10)
    else:  # (two prompts of 199 + 1 tokens each: 400 together, whatever n is)
        c = RequestContext(route="completions", request=CompletionRequest.model_validate(
            {"model": "m", "prompt": ["x" * 798] * 2, "n": 2, "max_tokens": 10}),
            principal=Principal("t", "user", "u", key_id="k1"), request_id="r")

    async def unsettled(c: RequestContext) -> Reply:
        return Completion({})  # no usage: the reservation stands

    await p(c, unsettled)  # 400 of prompt + 10 x 4 generations = 440 (not 1,640)
    assert c.response_headers["x-ratelimit-remaining-tokens"] == str(1000 - 440)
    await p.close()


async def test_a_cancellation_redis_loses_still_stops_the_request(
        redis_server: RedisServer) -> None:
    """The client left while Redis decided, and the command lost the cancellation (on
    Python 3.11 redis-py's `wait_for` returns the result it got instead): the request
    stops there, before generating, and its lease is given back."""
    p = plugin(redis_server.url, rules=[{"per": "tenant", "concurrent": 1, "tpm": 10_000}])
    assert p.remote is not None
    script = p.remote._admit
    decided, reply, settled = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def admit_losing_the_cancellation(**kw: Any) -> Any:
        result = await script(**kw)  # the script ran on Redis: the lease is taken
        decided.set()
        try:
            await reply.wait()  # the reply is on its way when the client leaves
        except asyncio.CancelledError:
            pass  # ... and the command returns it all the same
        return result

    generated: list[bool] = []

    async def generate(c: RequestContext) -> Reply:
        generated.append(True)
        return await answer(c)

    real_settle = p._settle

    async def settle(*args: Any) -> None:
        await real_settle(*args)
        settled.set()

    p.remote._admit = admit_losing_the_cancellation  # type: ignore[assignment]
    p._settle = settle  # type: ignore[method-assign]
    task = asyncio.create_task(p(ctx(), generate))
    await decided.wait()
    task.cancel()  # the client hangs up
    with pytest.raises(asyncio.CancelledError):
        await task
    assert generated == []
    reply.set()
    await settled.wait()
    p.remote._admit = script
    await p(ctx(), answer)  # the single slot is free again
    for k in await p.remote.client.keys(p.cfg.redis.key_prefix + "*:c"):
        assert await p.remote.client.zcard(k) == 0
    await p.close()


async def test_a_token_reservation_larger_than_the_room_left_is_named_a_tpm_refusal() -> None:
    """The token bucket still has room, but less than this request reserves: the 429 and
    its metric name the token limit, not a concurrency limit."""
    p = plugin(rules=[{"per": "key", "tpm": 100}])

    async def used_60(c: RequestContext) -> Reply:
        return Completion({"usage": {"total_tokens": 60}})

    await p(ctx(), used_60)  # ~40 tokens left
    with pytest.raises(RateLimited) as e:
        await p(ctx(max_tokens=60), answer)
    assert "tokens per minute" in e.value.message
    reg = p.services.metrics.registry
    assert reg.get_sample_value("weir_rate_limit_rejections_total",
                                {"per": "key", "limit": "tpm"}) == 1
    assert not reg.get_sample_value("weir_rate_limit_rejections_total",
                                    {"per": "any", "limit": "concurrent"})
    await p.close()


@pytest.mark.parametrize("where", ["memory", "redis"])
async def test_a_reservation_past_the_limit_is_settled_from_what_was_taken(
        where: str, redis_server: RedisServer) -> None:
    """A request may reserve more than a minute's tokens (its bucket takes the limit at
    most) where it set no maximum (the default reservation; one whose own `max_tokens`
    passes the limit is refused up front). It is settled from what the bucket took:
    settled from the whole reservation, an answer of 800 tokens against a 1,000 limit
    was charged nothing, and a user spent 2,400 tokens in a minute against a limit of
    1,000 (found by an adversarial pass)."""
    p = plugin(redis_server.url if where == "redis" else None, default_max_tokens=1900,
               rules=[{"per": "key", "tpm": 1000}])

    async def used_800(c: RequestContext) -> Reply:
        return Completion({"usage": {"total_tokens": 800}})

    await p(ctx(max_tokens=None), used_800)  # reserves past the limit, uses 800
    with pytest.raises(RateLimited):  # 800 of 1,000 spent: 600 more do not fit
        await p(ctx(max_tokens=600), answer)
    await p.close()


def test_an_estimate_past_the_limit_is_charged_what_was_taken() -> None:
    """Where the usage is unknown (an upstream answer cut, a stream without usage) the
    reservation stands, as far as the bucket took it: a reservation of millions (n=128,
    a huge max_tokens) must not block a bucket, perhaps a model's or everyone's, for
    hours; a measured usage is charged whole."""
    from plugins.rate_limit.plugin import _owed

    assert _owed(100_000, 12_800_000, 12_800_000) == 0  # the estimate: what was taken
    assert _owed(1000, 1900, 800) == -200  # measured: charged whole (800 of 1,000 taken)
    assert _owed(1000, 500, 800) == 300
    assert _owed(1000, 500, 100) == -400


async def test_streams_cut_short_are_charged_what_they_generated(make_client: MakeClient
                                                                 ) -> None:
    """A client that drops each stream just before its end is charged the tokens it was
    sent (the usage until the cut), so a token limit still stops it: it got them all
    back before."""
    engine = HoldingEngine(after=40)  # 40 tokens out, then the stream waits
    client = await make_client(engine=engine, plugins=[{"name": "rate_limit", "config": {
        "rules": [{"per": "tenant", "tpm": 200}]}}])
    st = client.app[STATE]
    body = {"model": "fake-model", "max_tokens": 50, "stream": True,
            "messages": [{"role": "user", "content": "hi"}]}
    # ~45 tokens charged a cut: the fifth is refused
    statuses = await streams_cut_until_refused(client, body, events=40, rounds=8,
                                               idle=lambda: st.in_flight == 0)
    assert statuses[-1] == 429 and 3 <= len(statuses) - 1 <= 5


async def test_health_sees_redis_back_without_waiting_for_a_request(tmp_path: Path) -> None:
    """On its local fallback the limiter checks Redis in its background round: health
    reads `redis` again once Redis is back, with no request in between."""
    server = RedisServer(tmp_path).start()
    url = server.url
    server.stop()
    p = plugin(url, lease_s=1, rules=[{"per": "key", "rpm": 100}])
    await p.start()
    again = None
    try:
        await p(ctx(), answer)  # Redis is down: the local limiter decides
        assert p.health() == {"store": "local-fallback"}
        again = RedisServer(tmp_path, port=server.port).start()
        await eventually(lambda: p.health() == {"store": "redis"}, timeout=5)
    finally:
        if again is not None:
            again.stop()
        await p.close()


async def test_an_outages_orphan_leases_are_dropped_once_expired_in_redis(
        tmp_path: Path) -> None:
    """Each request's admit that failed while Redis was down left a lease to release
    there, kept until Redis answered: one per request for the whole outage. A lease no
    one renews expires in Redis after `lease_s`, and then there is nothing to release."""
    server = RedisServer(tmp_path).start()
    url = server.url
    server.stop()
    p = plugin(url, lease_s=1, rules=[{"per": "key", "rpm": 1000, "concurrent": 4}])
    try:
        for _ in range(20):
            await p(ctx(), answer)  # the local fallback decides
        assert not p.idle()  # leases Redis may hold, Redis still down
        await eventually(p.idle, timeout=5)  # expired there: dropped here
    finally:
        await p.close()


async def test_an_error_after_the_limiter_charged_carries_its_headers(
        make_client: MakeClient) -> None:
    """A request the limiter charged and something later refused (the engine's context
    limit, a shed) still tells the client its limits, as an answer would."""
    engine = FakeEngine()
    engine.token_gate = asyncio.Event()
    client = await make_client(engine=engine, plugins=[
        {"name": "rate_limit", "config": {"rules": [{"per": "tenant", "rpm": 100,
                                                     "tpm": 1_000_000}]}},
        {"name": "admission", "config": {"max_concurrent": 1, "max_queue": 0}}])
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
    too_long = await client.post("/v1/chat/completions", json={**body, "max_tokens": 10_000})
    running = asyncio.create_task(client.post("/v1/chat/completions", json=body))
    await engine.wait_until(lambda: bool(engine.active))
    shed = await client.post("/v1/chat/completions", json=body)
    engine.token_gate.set()
    assert (await running).status == 200
    for r, status in ((too_long, 400), (shed, 503)):
        assert r.status == status
        validate("ErrorResponse", await r.json())
        assert r.headers["x-ratelimit-limit-requests"] == "100"
        assert int(r.headers["x-ratelimit-remaining-requests"]) < 100


async def test_an_error_answer_shows_each_tenant_its_own_limits(make_client: MakeClient
                                                                ) -> None:
    """The embedding model failed to load: every embeddings request is a 503 after the
    limiter charged it, and each tenant's 503 carries its own tenant's limits (headers
    travel with the request, never on an error object several requests share)."""
    keys = [{"key": "k-alice", "tenant": "acme", "user": "alice"},
            {"key": "k-eve", "tenant": "globex", "user": "eve"}]
    cfg = {"rules": [{"per": "tenant", "rpm": 1000, "overrides": {"globex": {"rpm": 7}}}]}
    client = await make_client(make_settings(
        auth={"mode": "keys", "keys": keys},
        embeddings={"enabled": True, "model": "/nonexistent/emb"},
        plugins=[{"name": "rate_limit", "config": cfg}]), engine=FakeEngine())
    body = {"model": "all-MiniLM-L6-v2", "input": "hi"}
    seen = {}
    for k in ("k-alice", "k-eve", "k-eve"):
        r = await client.post("/v1/embeddings", json=body,
                              headers={"Authorization": f"Bearer {k}"})
        assert r.status == 503
        seen[k] = r.headers.get("x-ratelimit-limit-requests")
    assert seen == {"k-alice": "1000", "k-eve": "7"}


async def _cut_until_refused(client: Any, engine: HoldingEngine, body: dict[str, Any],
                             rounds: int) -> list[int]:
    """Send `body` and hang up once the engine is at its hold (or, without tokens, has the
    request), again and again until a request is refused; the statuses (0: cut)."""
    st = client.app[STATE]
    statuses = []
    for _ in range(rounds):
        task = asyncio.create_task(client.post("/v1/chat/completions", json=body))
        there = asyncio.ensure_future(engine.wait_until(
            lambda: len(engine.active) == 1 and (engine.token_gate is not None
                                                 or engine.held == 1)))
        await asyncio.wait([task, there], return_when=asyncio.FIRST_COMPLETED)
        if task.done():  # refused before the engine saw it
            there.cancel()
            r = task.result()
            statuses.append(r.status)
            error = (await r.json())["error"]
            assert error["code"] == "rate_limit_exceeded" and "tokens per minute" in error[
                "message"]
            break
        statuses.append(0)
        task.cancel()  # hang up before anything came back
        await asyncio.gather(task, return_exceptions=True)
        await eventually(lambda: st.in_flight == 0 and not engine.active)
    return statuses


BODY = {"model": "fake-model", "max_tokens": 50,
        "messages": [{"role": "user", "content": "a question of several words " * 4}]}


async def test_whole_answers_cut_before_they_came_back_are_charged_what_they_spent(
        make_client: MakeClient) -> None:
    """A client that hangs up on each non-streamed request once the engine has generated
    most of it is charged the prompt and the tokens generated until the cut: a token
    limit still stops it (it was refunded everything before)."""
    engine = HoldingEngine(after=40)
    client = await make_client(engine=engine, plugins=[{"name": "rate_limit", "config": {
        "rules": [{"per": "tenant", "tpm": 300}]}}])
    statuses = await _cut_until_refused(client, engine, BODY, rounds=12)
    assert statuses[-1] == 429 and len(statuses) - 1 >= 2, statuses


async def test_what_the_engine_had_not_read_is_not_charged(make_client: MakeClient) -> None:
    """Cut before the engine's first token (queued in it, or reading the prompt): nothing
    was generated, and the prompt may not have been read (a backlog's deadline cuts must
    not turn into the client's 429s): refunded."""
    engine = HoldingEngine(after=1)
    engine.token_gate = asyncio.Event()  # the engine has the request, no token yet
    client = await make_client(engine=engine, plugins=[{"name": "rate_limit", "config": {
        "rules": [{"per": "tenant", "tpm": 300}]}}])
    for stream in (False, True):
        statuses = await _cut_until_refused(client, engine, {**BODY, "stream": stream},
                                            rounds=8)
        assert statuses == [0] * 8


async def test_a_drains_cut_is_not_charged(make_client: MakeClient) -> None:
    """A request cut by a drain gets a 503 that says to retry on another replica: with a
    shared limiter, charging it would charge that retry twice."""
    engine = HoldingEngine(after=40)
    client = await make_client(engine=engine, plugins=[{"name": "rate_limit", "config": {
        "rules": [{"per": "tenant", "tpm": 600}]}}])
    st = client.app[STATE]
    task = asyncio.create_task(client.post("/v1/chat/completions", json=BODY))
    await engine.wait_until(lambda: engine.held == 1)
    st.draining = True
    assert await st.abort_all() == 1
    r = await task
    assert r.status == 503 and (await r.json())["error"]["code"] == "shutting_down"
    st.draining = False
    engine.hold.set()
    await eventually(lambda: st.in_flight == 0 and not engine.active)
    r = await client.post("/v1/chat/completions", json={**BODY, "max_tokens": 5})
    assert r.status == 200
    # only this request's reservation (~35) is gone from the bucket; charging the cut
    # (its prompt and 40 tokens) would leave ~500
    assert int(r.headers["x-ratelimit-remaining-tokens"]) >= 550


@pytest.mark.parametrize("unknown", [True, False])
async def test_a_cut_whose_spend_no_one_counted_is_charged_its_reservation(
        unknown: bool) -> None:
    """A terminal step that cannot say what a cut request spent (an upstream's whole
    answer) marks it `spent_unknown`: its reservation is charged, not refunded."""
    p = plugin(rules=[{"per": "tenant", "tpm": 1000}])

    async def cut(c: RequestContext) -> Reply:
        c.spent_unknown = unknown
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await p(ctx(), cut)
    c = ctx(max_tokens=1)
    await p(c, answer)
    left = int(c.response_headers["x-ratelimit-remaining-tokens"])
    # the cut's reservation (its ~10-token prompt estimate and 10 output tokens) stays
    # charged, or all of it came back
    assert (left < 985) is unknown, left
    await p.close()


@pytest.mark.parametrize(("rule", "fault"), [
    ({"per": "user", "rpm": 100, "overrides": {"flooder": {"rpm": 5}}}, "acme/flooder"),
    ({"per": "role", "rpm": 100, "overrides": {"analyst": {"rpm": 2}}}, "acme/analyst"),
    ({"per": "user", "rpm": 100, "overrides": {"/x": {"rpm": 2}}}, "tenant/user"),
    ({"per": "global", "rpm": 100, "overrides": {"*": {"rpm": 2}}}, "global rule"),
    ({"per": "tenant", "rpm": 100, "overrides": {"vip": {}}}, "names no limit"),
])
def test_an_override_that_can_never_match_is_a_config_error(rule: dict[str, Any],
                                                            fault: str) -> None:
    """Users and roles are counted within their tenant (`acme/alice`): an override keyed
    `alice` never applied, and nothing said so."""
    with pytest.raises(ValueError, match=fault.replace("*", r"\*")):
        RateLimitConfig.model_validate({"rules": [rule]})


async def test_a_per_user_override_applies(make_client: MakeClient) -> None:
    keys = [{"key": "k-flood", "tenant": "acme", "user": "flooder"},
            {"key": "k-calm", "tenant": "acme", "user": "calm"}]
    cfg = {"rules": [{"per": "user", "rpm": 100, "overrides": {"acme/flooder": {"rpm": 2}}}]}
    client = await make_client(make_settings(auth={"mode": "keys", "keys": keys},
                                             plugins=[{"name": "rate_limit", "config": cfg}]))
    body = {"model": "fake-model", "max_tokens": 2,
            "messages": [{"role": "user", "content": "hi"}]}

    async def status(key: str) -> int:
        r = await client.post("/v1/chat/completions", json=body,
                              headers={"Authorization": f"Bearer {key}"})
        return r.status

    assert [await status("k-flood") for _ in range(3)] == [200, 200, 429]
    assert [await status("k-calm") for _ in range(3)] == [200, 200, 200]


async def test_a_store_failing_only_some_calls_is_logged_as_a_pair_a_while(
        redis_server: RedisServer, logs: Any) -> None:
    """A Redis out of memory fails writes and answers the rest: each answer said the
    store was back, each failure (once a while) that it was down: hundreds of lines."""
    from plugins.rate_limit.gcra import StoreError

    p = plugin(redis_server.url, rules=[{"per": "key", "rpm": 1000}],
               on_store_error="fail_open")
    assert p.remote is not None
    real = p.remote.admit
    calls = 0

    async def flapping(*args: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls % 2:
            raise StoreError("ResponseError")
        return await real(*args)

    p.remote.admit = flapping  # type: ignore[method-assign]
    for _ in range(20):
        await p(ctx(), answer)
    await p.close()
    said = [json.loads(x)["event"] for x in logs.getvalue().splitlines()
            if "rate-limit store" in x]
    assert said == ["rate-limit store unavailable", "rate-limit store is back"]


async def test_an_override_changes_only_what_it_names(make_client: MakeClient) -> None:
    """Raising one tenant's rpm kept none of the rule's other limits (its tpm went): an
    override is merged over its rule, and a `null` in it lifts a limit."""
    keys = [{"key": "k-acme", "tenant": "acme"}, {"key": "k-globex", "tenant": "globex"},
            {"key": "k-initech", "tenant": "initech"}]
    cfg = {"rules": [{"per": "tenant", "rpm": 100, "tpm": 50,
                      "overrides": {"acme": {"rpm": 200}, "initech": {"tpm": None}}}]}
    client = await make_client(make_settings(auth={"mode": "keys", "keys": keys},
                                             plugins=[{"name": "rate_limit", "config": cfg}]))
    body = {**BODY, "max_tokens": 15}  # (two of them pass 50 tokens; one does not)
    for key, expected, limit_tokens in (("k-acme", [200, 429], "50"),
                                        ("k-globex", [200, 429], "50"),
                                        ("k-initech", [200, 200], None)):
        statuses = []
        for _ in range(2):
            r = await client.post("/v1/chat/completions", json=body,
                                  headers={"Authorization": f"Bearer {key}"})
            statuses.append(r.status)
        assert statuses == expected, key
        assert r.headers.get("x-ratelimit-limit-tokens") == limit_tokens, key
    r = await client.post("/v1/chat/completions", json={**BODY, "max_tokens": 1},
                          headers={"Authorization": "Bearer k-acme"})
    assert r.headers["x-ratelimit-limit-requests"] == "200"


def test_a_limiter_with_no_rules_is_refused() -> None:
    """`rules: []` was taken: the plugin ran on every request and limited nothing (no
    429, no `x-ratelimit-*` headers), which reads as limits in place."""
    from proxy.chain import validate_plugins
    from proxy.settings import ConfigError, PluginSpec

    with pytest.raises(ConfigError) as e:
        validate_plugins([PluginSpec(name="rate_limit", config={"rules": []})])
    assert [where for where, _ in e.value.errors] == ["plugins[0].config.rules"]
    assert RateLimitConfig.model_validate({}).rules  # (the default has one)


async def test_an_admit_that_lands_after_its_timeout_gives_its_lease_back(
        redis_server: RedisServer) -> None:
    """An admission that timed out (the local limiter decided) but whose command lost
    its cancellation and ran on Redis later, after the timeout's orphan release: that
    release barred its lease, so it takes nothing there (it had held a concurrency slot
    no request owned for `lease_s`, refusing the next requests)."""
    p = plugin(redis_server.url, rules=[{"per": "tenant", "concurrent": 1, "tpm": 10_000}])
    assert p.remote is not None
    script = p.remote._admit
    go = asyncio.Event()
    calls: list[asyncio.Future[Any]] = []  # the admission's own task

    async def admit_losing_the_cancellation(**kw: Any) -> Any:
        calls.append(asyncio.current_task())  # type: ignore[arg-type]
        while not go.is_set():  # (redis-py opening a connection to a frozen Redis)
            try:
                await go.wait()
            except asyncio.CancelledError:
                pass
        return await script(**kw)  # it runs on Redis after all: the lease is taken

    p.remote._admit = admit_losing_the_cancellation  # type: ignore[assignment]
    try:
        await p(ctx(), answer)  # timed out: the local limiter decided
        await eventually(p.idle)  # the timeout's orphan release ran (a no-op then)
        go.set()
        await asyncio.wait(calls)  # (what it ends with runs before this wait's end)
        p.remote._admit = script
        await eventually(p.idle)
        await p(ctx(), answer)  # the single slot is free
        for k in await p.remote.client.keys(p.cfg.redis.key_prefix + "*:c"):
            assert await p.remote.client.zcard(k) == 0
    finally:
        go.set()
        await p.close()


async def test_an_admit_that_runs_on_redis_after_its_orphan_release_takes_nothing(
        redis_server: RedisServer) -> None:
    """An admission that timed out and took its cancellation (its task ends cancelled),
    but whose command had been sent: Redis runs it all the same, and can run it after the
    orphan release sent on another connection (a busy Redis serves its sockets in the
    order it polls them). The release bars the lease, so the admission, landing late,
    takes no concurrency slot that no request owns (held for `lease_s`, refusing the next
    requests)."""
    p = plugin(redis_server.url, rules=[{"per": "tenant", "concurrent": 1, "tpm": 10_000}])
    go = asyncio.Event()
    on_redis: list[asyncio.Task[Any]] = []  # the command Redis runs after the cut
    script = _landing_late(p, "_admit", go, on_redis)
    try:
        await p(ctx(), answer)  # timed out: the local limiter decided
        await eventually(p.idle)  # the timeout's orphan release ran
        assert on_redis
        assert p.remote is not None
        p.remote._admit = script
        go.set()
        await asyncio.wait(on_redis)
        for k in await p.remote.client.keys(p.cfg.redis.key_prefix + "*:c"):
            assert await p.remote.client.zcard(k) == 0
        await p(ctx(), answer)  # the single slot is free
    finally:
        go.set()
        await p.close()


@pytest.mark.parametrize("mode", ["fail_open", "fail_closed"])
async def test_a_full_redis_is_decided_without_and_said_once(tmp_path: Path, logs: Any,
                                                            mode: str) -> None:
    """Redis at its `maxmemory` (noeviction) refuses writes and answers the rest. It used
    to admit through Redis (where the script's writes happened to pass) while each token
    charge failed: TPM unenforced fleet-wide, `fail_closed` admitting with 200, and
    health and the log flapping between down and back. Now it is `full`: decided
    locally (or 503 with `fail_closed`), charged there, logged once, until a write lands."""
    server = RedisServer(tmp_path).start()
    p = plugin(server.url, on_store_error=mode,
               rules=[{"per": "key", "rpm": 1000, "tpm": 100, "concurrent": 4}])
    assert p.remote is not None

    async def spends_60(c: RequestContext) -> Reply:
        return Completion({"usage": {"total_tokens": 60}})

    async def status() -> int:
        try:
            await p(ctx(), spends_60)
        except RateLimited:
            return 429
        except Unavailable:
            return 503
        return 200

    try:
        await p(ctx(), answer)  # its bucket exists: Redis still admits into it
        await p.remote.client.config_set("maxmemory", 1)
        got = [await status() for _ in range(3)]
        # its charge is refused: 60 of 100 each (reserved 21), the third is over
        assert got == ([200, 200, 429] if mode == "fail_open" else [200, 503, 503])
        assert p.health() == {"store": "full"}
        assert p.store_errors.labels("full")._value.get() >= 1
        assert p.store_errors.labels("unavailable")._value.get() == 0
        await p.remote.client.config_set("maxmemory", 0)
        await p._probe()
        assert p.health() == {"store": "redis"}
    finally:
        server.stop()
        await p.close()
    said = [json.loads(x)["event"] for x in logs.getvalue().splitlines()
            if "rate-limit store" in x]
    assert said == ["rate-limit store is full (maxmemory): deciding without it",
                    "rate-limit store takes writes again"]


def test_each_rules_rejection_series_is_there_at_zero_before_its_first_429() -> None:
    """Admission's and the breaker's counters start at 0; the rate limiter's appeared
    only with a first 429, so an alert on `rate(weir_rate_limit_rejections_total[5m])`
    read nothing (not 0) until a client had been refused."""
    p = plugin(None, rules=[{"per": "key", "rpm": 10, "tpm": 1000},
                            {"per": "tenant", "rpm": 100,
                             "overrides": {"acme": {"concurrent": 5}}}])
    reg = p.services.metrics.registry
    for per, limit in (("key", "rpm"), ("key", "tpm"), ("tenant", "rpm"),
                       ("tenant", "concurrent")):
        assert reg.get_sample_value("weir_rate_limit_rejections_total",
                                    {"per": per, "limit": limit}) == 0, (per, limit)
    assert reg.get_sample_value("weir_rate_limit_rejections_total",
                                {"per": "key", "limit": "concurrent"}) is None


async def test_the_store_error_series_are_there_at_zero_with_redis() -> None:
    """`weir_rate_limit_store_errors_total` had one series at 0 from the start; labelled
    by reason since this stop, each reason's series starts at 0 too (an alert on its
    `rate()` reads 0, not nothing), where a Redis store is configured."""
    p = plugin("redis://127.0.0.1:1/0", rules=[{"per": "key", "rpm": 10}])
    reg = p.services.metrics.registry
    try:
        for reason in ("unavailable", "full"):
            assert reg.get_sample_value("weir_rate_limit_store_errors_total",
                                        {"reason": reason}) == 0, reason
    finally:
        await p.close()


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_a_refused_requests_token_headers_show_its_refund(
        make_client: MakeClient, redis_server: RedisServer, backend: str,
        stream: bool) -> None:
    """A request the engine refused (its context is too long) is refunded its tokens: its
    `x-ratelimit-*-tokens` headers say so. They showed the state at admission (its large
    reservation taken: 0 remaining, a minute to reset), which it never spent."""
    cfg: dict[str, Any] = {"rules": [{"per": "tenant", "rpm": 100, "tpm": 100_000}]}
    if backend == "redis":
        cfg.update(store="redis", redis={"url": redis_server.url, "key_prefix": key() + ":"})
    client = await make_client(engine=FakeEngine(), plugins=[
        {"name": "rate_limit", "config": cfg}])
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 10_000, "stream": stream}
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status == 400
    validate("ErrorResponse", await r.json())
    assert r.headers["x-ratelimit-limit-tokens"] == "100000"
    assert r.headers["x-ratelimit-remaining-tokens"] == "100000"
    assert r.headers["x-ratelimit-reset-tokens"].endswith("ms")  # (not a minute)
    assert r.headers["x-ratelimit-remaining-requests"] == "99"  # the request still counts


async def test_leases_redis_granted_hold_their_slots_while_it_is_full(tmp_path: Path
                                                                      ) -> None:
    """Requests Redis admitted before it filled keep running. While it is full the local
    limiter decides, and it counted none of them (a full concurrency limit let as many
    again in); Redis could not renew their leases, which lapsed there after `lease_s`,
    and stayed lapsed once it took writes again (their slots free while they still ran).
    The local limiter now counts them, and they are written back to Redis when it takes
    writes."""
    server = RedisServer(tmp_path).start()
    p = plugin(server.url, rules=[{"per": "key", "concurrent": 2}])
    assert p.remote is not None
    gate = asyncio.Event()

    async def held(c: RequestContext) -> Reply:
        await gate.wait()
        return Completion({"usage": {"total_tokens": 5}})

    async def leases() -> int:
        assert p.remote is not None
        keys = await p.remote.client.keys(p.cfg.redis.key_prefix + "*:c")
        return sum([await p.remote.client.zcard(k) for k in keys])

    running = [asyncio.create_task(p(ctx(), held)) for _ in range(2)]
    try:
        await eventually(lambda: len(p._active) == 2)
        await p.remote.client.config_set("maxmemory", 1)
        await p._renew()  # refused: Redis is full
        assert p.health() == {"store": "full"}
        with pytest.raises(RateLimited):  # the two running still hold both slots
            await p(ctx(), answer)
        # Their leases lapse in Redis meanwhile (as after `lease_s`)
        for k in await p.remote.client.keys(p.cfg.redis.key_prefix + "*:c"):
            await p.remote.client.delete(k)
        await p.remote.client.config_set("maxmemory", 0)
        await p._probe()
        assert p.health() == {"store": "redis"}
        assert await leases() == 2  # written back: they still run
        with pytest.raises(RateLimited):
            await p(ctx(), answer)
        gate.set()
        await asyncio.gather(*running)
        assert await leases() == 0 and p.local.in_flight() == 0
        await p(ctx(), answer)
    finally:
        gate.set()
        server.stop()
        await p.close()


async def test_a_request_redis_admitted_as_it_filled_holds_its_slot_locally(
        redis_server: RedisServer) -> None:
    """Redis admitted a request whose admission was under way when another call found it
    full (the two crossed): the local limiter, deciding from then on, counted the leases
    of the requests then running, not that one's (its lease came after), and a full
    concurrency limit let one more in. It holds its slot locally too."""
    from plugins.rate_limit.gcra import StoreFull

    p = plugin(redis_server.url, rules=[{"per": "key", "concurrent": 1}])
    assert p.remote is not None
    admit = p.remote.admit

    async def crossed(*args: Any) -> Any:
        decision = await admit(*args)
        p._store_failed(StoreFull("OutOfMemoryError"))  # another call's, meanwhile
        return decision

    p.remote.admit = crossed  # type: ignore[method-assign]
    gate = asyncio.Event()

    async def held(c: RequestContext) -> Reply:
        await gate.wait()
        return Completion({"usage": {"total_tokens": 5}})

    running = asyncio.create_task(p(ctx(), held))
    try:
        await eventually(lambda: len(p._active) == 1)
        assert p.health() == {"store": "full"}
        with pytest.raises(RateLimited):  # decided locally: the one running holds the slot
            await p(ctx(), answer)
        gate.set()
        await running
        assert p.local.in_flight() == 0
    finally:
        gate.set()
        await p.close()


async def test_a_renewal_never_brings_back_a_released_lease(store: Any) -> None:
    """A renewal of a lease released before it ran (the two race: the release ends its
    request while the renewal, sent on another connection, is on its way) renews nothing.
    Redis wrote every lease back, so a released one held its slot until `lease_s`
    passed (a concurrency limit of 1 refused every request meanwhile)."""
    c = key()
    assert (await store.admit([], [(c, 1)], "a", 60_000)).allowed
    await store.release([c], "a")
    assert await store.renew({"a": [c]}, 60_000) == {"a"}  # (it held it no longer)
    assert (await store.admit([], [(c, 1)], "b", 60_000)).allowed


async def test_a_lapsed_lease_is_written_back_unless_it_was_released(
        redis_server: RedisServer) -> None:
    """A lease Redis lost while its request ran (it lapsed over an outage, or Redis was
    full and could not renew it) is written back where the renewal asks (`restore`), but
    not one whose request ended meanwhile: a barred release (`release_barred`) says so."""
    s = RedisStore(redis_server.url, timeout_s=1.0)
    c = key()
    try:
        await s.renew({"runs": [c], "ended": [c]}, 60_000, restore={"runs", "ended"})
        await s.release_barred([c], "ended", 60_000)
        assert await s.renew({"runs": [c], "ended": [c]}, 60_000,
                             restore={"runs", "ended"}) == {"ended"}
        assert await s.client.zrange(c, 0, -1) == [b"runs"]
    finally:
        await s.close()


def _renewal_landing_late(p: RateLimitPlugin, go: asyncio.Event,
                          on_redis: list[asyncio.Task[Any]]) -> Any:
    """`p`'s renewal script, sent and then cut by its timeout: Redis runs it once `go` is
    set (a busy Redis may run it after a release sent later, on another connection)."""
    return _landing_late(p, "_renew", go, on_redis)


def _landing_late(p: RateLimitPlugin, name: str, go: asyncio.Event,
                  on_redis: list[asyncio.Task[Any]]) -> Any:
    """`p`'s Redis script `name`, replaced by one whose call waits for its reply until
    cut by its timeout; Redis runs the command (a task in `on_redis`) once `go` is set.
    Returns the script itself."""
    assert p.remote is not None
    script = getattr(p.remote, name)

    async def sent_then_cut(**kw: Any) -> Any:
        async def runs_later() -> Any:
            await go.wait()
            return await script(**kw)

        try:
            await asyncio.Event().wait()  # (waiting for the reply: cut by the timeout)
        except asyncio.CancelledError:
            on_redis.append(asyncio.create_task(runs_later()))
            raise

    setattr(p.remote, name, sent_then_cut)
    return script


@pytest.mark.parametrize("outage", [False, True])
async def test_a_renewal_landing_after_a_release_leaves_no_slot_behind(
        redis_server: RedisServer, outage: bool) -> None:
    """A renewal sent while a request ran lands on Redis after that request's release (it
    was cut by its timeout, and Redis ran it late). It wrote the lease back: the slot was
    held, by no request, until `lease_s` passed. With `outage`, the lease had lapsed in
    Redis while the request ran (Redis down, or full): a renewal writes such a lease
    back, but not once its request has ended."""
    from plugins.rate_limit.gcra import StoreError

    p = plugin(redis_server.url, rules=[{"per": "tenant", "concurrent": 1}])
    assert p.remote is not None
    gate = asyncio.Event()

    async def held(c: RequestContext) -> Reply:
        await gate.wait()
        return Completion({"usage": {"total_tokens": 5}})

    async def leases() -> int:
        assert p.remote is not None
        keys = await p.remote.client.keys(p.cfg.redis.key_prefix + "*:c")
        return sum([await p.remote.client.zcard(k) for k in keys])

    go = asyncio.Event()
    on_redis: list[asyncio.Task[Any]] = []
    running = asyncio.create_task(p(ctx(), held))
    try:
        await eventually(lambda: len(p._active) == 1)
        if outage:
            p._store_failed(StoreError("ConnectionError"))  # held locally from here on
            for k in await p.remote.client.keys(p.cfg.redis.key_prefix + "*:c"):
                await p.remote.client.delete(k)  # lapsed there meanwhile
        script = _renewal_landing_late(p, go, on_redis)
        await p._renew()  # cut by its timeout
        await eventually(lambda: bool(on_redis))
        p.remote._renew = script
        gate.set()
        await running  # released (Redis answers it)
        go.set()
        await asyncio.wait(on_redis)  # the renewal lands now
        assert await leases() == 0
        p._store_ok()
        await p(ctx(), answer)  # the single slot is free
    finally:
        gate.set()
        go.set()
        await p.close()


async def test_a_lease_redis_lost_while_its_request_runs_is_written_back(
        redis_server: RedisServer) -> None:
    """A renewal renews only the leases Redis still holds; one it finds gone while its
    request still runs (Redis lost it with no error seen: a restart, a round missed past
    `lease_s`) is written back at once, not left to free a slot its request holds."""
    p = plugin(redis_server.url, rules=[{"per": "tenant", "concurrent": 1}])
    assert p.remote is not None
    gate = asyncio.Event()

    async def held(c: RequestContext) -> Reply:
        await gate.wait()
        return Completion({"usage": {"total_tokens": 5}})

    running = asyncio.create_task(p(ctx(), held))
    try:
        await eventually(lambda: len(p._active) == 1)
        for k in await p.remote.client.keys(p.cfg.redis.key_prefix + "*:c"):
            await p.remote.client.delete(k)
        await p._renew()
        with pytest.raises(RateLimited):  # its request still holds the single slot
            await p(ctx(), answer)
        gate.set()
        await running
        await p(ctx(), answer)  # released: free again
    finally:
        gate.set()
        await p.close()


async def test_fail_closed_admits_again_soon_after_a_full_redis_takes_writes(
        tmp_path: Path) -> None:
    """Redis full: `fail_closed` answers 503 (Retry-After: 1 s) and stops trying Redis,
    which would record nothing. Only the background round (every `lease_s / 3`, 20 s
    here) saw it take writes again: its clients were refused all that while, however
    often they retried. While it is full (or down) it is tried every second."""
    server = RedisServer(tmp_path).start()
    p = plugin(server.url, on_store_error="fail_closed", lease_s=60,
               rules=[{"per": "key", "rpm": 1000}])
    assert p.remote is not None
    await p.start()
    try:
        await p(ctx(), answer)
        await p.remote.client.config_set("maxmemory", 1)
        with pytest.raises(Unavailable):
            await p(ctx(), answer)
        assert p.health() == {"store": "full"}
        await p.remote.client.config_set("maxmemory", 0)
        await eventually(lambda: p.health() == {"store": "redis"}, timeout=5)
        await p(ctx(), answer)  # admitted through Redis again
    finally:
        server.stop()
        await p.close()


async def test_leases_that_lapsed_over_an_outage_are_written_back_once_redis_is_back(
        redis_server: RedisServer) -> None:
    """A request ran through a Redis outage longer than `lease_s`: its lease lapsed there.
    Once an admission found Redis back, Redis decided again without it until the next
    renewal round (`lease_s / 3`, 20 s here) wrote it back: a concurrency limit let one
    more in meanwhile. It is written back as Redis is found back (as after a full
    Redis takes writes again)."""
    from plugins.rate_limit.gcra import StoreError

    p = plugin(redis_server.url, lease_s=60, rules=[{"per": "tenant", "concurrent": 2}])
    assert p.remote is not None
    gate = asyncio.Event()

    async def held(c: RequestContext) -> Reply:
        await gate.wait()
        return Completion({"usage": {"total_tokens": 5}})

    async def leases() -> int:
        assert p.remote is not None
        keys = await p.remote.client.keys(p.cfg.redis.key_prefix + "*:c")
        return sum([await p.remote.client.zcard(k) for k in keys])

    running = [asyncio.create_task(p(ctx(), held))]
    try:
        await eventually(lambda: len(p._active) == 1)
        p._store_failed(StoreError("ConnectionError"))  # an outage...
        for k in await p.remote.client.keys(p.cfg.redis.key_prefix + "*:c"):
            await p.remote.client.delete(k)  # ...past `lease_s`: lapsed there
        running.append(asyncio.create_task(p(ctx(), held)))  # Redis is back: admitted
        await eventually(lambda: len(p._active) == 2)
        assert p.health() == {"store": "redis"}
        await eventually_async(lambda: leases(), 2)
        with pytest.raises(RateLimited):  # the two running hold both slots
            await p(ctx(), answer)
    finally:
        gate.set()
        await asyncio.gather(*running)
        await p.close()


async def eventually_async(read: Any, want: Any, timeout: float = 5) -> None:
    """`eventually` of a value read from Redis."""
    async with asyncio.timeout(timeout):
        while await read() != want:  # noqa: ASYNC110 - polling Redis
            await asyncio.sleep(0.005)


async def test_a_replica_stays_ready_while_a_fail_closed_limiter_cannot_reach_redis(
        make_client: MakeClient, tmp_path: Path) -> None:
    """Redis is every replica's: /health/ready went 503 on all of them at once while a
    `fail_closed` limiter could not reach it, so the balancer had no replica left, and
    requests that need no limiter (the model list) failed with its bare 503 too. The
    replica stays ready (its details say the store is unavailable); a request the
    limiter must count gets a clear 503 `rate_limiter_unavailable` with Retry-After, and
    is served again once Redis is back."""
    server = RedisServer(tmp_path).start()
    url = server.url
    server.stop()
    cfg = {"store": "redis", "on_store_error": "fail_closed", "lease_s": 1,
           "redis": {"url": url, "timeout_s": 1}, "rules": [{"per": "key", "rpm": 100}]}
    client = await make_client(make_settings(plugins=[{"name": "rate_limit", "config": cfg}]))
    st = client.app[STATE]
    await eventually(lambda: st.readiness()["plugins"]["rate_limit"]["store"] == "unavailable",
                     timeout=5)
    resp = await client.get("/health/ready")
    assert resp.status == 200 and (await resp.json())["status"] == "ready"
    assert (await client.get("/v1/models")).status == 200
    body = {"model": "fake-model", "max_tokens": 1,
            "messages": [{"role": "user", "content": "hi"}]}
    resp = await client.post("/v1/chat/completions", json=body)
    assert resp.status == 503 and resp.headers["retry-after"] == "1"
    assert (await resp.json())["error"]["code"] == "rate_limiter_unavailable"
    again = RedisServer(tmp_path, port=server.port).start()
    try:
        await eventually(lambda: st.readiness()["plugins"]["rate_limit"]["store"] == "redis",
                         timeout=5)
        assert (await client.get("/health/ready")).status == 200
        assert (await client.post("/v1/chat/completions", json=body)).status == 200
    finally:
        again.stop()


async def test_the_probe_s_back_line_names_no_request(
        redis_server: RedisServer, logs: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The task that probes a Redis gone down was started by the request that found it
    down, and ran in that request's context: its `rate-limit store is back`, logged
    seconds later with no request in sight, carried that request's id (and its Redis
    spans joined that request's trace), pointing whoever followed the id at a request
    that had long ended. Background work runs in a context of its own."""
    import structlog

    from plugins.rate_limit.gcra import StoreError

    monkeypatch.setattr(RateLimitPlugin, "PROBE_S", 0.02)
    p = plugin(redis_server.url, rules=[{"per": "key", "rpm": 1000}],
               on_store_error="fail_open")
    assert p.remote is not None
    real = p.remote.admit

    async def down_once(*args: Any) -> Any:
        p.remote.admit = real  # type: ignore[union-attr,method-assign]
        raise StoreError("ConnectionError")

    p.remote.admit = down_once  # type: ignore[method-assign]
    tokens = structlog.contextvars.bind_contextvars(request_id="req-found-it-down")
    try:
        await p(ctx(), answer)
    finally:
        structlog.contextvars.reset_contextvars(**tokens)

    def lines() -> list[dict[str, Any]]:
        return [json.loads(x) for x in logs.getvalue().splitlines()
                if "rate-limit store" in x]

    await eventually(lambda: len(lines()) == 2)
    down, back = lines()
    await p.close()
    assert (down["event"], down.get("request_id")) == ("rate-limit store unavailable",
                                                      "req-found-it-down")
    assert back["event"] == "rate-limit store is back"
    assert "request_id" not in back


@pytest.mark.parametrize(("rule", "kind"), [({"rpm": 1}, "requests"), ({"tpm": 60}, "tokens"),
                                            ({"concurrent": 1}, "requests")])
async def test_a_429_s_type_names_the_limit_as_openai_s_do(rule: dict[str, int],
                                                           kind: str) -> None:
    """OpenAI's 429 has type `requests` or `tokens` (code `rate_limit_exceeded`); Weir
    sent `rate_limit_error`, a type of no OpenAI answer."""
    p = plugin(rules=[{"per": "key", **rule}])
    hold, running = asyncio.Event(), asyncio.Event()

    async def held(c: RequestContext) -> Reply:
        running.set()
        await hold.wait()
        return Completion({"usage": {"total_tokens": 30}})

    first = asyncio.create_task(p(ctx(max_tokens=10), held))
    await running.wait()
    with pytest.raises(RateLimited) as e:
        await p(ctx(max_tokens=40), answer)
    hold.set()
    await first
    body = e.value.to_body()["error"]
    assert (body["type"], body["code"]) == (kind, "rate_limit_exceeded")
    validate("ErrorResponse", e.value.to_body())
    await p.close()


@pytest.mark.parametrize("where", ["memory", "redis"])
async def test_a_request_larger_than_its_token_limit_is_refused_up_front(
        where: str, redis_server: RedisServer) -> None:
    """A request whose prompt and `max_tokens` alone pass a minute's tokens can never be
    served within the limit: it was let in whenever the bucket was full (and drained it).
    It is OpenAI's 429 "Request too large" (type `tokens`), with no Retry-After (no wait
    lets it through) and `x-should-retry: false`, and takes nothing from any bucket."""
    p = plugin(redis_server.url if where == "redis" else None,
               rules=[{"per": "key", "rpm": 10, "tpm": 100}])
    with pytest.raises(RateLimited) as e:
        await p(ctx(max_tokens=200), answer)  # ~11 prompt tokens + 200
    err, h = e.value.to_body()["error"], e.value.headers
    assert e.value.status == 429
    assert (err["type"], err["code"]) == ("tokens", "rate_limit_exceeded")
    assert "Request too large" in err["message"] and "Limit 100, Requested 211" in err["message"]
    assert "retry-after" not in h and "retry-after-ms" not in h
    assert h["x-should-retry"] == "false"
    reg = p.services.metrics.registry
    assert reg.get_sample_value("weir_rate_limit_rejections_total",
                                {"per": "key", "limit": "tpm"}) == 1
    c = ctx(max_tokens=10)
    await p(c, answer)  # nothing was taken: a full minute's requests and tokens
    assert c.response_headers["x-ratelimit-remaining-requests"] == "9"
    assert int(c.response_headers["x-ratelimit-remaining-tokens"]) >= 100 - 21
    await p.close()


@pytest.mark.parametrize("where", ["memory", "redis"])
@pytest.mark.parametrize("shared", ["global", "model"])
async def test_a_request_too_large_carries_the_callers_own_rate_limit_headers(
        where: str, shared: str, redis_server: RedisServer) -> None:
    """OpenAI's 429s carry `x-ratelimit-*`, as every other 429 of the limiter does: a
    request too large carried none, so a client pacing itself by them lost its count.
    They are the caller's own buckets as they stand (the refusal took nothing); a shared
    rule that refused it is named with its limit in the message (what the request must
    fit) but its counts are in no header."""
    p = plugin(redis_server.url if where == "redis" else None,
               rules=[{"per": "key", "rpm": 10, "tpm": 1000}, {"per": shared, "tpm": 100}])
    await p(ctx(max_tokens=10), answer)
    with pytest.raises(RateLimited) as e:
        await p(ctx(max_tokens=200), answer)
    err, h = e.value.to_body()["error"], e.value.headers
    what = "this server" if shared == "global" else "this model"
    assert f"Request too large for {what}" in err["message"]
    assert "Limit 100, Requested 211" in err["message"] and err["type"] == "tokens"
    assert h["x-should-retry"] == "false" and "retry-after" not in h
    assert (h["x-ratelimit-limit-requests"], h["x-ratelimit-remaining-requests"]) == ("10", "9")
    assert h["x-ratelimit-limit-tokens"] == "1000"
    assert 1000 - 21 <= int(h["x-ratelimit-remaining-tokens"]) < 1000
    assert "x-ratelimit-reset-tokens" in h and "x-ratelimit-reset-requests" in h
    await p.close()


@pytest.mark.parametrize("on_error", ["fail_open", "fail_closed"])
async def test_a_request_too_large_is_refused_with_the_store_out_of_reach(
        on_error: str) -> None:
    """Its refusal needs no store: with Redis out of reach it is the same 429, with the
    local limiter's headers where it stands in (`fail_open`), none with `fail_closed`
    (no limiter counts meanwhile); the store is seen down as by any call."""
    p = plugin("redis://127.0.0.1:1/0", rules=[{"per": "key", "rpm": 10, "tpm": 100}],
               on_store_error=on_error)
    with pytest.raises(RateLimited) as e:
        await p(ctx(max_tokens=200), answer)
    assert "Request too large" in e.value.message
    if on_error == "fail_closed":
        assert e.value.headers == {"x-should-retry": "false"}
        assert p.health() == {"store": "unavailable"}
    else:
        assert e.value.headers["x-ratelimit-remaining-requests"] == "10"
        assert p.health() == {"store": "local-fallback"}
    await p.close()


async def test_the_too_large_check_reads_the_callers_own_override() -> None:
    """A key's override raises (or lowers) the limit a request is measured against; a
    request without `max_tokens` is measured by its prompt (the default reservation is
    Weir's guess, not what it asked for)."""
    k1 = Principal("t", "user", "u", key_id="aaaaaaaaaaaa")
    k2 = Principal("t", "user", "u", key_id="bbbbbbbbbbbb")
    p = plugin(rules=[{"per": "key", "tpm": 100, "overrides": {
        "aaaaaaaaaaaa": {"tpm": 1000}, "bbbbbbbbbbbb": {"tpm": 20}}}])
    await p(ctx(k1, max_tokens=200), answer)
    with pytest.raises(RateLimited):
        await p(ctx(Principal("t", "user", "u", key_id="k3"), max_tokens=200), answer)
    with pytest.raises(RateLimited) as e:
        await p(ctx(k2, max_tokens=21), answer)  # 21 > 20 (and ~11 prompt tokens)
    assert "Limit 20, Requested 32" in e.value.message
    await p(ctx(max_tokens=None), answer)  # ~11 + the default 256 reserved: let in
    await p.close()


async def test_the_too_large_check_counts_no_estimated_prompt_tokens() -> None:
    """A text prompt's size is an estimate (its characters / 4), which overstates some
    text many times over (4,000 spaces are ~1,000 estimated tokens, 63 of SmolLM2's), so
    only what the request fixes itself, its output limit per choice and its prompts of
    token ids, can refuse it for good: a request whose estimate alone passed the limit
    was refused with no retry, though it fitted the minute."""
    p = plugin(rules=[{"per": "key", "tpm": 100}])
    await p(ctx(messages=[{"role": "user", "content": " " * 4000}], max_tokens=10), answer)
    with pytest.raises(RateLimited) as e:  # a prompt of token ids is counted exactly
        await p(completion_ctx(prompt=[7] * 95, max_tokens=10), answer)
    assert "Limit 100, Requested 106" in e.value.message  # (95 + 10, its estimate's 1)
    await p.close()


async def test_an_embeddings_request_is_charged_no_output_by_the_too_large_check() -> None:
    """An embeddings request generates nothing: its inputs (each a prompt of the
    request's view) were each counted one output token, and 2,048 short inputs against
    a limit of 2,000 tokens were refused for good, whatever they cost."""
    p = plugin(rules=[{"per": "key", "tpm": 2000}])
    view = CompletionRequest.model_construct(model="m", prompt=["hi"] * 2048, max_tokens=1,
                                             n=1, stream=False)
    c = RequestContext(route="embeddings", request=view, request_id="r",
                       principal=Principal("t", "user", "u", key_id="k1"))
    await p(c, answer)
    await p.close()


def completion_ctx(**kw: Any) -> RequestContext:
    req = CompletionRequest.model_validate({"model": "m", "prompt": "x", **kw})
    return RequestContext(route="completion", request=req, request_id="r",
                          principal=Principal("t", "user", "u", key_id="k1"))


async def test_start_warms_the_redis_store(redis_server: RedisServer) -> None:
    """The first burst after a start met a store with no connection open and no script
    loaded: each request opened its own connection and loaded the script, past the
    per-call timeout on a busy machine, and was decided by the local fallback (16 of 20
    passed a bucket with room for 5). `start` opens the connections of a burst and
    loads the scripts first."""
    import redis.asyncio as aioredis

    spy = aioredis.from_url(redis_server.url)
    await spy.script_flush()
    before = (await spy.info("clients"))["connected_clients"]
    p = plugin(redis_server.url, rules=[{"per": "key", "tpm": 1000}])
    await p.start()
    assert all(await spy.script_exists(*(s.sha for s in (
        p.remote._admit, p.remote._adjust, p.remote._renew, p.remote._release_barred))))
    opened = (await spy.info("clients"))["connected_clients"] - before
    assert opened >= RateLimitPlugin.WARM_CONNECTIONS
    assert p.health() == {"store": "redis"}
    await p.close()
    await spy.aclose()


async def test_a_redis_store_out_of_reach_at_start_falls_back_at_once() -> None:
    """Warming a store that cannot be reached does not stop the start: it is seen
    unavailable then (health and the metric say so, the local limiter decides)."""
    p = plugin("redis://127.0.0.1:1/0", rules=[{"per": "key", "rpm": 1}])
    await p.start()
    assert p.health() == {"store": "local-fallback"}
    reg = p.services.metrics.registry
    assert reg.get_sample_value("weir_rate_limit_store_errors_total",
                                {"reason": "unavailable"}) == 1
    await p(ctx(), answer)
    with pytest.raises(RateLimited):
        await p(ctx(), answer)
    await p.close()


async def test_a_stream_s_settle_in_memory_needs_no_task() -> None:
    """With the memory store a stream's tokens and lease are settled at its end, at once
    and in its consumer's own task (`Stream.end_shielded` needs no task for it)."""
    p = plugin(rules=[{"per": "key", "tpm": 1000, "concurrent": 1}])
    me = asyncio.current_task()
    where: list[bool] = []

    async def stream(c: RequestContext) -> Reply:
        async def chunks() -> AsyncIterator[dict[str, Any]]:
            yield {"choices": []}
        s = Stream(chunks())
        s.usage = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
        return s

    reply = await p(ctx(), stream)
    assert isinstance(reply, Stream)
    reply.on_end(lambda s, outcome: where.append(asyncio.current_task() is me))
    assert [c async for c in reply.rest()] == [{"choices": []}]
    await reply.end_shielded("completed")
    assert where == [True] and p.local.in_flight() == 0
    await p(ctx(), answer)  # its one slot is free again
    await p.close()


async def test_a_charge_that_fails_its_own_way_still_frees_the_concurrency_slot(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The settle charged the tokens, then released the lease: an error of the charge's
    own (not a store outage, which is caught) skipped the release, and the slot stayed
    taken until the lease expired."""
    p = plugin(rules=[{"per": "tenant", "concurrent": 1, "tpm": 10_000}])

    async def broken(buckets: list[Bucket]) -> list[Any]:
        raise RuntimeError("a bug in the charge")
    monkeypatch.setattr(p.local, "adjust", broken)
    try:
        await p(ctx(), answer)
    except RuntimeError:
        pass
    assert p.local.in_flight() == 0
    monkeypatch.undo()
    await p(ctx(), answer)  # the one slot is free again
    await p.close()


async def test_leases_an_outage_left_in_redis_are_released_as_soon_as_it_is_back(
        redis_server: RedisServer) -> None:
    """A slow Redis runs the admissions whose timeout the limiter gave up on once it
    answers again, taking their slots, while their releases, tried one at a time, were
    cut: the reaper then waited out its backoff (up to `lease_s / 3`) with Redis back,
    and every request of the caller was a 429 for a concurrency no request held."""
    from plugins.rate_limit.gcra import StoreError

    p = plugin(redis_server.url, rules=[{"per": "tenant", "concurrent": 1, "tpm": 10_000}])
    p.REAP_FIRST_S = 30.0  # type: ignore[misc]  # (a reaper deep in its backoff)
    assert p.remote is not None
    remote = p.remote
    admit, release_barred = remote.admit, remote.release_barred
    tried: list[str] = []

    async def ran_after_its_timeout(*a: Any, **kw: Any) -> Any:
        await admit(*a, **kw)  # Redis took the lease...
        raise StoreError("TimeoutError")  # ...after the limiter gave up on it

    async def cut(conc: list[str], lease: str, lease_ms: float) -> None:
        tried.append(lease)
        raise StoreError("TimeoutError")

    remote.admit = ran_after_its_timeout  # type: ignore[method-assign]
    remote.release_barred = cut  # type: ignore[method-assign]
    try:
        await p(ctx(), answer)  # the local limiter decided; its lease orphaned in Redis
        await eventually(lambda: bool(tried))  # its release cut: the reaper backs off
        remote.admit, remote.release_barred = admit, release_barred  # type: ignore[method-assign]
        with pytest.raises(RateLimited):
            await p(ctx(), answer)  # (the orphan holds the slot as Redis comes back)
        await eventually(p.idle)
        await p(ctx(), answer)  # the one slot is free again
    finally:
        await p.close()


async def test_redis_seen_back_before_an_outage_does_not_cut_its_first_backoff(
        tmp_path: Path) -> None:
    """Redis back after an outage that left no orphans set the reaper's `_back` with no
    reaper to clear it: the next outage's first backoff ended at once (a release retried
    at once, one round more than its backoff allows)."""
    from bench.redis_server import free_port
    from plugins.rate_limit.gcra import StoreError

    p = plugin(f"redis://127.0.0.1:{free_port()}/0", rules=[{"per": "key", "concurrent": 2}])
    p.REAP_FIRST_S = 60.0  # (its first backoff outlasts the test)
    tries = 0

    async def down(*args: Any) -> None:
        nonlocal tries
        tries += 1
        raise StoreError("ConnectionError")

    p.remote.release_barred = down  # type: ignore[union-attr, method-assign]
    try:
        p._store_failed(StoreError("ConnectionError"))  # an outage with no orphan
        p._store_ok()  # Redis back: seen so
        p._store_failed(StoreError("ConnectionError"))  # the next outage
        p._orphan("lease", ["k"])
        await eventually(lambda: tries >= 1)
        for _ in range(50):  # (turns of the loop, bounded: a second try needs none)
            await asyncio.sleep(0)
        assert tries == 1 and not p._back.is_set()
    finally:
        await p.close()


@pytest.mark.parametrize("restart", [False, True])
async def test_redis_losing_its_leases_mid_flight_lets_no_replica_past_its_limit(
        tmp_path: Path, restart: bool) -> None:
    """Redis losing its data (FLUSHALL, or a restart without persistence) while requests
    ran lost their leases: redis-py reconnects silently, and `concurrent: 3` admitted as
    many again until each lease's next renewal (5 in flight seen with two replicas). A
    replica that sees the lease sets' epoch new (reading it every `PROBE_S` while it
    holds leases, or in an admission's answer) writes its running leases back, and the
    admission that saw it stands only if the limit still holds."""
    server = RedisServer(tmp_path).start()
    prefix = key() + ":"
    cfg = {"store": "redis", "redis": {"url": server.url, "key_prefix": prefix,
                                       "timeout_s": 1.0},
           "rules": [{"per": "tenant", "concurrent": 3}]}
    services = [Services(terminal=FakeEngine(), settings=Settings(), metrics=Metrics())
                for _ in range(2)]
    a, b = (RateLimitPlugin(RateLimitConfig.model_validate(cfg), s) for s in services)
    a.PROBE_S = 3600.0  # (a sees the new epoch only in its admission's answer)
    b.PROBE_S = 0.02  # (b reads it soon, with no admission of its own)
    await a.start()
    await b.start()
    held = Holding()
    release = held.release
    leases = prefix + "0:tenant:t:c"

    tasks = []
    try:
        for replica in (a, a, b):
            tasks.append(asyncio.create_task(replica(ctx(), held)))
            await eventually(lambda: held.running == len(tasks))
        if restart:
            server.stop()
            server = RedisServer(tmp_path, port=server.port).start()
        else:
            await a.remote.client.flushall()  # type: ignore[union-attr]
        import redis.asyncio as aioredis

        client = aioredis.from_url(server.url)
        async with asyncio.timeout(5):  # b's lease back (a cross-process effect: polled)
            while await client.zcard(leases) != 1:  # noqa: ASYNC110
                await asyncio.sleep(0.005)
        with pytest.raises(RateLimited):  # a's two back, and this one: four of three
            await a(ctx(), answer)
        assert await client.zcard(leases) == 3
        with pytest.raises(RateLimited):
            await b(ctx(), answer)
        assert held.running == 3
        await client.aclose()
    finally:
        release.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await a.close()
        await b.close()
        server.stop()


async def test_the_longest_lease_a_config_takes_is_one_redis_keeps(
        redis_server: RedisServer) -> None:
    """A lease of 1e15 s passed the config and Redis refused its expiry (an error on
    every admission: the local limiter decided for good, a lease orphaned each time):
    the config takes at most a day, and a day's lease works through Redis."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="lease_s"):
        plugin(redis_server.url, lease_s=1e15, rules=[{"per": "key", "concurrent": 1}])
    p = plugin(redis_server.url, lease_s=86_400, rules=[{"per": "key", "concurrent": 1}])
    try:
        for _ in range(3):  # one at a time: each released
            await p(ctx(), answer)
        assert p.health() == {"store": "redis"} and p.idle()
    finally:
        await p.close()


async def test_leases_the_local_limiter_granted_count_in_redis_once_it_is_back(
        tmp_path: Path) -> None:
    """Requests the local limiter admitted over an outage (fail_open) still ran once Redis
    was back, and Redis counted none of them: every replica let as many again in until
    they ended. Redis back takes their leases over (written there, released there)."""
    server = RedisServer(tmp_path).start()
    url, port = server.url, server.port
    server.stop()
    prefix = key() + ":"
    cfg = {"store": "redis", "redis": {"url": url, "key_prefix": prefix, "timeout_s": 0.5},
           "rules": [{"per": "tenant", "concurrent": 3}]}
    a, b = (RateLimitPlugin(RateLimitConfig.model_validate(cfg), Services(
        terminal=FakeEngine(), settings=Settings(), metrics=Metrics())) for _ in range(2))
    held = Holding()
    release = held.release

    tasks: list[asyncio.Task[Reply]] = []
    again = None
    try:
        for _ in range(3):  # Redis down: a's local limiter admits them
            tasks.append(asyncio.create_task(a(ctx(), held)))
            await eventually(lambda: held.running == len(tasks))
        assert a.health() == {"store": "local-fallback"}
        again = RedisServer(tmp_path, port=port).start()
        with pytest.raises(RateLimited):  # through Redis, back: three run, no slot
            await a(ctx(), answer)
        assert a.health() == {"store": "redis"}
        with pytest.raises(RateLimited):  # nor for b
            await b(ctx(), answer)
        release.set()
        await asyncio.gather(*tasks)
        assert a.idle()
        await b(ctx(), answer)  # each slot released in Redis
        assert await a.remote.client.zcard(prefix + "0:tenant:t:c") == 0  # type: ignore[union-attr]
    finally:
        release.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await a.close()
        await b.close()
        if again is not None:
            again.stop()


async def test_close_ends_every_lease_rewrite_not_only_the_last(
        redis_server: RedisServer) -> None:
    """Each rewrite of the running leases waits on the one before it (`_start_rewrite`):
    close cancelled only the last, and an earlier one still writing (a slow Redis) ran
    on past close, its failure on the closed client starting a prober that ran for good."""
    p = patient_plugin(redis_server.url, rules=[{"per": "key", "concurrent": 2}])
    await p.start()
    release = asyncio.Event()
    writing = asyncio.Event()

    async def slow(*args: Any) -> set[str]:
        writing.set()
        await release.wait()  # (never set: a Redis that does not answer)
        return set()

    p.remote.renew = slow  # type: ignore[union-attr, method-assign]

    held = held_until(asyncio.Event())  # (never set: it runs until close)
    task = asyncio.create_task(p(ctx(), held))
    await eventually(lambda: bool(p._active))
    p._start_rewrite()
    first = p._rewrite
    await writing.wait()
    p._start_rewrite()  # (a second epoch seen meanwhile)
    task.cancel()  # (its lease released before close: the rewrites run on)
    await asyncio.gather(task, return_exceptions=True)
    try:
        await p.close()
        assert first is not None and first.done()
        assert p._prober is None or p._prober.done()
    finally:
        release.set()


async def test_a_local_admission_crossing_redis_back_is_counted_there(
        redis_server: RedisServer) -> None:
    """The local limiter admitted a request as Redis was seen taking writes again (the
    probe's answer landed before the admission's caller resumed): Redis taking over the
    local leases (`_adopt_local`) ran before this one was known, so Redis never counted
    it and let a full `concurrent` more in beside it until it ended."""
    p = patient_plugin(redis_server.url, rules=[{"per": "key", "concurrent": 1}])
    p.PROBE_S = 3600.0  # (the test runs the probe itself, at the crossing)
    await p.start()
    real = p.local.admit

    async def crossing(*args: Any) -> Any:
        decision = await real(*args)
        await p._probe()  # Redis takes writes again, before the caller resumes
        return decision

    p.local.admit = crossing  # type: ignore[method-assign]
    p._store_full()
    release = asyncio.Event()

    held = held_until(release)
    task = asyncio.create_task(p(ctx(), held))
    try:
        await eventually(lambda: bool(p._active))
        assert p.health() == {"store": "redis"}
        with pytest.raises(RateLimited):  # Redis counts the one running
            await p(ctx(), answer)
        release.set()
        await task
        assert p.idle()
        await p(ctx(), answer)  # its slot released in Redis too
    finally:
        release.set()
        await asyncio.gather(task, return_exceptions=True)
        await p.close()


@pytest.mark.parametrize("stored", ["inf", "1e300", "0x10", "7" * 1_000_000])
async def test_an_epoch_key_holding_no_epoch_is_replaced_and_read_in_part(
        redis_server: RedisServer, stored: str) -> None:
    """The lease sets' epoch key holding what no replica wrote: `inf` or `1e300` stood as
    an epoch that came back as -2^63, and a huge value was read whole by every admission
    (50 MB: 0.3 s each, every replica's, for good: the key never expires). Anything but
    up to 16 digits is replaced by a new epoch, read only in part."""
    store = RedisStore(redis_server.url, 2.0, key() + ":")
    try:
        await store.client.set(store.epoch_key, stored)
        first = await store.admit([], [(key(), 2)], "lease", 30_000)
        again = await store.admit([], [(key(), 2)], "lease", 30_000)
        held = await store.client.get(store.epoch_key)
        assert first.epoch > 0 and first.epoch == again.epoch == int(held)
        assert len(held) <= 16 and await store.epoch() == first.epoch
    finally:
        await store.close()


async def test_an_admission_refused_on_its_recount_frees_its_lease_when_the_refund_fails(
        redis_server: RedisServer) -> None:
    """Redis lost its data: an admission it granted is counted again once this replica's
    running leases are written back, and refused past the limit. Its refund failing at a
    full Redis (which takes no orphan: an admission it refused took nothing) left this
    one's lease, which Redis had taken, held there for `lease_s`."""
    from plugins.rate_limit.gcra import StoreFull

    p = patient_plugin(redis_server.url, rules=[{"per": "key", "concurrent": 1, "rpm": 100}])
    p.PROBE_S = 3600.0  # (the admission sees the new epoch, not the watch)
    await p.start()
    release = asyncio.Event()

    held = held_until(release)
    task = asyncio.create_task(p(ctx(), held))
    try:
        await eventually(lambda: bool(p._active))
        leases = p._active[next(iter(p._active))][1][0]
        client = p.remote.client  # type: ignore[union-attr]
        # its data lost (this test's keys only: the server is shared)
        await client.delete(*[k async for k in client.scan_iter(
            match=p.cfg.redis.key_prefix + "*")])

        async def full(*args: Any) -> Any:
            raise StoreFull("OutOfMemoryError")

        p.remote.adjust = full  # type: ignore[union-attr, method-assign]
        with pytest.raises(RateLimited):
            await p(ctx(), answer)
        assert await p.remote.client.zcard(leases) == 1  # type: ignore[union-attr]
    finally:
        release.set()
        await asyncio.gather(task, return_exceptions=True)
        await p.close()


async def test_a_replica_holding_only_leases_redis_took_over_watches_the_epoch(
        redis_server: RedisServer) -> None:
    """A replica whose running leases the local limiter granted (Redis down at their
    admission) and Redis took over once back had seen no epoch (no admission of its had
    Redis decide a concurrency limit): its watch skipped every round, and Redis losing
    its data then lost those leases until their next renewal (`lease_s / 3`)."""
    from plugins.rate_limit.gcra import StoreError

    p = patient_plugin(redis_server.url, rules=[{"per": "key", "concurrent": 2}])
    p.PROBE_S = 0.01  # (the epoch watch's round, and the outage's probe)
    await p.start()
    real = {name: getattr(p.remote, name) for name in ("admit", "release_barred", "ping")}

    async def down(*args: Any) -> Any:
        raise StoreError("ConnectionError")

    for name in real:  # Redis out of reach
        setattr(p.remote, name, down)
    p._store_failed(StoreError("ConnectionError"))
    release = asyncio.Event()

    held = held_until(release)
    task = asyncio.create_task(p(ctx(), held))
    client = p.remote.client  # type: ignore[union-attr]
    try:
        await eventually(lambda: bool(p._active))
        leases = p._active[next(iter(p._active))][1][0]
        for name, call in real.items():  # back: Redis takes the lease over
            setattr(p.remote, name, call)
        async with asyncio.timeout(5):  # (a cross-process effect: polled)
            while await client.zcard(leases) != 1:  # noqa: ASYNC110
                await asyncio.sleep(0.005)
        # its data lost (this test's keys only: the server is shared)
        await client.delete(*[k async for k in client.scan_iter(
            match=p.cfg.redis.key_prefix + "*")])
        async with asyncio.timeout(5):  # written back (a cross-process effect: polled)
            while await client.zcard(leases) != 1:  # noqa: ASYNC110
                await asyncio.sleep(0.005)
    finally:
        release.set()
        await asyncio.gather(task, return_exceptions=True)
        await p.close()
