"""`proxy.redis_client.listen`: the one listener both cross-replica channels use (the
cache's events, the stored responses' news), against a real redis-server."""

from __future__ import annotations

import asyncio
from typing import Any

from bench.redis_server import RedisServer
from proxy.redis_client import blocking_client, listen


async def test_a_failing_callback_is_reported_and_the_channel_heard_again(
        redis_server: RedisServer) -> None:
    """A callback's error (not Redis's) is handed to `on_error` and the channel is
    subscribed again: an error that ended the listener had stopped cross-replica events
    for good while the replica looked healthy."""
    client = blocking_client(redis_server.url, 1.0)
    heard: list[Any] = []
    errors: list[Exception] = []
    subscribed = asyncio.Queue[None]()
    got = asyncio.Event()

    async def on_message(data: Any) -> None:
        if not errors and data == b"first":
            raise RuntimeError("a bug in a handler")
        heard.append(data)
        got.set()

    async def on_subscribed() -> None:
        subscribed.put_nowait(None)

    task = asyncio.create_task(listen(
        client, "test-listen", wait_s=0.05, on_message=on_message,
        on_error=errors.append, on_subscribed=on_subscribed))
    try:
        async with asyncio.timeout(20):
            await subscribed.get()
            await client.publish("test-listen", "first")
            await subscribed.get()  # subscribed again after the error
            await client.publish("test-listen", "second")
            await got.wait()
        assert [type(e) for e in errors] == [RuntimeError]
        assert heard == [b"second"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.aclose()
