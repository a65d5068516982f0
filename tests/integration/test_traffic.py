"""Traffic control over real HTTP: an edge Weir in front of a central Weir (upstream
engine), the upstream going down, the breaker opening and closing, fallbacks, a surge
against admission, and counters back at zero after mixed traffic."""

from __future__ import annotations

import asyncio
import random
from typing import Any, ClassVar

import pytest
from aiohttp.test_utils import TestServer

from bench.redis_server import RedisServer
from plugins.breaker.plugin import BreakerPlugin
from proxy.app import create_app
from proxy.app_state import STATE
from proxy.chain import BasePlugin, Next, Reply, register, unregister
from proxy.context import RequestContext
from tests.conftest import MakeClient, make_settings
from tests.fakes import FakeEngine, HoldingEngine
from tests.metrics import metric
from tests.openai_spec import validate
from tests.sse import check_chat_stream, parse_sse, streams_cut_until_refused
from tests.waiting import eventually

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 4}


class HeaderSpy(BasePlugin):
    name: ClassVar[str] = "t_header_spy"
    seen: ClassVar[list[dict[str, str]]] = []

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        self.seen.append(dict(ctx.headers))
        return await call_next(ctx)


async def central(engine: FakeEngine) -> TestServer:
    register(HeaderSpy)
    app = create_app(make_settings(plugins=[{"name": "t_header_spy"}]), engine=engine)
    server = TestServer(app)
    await server.start_server()
    return server


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def edge_settings(url: str, **extra: Any) -> Any:
    return make_settings(engine={"kind": "upstream", "base_url": url, "models": ["fake-model"],
                                 "timeout_s": 5, "connect_timeout_s": 1}, **extra)


async def test_edge_forwards_to_central(make_client: MakeClient) -> None:
    engine = FakeEngine()
    server = await central(engine)
    try:
        edge = await make_client(edge_settings(f"http://127.0.0.1:{server.port}/v1"))
        tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        r = await edge.post("/v1/chat/completions", json=CHAT, headers={"traceparent": tp})
        assert r.status == 200
        body = await r.json()
        validate("CreateChatCompletionResponse", body)
        assert body["choices"][0]["message"]["content"] == FakeEngine.expected_text(
            engine.calls[0][0], 4)
        # Same trace; the parent is the caller's span, or the edge's own when tracing is on.
        assert HeaderSpy.seen[-1]["traceparent"].split("-")[1] == tp.split("-")[1]
        r = await edge.post("/v1/chat/completions", json={
            **CHAT, "stream": True, "stream_options": {"include_usage": True}})
        events, done = parse_sse(await r.text())
        assert done and check_chat_stream(events, usage=True)
        models = await (await edge.get("/v1/models")).json()
        assert [m["id"] for m in models["data"]] == ["fake-model"]
        assert models["data"][0]["root"] == "fake-model"  # not the upstream's address
        r = await edge.post("/v1/chat/completions", json={**CHAT, "temperature": 9})
        assert r.status == 400  # the edge validates; nothing reached the central
        r = await edge.post("/v1/chat/completions", json={**CHAT, "max_tokens": 100_000})
        assert r.status == 400  # the central's 400 passes through
        assert (await r.json())["error"]["param"] == "max_tokens"
    finally:
        unregister("t_header_spy")
        await server.close()


async def test_upstream_down_breaker_opens_and_falls_back(make_client: MakeClient) -> None:
    breaker = {"minimum_calls": 3, "failure_rate": 0.5, "open_s": 30,
               "fallback": [{"kind": "static", "content": "We are busy."}]}
    settings = edge_settings(f"http://127.0.0.1:{closed_port()}/v1",
                             plugins=[{"name": "breaker", "config": breaker}])
    edge = await make_client(settings)
    for _ in range(3):
        r = await edge.post("/v1/chat/completions", json=CHAT)
        assert r.status == 200 and r.headers["x-weir-fallback"] == "static"
    ready = await (await edge.get("/health/ready")).json()
    assert ready["plugins"]["breaker"]["state"] == "open"
    r = await edge.post("/v1/chat/completions", json={**CHAT, "stream": True})
    events, done = parse_sse(await r.text())
    assert done and check_chat_stream(events) == "We are busy."
    metrics = await (await edge.get("/metrics")).text()
    assert "weir_breaker_state 2.0" in metrics


async def test_without_fallback_an_open_breaker_is_a_clean_503(make_client: MakeClient) -> None:
    edge = await make_client(edge_settings(f"http://127.0.0.1:{closed_port()}/v1", plugins=[
        {"name": "breaker", "config": {"minimum_calls": 2, "open_s": 30}}]))
    for _ in range(2):
        r = await edge.post("/v1/chat/completions", json=CHAT)
        assert r.status == 502
        validate("ErrorResponse", await r.json())
    r = await edge.post("/v1/chat/completions", json=CHAT)
    assert r.status == 503 and "x-should-retry" not in r.headers
    assert 1 <= int(r.headers["retry-after"]) <= 30  # the time left until it half-opens
    assert 1 <= int(r.headers["retry-after-ms"]) <= 30_000
    assert (await r.json())["error"]["code"] == "circuit_open"


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


async def test_breaker_recovers_when_the_engine_does(make_client: MakeClient,
                                                     fake_engine: FakeEngine) -> None:
    client = await make_client(plugins=[{"name": "breaker", "config": {
        "minimum_calls": 2, "open_s": 10, "half_open_calls": 1,
        "fallback": [{"kind": "static"}]}}])
    plugin = next(p for p in client.app[STATE].plugins if isinstance(p, BreakerPlugin))
    clock = Clock()
    plugin.breaker.clock = clock
    fake_engine.fail_after = 0  # the engine errors
    for _ in range(2):
        r = await client.post("/v1/chat/completions", json=CHAT)
        assert r.headers.get("x-weir-fallback") == "static"
    assert plugin.breaker.state == "open"
    fake_engine.fail_after = None  # the engine recovers
    r = await client.post("/v1/chat/completions", json=CHAT)
    assert r.headers.get("x-weir-fallback") == "static"  # still open
    clock.t += 10
    r = await client.post("/v1/chat/completions", json=CHAT)  # the half-open trial
    assert r.status == 200 and "x-weir-fallback" not in r.headers
    assert plugin.breaker.state == "closed"


async def test_stale_entry_serves_when_the_engine_fails(make_client: MakeClient,
                                                        fake_engine: FakeEngine) -> None:
    client = await make_client(plugins=[
        {"name": "cache", "config": {"stale_grace_s": 3600, "store_truncated": True,
                                     "semantic": {"enabled": False}}},
        {"name": "breaker", "config": {"fallback": [{"kind": "stale"}, {"kind": "error"}]}}])
    body = {**CHAT, "temperature": 0}
    fresh = await (await client.post("/v1/chat/completions", json=body)).json()
    cache = next(p for p in client.app[STATE].plugins if p.name == "cache")
    for entry in cache.store.l1.entries():  # type: ignore[attr-defined]
        entry.expires = 0.0  # the entry is past its TTL, inside its grace window
    fake_engine.fail_after = 0
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status == 200
    assert r.headers["x-weir-cache"] == "stale" and r.headers["x-weir-fallback"] == "stale"
    assert (await r.json())["choices"][0]["message"] == fresh["choices"][0]["message"]
    r = await client.post("/v1/chat/completions", json={**body, "max_tokens": 3})
    assert r.status == 502  # nothing stale for this one: the engine's own error


async def test_surge_is_shed_at_once(make_client: MakeClient, fake_engine: FakeEngine) -> None:
    fake_engine.token_gate = asyncio.Event()
    client = await make_client(plugins=[{"name": "admission", "config": {
        "max_concurrent": 2, "max_queue": 2, "retry_after_s": 2}}])
    tasks = [asyncio.create_task(client.post("/v1/chat/completions", json=CHAT))
             for _ in range(20)]
    await fake_engine.wait_until(lambda: len(fake_engine.active) == 2)
    finished: set[asyncio.Task[Any]] = set()
    async with asyncio.timeout(10):  # 2 run, 2 queue, 16 are answered without waiting
        while len(finished) < 16:
            done, _ = await asyncio.wait(set(tasks) - finished,
                                         return_when=asyncio.FIRST_COMPLETED)
            finished |= done
    shed = [t.result() for t in finished]
    assert len(shed) == 16 and all(r.status == 503 for r in shed)
    assert len(fake_engine.active) == 2  # the engine has answered nobody yet
    err = await shed[0].json()
    validate("ErrorResponse", err)
    assert err["error"]["code"] == "overloaded" and shed[0].headers["Retry-After"] == "2"
    fake_engine.token_gate.set()
    replies = await asyncio.gather(*tasks)
    assert sum(r.status == 200 for r in replies) == 4


async def test_counters_return_to_zero_after_mixed_traffic(make_client: MakeClient,
                                                           redis_server: RedisServer) -> None:
    engine = FakeEngine(delay=0.001)
    client = await make_client(engine=engine, plugins=[
        {"name": "rate_limit", "config": {
            "store": "redis", "redis": {"url": redis_server.url,
                                        "key_prefix": "weir:leak:", "timeout_s": 0.5},
            "rules": [{"per": "tenant", "rpm": 100000, "tpm": 100000000, "concurrent": 50}]}},
        {"name": "breaker", "config": {"minimum_calls": 100000}},
        {"name": "admission", "config": {"max_concurrent": 8, "max_queue": 16,
                                         "max_queue_wait_s": 0.5}}])
    rng = random.Random(11)

    async def one(i: int) -> None:
        kind = i % 4
        body = {**CHAT, "max_tokens": rng.choice([2, 20]), "stream": i % 2 == 0}
        headers = {"x-weir-timeout-ms": "5"} if kind == 1 else {}
        task = asyncio.create_task(client.post("/v1/chat/completions", json=body,
                                               headers=headers))
        if kind == 2:  # client abort
            await asyncio.sleep(rng.random() * 0.01)
            task.cancel()
        try:
            r = await task
            await r.read()
        except asyncio.CancelledError:
            pass

    for batch in range(10):  # 2,000 requests, 200 at a time
        engine.fail_after = 1 if batch % 3 == 0 else None  # engine exceptions too
        await asyncio.gather(*(one(batch * 200 + i) for i in range(200)))
    await engine.wait_until(lambda: not engine.active, timeout=10)
    engine.fail_after = None
    st = client.app[STATE]
    plugins = {p.name: p for p in st.plugins}
    # Leases a timed-out Redis call may have taken are released in the background.
    await eventually(plugins["rate_limit"].idle, timeout=10)  # type: ignore[attr-defined]
    assert plugins["admission"].gate.in_use == 0  # type: ignore[attr-defined]
    assert plugins["admission"].gate.waiting == 0  # type: ignore[attr-defined]
    assert plugins["breaker"].breaker.trials_in_flight == 0  # type: ignore[attr-defined]
    assert st.in_flight == 0
    remote = plugins["rate_limit"].remote  # type: ignore[attr-defined]
    for key in await remote.client.keys("weir:leak:*:c"):
        assert await remote.client.zcard(key) == 0
    r = await client.post("/v1/chat/completions", json=CHAT)
    assert r.status == 200



async def test_upstream_fallback_when_the_local_engine_fails(make_client: MakeClient,
                                                            fake_engine: FakeEngine) -> None:
    central_engine = FakeEngine()
    server = await central(central_engine)
    try:
        client = await make_client(plugins=[{"name": "breaker", "config": {"fallback": [
            {"kind": "upstream", "base_url": f"http://127.0.0.1:{server.port}/v1"},
            {"kind": "static"}]}}])
        fake_engine.fail_after = 0  # the local engine fails
        r = await client.post("/v1/chat/completions", json=CHAT)
        assert r.status == 200 and r.headers["x-weir-fallback"] == "upstream"
        body = await r.json()
        validate("CreateChatCompletionResponse", body)
        assert len(central_engine.calls) == 1
        r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        assert r.headers["x-weir-fallback"] == "upstream"
        events, done = parse_sse(await r.text())
        assert done and check_chat_stream(events)
        await server.close()  # the central goes too: the next fallback answers
        r = await client.post("/v1/chat/completions", json=CHAT)
        assert r.headers.get("x-weir-fallback") == "static", (r.status, await r.text())
    finally:
        unregister("t_header_spy")
        await server.close()


@pytest.mark.parametrize("stream", [False, True])
async def test_a_request_waiting_on_an_identical_one_keeps_its_own_deadline(
        make_client: MakeClient, stream: bool) -> None:
    """A follower coalesced onto an identical generation under way waits within its own
    deadline (`x-weir-timeout-ms`), not the leader's: its 504 comes while the leader is
    still held, and the leader's answer is untouched."""
    engine = FakeEngine()
    engine.token_gate = asyncio.Event()
    client = await make_client(engine=engine, plugins=[
        {"name": "cache", "config": {"semantic": {"enabled": False}}},
        {"name": "admission", "config": {}}])
    body = {**CHAT, "temperature": 0, "max_tokens": 3, "stream": stream}
    leader = asyncio.create_task(client.post("/v1/chat/completions", json=body))
    await engine.wait_until(lambda: bool(engine.active))
    async with asyncio.timeout(5):  # (a follower waiting on the held leader: never)
        r = await client.post("/v1/chat/completions", json=body,
                              headers={"x-weir-timeout-ms": "100"})
    assert not leader.done() and len(engine.calls) == 1  # it never reached the engine
    assert r.status == 504 and (await r.json())["error"]["code"] == "timeout"
    engine.token_gate.set()
    led = await leader
    assert led.status == 200
    await led.read()


@pytest.mark.parametrize("stream", [False, True])
async def test_a_follower_cut_at_its_deadline_is_counted_as_a_queued_one_is(
        make_client: MakeClient, stream: bool) -> None:
    """A request waiting on an identical one's answer that its deadline cuts is a 504 as a
    request queued for the engine is, but `weir_admission_deadline_exceeded_total` counted
    only the queued one (the follower never reaches admission). Both count."""
    engine = FakeEngine()
    engine.token_gate = asyncio.Event()
    client = await make_client(engine=engine, plugins=[
        {"name": "cache", "config": {"semantic": {"enabled": False}}},
        {"name": "admission", "config": {"max_concurrent": 1}}])
    body = {**CHAT, "temperature": 0, "max_tokens": 3, "stream": stream}
    leader = asyncio.create_task(client.post("/v1/chat/completions", json=body))
    await engine.wait_until(lambda: bool(engine.active))
    short = {"x-weir-timeout-ms": "50"}
    follower = await client.post("/v1/chat/completions", json=body, headers=short)
    queued = await client.post("/v1/chat/completions", json={**body, "max_tokens": 2},
                               headers=short)
    assert (follower.status, queued.status) == (504, 504)
    engine.token_gate.set()
    assert (await leader).status == 200
    text = await (await client.get("/metrics")).text()
    assert metric(text, "weir_admission_deadline_exceeded_total") == 2


async def test_relayed_streams_cut_short_are_charged_what_was_relayed(
        make_client: MakeClient) -> None:
    """An upstream stream cut before its end reports no usage (the upstream's last chunk
    never came): the edge's limiter charges the pieces it relayed and its own estimate of
    the prompt, so a token limit still stops a client that drops each stream before its
    end (it was refunded everything before)."""
    engine = HoldingEngine(after=40)
    server = await central(engine)
    try:
        edge = await make_client(edge_settings(
            f"http://127.0.0.1:{server.port}/v1",
            plugins=[{"name": "rate_limit", "config": {
                "rules": [{"per": "tenant", "tpm": 250}]}}]))
        st = edge.app[STATE]
        body = {**CHAT, "max_tokens": 50, "stream": True}
        statuses = await streams_cut_until_refused(
            edge, body, events=40, rounds=10,
            idle=lambda: st.in_flight == 0 and not engine.active)
        assert statuses[-1] == 429 and 2 <= len(statuses) - 1 <= 5, statuses
    finally:
        unregister("t_header_spy")
        await server.close()


async def test_reasoning_effort_is_refused_here_and_passed_on_to_an_upstream(
        make_client: MakeClient) -> None:
    """The in-process model does not reason: `reasoning_effort` other than `none` is a
    400 naming it there; an upstream (a reasoning model behind another server) gets it."""
    engine = FakeEngine()
    server = await central(engine)
    try:
        local = await make_client()
        r = await local.post("/v1/chat/completions", json={**CHAT, "reasoning_effort": "low"})
        assert r.status == 400
        err = (await r.json())["error"]
        assert (err["param"], err["code"]) == ("reasoning_effort", "unsupported_parameter")
        ok = await local.post("/v1/chat/completions", json={**CHAT, "reasoning_effort": "none"})
        assert ok.status == 200
        edge = await make_client(edge_settings(f"http://127.0.0.1:{server.port}/v1"))
        r = await edge.post("/v1/chat/completions", json={**CHAT, "reasoning_effort": "low"})
        # the central (in-process) refuses it: the edge passed it on, as it is
        assert r.status == 400 and (await r.json())["error"]["param"] == "reasoning_effort"
        assert not engine.calls
    finally:
        unregister("t_header_spy")
        await server.close()


async def test_cache_directives_sent_on_several_lines_are_all_heard(
        make_client: MakeClient) -> None:
    """`Cache-Control` sent twice is one list, as HTTP reads it: a `no-store` on the
    first line holds though a `max-age` follows on the second (only the last line was
    read: the answer was stored); a deadline header sent twice keeps the shorter."""
    from multidict import CIMultiDict

    client = await make_client(plugins=[{"name": "cache", "config": {
        "store_truncated": True, "semantic": {"enabled": False}}}])
    body = {**CHAT, "temperature": 0}
    twice = CIMultiDict([("Cache-Control", "no-store"), ("Cache-Control", "max-age=60")])
    r = await client.post("/v1/chat/completions", json=body, headers=twice)
    assert r.status == 200 and r.headers["x-weir-cache"] == "miss"
    r = await client.post("/v1/chat/completions", json=body)
    assert r.headers["x-weir-cache"] == "miss"  # nothing was stored
    r = await client.post("/v1/chat/completions", json=body, headers=CIMultiDict([
        ("Cache-Control", "max-age=60"), ("Cache-Control", "no-cache")]))
    assert r.headers["x-weir-cache"] == "bypass"  # not read; stored


async def test_only_if_cached_over_http(make_client: MakeClient, fake_engine: FakeEngine,
                                        ) -> None:
    """A miss asking `only-if-cached` is a 504 in OpenAI's error shape, the engine never
    called; once the answer is stored, the same request is served from the cache."""
    client = await make_client(plugins=[{"name": "cache", "config": {
        "store_truncated": True, "semantic": {"enabled": False}}}])
    body = {**CHAT, "temperature": 0}
    only = {"Cache-Control": "only-if-cached"}
    r = await client.post("/v1/chat/completions", json=body, headers=only)
    assert r.status == 504
    err = await r.json()
    validate("ErrorResponse", err)
    assert err["error"]["code"] == "not_cached" and not fake_engine.calls
    assert r.headers["x-should-retry"] == "false"  # (the SDKs retried it twice)
    assert r.headers["x-weir-cache"] == "miss"  # (it had none)
    r = await client.post("/v1/chat/completions", json={**body, "temperature": 1},
                          headers=only)
    assert r.status == 504 and r.headers["x-weir-cache"] == "bypass"
    assert (await client.post("/v1/chat/completions", json=body)).status == 200
    r = await client.post("/v1/chat/completions", json=body, headers=only)
    assert r.status == 200 and r.headers["x-weir-cache"] == "exact"
    assert len(fake_engine.calls) == 1


@pytest.mark.parametrize("trusted", [True, False])
async def test_a_central_weir_keeps_the_edges_tenants_apart(make_client: MakeClient,
                                                            trusted: bool) -> None:
    """Two tenants of an edge Weir ask the same question through one key: a central Weir
    that trusts the edge's key (`on_behalf_of`) caches each tenant's answer for that
    tenant alone. The control (not trusted) shows what is shared otherwise."""
    engine = FakeEngine()
    app = create_app(make_settings(
        auth={"mode": "keys", "keys": [{"key": "edge-key", "tenant": "edge",
                                        "on_behalf_of": trusted}]},
        plugins=[{"name": "cache", "config": {"semantic": {"enabled": False},
                                              "store_truncated": True}}]),
        engine=engine)
    server = TestServer(app)
    await server.start_server()
    try:
        edge = await make_client(make_settings(
            engine={"kind": "upstream", "base_url": f"http://127.0.0.1:{server.port}/v1",
                    "api_key": "edge-key", "models": ["fake-model"],
                    "on_behalf_of_secret": "the-edge-own-secret"},
            auth={"mode": "keys", "keys": [{"key": "a-key", "tenant": "a"},
                                           {"key": "b-key", "tenant": "b"}]}))
        ask = {**CHAT, "temperature": 0}
        for key in ("a-key", "b-key", "a-key"):
            r = await edge.post("/v1/chat/completions", json=ask,
                                headers={"Authorization": f"Bearer {key}"})
            assert r.status == 200
        # trusted: a's answer is a's alone (b generated its own; a's repeat hit)
        assert len(engine.calls) == (2 if trusted else 1)
    finally:
        await server.close()


async def test_the_clients_cache_control_holds_at_a_central_weir(make_client: MakeClient
                                                                 ) -> None:
    """`no-store`, `no-cache` and `only-if-cached` sent to an edge were not passed on: the
    central cached a `no-store` answer and served `no-cache` from its cache. Its
    `not_cached` comes back as such, which the edge's breaker does not count."""
    engine = FakeEngine()
    app = create_app(make_settings(plugins=[{"name": "cache", "config": {
        "semantic": {"enabled": False}, "store_truncated": True}}]), engine=engine)
    server = TestServer(app)
    await server.start_server()
    try:
        edge = await make_client(edge_settings(
            f"http://127.0.0.1:{server.port}/v1",
            plugins=[{"name": "breaker", "config": {"minimum_calls": 1, "open_s": 60}}]))
        ask = {**CHAT, "temperature": 0}
        for cc in ("no-store", None, "no-cache", None):
            r = await edge.post("/v1/chat/completions", json=ask,
                                headers={"Cache-Control": cc} if cc else {})
            assert r.status == 200
        # no-store: not kept; the next stored it; no-cache: generated again; then a hit
        assert len(engine.calls) == 3
        r = await edge.post("/v1/chat/completions", json={**ask, "max_tokens": 2},
                            headers={"Cache-Control": "only-if-cached"})
        assert r.status == 504 and (await r.json())["error"]["code"] == "not_cached"
        assert r.headers["x-should-retry"] == "false" and len(engine.calls) == 3
        breaker = next(p for p in edge.app[STATE].plugins if p.name == "breaker")
        assert breaker.breaker.state == "closed"
    finally:
        await server.close()


async def test_an_upstreams_embedding_model_is_listed_once(make_client: MakeClient) -> None:
    """The upstream lists its embedding model, which this edge serves too: it was listed
    twice (owned by the upstream and by Weir); once now, as the one served here."""
    from aiohttp import web

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": "fake-model"}, {"id": "all-MiniLM-L6-v2"}]})

    up = web.Application()
    up.router.add_get("/v1/models", models)
    server = TestServer(up)
    await server.start_server()
    try:
        edge = await make_client(make_settings(
            engine={"kind": "upstream", "base_url": f"http://127.0.0.1:{server.port}/v1"},
            embeddings={"enabled": True}))
        await eventually(edge.app[STATE].terminal.ready, timeout=10)  # (models asked)
        listed = (await (await edge.get("/v1/models")).json())["data"]
        assert sorted((m["id"], m["owned_by"]) for m in listed) == [
            ("all-MiniLM-L6-v2", "weir"), ("fake-model", "upstream")]
    finally:
        await server.close()


async def test_an_admins_question_does_not_wait_out_a_user_queue(make_client: MakeClient
                                                                 ) -> None:
    """The cache coalesces identical questions: an admin's, identical to a user's still
    queued for the engine, waited on that user's turn, behind every user ahead of it
    (the queue orders by role). It now queues as itself, and goes first."""
    engine = FakeEngine()
    engine.token_gate = asyncio.Event()
    keys = {"mode": "keys", "keys": [{"key": "sk-user", "tenant": "a", "role": "user"},
                                     {"key": "sk-admin", "tenant": "a", "role": "admin"}]}
    client = await make_client(make_settings(auth=keys, plugins=[
        {"name": "cache", "config": {"semantic": {"enabled": False}}},
        {"name": "admission", "config": {"max_concurrent": 1, "max_queue": 8,
                                         "priorities": {"admin": 0, "user": 10}}}]),
        engine=engine)
    gate = next(p for p in client.app[STATE].plugins if p.name == "admission").gate
    done: list[str] = []

    async def ask(who: str, key: str, text: str) -> None:
        r = await client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                              json={**CHAT, "temperature": 0,
                                    "messages": [{"role": "user", "content": text}]})
        assert r.status == 200
        done.append(who)

    tasks = [asyncio.create_task(ask("u0", "sk-user", "first"))]
    await engine.wait_until(lambda: len(engine.active) == 1)  # in the engine, held
    tasks.append(asyncio.create_task(ask("user", "sk-user", "the same question")))
    await eventually(lambda: gate.waiting == 1)  # queued: it leads its question
    tasks.append(asyncio.create_task(ask("admin", "sk-admin", "the same question")))
    await eventually(lambda: gate.waiting == 2)  # queued as itself, not behind the user
    engine.token_gate.set()
    await asyncio.gather(*tasks)
    assert done.index("admin") < done.index("user")


async def test_a_streamed_static_fallback_is_charged_no_tokens_as_a_whole_one_is(
        make_client: MakeClient, fake_engine: FakeEngine) -> None:
    """The static text generated nothing: streamed or whole, its token reservation goes
    back (a stream was charged all of it: tenants were limited by an outage's answers)."""
    client = await make_client(plugins=[
        {"name": "rate_limit", "config": {"rules": [{"per": "tenant", "tpm": 100_000}]}},
        {"name": "breaker", "config": {"minimum_calls": 1, "open_s": 1000,
                                        "fallback": [{"kind": "static"}]}}])
    fake_engine.fail_after = 0
    left = []
    for route, body in [("/v1/chat/completions", {**CHAT, "max_tokens": 500}),
                        ("/v1/chat/completions", {**CHAT, "max_tokens": 500, "stream": True}),
                        ("/v1/completions", {"model": "fake-model", "prompt": "hello",
                                             "max_tokens": 500, "stream": True}),
                        ("/v1/chat/completions", {**CHAT, "max_tokens": 500})]:
        r = await client.post(route, json=body)
        await r.read()
        assert r.status == 200 and r.headers["x-weir-fallback"] == "static"
        left.append(int(r.headers["x-ratelimit-remaining-tokens"]))
    # Each sees its own reservation taken (~500), and only that: nothing was kept.
    assert max(left) - min(left) < 100, left


async def test_a_stale_fallback_counts_its_request_s_cache_lookup_once(
        make_client: MakeClient, fake_engine: FakeEngine) -> None:
    """The breaker's stale fallback read L1 again, counted as a second lookup of the same
    request: each request its engine failed was two L1 misses, and one a stale answer
    served was an L1 miss and an L1 hit (per-layer hit ratios moved in an outage). The
    request's own lookup is counted; what the fallback served is `weir_fallbacks_total`."""
    client = await make_client(plugins=[
        {"name": "cache", "config": {"stale_grace_s": 3600, "store_truncated": True,
                                     "semantic": {"enabled": False}}},
        {"name": "breaker", "config": {"fallback": [{"kind": "stale"}, {"kind": "error"}]}}])
    body = {**CHAT, "temperature": 0}
    assert (await client.post("/v1/chat/completions", json=body)).status == 200
    cache = next(p for p in client.app[STATE].plugins if p.name == "cache")
    for entry in cache.store.l1.entries():  # type: ignore[attr-defined]
        entry.expires = 0.0  # the entry is past its TTL, inside its grace window
    fake_engine.fail_after = 0
    sample = client.app[STATE].metrics.registry.get_sample_value

    def l1(result: str) -> float:
        return sample("weir_cache_lookups_total", {"layer": "l1", "result": result}) or 0.0

    before = l1("hit"), l1("miss")
    r = await client.post("/v1/chat/completions", json=body)
    assert r.headers["x-weir-fallback"] == "stale"
    assert (l1("hit"), l1("miss")) == (before[0], before[1] + 1)
    r = await client.post("/v1/chat/completions", json={**body, "max_tokens": 3})
    assert r.status == 502  # nothing stale for this one
    assert (l1("hit"), l1("miss")) == (before[0], before[1] + 2)
    assert sample("weir_fallbacks_total", {"kind": "stale", "reason": "engine"}) == 1
    assert sample("weir_cache_lookups_total", {"layer": "all", "result": "miss"}) == 3


@pytest.mark.parametrize("kind", ["static", "upstream"])
async def test_no_fallback_answer_is_cached_nor_served_once_the_engine_is_back(
        make_client: MakeClient, fake_engine: FakeEngine, kind: str) -> None:
    """A fallback's answer (a fixed text, another server's) is no answer of this engine:
    on every route and shape (chat, completions and the Responses API, whole and
    streamed) it is stored in no cache layer, and once the engine is back the same
    request is generated (a miss), not served the degraded answer."""
    central_engine = FakeEngine()
    central_engine.script = "From the central."
    server = await central(central_engine)
    fallback: dict[str, Any] = ({"kind": "static", "content": "Busy, sorry."} if kind == "static"
                                else {"kind": "upstream",
                                      "base_url": f"http://127.0.0.1:{server.port}/v1"})
    try:
        client = await make_client(embeddings={"enabled": True}, plugins=[
            {"name": "cache", "config": {"semantic": {"enabled": True}}},
            {"name": "breaker", "config": {"minimum_calls": 1000, "fallback": [fallback]}}])
        await client.app[STATE].embedder.ready()  # type: ignore[union-attr]
        asks = [(route, {**body, "temperature": 0, "stream": stream})
                for stream in (False, True)
                for route, body in [
                    ("/v1/chat/completions", CHAT),
                    ("/v1/completions", {"model": "fake-model", "prompt": "hello",
                                         "max_tokens": 4}),
                    ("/v1/responses", {"model": "fake-model", "input": "hello",
                                       "max_output_tokens": 16})]]
        fake_engine.fail_after = 0
        for route, body in asks:
            r = await client.post(route, json=body)
            text = await r.text()
            assert r.status == 200 and r.headers.get("x-weir-fallback") == kind, (route, text)
        fake_engine.fail_after = None
        for route, body in asks:
            r = await client.post(route, json=body)
            text = await r.text()
            assert r.status == 200 and "x-weir-fallback" not in r.headers, (route, text)
            assert r.headers["x-weir-cache"] == "miss", (route, r.headers["x-weir-cache"])
            assert "Busy" not in text and "central" not in text
        assert len(fake_engine.calls) == 2 * len(asks)
    finally:
        unregister("t_header_spy")
        await server.close()
