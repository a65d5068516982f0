"""Clients that go away or stop reading must not leave work running in the engine."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import MakeClient, make_settings
from tests.fakes import FakeEngine
from tests.metrics import metric

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
#: A long stream on each generation route (a client hangs up in the middle of it).
LONG_STREAMS = [("/v1/chat/completions", {**CHAT, "max_tokens": 400, "stream": True}),
                ("/v1/completions", {"model": "fake-model", "prompt": "hi",
                                     "max_tokens": 400, "stream": True}),
                ("/v1/responses", {"model": "fake-model", "input": "hi",
                                   "max_output_tokens": 400, "stream": True})]


async def metrics_once(client: Any, ready: Callable[[str], bool]) -> str:
    """`/metrics` once `ready` holds of it, or after 500 reads: the writer and the access
    log count a request after the engine stopped, so poll, bounded."""
    for _ in range(500):
        text: str = await (await client.get("/metrics")).text()
        if ready(text):
            break
    return text


async def test_abandoned_requests_abort_their_generations(make_client: MakeClient) -> None:
    engine = FakeEngine(delay=0.01)
    client = await make_client(engine=engine)
    for i in range(50):
        body = {**CHAT, "max_tokens": 400, "stream": i % 2 == 0}
        task = asyncio.create_task(client.post("/v1/chat/completions", json=body))
        await engine.wait_until(lambda: len(engine.active) == 1)
        if body["stream"]:
            resp = await task
            await resp.content.readuntil(b"\n\n")  # first chunk arrived, then hang up
            resp.close()
        else:
            task.cancel()  # hang up while the whole answer is being generated
            await asyncio.gather(task, return_exceptions=True)
        await engine.wait_until(lambda: not engine.active)
    assert len(engine.aborted) == 50
    engine.delay = 0
    r = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 3})
    assert r.status == 200 and (await r.json())["choices"][0]["finish_reason"] == "length"


async def test_disconnect_while_waiting_for_first_token(make_client: MakeClient) -> None:
    engine = FakeEngine()
    engine.token_gate = asyncio.Event()  # the engine never produces a token
    client = await make_client(engine=engine)
    task = asyncio.create_task(client.post("/v1/chat/completions",
                                           json={**CHAT, "stream": True}))
    await engine.wait_until(lambda: len(engine.active) == 1)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await engine.wait_until(lambda: not engine.active)
    assert len(engine.aborted) == 1


async def test_stalled_reader_is_cut_off(make_client: MakeClient) -> None:
    """A client that sends a request and never reads: the write timeout ends it."""
    engine = FakeEngine()
    client = await make_client(engine=engine, server={"write_timeout_s": 0.5})
    body = json.dumps({**CHAT, "stream": True, "max_tokens": 200_000, "logprobs": True,
                       "top_logprobs": 20}).encode()
    # fake_engine.max_model_len must allow that many tokens
    engine._max_model_len = 300_000
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (client.host, client.port))
    await loop.sock_sendall(sock, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                            b"Content-Type: application/json\r\n"
                            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    try:
        await engine.wait_until(lambda: len(engine.active) == 1)
        await engine.wait_until(lambda: not engine.active, timeout=30)  # never read a byte
        assert len(engine.aborted) == 1
    finally:
        sock.close()
    r = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 2})
    assert r.status == 200
    # counted as the server's cut of a stalled reader, not as a client that left
    text = await metrics_once(client, lambda t: metric(t, "weir_requests_total",
                                                       route="chat", status="499") >= 1)
    assert metric(text, "weir_requests_aborted_total", reason="write_timeout") == 1
    assert metric(text, "weir_requests_aborted_total", reason="client_gone") == 0
    assert metric(text, "weir_requests_total", route="chat", status="499") == 1


@pytest.mark.parametrize("route", ["chat", "responses"])
async def test_a_stream_cut_by_its_deadline_is_counted_as_the_504_it_sent(
        make_client: MakeClient, route: str) -> None:
    """Its head said 200; the in-band 504 is what it ended with, and what the request
    metrics count (an error-rate alert sees it), on every streaming route."""
    engine = FakeEngine(delay=0.02)
    client = await make_client(make_settings(plugins=[{"name": "admission"}]), engine=engine)
    path, body = (("/v1/chat/completions", {**CHAT, "max_tokens": 400, "stream": True})
                  if route == "chat" else
                  ("/v1/responses", {"model": "fake-model", "input": "hi", "stream": True,
                                     "max_output_tokens": 400}))
    r = await client.post(path, json=body, headers={"x-weir-timeout-ms": "300"})
    assert r.status == 200
    text = await r.text()
    assert '"code":"timeout"' in text.replace(" ", "")
    metrics = await metrics_once(client, lambda t: metric(t, "weir_requests_total",
                                                          route=route, status="504") >= 1)
    assert metric(metrics, "weir_requests_total", route=route, status="504") == 1
    assert metric(metrics, "weir_requests_total", route=route, status="200") == 0


@pytest.mark.parametrize("route", ["chat", "responses"])
async def test_a_stream_its_engine_failed_is_counted_as_the_502_it_sent(
        make_client: MakeClient, route: str) -> None:
    engine = FakeEngine()
    engine.fail_after = 3
    client = await make_client(engine=engine)
    path, body = (("/v1/chat/completions", {**CHAT, "max_tokens": 40, "stream": True})
                  if route == "chat" else
                  ("/v1/responses", {"model": "fake-model", "input": "hi", "stream": True,
                                     "max_output_tokens": 40}))
    r = await client.post(path, json=body)
    assert r.status == 200 and "error" in await r.text()
    metrics = await metrics_once(client, lambda t: metric(t, "weir_requests_total",
                                                          route=route, status="502") >= 1)
    assert metric(metrics, "weir_requests_total", route=route, status="502") == 1
    assert metric(metrics, "weir_requests_total", route=route, status="200") == 0


async def test_clients_gone_are_counted_on_every_generation_route(
        make_client: MakeClient) -> None:
    """`weir_requests_aborted_total{reason="client_gone"}` moves for a chat stream, a
    completion and a Responses stream whose clients hang up mid-answer."""
    from tests.metrics import metric

    engine = FakeEngine(delay=0.01)
    client = await make_client(engine=engine)
    for i, (path, body) in enumerate(LONG_STREAMS, 1):
        resp = await client.post(path, json=body)
        await resp.content.readuntil(b"\n\n")  # the first event arrived, then hang up
        resp.close()
        await engine.wait_until(lambda: not engine.active)
        text = await metrics_once(client, lambda t, i=i: metric(
            t, "weir_requests_aborted_total", reason="client_gone") >= i)
        assert metric(text, "weir_requests_aborted_total", reason="client_gone") == i, path


async def test_tokens_of_a_stream_whose_client_left_are_counted_on_every_route(
        make_client: MakeClient) -> None:
    """What a cut stream generated was spent: `weir_tokens_total` moves for it (and the
    access log has its counts) on chat, completions and the Responses API alike."""
    from tests.metrics import metric

    engine = FakeEngine(delay=0.01)
    client = await make_client(engine=engine)
    for path, body in LONG_STREAMS:
        text = await (await client.get("/metrics")).text()
        before = metric(text, "weir_tokens_total", kind="prompt")
        resp = await client.post(path, json=body)
        await resp.content.readuntil(b"\n\n")  # the first event arrived, then hang up
        resp.close()
        await engine.wait_until(lambda: not engine.active)
        text = await metrics_once(client, lambda t, b=before: metric(
            t, "weir_tokens_total", kind="prompt") > b)
        assert metric(text, "weir_tokens_total", kind="prompt") > before, path


async def test_gaps_of_a_stream_whose_client_left_are_observed_on_every_route(
        make_client: MakeClient) -> None:
    """A stream's inter-token gaps are held and added in batches (of 256): a stream cut
    by its client's leaving, well short of a batch, adds what it held as it ends."""
    engine = FakeEngine(delay=0.01)
    client = await make_client(engine=engine)
    for route, (path, body) in zip(("chat", "completion", "responses"), LONG_STREAMS,
                                   strict=True):
        resp = await client.post(path, json=body)
        seen = b""
        while seen.count(b"\n\n") < 6:  # a few events arrived, then hang up
            seen += await resp.content.readuntil(b"\n\n")
        resp.close()
        await engine.wait_until(lambda: not engine.active)
        text = await metrics_once(client, lambda t, r=route: metric(
            t, "weir_inter_token_latency_seconds_count", route=r) > 0)
        assert metric(text, "weir_inter_token_latency_seconds_count", route=route) > 0, path


@pytest.mark.parametrize("route", ["chat", "responses"])
async def test_a_whole_answer_cut_by_its_deadline_counts_the_tokens_it_spent(
        make_client: MakeClient, route: str) -> None:
    """The engine read its prompt and generated until the deadline (the rate limiter
    charges it): `weir_tokens_total` counts them, as a cut stream's are counted (a whole
    answer's were not)."""
    engine = FakeEngine(delay=0.02)
    client = await make_client(make_settings(plugins=[{"name": "admission"}]), engine=engine)
    path, body = (("/v1/chat/completions", {**CHAT, "max_tokens": 400})
                  if route == "chat" else
                  ("/v1/responses", {"model": "fake-model", "input": "hi",
                                     "max_output_tokens": 400}))
    r = await client.post(path, json=body, headers={"x-weir-timeout-ms": "300"})
    assert r.status == 504
    text = await (await client.get("/metrics")).text()
    assert metric(text, "weir_tokens_total", model="fake-model", kind="prompt") > 0
    assert metric(text, "weir_tokens_total", model="fake-model", kind="completion") > 0


@pytest.mark.parametrize("stream", [False, True])
async def test_a_client_gone_before_its_answer_is_logged_with_the_cache_s_outcome(
        make_client: MakeClient, logs: Any, stream: bool) -> None:
    """A client that left while its miss waited on the engine: its 499's access-log line
    (and span) said nothing of the cache, which had decided (a miss) before the engine
    was called: the outcome was read from the answer's headers alone, and no answer was
    made."""
    from tests.waiting import eventually

    engine = FakeEngine()
    engine.token_gate = asyncio.Event()  # the engine never produces a token
    client = await make_client(make_settings(logging={"access_log": True}, plugins=[
        {"name": "cache", "config": {"semantic": {"enabled": False}}}]), engine=engine)
    body = {**CHAT, "temperature": 0, "stream": stream}
    task = asyncio.create_task(client.post("/v1/chat/completions", json=body))
    await engine.wait_until(lambda: len(engine.active) == 1)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)

    def lines() -> list[dict[str, Any]]:
        return [x for line in logs.getvalue().splitlines() if line.startswith("{")
                and (x := json.loads(line)).get("event") == "request" and x["status"] == 499]

    await eventually(lambda: bool(lines()), timeout=10)
    assert lines()[0]["cache"] == "miss"
