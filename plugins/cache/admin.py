"""The cache's admin API: a tenant admin acts on its own tenant, an operator on all.

POST /admin/cache/purge  {"tenant", "role", "user", "key", "contains"}: all given
    fields must match (`contains`: a case-insensitive substring of the prompt or the
    answer; `key`: what an answer's `x-weir-cache-key` named). Removes the entries
    from Redis, from this replica's L1 and vector index, and, through Redis pub/sub,
    from every other replica's. Answers being generated when the purge runs are not
    stored afterwards.
GET  /admin/cache/stats  entry counts per layer on this replica and in Redis.

Scope: a key with role `admin` sees and purges only entries made by its own tenant
(its filter is pinned to that tenant, and the counts it gets back are counts within it,
so a purge cannot be used to learn what another tenant asked). Only an operator key
(`operator: true`) may name another tenant, purge across tenants or see global stats.

Talks to the store only; the one thing it needs from the plugin (how many generations
are in flight) is handed in as a function.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from aiohttp import web
from pydantic import Field, model_validator

from proxy.app_state import STATE
from proxy.auth import Principal, account
from proxy.body import read_json
from proxy.config_model import ConfigModel
from proxy.errors import InvalidRequest, PermissionDenied, RateLimited, Unavailable, retry_headers
from proxy.protocol import parse_model

from .entry import matcher
from .store import CacheStore


class PurgeRequest(ConfigModel):
    tenant: str | None = Field(None, min_length=1)
    role: str | None = Field(None, min_length=1)
    user: str | None = Field(None, min_length=1)
    key: str | None = Field(None, min_length=1)
    contains: str | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _something(self) -> PurgeRequest:
        if not any(self.model_dump().values()):
            raise InvalidRequest("Give at least one of tenant, role, user, key, contains.",
                                 code="missing_required_parameter")
        return self


def _caller(request: web.Request, what: str) -> Principal:
    return request.app[STATE].auth.require_role(
        request.headers, "admin", what)


def scoped_filter(principal: Principal, f: dict[str, Any]) -> dict[str, Any]:
    """The purge filter pinned to the caller's tenant (an operator's is left as given)."""
    if principal.operator:
        return f
    if f.get("tenant", principal.tenant) != principal.tenant:
        raise PermissionDenied("A tenant admin may only purge its own tenant's entries.",
                               param="tenant")
    return {**f, "tenant": principal.tenant}


class OneAtATime:
    """Each caller's tenant runs one purge or stats at a time: each reads every entry of
    Redis (its matches are known only by reading them), so a tenant admin looping on
    them would otherwise load the Redis every tenant shares. Another while one runs is a
    429 with `Retry-After`."""

    def __init__(self) -> None:
        self._running: set[str] = set()

    @contextlib.contextmanager
    def held(self, principal: Principal) -> Iterator[None]:
        who = "~operator" if principal.operator else principal.tenant  # (no tenant's name)
        if who in self._running:
            raise RateLimited("A cache purge or stats call of this tenant is already "
                              "running; retry when it ends.", code="admin_busy",
                              headers=retry_headers(1000))
        self._running.add(who)
        try:
            yield
        finally:
            self._running.discard(who)


def routes(store: CacheStore, in_flight: Callable[[], int],
           ) -> list[tuple[str, str, Callable[[web.Request], Any]]]:
    one = OneAtATime()

    async def purge(request: web.Request) -> web.Response:
        principal = _caller(request, "The cache admin API")
        data, _ = await read_json(request, 65536, account(principal.tenant))
        req = parse_model(PurgeRequest, data)
        f = scoped_filter(principal, req.model_dump(exclude_none=True))
        with one.held(principal):
            counts = await store.purge(f)
        if "redis" in counts and counts["redis"] is None:
            # This replica's memory is purged; Redis (and, through it, the others) is
            # not: the entries could come back from it. Say so, and retry.
            raise Unavailable("The cache's Redis could not be purged, so the matching "
                              "entries may still be served from it; retry the purge.",
                              code="cache_store_unavailable", retry_after=1)
        return web.json_response({"purged": counts})

    async def stats(request: web.Request) -> web.Response:
        principal = _caller(request, "The cache admin API")
        with one.held(principal):
            if principal.operator:
                body = await store.stats()
                body |= {"scope": "global", "in_flight": in_flight()}
            else:
                body = await store.stats(matcher({"tenant": principal.tenant}))
                body["scope"] = f"tenant {principal.tenant}"
        return web.json_response(body)

    return [("POST", "/admin/cache/purge", purge), ("GET", "/admin/cache/stats", stats)]
