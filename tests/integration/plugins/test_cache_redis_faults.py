"""The cache (and what shares its Redis) against a Redis that misbehaves without being
down: one full at its `maxmemory` (writes refused, reads answer), and entries under the
cache's keys that Weir never wrote (another version, a hand edit, an attacker with
Redis access): a read of one is a miss, never a 500 nor another tenant's answer."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from bench.redis_server import RedisServer
from plugins.cache.plugin import CachePlugin
from proxy.app_state import STATE
from tests.conftest import MakeClient, make_settings
from tests.fakes import FakeEngine

KEYS = [{"key": "k-alice", "tenant": "acme", "user": "alice"},
        {"key": "k-eve", "tenant": "globex", "user": "eve"},
        {"key": "k-admin", "tenant": "acme", "role": "admin", "user": "root"}]


def h(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
async def own_redis(tmp_path: Path) -> AsyncIterator[RedisServer]:
    """A Redis of this test's own: its `maxmemory` is changed."""
    server = RedisServer(tmp_path).start()
    yield server
    server.stop()


async def replica(make_client: MakeClient, url: str, prefix: str) -> Any:
    cfg = {"l2": {"enabled": True}, "semantic": {"enabled": False},
           "redis": {"url": url, "key_prefix": prefix, "timeout_s": 0.5},
           "store_truncated": True}
    settings = make_settings(auth={"mode": "keys", "keys": KEYS},
                             plugins=[{"name": "cache", "config": cfg}])
    return await make_client(settings, engine=FakeEngine())


def cache_of(client: Any) -> CachePlugin:
    return next(p for p in client.app[STATE].plugins if p.name == "cache")  # type: ignore[no-any-return]


async def ask(client: Any, content: str, key: str = "k-alice") -> tuple[str, Any]:
    r = await client.post("/v1/chat/completions", headers=h(key), json={
        "model": "fake-model", "temperature": 0, "max_tokens": 6,
        "messages": [{"role": "user", "content": content}]})
    assert r.status == 200, await r.text()
    data = await r.json()
    await cache_of(client).store.drain()
    return r.headers["x-weir-cache"], data


async def health(client: Any) -> tuple[int, Any]:
    r = await client.get("/health/ready", headers=h("k-admin"))
    return r.status, await r.json()


async def test_a_full_redis_is_served_from_not_down(make_client: MakeClient,
                                                    own_redis: RedisServer) -> None:
    """Redis at `maxmemory` with noeviction refuses writes and answers reads. The cache
    serves its entries and skips its stores; the replica stays ready (no replica can fix
    a full Redis: taking them all out of rotation is an outage), says "full" (not a
    "down" that every read turned back to "up"), and counts the refusals as `full`."""
    prefix = f"weir:test:{uuid.uuid4().hex[:8]}:"
    a = await replica(make_client, own_redis.url, prefix)
    b = await replica(make_client, own_redis.url, prefix)
    raw = aioredis.Redis.from_url(own_redis.url)
    try:
        first = await ask(a, "What are your opening hours?")
        assert first[0] == "miss"
        await raw.config_set("maxmemory-policy", "noeviction")
        await raw.config_set("maxmemory", 1)  # (every write past it is refused)
        assert (await ask(a, "Where is the office?"))[0] == "miss"  # its store refused
        # b has nothing in memory: the entry stored before comes from Redis
        layer, again = await ask(b, "What are your opening hours?")
        assert layer == "exact"
        assert again["choices"][0]["message"] == first[1]["choices"][0]["message"]
        for c in (a, b):
            status, body = await health(c)
            assert status == 200 and body["status"] == "ready"
        assert (await health(a))[1]["plugins"]["cache"]["redis"] == "full"
        metrics = await (await a.get("/metrics", headers=h("k-admin"))).text()
        assert 'weir_cache_store_errors_total{op="full"} 1.0' in metrics
        assert 'weir_cache_store_errors_total{op="persist"}' not in metrics
        # Room again: the next store lands, and the replica says so.
        await raw.config_set("maxmemory", 0)
        assert (await ask(a, "Do you ship abroad?"))[0] == "miss"
        assert (await health(a))[1]["plugins"]["cache"]["redis"] == "up"
        assert (await ask(b, "Do you ship abroad?"))[0] == "exact"
    finally:
        await raw.config_set("maxmemory", 0)
        await raw.aclose()


async def _stored(client: Any, raw: aioredis.Redis, prefix: str, content: str,
                  key: str = "k-alice") -> tuple[str, dict[str, Any]]:
    """Ask `content` (a miss, stored): its Redis key and its entry as stored."""
    l1 = cache_of(client).store.l1
    assert l1 is not None
    before = {e.key for e in l1.entries()}
    layer, _ = await ask(client, content, key)
    assert layer == "miss"
    (new,) = {e.key for e in l1.entries()} - before
    stored = await raw.get(prefix + "x:" + new)
    assert stored is not None
    return prefix + "x:" + new, json.loads(stored)


def _tampered(entry: dict[str, Any], other: dict[str, Any], moved: dict[str, Any],
              ) -> list[tuple[str, Any]]:
    """What Weir never writes under an exact key: (what, how to write it)."""
    return [
        ("not JSON", "garbage{"),
        ("a list", "[1, 2, 3]"),
        ("a number", "42"),
        ("a string for a number", json.dumps({**entry, "created": str(entry["created"])})),
        ("a string for the expiry", json.dumps({**entry, "expires": "never"})),
        ("a bool for a number", json.dumps({**entry, "created": True})),
        ("NaN times", json.dumps({**entry, "expires": float("nan")})),
        ("choices of another shape", json.dumps({**entry, "choices": [{"text": 1}]})),
        ("a dict for choices", json.dumps({**entry, "choices": {"0": "x"}})),
        ("no tenant", json.dumps({k: v for k, v in entry.items() if k != "tenant"})),
        ("deep nesting", "[" * 100_000 + "]" * 100_000),
        ("another tenant's entry", json.dumps(other)),
        ("another tenant's entry as this one's", json.dumps({**other, "key": entry["key"]})),
        ("this tenant's answer to another question", json.dumps(moved)),
        ("a huge string", json.dumps("x" * 4_000_000)),
        ("a huge list", json.dumps([entry] * 20_000)),
        ("a list key", ("rpush", ["a", "b"])),
        ("a hash key", ("hset", {"f": "v"})),
        ("a set key", ("sadd", ["m"])),
    ]


async def test_tampered_exact_entries_are_misses(make_client: MakeClient,
                                                 redis_server: RedisServer) -> None:
    """Every shape Weir never writes under an exact key, read by a replica with nothing
    in memory: a miss (generated again, and stored over it), never a 500 nor the answer
    another key (another tenant's, or another question's) holds."""
    prefix = f"weir:test:{uuid.uuid4().hex[:8]}:"
    a = await replica(make_client, redis_server.url, prefix)
    raw = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        key, entry = await _stored(a, raw, prefix, "What are your opening hours?")
        _, other = await _stored(a, raw, prefix, "Where is the office?", key="k-eve")
        _, moved = await _stored(a, raw, prefix, "Do you ship abroad?")
        assert other["tenant"] == "globex" and other["key"] != entry["key"]
        for what, value in _tampered(entry, other, moved):
            await raw.delete(key)
            if isinstance(value, tuple):
                op, args = value
                await (raw.hset(key, mapping=args) if op == "hset"
                       else getattr(raw, op)(key, *args))
            else:
                await raw.set(key, value)
            b = await replica(make_client, redis_server.url, prefix)  # (nothing in memory)
            layer, got = await ask(b, "What are your opening hours?")
            assert layer == "miss", what
            assert got["choices"][0]["message"]["content"] not in (
                json.dumps(other["choices"]), json.dumps(moved["choices"])), what
            status, body = await health(b)
            assert status == 200 and body["plugins"]["cache"]["redis"] == "up", what
            # (a key of another type is a stray key, not Redis failing)
            metrics = await (await b.get("/metrics", headers=h("k-admin"))).text()
            assert "weir_cache_store_errors_total{" not in metrics, what
            # and the answer generated again was stored over it
            assert json.loads(await raw.get(key))["key"] == entry["key"], what
            await b.close()
    finally:
        await raw.aclose()


async def test_a_stray_key_of_another_type_does_not_stop_stores(
        make_client: MakeClient, redis_server: RedisServer) -> None:
    """The owner's cap set (and a semantic partition's hash) are replaced where a key of
    another type sits under their name: every store of that owner failed (WRONGTYPE in
    the persist script), for as long as the stray key stayed."""
    prefix = f"weir:test:{uuid.uuid4().hex[:8]}:"
    a = await replica(make_client, redis_server.url, prefix)
    store = cache_of(a).store.redis
    assert store is not None
    raw = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        await raw.set(store.user_key("acme", "alice"), "not a sorted set")
        await _stored(a, raw, prefix, "What are your opening hours?")
        assert await raw.type(store.user_key("acme", "alice")) == "zset"
        assert "weir_cache_store_errors_total{" not in await (
            await a.get("/metrics", headers=h("k-admin"))).text()
    finally:
        await raw.aclose()


@pytest.mark.parametrize("value", [
    "garbage", "[]", '{"v": 1, "g": "x", "e": "{}"}', '{"v": "!!", "g": "x", "e": "{}"}',
    '{"v": "AACAfw==", "g": "x", "e": "{}"}',  # (a NaN vector)
    '{"v": "AAAAQA==", "g": "x", "e": "{}"}',  # (longer than a unit vector)
    '{"v": "AACAPw==", "g": 5, "e": "{}"}', '{"v": "AACAPw==", "g": "x", "e": "[]"}'])
async def test_tampered_semantic_entries_are_skipped(redis_server: RedisServer,
                                                     value: str) -> None:
    """A semantic hash's value Weir never wrote, and a partition of another type: read
    (one entry, or all of them at start) as nothing, and Redis is not marked down."""
    from prometheus_client import CollectorRegistry

    from plugins.cache.config import RedisConfig
    from plugins.cache.metrics import CacheMetrics
    from plugins.cache.redis_store import RedisStore

    prefix = f"weir:test:{uuid.uuid4().hex[:8]}:"
    metrics = CacheMetrics(CollectorRegistry())
    store = RedisStore(RedisConfig(url=redis_server.url, key_prefix=prefix, timeout_s=0.5),
                       metrics.store_errors, "r1")
    raw = aioredis.Redis.from_url(redis_server.url)
    try:
        await raw.hset(prefix + "s:p1", "e1", value)
        await raw.set(prefix + "s:p2", "a string, not a hash")
        assert await store.get_semantic("p1", "e1") is None
        assert await store.get_semantic("p2", "e1") is None
        assert await store.load_semantic(100) == []
        assert store.healthy
    finally:
        await raw.aclose()
        await store.close()


async def test_a_purge_of_a_full_redis_is_done_not_a_503(make_client: MakeClient,
                                                          own_redis: RedisServer) -> None:
    """Deletes and PUBLISH are allowed at `maxmemory`: a purge (how an operator makes
    room) deletes the entries and tells the replicas. Only its event log, for a listener
    that was away, is refused: that failed the whole purge, a 503 "could not be purged"
    on every retry."""
    prefix = f"weir:test:{uuid.uuid4().hex[:8]}:"
    a = await replica(make_client, own_redis.url, prefix)
    b = await replica(make_client, own_redis.url, prefix)
    raw = aioredis.Redis.from_url(own_redis.url)
    try:
        await ask(a, "What are your opening hours?")
        assert (await ask(b, "What are your opening hours?"))[0] == "exact"
        await raw.config_set("maxmemory-policy", "noeviction")
        await raw.config_set("maxmemory", 1)
        r = await a.post("/admin/cache/purge", headers=h("k-admin"), json={"tenant": "acme"})
        assert r.status == 200, await r.text()
        assert await raw.keys(prefix + "x:*") == []
        await raw.config_set("maxmemory", 0)
        await eventually_miss(b, "What are your opening hours?")
    finally:
        await raw.config_set("maxmemory", 0)
        await raw.aclose()


async def eventually_miss(client: Any, content: str) -> None:
    """The other replica heard the purge (its L1 entry dropped): a miss."""
    from tests.waiting import eventually

    l1 = cache_of(client).store.l1
    assert l1 is not None
    await eventually(lambda: not list(l1.entries()), timeout=5.0)
    assert (await ask(client, content))[0] == "miss"


async def test_a_stray_key_under_the_event_log_does_not_block_purges(
        make_client: MakeClient, redis_server: RedisServer) -> None:
    """A key of another type where the purge's event log goes (a hand edit, another
    version): the log's ZADD was refused (WRONGTYPE) and failed the purge, which had
    deleted and announced everything, a 503 on every retry. It is replaced, as the
    persist script replaces a stray key."""
    prefix = f"weir:test:{uuid.uuid4().hex[:8]}:"
    a = await replica(make_client, redis_server.url, prefix)
    raw = aioredis.Redis.from_url(redis_server.url)
    try:
        await ask(a, "What are your opening hours?")
        await raw.set(prefix + "eventlog", "stray")
        r = await a.post("/admin/cache/purge", headers=h("k-admin"), json={"tenant": "acme"})
        assert r.status == 200, await r.text()
        assert await raw.keys(prefix + "x:*") == []
        assert await raw.type(prefix + "eventlog") == b"zset"
    finally:
        await raw.aclose()


async def test_a_purge_of_a_full_redis_leaves_it_full(make_client: MakeClient,
                                                      own_redis: RedisServer) -> None:
    """The purge's event log refused for lack of room marked Redis full, and the same
    call, answered, marked it as taking writes again: health said "up" (and the log
    said both) while every store was still refused."""
    prefix = f"weir:test:{uuid.uuid4().hex[:8]}:"
    a = await replica(make_client, own_redis.url, prefix)
    raw = aioredis.Redis.from_url(own_redis.url)
    try:
        await ask(a, "What are your opening hours?")
        await raw.config_set("maxmemory-policy", "noeviction")
        await raw.config_set("maxmemory", 1)
        r = await a.post("/admin/cache/purge", headers=h("k-admin"), json={"tenant": "acme"})
        assert r.status == 200, await r.text()
        assert (await health(a))[1]["plugins"]["cache"]["redis"] == "full"
    finally:
        await raw.config_set("maxmemory", 0)
        await raw.aclose()
