from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from proxy.app import create_app
from proxy.app_state import STATE
from tests.conftest import MakeClient, make_settings
from tests.fakes import FakeEngine, HoldingEngine
from tests.openai_spec import validate
from tests.sse import parse_sse
from tests.waiting import eventually

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}


async def test_draining_refuses_new_work_and_drain_waits_for_in_flight(
        make_client: MakeClient) -> None:
    engine = FakeEngine()
    engine.token_gate = asyncio.Event()
    client = await make_client(engine=engine)
    st = client.app[STATE]
    inflight = asyncio.create_task(client.post("/v1/chat/completions",
                                               json={**CHAT, "max_tokens": 3, "stream": True}))
    await engine.wait_until(lambda: bool(engine.active))
    st.draining = True
    r = await client.post("/v1/chat/completions", json=CHAT)
    assert r.status == 503 and (await r.json())["error"]["code"] == "shutting_down"
    ready = await client.get("/health/ready")
    assert ready.status == 503 and (await ready.json())["status"] == "draining"
    assert not await st.drain(0.05)  # still one in flight
    engine.token_gate.set()
    resp = await inflight
    assert (await resp.text()).endswith("data: [DONE]\n\n")
    assert await st.drain(5)


async def test_abort_all_cancels_stragglers(make_client: MakeClient) -> None:
    engine = FakeEngine()
    engine.token_gate = asyncio.Event()
    client = await make_client(engine=engine)
    st = client.app[STATE]
    task = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT))
    await engine.wait_until(lambda: bool(engine.active))
    assert await st.abort_all() == 1
    await engine.wait_until(lambda: not engine.active)
    assert engine.aborted
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_engine_start_failure_is_reported(aiohttp_client) -> None:  # type: ignore[no-untyped-def]
    class Broken(FakeEngine):
        async def start(self) -> None:
            raise RuntimeError("no GPU")

    fatal: list[BaseException] = []
    engine = Broken(ready=False)
    app = create_app(make_settings(), engine=engine, on_fatal=fatal.append)
    client = await aiohttp_client(app)
    await asyncio.wait_for(client.app[STATE].engine_settled.wait(), 5)
    body = await (await client.get("/health/ready")).json()
    assert body["status"] == "failed" and len(fatal) == 1


SECRET = "sk-SECRET-0123456789"


def logged(logs: Any, event: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in logs.getvalue().splitlines() if line.strip()]
    return [line for line in lines if line["event"] == event]


async def test_an_engine_that_fails_to_start_logs_no_exception_message(
        aiohttp_client: Any, logs: Any) -> None:
    """The line said the exception's message, which may quote a secret (an upstream's
    URL with its credentials, a token, a private path): it names the error's type and
    where it was raised, as every other unexpected error's line does."""
    class Broken(FakeEngine):
        async def start(self) -> None:
            raise RuntimeError(f"cannot reach https://weir:{SECRET}@models.internal/x")

    app = create_app(make_settings(), engine=Broken(ready=False))
    client = await aiohttp_client(app)
    await asyncio.wait_for(client.app[STATE].engine_settled.wait(), 5)
    failed = logged(logs, "engine failed to start")
    assert len(failed) == 1 and failed[0]["error"] == "RuntimeError", failed
    assert "test_lifecycle.py" in failed[0]["at"]
    assert SECRET not in logs.getvalue() and "models.internal" not in logs.getvalue()


async def test_an_embedding_model_that_cannot_load_is_fatal_or_a_503(
        aiohttp_client) -> None:  # type: ignore[no-untyped-def]
    settings = make_settings(embeddings={"enabled": True, "model": "/nonexistent/emb"})
    fatal: list[BaseException] = []
    reported = asyncio.Event()

    def on_fatal(e: BaseException) -> None:
        fatal.append(e)
        reported.set()

    await aiohttp_client(create_app(settings, engine=FakeEngine(), on_fatal=on_fatal))
    await asyncio.wait_for(reported.wait(), 30)  # `weir serve` exits saying why
    assert isinstance(fatal[0], FileNotFoundError) and "embeddings.model" in str(fatal[0])
    client = await aiohttp_client(create_app(settings, engine=FakeEngine()))
    r = await client.post("/v1/embeddings", json={"model": "all-MiniLM-L6-v2", "input": "hi"})
    assert r.status == 503
    assert (await r.json())["error"]["code"] == "model_unavailable"


async def test_engine_is_closed_on_cleanup(aiohttp_client) -> None:  # type: ignore[no-untyped-def]
    engine = FakeEngine()
    client = await aiohttp_client(create_app(make_settings(), engine=engine))
    await client.app[STATE].engine_settled.wait()
    assert engine.started
    await client.close()
    assert engine.closed


def test_the_app_keeps_numpys_blas_to_one_thread() -> None:
    """Split over a thread per core, the semantic search waits on a core the engine
    holds (proxy/loop.py)."""
    from threadpoolctl import threadpool_info, threadpool_limits

    threadpool_limits(2, user_api="blas")  # what OpenBLAS starts with on 2 cores
    create_app(make_settings(), engine=FakeEngine())
    blas = [p for p in threadpool_info() if p["user_api"] == "blas"]
    assert blas and all(p["num_threads"] == 1 for p in blas)


ROUTES = {
    "chat": ("/v1/chat/completions", CHAT),
    "completions": ("/v1/completions", {"model": "fake-model", "prompt": "hi"}),
    "responses": ("/v1/responses", {"model": "fake-model", "input": "hi"}),
}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("route", list(ROUTES))
async def test_a_drain_ending_before_the_first_byte_answers_503(
        make_client: MakeClient, route: str, stream: bool) -> None:
    """Requests still waiting at the end of a drain, for the engine or for an admission
    slot, get the 503 `shutting_down` a request arriving during the drain gets (they had
    no byte yet: a real status is still possible), not a dropped connection."""
    engine = FakeEngine()
    engine.token_gate = asyncio.Event()
    client = await make_client(engine=engine, plugins=[
        {"name": "admission", "config": {"max_concurrent": 1, "max_queue": 4}}])
    st = client.app[STATE]
    path, body = ROUTES[route]
    body = {**body, "stream": stream}
    running = asyncio.create_task(client.post(path, json=body))
    await engine.wait_until(lambda: bool(engine.active))
    queued = asyncio.create_task(client.post(path, json=body))
    await eventually(lambda: st.in_flight == 2)
    st.draining = True
    assert await st.abort_all() == 2
    for task in (running, queued):
        r = await task
        assert r.status == 503
        error = (await r.json())["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["code"] == "shutting_down"
    await engine.wait_until(lambda: not engine.active)
    assert st.metrics.registry.get_sample_value(
        "weir_requests_aborted_total", {"reason": "client_gone"}) in (None, 0.0)


async def test_a_responses_stream_cut_by_a_drain_ends_with_its_own_events(
        make_client: MakeClient) -> None:
    """Cut mid-stream at the end of a drain, a Responses stream ends as the Responses API
    ends a failed one: a typed `error` event (`shutting_down`) with the next sequence
    number, then `response.failed`; no chat-style `{"error": ...}` and no `[DONE]`."""
    engine = HoldingEngine()
    client = await make_client(engine=engine)
    st = client.app[STATE]
    r = await client.post("/v1/responses", json={**ROUTES["responses"][1], "stream": True,
                                                 "max_output_tokens": 32})
    assert r.status == 200
    head = b""
    async with asyncio.timeout(10):
        while b"response.output_text.delta" not in head:
            head += await r.content.readany()
        assert await st.abort_all() == 1
        text = (head + await r.content.read()).decode()
    events, done = parse_sse(text)
    assert not done
    for e in events:
        validate("ResponseStreamEvent", e)
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    assert events[-2]["code"] == "shutting_down"
    assert events[-1]["response"]["status"] == "failed"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


async def test_a_client_gone_is_counted_once_per_request(make_client: MakeClient) -> None:
    """The stream writer sees the client go (a write fails), then aiohttp's handler
    cancellation reaches the route: one abort, not two."""
    from aiohttp.test_utils import make_mocked_request

    from proxy.inflight import count_abort, generating

    client = await make_client()
    st = client.app[STATE]

    def aborted() -> float:
        return st.metrics.registry.get_sample_value(
            "weir_requests_aborted_total", {"reason": "client_gone"}) or 0.0

    for writer_saw_it in (True, False):
        request = make_mocked_request("POST", "/v1/chat/completions")
        before = aborted()
        with pytest.raises(asyncio.CancelledError), generating(st, request):
            if writer_saw_it:
                count_abort(st, request, "client gone")
            raise asyncio.CancelledError()
        assert aborted() == before + 1


async def test_a_stream_cut_by_the_shutdown_is_counted_as_the_servers_not_the_clients(
        make_client: MakeClient) -> None:
    """A stream the drain's end cut was recorded as 499 (client closed), as if its client
    had left: it is the server's 503 (`shutting_down`, told in-band)."""
    client = await make_client(engine=FakeEngine(delay=0.05))
    st = client.app[STATE]
    r = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 500,
                                                        "stream": True})
    assert r.status == 200
    await r.content.readline()  # the stream is under way
    st.draining = True
    assert await st.abort_all() == 1
    events, done = parse_sse(await r.text())
    assert done and events[-1]["error"]["code"] == "shutting_down"
    metrics = st.metrics.registry
    labels = {"route": "chat", "model": "fake-model"}
    await eventually(lambda: metrics.get_sample_value(
        "weir_requests_total", {**labels, "status": "503"}) == 1)
    assert metrics.get_sample_value("weir_requests_total", {**labels, "status": "499"}) is None


@pytest.mark.parametrize("route", ["chat", "responses", "embeddings"])
async def test_a_drain_waits_for_a_request_still_sending_its_body(
        make_client: MakeClient, route: str) -> None:
    """A generation request let in before the drain began, its body still arriving: the
    drain saw nothing in flight (it was tracked only once its body was read), ended, and
    the request ran into the shutdown (its connection dropped). The drain waits for it
    now, and it is answered; cut at the drain's end, it gets the 503 `shutting_down`."""
    from proxy import embeddings_api
    from proxy.chain import compose
    from tests.fakes import FakeEmbedder

    client = await make_client()
    st = client.app[STATE]
    st.embedder = FakeEmbedder()
    st.embed_chain = compose([], embeddings_api.terminal(st.embedder))
    path, body = ({"embeddings": ("/v1/embeddings", {"model": "fake-embedder", "input": "hi"})}
                  | ROUTES)[route]
    raw = json.dumps(body).encode()
    for cut in (False, True):
        arrived = asyncio.Event()

        async def slowly(arrived: asyncio.Event) -> Any:
            yield raw[:10]
            await arrived.wait()
            yield raw[10:]

        post = asyncio.create_task(client.post(
            path, data=slowly(arrived), headers={"Content-Type": "application/json"}))
        await eventually(lambda: st.in_flight == 1)
        st.draining = True
        assert not await st.drain(0.1)  # still sending its body: in flight
        if cut:
            assert await st.abort_all() == 1
        arrived.set()
        r = await post
        assert r.status == (503 if cut else 200), await r.text()
        if cut:
            assert (await r.json())["error"]["code"] == "shutting_down"
        await r.read()
        assert await st.drain(1)
        st.draining = False
