"""The cache's admin API: a tenant admin acts on its own tenant, an operator on all.

POST /admin/cache/purge  {"tenant", "role", "user", "key", "contains"}: all given
    fields must match (`contains`: a case-insensitive substring of the prompt or the
    answer). Removes the entries from Redis, from this replica's L1 and vector index,
    and, through Redis pub/sub, from every other replica's. Answers being generated
    when the purge runs are not stored afterwards.
GET  /admin/cache/stats  entry counts per layer on this replica and in Redis.

Scope: a key with role `admin` sees and purges only entries made by its own tenant
(its filter is pinned to that tenant, and the counts it gets back are counts within it,
so a purge cannot be used to learn what another tenant asked). Only an operator key
(`operator: true`) may name another tenant, purge across tenants or see global stats.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, model_validator
from redis.exceptions import RedisError

from proxy.app_state import STATE
from proxy.auth import Principal
from proxy.body import read_json
from proxy.errors import InvalidRequest, PermissionDenied
from proxy.protocol import parse_model

from .entry import Entry

if TYPE_CHECKING:
    from .plugin import CachePlugin


class PurgeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant: str | None = Field(None, min_length=1)
    role: str | None = Field(None, min_length=1)
    user: str | None = Field(None, min_length=1)
    key: str | None = Field(None, min_length=1)
    contains: str | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _something(self) -> PurgeRequest:
        if not any(self.model_dump().values()):
            raise InvalidRequest("Give at least one of tenant, role, user, key, contains.")
        return self


def matcher(f: dict[str, Any]) -> Callable[[Entry], bool]:
    needle = (f.get("contains") or "").casefold()

    def match(e: Entry) -> bool:
        if f.get("tenant") and e.tenant != f["tenant"]:
            return False
        if f.get("role") and e.role != f["role"]:
            return False
        if f.get("user") and e.user != f["user"]:
            return False
        if f.get("key") and e.key != f["key"]:
            return False
        return not needle or needle in e.prompt.casefold() or needle in e.answer_text(
        ).casefold()

    return match


def _caller(request: web.Request, what: str) -> Principal:
    return request.app[STATE].auth.require_role(
        request.headers.get("Authorization"), "admin", what)


def scoped_filter(principal: Principal, f: dict[str, Any]) -> dict[str, Any]:
    """The purge filter pinned to the caller's tenant (an operator's is left as given)."""
    if principal.operator:
        return f
    if f.get("tenant", principal.tenant) != principal.tenant:
        raise PermissionDenied("A tenant admin may only purge its own tenant's entries.",
                               param="tenant")
    return {**f, "tenant": principal.tenant}


async def _count_redis(plugin: CachePlugin, match: Callable[[Entry], bool],
                       ) -> dict[str, int] | None:
    """Entries in Redis that `match` accepts (a tenant's share); None if Redis fails."""
    store = plugin.redis
    assert store is not None
    exact = semantic = 0
    try:
        async with asyncio.timeout(10):
            async for name in store.client.scan_iter(match=store.p + "x:*", count=500):
                raw = await store.client.get(name)
                exact += bool(raw and match(Entry.from_json(raw)))
            async for name in store.client.scan_iter(match=store.p + "s:*", count=500):
                for raw in (await store.client.hgetall(name)).values():
                    semantic += match(store._unpack(raw)[1])
    except (RedisError, OSError, TimeoutError, ValueError):
        return None
    return {"exact": exact, "semantic": semantic}


def _local_stats(plugin: CachePlugin, match: Callable[[Entry], bool]) -> dict[str, Any]:
    mine = [e for e in plugin.l1.entries() if match(e)] if plugin.l1 else []
    parts = [sum(map(match, (e for e, _ in p.entries.values())))
             for p in plugin.index.partitions.values()]
    return {"l1": {"entries": len(mine)},
            "semantic_index": {"entries": sum(parts), "partitions": sum(n > 0 for n in parts)}}


def routes(plugin: CachePlugin) -> list[tuple[str, str, Callable[[web.Request], Any]]]:
    async def purge(request: web.Request) -> web.Response:
        principal = _caller(request, "The cache admin API")
        data, _ = await read_json(request, 65536)
        req = parse_model(PurgeRequest, data)
        f = scoped_filter(principal, req.model_dump(exclude_none=True))
        match = matcher(f)
        l1, sem = plugin.purge_local(match)
        body: dict[str, Any] = {"purged": {"l1": l1, "semantic_index": sem}}
        if plugin.redis is not None:
            counts = await plugin.redis.purge(match, *plugin.last_purged())
            await plugin.redis.publish({"op": "purge", "filter": f})
            body["purged"]["redis"] = (None if counts is None else
                                       {"exact": counts[0], "semantic": counts[1]})
        return web.json_response(body)

    async def stats(request: web.Request) -> web.Response:
        principal = _caller(request, "The cache admin API")
        body: dict[str, Any] = {"replica": plugin.replica}
        if principal.operator:
            body |= {
                "scope": "global",
                "l1": {"entries": len(plugin.l1) if plugin.l1 else 0,
                       "bytes": plugin.l1.bytes if plugin.l1 else 0},
                "semantic_index": {"entries": len(plugin.index),
                                   "partitions": len(plugin.index.partitions)},
                "in_flight": len(plugin._inflight),
            }
            if plugin.redis is not None:
                body["redis"] = await plugin.redis.count()
            return web.json_response(body)
        match = matcher({"tenant": principal.tenant})
        body |= {"scope": f"tenant {principal.tenant}", **_local_stats(plugin, match)}
        if plugin.redis is not None:
            body["redis"] = await _count_redis(plugin, match)
        return web.json_response(body)

    return [("POST", "/admin/cache/purge", purge), ("GET", "/admin/cache/stats", stats)]
