"""Lazy vectors: a question no stored question's guard gate matches is not embedded, and
its answer's question is embedded once a lookup could use it or the gateway is idle."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from plugins.cache.config import CacheConfig
from plugins.cache.guard import ANY_GATE, DIGEST_MARK, gate, guard_digest, guard_ok
from plugins.cache.plugin import CachePlugin
from proxy.chain import Services
from proxy.settings import Settings
from proxy.telemetry import Metrics
from tests.fakes import FakeEmbedder, FakeEngine
from tests.unit.plugins.test_cache import ALICE, Engine, ctx, sample

DATA = Path(__file__).parents[2] / "data"


def pairs() -> list[tuple[str, str]]:
    """Every labelled pair: paraphrases and near misses of each kind."""
    out = []
    for name in ("semantic_pairs.yaml", "semantic_tune.yaml", "semantic_heldout.yaml"):
        doc = yaml.safe_load((DATA / name).read_text())
        near = doc["near_miss"]
        for group in [doc["paraphrase"], *(near.values() if isinstance(near, dict) else [near])]:
            out += [(a, b) for a, b in group]
    return out


def test_every_pair_the_guard_lets_through_shares_a_gate() -> None:
    """The gate is a necessary condition of the guard: skipping a lookup whose gate no
    entry has never loses a hit the guard would have allowed."""
    allowed = [(a, b) for a, b in pairs() if guard_ok(a, b)]
    assert len(allowed) > 100
    assert all(gate(a) == gate(b) for a, b in allowed)
    refused = [(a, b) for a, b in pairs() if gate(a) != gate(b)]
    assert refused and not any(guard_ok(a, b) for a, b in refused)


def test_a_digest_carries_its_gate_and_an_old_one_passes_any() -> None:
    q = "Cancel order 12345 for Alice"
    assert gate(guard_digest(q)) == gate(q) != gate("Cancel order 999 for Alice")
    assert gate(DIGEST_MARK + "0" * 64) == ANY_GATE  # stored before digests had gates


class Recording(FakeEmbedder):
    """Records each call's texts."""

    def __init__(self) -> None:
        super().__init__()
        self.texts: list[list[str]] = []

    async def embed(self, texts: list[str]) -> tuple[Any, list[int]]:
        self.texts.append(list(texts))
        return await super().embed(texts)


def lazy_plugin(**cfg: Any) -> tuple[CachePlugin, Recording]:
    emb = Recording()
    services = Services(terminal=FakeEngine(), settings=Settings(), metrics=Metrics(),
                        embedder=emb)  # type: ignore[arg-type]
    cfg = {"semantic": {"threshold": 0.8}, **cfg}
    return CachePlugin(CacheConfig.model_validate(cfg), services), emb


async def loop_turns(cond: Callable[[], bool]) -> bool:
    for _ in range(1000):  # bounded: a few loop turns
        if cond():
            return True
        await asyncio.sleep(0)
    return cond()


async def pending_is(p: CachePlugin, n: int) -> bool:
    """Whether `n` answers wait for their vectors (within a few loop turns)."""
    return await loop_turns(lambda: sample(p, "weir_cache_entries", layer="pending") == n)


class Busy:
    """A request held in flight, so the gateway is not idle until `release`."""

    def __init__(self, p: CachePlugin) -> None:
        self.gate = asyncio.Event()
        self.engine = Engine("Busy.", gate=self.gate)
        self.task = asyncio.create_task(p(ctx("busy", temperature=0.7), self.engine))

    async def start(self) -> Busy:
        await self.engine.entered.wait()
        return self

    async def release(self) -> None:
        self.gate.set()
        await self.task


async def test_under_load_a_question_nobody_shares_costs_no_embedding() -> None:
    p, emb = lazy_plugin()
    busy = await Busy(p).start()
    eng = Engine("Team 4411's invoice settings are under Billing.")
    reply = await p(ctx("How do I change the invoice settings for team 4411?"), eng)
    assert reply is not None and eng.calls == 1
    assert await pending_is(p, 1)
    assert emb.texts == [] and sample(p, "weir_cache_semantic_gated_total") == 1
    assert sample(p, "weir_cache_lookups_total", layer="semantic", result="miss") == 1
    # Another number: its gate is not held either, still nothing embedded.
    await p(ctx("How do I change the invoice settings for team 77?"), eng)
    assert await pending_is(p, 2)
    assert emb.texts == [] and sample(p, "weir_cache_semantic_gated_total") == 2
    # A paraphrase with the same number: its lookup embeds the pending question of its
    # gate alongside its own, and hits.
    c = ctx("How can I change invoice settings for team 4411?")
    await p(c, eng)
    assert c.response_headers["x-weir-cache"] == "semantic" and eng.calls == 2
    assert sorted(emb.texts) == [["How can I change invoice settings for team 4411?"],
                                 ["How do I change the invoice settings for team 4411?"]]
    assert sample(p, "weir_cache_entries", layer="pending") == 1  # team 77's still waits
    await busy.release()
    await p.close()


async def test_a_lookup_that_searches_twice_observes_one_similarity() -> None:
    p, _ = lazy_plugin()
    eng = Engine("Under Account, then Password.")
    await p(ctx("How do I reset my password?"), eng)
    await p.store.drain()
    assert len(p.store.index) == 1
    busy = await Busy(p).start()
    await p(ctx("How do I change the invoice settings for team 4411?"),
            Engine("Team 4411's invoice settings are under Billing."))
    assert await pending_is(p, 1)
    # Its own vector finds the password question (no hit), then the pending question of
    # its gate, embedded meanwhile, answers it: one lookup, one similarity observed.
    c = ctx("How can I change invoice settings for team 4411?")
    await p(c, eng)
    assert c.response_headers["x-weir-cache"] == "semantic"
    assert sample(p, "weir_cache_semantic_similarity_count") == 1
    assert sample(p, "weir_cache_lookups_total", layer="semantic", result="hit") == 1
    await busy.release()
    await p.close()


async def test_pending_questions_are_embedded_once_the_gateway_is_idle() -> None:
    p, emb = lazy_plugin()
    busy = await Busy(p).start()
    await p(ctx("What is the refund policy for order 5521?"), Engine())
    assert await pending_is(p, 1)
    assert emb.texts == []  # busy: it waits
    await busy.release()  # nothing in flight now
    assert await loop_turns(lambda: len(p.store.index) == 1)
    assert emb.texts == [["What is the refund policy for order 5521?"]]
    assert sample(p, "weir_cache_entries", layer="pending") == 0
    c = ctx("What is your refund policy for order 5521?")
    await p(c, Engine())
    assert c.response_headers["x-weir-cache"] == "semantic"
    await p.close()


async def test_a_question_whose_gate_is_held_is_looked_up_and_its_vector_reused() -> None:
    p, emb = lazy_plugin()
    await p(ctx("How do I reset my password?"), Engine())
    await p.store.drain()
    assert len(p.store.index) == 1 and len(emb.texts) == 1
    c = ctx("How do I delete my account?")  # the same (empty) gate: a real lookup
    await p(c, Engine("Settings, Account, Delete."))
    await p.store.drain()
    assert c.response_headers["x-weir-cache"] == "miss"
    assert len(emb.texts) == 2 and len(p.store.index) == 2  # embedded once, then stored
    assert sample(p, "weir_cache_semantic_gated_total") == 1  # the first: an empty index
    await p.close()


async def test_drain_embeds_what_waits_even_while_busy() -> None:
    p, emb = lazy_plugin()
    busy = await Busy(p).start()
    await p(ctx("Where is parcel 88123 now?"), Engine())
    await p.store.drain()
    assert len(p.store.index) == 1 and emb.texts == [["Where is parcel 88123 now?"]]
    await busy.release()
    await p.close()


async def test_the_owner_cap_counts_a_pending_entry_and_evicts_it_whole() -> None:
    p, emb = lazy_plugin(per_user_max_entries=1)
    busy = await Busy(p).start()
    await p(ctx("Where is parcel 88123 now?"), Engine())
    await p(ctx("Where is parcel 99321 now?"), Engine())
    await p.store.drain()
    assert p.store.l1 is not None
    keys = {e.prompt for e in p.store.l1.entries()}
    assert not any("88123" in k for k in keys) and any("99321" in k for k in keys)
    assert [q for _, q in p.store.index.partitions[next(iter(p.store.index.partitions))]
            .entries.values()] == ["Where is parcel 99321 now?"]
    assert all("88123" not in t for call in emb.texts for t in call)  # never embedded
    await busy.release()
    await p.close()


async def test_an_answer_pending_across_a_purge_is_never_indexed() -> None:
    p, _emb = lazy_plugin()
    busy = await Busy(p).start()
    await p(ctx("Where is parcel 88123 now?"), Engine())
    assert await pending_is(p, 1)
    await p.store.purge({"user": ALICE.user})
    assert not p.store._pending  # the question leaves memory with the purge
    await p.store.drain()
    assert len(p.store.index) == 0 and sample(p, "weir_cache_entries", layer="pending") == 0
    await busy.release()
    await p.close()


@pytest.mark.parametrize("cfg", [{"lazy": False}, {"guard": False}])
async def test_without_laziness_or_the_guard_every_miss_is_looked_up(
        cfg: dict[str, Any]) -> None:
    p, emb = lazy_plugin(semantic={"threshold": 0.8, **cfg})
    busy = await Busy(p).start()
    await p(ctx("Where is parcel 88123 now?"), Engine())
    assert await loop_turns(lambda: len(p.store.index) == 1)
    assert emb.texts == [["Where is parcel 88123 now?"]]  # looked up, the vector reused
    assert sample(p, "weir_cache_semantic_gated_total") == 0
    await busy.release()
    await p.close()


async def test_an_answer_stored_again_while_pending_replaces_the_pending_one() -> None:
    p, emb = lazy_plugin()
    busy = await Busy(p).start()
    for _ in range(2):
        await p(ctx("Where is parcel 88123 now?", headers={"cache-control": "no-cache"}),
                Engine())
    assert await pending_is(p, 1)
    assert len(p.store._gated) == 1 and sum(map(len, p.store._gated.values())) == 1
    await p.store.drain()
    assert len(p.store.index) == 1 and not p.store._gated
    assert emb.texts == [["Where is parcel 88123 now?"]]
    await busy.release()
    await p.close()


class SlowBatches(Recording):
    """One text at once; a batch (pending questions) only once `release` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()

    async def embed(self, texts: list[str]) -> tuple[Any, list[int]]:
        if len(texts) > 1:
            await self.release.wait()
        return await super().embed(texts)


async def test_a_lookup_is_not_held_up_by_the_pending_questions_it_embeds() -> None:
    emb = SlowBatches()
    services = Services(terminal=FakeEngine(), settings=Settings(), metrics=Metrics(),
                        embedder=emb)  # type: ignore[arg-type]
    p = CachePlugin(CacheConfig.model_validate(
        {"semantic": {"threshold": 0.8, "lookup_timeout_ms": 50}}), services)
    await p(ctx("How do I reset my password?"), Engine())
    await p.store.drain()  # indexed: the empty gate is held
    busy = await Busy(p).start()
    for q in ("How do I delete my account?", "How do I change my email address?"):
        # no-cache: no lookup, so no vector at hand: pending in the (held) empty gate
        await p(ctx(q, headers={"cache-control": "no-cache"}), Engine())
    assert await pending_is(p, 2)
    c = ctx("How can I reset my password?")
    await p(c, Engine())  # its lookup starts embedding both pending ones, which stall
    assert c.response_headers["x-weir-cache"] == "semantic"
    assert sample(p, "weir_cache_lookups_total", layer="semantic", result="timeout") == 0
    assert sample(p, "weir_cache_entries", layer="pending") == 2  # still being embedded
    emb.release.set()
    await p.store.drain()
    assert len(p.store.index) == 3 and not p.store._pending
    await busy.release()
    await p.close()


async def test_a_purge_of_someone_else_keeps_a_pending_answer_and_frees_the_owner() -> None:
    p, _ = lazy_plugin()
    busy = await Busy(p).start()
    await p(ctx("Where is parcel 88123 now?"), Engine())
    assert await pending_is(p, 1)
    await p.store.purge({"user": "somebody-else"})
    await p.store.drain()
    assert len(p.store.index) == 1  # not Alice's: it stays
    await p(ctx("Where is parcel 88124 now?"), Engine())
    assert await pending_is(p, 1)
    await p.store.purge({"user": ALICE.user})
    # Nothing of Alice's is counted any more: the pending answer's reserved member too.
    assert p.store.users.members((ALICE.tenant, ALICE.user)) == []
    await busy.release()
    await p.close()


def test_a_digest_stored_before_gates_still_passes_the_guard() -> None:
    import hashlib

    from plugins.cache.guard import _strict, signature

    q = "Cancel order 12345 for Alice"
    legacy = DIGEST_MARK + hashlib.sha256(repr(_strict(signature(q))).encode()).hexdigest()
    assert guard_ok(q, legacy) and not guard_ok("Cancel order 999 for Alice", legacy)


async def test_pending_questions_embedded_at_once_push_out_at_most_one_partition() -> None:
    p, _ = lazy_plugin(semantic={"threshold": 0.8, "max_partitions": 3})
    for n in (1, 2):  # two partitions in use (a parameter set makes its own partition)
        await p(ctx("How do I reset my password?", max_tokens=16 + n), Engine())
    await p.store.drain()
    in_use = list(p.store.index.partitions)
    assert len(in_use) == 2
    busy = await Busy(p).start()
    for n in range(10, 15):  # one-off questions in partitions of their own
        await p(ctx("Where is parcel 88123 now?", max_tokens=16 + n), Engine())
    await p.store.drain()  # embedded back to back
    assert set(in_use) <= set(p.store.index.partitions)
    await busy.release()
    await p.close()


async def test_a_miss_works_out_its_guard_features_once(monkeypatch: Any) -> None:
    """The question's gate found by its lookup is the one its pending entry and its
    index row keep: the guard's features (`signature`, ~20 us) are computed once per
    miss, not again when it is stored and when its vector joins the index."""
    from plugins.cache import guard

    calls: list[str] = []
    signature = guard.signature

    def counted(text: str) -> Any:
        calls.append(text)
        return signature(text)

    monkeypatch.setattr(guard, "signature", counted)
    p, emb = lazy_plugin()
    q = "What is the refund policy for order 5521?"
    await p(ctx(q), Engine())
    await p.store.drain()  # embedded and indexed
    assert len(p.store.index) == 1 and emb.texts == [[q]]
    assert calls == [q]
    assert p.store.index.partitions[next(iter(p.store.index.partitions))].gates[gate(q)] == 1
    await p.close()


async def test_the_idle_embedder_runs_in_no_request_s_context() -> None:
    """The task that embeds pending questions while the gateway is idle lives on, but was
    started by the request whose answer first waited for a vector and ran in its
    context: its log lines carried that request's id and its Redis writes joined that
    request's trace, long after it ended. It runs in a context of its own."""
    import structlog

    seen: list[dict[str, Any]] = []

    class Watching(Recording):
        async def embed(self, texts: list[str]) -> tuple[Any, list[int]]:
            seen.append(structlog.contextvars.get_contextvars())
            return await super().embed(texts)

    emb = Watching()
    services = Services(terminal=FakeEngine(), settings=Settings(), metrics=Metrics(),
                        embedder=emb)  # type: ignore[arg-type]
    p = CachePlugin(CacheConfig.model_validate({"semantic": {"threshold": 0.8}}), services)
    busy = await Busy(p).start()
    tokens = structlog.contextvars.bind_contextvars(request_id="req-first-pending")
    try:
        await p(ctx("What is the refund policy for order 5521?"), Engine())
    finally:
        structlog.contextvars.reset_contextvars(**tokens)
    assert await pending_is(p, 1)
    await busy.release()
    assert await loop_turns(lambda: len(p.store.index) == 1)
    assert seen and all("request_id" not in s for s in seen), seen
    await p.close()
