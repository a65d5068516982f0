"""Stored responses and chat completions against a Redis that misbehaves: one that
accepts connections and never answers (frozen: `CLIENT PAUSE`, a swapping host) is a
prompt 503 `store_unavailable` on every call, never a request held for the pool's socket
timeout."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from plugins.cache.config import RedisConfig
from proxy import record_store
from proxy.errors import Unavailable
from proxy.record_store import RedisStore, make_store
from proxy.settings import ResponsesSettings


@pytest.fixture
async def frozen() -> AsyncIterator[str]:
    """A Redis URL whose server takes every command and answers none."""
    held: list[asyncio.StreamWriter] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        while await reader.read(65536):
            pass

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield f"redis://127.0.0.1:{port}/0"
    for w in held:
        w.close()
    server.close()
    await server.wait_closed()


def _no_socket_timeout(url: str, timeout_s: float, **_: Any) -> aioredis.Redis:
    """A client that would wait for a frozen Redis for ever: only the store's own bound
    can answer."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=8, timeout=None, socket_timeout=3600, socket_connect_timeout=3600)
    return aioredis.Redis.from_pool(pool)


@pytest.mark.parametrize("kind", ["responses", "chat"])
async def test_every_call_to_a_frozen_redis_is_a_prompt_503(
        frozen: str, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(record_store, "blocking_client", _no_socket_timeout)
    store = RedisStore(frozen, 3600, "weir:test:", timeout_s=0.05, kind=kind)
    rec = {"response": {"id": "r1"}}
    summary = {"id": "r1", "at": 1, "model": "m", "metadata": {}}
    calls = [store.get("acme", "r1"), store.get_many("acme", ["r1", "r2"]),
             store.put("acme", "r1", rec, summary), store.replace("acme", "r1", rec, summary),
             store.delete("acme", "r1"), store.forget("acme", "r1"),
             store.scan("acme", None, True, 20)]
    try:
        for call in calls:
            task = asyncio.ensure_future(call)
            # (generous: the store's bound is 50 ms; without one this waits for ever)
            done, _ = await asyncio.wait((task,), timeout=30)
            assert task in done, "a call to a frozen Redis was still waiting"
            with pytest.raises(Unavailable) as e:
                task.result()
            assert e.value.code == "store_unavailable" and e.value.status == 503
    finally:
        for call in calls:
            call.close()  # (the ones a failure left unstarted)
        await store.close()


def test_the_store_in_the_caches_redis_takes_its_configured_timeout() -> None:
    """Not the constructor's default: the cache's write timeout (a record read is the
    answer, not a lookup that may miss)."""
    cfg = RedisConfig(url="redis://127.0.0.1:1/0", timeout_s=0.05, write_timeout_s=0.3)
    store = make_store(ResponsesSettings(), cfg)
    assert isinstance(store, RedisStore) and store.timeout_s == 0.3


@pytest.mark.parametrize("tampered", [
    {"response": 5}, {"response": {}, "conversation": []},
    {"response": {"id": "x", "object": "response"}, "conversation": 7},
    {"response": {"id": "x", "object": "response"}, "conversation": [5, "a"]},
    {"response": {"id": "x", "object": "response"}, "conversation": [], "input": "x"},
    {"response": {"id": 1, "object": "response"}, "conversation": []}])
async def test_a_stored_response_of_another_shape_is_not_found(
        make_client: Any, tampered: dict[str, Any]) -> None:
    """What sits under a response's key that is not a stored response (another version's
    shape, a hand edit in Redis): not found, on every route that reads it, never served
    as the response nor a 500."""
    from proxy.openai_responses.routes import STORE
    from tests.conftest import make_settings

    client = await make_client(make_settings())
    r = await client.post("/v1/responses", json={"model": "fake-model", "input": "hi",
                                                 "max_output_tokens": 16})
    assert r.status == 200, await r.text()
    rid = (await r.json())["id"]
    assert await client.app[STORE].replace("public", rid, tampered)  # (the open tenant)
    for path in (f"/v1/responses/{rid}", f"/v1/responses/{rid}/input_items"):
        got = await client.get(path)
        assert got.status == 404, (path, await got.text())
    cont = await client.post("/v1/responses", json={
        "model": "fake-model", "input": "and?", "previous_response_id": rid})
    assert cont.status == 400, await cont.text()
    assert (await cont.json())["error"]["code"] == "previous_response_not_found"


_STRAYS = {"string": lambda r, k: r.set(k, "x"), "list": lambda r, k: r.rpush(k, "x"),
           "hash": lambda r, k: r.hset(k, "x", "y"), "set": lambda r, k: r.sadd(k, "x"),
           "zset": lambda r, k: r.zadd(k, {"x": 1})}
_KINDS = {"listing": "hash", "order": "zset", "expiry": "zset", "bound": "hash",
          "aged": "zset", "record": "string"}


@pytest.mark.parametrize("where", list(_KINDS))
async def test_a_stray_key_of_another_type_is_replaced_not_a_503(
        redis_server: Any, where: str) -> None:
    """A key of another type under a tenant's listing, order, expiry, bound or aged key
    (or its record's: a hand edit, another program) made every store, listing, update or
    delete of that tenant a 503 (WRONGTYPE) until someone removed it. The store's
    scripts replace it, as the cache's do; no other tenant's keys are touched."""
    r = aioredis.Redis.from_url(redis_server.url)
    store = RedisStore(redis_server.url, 3600, f"stray-{uuid.uuid4().hex}:", kind="chat")
    rec = {"completion": {"id": "c1"}}
    try:
        await store.put("other", "o1", rec, {"id": "o1", "at": 1, "metadata": {}})
        theirs = {k: await r.dump(k) for k in await r.keys(store._prefix + "*")}
        keys = {"listing": store._listing("acme")[0], "order": store._listing("acme")[1],
                "expiry": store._listing("acme")[2], "bound": store._quota("acme")[0],
                "aged": store._quota("acme")[1], "record": store._key("acme", "c1")}
        for kind, stray in _STRAYS.items():
            if kind == _KINDS[where]:
                continue
            await r.delete(*keys.values())
            await stray(r, keys[where])
            await store.scan("acme", None, True, 20)
            await store.get_many("acme", ["c1"])
            await store.put("acme", "c1", rec, {"id": "c1", "at": 2, "metadata": {}})
            assert await store.get("acme", "c1") == rec
            assert [s["id"] for s in (await store.scan("acme", None, True, 20))[0]] == ["c1"]
            await r.delete(keys[where])
            await stray(r, keys[where])
            # (a stray at the record's key is no record: not replaced, nor deleted)
            assert await store.replace("acme", "c1", rec, {
                "id": "c1", "at": 2, "metadata": {"a": "b"}}) == (where != "record")
            await r.delete(keys[where])
            await stray(r, keys[where])
            await store.forget("acme", "c1")
            assert await store.delete("acme", "c1") == (where != "record")
            await store.put("acme", "c2", rec, {"id": "c2", "at": 3, "metadata": {}})
            assert [s["id"] for s in (await store.scan("acme", None, True, 20))[0]] == ["c2"]
            await store.delete("acme", "c2")
        assert {k: await r.dump(k) for k in theirs} == theirs  # another tenant's: as they were
    finally:
        await store.close()
        await r.aclose()


@pytest.mark.parametrize("total", ["abc", "1.5", ""])
async def test_a_bound_whose_total_is_no_integer_is_rebuilt_not_a_503(
        redis_server: Any, total: str) -> None:
    r = aioredis.Redis.from_url(redis_server.url)
    store = RedisStore(redis_server.url, 3600, f"stray-{uuid.uuid4().hex}:", kind="chat")
    rec = {"completion": {"id": "c1"}}
    try:
        await store.put("acme", "c1", rec, {"id": "c1", "at": 1, "metadata": {}})
        await r.hset(store._quota("acme")[0], "", total)
        await store.put("acme", "c2", rec, {"id": "c2", "at": 2, "metadata": {}})
        assert await store.replace("acme", "c1", rec)
        assert int(await r.hget(store._quota("acme")[0], "")) > 0
    finally:
        await store.close()
        await r.aclose()


@pytest.mark.parametrize("where", ["memory", "redis"])
async def test_a_fresh_put_never_overwrites_a_held_record(redis_server: Any, where: str) -> None:
    """(A stream's `in_progress` record, its write landing after the final record's.)"""
    store = (RedisStore(redis_server.url, 3600, f"fresh-{uuid.uuid4().hex}:")
             if where == "redis" else record_store.MemoryStore(3600, 100))
    try:
        await store.put("acme", "r1", {"v": "final"})
        await store.put("acme", "r1", {"v": "in_progress"}, fresh=True)
        assert await store.get("acme", "r1") == {"v": "final"}
        await store.put("acme", "r2", {"v": "in_progress"}, fresh=True)
        assert await store.get("acme", "r2") == {"v": "in_progress"}
    finally:
        await store.close()


@pytest.mark.parametrize("where", ["memory", "redis"])
async def test_a_fenced_replace_stores_only_over_its_writers_record(
        redis_server: Any, where: str) -> None:
    """(A background run's writes, once its record was settled without it.)"""
    store = (RedisStore(redis_server.url, 3600, f"fence-{uuid.uuid4().hex}:")
             if where == "redis" else record_store.MemoryStore(3600, 100))
    mine, other = "f" * 32, "e" * 32
    try:
        await store.put("acme", "r1", record_store.fenced({"v": "queued"}, mine, at=1))
        assert not await store.replace("acme", "r1", {"v": "x"}, fence=other)
        assert await store.replace("acme", "r1", record_store.fenced({"v": 2}, mine), fence=mine)
        assert record_store.fence_of(await store.get("acme", "r1") or {}) == mine
        assert await store.replace("acme", "r1", {"v": "settled"}, fence=mine)
        assert not await store.replace("acme", "r1", {"v": "late"}, fence=mine)
        # a text that holds the fence (JSON escapes its quotes) is no fence
        await store.put("acme", "r2", {"said": '"fence":"' + mine + '"'})
        assert not await store.replace("acme", "r2", {"v": "late"}, fence=mine)
        assert await store.get("acme", "r1") == {"v": "settled"}
        assert not await store.replace("acme", "gone", {"v": 1}, fence=mine)
        # a run that could not store its end drops its own record, not a settled one
        assert not await store.delete("acme", "r1", fence=mine)
        assert await store.get("acme", "r1") == {"v": "settled"}
        await store.put("acme", "r3", record_store.fenced({"v": "queued"}, mine, at=1))
        assert not await store.delete("acme", "r3", fence=other)
        assert await store.delete("acme", "r3", fence=mine)
        assert await store.get("acme", "r3") is None
    finally:
        await store.close()


@pytest.mark.parametrize("where", ["memory", "redis"])
async def test_a_fence_held_in_a_callers_key_is_no_fence(redis_server: Any, where: str) -> None:
    """A caller's `metadata` keys (echoed in the record unescaped, as JSON keys) can hold
    `"fence":"..."` as a run's fence is stored: a record that held it there, its run's
    own `run` gone (settled without it), was overwritten by the run's late write. (The
    fence is no secret: ids come from a seeded generator, `proxy.ids`.)"""
    store = (RedisStore(redis_server.url, 3600, f"fence-{uuid.uuid4().hex}:")
             if where == "redis" else record_store.MemoryStore(3600, 100))
    mine = "f" * 32
    try:
        settled = {"response": {"metadata": {"fence": mine}}, "conversation": []}
        await store.put("acme", "r1", settled)
        assert not await store.replace("acme", "r1", {"v": "late"}, fence=mine)
        await store.put("acme", "r2", {"response": {"tools": [{"parameters": {
            "properties": {"run": {"fence": mine}}}}]}})
        assert not await store.replace("acme", "r2", {"v": "late"}, fence=mine)
        assert await store.get("acme", "r1") == settled
        # its own record, renewed and renewed again, is still its own
        await store.put("acme", "r3", record_store.fenced({"v": 1}, mine, lease_until=1.5))
        again = record_store.fenced(record_store.fenced({"v": 2}, mine), mine, lease_until=2)
        assert await store.replace("acme", "r3", again, fence=mine)
        assert await store.replace("acme", "r3", {"v": "end"}, fence=mine)
    finally:
        await store.close()
