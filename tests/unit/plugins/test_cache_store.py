"""The cache store's public API without Redis: get, lookup, put, promote, purge, stats,
and the per-user bookkeeping that must stay within what the store still holds."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from plugins.cache.config import CacheConfig
from plugins.cache.entry import BadEntry, Entry, capture_body, matcher
from plugins.cache.metrics import CacheMetrics
from plugins.cache.store import CacheStore
from plugins.cache.users import UserIndex
from tests.fakes import FakeEmbedder
from tests.waiting import eventually


def store(**cfg: Any) -> CacheStore:
    return CacheStore(CacheConfig.model_validate(cfg), CacheMetrics(CollectorRegistry()),
                      FakeEmbedder())  # type: ignore[arg-type]


def entry(key: str, *, tenant: str = "acme", user: str = "alice", scope: str = "acme",
          text: str = "Use the reset link.", prompt: str = "reset my password",
          ttl: float = 60.0, grace: float = 0.0) -> Entry:
    now = time.time()
    return Entry(key=key, route="chat", model="m", scope=scope, tenant=tenant, role="user",
                 user=user, prompt=prompt, usage={"prompt_tokens": 3, "completion_tokens": 4},
                 choices=[{"index": 0, "text": text, "finish_reason": "stop"}],
                 created=now, expires=now + ttl, stale_until=now + ttl + grace)


async def test_put_then_get_within_its_scope_only() -> None:
    s = store()
    s.put(entry("k1"))
    await s.drain()
    got = await s.get("k1", "acme")
    assert got is not None and got.answer_text() == "Use the reset link."
    assert await s.get("k1", "globex") is None
    assert await s.get("nope", "acme") is None


async def test_get_serves_an_expired_entry_only_when_stale_is_allowed() -> None:
    s = store()
    s.put(entry("k1", ttl=-1.0, grace=60.0))
    await s.drain()
    assert await s.get("k1", "acme") is None
    assert await s.get("k1", "acme", allow_stale=True) is not None


async def test_semantic_lookup_finds_a_stored_question_in_its_partition_and_scope() -> None:
    s = store(semantic={"threshold": 0.8})
    s.put(entry("k1"), ("p", "How can I reset my password please?"))
    await s.drain()
    vec, hit = await s.lookup(("p", "How do I reset my password please?"), "acme")
    assert vec is not None and hit is not None and hit.key == "k1"
    assert (await s.lookup(("p", "How do I reset my password please?"), "globex"))[1] is None
    assert (await s.lookup(("other", "How do I reset my password please?"), "acme"))[1] is None


async def test_the_semantic_layer_serves_for_its_own_ttl() -> None:
    """An answer past L1's `ttl_s` (exact) but within `semantic.ttl_s` is no exact hit
    and still a semantic one."""
    s = store(exact={"ttl_s": 60}, semantic={"threshold": 0.8, "ttl_s": 9000})
    old = entry("k1", ttl=60)
    old.created -= 600
    old.expires -= 600
    s.put(old, ("p", "How can I reset my password please?"))
    await s.drain()
    assert await s.get("k1", "acme") is None
    _, hit = await s.lookup(("p", "How do I reset my password please?"), "acme")
    assert hit is not None and hit.key == "k1"


async def test_promote_makes_an_exact_alias_that_purges_with_the_original() -> None:
    s = store()
    original = entry("k1", prompt="How can I reset it?")
    s.put(original)
    s.promote("k2", original, "How do I reset it?", ("acme", "user", "alice"))
    assert await s.get("k2", "acme") is not None
    assert s.purge_local(matcher({"contains": "can I reset"})) == (2, 0)
    assert await s.get("k2", "acme") is None


async def test_an_alias_counts_its_askers_words_toward_l1s_bytes() -> None:
    s = store()
    original = entry("k1")
    s.put(original)
    before = s.l1.bytes  # type: ignore[union-attr]
    words = "a long paraphrase " * 100
    s.promote("k2", original, words, ("acme", "user", "bob"))
    assert s.l1.bytes - before >= len(original.to_json()) + len(words)  # type: ignore[union-attr]


async def test_a_purge_of_the_asker_removes_the_alias_holding_their_paraphrase() -> None:
    """Bob's paraphrase of Alice's question, kept as an alias of her entry (owned by her),
    holds Bob's prompt: purging Bob's data removes it; Alice's entry stays."""
    s = store()
    original = entry("k1", prompt="How can I reset it?")
    s.put(original)
    s.promote("k2", original, "bob's way of asking", ("acme", "user", "bob"))
    assert s.purge_local(matcher({"user": "bob"})) == (1, 0)
    assert await s.get("k2", "acme") is None and await s.get("k1", "acme") is not None
    assert s.purge_local(matcher({"user": "bob", "tenant": "globex"})) == (0, 0)


async def test_a_filter_tests_only_the_words_of_whom_it_names() -> None:
    """Scope global: globex's paraphrase is kept as an alias of acme's entry. A purge
    pinned to one tenant tests only that tenant's own words (else its counts were an
    oracle for the other's prompt); an operator's tests both."""
    s = store()
    original = entry("k1", prompt="acme secret initech question")
    s.put(original)
    s.promote("k2", original, "globex own words", ("globex", "user", "gus"))
    globex = {"tenant": "globex"}
    assert s.purge_local(matcher({**globex, "contains": "initech"})) == (0, 0)
    assert s.purge_local(matcher({"tenant": "acme", "contains": "globex own"})) == (0, 0)
    assert s.purge_local(matcher({**globex, "contains": "globex own"})) == (1, 0)
    s.promote("k3", original, "globex own words", ("globex", "user", "gus"))
    assert s.purge_local(matcher({"contains": "globex own"})) == (1, 0)  # an operator's


async def test_purge_counts_per_layer_and_marks_the_time() -> None:
    s = store()
    before = time.time() - 1
    s.put(entry("a1", prompt="the acme merger"), ("p", "tell me about the acme merger"))
    s.put(entry("b1", tenant="globex", scope="globex"), ("p", "tell me about the weather"))
    await s.drain()
    acme = entry("a2", prompt="more on the acme merger")
    weather = entry("b2", tenant="globex", scope="globex", prompt="the weather")
    assert not s.purged_since(before, acme)
    counts = await s.purge({"contains": "ACME"})
    assert counts == {"l1": 1, "semantic_index": 1}  # no Redis: no Redis count
    assert s.purged_since(before, acme)  # an answer generated across it is not stored
    assert not s.purged_since(before, weather)  # one the purge does not reach is
    assert s.purged_since(before, replace(weather, prompt=""))  # no prompt: cannot tell
    assert await s.get("a1", "acme") is None
    assert await s.get("b1", "globex") is not None


async def test_one_tenants_purge_never_stops_anothers_answers_being_stored() -> None:
    """A tenant admin's purge marked every answer under way as purged: purging in a loop
    kept every other tenant's cache from filling."""
    s = store()
    before = time.time() - 1
    await s.purge({"tenant": "globex", "user": "no-such-user"})
    assert not s.purged_since(before, entry("a1"))  # acme's answer is stored
    assert s.purged_since(before, entry("g1", tenant="globex", user="no-such-user"))
    for i in range(300):  # past the bound: the oldest purges' time holds for all
        await s.purge({"tenant": "globex", "user": f"u{i}"})
    assert s.purged_since(before, entry("a1"))
    later = time.time()  # after the floor: only the kept purges count, and none reach acme
    await s.purge({"tenant": "globex", "user": "x"})
    assert not s.purged_since(later, entry("a1"))


async def test_stats_global_and_filtered() -> None:
    s = store()
    s.put(entry("a1"), ("p1", "first question about things"))
    s.put(entry("a2"))
    s.put(entry("g1", tenant="globex", scope="globex"), ("p2", "second question about x"))
    await s.drain()
    everything = await s.stats()
    assert everything["l1"]["entries"] == 3 and everything["l1"]["bytes"] > 0
    assert everything["semantic_index"] == {"entries": 2, "partitions": 2}
    acme = await s.stats(matcher({"tenant": "acme"}))
    assert acme["l1"] == {"entries": 2}
    assert acme["semantic_index"] == {"entries": 1, "partitions": 1}
    assert "redis" not in acme and acme["replica"] == s.replica


async def test_user_cap_without_redis_evicts_the_oldest() -> None:
    s = store(per_user_max_entries=2, semantic={"enabled": False})
    for k in ("k1", "k2", "k3"):
        s.put(entry(k))
        await s.drain()
    assert await s.get("k1", "acme") is None
    assert await s.get("k2", "acme") is not None and await s.get("k3", "acme") is not None
    assert s.users.members(("acme", "alice")) == ["x:k2", "x:k3"]


async def test_an_answer_kept_exact_only_does_not_shrink_the_users_cap() -> None:
    """The cap counts an entry's parts (exact and semantic) the same for every put: an
    exact-only answer (a tool turn, a completion) after a full cap of two-part entries
    pushes out the oldest part only. It was scaled by that put's own parts, so it halved
    the user's cache."""
    s = store(per_user_max_entries=4, semantic={"lazy": False})
    for i in range(4):
        s.put(entry(f"q{i}"), ("p", f"question number {i} about topic {i}"))
        await s.drain()
    s.put(entry("tool-turn"))
    await s.drain()
    held = [k for k in ("q0", "q1", "q2", "q3", "tool-turn") if await s.get(k, "acme")]
    assert held == ["q1", "q2", "q3", "tool-turn"]
    assert s.users.members(("acme", "alice"))[:2] == ["s:p:q0", "x:q1"]


async def test_user_bookkeeping_without_redis_is_bounded_by_what_l1_holds() -> None:
    s = store(exact={"max_bytes": 2048}, semantic={"enabled": False})
    assert s.l1 is not None
    for i in range(200):  # 200 users, one entry each; L1 holds only a handful
        s.put(entry(f"k{i}", user=f"u{i}"))
        await s.drain()
    held = {e.key for e in s.l1.entries()}
    assert 0 < len(held) < 20
    assert len(s.users) == len(held) and s.users.users() == len(held)
    for i in range(200):
        assert s.users.members(("acme", f"u{i}")) == ([f"x:k{i}"] if f"k{i}" in held else [])


async def test_user_bookkeeping_forgets_purged_and_index_evicted_entries() -> None:
    s = store(semantic={"max_entries_per_scope": 1, "max_partitions": 1})
    s.put(entry("k1"), ("p1", "first question about things"))
    await s.drain()
    assert s.users.members(("acme", "alice")) == ["x:k1", "s:p1:k1"]
    s.put(entry("k2", user="bob"), ("p2", "second question about things"))
    await s.drain()  # p2 pushed p1 out whole
    assert s.users.members(("acme", "alice")) == ["x:k1"]
    s.purge_local(matcher({"user": "alice"}))
    assert s.users.members(("acme", "alice")) == [] and s.users.users() == 1


def test_user_index_add_discard_over() -> None:
    u = UserIndex()
    for m in ("a", "b", "c"):
        u.add(("t", "x"), m)
    u.add(("t", "y"), "d")
    assert u.over(("t", "x"), 2) == ["a"]
    u.discard("b")
    u.discard("missing")
    assert u.members(("t", "x")) == ["c"] and len(u) == 2
    u.discard("d")
    assert u.users() == 1 and u.members(("t", "y")) == []


async def test_entries_orjson_refuses_still_store_and_round_trip() -> None:
    """A lone surrogate (an upstream's JSON can carry one): stored and read back as it
    was, never an error on the request's path. An integer past 64 bits (which orjson
    refuses) is written without an error too, and read back as no count (an upstream's
    count past `rendering.MAX_COUNT` is refused before it is stored)."""
    odd = entry("k1", text="half a pair: \ud83d, and on")
    for e in (odd, entry("k2", text="ünïcødé ✓ 答え")):
        assert Entry.from_json(e.to_json()) == e
        assert Entry.from_json(e.to_json(with_prompt=False)).prompt == ""
    huge = entry("k3")
    huge.usage["completion_tokens"] = 2**70
    with pytest.raises(BadEntry):
        Entry.from_json(huge.to_json())
    s = store()
    s.put(odd)
    await s.drain()
    got = await s.get("k1", "acme")
    assert got is not None and got.answer_text() == "half a pair: \ud83d, and on"


async def test_a_replica_that_missed_events_keeps_nothing_it_cannot_check() -> None:
    """Its listener lost Redis a while: a purge another replica sent meanwhile is gone
    (pub/sub keeps nothing), and this replica served the purged entry from its memory
    until it expired. Told to resync, it empties its memory (L2 and the vectors in Redis
    answer again)."""
    s = store(semantic={"lazy": False})
    s.put(entry("k1"), ("p", "How can I reset my password please?"))
    await s.drain()
    assert await s.get("k1", "acme") is not None
    await s._on_event({"op": "resync"})
    assert await s.get("k1", "acme") is None
    assert (await s.lookup(("p", "How can I reset my password please?"), "acme"))[1] is None
    assert s.users.members(("acme", "alice")) == []


def test_a_tenant_filter_covers_the_callers_its_gateway_key_forwards_for() -> None:
    """A central Weir holds an edge's callers as `edge~<key id>~<digest>`: a purge or the
    stats of `edge` reach them; another tenant whose name only begins alike does not."""
    f = matcher({"tenant": "edge"})
    assert f(entry("a", tenant="edge")) and f(entry("b", tenant="edge~k1~d1"))
    assert not f(entry("c", tenant="edgewise")) and not f(entry("d", tenant="acme"))
    assert not matcher({"tenant": "edge~k1~d1"})(entry("e", tenant="edge~k1~d2"))


@pytest.mark.parametrize("change", [
    {"usage": {"prompt_tokens": -5, "completion_tokens": 3}},
    {"usage": {"prompt_tokens": 3, "completion_tokens": True}},
    {"choices": [{"index": 5, "text": "x", "finish_reason": "stop"}]},
    {"choices": [{"index": 0, "text": "x", "finish_reason": "stop"},
                 {"index": 0, "text": "y", "finish_reason": "stop"}]},
])
def test_an_entry_no_answer_could_have_stored_is_unreadable(change: dict[str, Any]) -> None:
    """What Redis holds may be anything: an entry whose usage is not token counts (it
    was read, then the hit was a 500 counting its tokens) or whose choices are not
    indexed 0 to n - 1 (served as they were) is a miss; and such an answer is never
    stored to be refused on every read."""
    bad = json.dumps({**json.loads(entry("k1").to_json()), **change})
    with pytest.raises(BadEntry):
        Entry.from_json(bad)
    body = {"choices": [{**c, "message": {"content": c["text"]}}
                        for c in change.get("choices", entry("k1").choices)],
            "usage": change.get("usage", {"prompt_tokens": 1, "completion_tokens": 1})}
    assert capture_body(body, "chat") is None


@pytest.mark.parametrize("order", [["Use the reset link."], [0], "x", None])
def test_a_choice_with_an_order_and_no_calls_is_unreadable(order: Any) -> None:
    """An `order` (`Completion.order`) is kept only beside the calls it numbers: a choice
    in Redis with one and no `tool_calls` (garbage, another version's) is a miss; its
    read raised a KeyError, a 500 for the request that looked it up."""
    bad = json.loads(entry("k1").to_json())
    bad["choices"][0]["order"] = order
    with pytest.raises(BadEntry):
        Entry.from_json(json.dumps(bad))


def test_a_stored_vector_longer_than_any_embedding_is_unreadable() -> None:
    """Embeddings are unit vectors: one longer (a poisoned or foreign semantic entry in
    Redis) scored above every real match in its partition, so the guard refused it
    and the partition's real entries answered no paraphrase while it stayed."""
    import base64

    import numpy as np

    from plugins.cache.redis_store import RedisStore

    def packed(vec: np.ndarray) -> str:
        return json.dumps({"v": base64.b64encode(vec.astype("<f4").tobytes()).decode(),
                           "g": "#", "q": "a question", "e": entry("k1").to_json()})

    unit = np.full(4, 0.5, dtype=np.float32)
    assert RedisStore._unpack(packed(unit))[2] == "a question"
    with pytest.raises(BadEntry):
        RedisStore._unpack(packed(unit * 100))


class _SlowEmbedder(FakeEmbedder):
    """Embeds once released: the embedding model behind under load."""

    def __init__(self) -> None:
        super().__init__()
        import asyncio

        self.waiting = 0
        self.go = asyncio.Event()

    async def embed(self, texts: list[str],
                    refuse_over: int | None = None) -> tuple[Any, list[int]]:
        self.waiting += 1
        await self.go.wait()
        return await super().embed(texts, refuse_over)


async def test_answers_waiting_for_their_vectors_are_bounded_with_lazy_vectors_off(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With `lazy` off an answer whose lookup gave no vector (a busy model: it timed out)
    embeds its question in the background, holding the answer and question meanwhile:
    under load they piled up without bound behind the model. Past MAX_PENDING the
    tenant holding the most keeps its next answers exact only; another still waits."""
    monkeypatch.setattr("plugins.cache.store.MAX_PENDING", 4)
    emb = _SlowEmbedder()
    s = CacheStore(CacheConfig.model_validate({"semantic": {"lazy": False}}),
                   CacheMetrics(CollectorRegistry()), emb)  # type: ignore[arg-type]
    for i in range(20):
        s.put(entry(f"k{i}", prompt=f"question {i}"), (f"p{i}", f"What about order {i}?"))
    await eventually(lambda: emb.waiting == 4 and len(s._background) == 4)
    s.put(entry("g1", tenant="globex", scope="globex"), ("g", "Where is my parcel now?"))
    await eventually(lambda: emb.waiting == 5)
    emb.go.set()
    await s.drain()
    assert len(s.index) == 5 and s.index.partitions.get("g") is not None
    assert [await s.get(f"k{i}", "acme") is not None for i in range(20)] == [True] * 20


async def test_answers_waiting_for_their_vectors_hold_at_most_the_semantic_byte_bound() -> None:
    """Lazy vectors: under load answers wait unembedded, at most MAX_PENDING (10,000) of
    them, whatever their size: long answers were hundreds of MB beside the index's own
    bound. They hold at most `semantic.max_bytes`, the tenant holding the most giving
    way."""
    s = store(semantic={"max_bytes": 2**20})
    s.idle = lambda: False  # under load: nothing is embedded while idle
    s.put(entry("g1", tenant="globex", scope="globex", prompt="q"),
          ("g", "Where is parcel 881 now?"))
    long = "This answer is long. " * 5000  # ~100 KB
    for i in range(30):
        s.put(entry(f"k{i}", text=long, prompt=f"q{i}"), (f"p{i}", f"What is order {i}?"))
    await eventually(lambda: len(s._background) == len(s._pending) > 0)
    held = sum(len(p.entry.to_json()) + len(p.question) for p in s._pending.values())
    assert held <= 2**20
    assert s._pending_bytes.total == sum(p.size for p in s._pending.values())
    assert ("g", "g1") in s._pending and 5 <= len(s._pending) <= 11
    assert ("p29", "k29") in s._pending  # the flooding tenant's newest wait, its oldest went
    await s.close()
