"""The app served on a socket through a `ConnectionGuard`: what `weir serve` runs."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from .app_state import STATE
from .connections import GUARD, ConnectionGuard
from .cors import CORS
from .middleware import log_refused
from .settings import ServerSettings
from .telemetry import get_logger

log = get_logger("weir.connections")


class Listener:
    """The app served on a socket through a `ConnectionGuard` (what `weir serve` runs)."""

    def __init__(self, runner: web.AppRunner, server: asyncio.Server,
                 guard: ConnectionGuard) -> None:
        self.runner, self.server, self.guard = runner, server, guard

    @property
    def port(self) -> int:
        return int(self.server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        """Stop accepting, then aiohttp's own shutdown (open connections, cleanup_ctx)."""
        self.server.close()
        await self.runner.cleanup()


async def listen(app: web.Application, settings: ServerSettings, host: str, port: int,
                 ) -> Listener:
    metrics = app[STATE].metrics
    last_note: dict[str, float] = {}

    def closed(reason: str) -> None:  # counted always; logged once per 10 s per reason
        metrics.connections_closed.labels(reason).inc()
        now = asyncio.get_running_loop().time()
        if now - last_note.get(reason, -1e9) >= 10:
            last_note[reason] = now
            log.warning("connection closed by the server", reason=reason,
                        open=len(guard.open), max_connections=guard.max_connections,
                        refused_total=guard.refused, evicted_total=guard.evicted,
                        head_timeouts_total=guard.head_timeouts,
                        write_timeouts_total=guard.write_timeouts)

    guard = ConnectionGuard(settings.max_connections, settings.header_timeout_s, closed,
                            write_timeout_s=settings.write_timeout_s,
                            max_head_bytes=settings.max_head_bytes,
                            max_head_bytes_in_flight=settings.max_head_bytes_in_flight,
                            on_refused=log_refused if app[STATE].settings.logging.access_log
                            else None,
                            cors_grant=cors.wire_grant if (cors := app.get(CORS)) else None,
                            any_origin=cors is not None and cors.any_origin)
    metrics.connections.set_function(lambda: len(guard.open))
    app[GUARD] = guard
    # (auto_decompress: a body's Content-Encoding is decoded by `proxy.body`, strictly)
    handler_kw: dict[str, Any] = dict(
        access_log=None, auto_decompress=False, keepalive_timeout=settings.idle_timeout_s,
        max_line_size=settings.max_header_line_bytes,
        max_field_size=settings.max_header_line_bytes, max_headers=settings.max_headers)
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0,
                           **handler_kw)
    await runner.setup()
    assert runner.server is not None
    loop = asyncio.get_running_loop()
    try:
        server = await loop.create_server(guard.handlers(runner.server, **handler_kw), host,
                                          port, reuse_address=True, backlog=1024)
    except BaseException:
        await runner.cleanup()
        raise
    return Listener(runner, server, guard)
