"""The SSE stream writer's keep-alives (proxy/streaming.py), seen only from outside: over
HTTP, with a fake engine that goes quiet after its first token until the test lets it go
on. While it is quiet the client receives `: keep-alive` comments; the stream then ends
as any other (comments are invisible to SSE clients)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from proxy.engine.base import EngineOutput, SamplingOptions
from tests.conftest import MakeClient
from tests.fakes import FakeEngine
from tests.sse import check_chat_stream, parse_sse
from tests.waiting import eventually

CHAT = {"model": "fake-model", "max_tokens": 3, "stream": True,
        "messages": [{"role": "user", "content": "hello"}]}


class QuietAfterFirstToken(FakeEngine):
    """Yields its first output, then waits for `resume` before the rest."""

    def __init__(self) -> None:
        super().__init__()
        self.resume = asyncio.Event()

    async def generate(self, prompt: list[int], options: SamplingOptions, request_id: str,
                       **kw: Any) -> AsyncGenerator[EngineOutput, None]:
        n = 0
        async for out in super().generate(prompt, options, request_id, **kw):
            if n == 1:
                await self.resume.wait()
            n += 1
            yield out


async def test_a_quiet_engine_gets_keepalive_comments(make_client: MakeClient) -> None:
    engine = QuietAfterFirstToken()
    client = await make_client(engine=engine, server={"keepalive_s": 0.01})
    r = await client.post("/v1/chat/completions", json=CHAT)
    assert r.status == 200
    lines: list[bytes] = []
    async with asyncio.timeout(10):  # bounded: each line is awaited, not slept for
        while not lines or not lines[-1].startswith(b"data: "):
            lines.append(await r.content.readline())  # the first token's event
        keepalives = 0
        while keepalives < 2:  # the engine is held: only comments can come now
            line = await r.content.readline()
            lines.append(line)
            assert not line.startswith(b"data: "), line
            keepalives += line == b": keep-alive\n"
        engine.resume.set()
        rest = await r.read()
    text = b"".join(lines).decode() + rest.decode()
    events, done = parse_sse(text)
    assert done
    prompt = engine.calls[0][0]
    assert check_chat_stream(events) == FakeEngine.expected_text(prompt, 3)


async def test_a_steady_stream_has_no_keepalives(make_client: MakeClient) -> None:
    client = await make_client(server={"keepalive_s": 60})
    r = await client.post("/v1/chat/completions", json=CHAT)
    text = await r.text()
    assert ": keep-alive" not in text and parse_sse(text)[1]



class OneStream:
    """An app whose one handler writes `source()` with `write_sse`; it records the
    handler's task, its connection, and how the stream ended."""

    def __init__(self, source: Any, whole: bool = False,
                 start: asyncio.Event | None = None, write_timeout: float = 60) -> None:
        from aiohttp import web

        self.source, self.whole, self.start = source, whole, start  # start: waited first
        self.write_timeout = write_timeout
        self.ended: list[str] = []
        self.handler: list[asyncio.Task[Any]] = []
        self.transports: list[Any] = []
        self.writes: list[bytes] = []  # what the handler handed its transport, call by call
        self.firsts = 0  # on_first calls: the first byte of the body went out
        self.aborts: list[str] = []  # on_abort reasons
        self.arrived = asyncio.Event()  # a request reached the handler
        self.app = web.Application()
        self.app.router.add_get("/", self.handle)

    async def handle(self, request: Any) -> Any:
        if self.start is not None:  # runs on after the client goes, as without
            # aiohttp's handler cancellation
            return await asyncio.shield(self.serve(request))
        return await self.serve(request)

    async def serve(self, request: Any) -> Any:
        from proxy import streaming
        from proxy.reply import Stream

        self.handler.append(asyncio.current_task())  # type: ignore[arg-type]
        t = request.transport
        self.transports.append(t)
        self.arrived.set()
        if self.start is not None:
            await self.start.wait()
        write, writelines = t.write, t.writelines

        def record_write(data: bytes) -> None:
            self.writes.append(bytes(data))
            write(data)

        def record_writelines(parts: list[bytes]) -> None:
            self.writes.append(b"".join(bytes(p) for p in parts))
            writelines(parts)

        t.write, t.writelines = record_write, record_writelines
        stream = Stream(self.source(), whole=self.whole)
        stream.on_end(lambda s, outcome: self.ended.append(outcome))

        def first() -> None:
            self.firsts += 1

        return await streaming.write_sse(request, stream, dict,
                                         write_timeout=self.write_timeout,
                                         keepalive=60, on_first=first,
                                         on_abort=self.aborts.append)


@pytest.mark.parametrize("whole", [True, False])
async def test_a_whole_stream_goes_out_in_one_write(whole: bool) -> None:
    """A stream whose chunks are all in hand (a cached answer replayed) is one write:
    the response head, every event and `[DONE]`; then the body's end. Otherwise each
    chunk is a write of its own."""
    from aiohttp import ClientSession
    from aiohttp.test_utils import TestServer

    async def source() -> Any:
        for n in range(3):
            yield {"n": n}

    one = OneStream(source, whole=whole)
    async with TestServer(one.app) as server, ClientSession() as session:
        async with session.get(server.make_url("/")) as r:
            events, done = parse_sse(await r.text())
    assert [e["n"] for e in events] == [0, 1, 2] and done and one.ended == ["completed"]
    assert one.firsts == 1 and one.aborts == []
    with_data = [w for w in one.writes if b"data: " in w]
    if whole:
        assert len(with_data) == 1 and with_data[0].startswith(b"HTTP/1.1 200")
        assert with_data[0].count(b"data: ") == 4 and with_data[0].endswith(b"data: [DONE]\n\n\r\n")
        assert len(one.writes) == 2  # and the chunked body's end
    else:
        assert len(with_data) == 4  # three events and [DONE], one write each


@pytest.mark.parametrize("whole", [True, False])
async def test_the_plugins_settle_before_the_client_reads_done(whole: bool) -> None:
    """The OpenAI SDK ends a stream at `data: [DONE]` and closes it: what the stream's end
    hooks settle (a stored completion, the rate limiter's slot, the cache's entry) must be
    settled before `[DONE]` is written, or the client's next request races them (a stored
    completion retrieved right after its stream was a 404 most times)."""
    from aiohttp import ClientSession
    from aiohttp.test_utils import TestServer

    async def source() -> Any:
        for n in range(2):
            yield {"n": n}

    one = OneStream(source, whole=whole)
    done_when_settled: list[bool] = []

    async def serve(request: Any) -> Any:
        from proxy import streaming
        from proxy.reply import Stream

        stream = Stream(source(), whole=whole)
        written: list[bytes] = []
        write = request.transport.write

        def record(data: bytes) -> None:
            written.append(bytes(data))
            write(data)

        request.transport.write = record
        stream.on_end(lambda s, outcome: done_when_settled.append(
            b"[DONE]" in b"".join(written)))
        stream.on_end(lambda s, outcome: one.ended.append(outcome))
        return await streaming.write_sse(request, stream, dict, write_timeout=60,
                                         keepalive=60)

    one.serve = serve  # type: ignore[method-assign]
    async with TestServer(one.app) as server, ClientSession() as session:
        async with session.get(server.make_url("/")) as r:
            events, done = parse_sse(await r.text())
    assert [e["n"] for e in events] == [0, 1] and done
    assert one.ended == ["completed"] and done_when_settled == [False]


async def test_a_shutdown_while_the_plugins_settle_ends_the_answer_without_an_error(
        ) -> None:
    """Every event went out and the end hooks run (`[DONE]` waits for them): a drain's
    cut then sends `[DONE]` alone, no 503 event after a whole answer."""
    from aiohttp import ClientSession
    from aiohttp.test_utils import TestServer

    from proxy import streaming
    from proxy.reply import Stream

    async def source() -> Any:
        yield {"n": 0}

    settling, release = asyncio.Event(), asyncio.Event()

    async def hook(s: Any, outcome: str) -> None:
        settling.set()
        await release.wait()

    one = OneStream(source)

    async def serve(request: Any) -> Any:
        one.handler.append(asyncio.current_task())  # type: ignore[arg-type]
        stream = Stream(source())
        stream.on_end(hook)
        return await streaming.write_sse(request, stream, dict, write_timeout=60,
                                         keepalive=60)

    one.serve = serve  # type: ignore[method-assign]
    async with TestServer(one.app) as server, ClientSession() as session:
        async with session.get(server.make_url("/")) as r:
            async with asyncio.timeout(10):
                await settling.wait()
                one.handler[0].cancel(streaming.SHUTDOWN)
                body = await r.read()
            release.set()
    events, done = parse_sse(body.decode())
    assert events == [{"n": 0}] and done and body.count(b"data: [DONE]") == 1


async def test_a_whole_stream_that_fails_sends_what_it_had_then_the_error() -> None:
    """A failure while a whole stream's events are held back: they go out before the
    error event, in order, and the stream ends `failed`."""
    from aiohttp import ClientSession
    from aiohttp.test_utils import TestServer

    async def source() -> Any:
        yield {"n": 0}
        raise RuntimeError("boom")

    one = OneStream(source, whole=True)
    async with TestServer(one.app) as server, ClientSession() as session:
        async with session.get(server.make_url("/")) as r:
            events, done = parse_sse(await r.text())
    assert events[0] == {"n": 0} and events[1]["error"]["type"] == "server_error" and done
    assert one.ended == ["failed"]


async def test_a_shutdown_while_a_whole_stream_drains_adds_nothing_after_its_end() -> None:
    """A whole stream's events and `[DONE]` are one write; a shutdown while that write
    waits on a slow reader sends no error event (and no second `[DONE]`) after it. The
    stream settled `completed` before that write (its end hooks run before `[DONE]`)."""
    from aiohttp.test_utils import TestServer

    from proxy import streaming

    async def source() -> Any:
        yield {"text": "x" * 4_000_000}

    one = OneStream(source, whole=True)
    async with TestServer(one.app) as server:
        reader, writer = await asyncio.open_connection(server.host, server.port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        async with asyncio.timeout(10):  # the client reads nothing yet: the write waits
            # (a transport's buffer has no event to wait on: polled, within the timeout)
            while not one.writes or one.transports[0].get_write_buffer_size() == 0:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        one.handler[0].cancel(streaming.SHUTDOWN)
        data = b""
        async with asyncio.timeout(10):
            while chunk := await reader.read(1 << 20):
                data += chunk
        writer.close()
    assert data.count(b"data: [DONE]") == 1 and b"shutting" not in data
    assert one.ended == ["completed"]


@pytest.mark.parametrize("whole", [True, False])
async def test_a_stream_to_a_client_already_gone_ends_cancelled(whole: bool) -> None:
    """Nothing of a stream reaches a client gone before its first write: the stream ends
    `cancelled` (the plugins settle it as cut), not `completed`; no first byte is counted
    (the TTFT metric), and the abort says it came before the first byte."""
    from aiohttp.test_utils import TestServer

    async def source() -> Any:
        yield {"n": 0}
        yield {"n": 1}

    start = asyncio.Event()
    one = OneStream(source, whole=whole, start=start)
    async with TestServer(one.app) as server:
        _, writer = await asyncio.open_connection(server.host, server.port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        async with asyncio.timeout(10):
            await one.arrived.wait()
            writer.close()
            await writer.wait_closed()
            # (the server seeing the close has no event to wait on: polled)
            while not one.transports[0].is_closing():  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            start.set()
            await asyncio.wait((one.handler[0],))
    assert one.ended == ["cancelled"]
    assert one.firsts == 0 and one.aborts == ["client gone before the first byte"]


async def test_a_second_cancellation_while_stopping_still_ends_the_stream(
        monkeypatch: Any) -> None:
    """The client goes (the handler is cancelled), and the handler is cancelled again
    while its keep-alive watchdog stops: the stream still ends, so every plugin frees
    what it holds (admission's engine slot stayed taken for good before)."""
    from aiohttp import ClientSession
    from aiohttp.test_utils import TestServer

    from proxy import streaming

    stopping = asyncio.Event()

    async def stop(self: Any) -> None:  # a stop that takes a while: cut by the 2nd cancel
        stopping.set()
        try:
            await asyncio.Event().wait()
        finally:
            self._timer.cancel()  # (its ticks stop; nothing else to wait for)

    monkeypatch.setattr(streaming._Watchdog, "stop", stop)

    async def source() -> Any:
        yield {"n": 0}
        await asyncio.Event().wait()  # quiet: the handler waits here when cancelled

    one = OneStream(source)
    async with TestServer(one.app) as server, ClientSession() as session:
        async with session.get(server.make_url("/")) as r:
            assert (await r.content.readline()).startswith(b"data: ")
            one.handler[0].cancel()
            await asyncio.wait_for(stopping.wait(), 10)
            one.handler[0].cancel()
            await asyncio.wait((one.handler[0],), timeout=10)
    assert one.handler[0].done() and one.ended == ["cancelled"]


async def test_a_shutdown_after_the_whole_answer_cuts_nothing(monkeypatch: Any) -> None:
    """The answer and `[DONE]` went out; the drain's cancellation arrives while the
    writer settles: no 503 event after the answer, and the stream ends `completed`."""
    from aiohttp import ClientSession
    from aiohttp.test_utils import TestServer

    from proxy import streaming

    stopping = asyncio.Event()

    real_stop = streaming._Watchdog.stop

    async def stop(self: Any) -> None:
        if stopping.is_set():  # the second call, on the way out: a plain stop
            await real_stop(self)
            return
        stopping.set()
        try:
            await asyncio.Event().wait()  # cut by the shutdown below
        finally:
            self._timer.cancel()

    monkeypatch.setattr(streaming._Watchdog, "stop", stop)

    async def source() -> Any:
        yield {"n": 0}

    one = OneStream(source)
    async with TestServer(one.app) as server, ClientSession() as session:
        async with session.get(server.make_url("/")) as r:
            body = b""
            async with asyncio.timeout(10):
                while not body.endswith(b"data: [DONE]\n\n"):
                    body += await r.content.readline()
                await stopping.wait()
            one.handler[0].cancel(streaming.SHUTDOWN)
            await asyncio.wait((one.handler[0],), timeout=10)
            one.transports[0].close()  # what else was written is read to its end
            try:
                body += await r.content.read()
            except Exception:
                pass  # cut without a chunked terminator: the bytes before it count
    assert one.handler[0].done()
    assert body.count(b"data: [DONE]") == 1 and b"shutting_down" not in body
    assert one.ended == ["completed"]


class _Aborted:
    aborted = False

    def abort(self) -> None:
        self.aborted = True

    def get_extra_info(self, name: str) -> None:
        return None

    def get_write_buffer_size(self) -> int:
        return 1 << 20


class _Held(dict):  # type: ignore[type-arg]
    """A client that stopped reading: every write blocks (the transport stays paused).
    (Both the response and the request, which holds what the writer notes on it.)"""

    transport = _Aborted()

    async def write(self, data: bytes) -> None:
        await asyncio.Event().wait()


async def test_a_stall_that_begins_in_a_keepalive_write_is_cut() -> None:
    """The watchdog writes keep-alives itself: a keep-alive that never drains blocked
    the very task that times writes, so the connection was held for good."""
    from proxy.streaming import _Watchdog

    held = _Held()
    held.transport = _Aborted()
    wd = _Watchdog(held, held, keepalive=0.02, write_timeout=0.2)  # type: ignore[arg-type]
    await eventually(lambda: held.transport.aborted, timeout=5)
    assert wd.cut
    await wd.stop()


async def test_a_client_that_stops_reading_at_the_end_is_cut_too(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The body's end waits for the client to read what is buffered; it was not timed,
    so a client that stopped reading just before it held the connection for good."""
    import aiohttp
    from aiohttp import ClientSession
    from aiohttp.test_utils import TestServer

    from proxy import streaming

    async def never_drains(self: Any) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(streaming._SseResponse, "write_eof", never_drains)

    async def source() -> Any:
        yield {"n": 0}

    one = OneStream(source, write_timeout=0.2)
    async with TestServer(one.app) as server, ClientSession() as session:
        async with asyncio.timeout(10), session.get(server.make_url("/")) as r:
            with pytest.raises(aiohttp.ClientError):
                await r.read()  # [DONE] came, then the connection was cut
        await asyncio.wait(one.handler, timeout=10)
    assert all(t.done() for t in one.handler) and one.ended == ["completed"]


async def test_a_write_cancelled_while_the_client_is_slow_leaves_later_writes_timed() -> None:
    """aiohttp's writes wait on one future the connection keeps until the client reads;
    cancelling a write parked there (a keep-alive stopped at the stream's end, a
    deadline) cancelled that future, and the body's end then raised CancelledError at
    once in a task nobody had cancelled (its timeout skipped, the handler cut)."""
    from aiohttp.base_protocol import BaseProtocol
    from aiohttp.http_writer import StreamWriter

    from proxy.streaming import _Watchdog

    class Transport:
        aborted = False

        def write(self, data: bytes) -> None:
            pass

        def writelines(self, parts: list[bytes]) -> None:
            pass

        def is_closing(self) -> bool:
            return False

        def get_extra_info(self, *a: Any, **kw: Any) -> None:
            return None

        def get_write_buffer_size(self) -> int:
            return 0

        def abort(self) -> None:
            self.aborted = True

    loop = asyncio.get_running_loop()
    protocol = BaseProtocol(loop)
    transport = Transport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    writer = StreamWriter(protocol, loop)
    writer.chunked, writer._headers_written = True, True

    class Resp:
        async def write(self, data: bytes) -> None:
            await writer.write(data)

    class Req:
        pass

    request = Req()
    request.transport, request.protocol = transport, protocol  # type: ignore[attr-defined]
    protocol.pause_writing()  # a slow client; the next write crosses the drain counter
    writer.buffer_size = 0x10000 - 5
    wd = _Watchdog(Resp(), request, keepalive=0.01,  # type: ignore[arg-type]
                   write_timeout=30)
    await eventually(lambda: wd._keepalive is not None and not wd._keepalive.done())
    await wd.stop()  # the keep-alive, parked, is cancelled
    with pytest.raises(TimeoutError):  # the body's end waits, timed (it raised at once)
        async with asyncio.timeout(0.2):
            await writer.write_eof()


async def test_a_cut_connection_is_reset_not_closed() -> None:
    """A plain abort closes the socket, and the kernel goes on sending what it holds
    (megabytes, to a client that stopped reading) for a minute or more; a reset drops it
    at once: the client sees the connection reset, not an orderly end."""
    from proxy.streaming import reset

    transports: list[asyncio.Transport] = []

    async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        transports.append(writer.transport)  # type: ignore[arg-type]

    server = await asyncio.start_server(accepted, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        await eventually(lambda: bool(transports))
        reset(transports[0])
        with pytest.raises(ConnectionResetError):
            async with asyncio.timeout(10):
                await reader.read(1)
    finally:
        writer.close()
        server.close()
        await server.wait_closed()


async def test_a_client_still_reading_slowly_is_not_cut() -> None:
    """The clock ran from when one write blocked: a client reading steadily but slowly
    (a full kernel buffer takes a write only once a third of it has gone) was cut,
    mid-answer, as if it had stopped. What it reads restarts the clock; a trickle (under
    `PROGRESS_BYTES` a timeout) does not, or it would hold the stream for good."""
    from proxy.streaming import PROGRESS_BYTES, _Watchdog

    class Draining(_Aborted):
        def __init__(self) -> None:
            self.left, self.calls = 1 << 30, 0
            self.reading: bool | None = True

        def get_write_buffer_size(self) -> int:
            self.calls += 1
            if self.reading:
                self.left -= PROGRESS_BYTES  # the client reads steadily, slowly
            elif self.reading is None:
                self.left -= 100  # a trickle: it would hold the stream for good
            return self.left

    held = _Held()
    held.transport = transport = Draining()
    wd = _Watchdog(held, held, keepalive=60, write_timeout=0.1)  # type: ignore[arg-type]
    writing = asyncio.create_task(wd.write(b"data: {}\n\n"))
    await eventually(lambda: transport.calls >= 20, timeout=10)  # 20 ticks: 5 timeouts
    assert not transport.aborted and not wd.cut
    transport.reading = None  # it trickles
    await eventually(lambda: transport.aborted, timeout=10)
    assert wd.cut
    writing.cancel()
    await wd.stop()


async def test_a_first_look_the_loop_ran_late_cuts_no_reader_still_reading() -> None:
    """The watchdog's first look at a blocked write only marks what is unsent: progress
    is measured from it. A loop running late (its first tick past `write_timeout`, seen
    on a busy machine) cut a client that was reading steadily, on that first look."""
    from proxy.streaming import PROGRESS_BYTES, _Watchdog

    class Draining(_Aborted):
        def __init__(self) -> None:
            self.left, self.calls = 1 << 30, 0

        def get_write_buffer_size(self) -> int:
            self.calls += 1
            self.left -= PROGRESS_BYTES  # the client reads steadily
            return self.left

    held = _Held()
    held.transport = transport = Draining()
    wd = _Watchdog(held, held, keepalive=60, write_timeout=0.1)  # type: ignore[arg-type]
    writing = asyncio.create_task(wd.write(b"data: {}\n\n"))
    await eventually(lambda: wd.writing_since is not None)
    wd.writing_since -= 10.0  # as if the loop had been held ten timeouts past its tick
    await eventually(lambda: transport.calls >= 3, timeout=10)
    assert not transport.aborted and not wd.cut
    writing.cancel()
    await wd.stop()


async def test_a_stream_s_watchdog_is_no_task_and_stops_at_once() -> None:
    """The watchdog ticks on a loop timer: a stream starts no task for it, and stopping
    it (every stream does, as it ends) cancels the timer at once, with no loop turn to
    wait for a task to end (a task per stream was a visible share of a stream's CPU).
    A keep-alive under way is the one thing it waits for."""
    from proxy.streaming import _Watchdog

    class Quick(dict):  # type: ignore[type-arg]
        transport = _Aborted()

        async def write(self, data: bytes) -> None:
            pass

    resp = Quick()
    before = asyncio.all_tasks()
    wd = _Watchdog(resp, resp, keepalive=15, write_timeout=30)  # type: ignore[arg-type]
    await wd.write(b"data: {}\n\n")
    assert asyncio.all_tasks() == before and wd.sent
    stopping = wd.stop()
    with pytest.raises(StopIteration):  # done in its first step: nothing awaited
        stopping.send(None)
    assert wd._timer is None


@pytest.mark.parametrize("ending", ["completed", "failed", "client gone", "handler cancelled",
                                    "shutdown", "write timeout"])
async def test_a_stream_s_watchdog_is_let_go_however_the_stream_ends(
        ending: str, monkeypatch: Any) -> None:
    """Whichever way a stream ends (its answer whole, an error in-band, its client gone,
    its handler cancelled, the drain's cut, a client that stopped reading cut by the
    write timeout), its watchdog's timer is cancelled: nothing on the loop holds the
    watchdog (and through it the request, its response and its transport) after the
    stream ended, and no tick of it can run on a connection that is gone."""
    import gc
    import weakref

    from aiohttp import ClientSession
    from aiohttp.test_utils import TestServer

    from proxy import streaming

    watchdogs: list[weakref.ref[Any]] = []
    real_init = streaming._Watchdog.__init__

    def init(self: Any, *args: Any, **kw: Any) -> None:
        real_init(self, *args, **kw)
        watchdogs.append(weakref.ref(self))

    cuts: list[bool] = []
    real_cut = streaming._Watchdog._cut

    def cut(self: Any) -> None:
        cuts.append(True)
        real_cut(self)

    monkeypatch.setattr(streaming._Watchdog, "__init__", init)
    monkeypatch.setattr(streaming._Watchdog, "_cut", cut)
    quiet = asyncio.Event()

    async def source() -> Any:
        if ending == "write timeout":
            yield {"text": "x" * 8_000_000}  # never read: the write blocks
        yield {"n": 0}
        if ending == "failed":
            raise RuntimeError("boom")
        if ending in ("client gone", "handler cancelled", "shutdown"):
            quiet.set()
            await asyncio.Event().wait()  # quiet until cut
        yield {"n": 1}

    one = OneStream(source, write_timeout=0.2 if ending == "write timeout" else 60)
    async with TestServer(one.app) as server:
        if ending == "write timeout":  # a client that reads nothing
            _, writer = await asyncio.open_connection(server.host, server.port)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            await asyncio.wait_for(one.arrived.wait(), 10)
            await asyncio.wait(one.handler, timeout=10)
            writer.close()
            assert cuts == [True]  # (the cut connection's handler is cancelled)
        else:
            async with ClientSession() as session, session.get(server.make_url("/")) as r:
                if ending in ("completed", "failed"):
                    await r.read()
                else:
                    await asyncio.wait_for(quiet.wait(), 10)
                    if ending == "client gone":
                        r.close()  # (aiohttp cancels the handler as the client leaves)
                    one.handler[0].cancel(streaming.SHUTDOWN if ending == "shutdown"
                                          else None)
                await asyncio.wait(one.handler, timeout=10)
    assert one.handler and all(t.done() for t in one.handler)
    assert one.ended == ["completed" if ending == "completed" else
                         "failed" if ending == "failed" else "cancelled"]
    one.handler.clear()  # (a cancelled task's traceback holds the handler's frames)
    one.transports.clear()
    gc.collect()
    assert len(watchdogs) == 1 and watchdogs[0]() is None
