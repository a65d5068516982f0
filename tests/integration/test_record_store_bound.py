"""Each tenant's stored records take at most `responses.max_bytes_per_tenant` of the
shared Redis: past it a put drops that tenant's oldest records (never another tenant's),
the accounting follows deletes, replaces, expiries and lost keys, a dropped record
leaves the listing as a deleted one does, and one record larger than all of it is a 413.
Against a real Redis."""

from __future__ import annotations

import asyncio
import io
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from bench.redis_server import RedisServer
from proxy.errors import RecordTooLarge
from proxy.record_store import RedisStore
from proxy.settings import ConfigError, parse_settings
from tests.conftest import MakeClient, make_settings
from tests.fakes import FakeEngine
from tests.openai_spec import validate

#: A record of about 500 bytes (its JSON: `_size` says exactly).
PAD = "x" * 480


def record(i: int) -> dict[str, Any]:
    return {"n": i, "pad": PAD}


def summary(rid: str, at: int) -> dict[str, Any]:
    return {"id": rid, "at": at, "model": "m", "metadata": {}}


def _size(rec: dict[str, Any], summ: dict[str, Any] | None = None) -> int:
    dump = lambda v: json.dumps(v, separators=(",", ":"), ensure_ascii=False)  # noqa: E731
    return len(dump(rec).encode()) + (len(dump(summ).encode()) if summ is not None else 0)


@pytest.fixture
async def raw(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    r = aioredis.Redis.from_url(redis_server.url)
    yield r
    await r.aclose()


def make(redis_server: RedisServer, max_bytes: int, kind: str = "responses",
         prefix: str | None = None) -> RedisStore:
    return RedisStore(redis_server.url, 3600, prefix or f"bound-{uuid.uuid4().hex}:",
                      kind=kind, max_bytes=max_bytes)


async def used(r: aioredis.Redis, store: RedisStore, tenant: str) -> int:
    """The tenant's total as the store counts it."""
    return int(await r.hget(store._quota(tenant)[0], "") or 0)


async def held(r: aioredis.Redis, store: RedisStore, tenant: str) -> int:
    """What the records of the tenant's account take, read from the records themselves
    (each counted by its place, `SCOPE:ID`)."""
    quota, _ = store._quota(tenant)
    total = 0
    for field in await r.hkeys(quota):
        place = field.decode()
        if place:
            scope, _, rid = place.partition(":")
            total += (await r.strlen(store._prefix + place)
                      + await r.hstrlen(f"{store._prefix}listing:{scope}", rid))
    return total


async def kept(store: RedisStore, tenant: str, ids: list[str]) -> list[str]:
    return [i for i, rec in zip(ids, await store.get_many(tenant, ids), strict=True)
            if rec is not None]


async def full_of_three(redis_server: RedisServer) -> tuple[RedisStore, int]:
    """A store whose bound holds three records of `size`, and tenant `t`'s three in it
    (r0, r1, r2)."""
    size = _size(record(10))
    store = make(redis_server, max_bytes=3 * size)
    for i in range(3):
        await store.put("t", f"r{i}", record(10 + i))
    return store, size


async def test_a_tenant_past_its_bound_loses_its_oldest_and_no_one_elses(
        redis_server: RedisServer, raw: aioredis.Redis) -> None:
    size = _size(record(10))
    store = make(redis_server, max_bytes=5 * size)
    try:
        others = [f"b{i}" for i in range(3)]
        for i, rid in enumerate(others):
            await store.put("b", rid, record(10 + i))
        mine = [f"a{i}" for i in range(20)]
        for i, rid in enumerate(mine):
            await store.put("a", rid, record(10 + i))
            assert await used(raw, store, "a") <= 5 * size
        assert await kept(store, "a", mine) == mine[-5:]  # the newest five, in order
        assert await kept(store, "b", others) == others  # the small tenant untouched
        assert await used(raw, store, "a") == await held(raw, store, "a") == 5 * size
        assert await used(raw, store, "b") == 3 * size
        # The oldest is the first put, not the first id: b2, b0, b1, then more of b's.
        await store.put("b", "b0", record(10))  # put again: now the newest
        for i in range(3):
            await store.put("b", f"c{i}", record(20 + i))
        assert await kept(store, "b", ["b0", "b1", "b2", "c0", "c1", "c2"]) == [
            "b0", "b2", "c0", "c1", "c2"]
    finally:
        await store.close()


async def test_callers_behind_a_gateway_key_share_its_tenants_bound(
        redis_server: RedisServer, raw: aioredis.Redis) -> None:
    """Each caller a gateway's key forwards for (`on_behalf_of`) is a tenant of its own
    (`TENANT~GATEWAY~DIGEST`), but what they store counts against the key's tenant: a
    gateway naming a new caller for each request cannot open a bound for each. The
    oldest go first whoever stored them; no other tenant's. Each caller's records stay
    its own (found, listed and dropped under its own listing)."""
    size = _size(record(10), summary("c0", 1))
    store = make(redis_server, max_bytes=4 * size, kind="chat")
    try:
        await store.put("other", "o0", record(10), summary("o0", 1))
        callers = [f"acme~edge~{i:032x}" for i in range(10)]
        for i, caller in enumerate(callers):
            await store.put(caller, f"c{i}", record(10 + i % 10), summary(f"c{i}", i))
            assert await used(raw, store, "acme") <= 4 * size
        assert [bool(await store.get(c, f"c{i}")) for i, c in enumerate(callers)] == [
            False] * 6 + [True] * 4
        assert await used(raw, store, "acme") == await held(raw, store, "acme") == 4 * size
        assert store._quota(callers[0]) == store._quota("acme")
        listed, _ = await store.scan(callers[0], None, False, 10)
        assert listed == []  # the dropped left its caller's listing
        assert [s["id"] for s in (await store.scan(callers[9], None, False, 10))[0]] == ["c9"]
        await store.put("acme", "ow", record(10), summary("ow", 9))  # the key's own
        assert await store.get(callers[6], "c6") is None  # the oldest went for it
        assert await store.get("other", "o0") == record(10)
        assert await store.delete(callers[9], "c9")  # a delete gives the room back
        assert await used(raw, store, "acme") == await held(raw, store, "acme") == 3 * size
    finally:
        await store.close()


async def test_concurrent_puts_from_several_replicas_keep_the_bound(
        redis_server: RedisServer, raw: aioredis.Redis) -> None:
    size = _size(record(10))
    prefix = f"bound-{uuid.uuid4().hex}:"
    replicas = [make(redis_server, 8 * size, prefix=prefix) for _ in range(3)]
    try:
        await asyncio.gather(*(
            replicas[i % 3].put("a", f"r{i}", record(10 + i % 10)) for i in range(90)))
        store = replicas[0]
        assert await used(raw, store, "a") == await held(raw, store, "a") == 8 * size
        assert len(await kept(store, "a", [f"r{i}" for i in range(90)])) == 8
    finally:
        for s in replicas:
            await s.close()


async def test_deletes_and_replaces_keep_the_count(
        redis_server: RedisServer, raw: aioredis.Redis) -> None:
    store = make(redis_server, max_bytes=10_000, kind="chat")
    try:
        for i in range(4):
            await store.put("t", f"c{i}", record(10 + i), summary(f"c{i}", i * 1000))
        assert await used(raw, store, "t") == await held(raw, store, "t") == sum(
            _size(record(10 + i), summary(f"c{i}", i * 1000)) for i in range(4))
        assert await store.delete("t", "c1")
        assert not await store.delete("t", "c1")  # (not counted off twice)
        bigger = {**record(12), "metadata": {"k": "v" * 200}}
        assert await store.replace("t", "c2", bigger, summary("c2", 2000))
        assert not await store.replace("t", "c1", bigger, summary("c1", 1000))  # deleted
        assert await used(raw, store, "t") == await held(raw, store, "t") == (
            _size(record(10), summary("c0", 0)) + _size(bigger, summary("c2", 2000))
            + _size(record(13), summary("c3", 3000)))
        for rid in ("c0", "c2", "c3"):
            assert await store.delete("t", rid)
        assert await used(raw, store, "t") == 0
        assert await raw.zcard(store._quota("t")[1]) == 0
    finally:
        await store.close()


async def test_a_replace_that_grows_a_record_drops_the_oldest_others(
        redis_server: RedisServer, raw: aioredis.Redis) -> None:
    size = _size(record(10), summary("c0", 0))
    store = make(redis_server, max_bytes=3 * size + 50, kind="chat")
    try:
        for i in range(3):
            await store.put("t", f"c{i}", record(10 + i), summary(f"c{i}", i))
        grown = {**record(12), "metadata": {"k": "v" * 100}}
        assert await store.replace("t", "c2", grown, summary("c2", 2))
        assert await kept(store, "t", ["c0", "c1", "c2"]) == ["c1", "c2"]
        assert await used(raw, store, "t") == await held(raw, store, "t")
    finally:
        await store.close()


async def test_expired_records_leave_the_count(
        redis_server: RedisServer, raw: aioredis.Redis) -> None:
    """A record gone by its TTL is counted off at the next put (its expiry passed)."""
    store, size = await full_of_three(redis_server)
    try:
        _, aging = store._quota("t")
        await raw.delete(store._key("t", "r0"))  # as if expired: its key gone...
        await raw.zadd(aging, {store._place("t", "r0"): 1})  # ...its expiry past
        await store.put("t", "r3", record(13))
        # Room for r3 where r0 was: nothing live dropped.
        assert await kept(store, "t", ["r1", "r2", "r3"]) == ["r1", "r2", "r3"]
        assert await used(raw, store, "t") == await held(raw, store, "t") == 3 * size
    finally:
        await store.close()


async def test_the_count_is_rebuilt_when_its_keys_are_lost(
        redis_server: RedisServer, raw: aioredis.Redis) -> None:
    """A Redis at `maxmemory` may evict one of the two accounting keys: the next write
    finds them disagreeing and rebuilds them from the records held."""
    store = make(redis_server, max_bytes=100_000, kind="chat")
    try:
        for i in range(3):
            await store.put("t", f"c{i}", record(10 + i), summary(f"c{i}", i))
        quota, aging = store._quota("t")
        for lost in (aging, quota):
            await raw.delete(lost)
            await raw.delete(store._key("t", "c0"))  # and a record with it
            await store.put("t", "c0", record(10), summary("c0", 0))
            assert await used(raw, store, "t") == await held(raw, store, "t") == 3 * _size(
                record(10), summary("c0", 0))
            assert await raw.zcard(aging) == 3
    finally:
        await store.close()


async def test_the_accounting_keys_always_expire(
        redis_server: RedisServer, raw: aioredis.Redis) -> None:
    """An update of a record stored before the bound (no accounting keys yet), or one
    that rebuilds them, leaves them expiring with the records (they were made with no
    expiry, kept for good by a tenant that never stored again)."""
    store = make(redis_server, max_bytes=100_000, kind="chat")
    try:
        for i in range(2):
            await store.put("t", f"c{i}", record(10 + i), summary(f"c{i}", i))
        quota, aging = store._quota("t")
        await raw.delete(quota, aging)  # as before the bound
        assert await store.replace("t", "c0", record(20), summary("c0", 0))
        assert await raw.pttl(quota) > 0 and await raw.pttl(aging) > 0
        await raw.delete(aging)  # lost: the next write rebuilds both
        assert await store.replace("t", "c1", record(21), summary("c1", 1))
        assert await raw.zcard(aging) == 2
        assert await raw.pttl(quota) > 0 and await raw.pttl(aging) > 0
    finally:
        await store.close()


async def test_a_dropped_record_leaves_the_listing_as_a_deleted_one(
        redis_server: RedisServer, raw: aioredis.Redis) -> None:
    size = _size(record(10), summary("c0", 1000))  # (each the same size)
    store = make(redis_server, max_bytes=4 * size, kind="chat")
    try:
        for i in range(4):
            await store.put("t", f"c{i}", record(10 + i), summary(f"c{i}", (i + 1) * 1000))
        window, cursor = await store.scan("t", None, False, 2)
        assert [s["id"] for s in window] == ["c0", "c1"] and cursor is not None
        for i in range(4, 6):  # c0 and c1 dropped
            await store.put("t", f"c{i}", record(10 + i), summary(f"c{i}", (i + 1) * 1000))
        listed, _ = await store.scan("t", None, False, 10)
        assert [s["id"] for s in listed] == ["c2", "c3", "c4", "c5"]
        rest, _ = await store.scan("t", cursor, False, 10)  # the page's cursor goes on
        assert [s["id"] for s in rest] == ["c2", "c3", "c4", "c5"]
    finally:
        await store.close()


async def test_a_record_larger_than_the_whole_bound_is_refused(
        redis_server: RedisServer, raw: aioredis.Redis) -> None:
    store, size = await full_of_three(redis_server)
    try:
        huge = {"pad": "y" * (3 * size)}
        with pytest.raises(RecordTooLarge) as e:
            await store.put("t", "big", huge)
        assert e.value.status == 413 and e.value.code == "stored_record_too_large"
        assert e.value.param == "store" and "max_bytes_per_tenant" in e.value.message
        with pytest.raises(RecordTooLarge):
            await store.replace("t", "r1", huge)
        # Nothing stored, nothing dropped.
        assert await kept(store, "t", ["r0", "r1", "r2", "big"]) == ["r0", "r1", "r2"]
        assert await store.get("t", "r1") == record(11)
        assert await used(raw, store, "t") == 3 * size
    finally:
        await store.close()


async def test_in_memory_callers_behind_a_gateway_key_count_as_its_tenant() -> None:
    """The memory store bounds them the same, and when full it takes from the tenant
    holding the most with all its callers: ten callers of one record each are not ten
    small tenants that push a larger one out."""
    from proxy.record_store import MemoryStore

    size = _size(record(10))
    store = MemoryStore(3600, 1000, max_bytes=4 * size)
    callers = [f"acme~edge~{i:032x}" for i in range(10)]
    for i, caller in enumerate(callers):
        await store.put(caller, f"c{i}", record(10 + i % 10))
    assert [await store.get(c, f"c{i}") is not None for i, c in enumerate(callers)] == [
        False] * 6 + [True] * 4
    store = MemoryStore(3600, max_items=6)
    for i in range(3):
        await store.put("big", f"b{i}", record(i))
    for i in range(4):  # 4 callers of one record each: together the largest
        await store.put(callers[i], f"c{i}", record(i))
    assert [await store.get("big", f"b{i}") is not None for i in range(3)] == [True] * 3
    assert await store.get(callers[0], "c0") is None  # their oldest went
    assert len(store) == 6


def _post(client: Any, body: dict[str, Any]) -> Any:
    return client.post("/v1/responses", data=io.BytesIO(json.dumps(body).encode()),
                       headers={"content-type": "application/json"})


def _redis_settings(url: str, prefix: str, max_bytes: int) -> Any:
    return make_settings(plugins=[{"name": "cache", "config": {
        "redis": {"url": url, "key_prefix": prefix}, "l2": {"enabled": True}}}],
        responses={"max_bytes_per_tenant": max_bytes})


async def test_a_response_whose_input_alone_passes_the_bound_is_a_413(
        make_client: MakeClient, redis_server: RedisServer) -> None:
    """Reasoning items are stored but never reach the prompt: the context length does
    not bound them. Refused before anything is generated; `store: false` goes through."""
    client = await make_client(_redis_settings(redis_server.url, f"big-{uuid.uuid4().hex}:",
                                               1024 * 1024))
    reasoning = {"type": "reasoning", "id": "rs_1", "status": "completed",
                 "summary": [{"type": "summary_text", "text": "z" * (1024 * 1024)}]}
    body = {"model": "fake-model", "max_output_tokens": 16,
            "input": [{"role": "user", "content": "hi"}, reasoning]}
    r = await _post(client, body)
    assert r.status == 413
    error = await r.json()
    validate("ErrorResponse", error)
    assert error["error"]["code"] == "stored_record_too_large"
    assert error["error"]["param"] == "store"
    assert "max_bytes_per_tenant" in error["error"]["message"]
    r = await _post(client, {**body, "store": False})
    assert r.status == 200, await r.text()


async def test_a_response_its_output_takes_past_the_bound_goes_out_unstored(
        make_client: MakeClient, redis_server: RedisServer) -> None:
    """The answer was generated: it goes out, with `store: false`, and is not found."""
    client = await make_client(_redis_settings(redis_server.url, f"big-{uuid.uuid4().hex}:",
                                               1024 * 1024),
                               engine=FakeEngine(max_model_len=2_000_000))
    # The input fits; the response echoes the instructions, which take it past.
    body = {"model": "fake-model", "max_output_tokens": 16, "input": "y" * (300 * 1024),
            "instructions": "z" * (600 * 1024)}
    r = await _post(client, body)
    assert r.status == 200, await r.text()
    out = await r.json()
    assert out["store"] is False
    assert (await client.get(f"/v1/responses/{out['id']}")).status == 404


@pytest.mark.parametrize("value", [0, 1000, -1, True, "lots", 1.5])
def test_the_bound_is_checked_as_config(value: Any) -> None:
    with pytest.raises(ConfigError) as e:
        parse_settings("auth: {mode: open}\nresponses:\n"
                       f"  max_bytes_per_tenant: {json.dumps(value)}\n", env={})
    assert [p for p, _ in e.value.errors] == ["responses.max_bytes_per_tenant"]


def test_the_bound_has_a_default_normal_use_does_not_reach() -> None:
    s = parse_settings("auth: {mode: open}\n", env={})
    assert s.responses.max_bytes_per_tenant == 256 * 1024 * 1024
    s = parse_settings("auth: {mode: open}\nresponses:\n  max_bytes_per_tenant: 1073741824\n",
                       env={})
    assert s.responses.max_bytes_per_tenant == 1024 ** 3


async def test_in_memory_a_tenant_past_its_bound_loses_its_oldest_and_no_one_elses() -> None:
    """Without Redis the records live in the process: the same bound keeps a few large
    conversations from filling its memory (10,000 of ~390 KB fit under
    `max_in_memory`)."""
    from proxy.record_store import MemoryStore

    size = _size(record(10), summary("a15", 115))  # (as the newest five each take)
    store = MemoryStore(3600, 10_000, max_bytes=5 * size)
    others = [f"b{i}" for i in range(3)]
    for i, rid in enumerate(others):
        await store.put("b", rid, record(10 + i), summary(rid, i))
    mine = [f"a{i}" for i in range(20)]
    for i, rid in enumerate(mine):
        await store.put("a", rid, record(10 + i), summary(rid, 100 + i))
    assert await kept(store, "a", mine) == mine[-5:]  # type: ignore[arg-type]
    assert await kept(store, "b", others) == others  # type: ignore[arg-type]
    listed, _ = await store.scan("a", None, False, 100)
    assert [s["id"] for s in listed] == mine[-5:]  # the dropped left the listing
    # a replace that grows a record drops older ones; a delete gives its room back
    await store.replace("a", mine[-1], {"n": 1, "pad": PAD * 3}, summary(mine[-1], 119))
    assert await kept(store, "a", mine) == mine[-3:]  # type: ignore[arg-type]
    assert await store.delete("a", mine[-2])
    for i in range(2):
        await store.put("a", f"n{i}", record(i), summary(f"n{i}", 200 + i))
    assert await kept(store, "a", [mine[-1], "n0", "n1"]) == [  # type: ignore[arg-type]
        mine[-1], "n0", "n1"]
    # an update of the oldest keeps it: older others go (it was dropped, and said 200)
    oldest = next(iter(store._items["a"]))
    assert await store.replace("a", oldest, {"pad": "x" * (4 * size)}, summary(oldest, 1))
    assert await store.get("a", oldest) is not None
    with pytest.raises(RecordTooLarge):
        await store.put("a", "huge", {"pad": "x" * (6 * size)})
    assert await store.get("a", oldest) is not None  # nothing was dropped for the refused


async def test_a_record_holding_a_lone_surrogate_is_stored_and_read_back(
        redis_server: RedisServer) -> None:
    """An upstream's answer may hold a lone surrogate (valid escaped JSON): no UTF-8 can
    hold it, and the Redis store's put raised UnicodeEncodeError (a 500 for a stored chat
    completion). It is kept as its `\\u` escape and reads back the same."""
    from proxy.record_store import MemoryStore

    rec = {"choices": [{"message": {"content": "a\ud800b"}}]}
    for store in (make(redis_server, max_bytes=1024 * 1024, kind="chat"),
                  MemoryStore(3600, 10, "chat", 1024 * 1024)):
        try:
            await store.put("t", "c1", rec, summary("c1", 1))
            assert await store.get("t", "c1") == rec
        finally:
            await store.close()


async def test_a_conversation_holding_a_lone_surrogate_is_measured_not_a_500(
        make_client: MakeClient) -> None:
    """A stored answer may hold a lone surrogate (an upstream's escaped JSON): going on
    from it, the bound's check measured the conversation with a strict UTF-8 encode,
    which raised (a 500). It is measured as the store writes it."""
    engine = FakeEngine()
    engine.script = "a\ud800b"
    client = await make_client(make_settings(responses={"max_bytes_per_tenant": 1024 * 1024}),
                               engine=engine)
    r = await _post(client, {"model": "fake-model", "max_output_tokens": 16, "input": "hi"})
    assert r.status == 200, await r.text()
    first = await r.json()
    r = await _post(client, {"model": "fake-model", "max_output_tokens": 16, "input": "and?",
                             "previous_response_id": first["id"]})
    assert r.status == 200, await r.text()
    assert (await client.get(f"/v1/responses/{(await r.json())['id']}")).status == 200


async def test_in_memory_all_tenants_together_hold_at_most_the_process_bound() -> None:
    """Each tenant's records were bounded in memory, but not all of them together: ten
    tenants each at its bound held ten times it in the process. Past
    `responses.max_bytes_in_memory` the tenant holding the most loses its oldest."""
    from proxy.record_store import MemoryStore

    size = _size(record(10))
    store = MemoryStore(3600, 10_000, max_bytes=4 * size, max_total_bytes=10 * size)
    await store.put("small", "s0", record(10))
    for t in range(6):  # six tenants, each within its own bound
        for i in range(4):
            await store.put(f"t{t}", f"r{i}", record(10 + i))
    held = [(t, i) for t in range(6) for i in range(4)
            if await store.get(f"t{t}", f"r{i}") is not None]
    assert len(held) == 9 and store._bytes.total <= 10 * size
    assert await store.get("small", "s0") is not None  # the one holding least kept it
    assert (5, 3) in held  # the newest stays
    cfg = parse_settings("auth: {mode: open}\nresponses:\n  max_bytes_in_memory: 2097152\n",
                         env={}).responses
    assert cfg.max_bytes_in_memory == 2**21
    with pytest.raises(ConfigError):
        parse_settings("auth: {mode: open}\nresponses:\n  max_bytes_in_memory: 1\n", env={})


class _Reads(dict[str, int]):
    """The accounts' byte counts, counting those read (an iteration: all of them)."""

    reads = 0

    def __getitem__(self, key: str) -> int:
        _Reads.reads += 1
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        _Reads.reads += 1
        return super().get(key, default)

    def __iter__(self):  # type: ignore[no-untyped-def]
        _Reads.reads += len(self)
        return super().__iter__()

    def values(self):  # type: ignore[no-untyped-def]
        _Reads.reads += len(self)
        return super().values()

    def items(self):  # type: ignore[no-untyped-def]
        _Reads.reads += len(self)
        return super().items()


async def test_in_memory_a_put_does_not_read_every_tenants_bytes() -> None:
    """The bound on all tenants' records together summed every account's bytes at each
    put, and found the one holding the most by reading them all again (O(tenants) a
    put, as L1's puts were): a running total and a heap; still the one holding the
    most gives way."""
    from proxy.record_store import MemoryStore

    tenants, size = 2000, _size(record(10))
    store = MemoryStore(3600, 100_000, max_bytes=8 * size,
                        max_total_bytes=(tenants + 2) * size)
    store._bytes._held = _Reads()
    for t in range(tenants):
        await store.put(f"t{t}", "r", record(10))
    for i in range(4):  # t0 holds the most
        await store.put("t0", f"more{i}", record(10))
    _Reads.reads = 0
    for i in range(tenants):  # t1 floods: past the bound, the one holding the most gives way
        await store.put("t1", f"flood{i}", record(10))
    assert _Reads.reads < 20 * tenants, _Reads.reads
    assert store._bytes.total == sum(dict.values(store._bytes._held)) <= (tenants + 2) * size
    kept = [await store.get(f"t{t}", "r") for t in range(2, tenants)]
    assert None not in kept  # only the ones holding the most gave way


async def test_in_memory_a_put_past_max_items_does_not_walk_every_tenant() -> None:
    """Past `max_items` the account holding the most records loses its oldest: it was
    found by a max over every account's records at each put (O(tenants)); a tally keeps
    the counts, and still the one holding the most gives way."""
    from proxy.record_store import MemoryStore

    tenants = 2000
    store = MemoryStore(3600, tenants + 2)
    for t in range(tenants):
        await store.put(f"t{t}", "r", record(1))
    for i in range(2):  # t0 holds the most
        await store.put("t0", f"more{i}", record(1))
    store._aged = _Reads(store._aged)  # type: ignore[assignment]
    _Reads.reads = 0
    for i in range(tenants):  # t1 floods: past the bound, the one holding the most gives way
        await store.put("t1", f"flood{i}", record(1))
    assert _Reads.reads < 20 * tenants, _Reads.reads
    assert len(store) <= tenants + 2
    kept = [await store.get(f"t{t}", "r") for t in range(2, tenants)]
    assert None not in kept  # only the ones holding the most gave way
