"""SSE framing and the stream writer: the only place that writes `text/event-stream`.

A producer task drains the reply's chunk iterator into a small bounded queue; the
handler writes from the queue. This split gives three things without a task per chunk:
- keep-alive comments while the engine is quiet (waiting on the queue can time out
  safely; waiting on the generator itself cannot be cancelled without killing it);
- a write timeout: a client that stops reading fills the socket, `write()` blocks, and
  after `write_timeout_s` the stream is cut and the generation aborted;
- prompt aborts: cancelling the producer closes the chunk iterator, whose `finally`
  aborts the engine request (client disconnect, write timeout, shutdown).

The first chunk is awaited before the response is prepared, so errors raised before any
output (bad params the engine refused, overload) still get a real HTTP status. After the
first byte, an error goes out in-band as `data: {"error": ...}` followed by `[DONE]`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web

from .errors import ServerError, WeirError

DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keep-alive\n\n"
_END = object()

SSE_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + (
        b"\n\n")


class StreamAborted(Exception):
    """The client stopped reading (write timeout) or went away."""


async def _produce(it: AsyncIterator[dict[str, Any]], queue: asyncio.Queue[Any]) -> None:
    try:
        async for chunk in it:
            await queue.put(chunk)
        await queue.put(_END)
    except asyncio.CancelledError:
        raise
    except BaseException as e:
        await queue.put(e)
    finally:
        close = getattr(it, "aclose", None)
        if close is not None:
            await close()


async def write_sse(
    request: web.Request,
    chunks: AsyncIterator[dict[str, Any]],
    headers: Callable[[], dict[str, str]],
    *,
    write_timeout: float,
    keepalive: float,
    on_first: Any = None,
    on_abort: Any = None,
    log_error: Any = None,
) -> web.StreamResponse:
    queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=32)
    producer = asyncio.create_task(_produce(chunks, queue))
    try:
        first = await queue.get()
        if isinstance(first, BaseException):
            raise first
        # Headers are taken now, after the first chunk: a plugin may have set some while
        # producing it (a fallback inside the stream, for one).
        resp = web.StreamResponse(status=200, headers={**SSE_HEADERS, **headers()})
        try:
            await resp.prepare(request)
        except ConnectionResetError:  # gone before the first byte: like any other abort
            if on_abort is not None:
                on_abort("client gone before the first byte")
            return resp
        if on_first is not None:
            on_first()

        async def send(data: bytes) -> None:
            try:
                async with asyncio.timeout(write_timeout):
                    await resp.write(data)
            except (TimeoutError, ConnectionResetError) as e:
                raise StreamAborted(type(e).__name__) from None

        try:
            item = first
            while item is not _END:
                if isinstance(item, BaseException):
                    err = item if isinstance(item, WeirError) else ServerError()
                    if not isinstance(item, WeirError) and log_error is not None:
                        log_error(item)
                    await send(sse(err.to_body()))
                    break
                await send(sse(item))
                item = await _next(queue, send, keepalive)
            await send(DONE)
            await resp.write_eof()
        except StreamAborted as e:
            # The producer is cancelled below (aborting the generation); the
            # connection is closed so a stalled reader cannot hold the socket.
            if on_abort is not None:
                on_abort(str(e))
            if request.transport is not None:
                request.transport.close()
        return resp
    finally:
        if not producer.done():
            producer.cancel()
        await asyncio.gather(producer, return_exceptions=True)


async def _next(queue: asyncio.Queue[Any], send: Any, keepalive: float) -> Any:
    """The next queued item, sending a keep-alive comment every `keepalive` seconds."""
    while True:
        try:
            async with asyncio.timeout(keepalive):
                return await queue.get()
        except TimeoutError:
            await send(KEEPALIVE)
