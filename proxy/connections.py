"""Connection limits in front of aiohttp's protocol: a cap, a head timeout, quiet logs.

aiohttp bounds a request head's size (`max_line_size`, `max_field_size`) and closes a
connection that stays idle for `keepalive_timeout`, but it has no clock on a request
head that arrives one byte at a time (slowloris) and no limit on connections, so idle
sockets can use up the process's file descriptors. `ConnectionGuard` wraps each of
aiohttp's per-connection protocols:

- at `max_connections`, a new connection takes the place of the oldest idle one (a
  keep-alive connection between requests, or one that never sent a byte), which is
  closed; when none is idle it gets a complete `503` (OpenAI-shaped, `Connection:
  close`) and is closed at once. So a flood of idle sockets cannot use up the file
  descriptors the engine, Redis and the requests in progress need, and new clients
  (health probes too) are still served;
- once the first byte of a request head arrives while no request is being handled,
  the head must be complete within `header_timeout_s`, or the connection is aborted.
  "Being handled" is marked by `guard_middleware` (the outermost middleware), which
  runs as soon as aiohttp has parsed a head;
- a head may be `max_head_bytes` long at most (aiohttp bounds each line and the number
  of fields, not their total): past it the connection gets a `431` and is closed. A
  request's body is no head: its bytes, after the head's blank line or arriving for a
  body its handler left unread or for one pipelined behind it, are not counted. What a
  client sends while its request runs, past that request's body, is the next requests
  (pipelined), which aiohttp
  parses at once: past `max_head_bytes` of them the connection is not read until the
  request has ended (a client that leaves meanwhile is seen at the next write);
- an answer that waits on its client for `write_timeout_s` once its handler has
  returned (aiohttp writes a whole answer, and a stream's end, after the middlewares)
  is aborted: writes wait while the transport's buffer is over its high-water mark
  (`pause_writing`) until the client has read it down (`resume_writing`), so a client
  that stopped reading would hold the answer's bytes, and the connection, for good. A
  stream's writes inside its handler have their own clock (`proxy.streaming`).

The body's own timeout is applied where the body is read (`proxy.body`), and the idle
keep-alive timeout is aiohttp's `keepalive_timeout`. aiohttp's own error answers (a
malformed head) are replaced by OpenAI-shaped ones that do not quote the request
(`proxy.wire_errors`). `proxy.listener.listen` puts it together.
"""

from __future__ import annotations

import asyncio
import re
import resource
from collections.abc import Callable
from typing import Any, cast

from aiohttp import StreamReader, web
from aiohttp.typedefs import Handler

from .ids import new_hex
from .wire_errors import Grant, OpenAIErrors, head_too_large, heads_full, refusal

_RESERVED_FDS = 256  # for the engine, Redis, log files, the embedding model ...


def default_max_connections() -> int:
    """The soft file-descriptor limit less a reserve (at least 64)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 65536
    return max(64, soft - max(_RESERVED_FDS, soft // 4))


_HEAD_END = b"\r\n\r\n"

#: A head's `Origin` field line, whole (its value: `Cors.wire_grant`'s to judge).
_ORIGIN_LINE = re.compile(rb"\n(?i:origin):([^\r\n]*)\r?\n")
#: The longest line kept, across a head's pieces, as it may be an `Origin` one (an
#: origin listed is `scheme://host:port`, a host 253 bytes at most).
_ORIGIN_LINE_MAX = 1024


class _Guarded(asyncio.Protocol):
    """One connection: delegates to aiohttp's protocol, adds the cap and the head clock."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self.guard = guard
        self.inner = inner
        self.transport: asyncio.Transport | None = None
        self.refused = False
        self.busy = 0  # requests of this connection inside their handler
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_bytes: int | None = None  # of the head arriving; None: not counting
        self._head_tail = b""  # its last bytes (its blank line may come split)
        self._head_done = False  # its blank line came: what follows is its body
        self._head_begun = False  # its request line has begun (past any blank lines)
        self._counted = 0  # of the guard's `head_held`: its head's bytes, while it comes
        self._unread: StreamReader | None = None  # a body its handler left, still coming
        self._running: StreamReader | None = None  # the body of the request running
        self._ahead = 0  # bytes sent after it while it runs (pipelined requests)
        self._held = False  # reading paused for them
        self._write_timer: asyncio.TimerHandle | None = None
        self.paused = False  # the transport's buffer is full: writes wait on the client
        self.origin: str | None = None  # the head's `Origin` (where `server.cors` is on)
        self._origin_tail = b""  # its line, begun (from its `\n`), where it came split

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        transport = cast(asyncio.Transport, base)
        self.transport = transport
        g = self.guard
        if len(g.open) >= g.max_connections and not g.evict_idle():
            self.refused = True
            g.refused += 1
            g.note("refused")
            transport.write(g.refusal)
            transport.close()
            return
        g.open[transport] = self
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        if not self.busy and self._head_timer is None and data:
            loop = asyncio.get_running_loop()
            self._head_timer = loop.call_later(self.guard.header_timeout_s, self._head_late)
        if not self.busy and not self._head_done and self._head_bytes is None and (
                self._unread is None or self._unread.is_eof()):
            self._unread, self._head_bytes, self._head_tail = None, 0, b""
            self._head_begun = False
            self.origin, self._origin_tail = None, b""
        if self._head_bytes is not None and self._head_too_large(data):
            return
        ahead = self.busy and self._running is not None and self._running.is_eof()
        self.inner.data_received(data)
        if ahead:
            self._read_ahead(len(data))

    def _read_ahead(self, size: int) -> None:
        """Bytes of requests pipelined behind the running one: past the bound, hold off
        reading until it ends. Paused after aiohttp has parsed them, and again each time:
        aiohttp resumes reading itself as a pipelined request's body ends."""
        self._ahead += size
        if self._ahead > self.guard.max_head_bytes:
            assert self.transport is not None
            self._held = True
            if not self.transport.is_closing():
                self.transport.pause_reading()

    def _head_too_large(self, data: bytes) -> bool:
        """Count a head's bytes up to its blank line; past the bound, refuse it. Blank
        lines before its request line (which the parser skips) count, but end nothing."""
        assert self._head_bytes is not None and self.transport is not None
        skipped = 0
        if not self._head_begun:
            line = data.lstrip(b"\r\n")
            skipped, data = len(data) - len(line), line
            self._head_begun = bool(line)
        seen = self._head_tail + data
        end = seen.find(_HEAD_END) if data else -1
        if self.guard.sniff_origin and self.origin is None:
            self._find_origin(data if end < 0 else data[:end + 4 - len(self._head_tail)])
        size = self._head_bytes + skipped + (
            len(data) if end < 0 else end + 4 - len(self._head_tail))
        g = self.guard
        if size > g.max_head_bytes:
            return self._refuse_head("head_too_large", 431, "request_header_fields_too_large",
                                     head_too_large)
        if end < 0 and g.head_held - self._counted + size > g.max_head_bytes_in_flight:
            # Heads arriving in pieces, all connections' together, past their bound:
            # this one, growing, is refused (a whole head in one piece never counts).
            return self._refuse_head("heads_in_flight", 503, "overloaded", heads_full)
        if end < 0:
            self._head_bytes, self._head_tail = size, seen[-3:]
            self._hold(size)
        else:
            self._head_bytes, self._head_done = None, True
            self._hold(0)
        return False

    def _find_origin(self, head: bytes) -> None:
        """The `Origin` line in this piece of the head, or in the line begun in the last
        one (a line past `_ORIGIN_LINE_MAX` is no origin allowed: not kept)."""
        seen = self._origin_tail + head
        found = _ORIGIN_LINE.search(seen)
        if found is not None:
            self.origin, self._origin_tail = found[1].strip(b" \t").decode("latin-1"), b""
            return
        line = seen.rfind(b"\n")
        rest = seen[line:] if line >= 0 else seen if self._origin_tail else b""
        self._origin_tail = rest if len(rest) <= _ORIGIN_LINE_MAX else b""

    def _refuse_head(self, reason: str, status: int, code: str,
                     answer: Callable[[str, Grant], bytes]) -> bool:
        """Refuse the head arriving: nothing more reaches aiohttp's parser; the access
        log's line and the answer carry one request id; the connection closes."""
        assert self.transport is not None
        self.refused = True
        self._hold(0)
        self._disarm_head()
        self.guard.note(reason)
        rid = new_hex()
        if self.guard.on_refused is not None:
            self.guard.on_refused(status, code, rid)
        self.transport.write(answer(rid, self.guard.wire_grant(self.transport)))
        self.transport.close()
        return True

    def _hold(self, size: int) -> None:
        """Count `size` bytes of this connection's head arriving (0: none) in the
        guard's `head_held`."""
        self.guard.head_held += size - self._counted
        self._counted = size

    def eof_received(self) -> bool | None:
        return None if self.refused else self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._hold(0)
        self._disarm()
        assert self.transport is not None
        if self.guard.open.pop(self.transport, None) is not None:  # (not one refused)
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if not self.refused:
            self.paused = True
            self._arm_write()
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if not self.refused:
            self.paused = False
            self._disarm_write()
            self.inner.resume_writing()

    def request_started(self, body: StreamReader | None = None) -> None:
        """`body`: the request's (once it has all come, what follows is read ahead)."""
        self.busy += 1
        self._disarm_head()
        self._head_bytes, self._head_done = None, False
        self._running, self._ahead = body, 0

    def request_ended(self, body: StreamReader | None = None) -> None:
        """`body`: the request's, where its handler left it still arriving (aiohttp reads
        it after the answer): its bytes are no head. Nor are those of the body of a
        request pipelined behind it, whose head aiohttp has parsed already."""
        self.busy -= 1
        self.origin, self._origin_tail = None, b""  # (a head that follows has its own)
        queued = getattr(self.inner, "_messages", None)  # (aiohttp's parsed requests)
        if queued:  # the last request pipelined behind it: its body may still come
            body = queued[-1][1]
        self._unread = body if body is not None and not body.is_eof() else None
        self._running = None
        if self._held and not self.busy:
            self._held = False
            if self.transport is not None and not self.transport.is_closing():
                self.transport.resume_reading()
        self._arm_write()  # (the answer's last writes may wait already)

    def _disarm(self) -> None:
        self._disarm_head()
        self._disarm_write()

    def _disarm_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _arm_write(self) -> None:
        """Start the write clock where writes wait on the client outside a handler."""
        if self.paused and not self.busy and self._write_timer is None:
            loop = asyncio.get_running_loop()
            self._write_timer = loop.call_later(self.guard.write_timeout_s, self._write_late)

    def _disarm_write(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    @property
    def idle(self) -> bool:
        return not self.busy and self._head_timer is None

    def _head_late(self) -> None:
        self._head_timer = None
        if self.busy or self.transport is None or self.transport.is_closing():
            return
        self.guard.head_timeouts += 1
        self.guard.note("head_timeout")
        self.transport.abort()  # a slow sender gets no lingering close

    def _write_late(self) -> None:
        self._write_timer = None
        if not self.paused or self.busy or self.transport is None or (
                self.transport.is_closing() and self.transport.get_write_buffer_size() == 0):
            return
        self.guard.write_timeouts += 1
        self.guard.note("write_timeout")
        self.transport.abort()  # (a close would wait for the client to read it all)


class ConnectionGuard:
    """The protocol factory's wrapper and the live connections it tracks."""

    def __init__(self, max_connections: int | None, header_timeout_s: float,
                 on_close: Callable[[str], None] | None = None,
                 write_timeout_s: float = 30.0, max_head_bytes: int = 65536,
                 on_refused: Callable[[int, str | None, str], None] | None = None,
                 max_head_bytes_in_flight: int = 64 << 20,
                 cors_grant: Callable[[str | None], Grant] | None = None,
                 any_origin: bool = False) -> None:
        """`on_refused(status, code, request_id)`: told of each request refused before
        it was parsed (by aiohttp's parser, or past `max_head_bytes`): the access log's
        line, with the id its answer carries. `max_head_bytes_in_flight`: the bytes of
        the heads arriving in pieces, all connections' together, at most (each stalled
        head held about twice its size in memory, on each of thousands of connections).
        `cors_grant(origin)`: `server.cors`'s headers for an answer written here, below
        the app (`Cors.wire_grant`), by the `Origin` line found in the head's bytes;
        `any_origin`: it grants any alike (`allow_origins: ["*"]`), so no head is
        searched for its `Origin` line."""
        self.cors_grant = cors_grant
        self.sniff_origin = cors_grant is not None and not any_origin
        self.refusal = refusal(cors_grant(None) if cors_grant is not None else ())
        self.max_head_bytes_in_flight = max_head_bytes_in_flight
        self.head_held = 0
        self.max_connections = max_connections or default_max_connections()
        self.header_timeout_s = header_timeout_s
        self.write_timeout_s = write_timeout_s
        self.max_head_bytes = max_head_bytes
        self.open: dict[asyncio.Transport, _Guarded] = {}
        self.refused = 0
        self.evicted = 0
        self.head_timeouts = 0
        self.write_timeouts = 0
        self._on_close = on_close
        self.on_refused = on_refused

    def factory(self, inner: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        return lambda: _Guarded(self, inner())

    def handlers(self, server: web.Server, **kw: Any) -> Callable[[], asyncio.Protocol]:
        """aiohttp's per-connection protocol (with OpenAI-shaped errors), guarded."""
        loop = asyncio.get_running_loop()

        return self.factory(lambda: OpenAIErrors(
            server, loop=loop, on_refused=self.on_refused,
            wire_grant=self.wire_grant if self.cors_grant is not None else None, **kw))

    def wire_grant(self, transport: Any) -> Grant:
        """`server.cors`'s headers for an answer written below the app on `transport`:
        by the `Origin` of the head it refuses (none where `server.cors` is off)."""
        if self.cors_grant is None:
            return ()
        conn = self.open.get(transport)
        return self.cors_grant(conn.origin if conn is not None else None)

    def evict_idle(self) -> bool:
        """Close the oldest idle connection (the dict keeps them oldest first)."""
        for transport, conn in self.open.items():
            if conn.idle and not transport.is_closing():
                self.open.pop(transport)
                self.evicted += 1
                self.note("evicted")
                transport.abort()
                return True
        return False

    def note(self, reason: str) -> None:
        """A connection Weir closed on its own: refused, evicted, head_timeout,
        head_too_large, heads_in_flight or write_timeout."""
        if self._on_close is not None:
            self._on_close(reason)

    def connection_of(self, transport: Any) -> _Guarded | None:
        return self.open.get(transport)


GUARD = web.AppKey("connection_guard", ConnectionGuard)


@web.middleware
async def guard_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Marks the connection busy while its request is handled (stops the head clock)."""
    guard = request.app.get(GUARD)
    conn = guard.connection_of(request.transport) if guard is not None else None
    if conn is None:
        return await handler(request)
    conn.request_started(request.content)
    try:
        return await handler(request)
    finally:
        conn.request_ended(request.content)
