"""Admission: the priority gate, immediate shedding, deadlines, no permit leaks."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest

from plugins.admission.config import AdmissionConfig
from plugins.admission.plugin import AdmissionPlugin
from plugins.admission.queue import PriorityGate, Shed
from proxy.auth import Principal
from proxy.chain import Completion, Reply, Services, Stream
from proxy.context import RequestContext
from proxy.errors import EngineError, InvalidRequest, Timeout, Unavailable
from proxy.protocol import ChatCompletionRequest, CompletionRequest
from proxy.settings import Settings
from proxy.telemetry import Metrics
from proxy.upstream import NotCachedUpstream, UpstreamDeadline
from tests.fakes import FakeEngine
from tests.waiting import eventually


async def test_gate_orders_by_priority_then_arrival() -> None:
    gate = PriorityGate(1, 10)
    await gate.acquire(5, None)
    order: list[str] = []

    async def wait(name: str, prio: int) -> None:
        await gate.acquire(prio, None)
        order.append(name)
        gate.release()

    tasks = []
    for n, p in (("low-1", 10), ("high", 0), ("low-2", 10)):
        tasks.append(asyncio.create_task(wait(n, p)))
        await eventually(lambda: gate.waiting == len(tasks))  # queued in this order
    gate.release()
    await asyncio.gather(*tasks)
    assert order == ["high", "low-1", "low-2"] and gate.in_use == 0


async def test_full_queue_sheds_at_once_or_displaces_the_worst() -> None:
    gate = PriorityGate(1, 1)
    await gate.acquire(10, None)
    low = asyncio.create_task(gate.acquire(10, None))
    await eventually(lambda: gate.waiting == 1)
    with pytest.raises(Shed):
        await gate.acquire(10, None)  # same priority: shed immediately
    assert gate.waiting == 1 and not low.done()
    high = asyncio.create_task(gate.acquire(0, None))
    with pytest.raises(Shed):
        await low  # displaced by a better priority
    assert gate.waiting == 1 and not high.done()  # high took low's place in the queue
    gate.release()
    await high
    gate.release()
    assert gate.in_use == 0 and gate.waiting == 0


@pytest.mark.parametrize("priority", [0, 10])
async def test_a_waiter_cancelled_this_instant_holds_no_place(priority: int) -> None:
    """Its future is cancelled at once, but it leaves the list only on its next step:
    a newcomer in between neither fails displacing it (InvalidStateError, a 500) nor is
    shed for the place it held."""
    gate = PriorityGate(1, 1)
    await gate.acquire(10, None)
    gone = asyncio.create_task(gate.acquire(10, None))
    await eventually(lambda: gate.waiting == 1)
    gone.cancel()  # its future is cancelled now; its except block runs on a later step
    asyncio.get_running_loop().call_soon(gate.release)  # the permit frees after that
    await gate.acquire(priority, None)  # the newcomer, in the same instant: queued, granted
    assert gone.cancelled() and gate.in_use == 1 and gate.waiting == 0
    gate.release()
    assert gate.in_use == 0 and gate.waiting == 0


async def test_waiters_that_give_up_leave_no_leak() -> None:
    gate = PriorityGate(2, 50)
    rng = random.Random(1)

    async def user() -> None:
        try:
            await gate.acquire(rng.choice([0, 10]), rng.choice([0.001, 0.01, None]))
        except (TimeoutError, Shed):
            return
        await asyncio.sleep(0)
        gate.release()

    tasks = [asyncio.create_task(user()) for _ in range(500)]
    for t in rng.sample(tasks, 100):
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert gate.in_use == 0 and gate.waiting == 0


async def test_a_request_takes_a_permit_per_sequence_and_waits_its_turn() -> None:
    gate = PriorityGate(4, 10)
    await gate.acquire(5, None, gate.weight(3))
    assert gate.in_use == 3
    two = asyncio.create_task(gate.acquire(5, None, 2))
    await eventually(lambda: gate.waiting == 1)
    # One permit is free, but the waiter before it needs two: the later one queues too
    # (smaller requests do not pass a larger one for ever).
    one = asyncio.create_task(gate.acquire(5, None, 1))
    await eventually(lambda: gate.waiting == 2)
    assert not two.done() and not one.done()
    gate.release(3)
    await asyncio.gather(two, one)
    assert gate.in_use == 3 and gate.waiting == 0
    assert gate.weight(100) == 4 and gate.weight(0) == 1  # all permits at most: it can run


async def test_a_large_waiter_giving_up_lets_the_next_ones_in() -> None:
    gate = PriorityGate(2, 10)
    await gate.acquire(5, None)
    heavy = asyncio.create_task(gate.acquire(5, 30, 2))
    await eventually(lambda: gate.waiting == 1)
    light = asyncio.create_task(gate.acquire(5, None, 1))
    await eventually(lambda: gate.waiting == 2)
    heavy.cancel()
    await light  # the free permit was held back for `heavy` only
    with pytest.raises(asyncio.CancelledError):
        await heavy
    assert gate.in_use == 2 and gate.waiting == 0


async def test_a_newcomer_ahead_of_a_heavy_waiter_takes_free_permits() -> None:
    gate = PriorityGate(4, 1)
    await gate.acquire(5, None, 2)
    heavy = asyncio.create_task(gate.acquire(5, 30, 4))
    await eventually(lambda: gate.waiting == 1)
    await gate.acquire(0, 30, 1)  # better priority, displaces the heavy one, and fits now
    with pytest.raises(Shed):
        await heavy
    ahead = asyncio.create_task(gate.acquire(0, 30, 1))  # queue empty: the fast path
    await ahead
    assert gate.in_use == 4 and gate.waiting == 0


async def test_weighted_waiters_that_give_up_leave_no_leak() -> None:
    gate = PriorityGate(4, 50)
    rng = random.Random(2)

    async def user() -> None:
        weight = gate.weight(rng.choice([1, 1, 2, 3, 8]))
        try:
            await gate.acquire(rng.choice([0, 10]), rng.choice([0.001, 0.01, None]), weight)
        except (TimeoutError, Shed):
            return
        assert gate.in_use <= 4
        await asyncio.sleep(0)
        gate.release(weight)

    tasks = [asyncio.create_task(user()) for _ in range(500)]
    for t in rng.sample(tasks, 100):
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert gate.in_use == 0 and gate.waiting == 0


def ctx(headers: dict[str, str] | None = None, role: str = "user",
        stream: bool = False) -> RequestContext:
    req = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream})
    return RequestContext(route="chat", request=req, principal=Principal("t", role, "u"),
                          request_id="r", headers=headers or {})


def plugin(**cfg: Any) -> AdmissionPlugin:
    services = Services(terminal=FakeEngine(), settings=Settings(), metrics=Metrics())
    return AdmissionPlugin(AdmissionConfig.model_validate(cfg), services)


async def test_shed_is_immediate_503_with_retry_after() -> None:
    p = plugin(max_concurrent=1, max_queue=0)
    gate, entered = asyncio.Event(), asyncio.Event()

    async def slow(c: RequestContext) -> Reply:
        entered.set()
        await gate.wait()
        return Completion({})

    first = asyncio.create_task(p(ctx(), slow))
    await entered.wait()  # the first request holds the only permit
    with pytest.raises(Unavailable) as e:
        await p(ctx(), slow)
    assert e.value.code == "overloaded" and "retry-after" in e.value.headers
    gate.set()
    await first
    assert p.gate.in_use == 0


def in_engine(p: AdmissionPlugin) -> float:
    return p.services.metrics.registry.get_sample_value("weir_admission_in_engine") or 0.0


class Held:
    """A terminal that holds every request until `gate` is set (`held`: one came)."""

    def __init__(self) -> None:
        self.held, self.gate = asyncio.Event(), asyncio.Event()

    async def __call__(self, c: RequestContext) -> Reply:
        self.held.set()
        await self.gate.wait()
        return Completion({})


def three_prompts(**sampling: Any) -> RequestContext:
    """A completion of three prompts, `n: 2` each."""
    req = CompletionRequest.model_validate(
        {"model": "m", "prompt": ["a", "b", "c"], "n": 2, **sampling})
    return RequestContext(route="completion", request=req,
                          principal=Principal("t", "user", "u"), request_id="r")


async def test_a_multi_prompt_completion_holds_a_permit_per_sequence() -> None:
    p, slow = plugin(max_concurrent=8, max_queue=4), Held()
    first = asyncio.create_task(p(three_prompts(temperature=1), slow))
    await slow.held.wait()
    assert p.gate.in_use == 6 and in_engine(p) == 6
    second = asyncio.create_task(p(ctx(), slow))  # 2 permits left: it gets one
    third = asyncio.create_task(p(ctx(), slow))
    fourth = asyncio.create_task(p(ctx(), slow))  # waits: six, one and one are taken
    await eventually(lambda: p.gate.in_use == 8 and p.gate.waiting == 1)
    slow.gate.set()
    await asyncio.gather(first, second, third, fourth)
    assert p.gate.in_use == 0 and in_engine(p) == 0


@pytest.mark.parametrize(("sampling", "permits"), [
    ({"temperature": 0}, 3), ({"top_p": 0}, 3), ({"temperature": 1}, 6), ({}, 6)])
async def test_a_greedy_request_holds_a_permit_per_prompt(sampling: dict[str, Any],
                                                          permits: int) -> None:
    """Its `n` choices are one answer in the engine, handed out `n` times: it held `n`
    permits per prompt (`n: 64` at temperature 0 took a whole default gate)."""
    p, slow = plugin(max_concurrent=8, max_queue=4), Held()
    first = asyncio.create_task(p(three_prompts(**sampling), slow))
    await slow.held.wait()
    assert p.gate.in_use == permits
    slow.gate.set()
    await first
    assert p.gate.in_use == 0


async def test_embeddings_take_no_engine_permit() -> None:
    """Embeddings run on the embedding model, beside the engine: queued behind one
    another there, they held every engine permit while the engine stood idle, and a
    chat request waited for them (19 s behind 20 large embeddings calls) or was shed."""
    p, held = plugin(max_concurrent=1, max_queue=1), Held()
    view = CompletionRequest.model_construct(model="e", prompt=["x"], max_tokens=1, n=1)
    embeddings = [RequestContext(route="embeddings", request=view,
                                 principal=Principal("t", "user", "u"), request_id=f"e{i}")
                  for i in range(2)]
    first = asyncio.create_task(p(embeddings[0], held))
    await held.held.wait()
    second = asyncio.create_task(p(embeddings[1], held))  # waits: embeddings' own permit
    await eventually(lambda: p.services.metrics.registry.get_sample_value(
        "weir_admission_queue_depth") == 1)
    assert await p(ctx(), lambda c: _completed()) is not None  # at once: the engine's free
    assert p.gate.in_use == 0 and in_engine(p) == 0
    held.gate.set()
    await asyncio.gather(first, second)
    assert p.health()["embeddings"] == {"in_use": 0, "waiting": 0}


async def _completed() -> Reply:
    return Completion({})


async def test_deadline_header_cuts_the_request() -> None:
    p = plugin()
    aborted = asyncio.Event()

    async def hang(c: RequestContext) -> Reply:
        try:
            await asyncio.Event().wait()
        finally:
            aborted.set()
        raise AssertionError("unreachable")

    with pytest.raises(Timeout):
        await p(ctx({"x-weir-timeout-ms": "20"}), hang)
    assert aborted.is_set() and p.gate.in_use == 0


@pytest.mark.parametrize(("raw", "seconds"), [
    ("20", 0.02), ("5000, 20", 0.02), ("20,5000", 0.02), ("20, ", 0.02), ("1e3", 1.0),
    ("0.5", 0.0005),
])
def test_a_deadline_header_sent_twice_keeps_the_shorter(raw: str, seconds: float) -> None:
    """Sent on two lines the header is one list (`5000, 20`): the shortest value holds."""
    c = ctx({"x-weir-timeout-ms": raw})
    plugin(deadline_s=300).enter(c)
    assert c.deadline is not None
    assert c.deadline - c.started == pytest.approx(seconds)


@pytest.mark.parametrize("raw", ["0", "-1", "abc", "", " ", "inf", "nan", "1_000", "+5",
                                 "x, 20", "20, -5", "1e999"])
@pytest.mark.parametrize("name", ["x-weir-timeout-ms", "x-request-timeout-ms"])
def test_a_deadline_header_that_is_no_positive_number_is_a_400(raw: str, name: str) -> None:
    """A value that is no positive number of milliseconds was ignored (`deadline_s`
    held): the client thought it had set a deadline. It is a 400 naming the header the
    plugin reads (its `deadline_header`)."""
    c = ctx({name: raw})
    with pytest.raises(InvalidRequest) as caught:
        plugin(deadline_s=300, deadline_header=name).enter(c)
    assert caught.value.status == 400 and caught.value.code == "invalid_value"
    assert f"`{name}` header" in caught.value.message
    assert c.deadline is None


async def test_stream_deadline_and_release() -> None:
    p = plugin()

    async def chunks() -> AsyncIterator[dict[str, Any]]:
        yield {"n": 1}
        await asyncio.Event().wait()
        yield {"n": 2}  # pragma: no cover

    async def engine(c: RequestContext) -> Reply:
        return Stream(chunks())

    reply = await p(ctx({"x-weir-timeout-ms": "30"}, stream=True), engine)
    assert isinstance(reply, Stream) and p.gate.in_use == 1
    got = []
    with pytest.raises(Timeout):
        async for c in reply:
            got.append(c)
    assert got == [{"n": 1}] and p.gate.in_use == 0
    assert deadline_count(p) == 1  # (a stream its deadline cut counts; see below)


async def test_thousands_of_mixed_requests_leave_no_permit() -> None:
    p = plugin(max_concurrent=4, max_queue=16, max_queue_wait_s=0.05)
    rng = random.Random(3)

    async def engine(c: RequestContext) -> Reply:
        kind = rng.random()
        await asyncio.sleep(0)
        if kind < 0.2:
            raise EngineError("boom")
        if kind < 0.4:
            async def chunks() -> AsyncIterator[dict[str, Any]]:
                for i in range(3):
                    await asyncio.sleep(0)
                    yield {"i": i}
            return Stream(chunks())
        return Completion({})

    async def client() -> None:
        try:
            reply = await p(ctx({"x-weir-timeout-ms": str(rng.choice([1, 50, 1000]))},
                                stream=True), engine)
            if isinstance(reply, Stream):
                async for _ in reply:
                    if rng.random() < 0.3:
                        break  # client goes away mid-stream
                await reply.aclose()
        except (EngineError, Timeout, Unavailable):
            pass

    tasks = [asyncio.create_task(client()) for _ in range(2000)]
    for t in rng.sample(tasks, 300):
        t.get_loop().call_soon(t.cancel)
    await asyncio.gather(*tasks, return_exceptions=True)
    assert p.gate.in_use == 0 and p.gate.waiting == 0


@pytest.mark.parametrize(("header_ms", "max_wait_s", "expected"), [
    ("3000", 10.0, Timeout),  # its own deadline bounded the wait: 504, no shed load
    ("30000", 1.0, Unavailable),  # the queue's bound came first: shed, 503
])
async def test_a_wait_cut_by_the_request_s_own_deadline_is_a_504(
        header_ms: str, max_wait_s: float, expected: type[Exception],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Which bound ended the wait decides the answer, not the clock read after it: a
    timer may fire a clock tick before the deadline (a 503 `queue_timeout`, counted as
    shed load, came back for one of twelve requests cut by their own 3 s deadline)."""
    p = plugin(max_queue_wait_s=max_wait_s)

    async def times_out(priority: int, wait: float | None, weight: int = 1,
                        owner: str = "") -> None:
        raise TimeoutError  # the wait ended, a tick before the deadline

    monkeypatch.setattr(p.gate, "acquire", times_out)
    with pytest.raises(expected) as e:
        await p(ctx({"x-weir-timeout-ms": header_ms}), lambda c: Completion({}))  # type: ignore[arg-type, return-value]
    if expected is Unavailable:
        assert e.value.code == "queue_timeout"  # type: ignore[attr-defined]


def deadline_count(p: AdmissionPlugin) -> float:
    return p.services.metrics.registry.get_sample_value(
        "weir_admission_deadline_exceeded_total") or 0.0


@pytest.mark.parametrize("raised", [
    NotCachedUpstream("No cached answer upstream."), UpstreamDeadline()])
async def test_a_deadline_error_from_the_terminal_is_no_deadline_of_admission(
        raised: Exception) -> None:
    """`weir_admission_deadline_exceeded_total` counts the requests its own deadline
    scope cut: an upstream Weir's only-if-cached miss (the client's choice) or the
    upstream's own time limit is a DeadlineExceeded too, but no request cut at its
    deadline. The permit is released either way."""
    p = plugin()

    async def terminal(c: RequestContext) -> Reply:
        raise raised

    with pytest.raises(type(raised)):
        await p(ctx({"x-weir-timeout-ms": "60000"}), terminal)
    assert deadline_count(p) == 0 and p.gate.in_use == 0
    async def hang(c: RequestContext) -> Reply:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    with pytest.raises(Timeout):  # (its own scope's expiry still counts)
        await p(ctx({"x-weir-timeout-ms": "1"}), hang)
    assert deadline_count(p) == 1 and p.gate.in_use == 0


async def test_a_stream_cut_by_its_upstream_s_own_limit_is_no_deadline_of_admission() -> None:
    """A stream that ends with the upstream's own time limit (`UpstreamDeadline`, a
    DeadlineExceeded too) was counted in `weir_admission_deadline_exceeded_total`, as if
    the request's deadline had cut it (one its deadline cuts counts: above)."""
    p = plugin()

    async def cut() -> AsyncIterator[dict[str, Any]]:
        yield {"n": 1}
        raise UpstreamDeadline()

    async def upstream(c: RequestContext) -> Reply:
        return Stream(cut())

    reply = await p(ctx({"x-weir-timeout-ms": "60000"}, stream=True), upstream)
    assert isinstance(reply, Stream)
    with pytest.raises(UpstreamDeadline):
        async for _ in reply:
            pass
    assert deadline_count(p) == 0 and p.gate.in_use == 0


@pytest.mark.parametrize("name", ["X-Request-Timeout-Ms", "x-request-timeout-ms",
                                  " X-REQUEST-TIMEOUT-MS "])
def test_a_deadline_header_named_in_any_case_is_read(name: str) -> None:
    """Request headers are held by lower-cased name: a configured name with capitals
    (as HTTP headers are often written) still shortens the deadline."""
    c = ctx({"x-request-timeout-ms": "20"})
    plugin(deadline_s=300, deadline_header=name).enter(c)
    assert c.deadline is not None and c.deadline - c.started == pytest.approx(0.02)


@pytest.mark.parametrize("name", ["", "x weir", "x-weir:", "x-wéir"])
def test_a_deadline_header_that_is_no_header_name_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="no HTTP header name"):
        AdmissionConfig.model_validate({"deadline_header": name})


def waits_observed(p: AdmissionPlugin) -> float:
    return p.services.metrics.registry.get_sample_value(
        "weir_admission_queue_wait_seconds_count") or 0.0


async def test_every_wait_is_observed_whatever_ended_it() -> None:
    """`weir_admission_queue_wait_seconds` observed only the waits a permit ended: one
    its bound ran out (503 `queue_timeout`), its client left, or a better request
    displaced was not there, so under overload its percentiles showed only the waits
    that were short enough. A request shed at once never waited: not observed."""
    p = plugin(max_concurrent=1, max_queue=1, max_queue_wait_s=0.05,
               priorities={"admin": 0})
    release, entered = asyncio.Event(), asyncio.Event()

    async def held(c: RequestContext) -> Reply:
        entered.set()
        await release.wait()
        return Completion({})

    first = asyncio.create_task(p(ctx(), held))
    await entered.wait()
    assert waits_observed(p) == 1  # (a permit at once: a wait of 0)
    with pytest.raises(Unavailable) as e:  # its bound ran out
        await p(ctx(), held)
    assert e.value.code == "queue_timeout" and waits_observed(p) == 2
    gone = asyncio.create_task(p(ctx(), held))  # its client leaves while it waits
    await eventually(lambda: p.gate.waiting == 1)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert waits_observed(p) == 3
    p.cfg.max_queue_wait_s = 30
    low = asyncio.create_task(p(ctx(), held))
    await eventually(lambda: p.gate.waiting == 1)
    with pytest.raises(Unavailable):  # the queue is full: shed at once, never waited
        await p(ctx(), held)
    assert waits_observed(p) == 3
    high = asyncio.create_task(p(ctx(role="admin"), held))  # displaces the waiter
    with pytest.raises(Unavailable):
        await low
    assert waits_observed(p) == 4
    release.set()
    await first
    await high
    assert waits_observed(p) == 5 and p.gate.in_use == 0


async def test_a_shed_request_lets_go_of_what_was_prepared_ahead() -> None:
    # A breaker's fallback answers a shed request, its context held meanwhile: what the
    # terminal prepared ahead (a long prompt's token ids) is no longer kept on it.
    p, slow = plugin(max_concurrent=1, max_queue=1), Held()
    first = asyncio.create_task(p(ctx(), slow))
    await slow.held.wait()
    shed = ctx()

    async def prepare(c: RequestContext) -> None:
        if c is not shed:
            return
        c.prepared = (c.request, object())
        second = asyncio.create_task(p(ctx(), slow))  # the wait list fills meanwhile
        await eventually(lambda: p.gate.waiting == 1)
        tasks.append(second)

    tasks: list[asyncio.Task[Reply]] = []
    p.services.terminal.prepare = prepare  # type: ignore[method-assign]
    with pytest.raises(Unavailable) as e:
        await p(shed, slow)
    assert e.value.code == "overloaded" and shed.prepared is None
    slow.gate.set()
    await first
    await asyncio.gather(*tasks)


def queue_depth(p: AdmissionPlugin) -> float:
    return p.services.metrics.registry.get_sample_value("weir_admission_queue_depth") or 0.0


async def test_a_scrape_reads_the_gauges_as_the_gate_stands() -> None:
    """Read at the scrape, not set at each of a request's steps (four updates per
    request): a waiter granted by another's release is in the engine, not waiting,
    before its own task runs again."""
    p = plugin(max_concurrent=1, max_queue=4)
    await p.gate.acquire(0, None)  # (a permit held elsewhere)
    waiter = asyncio.create_task(p(ctx(), lambda c: _completed()))
    await eventually(lambda: p.gate.waiting == 1)
    assert queue_depth(p) == 1 and in_engine(p) == 1
    p.gate.release()  # grants the waiter, whose task has not run since
    assert queue_depth(p) == 0 and in_engine(p) == 1
    await waiter
    assert queue_depth(p) == 0 and in_engine(p) == 0


async def test_the_deadline_is_worked_out_once_per_request(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """`enter` sets the request's deadline (header and all) before the chain runs: the
    plugin's call does not work it out again; called with no `enter` (a chain built
    without hooks) it still does."""
    import plugins.admission.plugin as admission
    from proxy.chain import compose

    calls: list[str | None] = []
    real = admission.asked_limit

    def counted(raw: str | None, *args: Any) -> float | None:
        calls.append(raw)
        return real(raw, *args)

    monkeypatch.setattr(admission, "asked_limit", counted)
    p = plugin(deadline_s=300)

    async def done(c: RequestContext) -> Reply:
        return Completion({})

    c = ctx({"x-weir-timeout-ms": "5000"})
    await compose([p], done)(c)
    assert calls == ["5000"] and c.deadline is not None
    assert c.deadline == pytest.approx(c.started + 5.0)
    bare = ctx({"x-weir-timeout-ms": "4000"})
    await p(bare, done)
    assert bare.deadline == pytest.approx(bare.started + 4.0)
