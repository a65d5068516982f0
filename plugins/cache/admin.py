"""The cache's admin API (role `admin` only; 403 otherwise).

POST /admin/cache/purge  {"tenant", "role", "user", "key", "contains"}: all given
    fields must match (`contains`: a case-insensitive substring of the prompt or the
    answer). Removes the entries from Redis, from this replica's L1 and vector index,
    and, through Redis pub/sub, from every other replica's. Answers being generated
    when the purge runs are not stored afterwards.
GET  /admin/cache/stats  entry counts per layer on this replica and in Redis.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, model_validator

from proxy.app_state import STATE
from proxy.errors import InvalidRequest, PermissionDenied
from proxy.protocol import parse_model
from proxy.routes import read_json

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


def _require_admin(request: web.Request) -> None:
    principal = request.app[STATE].auth.authenticate(request.headers.get("Authorization"))
    if principal.role != "admin":
        raise PermissionDenied("The cache admin API needs an API key with role `admin`.")


def routes(plugin: CachePlugin) -> list[tuple[str, str, Callable[[web.Request], Any]]]:
    async def purge(request: web.Request) -> web.Response:
        _require_admin(request)
        data, _ = await read_json(request, 65536)
        req = parse_model(PurgeRequest, data)
        f = req.model_dump(exclude_none=True)
        match = matcher(f)
        l1, sem = plugin.purge_local(match)
        body: dict[str, Any] = {"purged": {"l1": l1, "semantic_index": sem}}
        if plugin.redis is not None:
            counts = await plugin.redis.purge(match)
            await plugin.redis.publish({"op": "purge", "filter": f})
            body["purged"]["redis"] = (None if counts is None else
                                       {"exact": counts[0], "semantic": counts[1]})
        return web.json_response(body)

    async def stats(request: web.Request) -> web.Response:
        _require_admin(request)
        body: dict[str, Any] = {
            "replica": plugin.replica,
            "l1": {"entries": len(plugin.l1) if plugin.l1 else 0,
                   "bytes": plugin.l1.bytes if plugin.l1 else 0},
            "semantic_index": {"entries": len(plugin.index),
                               "partitions": len(plugin.index.partitions)},
            "in_flight": len(plugin._inflight),
        }
        if plugin.redis is not None:
            body["redis"] = await plugin.redis.count()
        return web.json_response(body)

    return [("POST", "/admin/cache/purge", purge), ("GET", "/admin/cache/stats", stats)]
