"""Where stored responses live: in memory, or in the cache plugin's Redis when it has one.

A record is `{"response": <Response>, "conversation": [chat messages]}`. Every key holds
the caller's tenant, so another tenant's id is simply not found (a 404, never a 403
that would confirm the id exists). Records expire after `responses.ttl_s`.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from typing import Any, Protocol

from redis.exceptions import RedisError

from ..errors import Unavailable
from ..redis_client import blocking_client
from ..settings import ResponsesSettings
from ..telemetry import get_logger

log = get_logger("weir.responses")

Record = dict[str, Any]


class ResponseStore(Protocol):
    async def get(self, tenant: str, response_id: str) -> Record | None: ...

    async def put(self, tenant: str, response_id: str, record: Record) -> None: ...

    async def delete(self, tenant: str, response_id: str) -> bool: ...

    async def close(self) -> None: ...


class MemoryStore:
    """Bounded and expiring. When full, the tenant holding the most records loses its
    oldest: a tenant can push out its own records, never a smaller tenant's (cheap
    requests, cache hits say, must not wipe another tenant's conversations)."""

    def __init__(self, ttl_s: float, max_items: int) -> None:
        self.ttl_s = ttl_s
        self.max_items = max_items
        self._count = 0
        #: tenant -> response id -> (expires, record), oldest first
        self._items: dict[str, OrderedDict[str, tuple[float, Record]]] = {}

    def __len__(self) -> int:
        return self._count

    async def get(self, tenant: str, response_id: str) -> Record | None:
        records = self._items.get(tenant)
        hit = records.get(response_id) if records is not None else None
        if hit is None:
            return None
        if hit[0] <= time.monotonic():
            self._pop(tenant, response_id)
            return None
        return hit[1]

    async def put(self, tenant: str, response_id: str, record: Record) -> None:
        self._pop(tenant, response_id)
        self._items.setdefault(tenant, OrderedDict())[response_id] = (
            time.monotonic() + self.ttl_s, record)
        self._count += 1
        while self._count > self.max_items:
            largest = max(self._items, key=lambda t: len(self._items[t]))
            self._pop(largest, next(iter(self._items[largest])))

    async def delete(self, tenant: str, response_id: str) -> bool:
        return self._pop(tenant, response_id)

    def _pop(self, tenant: str, response_id: str) -> bool:
        records = self._items.get(tenant)
        if records is None or records.pop(response_id, None) is None:
            return False
        self._count -= 1
        if not records:
            del self._items[tenant]
        return True

    async def close(self) -> None:
        self._items.clear()
        self._count = 0


class RedisStore:
    """One key per record, `SET ... EX ttl`; a Redis that fails is a 503."""

    def __init__(self, url: str, ttl_s: float, key_prefix: str,
                 timeout_s: float = 0.5) -> None:
        self.ttl_s = ttl_s
        self._prefix = f"{key_prefix}responses:"  # under the cache's own prefix
        self._redis = blocking_client(url, timeout_s)

    def _key(self, tenant: str, response_id: str) -> str:
        scope = hashlib.sha256(tenant.encode()).hexdigest()[:32]
        return f"{self._prefix}{scope}:{response_id}"

    async def get(self, tenant: str, response_id: str) -> Record | None:
        try:
            raw = await self._redis.get(self._key(tenant, response_id))
        except (RedisError, OSError, TimeoutError) as e:
            raise _down(e) from None
        return None if raw is None else dict(json.loads(raw))

    async def put(self, tenant: str, response_id: str, record: Record) -> None:
        data = json.dumps(record, separators=(",", ":"), ensure_ascii=False)
        try:
            await self._redis.set(self._key(tenant, response_id), data,
                                  px=max(1, int(self.ttl_s * 1000)))
        except (RedisError, OSError, TimeoutError) as e:
            raise _down(e) from None

    async def delete(self, tenant: str, response_id: str) -> bool:
        try:
            return bool(await self._redis.delete(self._key(tenant, response_id)))
        except (RedisError, OSError, TimeoutError) as e:
            raise _down(e) from None

    async def close(self) -> None:
        await self._redis.aclose()


def _down(e: BaseException) -> Unavailable:
    log.error("response store failed", error=f"{type(e).__name__}: {e}")
    return Unavailable("The response store is unavailable; retry shortly.",
                       code="store_unavailable")


def make_store(cfg: ResponsesSettings, cache_redis: Any) -> ResponseStore:
    """In the cache's Redis (`cache_redis`: the cache plugin's `redis` config, or None),
    under its key prefix (two deployments sharing a Redis with their own prefixes share
    no stored response), or in memory."""
    url = getattr(cache_redis, "url", None)
    if cfg.redis and url:
        return RedisStore(url, cfg.ttl_s, cache_redis.key_prefix)
    return MemoryStore(cfg.ttl_s, cfg.max_in_memory)
