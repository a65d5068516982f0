"""The cache with a real redis-server and the real embedding model, two replicas sharing
Redis: L2, cross-replica semantic entries, purges over pub/sub, tenant isolation, Redis
going away and coming back, and cancelled Redis commands."""

from __future__ import annotations

import asyncio
import base64
import json
import random
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.redis_server import RedisServer
from plugins.cache.config import RedisConfig
from plugins.cache.entry import Entry
from plugins.cache.plugin import CachePlugin
from plugins.cache.redis_store import RedisStore
from proxy.app_state import STATE
from tests.conftest import MakeClient, make_settings
from tests.fakes import FakeEngine
from tests.sse import check_chat_stream, parse_sse
from tests.waiting import eventually

KEYS = [{"key": "k-alice", "tenant": "acme", "user": "alice"},
        {"key": "k-bob", "tenant": "acme", "user": "bob"},
        {"key": "k-eve", "tenant": "globex", "user": "eve"},
        {"key": "k-admin", "tenant": "acme", "role": "admin", "user": "root"}]


def h(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def body(content: str, **kw: Any) -> dict[str, Any]:
    return {"model": "fake-model", "temperature": 0, "max_tokens": 6,
            "messages": [{"role": "user", "content": content}], **kw}


async def replicas(make_client: MakeClient, url: str, n: int = 2, **cache: Any) -> list[Any]:
    """Replicas sharing Redis; with `store_prompts` unless `redis` says otherwise (an
    entry read from Redis without its question serves no paraphrase, so joins no index:
    `test_without_its_question_another_replicas_entry_serves_no_paraphrase`)."""
    prefix = f"weir:test:{uuid.uuid4().hex[:8]}:"
    cfg = {"l2": {"enabled": True}, "redis": {"url": url, "key_prefix": prefix,
                                              "timeout_s": 0.2, "store_prompts": True},
           "store_truncated": True, **cache}
    clients = []
    for _ in range(n):
        settings = make_settings(auth={"mode": "keys", "keys": KEYS},
                                 embeddings={"enabled": True},
                                 plugins=[{"name": "cache", "config": cfg}])
        c = await make_client(settings, engine=FakeEngine())
        await c.app[STATE].embedder.ready()
        clients.append(c)
    return clients


def cache_of(client: Any) -> CachePlugin:
    return next(p for p in client.app[STATE].plugins if p.name == "cache")  # type: ignore[no-any-return]


def engine_of(client: Any) -> FakeEngine:
    return client.app[STATE].terminal.engine  # type: ignore[no-any-return]


async def settle(*clients: Any) -> None:
    for c in clients:
        p = cache_of(c)
        await p.store.drain()


async def ask(client: Any, content: str, key: str = "k-alice",
              headers: dict[str, str] | None = None, **kw: Any) -> tuple[str, Any]:
    r = await client.post("/v1/chat/completions", json=body(content, **kw),
                          headers={**h(key), **(headers or {})})
    assert r.status == 200, await r.text()
    data = await r.json() if not kw.get("stream") else await r.text()
    await settle(client)
    return r.headers["x-weir-cache"], data


async def test_l2_is_shared_and_fills_l1(make_client: MakeClient, redis_server: RedisServer
                                         ) -> None:
    a, b = await replicas(make_client, redis_server.url)
    layer, first = await ask(a, "What are your opening hours?")
    assert layer == "miss"
    layer, second = await ask(b, "What are your opening hours?")
    assert layer == "exact" and engine_of(b).calls == []
    assert second["choices"][0]["message"] == first["choices"][0]["message"]
    layer, _ = await ask(b, "What are your opening hours?", stream=True)
    assert layer == "exact"
    metrics = await (await b.get("/metrics")).text()
    assert 'weir_cache_lookups_total{layer="l2",result="hit"} 1.0' in metrics
    assert 'weir_cache_lookups_total{layer="l1",result="hit"} 1.0' in metrics
    # per request: both were hits (one from L2), and b had no miss
    assert 'weir_cache_lookups_total{layer="all",result="hit"} 2.0' in metrics
    assert 'weir_cache_lookups_total{layer="all",result="miss"}' not in metrics


async def test_each_layer_keeps_an_answer_for_its_own_ttl(make_client: MakeClient,
                                                          redis_server: RedisServer) -> None:
    """`l2.ttl_s` and `semantic.ttl_s` say how long those layers serve an answer; every
    layer used `exact.ttl_s` (L1's), so the shipped defaults kept a day's answers an
    hour."""
    a, b = await replicas(make_client, redis_server.url, exact={"ttl_s": 60},
                          l2={"enabled": True, "ttl_s": 5000},
                          semantic={"ttl_s": 9000}, stale_grace_s=0)
    await ask(a, "How do I reset my password?")
    await eventually(lambda: len(cache_of(b).store.index) == 1, timeout=1.0)
    store = cache_of(a).store
    assert store.redis is not None
    (key,) = [e.key for e in store.l1.entries()]  # type: ignore[union-attr]
    l1 = store.l1.held(key)  # type: ignore[union-attr]
    assert l1 is not None and l1.expires == l1.created + 60
    ttl_ms = await store.redis.client.pttl(store.redis.p + "x:" + key)
    assert 4_000_000 < ttl_ms <= 5_000_000
    l2 = await store.redis.get_exact(key)
    assert l2 is not None and l2.expires == l2.created + 5000
    (held,) = [e for part in cache_of(b).store.index.partitions.values()
               for e, _ in part.entries.values()]
    assert held.expires == held.created + 9000  # as the other replica keeps it too


async def test_semantic_entry_reaches_the_other_replica(make_client: MakeClient,
                                                        redis_server: RedisServer) -> None:
    """With its question (`store_prompts`), which the near-miss guard needs."""
    redis = {"url": redis_server.url, "key_prefix": f"weir:test:{uuid.uuid4().hex[:8]}:",
             "store_prompts": True}
    a, b = await replicas(make_client, redis_server.url, redis=redis)
    await ask(a, "How do I reset my password?")
    await eventually(lambda: len(cache_of(b).store.index) == 1, timeout=1.0)
    layer, _ = await ask(b, "How can I reset my password?")
    assert layer == "semantic" and engine_of(b).calls == []
    # A third replica started later loads the entry from Redis at start.
    (c,) = await replicas(make_client, redis_server.url, n=1, redis=redis)
    assert len(cache_of(c).store.index) == 1


async def test_without_its_question_another_replicas_entry_serves_no_paraphrase(
        make_client: MakeClient, redis_server: RedisServer) -> None:
    """Redis holds no prompt text by default: the guard would have a digest of the
    question's features alone, and its word-level rules could not run ("open" answered
    "close", "annual plans" answered "monthly plans" across replicas). Such an entry
    serves exact repeats only; the replica that stored it keeps its own question."""
    redis = {"url": redis_server.url, "key_prefix": f"weir:test:{uuid.uuid4().hex[:8]}:"}
    a, b = await replicas(make_client, redis_server.url, redis=redis)
    await ask(a, "Is the store open on Saturday?")
    heard = cache_of(b).store.metrics.events.labels("add")
    await eventually(lambda: heard._value.get() == 1, timeout=1.0)
    assert len(cache_of(b).store.index) == 0  # heard, and not held
    for near_miss in ("Is the store closed on Saturday?", "Is the shop open on Saturday?"):
        layer, _ = await ask(b, near_miss)
        assert layer == "miss"
    layer, _ = await ask(b, "Is the store open on Saturday?")
    assert layer == "exact"  # (L2)
    assert len(cache_of(a).store.index) == 1  # a holds its own, with its question
    (c,) = await replicas(make_client, redis_server.url, n=1, redis=redis)
    assert len(cache_of(c).store.index) == 0  # none loaded at start either


async def test_tenants_never_share_entries(make_client: MakeClient, redis_server: RedisServer
                                           ) -> None:
    a, b = await replicas(make_client, redis_server.url)
    await ask(a, "What is our refund policy for enterprise plans?")
    await eventually(lambda: len(cache_of(b).store.index) == 1)
    probe = {"Cache-Control": "no-store"}  # eve's lookups must not plant entries of her own
    for client in (a, b):
        for q in ("What is our refund policy for enterprise plans?",
                  "What's our refund policy for enterprise plans?"):
            layer, _ = await ask(client, q, "k-eve", headers=probe)
            assert layer == "miss"
    layer, _ = await ask(b, "What is our refund policy for enterprise plans?", "k-bob")
    assert layer == "exact"  # same tenant, tenant scope


async def test_role_scope_separates_roles(make_client: MakeClient, redis_server: RedisServer
                                          ) -> None:
    (a,) = await replicas(make_client, redis_server.url, n=1, scope="role")
    await ask(a, "Show me the quarterly numbers summary", "k-admin")
    layer, _ = await ask(a, "Show me the quarterly numbers summary", "k-alice")
    assert layer == "miss"


async def test_admin_purge_reaches_every_replica(make_client: MakeClient,
                                                 redis_server: RedisServer) -> None:
    # Prompts stored in Redis (opt-in): a purge by content reaches Redis entries too.
    a, b = await replicas(make_client, redis_server.url, redis={
        "url": redis_server.url, "key_prefix": f"weir:test:{uuid.uuid4().hex[:8]}:",
        "timeout_s": 0.2, "store_prompts": True})
    await ask(a, "Tell me about project falcon launch")
    await ask(a, "What is the weather policy for travel")
    await ask(b, "Tell me about project falcon launch")  # b's L1 holds it too
    await eventually(lambda: len(cache_of(b).store.index) == 2)
    r = await a.post("/admin/cache/purge", json={"contains": "FALCON"}, headers=h("k-alice"))
    assert r.status == 403
    r = await a.post("/admin/cache/purge", json={}, headers=h("k-admin"))
    assert r.status == 400
    r = await a.post("/admin/cache/purge", json={"contains": "falcon"}, headers=h("k-admin"))
    assert r.status == 200
    purged = (await r.json())["purged"]
    assert purged["redis"] == {"exact": 1, "semantic": 1}
    await eventually(lambda: len(cache_of(b).store.index) == 1)
    for client in (a, b):  # probes must not store the answer again
        layer, _ = await ask(client, "Tell me about project falcon launch",
                             headers={"Cache-Control": "no-store"})
        assert layer == "miss"
        layer, _ = await ask(client, "Tell me about the project falcon launch",
                             headers={"Cache-Control": "no-store"})
        assert layer == "miss"  # nor semantically
    await settle(a, b)
    stats = await (await a.get("/admin/cache/stats", headers=h("k-admin"))).json()
    assert stats["redis"]["exact"] >= 1


async def test_an_entry_read_from_redis_as_a_purge_removes_it_is_not_kept_in_memory(
        make_client: MakeClient, redis_server: RedisServer) -> None:
    """A replica's read of an L2 entry answered just before another replica's purge
    deleted it, and the purge's event handled here before the read's answer was: the
    answer goes out (it was read before the purge), but it is not put in this replica's
    L1, where it was served until its TTL ran out as if never purged."""
    a, b = await replicas(make_client, redis_server.url)
    q = "What is the refund window for orders?"
    assert (await ask(a, q))[0] == "miss"
    rs = cache_of(b).store.redis
    assert rs is not None
    read = rs.get_exact
    purges = len(cache_of(b).store._purges)

    async def overtaken(key: str) -> Entry | None:
        got = await read(key)
        await cache_of(a).store.purge({"tenant": "acme"})  # Redis's copy goes, event out
        await eventually(lambda: len(cache_of(b).store._purges) > purges, timeout=2.0)
        return got

    rs.get_exact = overtaken  # type: ignore[method-assign]
    assert (await ask(b, q))[0] == "exact"
    rs.get_exact = read  # type: ignore[method-assign]
    assert len(cache_of(b).store.l1 or []) == 0
    assert (await ask(b, q, headers={"Cache-Control": "no-store"}))[0] == "miss"
    # and the semantic entries a replica loads (at start, after a gap), alike
    assert (await ask(a, q))[0] == "miss"
    await eventually(lambda: len(cache_of(b).store.index) == 1)
    cache_of(b).store.index.purge(lambda e: True)
    load, purges = rs.load_semantic, len(cache_of(b).store._purges)

    async def loaded_then_purged(*args: Any) -> Any:
        got = await load(*args)
        await cache_of(a).store.purge({"tenant": "acme"})
        await eventually(lambda: len(cache_of(b).store._purges) > purges, timeout=2.0)
        return got

    rs.load_semantic = loaded_then_purged  # type: ignore[method-assign]
    await cache_of(b).store._load_semantic()
    assert len(cache_of(b).store.index) == 0


async def test_purge_by_tenant_and_user(make_client: MakeClient, redis_server: RedisServer
                                        ) -> None:
    (a,) = await replicas(make_client, redis_server.url, n=1, scope="user")
    await ask(a, "alice question about invoices", "k-alice")
    await ask(a, "bob question about invoices", "k-bob")
    r = await a.post("/admin/cache/purge", json={"tenant": "acme", "user": "alice"},
                     headers=h("k-admin"))
    assert (await r.json())["purged"]["l1"] == 1
    assert (await ask(a, "alice question about invoices", "k-alice",
                      headers={"Cache-Control": "no-store"}))[0] == "miss"
    assert (await ask(a, "bob question about invoices", "k-bob"))[0] == "exact"


async def test_redis_down_then_back(make_client: MakeClient, tmp_path: Path) -> None:
    server = RedisServer(tmp_path).start()
    again: RedisServer | None = None
    try:
        a, b = await replicas(make_client, server.url)
        await ask(a, "Which payment methods do you accept?")
        await eventually(lambda: len(cache_of(b).store.index) == 1)
        server.stop()
        layer, _ = await ask(a, "Which payment methods do you accept?")
        assert layer == "exact"  # L1 still serves
        layer, _ = await ask(b, "Which payment methods do you accept?")
        assert layer == "semantic"  # b's in-memory index still serves
        layer, _ = await ask(a, "Where is your office located?")
        assert layer == "miss"  # the engine serves; nothing raised
        metrics = await (await a.get("/metrics")).text()
        assert "weir_cache_store_errors_total{" in metrics
        ready = await (await a.get("/health/ready", headers=h("k-admin"))).json()
        assert ready["plugins"]["cache"]["redis"] == "down"
        again = RedisServer(tmp_path, port=server.port).start()
        layer, _ = await ask(a, "How long does shipping take to Canada?")
        assert layer == "miss"
        layer, _ = await ask(b, "How long does shipping take to Canada?")
        assert layer == "exact"  # written to Redis again, read by the other replica
        assert cache_of(a).store.redis.healthy  # type: ignore[union-attr]
    finally:
        server.stop()
        if again is not None:
            again.stop()


def entry_ids(client: Any) -> set[str]:
    return {eid for part in cache_of(client).store.index.partitions.values()
            for eid in part.rows}


async def test_user_cap_holds_across_replicas(make_client: MakeClient,
                                              redis_server: RedisServer) -> None:
    """Redis keeps each user's list: entries stored through two replicas count against one
    cap, and the oldest leaves Redis and both replicas' memory."""
    a, b = await replicas(make_client, redis_server.url, per_user_max_entries=2)
    questions = ["What are your opening hours on Sundays?", "How do I export my invoices?",
                 "Which browsers does the dashboard support?"]
    assert (await ask(a, questions[0]))[0] == "miss"
    await eventually(lambda: len(entry_ids(b)) == 1)
    first = entry_ids(b)
    for client, q in ((b, questions[1]), (a, questions[2])):
        assert (await ask(client, q))[0] == "miss"
    # b heard of the third entry and of the first's drop
    await eventually(lambda: len(entry_ids(b)) == 2 and not first & entry_ids(b))
    assert entry_ids(a) == entry_ids(b)
    probe = {"Cache-Control": "no-store"}
    for client in (a, b):  # the first is gone everywhere, L2 included
        assert (await ask(client, questions[0], headers=probe))[0] == "miss"
    assert (await ask(b, questions[2]))[0] == "exact"  # from L2: a stored it
    assert (await ask(b, questions[0], "k-bob"))[0] == "miss"  # bob's own cap is untouched


@pytest.mark.parametrize("cap", [1000, 1])
async def test_a_stored_answer_is_one_redis_round_trip(
        make_client: MakeClient, redis_server: RedisServer,
        monkeypatch: pytest.MonkeyPatch, cap: int) -> None:
    """With the cap reached too (cap 1: the second answer evicts the first, deleted from
    Redis and announced in the same script)."""
    from redis.asyncio.connection import AbstractConnection

    a, b = await replicas(make_client, redis_server.url, per_user_max_entries=cap)
    await ask(a, "Warm the script cache with a first question")
    await eventually(lambda: len(entry_ids(b)) == 1)
    first = entry_ids(a)
    pool = cache_of(a).store.redis.client.connection_pool  # type: ignore[union-attr]
    sent: list[bytes] = []
    send = AbstractConnection.send_packed_command

    async def counting(self: AbstractConnection, command: Any, *args: Any, **kw: Any) -> None:
        if self in pool._in_use_connections:  # a's commands only (b reads a's events)
            sent.append(b"".join(command) if isinstance(command, list) else bytes(command))
        await send(self, command, *args, **kw)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counting)
    await ask(a, "Where can I download my receipts?")  # a miss: exact + semantic + cap
    # (the store may still be on its way when the answer is: a loaded machine saw only
    # the lookup by now)
    await eventually(lambda: len(sent) >= 2)
    monkeypatch.undo()
    # Two writes to Redis: the miss's L2 lookup, then the whole store (exact entry,
    # semantic entry and its event, the owner's cap) as one script.
    assert len(sent) == 2, sent
    assert sent[0].startswith(b"*2\r\n$3\r\nGET")
    assert b"EVALSHA" in sent[1]
    if cap == 1:  # the first answer left Redis and both replicas' memory
        await eventually(lambda: entry_ids(b) == entry_ids(a) and len(entry_ids(a)) == 1
                         and entry_ids(a) != first)
        probe = {"Cache-Control": "no-store"}
        for client in (b, a):
            layer, _ = await ask(client, "Warm the script cache with a first question",
                                 headers=probe)
            assert layer == "miss"


async def test_cancelled_commands_never_cross_keys(redis_server: RedisServer) -> None:
    from prometheus_client import CollectorRegistry, Counter

    errors = Counter("e", "e", ["op"], registry=CollectorRegistry())
    store = RedisStore(RedisConfig(url=redis_server.url, key_prefix=f"weir:t:{uuid.uuid4().hex}:",
                                   timeout_s=1.0, max_connections=8), errors, "r")
    rng = random.Random(7)

    def entry(i: int) -> Entry:
        return Entry(key=f"k{i}", route="chat", model="m", scope="s", tenant="t", role="r",
                     user="u", prompt="p", usage={"prompt_tokens": 1, "completion_tokens": 1},
                     choices=[{"index": 0, "text": f"value-{i}" * 50, "finish_reason": "stop"}],
                     expires=1e12, stale_until=1e12)

    await asyncio.gather(*(store.persist(entry(i), True, 60, None, entry(i), 60,
                                         [f"x:k{i}"], 1000, 60) for i in range(50)))
    wrong = 0
    for _ in range(20):
        tasks = [asyncio.create_task(store.get_exact(f"k{i}")) for i in range(50)]
        for t in rng.sample(tasks, 15):
            t.get_loop().call_soon(t.cancel)
        for i, t in enumerate(tasks):
            try:
                got = await t
            except asyncio.CancelledError:
                continue
            if got is not None and got.key != f"k{i}":
                wrong += 1
    assert wrong == 0
    for i in range(50):  # every connection still answers with its own key's value
        got = await store.get_exact(f"k{i}")
        assert got is not None and got.key == f"k{i}"
    await store.close()


async def test_a_busy_redis_still_takes_writes_that_reads_give_up_on(
        redis_server: RedisServer) -> None:
    """A read is on the request's path and gives up after `timeout_s` (a miss); a write
    runs after the answer has gone out and waits up to `write_timeout_s`, so a Redis busy
    for longer than a read may wait still stores the answer (with one timeout for both,
    a busy machine lost stored answers to neither Redis nor the other replicas)."""
    from prometheus_client import CollectorRegistry, Counter

    errors = Counter("e", "e", ["op"], registry=CollectorRegistry())
    store = RedisStore(RedisConfig(url=redis_server.url, key_prefix=f"weir:t:{uuid.uuid4().hex}:",
                                   timeout_s=0.05, write_timeout_s=5.0), errors, "r")
    other = RedisStore(RedisConfig(url=redis_server.url, key_prefix=store.p), errors, "o")
    entry = Entry(key="k", route="chat", model="m", scope="s", tenant="t", role="r", user="u",
                  prompt="p", usage={"prompt_tokens": 1, "completion_tokens": 1},
                  choices=[{"index": 0, "text": "kept", "finish_reason": "stop"}],
                  expires=1e12, stale_until=1e12)
    try:
        assert await other.client.client_pause(300) is True  # Redis busy for 0.3 s
        assert await store.get_exact("k") is None
        assert errors.labels("get")._value.get() == 1  # the read gave up ...
        assert await store.persist(entry, True, 60, None, entry, 60, ["x:k"], 1000, 60) == []
        assert errors.labels("persist")._value.get() == 0  # ... the write waited
        got = await store.get_exact("k")
        assert got is not None and got.choices[0]["text"] == "kept"
    finally:
        await store.close()
        await other.close()


@pytest.mark.parametrize("stream", [False, True])
async def test_concurrent_identical_requests_generate_once(
        make_client: MakeClient, redis_server: RedisServer, stream: bool) -> None:
    (a,) = await replicas(make_client, redis_server.url, n=1)
    engine = engine_of(a)
    engine.token_gate = asyncio.Event()
    tasks = [asyncio.create_task(a.post("/v1/chat/completions", headers=h("k-alice"),
                                        json=body("the same question", stream=stream)))
             for _ in range(10)]
    await engine.wait_until(lambda: len(engine.active) == 1)
    engine.token_gate.set()
    replies = await asyncio.gather(*tasks)
    assert all(r.status == 200 for r in replies) and len(engine.calls) == 1
    texts = set()
    for r in replies:
        if stream:
            events, done = parse_sse(await r.text())
            assert done
            texts.add(check_chat_stream(events))
        else:
            texts.add((await r.json())["choices"][0]["message"]["content"])
    assert len(texts) == 1


async def test_closing_ends_a_listener_that_lost_its_cancellation(
        redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """On Python 3.11 redis-py can lose a cancellation (its `asyncio.wait_for` returns
    the command's result when the command finished as the cancellation arrived): the
    listener read on and a replica's shutdown waited for it forever."""
    from prometheus_client import CollectorRegistry, Counter
    from redis.asyncio.client import PubSub

    get_message = PubSub.get_message
    lost: list[bool] = []

    async def losing(self: PubSub, *args: Any, **kw: Any) -> Any:
        try:
            return await get_message(self, *args, **kw)
        except asyncio.CancelledError:
            if lost:
                raise
            lost.append(True)
            return None

    monkeypatch.setattr(PubSub, "get_message", losing)
    store = RedisStore(RedisConfig(url=redis_server.url, key_prefix=f"weir:t:{uuid.uuid4().hex}:",
                                   timeout_s=1.0),
                       Counter("e", "e", ["op"], registry=CollectorRegistry()), "r")
    subscribed = asyncio.Event()

    async def on_event(event: dict[str, Any]) -> None:
        subscribed.set()

    await store.start(on_event)
    other = RedisStore(RedisConfig(url=redis_server.url, key_prefix=store.p, timeout_s=1.0),
                       Counter("e", "e", ["op"], registry=CollectorRegistry()), "other")
    heard = asyncio.ensure_future(subscribed.wait())
    async with asyncio.timeout(30):
        while not heard.done():  # once it hears, the listener is subscribed and reading
            await other.publish({"op": "ping"})
            await asyncio.wait({heard}, timeout=0.05)
        await store.close()
    await other.close()
    assert lost == [True] and store._listener is not None and store._listener.done()


async def test_a_cancellation_redis_loses_is_raised_again(
        redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that leaves during an L2 lookup whose command loses the cancellation:
    the lookup raises it, so the request does not go on to generate for nobody."""
    from prometheus_client import CollectorRegistry, Counter

    store = RedisStore(RedisConfig(url=redis_server.url, key_prefix=f"weir:t:{uuid.uuid4().hex}:",
                                   timeout_s=5.0),
                       Counter("e", "e", ["op"], registry=CollectorRegistry()), "r")
    started = asyncio.Event()

    async def losing_get(*args: Any) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return None  # the command finished as the cancellation arrived
        return None

    monkeypatch.setattr(store.client, "get", losing_get)
    lookup = asyncio.create_task(store.get_exact("k"))
    await started.wait()
    lookup.cancel()
    await asyncio.wait({lookup})
    assert lookup.cancelled()
    await store.close()



async def test_a_pending_answer_dropped_unembedded_frees_its_place_on_the_owners_list(
        redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lazy vectors reserve an answer's semantic place on its owner's Redis list when it
    is stored; an answer dropped before its vector came gives that place back."""
    from plugins.cache import store as store_mod
    from tests.unit.plugins.test_cache import ALICE, Engine, ctx
    from tests.unit.plugins.test_lazy import Busy, lazy_plugin, pending_is

    monkeypatch.setattr(store_mod, "MAX_PENDING", 1)
    p, _ = lazy_plugin(l2={"enabled": True}, redis={
        "url": redis_server.url, "key_prefix": f"weir:test:{uuid.uuid4().hex[:8]}:"})
    await p.start()
    redis = p.store.redis
    assert redis is not None
    busy = await Busy(p).start()
    await p(ctx("Where is parcel 88123 now?"), Engine("In Lisbon."))
    assert await pending_is(p, 1)
    await p(ctx("Where is parcel 99231 now?"), Engine("In Porto."))  # the bound drops it
    await p.store.drain()  # the writes, the release, and the second's vector
    indexed = {f"s:{name}:{eid}" for name, part in p.store.index.partitions.items()
               for eid in part.rows}
    assert len(indexed) == 1  # the second answer; the first was dropped unembedded
    owner = redis.user_key(ALICE.tenant, ALICE.user)
    members = {m.decode() for m in await redis.client.zrange(owner, 0, -1)}
    assert {m for m in members if m.startswith("s:")} == indexed
    assert sum(m.startswith("x:") for m in members) == 2  # both exact entries stay
    await busy.release()
    await p.close()


async def test_a_tenant_purge_never_drops_another_tenants_entry(make_client: MakeClient,
                                                               redis_server: RedisServer
                                                               ) -> None:
    """Scope `global`: two tenants' entries for one prompt share a key. acme's admin
    purges by content on replica a; replica b holds globex's entry under that key: the
    name a sends does not drop it (the filter's tenant is checked against what b holds)."""
    prefix = f"weir:test:{uuid.uuid4().hex[:8]}:"
    cfg = {"scope": "global", "store_truncated": True, "semantic": {"enabled": False},
           "redis": {"url": redis_server.url, "key_prefix": prefix, "timeout_s": 0.2}}
    a, b = [await make_client(make_settings(auth={"mode": "keys", "keys": KEYS},
                                            plugins=[{"name": "cache", "config": cfg}]),
                              engine=FakeEngine()) for _ in range(2)]
    q = "Tell me about project osprey launch"
    assert (await ask(a, q, key="k-alice"))[0] == "miss"  # acme's entry on a
    assert (await ask(b, q, key="k-eve"))[0] == "miss"  # globex's own entry on b
    await settle(a, b)
    assert [e.tenant for e in cache_of(b).store.l1.entries()] == ["globex"]
    r = await a.post("/admin/cache/purge", json={"contains": "osprey"}, headers=h("k-admin"))
    assert r.status == 200 and (await r.json())["purged"]["l1"] == 1
    # A second purge, of an acme entry only b holds: once b has dropped it, b has
    # handled the first purge's event too (events arrive in order).
    marker = "Tell me about project plover launch"
    await ask(b, marker, key="k-alice")
    await settle(b)
    r = await a.post("/admin/cache/purge", json={"contains": "plover"}, headers=h("k-admin"))
    assert r.status == 200
    await eventually(lambda: all(e.tenant != "acme" for e in cache_of(b).store.l1.entries()),
                     timeout=2.0)
    assert [e.tenant for e in cache_of(b).store.l1.entries()] == ["globex"]


async def test_garbage_in_redis_is_a_miss_never_a_crash(make_client: MakeClient,
                                                        redis_server: RedisServer) -> None:
    """Anything may sit under Weir's keys (another version's entries, garbage): a bad
    exact entry is a miss that is generated again (it was a 500 for every ask), a bad
    semantic entry does not stop a replica from starting (it crashed on it), a bad event
    does not kill the listener (purges had stopped reaching the replica), and purges and
    stats go on past bad entries (found by an adversarial pass)."""
    import redis.asyncio as aioredis

    prefix = f"weir:test:{uuid.uuid4().hex[:8]}:"
    redis_cfg = {"url": redis_server.url, "key_prefix": prefix, "timeout_s": 0.2}
    a, b = await replicas(make_client, redis_server.url, redis=redis_cfg)
    r = aioredis.from_url(redis_server.url)
    try:
        good = None
        for i, garbage in enumerate(["not json", "[1,2,3]", '{"key": "x"}', "GOOD-CHOICES"]):
            q = f"What are the opening hours of branch {i}?"
            assert (await ask(a, q))[0] == "miss"
            names = [n async for n in r.scan_iter(match=prefix + "x:*")]
            for name in names:
                raw = await r.get(name)
                good = good or raw
                if garbage == "GOOD-CHOICES":  # a known entry with choices of no shape
                    value = raw.replace(b'"choices":[', b'"choices":[{"index":"0"},')
                else:
                    value = garbage.encode()
                await r.set(name, value)
            # read and refused (a 200 from elsewhere: generated again, or the semantic
            # copy the other replica announced), never served from it nor a 500
            assert (await ask(b, q))[0] in ("miss", "semantic")
            assert (await ask(b, q))[0] == "exact"
            for name in names:
                await r.delete(name)
        await r.hset(prefix + "s:deadbeef", "id1", "garbage{")
        await r.hset(prefix + "s:deadbeef", "id2", '{"v": "%%%", "e": 1}')
        c, = await replicas(make_client, redis_server.url, n=1, redis=redis_cfg)  # starts
        for event in (b"not json", b"[1]", b'{"op": "purge", "filter": "x"}',
                      b'{"op": "add"}', b'{"op": "add", "p": "deadbeef", "id": "id1"}'):
            await r.publish(prefix + "events", event)
        await r.set(prefix + "x:bad", "[1,2,3]")
        await r.set(prefix + "x:nan", good.replace(b'"created":', b'"created":NaN,"x":'))
        await r.hset(prefix + "x:wrongtype", "a", "b")  # another type under the prefix
        nan = base64.b64encode(np.full(384, np.nan, dtype="<f4").tobytes()).decode()
        await r.hset(prefix + "s:nanpart", "n1",
                     json.dumps({"v": nan, "g": "#", "e": good.decode()}))
        held = len(cache_of(b).store.index)
        await r.publish(prefix + "events", json.dumps({"op": "add", "p": "nanpart", "id": "n1"}))
        assert (await ask(b, "Tell me about the spring sale"))[0] == "miss"
        assert (await ask(b, "Tell me about the spring sale"))[0] == "exact"
        stats = await b.get("/admin/cache/stats", headers=h("k-admin"))
        assert stats.status == 200
        purge = await a.post("/admin/cache/purge", json={"user": "alice"},
                             headers=h("k-admin"))
        assert purge.status == 200, await purge.text()
        # what no replica can read cannot be shown not to match: it went too
        assert not await r.exists(prefix + "x:bad") and not await r.exists(prefix + "x:nan")
        assert not await r.hexists(prefix + "s:nanpart", "n1")
        assert len(cache_of(b).store.index) <= held + 1  # the NaN vector never joined
        # b's listener lived through the bad events: a's purge reaches b's memory
        await eventually(lambda: len(cache_of(b).store.l1 or []) == 0, timeout=2.0)
        for client in (a, b, c):
            layer, _ = await ask(client, "Tell me about the spring sale",
                                 headers={"Cache-Control": "no-store"})
            assert layer == "miss"
    finally:
        await r.aclose()


async def test_readiness_says_redis_is_back_without_traffic(redis_server: RedisServer) -> None:
    """A read that timed out (Redis paused a moment; the listener's connection stays up,
    so it never reconnects) marks Redis down for /health/ready. Only a call that
    succeeded marked it up again: with no traffic it said "down" for good. The listener
    asks Redis while it is marked down."""
    import redis.asyncio as aioredis
    from prometheus_client import CollectorRegistry, Counter

    errors = Counter("errors", "", ["op"], registry=CollectorRegistry())
    store = RedisStore(RedisConfig(url=redis_server.url, timeout_s=0.05,
                                   key_prefix=f"weir:test:{uuid.uuid4().hex[:8]}:"),
                       errors, "r1")
    admin = aioredis.from_url(redis_server.url)

    async def nothing(event: dict[str, Any]) -> None:
        pass

    await store.start(nothing)
    try:
        assert await store.get_exact("k") is None and store.healthy
        await admin.execute_command("CLIENT", "PAUSE", "300", "ALL")
        assert await store.get_exact("k") is None  # timed out
        assert not store.healthy and errors.labels("get")._value.get() == 1
        await eventually(lambda: store.healthy, timeout=5.0)  # no call made meanwhile
    finally:
        await admin.aclose()
        await store.close()


async def test_a_replica_loads_no_more_semantic_entries_than_its_index_can_hold(
        redis_server: RedisServer) -> None:
    """A replica starting (or resyncing after a gap) read every semantic entry Redis held,
    up to 10,000,000 of them, into one list before its index kept any: a Redis filled
    by clients' distinct parameter sets cost each replica gigabytes at once. It reads
    about `semantic.max_bytes` of them, and none its index would refuse."""
    from prometheus_client import CollectorRegistry, Counter

    errors = Counter("e", "e", ["op"], registry=CollectorRegistry())
    store = RedisStore(RedisConfig(url=redis_server.url, key_prefix=f"weir:t:{uuid.uuid4().hex}:",
                                   timeout_s=1.0, store_prompts=True), errors, "r")

    def entry(i: int) -> Entry:
        return Entry(key=f"k{i}", route="chat", model="m", scope="s", tenant="t", role="r",
                     user="u", prompt="p", usage={"prompt_tokens": 1, "completion_tokens": 1},
                     choices=[{"index": 0, "text": "an answer " * 100, "finish_reason": "stop"}],
                     expires=1e12, stale_until=1e12)

    vec = np.ones(384, dtype=np.float32) / np.sqrt(384)
    for i in range(300):  # a partition per parameter set
        assert await store.persist(entry(i), False, 60, (f"seed-{i}", vec, f"question {i}"),
                                   entry(i), 60, [f"s:seed-{i}:k{i}"], 10_000, 60) is not None
    try:
        assert len(await store.load_semantic(10_000_000)) == 300
        some = await store.load_semantic(10_000_000, 100_000)
        assert 20 <= len(some) <= 60  # ~3.3 KB each as stored
        even = await store.load_semantic(10_000_000, None,
                                        lambda e, q: q.endswith(("0", "2", "4", "6", "8")))
        assert len(even) == 150
    finally:
        await store.close()


async def test_an_expired_semantic_entry_leaves_its_partition_in_redis(
        redis_server: RedisServer) -> None:
    """Every write to a partition's hash renews the hash's TTL, and an entry left the
    hash only through its owner's cap or a replica's eviction: once its owner's list
    expired, a partition written to every day kept it for good. A write now deletes the
    partition's entries past their time (but its own)."""
    from prometheus_client import CollectorRegistry, Counter

    errors = Counter("e", "e", ["op"], registry=CollectorRegistry())
    store = RedisStore(RedisConfig(url=redis_server.url, key_prefix=f"weir:t:{uuid.uuid4().hex}:",
                                   timeout_s=1.0), errors, "r")

    def entry(key: str, expires: float) -> Entry:
        return Entry(key=key, route="chat", model="m", scope="s", tenant="t", role="r",
                     user="u", prompt="p", usage={"prompt_tokens": 1, "completion_tokens": 1},
                     choices=[{"index": 0, "text": "an answer", "finish_reason": "stop"}],
                     created=expires - 60, expires=expires, stale_until=expires)

    vec = np.ones(384, dtype=np.float32) / np.sqrt(384)
    key = store.p + "s:p"

    async def put(e: Entry) -> set[str]:
        await store.persist(e, False, 60, ("p", vec, "q"), e, 60, [], 10, 60)
        return {k.decode() for k in await store.client.hkeys(key)}

    try:
        assert await put(entry("old", 1_000_000.0)) == {"old"}
        # (a hash of two: both are looked at) the one past its time goes, not the new one
        assert await put(entry("new", 4e9)) == {"new"}
        assert await put(entry("next", 4e9)) == {"new", "next"}  # a live one stays
    finally:
        await store.close()


async def test_a_write_deletes_its_partitions_expired_entries_by_their_times(
        redis_server: RedisServer) -> None:
    """A write looked at two of the partition's entries at random, decoding both (two
    JSON decodes of whole answers a write, in Redis's one thread), and a partition with
    many expired entries kept most of them for many writes. Each entry's time is kept in
    a sorted set beside the hash: a write deletes up to 16 past their time, reading no
    entry; one in its stale grace, or live, stays. Entries an earlier version stored
    (not in the set) are read once each, and leave or join the set."""
    from prometheus_client import CollectorRegistry, Counter

    errors = Counter("e", "e", ["op"], registry=CollectorRegistry())
    store = RedisStore(RedisConfig(url=redis_server.url, key_prefix=f"weir:t:{uuid.uuid4().hex}:",
                                   timeout_s=1.0), errors, "r")

    def entry(key: str, expires: float, stale_until: float | None = None) -> Entry:
        return Entry(key=key, route="chat", model="m", scope="s", tenant="t", role="r",
                     user="u", usage={"prompt_tokens": 1, "completion_tokens": 1},
                     choices=[{"index": 0, "text": "an answer", "finish_reason": "stop"}],
                     created=expires - 60, expires=expires,
                     stale_until=expires if stale_until is None else stale_until)

    vec = np.ones(384, dtype=np.float32) / np.sqrt(384)
    key, times = store.p + "s:p", store.p + "se:p"

    async def put(e: Entry) -> set[str]:
        await store.persist(e, False, 60, ("p", vec, "q"), e, 60, [], 10, 60)
        return {k.decode() for k in await store.client.hkeys(key)}

    try:
        for i in range(20):
            await put(entry(f"e{i}", 4e9))
        await put(entry("grace", 1_000_000.0, 4e9))  # expired, in its stale grace
        # (time passes: the 20 are past their time; what each holds is not read)
        await store.client.zadd(times, {f"e{i}": 1_000_000.0 + i for i in range(20)})
        for i in range(20):
            await store.client.hset(key, f"e{i}", "not read")
        assert await put(entry("a", 4e9)) == {f"e{i}" for i in range(16, 20)} | {
            "grace", "a"}
        assert await put(entry("b", 4e9)) == {"grace", "a", "b"}
        # An earlier version's entries: no times in the set; read once, as written before.
        old, live = entry("old", 1_000_000.0), entry("live", 4e9)
        for e in (old, live):
            await store.client.hset(key, e.key, store._pack(vec, e.to_json(), "q"))
        for _ in range(200):  # (two at random a write: until both were read)
            if await store.client.hlen(key) == await store.client.zcard(times):
                break
            await put(entry("c", 4e9))
        assert await put(entry("d", 4e9)) == {"grace", "a", "b", "c", "d", "live"}
        assert await store.client.zscore(times, "live") == 4e9
        assert await store.client.hlen(key) == await store.client.zcard(times)
    finally:
        await store.close()


@pytest.mark.parametrize("bound", [None, 10**6])
async def test_a_purged_semantic_entry_leaves_its_partitions_times(
        redis_server: RedisServer, bound: int | None) -> None:
    """A semantic entry deleted (a purge, a cap, a replica's drop) leaves the sorted set
    of its partition's times with it: one left there made the set look as if it held
    every entry, and the entries an earlier version stored were not looked at."""
    from prometheus_client import CollectorRegistry, Counter

    errors = Counter("e", "e", ["op"], registry=CollectorRegistry())
    store = RedisStore(RedisConfig(url=redis_server.url, key_prefix=f"weir:t:{uuid.uuid4().hex}:",
                                   timeout_s=1.0, max_bytes_per_tenant=bound), errors, "r")
    vec = np.ones(384, dtype=np.float32) / np.sqrt(384)
    try:
        for key in ("a", "b", "c"):
            e = Entry(key=key, route="chat", model="m", scope="s", tenant="t", role="r",
                      user="u", usage={"prompt_tokens": 1, "completion_tokens": 1},
                      choices=[{"index": 0, "text": f"answer {key}", "finish_reason": "stop"}],
                      expires=1e12, stale_until=1e12)
            await store.persist(e, False, 60, ("p", vec, "q"), e, 60, [f"s:p:{key}"], 10, 60)
        assert await store.purge(lambda e: e.key == "a") == (0, 1)
        await store.delete_semantic([("p", "b")])
        assert await store.client.zrange(store.p + "se:p", 0, -1) == [b"c"]
    finally:
        await store.close()


async def test_a_purge_and_a_write_of_the_same_entry_leave_it_with_its_time(
        redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A purge deleted a semantic entry's time and the entry in two commands: a write of
    the same entry between them left its time (P se:) without it, which hid entries with
    no time from the writes that look for them. One transaction now: the entry and its
    time go together, or stay together (with `max_bytes_per_tenant`, a script did so)."""
    from prometheus_client import CollectorRegistry, Counter

    errors = Counter("e", "e", ["op"], registry=CollectorRegistry())
    store = RedisStore(RedisConfig(url=redis_server.url, key_prefix=f"weir:t:{uuid.uuid4().hex}:",
                                   timeout_s=1.0, max_bytes_per_tenant=None), errors, "r")
    vec = np.ones(384, dtype=np.float32) / np.sqrt(384)
    e = Entry(key="a", route="chat", model="m", scope="s", tenant="t", role="r", user="u",
              usage={"prompt_tokens": 1, "completion_tokens": 1},
              choices=[{"index": 0, "text": "answer", "finish_reason": "stop"}],
              expires=1e12, stale_until=1e12)

    async def write() -> None:
        await store.persist(e, False, 60, ("p", vec, "q"), e, 60, [], 10, 60)

    zrem, hdel = store.client.zrem, store.client.hdel

    async def zrem_then_write(*args: Any) -> Any:  # (the write lands between)
        done = await zrem(*args)
        await write()
        return done

    async def hdel_then_write(*args: Any) -> Any:
        done = await hdel(*args)
        await write()
        return done
    try:
        for between in (zrem_then_write, hdel_then_write):
            await write()
            with monkeypatch.context() as m:
                m.setattr(store.client, "zrem", between if between is zrem_then_write
                          else zrem)
                m.setattr(store.client, "hdel", between if between is hdel_then_write
                          else hdel)
                assert await store.purge(lambda got: got.key == "a") == (0, 1)
            held = await store.client.hexists(store.p + "s:p", "a")
            timed = await store.client.zscore(store.p + "se:p", "a") is not None
            assert held == timed
    finally:
        await store.close()
