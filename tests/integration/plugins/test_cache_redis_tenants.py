"""A tenant's share of the cache in Redis: `redis.max_bytes_per_tenant` bounds what one
tenant's entries take, its oldest going first (from Redis and every replica's memory),
so one tenant's flood cannot fill Redis and evict the other tenants' entries."""

from __future__ import annotations

import time
import uuid
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Counter

from bench.redis_server import RedisServer
from plugins.cache.config import RedisConfig
from plugins.cache.entry import Entry
from plugins.cache.redis_store import RedisStore
from tests.conftest import MakeClient
from tests.integration.plugins.test_cache_redis import ask, cache_of, replicas, settle
from tests.waiting import eventually


def store(url: str, bound: int | None, shared: bool = False) -> RedisStore:
    """`shared`: keys every tenant shares (scope `global`)."""
    errors = Counter("e", "e", ["op"], registry=CollectorRegistry())
    return RedisStore(RedisConfig(url=url, key_prefix=f"weir:t:{uuid.uuid4().hex}:",
                                  max_bytes_per_tenant=bound), errors, "r",
                      shared_keys=shared)


def entry(key: str, tenant: str, text: str) -> Entry:
    return Entry(key=key, route="chat", model="m", scope="s", tenant=tenant, role="r",
                 user="u", usage={"prompt_tokens": 1, "completion_tokens": 1},
                 choices=[{"index": 0, "text": text, "finish_reason": "stop"}],
                 expires=1e12, stale_until=1e12)


async def held_bytes(s: RedisStore, tenant: str) -> int:
    """What the tenant's entries take in Redis, as stored (UTF-8 bytes)."""
    total = 0
    async for name in s.client.scan_iter(match=s.p + "x:*"):
        raw = await s.client.get(name)
        if raw and Entry.from_json(raw).tenant == tenant:
            total += len(raw)
    async for name in s.client.scan_iter(match=s.p + "s:*"):
        for raw in (await s.client.hgetall(name)).values():
            if s._unpack(raw)[1].tenant == tenant:
                total += len(raw)
    return total


async def exact_keys(s: RedisStore) -> set[str]:
    return {n.decode()[len(s.p) + 2:] async for n in s.client.scan_iter(match=s.p + "x:*")}


@pytest.mark.parametrize("text", ["answer " * 100, "回答😀" * 100])  # 1 and 3.5 bytes/char
async def test_one_tenants_entries_stay_within_its_bound_in_redis(
        redis_server: RedisServer, text: str) -> None:
    s = store(redis_server.url, 8000)
    vec = np.ones(4, dtype=np.float32) / 2
    try:
        for i in range(2):
            assert await s.persist(entry(f"g{i}", "globex", text), True, 60, None,
                                   entry(f"g{i}", "globex", text), 60, [f"x:g{i}"], 1000,
                                   60) == []
        evicted: list[str] = []
        for i in range(30):  # acme floods (its gateway's callers count as acme)
            e = entry(f"a{i}", "acme" if i % 2 else "acme~gw~" + "0" * 32, text)
            got = await s.persist(e, True, 60, (f"part{i % 3}", vec, "q"), e, 60,
                                  [f"x:a{i}", f"s:part{i % 3}:a{i}"], 1000, 60)
            assert got is not None
            evicted += got
        acme = await held_bytes(s, "acme") + await held_bytes(s, "acme~gw~" + "0" * 32)
        assert 0 < acme <= 8000
        keys = await exact_keys(s)
        assert {"g0", "g1"} <= keys  # globex's untouched
        assert "a29" in keys and "a0" not in keys  # acme's newest kept, its oldest gone
        assert "x:a0" in evicted and "s:part0:a0" in evicted  # told to the replicas
        assert not any(m.endswith(("g0", "g1")) for m in evicted)
    finally:
        await s.close()


async def test_an_entry_larger_than_the_bound_is_not_stored(
        redis_server: RedisServer) -> None:
    s = store(redis_server.url, 2048)
    try:
        kept = entry("k", "acme", "short")
        await s.persist(kept, True, 60, None, kept, 60, ["x:k"], 1000, 60)
        big = entry("big", "acme", "😀" * 1000)  # 1000 characters, 4000 bytes
        assert await s.persist(big, True, 60, None, big, 60, ["x:big"], 1000, 60) == []
        assert await exact_keys(s) == {"k"}
    finally:
        await s.close()


async def test_without_a_bound_nothing_is_tallied(redis_server: RedisServer) -> None:
    s = store(redis_server.url, None)
    try:
        for i in range(5):
            e = entry(f"a{i}", "acme", "x" * 2000)
            assert await s.persist(e, True, 60, None, e, 60, [f"x:a{i}"], 1000, 60) == []
        assert len(await exact_keys(s)) == 5
        assert not [k async for k in s.client.scan_iter(match=s.p + "t*")]
    finally:
        await s.close()


async def test_a_tenants_evicted_entries_leave_every_replica(make_client: MakeClient,
                                                             redis_server: RedisServer
                                                             ) -> None:
    prefix = f"weir:test:{uuid.uuid4().hex[:8]}:"
    redis: dict[str, Any] = {"url": redis_server.url, "key_prefix": prefix,
                             "timeout_s": 0.2, "store_prompts": True,
                             "max_bytes_per_tenant": 4096}
    a, b = await replicas(make_client, redis_server.url, redis=redis,
                          semantic={"enabled": False})
    assert (await ask(a, "What is the capital of Norway?", key="k-eve"))[0] == "miss"
    for i in range(40):
        assert (await ask(a, f"Tell me fact number {i} about owls", key="k-alice"))[0] \
            == "miss"
    await settle(a, b)

    def acme_keys(c: Any) -> set[str]:
        return {e.key for e in cache_of(c).store.l1.entries() if e.tenant == "acme"}

    # b read acme's entries from Redis or heard of them: the first ones went everywhere
    await eventually(lambda: len(acme_keys(a)) < 40)
    s = cache_of(a).store.redis
    assert s is not None
    assert await held_bytes(s, "acme") <= 4096
    probe = {"Cache-Control": "no-store"}
    assert (await ask(b, "Tell me fact number 0 about owls", headers=probe))[0] == "miss"
    assert (await ask(b, "Tell me fact number 39 about owls"))[0] == "exact"
    assert (await ask(b, "What is the capital of Norway?", key="k-eve"))[0] == "exact"


async def test_a_purged_entry_no_longer_counts_against_its_tenants_bound(
        redis_server: RedisServer) -> None:
    """A purge deleted a tenant's entries from Redis and left their bytes in its count:
    after purging its newest answers, its next ones evicted its older live entries to
    make room for entries that were gone, until the purged ones aged out of the count."""
    size = len(entry("a00", "acme", "answer " * 100).to_json(with_prompt=False))
    s = store(redis_server.url, size * 19 // 2)  # room for nine
    try:
        for i in range(8):
            e = entry(f"a{i:02}", "acme", "answer " * 100)
            assert await s.persist(e, True, 60, None, e, 60, [f"x:a{i:02}"], 1000, 60) == []
        purged = {f"a{i:02}" for i in range(4, 8)}  # its newest four
        assert await s.purge(lambda e: e.key in purged) == (4, 0)
        for i in range(8, 12):  # eight live again: within the bound
            e = entry(f"a{i:02}", "acme", "answer " * 100)
            assert await s.persist(e, True, 60, None, e, 60, [f"x:a{i:02}"], 1000, 60) == []
        assert await exact_keys(s) == {f"a{i:02}" for i in (0, 1, 2, 3, 8, 9, 10, 11)}
    finally:
        await s.close()


@pytest.mark.parametrize(("bound", "cap"), [(8000, 1000), (None, 4)])  # bound, user cap
async def test_a_tenants_bound_never_evicts_a_key_another_tenant_stored_since(
        redis_server: RedisServer, bound: int | None, cap: int) -> None:
    """With `scope: global` a key is every tenant's: one acme stored, expired and globex
    stored again stayed in acme's count (and its user's list), and acme's flood, popping
    its oldest, deleted globex's live entry (and told every replica to drop it). Only an
    entry that is still the tenant's own goes; another's stays, counted as its own
    tenant's."""
    s = store(redis_server.url, bound, shared=True)
    vec = np.ones(4, dtype=np.float32) / 2
    try:
        first = entry("shared", "acme", "answer " * 100)
        await s.persist(first, True, 60, ("p", vec, "q"), first, 60,
                        ["x:shared", "s:p:shared"], cap, 60)
        await s.client.delete(s.p + "x:shared")  # expired (its semantic part too)
        await s.client.delete(s.p + "s:p")
        again = entry("shared", "globex", "answer " * 100)
        assert await s.persist(again, True, 60, ("p", vec, "q"), again, 60,
                               ["x:shared", "s:p:shared"], cap, 60) == []
        evicted: list[str] = []
        for i in range(30):  # acme floods: its oldest, the shared key's count, pops
            e = entry(f"a{i}", "acme", "answer " * 100)
            evicted += await s.persist(e, True, 60, None, e, 60, [f"x:a{i}"], cap, 60) or []
        assert "x:a0" in evicted
        assert "x:shared" not in evicted and "s:p:shared" not in evicted
        assert "shared" in await exact_keys(s)
        assert await held_bytes(s, "globex") > 0
        assert await held_bytes(s, "acme") <= (bound or 4 * len(e.to_json()))
    finally:
        await s.close()


async def test_a_key_another_tenant_stored_again_leaves_the_first_tenants_count(
        redis_server: RedisServer) -> None:
    """With `scope: global`, an entry acme stored, which expired and globex stored again
    under the key they share, stayed in acme's count (its bytes held twice, acme's and
    globex's) until popped: acme's live entries older than it were evicted for bytes it
    no longer held. The count drops it as it drops an entry gone on its own."""
    vec = np.ones(4, dtype=np.float32) / 2
    text = "answer " * 100
    e = entry("a0", "acme", text)
    sizing = store(redis_server.url, None)
    exact, sem = len(e.to_json(with_prompt=False)), len(sizing._pack(vec, e.to_json(), "q"))
    await sizing.close()
    s = store(redis_server.url, sem + 2 * exact + exact // 2, shared=True)
    try:
        older = entry("a0", "acme", text)  # in the semantic layer: longer-lived
        await s.persist(older, False, 60, ("p", vec, "q"), older, 60, ["s:p:a0"], 1000, 60)
        for key in ("shared", "a1"):
            e = entry(key, "acme", text)
            assert await s.persist(e, True, 60, None, e, 60, [f"x:{key}"], 1000, 60) == []
        await s.client.delete(s.p + "x:shared")  # expired
        again = entry("shared", "globex", text)
        assert await s.persist(again, True, 60, None, again, 60, ["x:shared"], 1000, 60) == []
        e = entry("a2", "acme", text)  # acme holds a0, a1 and a2: within its bound
        assert await s.persist(e, True, 60, None, e, 60, ["x:a2"], 1000, 60) == []
        assert await held_bytes(s, "acme") == int(
            (await s.client.hget(s.tenant_keys("acme")[1], "#")) or 0)
        assert len(await s.client.hkeys(s.p + "s:p")) == 1  # acme's older entry kept
        assert await exact_keys(s) == {"shared", "a1", "a2"}
    finally:
        await s.close()


async def test_a_write_in_global_scope_reads_no_entry_to_tell_whose_it_is(
        redis_server: RedisServer) -> None:
    """With `scope: global` and a tenant bound, each write looked at up to 16 of the
    tenant's counted entries for whose they were now: each read from Redis (a GET, a
    semantic hash's HGET) and decoded whole inside the script. Whose an entry is, is a
    small marker beside it: no write reads an entry."""
    vec = np.ones(4, dtype=np.float32) / 2
    s = store(redis_server.url, 10**6, shared=True)
    try:
        for i in range(20):
            e = entry(f"a{i}", "acme", "answer " * 50)
            assert await s.persist(e, True, 60, ("p", vec, "q"), e, 60,
                                   [f"x:a{i}", f"s:p:a{i}"], 1000, 60) == []
        seen: list[str] = []
        async with s.client.monitor() as watch:
            e = entry("last", "acme", "answer")
            assert await s.persist(e, True, 60, ("p", vec, "q"), e, 60,
                                   ["x:last", "s:p:last"], 1000, 60) == []
            await s.client.echo("weir-test-done")
            async for command in watch.listen():
                if "weir-test-done" in command["command"]:
                    break
                seen.append(command["command"])
        assert any(c.startswith("EVALSHA") or c.startswith("EVAL") for c in seen)
        reads = [c for c in seen if c.split(" ", 1)[0].upper() in ("GET", "HGET")
                 and (s.p + "x:" in c or s.p + "s:" in c)]
        assert reads == []
    finally:
        await s.close()


async def test_a_key_another_user_stored_again_leaves_the_first_users_list(
        redis_server: RedisServer) -> None:
    """With `scope: global`, an entry acme's user stored, which expired and globex
    stored again under the key they share, stayed on acme's user's list until popped:
    it took a place under that user's cap, and one of the user's live entries was
    evicted for it. It leaves the list once another stores it."""
    s = store(redis_server.url, None, shared=True)
    try:
        for key in ("a1", "shared"):
            e = entry(key, "acme", "answer")
            assert await s.persist(e, True, 60, None, e, 60, [f"x:{key}"], 2, 60) == []
        await s.client.delete(s.p + "x:shared")  # expired
        again = entry("shared", "globex", "answer")
        assert await s.persist(again, True, 60, None, again, 60, ["x:shared"], 2, 60) == []
        e = entry("a2", "acme", "answer")  # acme's user holds a1 and a2: its cap
        assert await s.persist(e, True, 60, None, e, 60, ["x:a2"], 2, 60) == []
        assert await exact_keys(s) == {"shared", "a1", "a2"}
        assert await s.client.zrange(s.user_key("acme", "u"), 0, -1) == [b"x:a1", b"x:a2"]
    finally:
        await s.close()


async def test_entries_gone_on_their_own_leave_their_tenants_count(
        redis_server: RedisServer) -> None:
    """An exact entry that expired (L2's TTL shorter than the semantic layer's) stayed in
    its tenant's count until popped: its live semantic twins, as old, were evicted to make
    room for bytes no longer held. The count drops what is gone as it goes."""
    vec = np.ones(4, dtype=np.float32) / 2
    text = "answer " * 100
    e = entry("a0", "acme", text)
    sizing = store(redis_server.url, None)
    size = len(e.to_json(with_prompt=False)) + len(sizing._pack(vec, e.to_json(), "q"))
    await sizing.close()
    s = store(redis_server.url, size * 7 // 2)  # room for three and a half pairs
    try:
        for i in range(3):
            e = entry(f"a{i}", "acme", text)
            assert await s.persist(e, True, 60, ("p", vec, "q"), e, 60,
                                   [f"x:a{i}", f"s:p:a{i}"], 1000, 60) == []
        for i in range(3):
            await s.client.delete(s.p + f"x:a{i}")  # L2's TTL ran out
        e = entry("a3", "acme", text)  # live: three semantic entries and this pair
        assert await s.persist(e, True, 60, ("p", vec, "q"), e, 60,
                               ["x:a3", "s:p:a3"], 1000, 60) == []
        assert len(await s.client.hkeys(s.p + "s:p")) == 4
        assert await held_bytes(s, "acme") == int(
            (await s.client.hget(s.tenant_keys("acme")[1], "#")) or 0)
    finally:
        await s.close()


async def test_entry_ages_are_redis_time_not_each_replicas_clock(
        redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica whose clock ran an hour ahead stored answers that looked an hour newer
    than every other replica's: a user's cap and a tenant's bound evicted the others'
    newer entries first. Ages are the time Redis stores them at."""
    import plugins.cache.redis_store as redis_store

    s = store(redis_server.url, None)
    try:
        clock = [3600.0]
        monkeypatch.setattr(redis_store, "time", SimpleNamespace(
            time=lambda: time.time() + clock[0], monotonic=time.monotonic))
        first = entry("a0", "acme", "answer")
        assert await s.persist(first, True, 60, None, first, 60, ["x:a0"], 2, 60) == []
        clock[0] = 0.0  # the next replica's clock is right
        for i in (1, 2):
            e = entry(f"a{i}", "acme", "answer")
            evicted = await s.persist(e, True, 60, None, e, 60, [f"x:a{i}"], 2, 60)
        assert evicted == ["x:a0"]  # the first stored goes first
        assert await exact_keys(s) == {"a1", "a2"}
    finally:
        await s.close()



async def test_gone_entries_behind_the_oldest_live_ones_leave_the_count_too(
        redis_server: RedisServer) -> None:
    """Each write looked at the tenant's 8 oldest entries only: once those were live
    semantic entries (a longer TTL than L2's), the expired exact entries behind them held
    their bytes for good, and the live entries were evicted for them. Every entry is
    looked at in turn, a few a write."""
    vec = np.ones(4, dtype=np.float32) / 2
    text = "answer " * 100
    e = entry("a10", "acme", text)
    sizing = store(redis_server.url, None)
    exact, sem = (len(e.to_json(with_prompt=False)),
                  len(sizing._pack(vec, e.to_json(), "q")))
    await sizing.close()
    # room for what is live at the end (twenty semantic entries, eight exact), not more
    s = store(redis_server.url, 20 * sem + 8 * exact + sem // 2)
    try:
        def pair(i: int) -> Entry:
            return entry(f"a{i}", "acme", text)

        async def put(i: int) -> list[str] | None:
            e = pair(i)
            return await s.persist(e, True, 60, ("p", vec, "q"), e, 60,
                                   [f"x:a{i}", f"s:p:a{i}"], 1000, 60)

        for i in range(12):
            assert await put(i) == []
        for i in range(12):
            await s.client.delete(s.p + f"x:a{i}")  # L2's TTL ran out
        for i in range(12, 20):
            assert await put(i) == []
        assert await held_bytes(s, "acme") == int(
            (await s.client.hget(s.tenant_keys("acme")[1], "#")) or 0)
    finally:
        await s.close()


async def test_an_entry_the_previous_version_stored_is_served_and_kept_for_its_tenant(
        redis_server: RedisServer) -> None:
    """With `scope: global`, entries the previous version stored have no owner marker
    (for a day, their life). A read never asks the marker: such an entry is a hit, as
    any (and scope `global` is the one scope whose keys tenants share; the others'
    keys hold the tenant). Popped from the list of a user whose copy another tenant
    had stored again (under that version), it was deleted as if still the user's: that
    version read the entry's tenant and kept it. It is read so now (a tenant's own left in
    a marker); the tenant's own legacy entry still goes past its user's cap."""
    s = store(redis_server.url, None, shared=True)
    try:
        for key in ("shared", "own"):
            e = entry(key, "acme", "answer")
            assert await s.persist(e, True, 60, None, e, 60, [f"x:{key}"], 2, 60) == []
        # the previous version: globex stored the shared key again (acme's copy gone),
        # and no entry has a marker
        again = entry("shared", "globex", "answer")
        await s.client.set(s.p + "x:shared", again.to_json(with_prompt=False))
        await s.client.delete(s.p + "o:x:shared", s.p + "o:x:own")
        got = await s.get_exact("shared")
        assert got is not None and got.tenant == "globex"  # readable, as stored
        e = entry("a1", "acme", "answer")  # acme's user: own, shared, a1 past its cap 2
        evicted = await s.persist(e, True, 60, None, e, 60, ["x:a1"], 2, 60)
        assert evicted == []  # (the shared key popped first: globex's, kept)
        assert "shared" in await exact_keys(s)
        assert (await s.get_exact("shared")).tenant == "globex"  # type: ignore[union-attr]
        e = entry("a2", "acme", "answer")
        assert await s.persist(e, True, 60, None, e, 60, ["x:a2"], 2, 60) == ["x:own"]
        assert await exact_keys(s) == {"shared", "a1", "a2"}
        # (no marker: one would tell globex it is another's too)
        assert await s.client.get(s.p + "o:x:shared") is None
    finally:
        await s.close()


async def test_an_old_entry_another_tenant_looked_at_still_goes_past_its_owners_cap(
        redis_server: RedisServer) -> None:
    """(scope `global`) An entry the previous version stored, found another tenant's by
    the tenant whose user list popped it, was marked so for everyone ('- -'): its own
    tenant's user then took it for another's too, and never deleted it past its cap (it
    held a place, and Redis, for a day). Whose it is, is said to the tenant that asked,
    and marked only where it is that tenant's."""
    s = store(redis_server.url, None, shared=True)
    try:
        e = entry("shared", "acme", "answer")
        assert await s.persist(e, True, 60, None, e, 60, ["x:shared"], 2, 60) == []
        # the previous version: globex stored the key again, on its user's list; no marker
        again = entry("shared", "globex", "answer")
        await s.client.set(s.p + "x:shared", again.to_json(with_prompt=False))
        await s.client.delete(s.p + "o:x:shared")
        await s.client.zadd(s.user_key("globex", "u"), {"x:shared": 1.0})
        for key in ("a1", "a2"):  # acme's user: `shared` popped, globex's, kept
            e = entry(key, "acme", "answer")
            assert await s.persist(e, True, 60, None, e, 60, [f"x:{key}"], 2, 60) == []
        assert "shared" in await exact_keys(s)
        for key in ("g1", "g2"):  # globex's user, past its cap 2: its own `shared` goes
            e = entry(key, "globex", "answer")
            popped = await s.persist(e, True, 60, None, e, 60, [f"x:{key}"], 2, 60)
        assert popped == ["x:shared"]
        assert await exact_keys(s) == {"a1", "a2", "g1", "g2"}
    finally:
        await s.close()
