"""Coalescing when the leader's client goes away: one waiter takes over the generation
and the others are answered by it (not one regeneration per waiter)."""

from __future__ import annotations

import asyncio

from proxy.chain import Completion, Reply
from proxy.context import RequestContext
from tests.unit.plugins.test_cache import answer, ctx, l1_misses, plugin, sample
from tests.waiting import eventually


async def test_an_abandoned_lead_is_handed_to_one_waiter() -> None:
    p = plugin(semantic={"enabled": False})
    calls = 0
    first_entered = asyncio.Event()
    hold = asyncio.Event()
    takeover = asyncio.Event()

    async def engine(c: RequestContext) -> Reply:
        nonlocal calls
        calls += 1
        if calls == 1:
            first_entered.set()
            await asyncio.Event().wait()  # the leader hangs until its client leaves
        takeover.set()
        await hold.wait()
        return Completion(answer())

    leader = asyncio.create_task(p(ctx(), engine))
    await first_entered.wait()
    waiters = [asyncio.create_task(p(ctx(), engine)) for _ in range(5)]
    await eventually(lambda: l1_misses(p) == 6)  # all five joined the leader
    leader.cancel()  # its client hangs up
    await takeover.wait()  # one waiter generates in its place ...
    assert calls == 2 and not any(w.done() for w in waiters)  # ... the others wait on it
    hold.set()
    replies = await asyncio.gather(*waiters)
    assert calls == 2
    assert all(r.body["choices"][0]["message"]["content"] == "Use the reset link."
               for r in replies)  # type: ignore[union-attr]
    assert sample(p, "weir_cache_coalesced_total") == 4
