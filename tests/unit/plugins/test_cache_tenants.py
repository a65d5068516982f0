"""The cache's memory bounds are shared fairly between tenants: one tenant sending many
distinct questions, seeds or parameter sets evicts its own entries and partitions, never
those of a tenant holding less."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from plugins.cache.config import CacheConfig, SemanticConfig
from plugins.cache.entry import Entry
from plugins.cache.l1 import L1
from plugins.cache.metrics import CacheMetrics
from plugins.cache.semantic import ENTRY_OVERHEAD, SemanticIndex, entry_bytes
from plugins.cache.store import CacheStore, _owner
from proxy.auth import Principal
from tests.fakes import FakeEmbedder
from tests.unit.plugins.test_cache import Engine, ctx, plugin, run

ACME = Principal("acme", "user", "alice")
GLOBEX = Principal("globex", "user", "eve")


def entry(key: str, tenant: str) -> Entry:
    return Entry(key=key, route="chat", model="m", scope=f"t={tenant}", tenant=tenant,
                 role="user", user="u", prompt="p",
                 usage={"prompt_tokens": 1, "completion_tokens": 1},
                 choices=[{"index": 0, "text": "a", "finish_reason": "stop"}],
                 created=0.0, expires=1e12, stale_until=1e12)


def by_tenant(e: Entry) -> str:
    return e.tenant


def test_a_tenant_flooding_l1_evicts_its_own_entries_not_another_tenants() -> None:
    l1 = L1(max_bytes=1000, owner=by_tenant)
    l1.put(entry("b1", "b"), 100)
    l1.put(entry("b2", "b"), 100)
    for i in range(200):  # many distinct questions, never asked again
        l1.put(entry(f"a{i}", "a"), 100)
    assert l1.get("b1", 1.0) is not None and l1.get("b2", 1.0) is not None
    assert l1.bytes <= 1000 and l1.owned_bytes("a") == 800
    assert l1.get("a199", 1.0) is not None and l1.get("a0", 1.0) is None


def test_a_full_l1_takes_from_the_tenant_holding_the_most() -> None:
    l1 = L1(max_bytes=1000, owner=by_tenant)
    for i in range(7):
        l1.put(entry(f"b{i}", "b"), 100)  # b holds 700 while a is quiet
    for i in range(5):
        l1.put(entry(f"a{i}", "a"), 100)  # a comes: b, holding the most, gives way
    assert (l1.owned_bytes("a"), l1.owned_bytes("b")) == (500, 500)
    assert l1.get("b0", 1.0) is None and l1.get("b6", 1.0) is not None
    l1.put(entry("a5", "a"), 100)  # now even: a's own oldest goes
    assert l1.get("a0", 1.0) is None and l1.owned_bytes("b") == 500


def test_l1_per_tenant_cap() -> None:
    l1 = L1(max_bytes=10_000, owner=by_tenant, max_bytes_per_owner=300)
    for i in range(5):
        l1.put(entry(f"a{i}", "a"), 100)
    assert l1.owned_bytes("a") == 300 and len(l1) == 3
    l1.put(entry("big", "a"), 400)  # larger than the tenant's cap: not kept
    assert "big" not in l1 and l1.owned_bytes("a") == 300


def test_l1_with_one_owner_is_a_plain_lru() -> None:
    gone: list[str] = []
    l1 = L1(max_bytes=300, on_remove=gone.append)
    for k in "abc":
        l1.put(entry(k, "t"), 100)
    assert l1.get("a", 1.0) is not None
    l1.put(entry("d", "t"), 100)
    assert gone == ["b"] and l1.bytes == 300
    assert l1.purge(lambda e: True) and l1.bytes == 0 and len(l1) == 0


def unit(i: int, dim: int = 8) -> np.ndarray:
    v = np.zeros(dim, dtype=np.float32)
    v[i % dim] = 1.0
    return v


def test_a_tenant_flooding_partitions_drops_its_own_not_another_tenants() -> None:
    index = SemanticIndex(dim=8, capacity=10, max_partitions=4)
    index.partition("b-faq", owner="b").add("b1", unit(1), entry("b1", "b"), "q")
    for seed in range(100):  # a new seed per request
        index.partition(f"a-seed-{seed}", owner="a").add(
            f"a{seed}", unit(seed), entry(f"a{seed}", "a"), "q")
    assert index.get("b-faq") is not None and index.owned("b") == 1
    assert index.owned("a") == 3 and len(index.partitions) == 4
    assert index.evicted_partitions == 97


def test_a_full_index_drops_from_the_tenant_holding_the_most() -> None:
    index = SemanticIndex(dim=8, capacity=10, max_partitions=4)
    for i in range(4):
        index.partition(f"b{i}", owner="b")
    index.get("b0")  # b0 is b's most recently used now
    index.partition("a0", owner="a")
    assert "b1" not in index.partitions and index.owned("b") == 3
    index.partition("a1", owner="a")
    index.partition("a2", owner="a")  # now even (2 and 2): a's own least recent goes
    assert index.owned("a") == 2 and index.owned("b") == 2 and "a0" not in index.partitions
    assert "b0" in index.partitions


def test_partitions_per_tenant_cap() -> None:
    index = SemanticIndex(dim=8, capacity=10, max_partitions=100,
                          max_partitions_per_owner=2)
    for i in range(5):
        index.partition(f"a{i}", owner="a")
    index.partition("b0", owner="b")
    assert list(index.partitions) == ["a3", "a4", "b0"]


def test_the_caps_are_configurable_and_described() -> None:
    cfg = CacheConfig.model_validate({"exact": {"max_bytes_per_tenant": 2048},
                                      "semantic": {"max_partitions_per_tenant": 8}})
    assert cfg.exact.max_bytes_per_tenant == 2048
    assert cfg.semantic.max_partitions_per_tenant == 8
    assert CacheConfig().exact.max_bytes_per_tenant is None
    assert CacheConfig().semantic.max_partitions_per_tenant is None
    for bad in ({"exact": {"max_bytes_per_tenant": 0}},
                {"semantic": {"max_partitions_per_tenant": 0}}):
        with pytest.raises(ValueError):
            CacheConfig.model_validate(bad)


def test_a_gateways_callers_count_as_its_tenant_and_an_alias_as_its_asker() -> None:
    """A gateway key forwards for as many callers as it names, each a tenant of its own:
    counted apart, they would each hold little and the tenant they evict from would be
    the one holding the most, a real one."""
    assert _owner(entry("k", "acme~gw~" + "a" * 32)) == "acme"
    alias = replace(entry("k", "acme"), asker=("globex", "user", "eve", "q"))
    assert _owner(alias) == "globex"


async def test_a_flood_of_parameter_sets_keeps_the_other_tenants_answers() -> None:
    p = plugin(exact={"max_bytes": 8192}, semantic={"max_partitions": 4, "lazy": False})
    eng = Engine()
    await run(p, ctx("What are your opening hours?", principal=GLOBEX), eng)
    for i in range(40):  # acme: a new parameter set (a new partition, a new key) each time
        await run(p, ctx(f"Question number {i} about our invoices?", principal=ACME,
                         max_tokens=16 + i), eng)
    calls = eng.calls
    _, layer = await run(p, ctx("What are your opening hours?", principal=GLOBEX), eng)
    assert layer == "exact" and eng.calls == calls
    _, layer = await run(p, ctx("What are your opening hours, please?", principal=GLOBEX),
                         eng)
    assert layer == "semantic" and eng.calls == calls
    assert p.store.index.owned("globex") == 1 and p.store.index.owned("acme") == 3
    await p.close()


async def test_a_tenants_burst_under_load_keeps_anothers_answers_waiting_for_vectors(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Under load (lazy vectors) answers wait for their question's vector, at most
    MAX_PENDING of them: a tenant's burst of one-off answers drops its own oldest, not
    another tenant's, which joins the index once the gateway is idle and answers its
    paraphrase."""
    from plugins.cache import store as store_mod
    from tests.unit.plugins.test_lazy import Busy, lazy_plugin, pending_is

    monkeypatch.setattr(store_mod, "MAX_PENDING", 4)
    p, _ = lazy_plugin()
    busy = await Busy(p).start()  # (its own answer waits too: acme's, as ctx's default)
    await p(ctx("What are the opening hours of the Lisbon office?", principal=GLOBEX),
            Engine("Nine to five."))
    for i in range(10):
        await p(ctx(f"Where is parcel {88100 + i} now?", principal=ACME), Engine("Lisbon."))
    assert await pending_is(p, 4)
    await busy.release()
    await p.store.drain()
    eng = Engine()
    _, layer = await run(p, ctx("What are the opening hours of the Lisbon office please?",
                                principal=GLOBEX), eng)
    assert layer == "semantic" and eng.calls == 0
    await p.close()


class _Reads(dict[str, int]):
    """A dict counting the owners' byte counts read (an iteration: all of them)."""

    reads = 0

    def __getitem__(self, key: str) -> int:
        _Reads.reads += 1
        return super().__getitem__(key)

    def get(self, key: str, default: object = None) -> object:  # type: ignore[override]
        _Reads.reads += 1
        return super().get(key, default)

    def __iter__(self):  # type: ignore[no-untyped-def]
        _Reads.reads += len(self)
        return super().__iter__()

    def items(self):  # type: ignore[no-untyped-def]
        _Reads.reads += len(self)
        return super().items()


def test_a_put_into_a_full_l1_does_not_walk_every_tenant() -> None:
    """L1 full, each put evicts from the tenant holding the most: found without reading
    every tenant's count each time (O(tenants) a put: 25 µs a put at 1,000 tenants, 1 µs
    before the fair share), and still the one holding the most."""
    tenants = 2000
    l1 = L1(max_bytes=100 * tenants, owner=by_tenant)
    l1._bytes._held = _Reads()
    for i in range(tenants):
        l1.put(entry(f"k{i}", f"t{i}"), 100)
    _Reads.reads = 0
    for i in range(tenants):  # one tenant floods: each put evicts
        l1.put(entry(f"flood{i}", "t0" if i % 2 else "t1"), 100)
    assert _Reads.reads < 20 * tenants, _Reads.reads
    assert l1.bytes <= l1.max_bytes
    assert all(f"k{i}" in l1 for i in range(2, tenants))  # only the flooders' own went


class _Partitions(dict[str, "OrderedDict[str, None]"]):
    """`_Reads` for the index's partitions by owner."""

    reads = 0

    def __getitem__(self, key: str) -> OrderedDict[str, None]:
        _Partitions.reads += 1
        return super().__getitem__(key)

    def get(self, key: str, default: object = None) -> object:  # type: ignore[override]
        _Partitions.reads += 1
        return super().get(key, default)

    def __iter__(self):  # type: ignore[no-untyped-def]
        _Partitions.reads += len(self)
        return super().__iter__()

    def items(self):  # type: ignore[no-untyped-def]
        _Partitions.reads += len(self)
        return super().items()


def test_a_new_partition_in_a_full_index_does_not_walk_every_tenant() -> None:
    """Each distinct conversation so far is a partition: a full index made each new one
    read every tenant's count (163 µs a partition at 1,000 tenants); the tenant holding
    the most is found in a heap, and it is still the one that gives way."""
    tenants = 2000
    index = SemanticIndex(4, 5, max_partitions=tenants)
    index._owned = _Partitions()
    for i in range(tenants):
        index.partition(f"p{i}", owner=f"t{i}")
    _Partitions.reads = 0
    for i in range(tenants):  # two tenants' many conversations: each drops their own
        index.partition(f"flood{i}", owner="t0" if i % 2 else "t1")
    assert _Partitions.reads < 20 * tenants, _Partitions.reads
    assert len(index.partitions) == tenants
    assert all(f"p{i}" in index.partitions for i in range(2, tenants))


async def test_an_answer_kept_waiting_in_a_full_pending_list_does_not_walk_every_tenant(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Answers waiting for their vectors (lazy vectors, under load) at their bound: each
    new one read every tenant's count of them to drop from the one with the most; a heap
    finds it, and it is still the one whose oldest goes."""
    from plugins.cache import store as store_mod
    from tests.unit.plugins.test_lazy import lazy_plugin

    tenants = 2000
    monkeypatch.setattr(store_mod, "MAX_PENDING", tenants)
    p, _ = lazy_plugin()
    s = p.store
    s.idle = lambda: False  # (under load: nothing is embedded meanwhile)
    s._pending_of = _Partitions()  # type: ignore[assignment]
    for i in range(tenants):
        s._defer("part", entry(f"k{i}", f"t{i}"), "q", None)
    _Partitions.reads = 0
    for i in range(tenants):  # two tenants' bursts: each drops their own oldest
        s._defer("part", entry(f"flood{i}", "t0" if i % 2 else "t1"), "q", None)
    assert _Partitions.reads < 20 * tenants, _Partitions.reads
    assert len(s._pending) == tenants
    assert all(("part", f"k{i}") in s._pending for i in range(2, tenants))
    await p.close()


def _real_entry(key: str, tenant: str) -> Entry:
    return replace(entry(key, tenant), prompt="What is the status of my order? " * 4,
                   choices=[{"index": 0, "text": "Your order ships today. " * 40,
                             "finish_reason": "stop"}])


def test_a_flood_of_parameter_sets_keeps_the_semantic_index_within_its_bytes() -> None:
    """Every seed or temperature a client sends makes a partition: without a bound on the
    whole index, max_partitions x capacity entries of 384 floats (and their answers)
    grew to gigabytes. The index's count is the memory it really takes, it stays under
    max_bytes, and the flooding tenant gives way, not the one holding less."""
    import tracemalloc

    bound = 2 * 2**20
    rng = np.random.default_rng(7)
    vecs = rng.standard_normal((64, 384)).astype(np.float32)
    index = SemanticIndex(dim=384, capacity=10_000, max_partitions=1024, max_bytes=bound)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(20):
            index.partition("b-faq", owner="b").add(f"b{i}", vecs[i % 64], _real_entry(
                f"b{i}", "b"), f"question {i}")
        for seed in range(600):  # a new parameter set per request, a few answers each
            for j in range(3):
                index.partition(f"a-seed-{seed}", owner="a").add(
                    f"a{seed}-{j}", vecs[(seed + j) % 64], _real_entry(f"a{seed}-{j}", "a"),
                    f"question {seed} {j}")
            assert index.bytes <= bound
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held <= bound * 1.25  # the count is what the index really holds
    assert index.bytes > bound // 2 and index.evicted_for_bytes > 0
    assert len(index.partitions["b-faq"]) == 20  # the other tenant kept all its answers
    assert index.bytes == sum(p.bytes for p in index.partitions.values())


def test_one_large_partition_sheds_its_oldest_entries_and_its_matrix_shrinks() -> None:
    index = SemanticIndex(dim=384, capacity=10_000, max_bytes=2**20)
    vec = np.ones(384, dtype=np.float32) / np.sqrt(384)
    for i in range(2000):
        index.partition("p", owner="a").add(f"k{i}", vec, _real_entry(f"k{i}", "a"), "q")
    p = index.partitions["p"]
    assert index.bytes <= 2**20 and "k1999" in p.entries and "k0" not in p.entries
    assert p.vecs.nbytes < 2**20
    for entry_id in list(p.rows)[:-3]:  # a purge empties most of it: the matrix shrinks
        p.remove(entry_id)
    assert len(p.vecs) <= 8 and index.bytes == p.bytes
    found = p.search(vec, now=1.0)
    assert found is not None and found[0] in {"k1997", "k1998", "k1999"}


def test_the_semantic_byte_bound_is_configurable_and_described() -> None:
    field = SemanticConfig.model_fields["max_bytes"]
    assert field.description and CacheConfig().semantic.max_bytes <= 2**30
    assert CacheConfig.model_validate({"semantic": {"max_bytes": 2**21}}).semantic.max_bytes \
        == 2**21
    with pytest.raises(ValueError):
        CacheConfig.model_validate({"semantic": {"max_bytes": 1}})


def test_an_answer_embedded_lazily_into_a_full_index_is_kept() -> None:
    """An answer embedded late (lazy) makes its partition the least recently used
    (`new_last=False`): in an index full in bytes, its tenant holding the most, that
    partition was the one to give way, the answer just added dropped at once, so no new
    conversation entered the index again. Another partition's oldest goes instead."""
    bound = 2**20
    vec = np.ones(384, dtype=np.float32) / np.sqrt(384)
    index = SemanticIndex(dim=384, capacity=10_000, max_bytes=bound)
    for i in range(600):
        index.partition(f"p{i % 20}", owner="a").add(f"k{i}", vec, _real_entry(f"k{i}", "a"),
                                                    "q")
    assert index.evicted_for_bytes > 0
    for n in range(3):
        index.partition(f"late{n}", new_last=False, owner="a").add(
            f"late{n}", vec, _real_entry(f"late{n}", "a"), "q")
        assert "late" + str(n) in index.partitions[f"late{n}"].entries
    assert index.bytes <= bound
    assert index.bytes == sum(p.bytes for p in index.partitions.values())


@pytest.mark.parametrize("text", ["😀" * 1000, "回答" * 700])  # 4 and 3 bytes a character
async def test_the_byte_bounds_count_bytes_not_characters(text: str) -> None:
    """L1's and the semantic index's bounds counted an entry's JSON in characters: an
    answer of 4-byte characters took four times `max_bytes_per_tenant` (and L1's, the
    index's `max_bytes`)."""
    s = CacheStore(CacheConfig.model_validate({"exact": {"max_bytes_per_tenant": 8192}}),
                   CacheMetrics(CollectorRegistry()), FakeEmbedder())  # type: ignore[arg-type]
    assert s.l1 is not None
    for i in range(20):
        e = replace(entry(f"k{i}", "acme"), choices=[
            {"index": 0, "text": text, "finish_reason": "stop"}])
        s.put(e, (f"p{i}", f"Question {i} {text[:50]}"))
    await s.drain()
    held = [e.to_json().encode() for e in s.l1.entries()]
    assert 0 < sum(map(len, held)) <= 8192 and s.l1.owned_bytes("acme") <= 8192
    q = f"Question {text[:50]}"
    assert entry_bytes(e, q) == len(e.to_json().encode()) + len(q.encode()) + ENTRY_OVERHEAD
    await s.close()
