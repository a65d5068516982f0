"""Where stored responses and stored chat completions live: in memory, or in the cache
plugin's Redis when it has one (one store per kind, `responses` or `chat`).

A response's record is `{"response": <Response>, "conversation": [chat messages]}`; a
chat completion's, `proxy.stored_chat`'s. Every key holds the caller's tenant, so another
tenant's id is simply not found (a 404, never a 403 that would confirm the id exists).
Records expire after `responses.ttl_s`. A record put with a summary can be listed:
`summaries` gives a tenant's, and `get_many` the records of a page of them.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from typing import Any, Protocol

from redis.exceptions import RedisError

from .errors import Unavailable
from .redis_client import blocking_client
from .settings import ResponsesSettings
from .telemetry import get_logger

log = get_logger("weir.responses")

Record = dict[str, Any]
#: What a listing reads of a record (its `id` and what it is filtered and sorted by).
Summary = dict[str, Any]


class RecordStore(Protocol):
    async def get(self, tenant: str, record_id: str) -> Record | None: ...

    async def get_many(self, tenant: str, ids: list[str]) -> list[Record | None]: ...

    async def put(self, tenant: str, record_id: str, record: Record,
                  summary: Summary | None = None) -> None: ...

    async def delete(self, tenant: str, record_id: str) -> bool: ...

    async def forget(self, tenant: str, record_id: str) -> None: ...

    async def summaries(self, tenant: str) -> list[Summary]: ...

    async def close(self) -> None: ...


class MemoryStore:
    """Bounded and expiring. When full, the tenant holding the most records loses its
    oldest: a tenant can push out its own records, never a smaller tenant's (cheap
    requests, cache hits say, must not wipe another tenant's conversations)."""

    def __init__(self, ttl_s: float, max_items: int) -> None:
        self.ttl_s = ttl_s
        self.max_items = max_items
        self._count = 0
        #: tenant -> id -> (expires, record, summary), oldest first
        self._items: dict[str, OrderedDict[str, tuple[float, Record, Summary | None]]] = {}

    def __len__(self) -> int:
        return self._count

    async def get(self, tenant: str, record_id: str) -> Record | None:
        records = self._items.get(tenant)
        hit = records.get(record_id) if records is not None else None
        if hit is None:
            return None
        if hit[0] <= time.monotonic():
            self._pop(tenant, record_id)
            return None
        return hit[1]

    async def get_many(self, tenant: str, ids: list[str]) -> list[Record | None]:
        return [await self.get(tenant, i) for i in ids]

    async def put(self, tenant: str, record_id: str, record: Record,
                  summary: Summary | None = None) -> None:
        self._pop(tenant, record_id)
        self._items.setdefault(tenant, OrderedDict())[record_id] = (
            time.monotonic() + self.ttl_s, record, summary)
        self._count += 1
        while self._count > self.max_items:
            largest = max(self._items, key=lambda t: len(self._items[t]))
            self._pop(largest, next(iter(self._items[largest])))

    async def delete(self, tenant: str, record_id: str) -> bool:
        return self._pop(tenant, record_id)

    async def forget(self, tenant: str, record_id: str) -> None:
        """(A record gone from memory took its summary with it.)"""

    async def summaries(self, tenant: str) -> list[Summary]:
        now = time.monotonic()
        held = self._items.get(tenant)
        for rid in [rid for rid, (expires, _, _) in (held or {}).items() if expires <= now]:
            self._pop(tenant, rid)
        return [summary for _, _, summary in (self._items.get(tenant) or {}).values()
                if summary is not None]

    def _pop(self, tenant: str, record_id: str) -> bool:
        records = self._items.get(tenant)
        if records is None or records.pop(record_id, None) is None:
            return False
        self._count -= 1
        if not records:
            del self._items[tenant]
        return True

    async def close(self) -> None:
        self._items.clear()
        self._count = 0


#: How long past its expiry a listing keeps a summary (replicas' clocks differ; its
#: record, gone or not, decides what a page shows).
_GRACE_S = 60.0
#: At most this many expired summaries leave the listing at each put (bounded work).
_PRUNE = 256
# Expired summaries out of the listing (hash) and the expiry index (sorted set).
_PRUNE_SCRIPT = """
local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
if #gone > 0 then
  redis.call('HDEL', KEYS[1], unpack(gone))
  redis.call('ZREM', KEYS[2], unpack(gone))
end
return #gone
"""
# A summary out of the listing, only if its record is gone (not one put again meanwhile).
_FORGET_SCRIPT = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[3], ARGV[1])
  return 1
end
return 0
"""


class RedisStore:
    """One key per record, `SET ... PX ttl`. A record put with a summary (a stored chat
    completion: its id, order, model and metadata) also has it in the tenant's listing,
    a hash read to list and filter without loading the records, and its expiry in a
    sorted set: each put takes expired summaries out of the listing (a bounded number),
    so a tenant that stores and never lists does not grow it. A Redis that fails is a
    503; a record that is not a JSON object is not found."""

    def __init__(self, url: str, ttl_s: float, key_prefix: str,
                 timeout_s: float = 0.5, kind: str = "responses") -> None:
        self.ttl_s = ttl_s
        self.kind = kind
        self._prefix = f"{key_prefix}{kind}:"  # under the cache's own prefix
        self._redis = blocking_client(url, timeout_s)
        self._prune = self._redis.register_script(_PRUNE_SCRIPT)
        self._forget = self._redis.register_script(_FORGET_SCRIPT)

    @staticmethod
    def _scope(tenant: str) -> str:
        return hashlib.sha256(tenant.encode()).hexdigest()[:32]

    def _key(self, tenant: str, record_id: str) -> str:
        return f"{self._prefix}{self._scope(tenant)}:{record_id}"

    def _listing(self, tenant: str) -> tuple[str, str]:
        """(the summaries' hash, their expiry set): a scope is hex, so no record's key."""
        scope = self._scope(tenant)
        return f"{self._prefix}listing:{scope}", f"{self._prefix}expiry:{scope}"

    async def get(self, tenant: str, record_id: str) -> Record | None:
        return (await self.get_many(tenant, [record_id]))[0]

    async def get_many(self, tenant: str, ids: list[str]) -> list[Record | None]:
        if not ids:
            return []
        try:
            raws = await self._redis.mget([self._key(tenant, i) for i in ids])
        except (RedisError, OSError, TimeoutError) as e:
            raise _down(e, self.kind) from None
        return [_record(raw) for raw in raws]

    async def put(self, tenant: str, record_id: str, record: Record,
                  summary: Summary | None = None) -> None:
        data = json.dumps(record, separators=(",", ":"), ensure_ascii=False)
        ttl_ms = max(1, int(self.ttl_s * 1000))
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.set(self._key(tenant, record_id), data, px=ttl_ms)
                if summary is not None:
                    listing, expiry = self._listing(tenant)
                    pipe.hset(listing, record_id, json.dumps(
                        summary, separators=(",", ":"), ensure_ascii=False))
                    pipe.zadd(expiry, {record_id: time.time() + self.ttl_s})
                    pipe.pexpire(listing, ttl_ms)
                    pipe.pexpire(expiry, ttl_ms)
                await pipe.execute()
            if summary is not None:
                await self._prune(keys=list(self._listing(tenant)),
                                  args=[time.time() - _GRACE_S, _PRUNE])
        except (RedisError, OSError, TimeoutError) as e:
            raise _down(e, self.kind) from None

    async def delete(self, tenant: str, record_id: str) -> bool:
        listing, expiry = self._listing(tenant)
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.delete(self._key(tenant, record_id))
                pipe.hdel(listing, record_id)
                pipe.zrem(expiry, record_id)
                deleted, _, _ = await pipe.execute()
            return bool(deleted)
        except (RedisError, OSError, TimeoutError) as e:
            raise _down(e, self.kind) from None

    async def forget(self, tenant: str, record_id: str) -> None:
        """`record_id`'s summary out of the listing, if its record is gone."""
        try:
            await self._forget(keys=[self._key(tenant, record_id), *self._listing(tenant)],
                               args=[record_id])
        except (RedisError, OSError, TimeoutError) as e:
            raise _down(e, self.kind) from None

    async def summaries(self, tenant: str) -> list[Summary]:
        try:
            held = await self._redis.hgetall(self._listing(tenant)[0])
        except (RedisError, OSError, TimeoutError) as e:
            raise _down(e, self.kind) from None
        return [s for s in map(_record, held.values()) if s is not None]

    async def close(self) -> None:
        await self._redis.aclose()


def _record(raw: Any) -> Record | None:
    """A stored JSON object, or None (missing, or not one: written by something else)."""
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        log.warning("stored record is not a JSON object; ignored")
        return None
    return value


_WHAT = {"responses": "response", "chat": "chat completion"}


def _down(e: BaseException, kind: str) -> Unavailable:
    what = _WHAT.get(kind, kind)
    log.error("record store failed", kind=kind, error=f"{type(e).__name__}: {e}")
    return Unavailable(f"The {what} store is unavailable; retry shortly.",
                       code="store_unavailable")


def cache_redis(plugins: Any) -> Any:
    """The cache plugin's `redis` config, or None (no cache, or no Redis)."""
    cache = next((p for p in plugins if p.name == "cache"), None)
    return getattr(getattr(cache, "config", None), "redis", None)


def make_store(cfg: ResponsesSettings, cache_redis: Any,
               kind: str = "responses") -> RecordStore:
    """In the cache's Redis (`cache_redis`: the cache plugin's `redis` config, or None),
    under its key prefix (two deployments sharing a Redis with their own prefixes share
    no stored response), or in memory."""
    url = getattr(cache_redis, "url", None)
    if cfg.redis and url:
        return RedisStore(url, cfg.ttl_s, cache_redis.key_prefix, kind=kind)
    return MemoryStore(cfg.ttl_s, cfg.max_in_memory)
