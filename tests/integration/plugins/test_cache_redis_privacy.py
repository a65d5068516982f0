"""No prompt text in Redis (issue 16): after caching a prompt that carries a unique marker
word, no Redis key or value holds the marker, while the semantic layer still works
across replicas (its guard compares a hash). Opting in keeps the prompt in Redis."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import redis.asyncio as aioredis

from bench.redis_server import RedisServer
from proxy.app_state import STATE
from tests.conftest import MakeClient, make_settings
from tests.fakes import FakeEngine
from tests.integration.plugins.test_cache_redis import ask, cache_of, replicas, settle
from tests.waiting import eventually


async def redis_dump(url: str, prefix: str) -> list[str]:
    """Every key under `prefix` and every value in it, as text."""
    client = aioredis.from_url(url)
    out: list[str] = []
    try:
        async for raw in client.scan_iter(match=prefix + "*", count=500):
            key = raw.decode()
            out.append(key)
            kind = (await client.type(key)).decode()
            if kind == "string":
                out.append((await client.get(key)).decode())
            elif kind == "hash":
                for f, v in (await client.hgetall(key)).items():
                    out += [f.decode(), v.decode()]
            elif kind == "zset":
                out += [m.decode() for m in await client.zrange(key, 0, -1)]
            else:
                raise AssertionError(f"unexpected Redis type {kind} at {key}")
    finally:
        await client.aclose()
    return out


async def assert_gone(url: str, prefix: str, q: str, *clients: Any) -> None:
    """No entry is left in Redis, and no replica answers `q` from the cache."""
    left = [k for k in await redis_dump(url, prefix)
            if k.startswith((prefix + "x:", prefix + "s:"))]
    assert left == []
    for client in clients:
        layer, _ = await ask(client, q, headers={"Cache-Control": "no-store"})
        assert layer == "miss"


async def with_prefix(make_client: MakeClient, url: str, n: int = 2,
                      **redis: Any) -> tuple[Any, str]:
    prefix = f"weir:test:{uuid.uuid4().hex[:8]}:"
    clients = await replicas(make_client, url, n=n, redis={
        "url": url, "key_prefix": prefix, "timeout_s": 0.2, **redis})
    return clients, prefix


async def test_redis_holds_no_prompt_text(make_client: MakeClient,
                                          redis_server: RedisServer) -> None:
    marker = "zq" + uuid.uuid4().hex[:10]  # lower case: not a "name" for the guard
    (a, b), prefix = await with_prefix(make_client, redis_server.url)
    layer, _ = await ask(a, f"How do I reset the {marker} password for 2 users?")
    assert layer == "miss"
    await ask(a, f"What is the {marker} refund policy?", stream=True)
    await settle(a)
    dump = await redis_dump(redis_server.url, prefix)
    assert any(k.startswith(prefix + "x:") for k in dump)  # exact entries are there
    assert any(k.startswith(prefix + "s:") for k in dump)  # and semantic ones
    assert not [v for v in dump if marker in v.lower()]
    assert not [v for v in dump if "reset the" in v or "refund policy" in v]

    # The other replica hears of the entry, which Redis holds without its question: the
    # near-miss guard could not check the words, so it serves no paraphrase from it.
    heard = cache_of(b).store.metrics.events.labels("add")
    await eventually(lambda: heard._value.get() == 2, timeout=2.0)
    assert len(cache_of(b).store.index) == 0
    layer, _ = await ask(b, f"How can I reset the {marker} password for 2 users?",
                         headers={"Cache-Control": "no-store"})
    assert layer == "miss"
    # An exact repeat on the other replica is served from Redis (L2).
    layer, _ = await ask(b, f"What is the {marker} refund policy?")
    assert layer == "exact"


async def test_purge_by_content_without_stored_prompts(make_client: MakeClient,
                                                      redis_server: RedisServer) -> None:
    """Without the opt-in a content purge matches prompts held in a replica's memory, and
    removes those entries' Redis copies too (Redis itself holds no prompt to match)."""
    (a,), prefix = await with_prefix(make_client, redis_server.url, n=1)
    await ask(a, "Tell me about project heron launch")
    r = await a.post("/admin/cache/purge", json={"contains": "heron"},
                     headers={"Authorization": "Bearer k-admin"})
    purged = (await r.json())["purged"]
    assert purged["l1"] == 1 and purged["semantic_index"] == 1
    assert purged["redis"] == {"exact": 1, "semantic": 1}
    left = await redis_dump(redis_server.url, prefix)
    assert not [k for k in left if k.startswith((prefix + "x:", prefix + "s:"))]


async def test_opt_in_keeps_prompts_in_redis(make_client: MakeClient,
                                             redis_server: RedisServer) -> None:
    marker = "zq" + uuid.uuid4().hex[:10]
    (a,), prefix = await with_prefix(make_client, redis_server.url, n=1, store_prompts=True)
    await ask(a, f"Explain the {marker} setup steps")
    dump = await redis_dump(redis_server.url, prefix)
    assert [v for v in dump if marker in v]


async def test_a_content_purge_reaches_copies_read_from_redis(make_client: MakeClient,
                                                              redis_server: RedisServer) -> None:
    """Replica b serves an answer it read from Redis (no prompt in it); the purge is
    asked of replica c, which never saw it. a, which stored it and holds its prompt,
    matches it and names it to the others: b drops its copy, and no replica serves the
    purged answer again."""
    (a, b, c), _ = await with_prefix(make_client, redis_server.url, n=3)
    q = "Tell me about project osprey launch"
    await ask(a, q)
    await settle(a)
    assert (await ask(b, q))[0] == "exact"  # read from Redis into b's memory (L1)
    r = await c.post("/admin/cache/purge", json={"contains": "osprey"},
                     headers={"Authorization": "Bearer k-admin"})
    assert r.status == 200 and (await r.json())["purged"]["l1"] == 0
    b_l1 = cache_of(b).store.l1
    await eventually(lambda: b_l1 is not None and len(b_l1) == 0
                     and len(cache_of(a).store.index) == 0, timeout=2.0)
    await settle(a, b, c)
    for client in (a, b, c):  # probes must not store the answer again
        for text in (q, "Tell me about the project osprey launch"):
            layer, _ = await ask(client, text, headers={"Cache-Control": "no-store"})
            assert layer == "miss", (text, layer)


async def test_a_content_purge_reaches_paraphrases_kept_as_aliases(
        make_client: MakeClient, redis_server: RedisServer) -> None:
    """Replica b serves a paraphrase from an entry it read from Redis and keeps it as an
    exact alias (its next ask skips the embedding); the alias holds the paraphrase's text,
    not the original's. A purge of words only the original has, asked of c, reaches the
    alias too (a names the original; b drops what it keeps of it, aliases included)."""
    # (with its question: an entry read from Redis without it serves no paraphrase)
    (a, b, c), _ = await with_prefix(make_client, redis_server.url, n=3,
                                     store_prompts=True)
    q = "Tell me about project osprey launch"
    paraphrase = "Tell me about the project osprey launch"
    await ask(a, q)
    await settle(a)
    await eventually(lambda: len(cache_of(b).store.index) == 1, timeout=2.0)
    assert (await ask(b, paraphrase))[0] == "semantic"  # kept as an alias
    assert (await ask(b, paraphrase, headers={"Cache-Control": "no-store"}))[0] == "exact"
    r = await c.post("/admin/cache/purge", json={"contains": "about project osprey"},
                     headers={"Authorization": "Bearer k-admin"})
    assert r.status == 200
    await eventually(lambda: len(cache_of(b).store.index) == 0
                     and len(cache_of(a).store.index) == 0, timeout=2.0)
    b_l1 = cache_of(b).store.l1
    await eventually(lambda: b_l1 is not None and len(b_l1) == 0, timeout=2.0)
    await settle(a, b, c)  # the Redis copies each deletes of what it matched
    for client in (a, b, c):
        for text in (q, paraphrase):
            layer, _ = await ask(client, text, headers={"Cache-Control": "no-store"})
            assert layer == "miss", (text, layer)


async def test_a_purge_redis_did_not_take_is_a_503(make_client: MakeClient,
                                                   redis_server: RedisServer) -> None:
    """Redis unreachable during a purge: this replica's memory is purged, but Redis's
    copies (and the other replicas, told through it) are not; the purge says so (503,
    retry) instead of a 200."""
    (a,), _ = await with_prefix(make_client, redis_server.url, n=1)
    await ask(a, "Tell me about project kestrel launch")
    await settle(a)
    store = cache_of(a).store
    assert store.redis is not None

    async def down(*args: Any, **kwargs: Any) -> None:
        return None  # what RedisStore.purge answers when Redis failed

    store.redis.purge = down  # type: ignore[method-assign]
    r = await a.post("/admin/cache/purge", json={"contains": "kestrel"},
                     headers={"Authorization": "Bearer k-admin"})
    assert r.status == 503 and r.headers["Retry-After"] == "1"
    assert (await r.json())["error"]["code"] == "cache_store_unavailable"


async def test_the_retry_a_failed_purge_asks_for_reaches_redis(make_client: MakeClient,
                                                               redis_server: RedisServer
                                                               ) -> None:
    """Redis failed a content purge once (503); the retry finds nothing left in this
    replica's memory to match by prompt, but the names the first try matched are kept
    and retried: the Redis copies go, and no replica serves the answer again."""
    (a, b), prefix = await with_prefix(make_client, redis_server.url, n=2)
    q = "Tell me about project kestrel launch"
    await ask(a, q)
    await settle(a)
    store = cache_of(a).store
    assert store.redis is not None
    real = store.redis.purge

    async def down(*args: Any, **kwargs: Any) -> None:
        return None  # Redis failed this once (a scan timeout, a blip)

    store.redis.purge = down  # type: ignore[method-assign]
    admin = {"Authorization": "Bearer k-admin"}
    r = await a.post("/admin/cache/purge", json={"contains": "kestrel"}, headers=admin)
    assert r.status == 503
    store.redis.purge = real  # type: ignore[method-assign]
    r = await a.post("/admin/cache/purge", json={"contains": "kestrel"}, headers=admin)
    assert r.status == 200
    await assert_gone(redis_server.url, prefix, q, a, b)


async def test_a_purge_sent_while_a_replica_was_away_reaches_it_when_it_is_back(
        make_client: MakeClient, redis_server: RedisServer) -> None:
    """Pub/sub keeps nothing: a content purge sent while the listener of the replica that
    holds the prompt was away (a Redis restart, a blip) never reached it, and the entry
    was served by every replica, from its memory and from Redis (no prompt there to
    match), until it expired. Redis keeps a purge's events a while; the replica reads
    them back when its listener is, and applies them as it would have."""
    import time

    from proxy.tasks import cancel_and_wait

    (a, b), prefix = await with_prefix(make_client, redis_server.url)
    q = "Tell me about project osprey migration"
    assert (await ask(b, q))[0] == "miss"  # b made it: b alone holds its prompt
    await settle(b)
    store = cache_of(b).store
    assert store.redis is not None
    away = time.time()
    await cancel_and_wait(store.redis._listener)  # b's listener is away
    r = await a.post("/admin/cache/purge", json={"contains": "osprey"},
                     headers={"Authorization": "Bearer k-admin"})
    assert r.status == 200
    assert (await ask(a, q, headers={"Cache-Control": "only-if-cached"}))[0] == "exact"
    await store._on_event({"op": "resync", "since": away})  # what the listener does back
    await settle(a, b)
    a_l1 = cache_of(a).store.l1  # the copy a read from Redis: dropped as b names it
    await eventually(lambda: a_l1 is not None and len(a_l1) == 0, timeout=2.0)
    await assert_gone(redis_server.url, prefix, q, a, b)


async def test_another_tenants_purge_neither_counts_nor_strands_a_failed_purges_names(
        make_client: MakeClient, redis_server: RedisServer) -> None:
    """Redis was away for tenant acme's content purge (503: neither the delete nor the
    event to the other replicas went), so the names it matched were kept for the next
    purge to retry; the next was tenant globex's own. It took acme's
    names under globex's filter: globex's answer counted acme's entries as its own
    purged ones, and the other replica, told to drop them under globex's filter (which
    owns none of them), kept its copy read from Redis. acme's retry then found nothing
    left to name, and that replica served the purged answer until it expired."""
    prefix = f"weir:test:{uuid.uuid4().hex[:8]}:"
    keys = [{"key": "k-alice", "tenant": "acme", "user": "alice"},
            {"key": "k-acme-admin", "tenant": "acme", "role": "admin"},
            {"key": "k-globex-admin", "tenant": "globex", "role": "admin"}]
    cfg = {"l2": {"enabled": True}, "store_truncated": True,
           "redis": {"url": redis_server.url, "key_prefix": prefix, "timeout_s": 0.2}}
    a, b = [await make_client(make_settings(
        auth={"mode": "keys", "keys": keys}, embeddings={"enabled": True},
        plugins=[{"name": "cache", "config": cfg}]), engine=FakeEngine()) for _ in range(2)]
    for c in (a, b):
        await c.app[STATE].embedder.ready()
    q = "Tell me about project kestrel launch"
    assert (await ask(a, q))[0] == "miss"  # a made it: a alone holds its prompt
    assert (await ask(b, q))[0] == "exact"  # b's copy, read from Redis, has none
    store = cache_of(a).store
    assert store.redis is not None
    real, real_publish = store.redis.purge, store.redis.publish

    async def down(*args: Any, **kwargs: Any) -> None:
        return None  # Redis was away for this one

    async def not_sent(*args: Any, **kwargs: Any) -> bool:
        return False

    store.redis.purge = down  # type: ignore[method-assign]
    store.redis.publish = not_sent  # type: ignore[method-assign]
    acme = {"Authorization": "Bearer k-acme-admin"}
    r = await a.post("/admin/cache/purge", json={"contains": "kestrel"}, headers=acme)
    assert r.status == 503
    store.redis.purge, store.redis.publish = real, real_publish  # type: ignore[method-assign]
    r = await a.post("/admin/cache/purge", json={"contains": "osprey"},
                     headers={"Authorization": "Bearer k-globex-admin"})
    assert r.status == 200
    assert (await r.json())["purged"]["redis"] == {"exact": 0, "semantic": 0}
    r = await a.post("/admin/cache/purge", json={"contains": "kestrel"}, headers=acme)
    assert r.status == 200
    await settle(a, b)
    b_l1 = cache_of(b).store.l1
    await eventually(lambda: b_l1 is not None and len(b_l1) == 0, timeout=2.0)
    await assert_gone(redis_server.url, prefix, q, a, b)


async def test_a_purge_waits_for_another_purges_retry_of_its_names(
        make_client: MakeClient, redis_server: RedisServer) -> None:
    """tenant acme's content purge failed (its names owed); globex's purge took them to
    retry under acme's filter, and while that retry ran acme purged again: finding no
    names of its own owed, it answered 200 at once. globex's retry of acme's names then
    failed too: they were owed again, to no caller waiting, and the other replica kept
    serving the purged answer. A purge now waits for the one retrying, and takes what
    it left owed."""
    prefix = f"weir:test:{uuid.uuid4().hex[:8]}:"
    keys = [{"key": "k-alice", "tenant": "acme", "user": "alice"},
            {"key": "k-acme-admin", "tenant": "acme", "role": "admin"},
            {"key": "k-globex-admin", "tenant": "globex", "role": "admin"}]
    cfg = {"l2": {"enabled": True}, "store_truncated": True,
           "redis": {"url": redis_server.url, "key_prefix": prefix, "timeout_s": 0.2}}
    a, b = [await make_client(make_settings(
        auth={"mode": "keys", "keys": keys}, embeddings={"enabled": True},
        plugins=[{"name": "cache", "config": cfg}]), engine=FakeEngine()) for _ in range(2)]
    for c in (a, b):
        await c.app[STATE].embedder.ready()
    q = "Tell me about project kestrel launch"
    assert (await ask(a, q))[0] == "miss"
    assert (await ask(b, q))[0] == "exact"  # b's copy, read from Redis, has no prompt
    store = cache_of(a).store
    assert store.redis is not None
    real, real_publish = store.redis.purge, store.redis.publish

    async def down(*args: Any, **kwargs: Any) -> None:
        return None

    async def not_sent(*args: Any, **kwargs: Any) -> bool:
        return False

    store.redis.purge = down  # type: ignore[method-assign]
    store.redis.publish = not_sent  # type: ignore[method-assign]
    acme = {"Authorization": "Bearer k-acme-admin"}
    r = await a.post("/admin/cache/purge", json={"contains": "kestrel"}, headers=acme)
    assert r.status == 503
    store.redis.publish = real_publish  # type: ignore[method-assign]
    entered, gate = asyncio.Event(), asyncio.Event()
    calls = 0

    async def held_then_down_once(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:  # globex's retry of acme's names: held, then Redis is away again
            entered.set()
            await gate.wait()
            return None
        return await real(*args, **kwargs)

    store.redis.purge = held_then_down_once  # type: ignore[method-assign]
    globex = asyncio.ensure_future(a.post(
        "/admin/cache/purge", json={"contains": "osprey"},
        headers={"Authorization": "Bearer k-globex-admin"}))
    await asyncio.wait_for(entered.wait(), 5)
    again = asyncio.ensure_future(a.post("/admin/cache/purge", json={"contains": "kestrel"},
                                         headers=acme))
    # acme's purge waits while globex's retry of its names is held (it answered 200 at
    # once): the wait is bounded only for the code before, which did not wait.
    done, _ = await asyncio.wait((again,), timeout=0.5)
    assert not done
    gate.set()
    r_globex, r = await globex, await again
    assert r_globex.status == 200 and r.status == 200
    assert (await r.json())["purged"]["redis"] is not None
    await settle(a, b)
    b_l1 = cache_of(b).store.l1
    await eventually(lambda: b_l1 is not None and len(b_l1) == 0, timeout=2.0)
    await assert_gone(redis_server.url, prefix, q, a, b)
