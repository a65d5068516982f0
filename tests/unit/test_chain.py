"""The chain framework, driven by small test plugins (the real plugins have their own)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any, ClassVar, Literal

import pytest
from pydantic import Field

from proxy.auth import Principal
from proxy.chain import (
    BasePlugin,
    Completion,
    PluginConfig,
    Reply,
    Services,
    Stream,
    build_plugins,
    compose,
    register,
    unregister,
    validate_plugins,
)
from proxy.context import RequestContext
from proxy.errors import RateLimited
from proxy.protocol import ChatCompletionRequest
from proxy.settings import ConfigError, PluginSpec, Settings
from proxy.telemetry import Metrics
from tests.fakes import FakeEngine


def ctx() -> RequestContext:
    req = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    return RequestContext(route="chat", request=req, principal=Principal("t", "user", "u"),
                          request_id="r1")


class TraceConfig(PluginConfig):
    tag: str = Field("x", description="label written to the trace")


class TracePlugin(BasePlugin):
    """Records entry and exit around call_next."""

    name: ClassVar[str] = "t_trace"
    Config = TraceConfig
    log: ClassVar[list[str]] = []

    async def __call__(self, ctx: RequestContext, call_next: Any) -> Reply:
        tag = self.config.tag  # type: ignore[attr-defined]
        self.log.append(f"in:{tag}")
        try:
            return await call_next(ctx)
        finally:
            self.log.append(f"out:{tag}")


class ShortCircuit(BasePlugin):
    name: ClassVar[str] = "t_short"

    async def __call__(self, ctx: RequestContext, call_next: Any) -> Reply:
        return Completion({"short": True}, headers={"x-short": "1"})


class First(BasePlugin):
    name: ClassVar[str] = "t_first"
    placement: ClassVar[Literal["first", "any", "last"]] = "first"


class Last(BasePlugin):
    name: ClassVar[str] = "t_last"
    placement: ClassVar[Literal["first", "any", "last"]] = "last"


class Early(BasePlugin):
    name: ClassVar[str] = "t_early"
    before: ClassVar[tuple[str, ...]] = ("t_trace",)


@pytest.fixture(autouse=True)
def _registry() -> Iterator[None]:
    for cls in (TracePlugin, ShortCircuit, First, Last, Early):
        register(cls)
    TracePlugin.log = []
    yield
    for cls in (TracePlugin, ShortCircuit, First, Last, Early):
        unregister(cls.name)


def services() -> Services:
    return Services(terminal=FakeEngine(), settings=Settings(), metrics=Metrics())


def plugins(*specs: dict[str, Any]) -> list[BasePlugin]:
    return build_plugins([PluginSpec.model_validate(s) for s in specs], services())


async def terminal(ctx: RequestContext) -> Reply:
    return Completion({"terminal": True})


async def test_plugins_run_outermost_first() -> None:
    chain = compose(plugins({"name": "t_trace", "config": {"tag": "a"}}), terminal)  # type: ignore[arg-type]
    reply = await chain(ctx())
    assert isinstance(reply, Completion) and reply.body == {"terminal": True}
    assert TracePlugin.log == ["in:a", "out:a"]


async def test_short_circuit_skips_the_rest() -> None:
    called = []

    async def term(c: RequestContext) -> Reply:
        called.append(1)
        return Completion({})

    ps = plugins({"name": "t_trace"}, {"name": "t_short"})
    reply = await compose(ps, term)(ctx())  # type: ignore[arg-type]
    assert isinstance(reply, Completion) and reply.body == {"short": True}
    assert called == [] and TracePlugin.log == ["in:x", "out:x"]


async def test_errors_propagate_through_plugins() -> None:
    async def boom(c: RequestContext) -> Reply:
        raise RateLimited("slow down")

    with pytest.raises(RateLimited):
        await compose(plugins({"name": "t_trace"}), boom)(ctx())  # type: ignore[arg-type]
    assert TracePlugin.log == ["in:x", "out:x"]


async def test_stream_end_hook_runs_once_on_cancel() -> None:
    cleaned: list[str] = []
    gate = asyncio.Event()

    async def source() -> AsyncIterator[dict[str, Any]]:
        try:
            yield {"n": 0}
            await gate.wait()  # never set: the consumer is cancelled while waiting
            yield {"n": 1}
        finally:
            cleaned.append("source")

    class Hooked(BasePlugin[Any]):
        name: ClassVar[str] = "t_hooked"

        async def __call__(self, ctx: RequestContext, call_next: Any) -> Reply:
            reply = await call_next(ctx)
            assert isinstance(reply, Stream)
            reply.on_end(lambda s, outcome: cleaned.append(f"hook:{outcome}"))
            return reply

    async def term(c: RequestContext) -> Reply:
        return Stream(source())

    register(Hooked)
    try:
        reply = await compose(plugins({"name": "t_hooked"}), term)(ctx())  # type: ignore[arg-type]
        assert isinstance(reply, Stream)
        it = reply.__aiter__()
        assert await it.__anext__() == {"n": 0}
        waiting = asyncio.Event()

        async def next_chunk() -> Any:
            waiting.set()
            return await it.__anext__()

        task = asyncio.ensure_future(next_chunk())
        await waiting.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await reply.aclose()
        # The source's finally ran (the engine would abort) and the hook saw the outcome,
        # exactly once.
        assert cleaned == ["source", "hook:cancelled"]
        await reply.end("completed")
        assert cleaned == ["source", "hook:cancelled"]
    finally:
        unregister("t_hooked")


async def test_end_hooks_run_in_order_and_survive_a_failing_hook() -> None:
    seen: list[str] = []

    async def source() -> AsyncIterator[dict[str, Any]]:
        yield {"n": 0}

    stream = Stream(source())

    def bad(s: Stream, outcome: str) -> None:
        raise RuntimeError("hook bug")

    async def inner(s: Stream, outcome: str) -> None:
        seen.append(f"inner:{outcome}")

    stream.on_end(inner)
    stream.on_end(bad)
    stream.on_end(lambda s, outcome: seen.append(f"outer:{outcome}"))
    assert [c async for c in stream] == [{"n": 0}]
    assert seen == ["inner:completed", "outer:completed"]
    late = asyncio.Event()

    async def too_late(s: Stream, outcome: str) -> None:
        seen.append(f"late:{outcome}")
        late.set()

    stream.on_end(too_late)  # it has ended: the hook still runs, with how it ended
    async with asyncio.timeout(5):
        await late.wait()
    assert seen == ["inner:completed", "outer:completed", "late:completed"]


async def test_primed_stream_raises_before_any_output_and_ends_failed() -> None:
    seen: list[str] = []

    async def source() -> AsyncIterator[dict[str, Any]]:
        raise RuntimeError("engine refused")
        yield {}  # pragma: no cover

    stream = Stream(source())
    stream.on_end(lambda s, outcome: seen.append(outcome))
    with pytest.raises(RuntimeError):
        await stream.prime()
    assert seen == ["failed"] and isinstance(stream.error, RuntimeError)


def test_config_is_validated_with_paths() -> None:
    with pytest.raises(ConfigError) as e:
        validate_plugins([PluginSpec(name="t_trace", config={"tag": 1, "nope": 2})])
    paths = {p for p, _ in e.value.errors}
    assert paths == {"plugins[0].config.tag", "plugins[0].config.nope"}


def test_unknown_and_duplicate_plugins_are_refused() -> None:
    with pytest.raises(ConfigError) as e:
        validate_plugins([PluginSpec(name="nope"), PluginSpec(name="t_trace"),
                          PluginSpec(name="t_trace")])
    assert [p for p, _ in e.value.errors] == ["plugins[0].name", "plugins[2].name"]


def test_disabled_plugins_are_skipped() -> None:
    assert validate_plugins([PluginSpec(name="t_trace", enabled=False)]) == []


@pytest.mark.parametrize(
    ("names", "bad"),
    [
        (["t_trace", "t_first"], "plugins[1]"),
        (["t_last", "t_trace"], "plugins[1]"),
        (["t_trace", "t_early"], "plugins[1]"),
    ],
)
def test_order_rules(names: list[str], bad: str) -> None:
    with pytest.raises(ConfigError) as e:
        validate_plugins([PluginSpec(name=n) for n in names])
    assert e.value.errors[0][0] == bad


def test_good_order_passes() -> None:
    names = ["t_first", "t_early", "t_trace", "t_last"]
    assert [c.name for c, _, _ in validate_plugins([PluginSpec(name=n) for n in names])] == names


async def test_a_cancellation_while_closing_skips_no_end_hook() -> None:
    """Closing the source awaits (an engine abort under way); a client gone in that
    moment still frees what every plugin holds."""
    seen: list[str] = []
    closing = asyncio.Event()

    async def source() -> AsyncIterator[dict[str, Any]]:
        try:
            yield {"n": 0}
        finally:
            closing.set()
            await asyncio.Event().wait()  # a slow abort: cancelled below

    stream = Stream(source())
    it = stream.rest()
    assert await it.__anext__() == {"n": 0}
    stream.on_end(lambda s, outcome: seen.append(f"slot:{outcome}"))
    task = asyncio.ensure_future(stream.end("cancelled"))
    await closing.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["slot:cancelled"] and stream.ended


async def test_hooks_after_an_interrupted_async_hook_still_run() -> None:
    seen: list[str] = []
    entered, done = asyncio.Event(), asyncio.Event()

    async def source() -> AsyncIterator[dict[str, Any]]:
        yield {"n": 0}

    async def slow(s: Stream, outcome: str) -> None:
        entered.set()
        await asyncio.Event().wait()  # cancelled below

    def lease(s: Stream, outcome: str) -> None:
        seen.append(f"lease:{outcome}")
        done.set()

    stream = Stream(source())
    stream.on_end(slow)
    stream.on_end(lease)
    task = asyncio.ensure_future(stream.end("completed"))
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(done.wait(), 10)  # in a task of its own
    assert seen == ["lease:completed"]


async def test_a_hook_cancelled_on_its_own_is_a_failed_hook() -> None:
    """A CancelledError out of a hook while nobody cancels the stream's ender (a task the
    hook awaited was cancelled): logged, and the rest run in place; `end` returns."""
    seen: list[str] = []

    async def source() -> AsyncIterator[dict[str, Any]]:
        yield {"n": 0}

    async def awaits_a_cancelled_task(s: Stream, outcome: str) -> None:
        inner = asyncio.ensure_future(asyncio.Event().wait())
        inner.cancel()
        await inner

    stream = Stream(source())
    stream.on_end(awaits_a_cancelled_task)
    stream.on_end(lambda s, outcome: seen.append(f"slot:{outcome}"))
    await stream.end("completed")
    assert seen == ["slot:completed"]


async def test_a_hook_registered_while_the_stream_closes_runs_after_the_earlier_ones() -> None:
    """`end` marks the stream ended, closes the source, then runs the hooks: a hook
    registered in between waits its turn instead of running at once, out of order."""
    closing, release = asyncio.Event(), asyncio.Event()
    seen: list[str] = []

    class Source:
        def __aiter__(self) -> Source:
            return self

        async def __anext__(self) -> dict[str, Any]:
            raise StopAsyncIteration

        async def aclose(self) -> None:
            closing.set()
            await release.wait()

    stream = Stream(Source())  # type: ignore[arg-type]
    stream.on_end(lambda s, outcome: seen.append(f"first:{outcome}"))
    ending = asyncio.create_task(stream.end("completed"))
    async with asyncio.timeout(5):
        await closing.wait()
    stream.on_end(lambda s, outcome: seen.append(f"during:{outcome}"))
    assert seen == []
    release.set()
    async with asyncio.timeout(5):
        await ending
    assert seen == ["first:completed", "during:completed"]


async def test_a_spent_stream_with_plain_hooks_ends_in_its_consumer_s_task() -> None:
    """Nothing to await (the source ran out, every hook a plain function): `end_shielded`
    runs the hooks at once, in the consumer's own task, with no task of its own (one a
    stream cost ~8 us a request)."""
    seen: list[Any] = []

    async def source() -> AsyncIterator[dict[str, Any]]:
        yield {"n": 0}

    stream = Stream(source())
    stream.on_end(lambda s, outcome: seen.append((outcome, asyncio.current_task())))
    stream.on_end(lambda s, outcome: seen.append(s.error))
    it = stream.rest()
    assert [c async for c in it] == [{"n": 0}]
    err = RuntimeError("kept")
    await stream.end_shielded("completed", err)
    assert seen == [("completed", asyncio.current_task()), err] and stream.ended
    await stream.end_shielded("failed")  # only the first end counts
    assert len(seen) == 2


async def test_an_async_hook_after_plain_ones_runs_in_a_task_of_its_own() -> None:
    """From the first hook that hands back an awaitable on, the rest runs in a task of
    its own, and none of it ran in the consumer's task before: a timeout that hook
    enters cancels its own task, never the consumer (whose end returns normally)."""
    seen: list[Any] = []
    me = asyncio.current_task()

    async def source() -> AsyncIterator[dict[str, Any]]:
        yield {"n": 0}

    async def times_out(s: Stream, outcome: str) -> None:
        seen.append(asyncio.current_task() is me)
        try:
            async with asyncio.timeout(0):
                await asyncio.Event().wait()
        except TimeoutError:
            seen.append("timed out")

    stream = Stream(source())
    stream.on_end(lambda s, outcome: seen.append(asyncio.current_task() is me))
    stream.on_end(times_out)
    stream.on_end(lambda s, outcome: seen.append(f"last:{outcome}"))
    assert [c async for c in stream.rest()] == [{"n": 0}]
    async with asyncio.timeout(10):
        await stream.end_shielded("completed")
    assert seen == [True, False, "timed out", "last:completed"]
    assert me is not None and not me.cancelling()


async def test_a_plain_hook_that_raises_cancelled_error_is_a_failed_hook_on_a_spent_stream(
        ) -> None:
    """A plain hook can raise CancelledError itself (it read a cancelled future's
    result): no cancellation of the consumer's, which a plain call cannot receive. On
    a spent stream, ended in its consumer's task, it is a failed hook as in a task of
    the stream's own: logged, the hooks after it run (one skipped would hold its slot
    for good), and the consumer's end returns rather than look cancelled."""
    seen: list[str] = []

    async def source() -> AsyncIterator[dict[str, Any]]:
        yield {"n": 0}

    def reads_a_cancelled_future(s: Stream, outcome: str) -> None:
        f = asyncio.get_running_loop().create_future()
        f.cancel()
        f.result()

    stream = Stream(source())
    stream.on_end(reads_a_cancelled_future)
    stream.on_end(lambda s, outcome: seen.append(f"slot:{outcome}"))
    assert [c async for c in stream.rest()] == [{"n": 0}]
    await stream.end_shielded("completed")
    assert seen == ["slot:completed"] and stream.ended


def test_the_built_in_enter_hooks_applied_twice_change_nothing() -> None:
    """A background Responses create runs the chain's `enter` hooks (and `refuse_ahead`)
    before it queues the run (`enter_ahead`), and the run runs them again: applied twice
    they leave the request's deadline and every metric as once."""
    from proxy.chain import _entering, enter_ahead

    svc = services()
    ps = build_plugins([PluginSpec.model_validate(s) for s in (
        {"name": "sanitizer"}, {"name": "rate_limit"}, {"name": "breaker"},
        {"name": "admission"})], svc)
    c = ctx()
    c.headers = {"x-weir-timeout-ms": "5000"}

    def metrics() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for m in svc.metrics.registry.collect() for s in m.samples
                if not s.name.endswith("_created")}

    enter_ahead(ps, c, deadline_s=30)
    once = (c.deadline, c.deadline_cut, c.output_ceiling, metrics())
    assert c.deadline is not None and c.deadline - c.started == pytest.approx(5)
    for hook in _entering(ps, 30):  # (as the chain runs them)
        hook(c)
    assert (c.deadline, c.deadline_cut, c.output_ceiling, metrics()) == once
