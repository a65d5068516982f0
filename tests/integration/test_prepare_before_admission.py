"""A long prompt is prepared (rendered, tokenized) in the one preparing thread before
admission gives it an engine permit: waiting there behind other long prompts, it held a
permit the engine could have given a short request meanwhile."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from proxy.app_state import STATE
from proxy.serving import OFF_LOOP_CHARS, LocalServing
from tests.conftest import MakeClient
from tests.fakes import FakeEngine
from tests.waiting import eventually


def _chat(text: str) -> dict[str, object]:
    return {"model": "fake-model", "max_tokens": 2,
            "messages": [{"role": "user", "content": text}]}


async def test_a_long_prompt_waiting_to_be_prepared_holds_no_engine_permit(
        make_client: MakeClient) -> None:
    client = await make_client(engine=FakeEngine(max_model_len=4 * OFF_LOOP_CHARS),
                               plugins=[{"name": "admission", "config": {
                                   "max_concurrent": 1, "max_queue_wait_s": 0.5}}])
    serving = client.app[STATE].terminal
    assert isinstance(serving, LocalServing)
    hold = threading.Event()
    busy = serving._preparing.submit(hold.wait, 30)  # another long prompt, being prepared
    try:
        long = asyncio.ensure_future(client.post("/v1/chat/completions",
                                                 json=_chat("x" * OFF_LOOP_CHARS)))
        await eventually(lambda: serving._preparing._work_queue.qsize() == 1, timeout=10)
        r = await client.post("/v1/chat/completions", json=_chat("short"))
        assert r.status == 200, await r.text()  # (was 503: no engine slot in time)
    finally:
        hold.set()
    r = await long
    assert r.status == 200, await r.text()
    assert busy.result() is True


async def test_long_prompts_waiting_to_be_prepared_count_against_the_queue(
        make_client: MakeClient) -> None:
    # The wait list's bound sheds at once what it cannot hold: long prompts waiting for
    # the preparing thread ahead of it were not counted, so a burst of them all waited
    # there (till their deadline), none shed.
    client = await make_client(engine=FakeEngine(max_model_len=4 * OFF_LOOP_CHARS),
                               plugins=[{"name": "admission", "config": {
                                   "max_concurrent": 1, "max_queue": 1}}])
    serving = client.app[STATE].terminal
    assert isinstance(serving, LocalServing)
    hold = threading.Event()
    busy = serving._preparing.submit(hold.wait, 30)  # another long prompt, being prepared
    try:
        burst = [asyncio.ensure_future(client.post("/v1/chat/completions",
                                                   json=_chat("x" * OFF_LOOP_CHARS)))
                 for _ in range(4)]
        await eventually(lambda: any(t.done() for t in burst), timeout=10)
        shed = [t.result() for t in burst if t.done()]
        assert [r.status for r in shed] == [503]
        assert (await shed[0].json())["error"]["code"] == "overloaded"
    finally:
        hold.set()
    statuses = [(await t).status for t in burst]  # (one ahead, one permit, one queued;
    assert set(statuses) == {200, 503}  # the one ahead may find the list full after)
    assert statuses.count(200) >= 2
    assert busy.result() is True


async def test_only_a_long_prompt_is_prepared_ahead_and_timed_there(
        make_client: MakeClient, monkeypatch: Any) -> None:
    """Admission calls the terminal's `prepare` for what it has to prepare ahead (a long
    prompt), inside a deadline scope; a short prompt, which it would return from at once,
    costs neither the call nor the scope (a loop timer set and cancelled per request).
    Both are answered alike."""
    from proxy import context

    client = await make_client(engine=FakeEngine(max_model_len=4 * OFF_LOOP_CHARS),
                               plugins=[{"name": "admission", "config": {}}])
    serving = client.app[STATE].terminal
    assert isinstance(serving, LocalServing)
    prepared: list[bool] = []
    scopes: list[float | None] = []
    real_prepare, real_within = serving.prepare, context.Within.__init__

    async def prepare(ctx: Any) -> None:
        await real_prepare(ctx)
        prepared.append(ctx.prepared is not None)

    def within(self: Any, deadline: float | None, *args: Any) -> None:
        scopes.append(deadline)
        real_within(self, deadline, *args)

    monkeypatch.setattr(serving, "prepare", prepare)
    monkeypatch.setattr(context.Within, "__init__", within)
    r = await client.post("/v1/chat/completions", json=_chat("short"))
    assert r.status == 200, await r.text()
    assert prepared == []
    short_scopes = len(scopes)
    r = await client.post("/v1/chat/completions", json=_chat("x" * OFF_LOOP_CHARS))
    assert r.status == 200, await r.text()
    assert prepared == [True]
    assert len(scopes) == 2 * short_scopes + 1  # (the long one's preparing scope besides)
