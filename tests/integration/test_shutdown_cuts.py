"""Streams cut at the end of a drain (`AppState.abort_all`) at awkward moments: while a
write waits on a slow reader, mid-batch, while a replay's events are held, while an error
event is being written. Each ends once, in its route's framing, with nothing lost or
repeated. (A review's repros.)"""

from __future__ import annotations

import asyncio
from typing import Any

from proxy import streaming
from proxy.app_state import STATE
from tests.conftest import MakeClient, make_settings
from tests.fakes import FakeEngine
from tests.openai_spec import validate
from tests.sse import parse_sse
from tests.waiting import eventually

BASE = {"model": "fake-model", "input": "hi", "max_output_tokens": 16, "stream": True}


def block_write_containing(monkeypatch: Any, marker: bytes) -> asyncio.Event:
    """The write carrying `marker` is handed to the transport (as aiohttp does), then
    waits, as a write to a slow reader waits for the transport to drain."""
    blocked = asyncio.Event()
    orig = streaming._Watchdog.write

    async def write(self: Any, data: bytes, body: bool = True) -> None:
        await orig(self, data, body)
        if marker in data and not blocked.is_set():
            blocked.set()
            await asyncio.Event().wait()

    monkeypatch.setattr(streaming._Watchdog, "write", write)
    return blocked


async def cut(client: Any, blocked: asyncio.Event, r: Any) -> list[dict[str, Any]]:
    st = client.app[STATE]
    async with asyncio.timeout(10):
        await blocked.wait()
        st.draining = True
        assert await st.abort_all() == 1
        text = (await r.read()).decode()
    events, done = parse_sse(text)
    assert not done  # the Responses stream has no [DONE]
    for e in events:
        validate("ResponseStreamEvent", e)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


async def test_a_response_already_ended_gets_nothing_after_its_end(
        make_client: MakeClient, monkeypatch: Any) -> None:
    blocked = block_write_containing(monkeypatch, b'"response.incomplete"')
    client = await make_client()
    events = await cut(client, blocked, await client.post("/v1/responses", json=BASE))
    assert events[-1]["type"] == "response.incomplete"
    assert not any(e["type"] in ("error", "response.failed") for e in events)


async def test_a_cut_mid_batch_leaves_no_gap_in_the_sequence(
        make_client: MakeClient, monkeypatch: Any) -> None:
    """The cut lands while `output_item.added` drains; the events made with it (its
    content part, the first delta) never went out and take no number."""
    blocked = block_write_containing(monkeypatch, b'"response.output_item.added"')
    client = await make_client()
    events = await cut(client, blocked, await client.post("/v1/responses", json=BASE))
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    assert events[-2]["code"] == "shutting_down"
    # The failed response is kept, as one that failed in the engine is.
    from proxy.openai_responses import routes

    store = client.app[routes.STORE]
    rid = events[-1]["response"]["id"]
    await eventually(lambda: len(store) == 1)
    record = await store.get("public", rid)
    assert record is not None and record["response"] == events[-1]["response"]


async def test_a_replay_cut_while_its_events_are_held_still_sends_them(
        make_client: MakeClient, monkeypatch: Any) -> None:
    """A cached answer replayed as Response events is written in one go at its end; a
    drain ending while the response store is slow sends the events held so far, then
    its own end (decided before the cut, as a failure's is): the stream still begins
    with `response.created` and ends with the replayed answer's terminal event."""
    from proxy.openai_responses import routes

    client = await make_client(make_settings(plugins=[{"name": "cache", "config": {
        "semantic": {"enabled": False}, "store_truncated": True}}]))
    req = {**BASE, "temperature": 0}
    r = await client.post("/v1/responses", json=req)
    assert r.status == 200
    await r.read()  # stored: the next one is a whole replay
    store = client.app[routes.STORE]
    held = asyncio.Event()

    async def put(self: Any, *a: Any, **k: Any) -> None:
        held.set()
        await asyncio.Event().wait()  # a slow store (Redis) when the drain ends

    monkeypatch.setattr(type(store), "put", put)
    events = await cut(client, held, await client.post("/v1/responses", json=req))
    assert events[0]["type"] == "response.created"
    assert events[-1]["type"] in ("response.completed", "response.incomplete")
    assert "error" not in [e["type"] for e in events]
    for e in events:
        validate("ResponseStreamEvent", e)


async def test_a_chat_stream_cut_while_its_error_drains_has_one_error(
        monkeypatch: Any) -> None:
    from aiohttp import ClientSession
    from aiohttp.test_utils import TestServer

    from tests.unit.test_streaming import OneStream

    blocked = block_write_containing(monkeypatch, b'"error"')

    async def source() -> Any:
        yield {"n": 0}
        await asyncio.sleep(0)
        raise RuntimeError("boom")

    one = OneStream(source)
    async with TestServer(one.app) as server, ClientSession() as session:
        async with session.get(server.make_url("/")) as r:
            async with asyncio.timeout(10):
                await blocked.wait()
                one.handler[0].cancel(streaming.SHUTDOWN)
                body = await r.read()
    assert body.count(b'"error"') == 1 and body.endswith(b"data: [DONE]\n\n")


async def test_embeddings_waiting_for_a_slot_at_the_drain_end_get_503(
        make_client: MakeClient) -> None:
    engine = FakeEngine()
    engine.token_gate = asyncio.Event()
    client = await make_client(engine=engine, embeddings={"enabled": True}, plugins=[
        {"name": "admission", "config": {"max_concurrent": 1, "max_queue": 4}}])
    st = client.app[STATE]
    await st.embedder.ready()
    running = asyncio.create_task(client.post("/v1/chat/completions", json={
        "model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}))
    await engine.wait_until(lambda: bool(engine.active))
    admission = next(p for p in st.plugins if p.name == "admission")
    await admission.embed_gate.acquire(0, None)  # type: ignore[attr-defined]
    # (embeddings wait for a slot of their own, the only one taken)
    queued = asyncio.create_task(client.post("/v1/embeddings", json={
        "model": "all-MiniLM-L6-v2", "input": "hi"}))
    await eventually(lambda: st.in_flight == 2)
    st.draining = True
    assert await st.abort_all() == 2
    for task in (running, queued):
        r = await task
        assert r.status == 503 and (await r.json())["error"]["code"] == "shutting_down"
    admission.embed_gate.release()  # type: ignore[attr-defined]
    # and one arriving during the drain is sent elsewhere, as a chat request is
    r = await client.post("/v1/embeddings", json={"model": "all-MiniLM-L6-v2", "input": "hi"})
    assert r.status == 503 and (await r.json())["error"]["code"] == "shutting_down"


async def test_a_response_cut_while_its_own_failure_goes_out_fails_once(
        make_client: MakeClient, monkeypatch: Any) -> None:
    """The engine failed mid-stream and the failure's `error` event is being written
    when the drain ends: the rest of that failure (`response.failed`) goes out, not a
    second `error` and failure of the shutdown's own."""
    engine = FakeEngine()
    engine.fail_after = 3
    blocked = block_write_containing(monkeypatch, b"event: error")
    client = await make_client(engine=engine)
    events = await cut(client, blocked, await client.post("/v1/responses", json=BASE))
    types = [e["type"] for e in events]
    assert types.count("error") == 1 and types[-2:] == ["error", "response.failed"]
    assert events[-2]["code"] != "shutting_down"  # the engine's failure, not the drain's


async def test_a_response_cut_while_its_failure_is_stored_fails_once(
        make_client: MakeClient, monkeypatch: Any) -> None:
    """The drain ends while the failed response is being stored (a slow Redis): its
    `response.failed` still goes out, once, after the one `error`."""
    from proxy.openai_responses import routes

    engine = FakeEngine()
    engine.fail_after = 3
    client = await make_client(engine=engine)
    held = asyncio.Event()

    async def put(self: Any, *a: Any, **k: Any) -> None:
        held.set()
        await asyncio.Event().wait()

    monkeypatch.setattr(type(client.app[routes.STORE]), "put", put)
    events = await cut(client, held, await client.post("/v1/responses", json=BASE))
    types = [e["type"] for e in events]
    assert types.count("error") == 1 and types[-2:] == ["error", "response.failed"]



async def test_a_stream_cut_mid_answer_is_stored_as_it_ended(
        make_client: MakeClient) -> None:
    """The drain ends while a stream waits for its next token: its generator, closed,
    stores the response `cancelled`, and the writer's `response.failed` stores it
    `failed`, two writes at once: the first one slower (on Redis, a connection being
    opened), the record ended `cancelled` though its stream said `failed`. The failure's
    write goes after the cut's: the record is what the stream said."""
    from proxy.openai_responses import routes
    from proxy.openai_responses.events import saves_settled
    from tests.fakes import HoldingEngine

    engine = HoldingEngine(after=2)
    client = await make_client(engine=engine)
    store = client.app[routes.STORE]
    replace, slow = store.replace, asyncio.Event()

    async def racing(tenant: str, rid: str, record: Any, *a: Any, **k: Any) -> Any:
        if record["response"]["status"] == "cancelled":
            await slow.wait()  # (until the next write starts, or the stream was read)
        else:
            slow.set()
        return await replace(tenant, rid, record, *a, **k)

    store.replace = racing  # type: ignore[method-assign]
    r = await client.post("/v1/responses", json=BASE)
    assert r.status == 200
    await engine.wait_until(lambda: engine.held == 1)
    st = client.app[STATE]
    st.draining = True
    assert await st.abort_all() == 1
    events, _ = parse_sse((await r.read()).decode())
    slow.set()
    await saves_settled(10)
    assert [e["type"] for e in events][-2:] == ["error", "response.failed"]
    record = await store.get("public", events[-1]["response"]["id"])
    assert record is not None and record["response"] == events[-1]["response"]
