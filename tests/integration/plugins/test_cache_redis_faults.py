"""The cache (and what shares its Redis) against a Redis that misbehaves without being
down: one full at its `maxmemory` (writes refused, reads answer), and entries under the
cache's keys that Weir never wrote (another version, a hand edit, an attacker with
Redis access): a read of one is a miss, never a 500 nor another tenant's answer."""

from __future__ import annotations

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
