"""A real aiohttp server for an app, on its own event loop in a background thread, for
tests whose client side is synchronous (hypothesis, a browser)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from aiohttp import web


@contextmanager
def serve_in_thread(make_app: Callable[[], web.Application]) -> Iterator[str]:
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def start() -> None:
        runner = web.AppRunner(make_app(), handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        box["runner"], box["url"] = runner, f"http://127.0.0.1:{runner.addresses[0][1]}"
        ready.set()

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(start())
            loop.run_forever()
        finally:
            # (left open, the loop and its self-pipe's two sockets were found unclosed by a
            # later test's garbage collection, and failed that test)
            asyncio.set_event_loop(None)
            loop.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert ready.wait(10), "the server did not start"
    try:
        yield box["url"]
    finally:
        asyncio.run_coroutine_threadsafe(box["runner"].cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        t.join(10)
