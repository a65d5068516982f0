"""Purging one entry by its key: every answer the cache looked up or stored names its
entry's key (`x-weir-cache-key`, an opaque digest), which `POST /admin/cache/purge`
takes; a tenant's admin reaches only its own tenant's entries with it, even where the
scope is `global` and the tenants share keys."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from bench.redis_server import RedisServer
from proxy.app_state import STATE
from tests.conftest import MakeClient, make_settings
from tests.fakes import FakeEngine
from tests.integration.plugins.test_cache_redis import cache_of, h, settle

KEYS = [{"key": "k-alice", "tenant": "acme", "user": "alice"},
        {"key": "k-admin", "tenant": "acme", "role": "admin", "user": "root"},
        {"key": "k-eve", "tenant": "globex", "user": "eve"},
        {"key": "k-gadmin", "tenant": "globex", "role": "admin", "user": "groot"}]


async def gateway(make_client: MakeClient, url: str, scope: str) -> Any:
    cfg = {"scope": scope, "store_truncated": True, "l2": {"enabled": True},
           "redis": {"url": url, "key_prefix": f"weir:test:{uuid.uuid4().hex[:8]}:",
                     "timeout_s": 0.2, "store_prompts": True}}
    settings = make_settings(auth={"mode": "keys", "keys": KEYS}, embeddings={"enabled": True},
                             plugins=[{"name": "cache", "config": cfg}])
    c = await make_client(settings, engine=FakeEngine())
    await c.app[STATE].embedder.ready()
    return c


async def asked(client: Any, content: str, key: str, stream: bool = False,
                headers: dict[str, str] | None = None) -> tuple[str, str]:
    r = await client.post("/v1/chat/completions", headers={**h(key), **(headers or {})},
                          json={"model": "fake-model", "temperature": 0, "max_tokens": 6,
                                "stream": stream,
                                "messages": [{"role": "user", "content": content}]})
    assert r.status == 200
    await r.read()
    return r.headers["x-weir-cache"], r.headers["x-weir-cache-key"]


async def purge(client: Any, admin: str, **f: str) -> dict[str, Any]:
    r = await client.post("/admin/cache/purge", json=f, headers=h(admin))
    assert r.status == 200, await r.text()
    return (await r.json())["purged"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("stream", [False, True])
async def test_an_answer_names_its_entry_and_its_tenant_purges_it_by_that(
        make_client: MakeClient, redis_server: RedisServer, stream: bool) -> None:
    a = await gateway(make_client, redis_server.url, "global")
    q = "What are the opening hours of the Lisbon office?"
    layer, key = await asked(a, q, "k-alice", stream)
    assert layer == "miss" and len(key) == 64 and int(key, 16) >= 0  # a digest, no prompt
    await settle(a)
    layer, again = await asked(a, q, "k-alice", stream)
    assert (layer, again) == ("exact", key)
    # Another tenant shares the key (scope global) but never purges acme's entry with it.
    layer, theirs = await asked(a, q, "k-eve")
    assert (layer, theirs) == ("exact", key)
    assert await purge(a, "k-gadmin", key=key) == {
        "l1": 0, "semantic_index": 0, "redis": {"exact": 0, "semantic": 0}}
    assert (await asked(a, q, "k-eve"))[0] == "exact"
    got = await purge(a, "k-admin", key=key)
    assert got["l1"] == 1 and got["redis"]["exact"] == 1
    assert (await asked(a, q, "k-alice", headers={"Cache-Control": "no-store"}))[0] == "miss"


async def test_a_paraphrase_names_the_answer_it_was_given(
        make_client: MakeClient, redis_server: RedisServer) -> None:
    """A semantic hit (and its alias's exact hits after it) names the original entry: a
    purge by that key removes the original and the paraphrase's alias with it."""
    a = await gateway(make_client, redis_server.url, "tenant")
    _, key = await asked(a, "How do I reset my password?", "k-alice")
    await settle(a)
    layer, named = await asked(a, "How can I reset my password?", "k-alice")
    assert (layer, named) == ("semantic", key)
    layer, named = await asked(a, "How can I reset my password?", "k-alice")
    assert (layer, named) == ("exact", key)
    await purge(a, "k-admin", key=key)
    for q in ("How do I reset my password?", "How can I reset my password?"):
        assert (await asked(a, q, "k-alice", headers={"Cache-Control": "no-store"}))[0] == "miss"


async def test_a_request_the_cache_never_reads_or_stores_names_no_key(
        make_client: MakeClient, redis_server: RedisServer) -> None:
    a = await gateway(make_client, redis_server.url, "tenant")
    r = await a.post("/v1/chat/completions", headers=h("k-alice"), json={
        "model": "fake-model", "temperature": 0.9, "max_tokens": 6,
        "messages": [{"role": "user", "content": "Tell me a story"}]})
    assert r.headers["x-weir-cache"] == "bypass" and "x-weir-cache-key" not in r.headers


@pytest.mark.parametrize("scope", ["global", "tenant"])
async def test_a_paraphrase_of_another_callers_entry_names_its_own_key(
        make_client: MakeClient, redis_server: RedisServer, scope: str) -> None:
    """A semantic hit on an entry another caller stored (another tenant's, scope
    `global`; another user's, scope `tenant`) named that entry's key: a digest of the
    other caller's words (and a plain SHA-256 of what `exact_key` hashes, so it can be
    guessed at offline). It names the paraphrase's own key, which its alias is kept
    under: a purge by it removes the alias (and reaches nothing of the other's)."""
    a = await gateway(make_client, redis_server.url, scope)
    other = "k-eve" if scope == "global" else "k-admin"
    _, original = await asked(a, "How do I reset my password?", "k-alice")
    await settle(a)
    q = "How can I reset my password?"
    layer, named = await asked(a, q, other)
    assert layer == "semantic" and named != original
    layer, again = await asked(a, q, other)
    assert (layer, again) == ("exact", named)  # (its alias, kept under its own key)
    assert (await asked(a, q, other, headers={"Cache-Control": "no-cache"}))[1] == named


async def test_a_paraphrase_is_a_semantic_hit_however_long_its_embedding_waits(
        make_client: MakeClient, redis_server: RedisServer) -> None:
    """The tests' gateways wait for a lookup's embedding: the model's thread runs at a
    lowered priority, which a loaded machine starves past the 100 ms a lookup gives it
    by default, and the paraphrases above were then served as misses, at random. Here
    the embedding is made slower than that at will (a slow model, not a wait)."""
    a = await gateway(make_client, redis_server.url, "tenant")
    _, key = await asked(a, "How do I reset my password?", "k-alice")
    await settle(a)
    embedder = a.app[STATE].embedder
    embed = embedder.embed

    async def slow(texts: list[str], refuse_over: int | None = None) -> Any:
        await asyncio.sleep(0.2)  # (the model's thread, starved)
        return await embed(texts, refuse_over)

    embedder.embed = slow
    layer, named = await asked(a, "How can I reset my password?", "k-alice")
    assert (layer, named) == ("semantic", key)


async def test_a_purge_names_no_entry_redis_holds_for_another_tenant(
        make_client: MakeClient, redis_server: RedisServer) -> None:
    """With `scope: global`, the copy of an entry this replica's L1 holds may be acme's
    while Redis holds globex's, stored again under the key they share once acme's copy
    there was gone (an L1 kept longer than L2). acme's purge (by key, or by tenant)
    named the key to Redis, which deleted it whoever held it there: a tenant's admin
    purged another tenant's entry. Redis deletes a named entry only where the purge's
    owner fields accept the copy it holds."""
    import orjson

    a = await gateway(make_client, redis_server.url, "global")
    q = "What are the opening hours of the Lisbon office?"
    _, key = await asked(a, q, "k-alice")
    await settle(a)
    redis = cache_of(a).store.redis
    assert redis is not None
    name = redis.p + "x:" + key
    theirs = orjson.loads(await redis.client.get(name))
    theirs.update(tenant="globex", user="eve", role="user")
    await redis.client.set(name, orjson.dumps(theirs))  # (globex's copy, stored since)
    got = await purge(a, "k-admin", key=key)
    assert got["l1"] == 1 and got["redis"]["exact"] == 0  # (its semantic copy: acme's)
    assert await redis.client.exists(name) == 1
