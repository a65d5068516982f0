"""One way to open Redis for Weir's plugins, the type of a Redis URL in a config, and
the Lua that Weir's scripts share.

A blocking pool: a burst beyond `max_connections` waits for a free connection (within
the command timeout) instead of failing at once, as redis-py's default pool does. The
client owns its pool (`from_pool`), so `await client.aclose()` closes both.
"""

from __future__ import annotations

from typing import Annotated

import redis.asyncio as aioredis
from pydantic import AfterValidator
from redis.connection import parse_url


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


#: Lua for a script's start: `own(key, kind)` replaces a stray key of another type (a
#: hand edit, another program) where the script writes a `kind` ('hash', 'zset', ...):
#: it failed every write there with WRONGTYPE (a 503) until someone removed it.
OWN_LUA = """
local function own(key, kind)
  local t = redis.call('TYPE', key)['ok']
  if t ~= kind and t ~= 'none' then redis.call('DEL', key) end
end
"""
