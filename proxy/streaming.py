"""SSE framing and the stream writer: the only place that writes `text/event-stream`.

One pass per chunk: the handler pulls each chunk from the reply's own iterator (no
queue, no producer task), serialises it once (orjson) and writes it; one engine step is
one chunk is one write, and a stream whose chunks are all in hand (`Stream.whole`: a
cached answer replayed) is one write with its `[DONE]`. What used to cost a timeout
scope per chunk is done once per stream:
- the request's deadline is one `asyncio.timeout_at` around the whole loop; when it
  passes, the generation is aborted and a 504 `timeout` error goes out in-band;
- a watchdog, one per stream (a loop timer re-armed each tick, cancelled as the stream
  ends; no task), looks every quarter of the shorter of `keepalive_s` and
  `write_timeout_s` (3.75 s by default): it sends a keep-alive comment while the
  engine has been quiet for `keepalive_s`, and aborts the connection when one write has
  been stuck for `write_timeout_s` (a client that stopped reading); aborting with a
  reset (not closing) drops what is unsent at once, in the kernel too, and the pending
  write fails.

The first chunk is in hand before the response is prepared (the terminal primes the
stream), so errors before any output still get a real HTTP status; a stream that was
not primed is primed here. After the first byte an error goes out in-band, in the
route's framing (`error_events`; chat and completions: `data: {"error": ...}` followed by
`[DONE]`; the Responses API: a typed `error` event, then `response.failed`), and so does
a shutdown's cut at the end of a drain. However the stream ends, `Stream.end` runs once
with its outcome, shielded from a second cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import socket
import struct
import termios
import time
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web

from .chain import Outcome, Stream
from .context import Within
from .errors import ServerError, Unavailable, WeirError
from .tasks import cancel_and_wait

DONE = b"data: [DONE]\n\n"
#: The cancel message of requests cut at the end of a drain (AppState.abort_all).
SHUTDOWN = "weir-shutdown"
#: Set on a request as the drain's end cuts it (AppState.abort_all), before its task is
#: cancelled: a cancel message is lost when another cancellation follows (its client
#: closing at the in-band end, aiohttp cancelling the handler), a mark is not.
CUT_BY_SHUTDOWN: web.RequestKey[bool] = web.RequestKey("weir_cut_by_shutdown", bool)
KEEPALIVE = b": keep-alive\n\n"
#: Set on a request once its stream's response is prepared: from then on a status can no
#: longer be sent, and a shutdown cuts the stream in-band.
PREPARED: web.RequestKey[bool] = web.RequestKey("weir_stream_prepared", bool)
#: The stream's body went out whole (its end written): a client that leaves now, having
#: read its answer (the SDK closes at `[DONE]`), was answered, not aborted.
ANSWERED: web.RequestKey[bool] = web.RequestKey("weir_stream_answered", bool)
#: The status of the in-band error that ended a stream (its head said 200): what the
#: access log and the request metrics count it as, so a stream cut by its deadline or a
#: failed engine shows as the 504 or 502 it was.
STREAM_ERROR: web.RequestKey[int] = web.RequestKey("weir_stream_error", int)
#: The code of the error a request was answered with (its error answer's, or the in-band
#: one that ended its stream): the access log's `error` and the server span's `error.type`
#: and status, so a shed (`overloaded`, `queue_timeout`) is told from a deadline's 504.
ERROR_CODE: web.RequestKey[str] = web.RequestKey("weir_error_code", str)


def note_error(request: web.Request, err: WeirError) -> None:
    """The error `request` is answered with, for its log line and span (its code, or its
    class where it has none; an upstream's code is its text: cut short)."""
    request[ERROR_CODE] = (err.code or type(err).__name__)[:64]
#: Set when the writer cut the connection because its client stopped reading (the write
#: timeout): the abort is counted as `write_timeout`, not as a client that left.
WRITE_TIMED_OUT: web.RequestKey[bool] = web.RequestKey("weir_write_timed_out", bool)

SSE_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}


def dumps(obj: Any) -> bytes:
    """JSON bytes, compact and UTF-8; orjson, with the standard library as the fallback
    for what orjson refuses (integers past 64 bits, lone surrogates in echoed text or an
    upstream's). A lone surrogate, which UTF-8 cannot hold (written as its bytes, it broke
    clients' decoding: the OpenAI SDK's stream raised `UnicodeDecodeError`), stays the
    `\\uXXXX` escape JSON has for it: it can only be in a string, where that escape reads
    back as the same text."""
    try:
        return orjson.dumps(obj)
    except TypeError:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode(
            "utf-8", "backslashreplace")


def json_response(body: Any, headers: dict[str, str] | None = None,
                  status: int = 200) -> web.Response:
    """A JSON answer serialised once, with orjson."""
    return web.Response(body=dumps(body), status=status, headers=headers,
                        content_type="application/json")


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + dumps(obj) + b"\n\n"


def typed_sse(event: dict[str, Any]) -> bytes:
    """A typed event as OpenAI sends the Responses API's: named by an `event:` line too
    (clients that listen by name, as browsers' EventSource does, need it)."""
    kind: str = event["type"]
    return b"event: " + kind.encode() + b"\n" + sse(event)


class _SseResponse(web.StreamResponse):
    """A stream response whose head goes out with its first write (as aiohttp's
    `web.Response` does), not in a write of its own: the first chunk is in hand when it
    is prepared, so it never delays the head."""

    _send_headers_immediately = False


class _Watchdog:
    """Keep-alives while the engine is quiet; cuts a connection stuck in one write.

    A timer callback on the loop, re-armed each tick, not a task of its own: a task per
    stream cost its creation, its first step and, to stop it, a cancellation and a wait
    for it to end (a loop turn and more) on every stream, where a timer is cancelled at
    once."""

    def __init__(self, resp: web.StreamResponse, request: web.Request, *,
                 keepalive: float, write_timeout: float,
                 on_first: Callable[[], None] | None = None) -> None:
        self.resp, self.request = resp, request
        self.keepalive, self.write_timeout = keepalive, write_timeout
        self.last_write = time.monotonic()
        self.writing_since: float | None = None
        self.cut = False
        self.sent = False  # some of the body (not a keep-alive) reached the socket
        self._on_first = on_first
        self._keepalive: asyncio.Task[None] | None = None
        self._tick = max(0.05, min(self.keepalive, self.write_timeout) / 4)
        self._mark = -1  # what was unsent when the clock last started
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = self._loop.call_later(self._tick,
                                                                         self._look)

    async def write(self, data: bytes, body: bool = True) -> None:
        """`body`: events or the body's end (the first such write that goes out calls
        `on_first`), not a keep-alive or the shutdown's cut."""
        self.writing_since = time.monotonic()
        try:
            await self.resp.write(data)
        except asyncio.CancelledError:
            _unstick(self.request)
            raise
        finally:
            self.writing_since = None
            self.last_write = time.monotonic()
        if body and not self.sent:
            self.sent = True
            if self._on_first is not None:
                self._on_first()

    def _look(self) -> None:
        """One tick: cut a write stuck past `write_timeout`, or send a keep-alive after
        `keepalive` of quiet; then the next tick (none once cut)."""
        self._timer = None
        now = time.monotonic()
        if self.writing_since is not None:
            # A client still reading, slowly, is not stalled: `PROGRESS_BYTES` of
            # what is unsent acknowledged restarts the clock. (A full kernel buffer
            # takes a write only once a third of it has gone: megabytes, at a slow
            # reader's pace, past `write_timeout_s`.) Less is a trickle that would
            # hold the stream, its slot and its buffers for good.
            # Judged from a second look on: progress is measured from the first, so
            # a first look the loop ran late (a busy loop, past `write_timeout_s`)
            # cannot cut a reader that kept reading.
            unsent = _unsent(self.request.transport)
            if self._mark < 0:
                self._mark = unsent
            elif self._mark - unsent >= PROGRESS_BYTES:
                self.writing_since, self._mark = now, unsent
            elif now - self.writing_since >= self.write_timeout:
                self._cut()
                return
        else:
            self._mark = -1
        if self.writing_since is None and now - self.last_write >= self.keepalive:
            # In a task of its own, timed by these ticks as any write (`writing_since`):
            # a client that stopped reading blocks whichever write crosses aiohttp's
            # buffer, a keep-alive too, and the ticks must go on watching. (Not
            # cancelled on a timeout: the drain it waits on is the body write's too.)
            self._keepalive = asyncio.create_task(self.write(KEEPALIVE, body=False))
            self._keepalive.add_done_callback(_retrieved)
        self._timer = self._loop.call_later(self._tick, self._look)

    def _cut(self) -> None:
        self.cut = self.request[WRITE_TIMED_OUT] = True
        if self.request.transport is not None:
            reset(self.request.transport)

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        await cancel_and_wait(self._keepalive)


def reset(transport: asyncio.Transport) -> None:
    """Abort a connection with a reset: a plain abort only closes the socket, and the
    kernel then goes on trying to send what it holds (megabytes, to a client that stopped
    reading) for a minute or more, in memory an attacker can multiply."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError, AttributeError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


#: What a client stuck in one write must read within `write_timeout_s` to be kept: 64
#: KiB (about 2 KB/s at the default 30 s), the most aiohttp buffers before it waits.
PROGRESS_BYTES = 64 << 10


def _unsent(transport: asyncio.Transport | None) -> int:
    """The bytes written to `transport` that its peer has not acknowledged: in the
    transport's buffer and in the kernel's (Linux's `TIOCOUTQ`; where it cannot say, the
    transport's alone)."""
    if transport is None:
        return 0
    n = transport.get_write_buffer_size()
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            n += struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ,
                                                b"\0\0\0\0"))[0]
    return n


def _unstick(request: web.Request) -> None:
    """After a write cancelled while it waited for the client to read (a deadline, a
    keep-alive stopped): aiohttp's writes wait on one future the connection keeps until
    the client reads, and the cancellation cancelled that future. Every later write (the
    error event, the body's end) would then raise CancelledError at once in a task
    nobody cancelled; without it they wait anew, timed as any write."""
    protocol = getattr(request, "protocol", None)
    waiter = getattr(protocol, "_drain_waiter", None)
    if waiter is not None and waiter.cancelled():
        protocol._drain_waiter = None  # type: ignore[union-attr]


def _retrieved(task: asyncio.Task[None]) -> None:
    """A keep-alive write's end: a client gone is the body's writes' to find."""
    if not task.cancelled():
        task.exception()


async def write_sse(
    request: web.Request,
    stream: Stream,
    headers: Callable[[], dict[str, str]],
    *,
    write_timeout: float,
    keepalive: float,
    on_first: Callable[[], None] | None = None,
    on_chunk: Callable[[dict[str, Any]], None] | None = None,
    on_abort: Callable[[str], None] | None = None,
    log_error: Callable[[BaseException], None] | None = None,
    terminator: bytes = DONE,
    error_events: Callable[[WeirError], bytes] | None = None,
    frame: Callable[[dict[str, Any]], bytes] = sse,
) -> web.StreamResponse:
    """`terminator`: what ends the body after the last event (chat and completions:
    `data: [DONE]`; the Responses API: nothing). `error_events`: an error that cuts the
    stream, as the route's events (chat and completions: `data: {"error": ...}`; the
    Responses API: a typed `error` event, then `response.failed`). `frame`: one event's
    bytes (the Responses API's are named: `typed_sse`)."""
    framed = error_events if error_events is not None else _chat_error
    outcome: Outcome = "cancelled"
    error: BaseException | None = None
    watchdog: _Watchdog | None = None
    whole = False
    ending = False  # the body's last write (its end, with a whole stream's events) began
    errored = False  # an in-band error's write began: a shutdown cut adds only the end
    settled = False  # the stream ended (its hooks ran) with its answer whole: a shutdown
    # cut before its end went out adds the end alone, no error
    try:
        if stream.primed_at is None:
            await stream.prime()  # raises before any byte: the route answers with a status
        # Headers are taken now, with the first chunk in hand: a plugin may have set some
        # while producing it (a fallback, for one).
        resp = _SseResponse(status=200, headers={**SSE_HEADERS, **headers()})
        # The head is held until the first write (_SseResponse): a client already gone is
        # found there, by the write's ConnectionError.
        await resp.prepare(request)
        request[PREPARED] = True
        watchdog = _Watchdog(resp, request, keepalive=keepalive, write_timeout=write_timeout,
                             on_first=on_first)
        write = watchdog.write
        held: list[bytes] = []  # a whole stream's events: they go out with what ends it
        keep = stream.whole

        async def put(chunk: dict[str, Any]) -> None:
            if on_chunk is not None:
                on_chunk(chunk)
            if keep:
                held.append(frame(chunk))
            else:
                await write(frame(chunk))

        try:
            try:
                async with Within(stream.deadline):
                    if stream.first is not None:
                        await put(stream.first)
                    async for chunk in stream.rest():
                        await put(chunk)
                outcome = "completed"
            except ConnectionError:
                raise  # the client is gone: nothing more can be written
            except Exception as e:  # after the first byte an error goes out in-band
                outcome, error, errored = "failed", e, True
                await _error_event(request, write, e, log_error, framed, _take(held))
            if held and gone(request):  # a whole stream's events go out only now: its
                outcome = "cancelled"  # client, gone, never had any of the answer
                raise ConnectionResetError("the client is gone")
            # Settle before the client can see the answer's end: the OpenAI SDK stops at
            # `[DONE]` and closes, so a client that saw it must never race its own
            # request's accounting (slot, tokens, cache entry, stored completion).
            settled = True
            await stream.end_shielded(outcome, error)
            if terminator or held:
                ending = True  # handed over with its end: a shutdown adds nothing after
                await write(_take(held) + terminator)
            whole = request[ANSWERED] = True  # a cancellation now cuts nothing
            await watchdog.stop()
            try:  # (it waits for the client to read what is buffered: timed as a write)
                async with asyncio.timeout(write_timeout):
                    await resp.write_eof()
            except TimeoutError:
                watchdog._cut()
        except ConnectionError:  # an answer already whole stays "completed"
            if on_abort is not None and not whole:
                on_abort("write timeout" if watchdog.cut else
                         "client gone" if watchdog.sent else "client gone before the first byte")
        return resp
    except asyncio.CancelledError as e:
        if not whole:  # (whole: the answer went out, and ends as it was)
            outcome = "cancelled"
            if cut_by_shutdown(request, e) and watchdog is not None and not ending:
                await _cut_for_shutdown(request, watchdog, resp, _take(held),
                                        None if errored or settled else framed, terminator)
        raise
    except BaseException as e:
        if outcome != "completed":
            outcome, error = "failed", e
        raise
    finally:
        try:
            if watchdog is not None:
                await watchdog.stop()  # raises if cancelled (again) meanwhile
        finally:
            if not stream.ended:
                await stream.end_shielded(outcome, error)


def cut_by_shutdown(request: web.Request, e: asyncio.CancelledError) -> bool:
    """Whether a cancellation is the drain's end cutting the request (not its client
    leaving)."""
    return e.args == (SHUTDOWN,) or bool(request.get(CUT_BY_SHUTDOWN))


async def _cut_for_shutdown(request: web.Request, watchdog: _Watchdog,
                            resp: web.StreamResponse, before: bytes,
                            framed: Callable[[WeirError], bytes] | None,
                            terminator: bytes) -> None:
    """Still running when the drain ran out: end the stream properly, so a client can tell
    a cut answer from a whole one: the events held back (`before`: a whole stream's), an
    in-band 503 in the route's framing (none if an error event already went out:
    `framed` None), and the body's end (`[DONE]` for chat). Best effort, briefly. The
    503's code is the request's error (`note_error`), as an in-band error's is."""
    err = Unavailable("The server shut down before this answer was complete; retry.",
                      code="shutting_down")
    if framed is not None:
        note_error(request, err)
    try:
        async with asyncio.timeout(1.0):
            await watchdog.write(before + (framed(err) if framed is not None else b"")
                                 + terminator, body=False)
            await resp.write_eof()
    except (TimeoutError, ConnectionError, asyncio.CancelledError):
        pass


def gone(request: web.Request) -> bool:
    """The client closed its connection, or is closing it (nothing written to it can arrive)."""
    return request.transport is None or request.transport.is_closing()


def _take(held: list[bytes]) -> bytes:
    """The events held back so far, as one buffer; none are held after."""
    out = b"".join(held)
    held.clear()
    return out


def _chat_error(err: WeirError) -> bytes:
    return sse(err.to_body())


async def _error_event(request: web.Request, write: Callable[[bytes], Any], e: BaseException,
                       log_error: Callable[[BaseException], None] | None,
                       framed: Callable[[WeirError], bytes], before: bytes = b"") -> None:
    """The error as in-band events, after `before` (events not yet written); once they
    went out, its status noted for the access log (`STREAM_ERROR`). (None go out where
    the route's own events had ended the stream already.)"""
    err = e if isinstance(e, WeirError) else ServerError()
    if not isinstance(e, WeirError) and log_error is not None:
        log_error(e)
    events = framed(err)
    await write(before + events)
    if events:
        request[STREAM_ERROR] = err.status
        note_error(request, err)
