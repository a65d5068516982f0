"""What one tenant or one flaky dependency must not do to everyone else (issue 16):
open the shared breaker with its own deadlines or bad requests, leave rate-limit slots
taken after Redis stalls, or go uncounted when it hangs up."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis

from bench.redis_server import RedisServer
from proxy.app_state import STATE
from tests.conftest import MakeClient, make_settings
from tests.fakes import FakeEngine
from tests.waiting import eventually

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 4}
KEYS = {"mode": "keys", "keys": [{"key": "sk-tenant-a", "tenant": "a"},
                                 {"key": "sk-tenant-b", "tenant": "b"}]}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def plugin(client: Any, name: str) -> Any:
    return next(p for p in client.app[STATE].plugins if p.name == name)


async def test_one_tenants_deadlines_and_bad_requests_never_open_the_breaker(
        make_client: MakeClient) -> None:
    engine = FakeEngine(delay=0.05)
    client = await make_client(make_settings(auth=KEYS, plugins=[
        {"name": "breaker", "config": {"minimum_calls": 4, "failure_rate": 0.5, "open_s": 60}},
        {"name": "admission", "config": {"max_concurrent": 8, "max_queue": 64}}]),
        engine=engine)
    for stream in (False, True) * 5:  # ten calls cut by their own 1 ms deadline
        r = await client.post("/v1/chat/completions", json={**CHAT, "stream": stream},
                              headers={**bearer("sk-tenant-a"), "x-weir-timeout-ms": "1"})
        body = await r.text()
        assert r.status == 504 or (r.status == 200 and '"code":"timeout"' in body), body
    for _ in range(10):  # and ten the engine refuses as invalid
        r = await client.post("/v1/chat/completions", headers=bearer("sk-tenant-a"),
                              json={**CHAT, "logit_bias": {"999999": 1}})
        assert r.status == 400
    assert plugin(client, "breaker").breaker.state == "closed"
    r = await client.post("/v1/chat/completions", json=CHAT, headers=bearer("sk-tenant-b"))
    assert r.status == 200


async def test_a_request_weir_fails_to_prepare_never_opens_the_breaker(
        make_client: MakeClient) -> None:
    """A tool call's arguments nested 5,000 deep once made a 500 counted as the engine's
    failure: ten of them opened the circuit for every tenant. Now such arguments reach
    the template as text, and a request Weir fails to prepare (its own bug) is a 500
    that the breaker does not count."""
    engine = FakeEngine()
    client = await make_client(make_settings(auth=KEYS, plugins=[
        {"name": "breaker", "config": {"minimum_calls": 4, "failure_rate": 0.5, "open_s": 60}}]),
        engine=engine)
    nested = "[" * 5000 + "]" * 5000
    turns = [{"role": "user", "content": "hi"},
             {"role": "assistant", "content": None, "tool_calls": [
                 {"id": "c1", "type": "function",
                  "function": {"name": "f", "arguments": nested}}]},
             {"role": "tool", "tool_call_id": "c1", "content": "1"}]
    seen: list[list[dict[str, Any]]] = []
    render = engine.render_chat

    def spy(messages: list[dict[str, Any]], tools: Any, **kw: Any) -> list[int]:
        seen.append(messages)
        return render(messages, tools, **kw)

    engine.render_chat = spy  # type: ignore[method-assign]
    for _ in range(6):
        r = await client.post("/v1/chat/completions", headers=bearer("sk-tenant-a"),
                              json={**CHAT, "messages": turns})
        assert r.status == 200, await r.text()
    assert seen[-1][1]["tool_calls"][0]["function"]["arguments"] == nested  # as text

    def broken(messages: list[dict[str, Any]], tools: Any, **kw: Any) -> list[int]:
        raise KeyError("a bug some input reaches")

    engine.render_chat = broken  # type: ignore[method-assign]
    for _ in range(10):
        r = await client.post("/v1/chat/completions", json=CHAT, headers=bearer("sk-tenant-a"))
        assert r.status == 500
        assert (await r.json())["error"]["type"] == "server_error"

    def too_deep(messages: list[dict[str, Any]], tools: Any, **kw: Any) -> list[int]:
        raise RecursionError("a template's tojson on arguments nested 900 deep")

    engine.render_chat = too_deep  # type: ignore[method-assign]
    r = await client.post("/v1/chat/completions", json=CHAT, headers=bearer("sk-tenant-a"))
    assert r.status == 400 and (await r.json())["error"]["param"] == "messages"
    assert plugin(client, "breaker").breaker.state == "closed"
    del engine.render_chat
    r = await client.post("/v1/chat/completions", json=CHAT, headers=bearer("sk-tenant-b"))
    assert r.status == 200


async def test_engine_faults_still_open_it(make_client: MakeClient) -> None:
    engine = FakeEngine()
    engine.fail_after = 0
    client = await make_client(make_settings(auth=KEYS, plugins=[
        {"name": "breaker", "config": {"minimum_calls": 4, "failure_rate": 0.5, "open_s": 60}}]),
        engine=engine)
    for _ in range(4):
        r = await client.post("/v1/chat/completions", json=CHAT, headers=bearer("sk-tenant-a"))
        assert r.status == 502
    assert plugin(client, "breaker").breaker.state == "open"


async def test_no_slot_stays_taken_when_redis_stalls(make_client: MakeClient,
                                                      redis_server: RedisServer) -> None:
    engine = FakeEngine(delay=0.002)
    client = await make_client(make_settings(auth=KEYS, plugins=[
        {"name": "rate_limit", "config": {
            "store": "redis", "lease_s": 3,
            "redis": {"url": redis_server.url, "key_prefix": "weir:stall:", "timeout_s": 0.05},
            "rules": [{"per": "tenant", "rpm": 1_000_000, "tpm": 10**9, "concurrent": 64}]}}]),
        engine=engine)
    admin = aioredis.from_url(redis_server.url)
    rl = plugin(client, "rate_limit")

    async def one(i: int) -> None:
        r = await client.post("/v1/chat/completions", json={**CHAT, "stream": i % 2 == 0},
                              headers=bearer("sk-tenant-a"))
        await r.read()

    try:
        for _ in range(4):  # bursts of 40 while Redis stops answering for 200 ms
            burst = [asyncio.create_task(one(i)) for i in range(40)]
            await admin.execute_command("CLIENT", "PAUSE", "200", "ALL")
            await asyncio.gather(*burst)
        await eventually(rl.idle, timeout=10)
        for key in await admin.keys("weir:stall:*:c"):
            assert await admin.zcard(key) == 0
        assert rl.local.in_flight() == 0
        assert sum(s.value for m in rl.store_errors.collect() for s in m.samples
                   if s.name.endswith("_total")) > 0  # the stall really happened
        # The key is not refused while idle: its whole concurrency is there.
        rs = await asyncio.gather(*(client.post("/v1/chat/completions", json=CHAT,
                                                headers=bearer("sk-tenant-a"))
                                    for _ in range(64)))
        assert [r.status for r in rs] == [200] * 64
    finally:
        await admin.aclose()


async def test_every_client_that_hangs_up_is_counted(make_client: MakeClient) -> None:
    engine = FakeEngine()
    engine.token_gate = asyncio.Event()  # no token until the clients are gone
    client = await make_client(make_settings(auth=KEYS), engine=engine)
    metric = client.app[STATE].metrics.aborted.labels("client_gone")
    before = metric._value.get()
    tasks = [asyncio.create_task(client.post(
        "/v1/chat/completions", json={**CHAT, "stream": i % 2 == 0},
        headers=bearer("sk-tenant-a"))) for i in range(6)]
    await engine.wait_until(lambda: len(engine.active) == 6)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await engine.wait_until(lambda: not engine.active)
    await eventually(lambda: metric._value.get() - before == 6, timeout=5)
    assert len(engine.aborted) == 6


async def test_long_answers_and_queue_waits_never_open_the_breaker(
        make_client: MakeClient) -> None:
    """A tenant's long answers (it sets their length) and the admission queue's waits
    behind them are no engine's slowness: the breaker times the engine's first token,
    from when the engine took the request. Timed from the breaker's own start, whole
    answers of 25 tokens queued behind each other opened the circuit for every tenant.
    A call the engine had past `slow_call_s` with no first token still counts (hung)."""
    engine = FakeEngine(delay=0.02)  # a first token at once, 25 tokens in half a second
    client = await make_client(make_settings(auth=KEYS, plugins=[
        {"name": "breaker", "config": {"minimum_calls": 4, "failure_rate": 0.5,
                                       "slow_call_s": 0.3, "slow_call_rate": 0.5,
                                       "open_s": 60}},
        {"name": "admission", "config": {"max_concurrent": 1, "max_queue": 64}}]),
        engine=engine)
    breaker = plugin(client, "breaker").breaker

    async def ask(stream: bool) -> int:
        r = await client.post("/v1/chat/completions", headers=bearer("sk-tenant-a"),
                              json={**CHAT, "max_tokens": 25, "stream": stream})
        await r.read()
        return r.status

    assert await asyncio.gather(*(ask(s) for s in (False, True) * 3)) == [200] * 6
    assert breaker.state == "closed"
    engine.token_gate = asyncio.Event()  # the engine hangs: calls it has get no token
    statuses = []
    for _ in range(8):  # cut by their deadlines, until the breaker opens
        r = await client.post("/v1/chat/completions", json=CHAT,
                              headers={**bearer("sk-tenant-b"), "x-weir-timeout-ms": "400"})
        statuses.append(r.status)
        if r.status == 503:
            break
    assert breaker.state == "open" and statuses[-1] == 503 and 504 in statuses


@pytest.mark.parametrize("stream", [True, False])
async def test_a_hung_engine_opens_the_breaker_while_requests_queue_behind_it(
        make_client: MakeClient, stream: bool) -> None:
    """The calls a hung engine holds are slow once it has had them past `slow_call_s`
    with no token, not when their (long) deadlines end them: the queue's waits and sheds
    behind them count for nothing, and the breaker opens while the calls still hang.
    Whole answers too: they tell no token until their end, so the engine is asked how
    many it has made (with only whole answers, the breaker took their deadline)."""
    engine = FakeEngine()
    engine.token_gate = asyncio.Event()
    client = await make_client(make_settings(auth=KEYS, plugins=[
        {"name": "breaker", "config": {"minimum_calls": 2, "failure_rate": 0.5,
                                       "slow_call_s": 0.2, "slow_call_rate": 0.5,
                                       "open_s": 60}},
        {"name": "admission", "config": {"max_concurrent": 2, "max_queue": 8,
                                         "max_queue_wait_s": 0.3, "deadline_s": 60}}]),
        engine=engine)
    hung = [asyncio.create_task(client.post("/v1/chat/completions",
                                            json={**CHAT, "stream": stream},
                                            headers=bearer("sk-tenant-a"))) for _ in range(2)]
    try:
        await engine.wait_until(lambda: len(engine.active) == 2)
        codes = []
        for _ in range(20):  # bounded: each is shed after its 0.3 s in the queue
            r = await client.post("/v1/chat/completions", json=CHAT,
                                  headers=bearer("sk-tenant-b"))
            codes.append((await r.json())["error"]["code"])
            if codes[-1] == "circuit_open":
                break
        assert codes[-1] == "circuit_open" and set(codes[:-1]) <= {"queue_timeout"}
        assert all(not t.done() for t in hung)  # opened while they still hang
    finally:
        engine.token_gate.set()
        for r in await asyncio.gather(*hung):
            await r.read()


async def test_whole_answers_the_engine_is_making_are_not_slow(
        make_client: MakeClient) -> None:
    """The control: whole answers past `slow_call_s` whose tokens are coming (a long
    answer) are an engine at work: the breaker stays closed."""
    engine = FakeEngine(delay=0.02)
    client = await make_client(make_settings(auth=KEYS, plugins=[
        {"name": "breaker", "config": {"minimum_calls": 2, "slow_call_s": 0.2,
                                       "slow_call_rate": 0.5, "open_s": 60}}]),
        engine=engine)
    long = [asyncio.create_task(client.post("/v1/chat/completions",
                                            json={**CHAT, "max_tokens": 60},
                                            headers=bearer("sk-tenant-a"))) for _ in range(2)]
    await engine.wait_until(lambda: len(engine.active) == 2)
    await eventually(lambda: all(engine.generated_tokens(i) >= 15 for i in engine.active))
    for _ in range(3):  # each sweeps the calls under way, past slow_call_s by now
        r = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 1},
                              headers=bearer("sk-tenant-b"))
        assert r.status == 200
    for r in await asyncio.gather(*long):
        assert r.status == 200
    assert plugin(client, "breaker").breaker.state == "closed"


async def test_a_whole_answer_cut_after_its_tokens_came_is_not_slow(
        make_client: MakeClient) -> None:
    """A whole answer tells its first token only with its end. Cut before it (the
    client's deadline) after the engine had generated tokens, it is an engine at work,
    not a hung one: it never counts as slow (one cut with none does, as a hang)."""

    class Generating(FakeEngine):
        async def generate(self, prompt: list[int], options: Any, request_id: str,
                           **kw: Any) -> Any:
            options.generated += 5  # as vLLM's final-only reader counts a cut request's
            await asyncio.Event().wait()
            yield  # (a generator)

    client = await make_client(make_settings(auth=KEYS, plugins=[
        {"name": "breaker", "config": {"minimum_calls": 2, "failure_rate": 0.5,
                                       "slow_call_s": 0.1, "slow_call_rate": 0.5,
                                       "open_s": 60}},
        {"name": "admission", "config": {"max_concurrent": 8, "max_queue": 8}}]),
        engine=Generating())
    for _ in range(4):
        r = await client.post("/v1/chat/completions", json=CHAT,
                              headers={**bearer("sk-tenant-a"), "x-weir-timeout-ms": "300"})
        assert r.status == 504
    assert plugin(client, "breaker").breaker.state == "closed"


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


async def _half_open(make_client: MakeClient, engine: FakeEngine) -> tuple[Any, Any, _Clock]:
    """A client over `engine` whose breaker (on a hand-driven clock) its failures opened,
    `open_s` later: half-open, one trial at a time, the engine answering again but
    holding each token until `engine.token_gate` is set."""
    engine.fail_after = 0
    client = await make_client(make_settings(auth=KEYS, plugins=[
        {"name": "breaker", "config": {"minimum_calls": 2, "failure_rate": 0.5, "open_s": 5,
                                       "half_open_calls": 1, "slow_call_s": 30,
                                       "half_open_max_wait_s": 3}}]), engine=engine)
    breaker = plugin(client, "breaker")
    clock = _Clock()
    breaker.breaker.clock = clock
    for _ in range(2):
        r = await client.post("/v1/chat/completions", json=CHAT, headers=bearer("sk-tenant-a"))
        assert r.status >= 500
    assert breaker.breaker.state == "open"
    clock.t += 5
    engine.fail_after, engine.token_gate = None, asyncio.Event()
    return client, breaker, clock


async def _circuit_open(client: Any) -> bool:
    r = await client.post("/v1/chat/completions", json=CHAT, headers=bearer("sk-tenant-b"))
    return r.status == 503 and (await r.json())["error"]["code"] == "circuit_open"


@pytest.mark.parametrize("stream", [False, True])
async def test_a_half_open_trial_whose_client_leaves_frees_its_slot(
        make_client: MakeClient, stream: bool) -> None:
    """A trial cut by its client gives no outcome: its slot frees (the breaker stays
    half-open, the next call is the trial), it is not held with no trial in flight."""
    engine = FakeEngine()
    client, breaker, _ = await _half_open(make_client, engine)
    trial = asyncio.create_task(client.post(
        "/v1/chat/completions", json={**CHAT, "stream": stream}, headers=bearer("sk-tenant-a")))
    await engine.wait_until(lambda: len(engine.active) == 1)
    assert breaker.breaker.trials_in_flight == 1 and await _circuit_open(client)
    trial.cancel()
    await asyncio.gather(trial, return_exceptions=True)
    await engine.wait_until(lambda: not engine.active)
    await eventually(lambda: breaker.breaker.trials_in_flight == 0, timeout=5)
    assert breaker.health()["state"] == "half_open"
    engine.token_gate.set()  # type: ignore[union-attr]
    r = await client.post("/v1/chat/completions", json=CHAT, headers=bearer("sk-tenant-b"))
    assert r.status == 200 and breaker.breaker.state == "closed"


@pytest.mark.parametrize("stream", [False, True])
async def test_a_hung_half_open_trial_reopens_rather_than_wedging_it(
        make_client: MakeClient, stream: bool) -> None:
    """A trial that hangs (no token) is failed after `half_open_max_wait_s`: the breaker
    opens again, then half-opens and lets a new trial through, the hung one still held."""
    engine = FakeEngine()
    client, breaker, clock = await _half_open(make_client, engine)
    hung = asyncio.create_task(client.post(
        "/v1/chat/completions", json={**CHAT, "stream": stream}, headers=bearer("sk-tenant-a")))
    await engine.wait_until(lambda: len(engine.active) == 1)
    assert await _circuit_open(client)
    clock.t += 3
    assert breaker.health()["state"] == "open" and await _circuit_open(client)
    clock.t += 5
    engine.token_gate.set()  # type: ignore[union-attr]
    r = await client.post("/v1/chat/completions", json=CHAT, headers=bearer("sk-tenant-b"))
    assert r.status == 200 and breaker.breaker.state == "closed"
    await (await hung).read()
