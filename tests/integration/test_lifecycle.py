from __future__ import annotations

import asyncio

from proxy.app import create_app
from proxy.app_state import STATE
from tests.conftest import MakeClient, make_settings
from tests.fakes import FakeEngine

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
