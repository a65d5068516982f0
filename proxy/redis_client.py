"""One way to open Redis for Weir's plugins, the type of a Redis URL in a config, and
the Lua that Weir's scripts share.

A blocking pool: a burst beyond `max_connections` waits for a free connection (within
the command timeout) instead of failing at once, as redis-py's default pool does. The
client owns its pool (`from_pool`), so `await client.aclose()` closes both.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, NoReturn

import redis.asyncio as aioredis
from pydantic import AfterValidator
from redis.connection import parse_url
from redis.exceptions import RedisError


def _redis_url(url: str) -> str:
    """Checked as redis-py will read it when the client opens, so a bad one is a config
    error at load time (and in `check-config`), not a traceback at start."""
    try:
        parse_url(url)  # type: ignore[no-untyped-call]
    except ValueError:
        # Not the parser's words: they quote the URL's parts, and what follows its last
        # `:` is often the password (a port that is not a number).
        raise ValueError(
            "not a Redis URL: redis://, rediss:// or unix://, with a numeric port, and a "
            "password's `/`, `#`, `?` or `@` percent-encoded; e.g. redis://host:6379/0"
        ) from None
    return url


#: A Redis URL: redis://, rediss:// or unix://.
RedisUrl = Annotated[str, AfterValidator(_redis_url)]


def blocking_client(url: str, timeout_s: float, max_connections: int = 64,
                    health_check_interval: int = 0) -> aioredis.Redis:
    wait = max(timeout_s * 4, 0.5)
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=wait, socket_timeout=wait,
        socket_connect_timeout=wait, health_check_interval=health_check_interval)
    return aioredis.Redis.from_pool(pool)


async def listen(client: aioredis.Redis, channel: str, *, wait_s: float,
                 on_message: Callable[[Any], Awaitable[None]],
                 on_error: Callable[[Exception], None],
                 on_subscribed: Callable[[], Awaitable[None]] | None = None,
                 between: Callable[[], Awaitable[None]] | None = None) -> NoReturn:
    """Hears `channel` until cancelled: `on_message(data)` for each message published
    there, `between()` before each wait for one (at most `wait_s`), `on_subscribed()`
    each time the subscription is made. An error, a callback's included, goes to
    `on_error` and the channel is subscribed again after a backoff (0.2 s, doubling to
    5 s): what was published meanwhile is not heard. A listener that ended on one error
    had stopped hearing the other replicas while everything else looked fine."""
    backoff = 0.2
    while True:
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(channel)
            backoff = 0.2
            if on_subscribed is not None:
                await on_subscribed()
            while True:
                if between is not None:
                    await between()
                msg = await pubsub.get_message(timeout=wait_s)
                if msg is not None and msg.get("type") == "message":
                    await on_message(msg["data"])
        except Exception as e:
            on_error(e)
            await asyncio.sleep(backoff)  # reconnect backoff, not synchronisation
            backoff = min(backoff * 2, 5.0)
        finally:
            try:
                await pubsub.aclose()  # type: ignore[no-untyped-call]
            except (RedisError, OSError):
                pass


#: What a lost or confused Redis connection raises (a listener hears the channel again).
LOST = (RedisError, OSError, TimeoutError, ValueError)


#: Lua for a script's start: `own(key, kind)` replaces a stray key of another type (a
#: hand edit, another program) where the script writes a `kind` ('hash', 'zset', ...):
#: it failed every write there with WRONGTYPE (a 503) until someone removed it.
OWN_LUA = """
local function own(key, kind)
  local t = redis.call('TYPE', key)['ok']
  if t ~= kind and t ~= 'none' then redis.call('DEL', key) end
end
"""
