"""One way to open Redis for Weir's plugins.

A blocking pool: a burst beyond `max_connections` waits for a free connection (within
the command timeout) instead of failing at once, as redis-py's default pool does. The
client owns its pool (`from_pool`), so `await client.aclose()` closes both.
"""

from __future__ import annotations

import redis.asyncio as aioredis


def blocking_client(url: str, timeout_s: float, max_connections: int = 64,
                    health_check_interval: int = 0) -> aioredis.Redis:
    wait = max(timeout_s * 4, 0.5)
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=wait, socket_timeout=wait,
        socket_connect_timeout=wait, health_check_interval=health_check_interval)
    return aioredis.Redis.from_pool(pool)
