"""Breaker: the state machine under an injected clock, and the plugin's accounting."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import openai
import pytest

from plugins.breaker.config import BreakerConfig
from plugins.breaker.plugin import BreakerPlugin
from plugins.breaker.state import HALF_OPEN_RETRY_S, Breaker, BreakerPolicy
from proxy.auth import Principal
from proxy.chain import Completion, Reply, Services, Stream
from proxy.context import RequestContext
from proxy.errors import EngineError, InvalidRequest, RateLimited, Unavailable
from proxy.protocol import ChatCompletionRequest
from proxy.settings import Settings
from proxy.telemetry import Metrics
from tests.fakes import FakeEngine
from tests.openai_spec import validate


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


POLICY = BreakerPolicy(window_s=10, minimum_calls=4, failure_rate=0.5, slow_call_s=1,
                       slow_call_rate=0.75, open_s=5, half_open_calls=2, half_open_max_wait_s=3)


def calls(b: Breaker, outcomes: list[bool], slow: bool = False) -> None:
    for failed in outcomes:
        permit = b.allow()
        assert permit is not None
        b.record(permit, failed=failed, slow=slow)


def test_opens_on_failure_rate_after_minimum_calls() -> None:
    clock = Clock()
    b = Breaker(POLICY, clock)
    calls(b, [True, True, True])
    assert b.state == "closed"  # under minimum_calls
    calls(b, [False])
    assert b.state == "open" and b.allow() is None


def test_failures_leave_the_window() -> None:
    clock = Clock()
    b = Breaker(POLICY, clock)
    calls(b, [True, True])
    clock.t += 11
    calls(b, [False, False, True, False])
    assert b.state == "closed"


def test_the_snapshot_counts_only_the_window() -> None:
    """What /health/ready shows: outcomes past the window are gone from it, whether or
    not a call has come since."""
    clock = Clock()
    b = Breaker(POLICY, clock)
    calls(b, [True, False])
    assert b.snapshot()["window_calls"] == 2
    clock.t += 11
    assert b.snapshot()["window_calls"] == 0


def test_slow_calls_open_it() -> None:
    b = Breaker(POLICY, Clock())
    calls(b, [False] * 4, slow=True)
    assert b.state == "open"


def test_half_open_closes_after_trials() -> None:
    clock = Clock()
    changes: list[tuple[str, str]] = []
    b = Breaker(POLICY, clock, lambda a, z: changes.append((a, z)))
    calls(b, [True] * 4)
    clock.t += 5
    p1, p2 = b.allow(), b.allow()
    assert b.state == "half_open" and p1 and p2 and b.allow() is None  # 2 trials at most
    b.record(p1, failed=False)
    b.record(p2, failed=False)
    assert b.state == "closed"
    assert changes == [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]


def test_a_failed_trial_reopens() -> None:
    clock = Clock()
    b = Breaker(POLICY, clock)
    calls(b, [True] * 4)
    clock.t += 5
    p = b.allow()
    assert p is not None
    b.record(p, failed=True)
    assert b.state == "open"


def test_a_stuck_trial_cannot_wedge_it() -> None:
    clock = Clock()
    b = Breaker(POLICY, clock)
    calls(b, [True] * 4)
    clock.t += 5
    assert b.allow() is not None and b.allow() is not None  # both trials hang
    clock.t += 3
    assert b.allow() is None and b.state == "open"
    clock.t += 5
    assert b.allow() is not None and b.state == "half_open"


def test_a_trial_answering_at_length_is_not_stuck() -> None:
    """A trial whose answer has begun is not silent: a healthy engine's long answers
    (past `half_open_max_wait_s`) reopened the breaker, which where answers run that long
    never closed. One with no first token by then still reopens it."""
    clock = Clock()
    b = Breaker(POLICY, clock)
    calls(b, [True] * 4)
    clock.t += 5
    p1, p2 = b.allow(), b.allow()
    assert p1 is not None and p2 is not None
    b.answering(p1)
    b.answering(p2)
    clock.t += 10  # both still streaming, past the wait
    assert b.allow() is None and b.state == "half_open"
    b.record(p1, failed=False)
    b.record(p2, failed=False)
    assert b.state == "closed"
    calls(b, [True] * 4)
    clock.t += 5
    p3, p4 = b.allow(), b.allow()
    assert p3 is not None and p4 is not None
    b.answering(p3)  # (the other never answers)
    clock.t += 3
    assert b.allow() is None and b.state == "open"


def test_release_frees_a_trial_without_an_outcome() -> None:
    clock = Clock()
    b = Breaker(POLICY, clock)
    calls(b, [True] * 4)
    clock.t += 5
    p1, p2 = b.allow(), b.allow()
    b.release(p1)  # type: ignore[arg-type]
    assert b.allow() is not None and b.trials_in_flight == 2
    assert p2 is not None


# ------------------------------------------------------------------------ plugin


def ctx(stream: bool = False) -> RequestContext:
    req = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream})
    return RequestContext(route="chat", request=req, principal=Principal("t", "user", "u"),
                          request_id="r")


def plugin(clock: Clock | None = None, **cfg: Any) -> BreakerPlugin:
    services = Services(terminal=FakeEngine(), settings=Settings(), metrics=Metrics())
    return BreakerPlugin(BreakerConfig.model_validate(
        {"minimum_calls": 2, "failure_rate": 0.5, "open_s": 5, **cfg}), services,
        clock=clock or Clock())


async def ok(c: RequestContext) -> Reply:
    return Completion({"ok": True})


async def failing(c: RequestContext) -> Reply:
    raise EngineError("boom")


async def half_opened(**cfg: Any) -> tuple[BreakerPlugin, Clock]:
    """A breaker its engine's failures opened, `open_s` (5) later: half-open at its next
    call."""
    clock = Clock()
    p = plugin(clock, **cfg)
    for _ in range(2):
        with pytest.raises(EngineError):
            await p(ctx(), failing)
    assert p.breaker.state == "open"
    clock.t += 5
    return p, clock



@pytest.mark.parametrize("error", [InvalidRequest("bad"), RateLimited("slow"),
                                   Unavailable("shed", code="overloaded"),
                                   asyncio.CancelledError()])
async def test_local_rejections_never_count(error: BaseException) -> None:
    p = plugin()

    async def reject(c: RequestContext) -> Reply:
        raise error

    for _ in range(5):
        with pytest.raises(type(error)):
            await p(ctx(), reject)
    assert p.breaker.state == "closed" and p.breaker.snapshot()["window_calls"] == 0


def test_retry_in_is_the_time_left_until_a_call_may_pass() -> None:
    clock = Clock()
    b = Breaker(POLICY, clock)
    assert b.retry_in() == 0.0
    calls(b, [True] * 4)
    assert b.retry_in() == 5.0
    clock.t += 3.75
    assert b.retry_in() == 1.25
    clock.t += 1.25
    assert b.allow() is not None and b.allow() is not None  # half-open, slots full
    assert b.retry_in() == HALF_OPEN_RETRY_S


async def open_breaker_error(p: BreakerPlugin) -> Unavailable:
    with pytest.raises(Unavailable) as e:
        await p(ctx(), ok)
    assert e.value.code == "circuit_open"
    return e.value


async def test_open_breaker_answers_503_with_the_time_left_until_it_half_opens() -> None:
    """Retry-After was always `open_s`, however long the breaker had been open, and came
    with `x-should-retry: false`, which OpenAI's SDK obeys first: it never retried."""
    clock = Clock()
    p = plugin(clock)
    for _ in range(2):
        with pytest.raises(EngineError):
            await p(ctx(), failing)
    e = await open_breaker_error(p)
    assert e.headers["retry-after"] == "5" and e.headers["retry-after-ms"] == "5000"
    clock.t += 3.2  # 1.8 s left: rounded up, and exact in milliseconds
    e = await open_breaker_error(p)
    assert e.headers["retry-after"] == "2" and e.headers["retry-after-ms"] == "1800"
    assert "x-should-retry" not in e.headers
    clock.t += 1.7999  # under a millisecond left: still a wait, never 0
    e = await open_breaker_error(p)
    assert e.headers["retry-after"] == "1" and e.headers["retry-after-ms"] == "1"
    assert p.health()["state"] == "open"
    # OpenAI's SDK retries it after that wait (it honours waits up to two minutes)
    sdk = openai.OpenAI(api_key="k", base_url="http://127.0.0.1:9/v1")
    response = httpx2.Response(503, headers=e.headers)
    assert sdk._should_retry(response)
    assert sdk._parse_retry_after_header(response.headers) == 0.001


async def test_half_open_with_its_trials_under_way_answers_a_short_wait() -> None:
    p, _ = await half_opened(half_open_calls=1)
    started, trial = asyncio.Event(), asyncio.Event()

    async def hanging(c: RequestContext) -> Reply:
        started.set()
        await trial.wait()
        return Completion({"ok": True})

    first = asyncio.create_task(p(ctx(), hanging))
    await started.wait()  # it holds the one trial slot
    assert p.breaker.trials_in_flight == 1
    e = await open_breaker_error(p)
    assert e.headers["retry-after"] == "1" and e.headers["retry-after-ms"] == "1000"
    trial.set()
    await first
    assert p.health()["state"] == "closed"


def fallbacks(p: BreakerPlugin, reason: str) -> float:
    return p.services.metrics.registry.get_sample_value(
        "weir_fallbacks_total", {"kind": "static", "reason": reason}) or 0.0


async def check_static(reply: Reply, stream: bool) -> None:
    assert reply.headers["x-weir-fallback"] == "static"
    if stream:
        assert isinstance(reply, Stream)
        chunks = [c async for c in reply]
        assert chunks[0]["choices"][0]["delta"]["content"] == "Busy, sorry."
        for c in chunks:
            validate("CreateChatCompletionStreamResponse", c)
    else:
        assert isinstance(reply, Completion)
        validate("CreateChatCompletionResponse", reply.body)
        assert reply.body["choices"][0]["message"]["content"] == "Busy, sorry."


@pytest.mark.parametrize("stream", [False, True])
async def test_static_fallback_when_open_and_on_failure(stream: bool) -> None:
    p = plugin(fallback=[{"kind": "stale"}, {"kind": "static", "content": "Busy, sorry."}])
    for _ in range(2):  # minimum_calls failures: each engine failure itself falls back
        await check_static(await p(ctx(stream), failing), stream)
    assert p.breaker.state == "open" and fallbacks(p, "engine") == 2
    engine_calls = 0

    async def healthy(c: RequestContext) -> Reply:
        nonlocal engine_calls
        engine_calls += 1
        return await ok(c)

    # Open: the engine is not called at all, even though it would answer now.
    await check_static(await p(ctx(stream), healthy), stream)
    assert engine_calls == 0 and fallbacks(p, "open") == 1


def ctx_with(**fields: Any) -> RequestContext:
    req = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi, in JSON"}], **fields})
    return RequestContext(route="chat", request=req, principal=Principal("t", "user", "u"),
                          request_id="r")


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.mark.parametrize("fields", [
    {"tools": [TOOL], "tool_choice": "required"},
    {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "f"}}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}},
    {"response_format": {"type": "json_object"}},
    {"logprobs": True},
])
async def test_a_static_text_never_answers_what_it_cannot_answer_as_asked(
        fields: dict[str, Any]) -> None:
    """A forced tool call, a JSON schema, JSON mode (with a text that is not JSON) and
    logprobs get the next fallback or their error, never a 200 "busy" that breaks the
    contract they asked for."""
    p = plugin(fallback=[{"kind": "static", "content": "Busy, sorry."}])
    with pytest.raises(EngineError):
        await p(ctx_with(**fields), failing)
    assert fallbacks(p, "engine") == 0
    json_text = plugin(fallback=[{"kind": "static", "content": '{"busy": true}'}])
    if fields == {"response_format": {"type": "json_object"}}:  # a JSON object it answers
        reply = await json_text(ctx_with(**fields), failing)
        assert isinstance(reply, Completion)
        assert reply.body["choices"][0]["message"]["content"] == '{"busy": true}'


async def test_a_static_text_answers_every_choice_asked_for() -> None:
    p = plugin(fallback=[{"kind": "static", "content": "Busy, sorry."}])
    reply = await p(ctx_with(n=3), failing)
    assert isinstance(reply, Completion)
    validate("CreateChatCompletionResponse", reply.body)
    assert [c["index"] for c in reply.body["choices"]] == [0, 1, 2]
    reply = await p(ctx_with(n=2, stream=True), failing)
    assert isinstance(reply, Stream)
    chunks = [c async for c in reply]
    assert sorted(ch["index"] for c in chunks for ch in c["choices"]) == [0, 1]


async def test_a_shed_request_keeps_its_503_rather_than_a_static_text() -> None:
    """Clients retry a 503 with Retry-After; a 200 "busy" they would take as the answer.
    A stale answer still serves a shed request."""
    p = plugin(fallback=[{"kind": "static", "content": "Busy, sorry."}])

    async def shed(c: RequestContext) -> Reply:
        raise Unavailable("shed", code="overloaded", retry_after=1)

    with pytest.raises(Unavailable) as e:
        await p(ctx(), shed)
    assert e.value.code == "overloaded" and fallbacks(p, "shed") == 0


async def test_stream_failure_before_first_chunk_falls_back() -> None:
    p = plugin(fallback=[{"kind": "static"}])

    async def broken() -> AsyncIterator[dict[str, Any]]:
        raise EngineError("engine died")
        yield {}  # pragma: no cover

    async def engine(c: RequestContext) -> Reply:
        return Stream(broken())

    reply = await p(ctx(True), engine)
    assert isinstance(reply, Stream)
    chunks = [c async for c in reply]
    assert chunks and chunks[0]["choices"][0]["finish_reason"] == "stop"
    assert p.breaker.snapshot()["window_calls"] == 1


async def test_client_abort_mid_stream_releases_the_permit() -> None:
    clock = Clock()
    p = plugin(clock)
    for _ in range(2):
        with pytest.raises(EngineError):
            await p(ctx(), failing)
    clock.t += 5

    async def chunks() -> AsyncIterator[dict[str, Any]]:
        yield {"choices": []}
        await asyncio.Event().wait()
        yield {}  # pragma: no cover

    async def engine(c: RequestContext) -> Reply:
        return Stream(chunks())

    reply = await p(ctx(True), engine)  # a half-open trial
    assert isinstance(reply, Stream)
    it = reply.__aiter__()
    await it.__anext__()
    await reply.aclose()
    assert p.breaker.trials_in_flight == 0 and p.breaker.state == "half_open"


async def test_a_whole_answer_is_slow_only_by_the_engines_first_token() -> None:
    """An answer's length is the caller's: a long whole answer is not slow, from the
    in-process engine (it tells its first token) or an upstream (it tells none; a hung
    one times out, a failure). A late first token is."""
    import time

    p = plugin(slow_call_s=1, slow_call_rate=0.5, minimum_calls=4)

    async def upstream_whole(c: RequestContext) -> Reply:  # ten seconds, no token told
        c.engine_started = time.monotonic() - 10
        return Completion({"ok": True})

    async def local_whole(c: RequestContext) -> Reply:  # ten seconds, a token at once
        c.engine_started, c.engine_timed, c.engine_ttft_s = time.monotonic() - 10, True, 0.1
        return Completion({"ok": True})

    async def local_late(c: RequestContext) -> Reply:
        c.engine_started, c.engine_timed, c.engine_ttft_s = time.monotonic() - 10, True, 2.0
        return Completion({"ok": True})

    for f in (upstream_whole, local_whole) * 3:
        await p(ctx(), f)
    assert p.breaker.state == "closed" and p.breaker.snapshot()["window_calls"] == 6
    for _ in range(8):
        if p.breaker.state == "open":
            break
        await p(ctx(), local_late)
    assert p.breaker.state == "open"


async def test_a_whole_answer_still_generating_is_not_swept() -> None:
    """A whole answer tells its first token only with its end: one the engine has had
    past `slow_call_s` while others arrive is not taken for hung (it was, and a tenant's
    long whole answers would have opened the circuit); its own first token decides."""
    import time

    p = plugin(slow_call_s=1, slow_call_rate=0.5, minimum_calls=2)
    gate, both_in = asyncio.Event(), asyncio.Event()
    started = 0

    async def long_whole(c: RequestContext) -> Reply:
        nonlocal started
        c.engine_started, c.engine_timed = time.monotonic() - 10, True  # not live
        started += 1
        if started == 2:
            both_in.set()
        await gate.wait()
        c.engine_ttft_s = 0.1  # known at its end: the first token came at once
        return Completion({"ok": True})

    running = [asyncio.create_task(p(ctx(), long_whole)) for _ in range(2)]
    await both_in.wait()  # both are in the engine
    for _ in range(2):
        await p(ctx(), ok)  # each arrival sweeps
    gate.set()
    await asyncio.gather(*running)
    assert p.breaker.state == "closed" and p.breaker.snapshot()["window_calls"] == 4


def hung_since(p: BreakerPlugin, c: RequestContext) -> None:
    """The engine has answered nothing since `c` began (its start set back in time: what
    was heard since was heard before it)."""
    assert c.engine_started is not None
    p.heard_at = min(p.heard_at, c.engine_started)


async def test_a_healthy_upstreams_long_whole_answers_are_not_slow() -> None:
    """`whole_call_s` counted every whole answer of an upstream that ran past it as slow,
    in flight and at its end: a workload of long, healthy generations (each answered, the
    upstream answering others all along) opened the breaker. Its length is the caller's
    while the upstream answers others; only one silent as long is hung."""
    import time

    p = plugin(slow_call_s=1, slow_call_rate=0.5, minimum_calls=2, whole_call_s=5)
    gate, inside = asyncio.Event(), asyncio.Event()

    async def long_whole(c: RequestContext) -> Reply:  # an upstream's: not timed
        c.engine_started = time.monotonic() - 6  # past whole_call_s
        return Completion({"ok": True})

    async def long_in_flight(c: RequestContext) -> Reply:
        c.engine_started = time.monotonic() - 6
        inside.set()
        await gate.wait()
        return Completion({"ok": True})

    await p(ctx(), ok)  # the upstream answers
    running = asyncio.create_task(p(ctx(), long_in_flight))
    await inside.wait()
    for _ in range(4):  # ... the others, while the long one runs
        await p(ctx(), long_whole)
    assert p.health()["state"] == "closed"
    gate.set()
    await running
    assert p.breaker.state == "closed" and p.breaker.snapshot()["window_calls"] == 6


async def test_a_hung_upstream_whole_answer_is_slow_once_past_whole_call_s() -> None:
    """An upstream's whole answer tells nothing until its end: a hung upstream opened the
    breaker only when each call's `timeout_s` or deadline ended it (600 s by default),
    every call meanwhile hanging too. Past `whole_call_s` it is slow while still in
    flight, and the arrivals that sweep open the breaker; one shorter is not."""
    import time

    p = plugin(slow_call_s=1, slow_call_rate=0.5, minimum_calls=2, whole_call_s=5)
    gate, inside = asyncio.Event(), asyncio.Event()

    async def hung_whole(c: RequestContext) -> Reply:  # an upstream's: not timed
        c.engine_started = time.monotonic() - 6
        hung_since(p, c)
        hung_since(q, c)
        inside.set()
        await gate.wait()
        return Completion({"ok": True})

    async def long_whole(c: RequestContext) -> Reply:  # past slow_call_s, not whole_call_s
        c.engine_started = time.monotonic() - 4
        return Completion({"ok": True})

    q = plugin(slow_call_s=1, slow_call_rate=0.5, minimum_calls=2, whole_call_s=5)
    await p(ctx(), long_whole)
    assert p.breaker.state == "closed" and p.breaker.snapshot()["window_calls"] == 1
    running = asyncio.create_task(p(ctx(), hung_whole))
    await inside.wait()
    assert p.health()["state"] == "open"  # swept while it still hangs
    with pytest.raises(Unavailable) as e:
        await p(ctx(), ok)
    assert e.value.code == "circuit_open"
    gate.set()
    await running
    # ... and one that ends past it is slow at its end
    for _ in range(2):
        await q(ctx(), hung_whole)
    assert q.breaker.state == "open"


async def test_a_call_told_slow_in_flight_then_failing_counts_as_a_failure() -> None:
    """A hung call is told slow while in flight (past `whole_call_s` here); when it then
    fails (the upstream's timeout) it counts as a failure too: an upstream hanging on half
    its calls opens the breaker by its failure rate, as when hung calls counted only at
    their end, and not slow ones alone (their share under `slow_call_rate`)."""
    import time

    p = plugin(slow_call_s=1, slow_call_rate=1.0, minimum_calls=2, whole_call_s=5)
    gate, inside = asyncio.Event(), asyncio.Event()

    async def hung_then_timed_out(c: RequestContext) -> Reply:
        c.engine_started = time.monotonic() - 6
        hung_since(p, c)
        inside.set()
        await gate.wait()
        raise EngineError("upstream timed out")

    await p(ctx(), ok)
    running = asyncio.create_task(p(ctx(), hung_then_timed_out))
    await inside.wait()
    assert p.health()["state"] == "closed"  # swept: slow, 1 of 2 (under 1.0)
    assert p.breaker.snapshot()["window_calls"] == 2
    gate.set()
    with pytest.raises(EngineError):
        await running
    assert p.breaker.state == "open"  # its failure: 1 of 2 (at 0.5)
    # a verdict the window no longer holds is not told again
    clock = Clock()
    b = Breaker(POLICY, clock)
    permit = b.allow()
    assert permit is not None
    verdict = b.record(permit, failed=False, slow=True)
    assert verdict is not None
    clock.t += 11
    calls(b, [False, False, False])
    b.failed_after(verdict)
    calls(b, [True])
    assert b.state == "closed"  # 1 failure of 4


def _raises() -> int | None:
    raise AttributeError("vLLM keeps it elsewhere now")


@pytest.mark.parametrize(("progress", "slow"), [
    (lambda: 0, True),  # the engine says: none made, past slow_call_s: hung
    (lambda: 12, False),  # at work
    (lambda: None, False),  # it cannot say (the request just ended): not taken for hung
    (_raises, False),  # its internals moved: never a failure of the request sweeping
])
async def test_a_whole_answer_is_swept_only_on_the_engines_definite_zero(
        progress: Any, slow: bool) -> None:
    import time

    p = plugin(slow_call_s=1, slow_call_rate=0.5, minimum_calls=3)
    gate, inside = asyncio.Event(), asyncio.Event()

    async def whole(c: RequestContext) -> Reply:
        c.engine_started, c.engine_timed = time.monotonic() - 10, True  # not live
        c.engine_progress = progress
        inside.set()
        await gate.wait()
        c.engine_ttft_s = 0.1
        return Completion({"ok": True})

    running = asyncio.create_task(p(ctx(), whole))
    await inside.wait()
    assert isinstance(await p(ctx(), ok), Completion)  # it sweeps
    assert (p.breaker.snapshot()["window_calls"] == 2) is slow  # counted already, as slow
    gate.set()
    await running


@pytest.mark.parametrize(("status", "passed_on"), [
    (400, True), (413, True),  # the request's own fault, as the fallback saw it
    (404, False), (402, False),  # the fallback's own limits (a model, its credit)
])
@pytest.mark.parametrize("then_static", [False, True])
async def test_a_fallback_upstream_refusing_the_request_says_why_if_none_answers(
        status: int, passed_on: bool, then_static: bool) -> None:
    """With the breaker open and no fallback answering, the client got a 503
    `circuit_open` that says not to retry, which hid that the fallback found its request
    bad (`context_length_exceeded`). A later fallback still answers; an engine failure
    keeps its own error (the request may suit the engine once it is back)."""
    from proxy.upstream import UpstreamError

    chain: list[dict[str, Any]] = [{"kind": "upstream", "base_url": "http://127.0.0.1:9/v1",
                                    "breaker": {"minimum_calls": 2, "open_s": 5}}]
    if then_static:
        chain.append({"kind": "static", "content": "Busy, sorry."})
    p = plugin(fallback=chain)
    refusal = UpstreamError(status, {"error": {"message": "too long", "param": "messages",
                                               "code": "context_length_exceeded"}})

    async def refuse(c: RequestContext) -> Reply:
        raise refusal

    p.upstreams[0] = refuse  # type: ignore[assignment]
    for _ in range(2):
        if then_static:
            await check_static(await p(ctx(), failing), False)
        else:  # the engine failed: its error stands (the request may suit it later)
            with pytest.raises(EngineError):
                await p(ctx(), failing)
    assert p.breaker.state == "open"
    if then_static:
        await check_static(await p(ctx(), ok), False)
    elif passed_on:
        with pytest.raises(UpstreamError) as e:
            await p(ctx(), ok)
        assert e.value is refusal
    else:
        with pytest.raises(Unavailable) as u:
            await p(ctx(), ok)
        assert u.value.code == "circuit_open"


@pytest.mark.parametrize("stream", [False, True])
async def test_an_upstream_fallback_answers_within_the_requests_deadline(stream: bool) -> None:
    """The engine's call runs inside admission's deadline scope, a fallback outside it: a
    client's `x-weir-timeout-ms: 2000` got the upstream fallback's answer after 5 s with
    a 200 (its `timeout_s`, 60 s by default, was the only bound), and a fallback stream ran
    on past the deadline. Past it: a 504, and no later fallback (the static) answers."""
    import time

    from proxy.errors import DeadlineExceeded

    p = plugin(fallback=[{"kind": "upstream", "base_url": "http://127.0.0.1:9/v1"},
                         {"kind": "static", "content": "Busy, sorry."}])

    async def slow(c: RequestContext) -> Reply:
        await asyncio.sleep(30)
        return Completion({"late": True})

    async def quick_stream(c: RequestContext) -> Reply:
        async def chunks() -> AsyncIterator[dict[str, Any]]:
            yield {"choices": []}
        return Stream(chunks())

    p.upstreams[0] = quick_stream if stream else slow  # type: ignore[assignment]
    c = ctx(stream)
    c.deadline = time.monotonic() + 0.2
    if stream:
        reply = await p(c, failing)
        assert isinstance(reply, Stream) and reply.deadline == c.deadline
        assert reply.headers["x-weir-fallback"] == "upstream"
    else:
        with pytest.raises(DeadlineExceeded):
            await p(c, failing)
        assert fallbacks(p, "engine") == 0  # the static did not answer after it


async def test_a_half_open_trial_streaming_past_the_wait_closes_the_breaker() -> None:
    """Live: a trial streaming a healthy answer for longer than `half_open_max_wait_s`
    was taken for stuck by the next request's check and reopened the breaker, its success
    then discarded."""
    p, clock = await half_opened(half_open_calls=1, half_open_max_wait_s=3)
    more = asyncio.Event()

    async def chunks() -> AsyncIterator[dict[str, Any]]:
        yield {"choices": []}
        await more.wait()
        yield {"choices": []}

    async def engine(c: RequestContext) -> Reply:
        return Stream(chunks())

    reply = await p(ctx(True), engine)  # the trial: its first chunk in hand
    assert isinstance(reply, Stream)
    it = reply.__aiter__()
    await it.__anext__()
    clock.t += 10  # still answering, past the wait
    assert p.health()["state"] == "half_open"
    with pytest.raises(Unavailable):  # its slot is taken: circuit_open meanwhile
        await p(ctx(), ok)
    more.set()
    async for _ in it:
        pass
    assert p.breaker.state == "closed"


async def test_a_half_open_trials_whole_answer_under_way_is_not_stuck() -> None:
    """The in-process engine tells a whole answer's first token as it comes
    (`engine_ttft_s`): a trial generating a long whole answer is answering too."""
    p, clock = await half_opened(half_open_calls=1, half_open_max_wait_s=3)
    begun, done = asyncio.Event(), asyncio.Event()

    async def engine(c: RequestContext) -> Reply:
        c.engine_started, c.engine_ttft_s, c.engine_timed = 0.0, 0.1, True
        begun.set()
        await done.wait()
        return Completion({"ok": True})

    trial = asyncio.create_task(p(ctx(), engine))
    await begun.wait()
    clock.t += 10
    assert p.health()["state"] == "half_open"
    done.set()
    await trial
    assert p.breaker.state == "closed"


@pytest.mark.parametrize("whole_call_s", [100.0, None])
async def test_an_upstream_whole_answer_trial_is_judged_by_whole_call_s(
        whole_call_s: float | None) -> None:
    """An upstream's whole answer tells nothing until its end: as a half-open trial it
    was stuck after `half_open_max_wait_s` (30 s) however it fared, so where long whole
    answers are the traffic the breaker reopened at every trial. It is judged by
    `whole_call_s` as any such call is (slow, a failed trial, once past it); with that
    off, by its silence as before (a hung one must not hold the slot until its
    `timeout_s`)."""
    import time

    p, clock = await half_opened(half_open_calls=1, half_open_max_wait_s=3,
                                 whole_call_s=whole_call_s)
    begun, done = asyncio.Event(), asyncio.Event()

    async def upstream_whole(c: RequestContext) -> Reply:  # not timed: tells nothing
        c.engine_started = time.monotonic()
        begun.set()
        await done.wait()
        return Completion({"ok": True})

    trial = asyncio.create_task(p(ctx(), upstream_whole))
    await begun.wait()
    clock.t += 10
    assert p.health()["state"] == ("half_open" if whole_call_s else "open")
    done.set()
    await trial
    assert p.breaker.state == ("closed" if whole_call_s else "open")


async def test_the_state_gauge_half_opens_with_no_request_to_see_it() -> None:
    """An open breaker is half-open after `open_s` whether or not a request comes: the
    gauge (a dashboard's "open") said open until one did."""
    clock = Clock()
    p = plugin(clock)
    for _ in range(2):
        with pytest.raises(EngineError):
            await p(ctx(), failing)
    state = lambda: p.services.metrics.registry.get_sample_value("weir_breaker_state")  # noqa: E731
    assert state() == 2
    clock.t += 6  # past open_s (5)
    assert state() == 1
    assert p.services.metrics.registry.get_sample_value(
        "weir_breaker_transitions_total", {"from_state": "open", "to_state": "half_open"}) == 1


async def test_a_trial_that_stops_making_tokens_is_stuck_again() -> None:
    """A trial that has begun its answer is not stuck while the engine still makes its
    tokens (where the engine can say); one that stalls after its first is stuck once
    silent `half_open_max_wait_s`, and the breaker reopens (it stayed half-open, every
    request refused, until the trial's deadline or for good)."""
    p, clock = await half_opened(half_open_calls=1, half_open_max_wait_s=3)
    made, hang = [1], asyncio.Event()

    async def chunks() -> AsyncIterator[dict[str, Any]]:
        yield {"choices": []}
        await hang.wait()

    async def engine(c: RequestContext) -> Reply:
        c.engine_progress = lambda: made[0]
        return Stream(chunks())

    reply = await p(ctx(True), engine)  # the trial, its first chunk in hand
    assert isinstance(reply, Stream)
    for _ in range(3):  # making tokens, long past the wait
        clock.t += 2
        made[0] += 5
        assert p.health()["state"] == "half_open"
    clock.t += 2  # stalled: silent 2 s, then past the wait
    assert p.health()["state"] == "half_open"
    clock.t += 2
    assert p.health()["state"] == "open"
    hang.set()
    await reply.aclose()


async def test_no_fallback_answers_a_request_past_its_deadline() -> None:
    """The static fallback never awaits, so the deadline's scope never fired: a request
    whose engine failed at its deadline got the static answer, a 200, late."""
    import time

    from proxy.errors import DeadlineExceeded

    p = plugin(fallback=[{"kind": "static", "content": "Busy, sorry."}])
    c = ctx()
    c.deadline = time.monotonic() - 0.01
    with pytest.raises(DeadlineExceeded):
        await p(c, failing)
    assert fallbacks(p, "engine") == 0


async def test_a_whole_answer_trial_is_watched_by_the_engine_s_count() -> None:
    """A whole answer tells no first token until its end: a trial generating one past
    `half_open_max_wait_s` is alive while the engine's count of its tokens grows (it
    reopened the breaker), and stuck once that count stops."""
    p, clock = await half_opened(half_open_calls=1, half_open_max_wait_s=3)
    made, begun, release = [0], asyncio.Event(), asyncio.Event()

    async def engine(c: RequestContext) -> Reply:
        c.engine_progress = lambda: made[0]
        begun.set()
        await release.wait()
        return Completion({"ok": True})

    trial = asyncio.create_task(p(ctx(), engine))
    await begun.wait()
    for _ in range(3):  # generating, long past the wait
        clock.t += 2
        made[0] += 5
        assert p.health()["state"] == "half_open"
    clock.t += 2  # stalled
    assert p.health()["state"] == "half_open"
    clock.t += 2
    assert p.health()["state"] == "open"
    release.set()
    await trial


@pytest.mark.parametrize("stream", [False, True])
async def test_an_error_fallback_that_answers_is_counted(stream: bool) -> None:
    """`kind: error` ends the list with a clean error (the engine's own, or 503
    `circuit_open`) before any fallback after it: its `weir_fallbacks_total` series,
    made at 0 at start, never moved, so a dashboard counted no degraded answer."""
    p = plugin(fallback=[{"kind": "error"}, {"kind": "static", "content": "never"}])

    def count(kind: str, reason: str) -> float:
        return p.services.metrics.registry.get_sample_value(
            "weir_fallbacks_total", {"kind": kind, "reason": reason}) or 0.0

    for _ in range(2):
        with pytest.raises(EngineError):
            await p(ctx(stream), failing)
    assert p.breaker.state == "open" and count("error", "engine") == 2
    e = await open_breaker_error(p)
    assert e.code == "circuit_open"
    assert count("error", "open") == 1 and count("static", "open") == 0


@pytest.mark.parametrize("how", ["scope", "late", "stream"])
async def test_a_fallback_cut_at_the_deadline_is_counted_as_admission_counts_its_own(
        how: str) -> None:
    """Admission counts the requests their deadline cut
    (`weir_admission_deadline_exceeded_total`, through `ctx.deadline_cut`); a fallback runs
    outside it, and its 504s (its scope expired, the deadline gone before it began, its
    stream ended by the deadline) were not counted. They are, once each; an upstream's
    own time limit is not."""
    import time

    from proxy.errors import DeadlineExceeded
    from proxy.upstream import UpstreamDeadline

    p = plugin(fallback=[{"kind": "upstream", "base_url": "http://127.0.0.1:9/v1"}])
    cut: list[int] = []

    async def slow(c: RequestContext) -> Reply:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    def ends_with(e: Exception) -> Any:
        async def upstream(c: RequestContext) -> Reply:
            async def chunks() -> AsyncIterator[dict[str, Any]]:
                yield {"choices": []}
                raise e
            return Stream(chunks())
        return upstream

    for i, limit in enumerate((DeadlineExceeded("cut"), UpstreamDeadline())):
        p.upstreams[0] = ends_with(limit) if how == "stream" else slow  # type: ignore[assignment]
        c = ctx(how == "stream")
        c.deadline_cut = lambda: cut.append(1)
        c.deadline = time.monotonic() + (-0.01 if how == "late" else 0.05)
        if how == "stream":
            reply = await p(c, failing)
            assert isinstance(reply, Stream)
            with pytest.raises(type(limit)):
                async for _ in reply:
                    pass
        else:
            with pytest.raises(DeadlineExceeded):
                await p(c, failing)
        if i == 0:
            assert len(cut) == 1, how
        if how != "stream":
            break
    assert len(cut) == 1


@pytest.mark.parametrize("then_static", [False, True])
async def test_a_dead_upstream_fallback_is_skipped_by_its_own_breaker(then_static: bool) -> None:
    """An upstream fallback had no breaker of its own: while it was down every request
    paid its connect or its `timeout_s` before the next fallback or the 503 answered.
    Past the engine's thresholds it is skipped at once; after `open_s` one trial goes to
    it, and its answer closes its breaker again."""
    from proxy.errors import Timeout

    chain: list[dict[str, Any]] = [{"kind": "upstream", "base_url": "http://127.0.0.1:9/v1",
                                    "breaker": {"minimum_calls": 2, "open_s": 5}}]
    if then_static:
        chain.append({"kind": "static", "content": "Busy, sorry."})
    clock = Clock()
    p = plugin(clock, fallback=chain)
    asked = 0
    down = True

    async def upstream(c: RequestContext) -> Reply:
        nonlocal asked
        asked += 1
        if down:
            raise Timeout("The upstream did not answer in time.")
        return Completion({"fallback": True})

    p.upstreams[0] = upstream  # type: ignore[assignment]
    for _ in range(2):  # the engine fails, then the fallback too
        if then_static:
            await check_static(await p(ctx(), failing), False)
        else:
            with pytest.raises(EngineError):
                await p(ctx(), failing)
    assert p.breaker.state == "open" and asked == 2
    for _ in range(3):  # the dead fallback is not asked again
        if then_static:
            await check_static(await p(ctx(), ok), False)
        else:
            with pytest.raises(Unavailable) as e:
                await p(ctx(), ok)
            assert e.value.code == "circuit_open"
    assert asked == 2 and p.health()["fallback_states"] == {"0": "open"}
    down = False
    clock.t += 5  # both half-open: the engine's trial fails, the fallback's answers
    for n in (3, 4):  # ... which closes the fallback's breaker (the engine's is open)
        reply = await p(ctx(), failing if n == 3 else ok)
        assert isinstance(reply, Completion) and reply.body == {"fallback": True}
        assert reply.headers["x-weir-fallback"] == "upstream" and asked == n
    assert p.breaker.state == "open" and p.health()["fallback_states"] == {"0": "closed"}


async def _dead_fallback(stream_reply: bool) -> tuple[BreakerPlugin, Clock, dict[str, Any]]:
    """A breaker and its upstream fallback's own breaker, both opened (the engine and the
    fallback failing twice), `open_s` later: both half-open at the next call. The
    fallback answers once `state["down"]` is False: a primed stream it holds open until
    `state["done"]` is set, or a whole answer."""
    from proxy.errors import Timeout

    clock = Clock()
    p = plugin(clock, fallback=[{"kind": "upstream", "base_url": "http://127.0.0.1:9/v1",
                                 "breaker": {"minimum_calls": 2, "open_s": 5}}])
    state: dict[str, Any] = {"down": True, "done": asyncio.Event()}

    async def upstream(c: RequestContext) -> Reply:
        if state["down"]:
            raise Timeout("The upstream did not answer in time.")
        if not stream_reply:
            return Completion({"fallback": True})

        async def chunks() -> AsyncIterator[dict[str, Any]]:
            yield {"choices": [{"index": 0, "delta": {"content": "a"}}]}
            await state["done"].wait()
            yield {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}

        return await Stream(chunks()).prime()

    p.upstreams[0] = upstream  # type: ignore[assignment]
    for _ in range(2):
        with pytest.raises(EngineError):
            await p(ctx(), failing)
    assert p.health()["fallback_states"] == {"0": "open"}
    state["down"] = False
    clock.t += 5
    return p, clock, state


async def test_a_fallback_streamed_trial_answering_at_length_is_not_stuck() -> None:
    """An upstream fallback's half-open trial that streams was never told answering: a
    healthy one still streaming past its wait (the fallback's `timeout_s`) was judged
    stuck and reopened the fallback's breaker. Its first chunk is a sign of life, as the
    engine's trial's is (a stall is the upstream's `read_timeout_s`, a failure)."""
    p, clock, state = await _dead_fallback(stream_reply=True)
    reply = await p(ctx(stream=True), failing)  # the engine's trial fails; the fallback's
    assert isinstance(reply, Stream)            # streams
    clock.t += 120  # past its wait, still answering
    assert p.health()["fallback_states"] == {"0": "half_open"}
    state["done"].set()
    async for _ in reply:
        pass
    assert p.health()["fallback_states"] == {"0": "closed"}


async def test_an_upstream_fallback_s_breaker_has_its_own_settings() -> None:
    """An upstream fallback's breaker took the engine's thresholds: with the engine's
    `minimum_calls` (10 by default) a dead fallback was asked ten times in a window
    before it was skipped, though it is asked only while the engine is in trouble. It
    has its own (`fallback[].breaker`: 3 calls by default), and only an upstream has one."""
    from pydantic import ValidationError

    from proxy.errors import Timeout

    clock = Clock()
    p = plugin(clock, minimum_calls=10, open_s=60, fallback=[
        {"kind": "upstream", "base_url": "http://127.0.0.1:9/v1"},
        {"kind": "upstream", "base_url": "http://127.0.0.1:8/v1",
         "breaker": {"minimum_calls": 1, "open_s": 2}}])
    asked = [0, 0]

    def dead(i: int) -> Any:
        async def upstream(c: RequestContext) -> Reply:
            asked[i] += 1
            raise Timeout("The upstream did not answer in time.")
        return upstream

    p.upstreams[0], p.upstreams[1] = dead(0), dead(1)  # type: ignore[assignment]
    for _ in range(5):
        with pytest.raises(EngineError):
            await p(ctx(), failing)
    assert p.breaker.state == "closed"  # the engine's 10 calls are not reached
    assert asked == [3, 1]  # each fallback skipped past its own minimum_calls
    assert p.health()["fallback_states"] == {"0": "open", "1": "open"}
    clock.t += 2  # the second's own open_s
    assert p.health()["fallback_states"] == {"0": "open", "1": "half_open"}
    with pytest.raises(ValidationError):
        BreakerConfig.model_validate({"fallback": [
            {"kind": "static", "breaker": {"minimum_calls": 1}}]})


async def test_a_hung_call_with_no_other_traffic_is_told_by_a_scrape_alone() -> None:
    """The breaker has no timer: every observer sweeps first (a request before it takes a
    permit, `/health/ready`, a metrics scrape), so each sees the state a timer would
    have set. A hung call with no other traffic: the first scrape shows the breaker open
    and the transition counted (the state gauge, which sweeps, is collected before the
    counter). (Readiness is no plugin's to say: an open breaker's fallbacks or its 503
    `circuit_open` answer, and the instance can still serve.)"""
    import time

    from prometheus_client import generate_latest

    p = plugin(slow_call_s=1, slow_call_rate=0.5, minimum_calls=1, whole_call_s=5)
    gate, inside = asyncio.Event(), asyncio.Event()

    async def hung(c: RequestContext) -> Reply:  # an upstream's whole answer
        c.engine_started = time.monotonic() - 6
        hung_since(p, c)
        inside.set()
        await gate.wait()
        return Completion({"ok": True})

    running = asyncio.create_task(p(ctx(), hung))
    await inside.wait()
    scraped = generate_latest(p.services.metrics.registry).decode().splitlines()
    assert "weir_breaker_state 2.0" in scraped
    assert ('weir_breaker_transitions_total{from_state="closed",to_state="open"} 1.0'
            in scraped)
    gate.set()
    await running


async def test_a_fallback_raising_what_weir_does_not_name_goes_on_to_the_next() -> None:
    """A fallback raising an exception Weir has no name for (a bug below it, a library's
    own error from a malformed answer) escaped the fallback list as a 500: the next
    fallback was never tried. It is that fallback's failure (its breaker counts it) and
    the list goes on."""
    p = plugin(fallback=[{"kind": "upstream", "base_url": "http://127.0.0.1:9/v1",
                          "breaker": {"minimum_calls": 1}},
                         {"kind": "static", "content": "Busy; try later."}])

    async def broken(c: RequestContext) -> Reply:
        raise ValueError("a malformed answer")

    p.upstreams[0] = broken  # type: ignore[assignment]
    reply = await p(ctx(), failing)
    assert isinstance(reply, Completion)
    assert reply.headers["x-weir-fallback"] == "static"
    assert p.health()["fallback_states"] == {"0": "open"}


@pytest.mark.parametrize("asked", [False, True])
async def test_an_upstream_fallback_salts_its_prefix_cache_per_tenant_when_asked(
        asked: bool) -> None:
    """An upstream fallback had no `cache_salt` to set: a vLLM fallback shared its prefix
    cache between every tenant of this gateway (a prefix another tenant sent answered
    faster there, which told that it was sent), where the engine's upstream, asked, keeps
    them apart. Asked, each request to it carries its tenant's salt, keyed by its secret
    as the engine's is; not asked (a Weir or another server, which may refuse the field),
    none."""
    from proxy.auth import tenant_salt
    from tests.unit.test_upstream import Upstream as FakeUpstream
    from tests.unit.test_upstream import ctx as upstream_ctx

    up = FakeUpstream()
    await up.server.start_server()
    secret = "the-fallback-own-secret"
    p = plugin(fallback=[{"kind": "upstream", "base_url": up.base_url,
                          "on_behalf_of_secret": secret, "cache_salt": asked}])
    fallback = p.upstreams[0]
    await fallback.start()
    try:
        salts = []
        for tenant in ("a", "a", "b"):
            c = upstream_ctx()
            c.principal = Principal(tenant, "user", "u")
            await fallback(c)
            salts.append(up.seen[-1][1].get("cache_salt"))
    finally:
        await fallback.close()
        await up.server.close()
    if not asked:
        assert salts == [None, None, None]
    else:
        assert salts == [tenant_salt("a", secret), tenant_salt("a", secret),
                         tenant_salt("b", secret)]
        assert salts[0] != salts[2]
    from pydantic import ValidationError

    with pytest.raises(ValidationError):  # (only an upstream sends one)
        BreakerConfig.model_validate({"fallback": [{"kind": "static", "cache_salt": True}]})
