"""Stored chat completions: a chat request with `store: true` is kept, for its tenant, and
served back as OpenAI serves it (`client.chat.completions.list / retrieve / update /
delete / messages.list`).

What is kept is what went out: the completion (a streamed one assembled from its chunks,
and only once it completed; one cut or failed is not kept), the request's messages as the
model saw them (after the sanitizer's redactions) and the request's `metadata`. Stored
records live where stored responses do (`proxy.record_store`: memory, or the cache's
Redis), with the same `responses.ttl_s`, and in memory a `max_in_memory` of their own. A
store that fails does not fail the answer, which has gone out: it is logged, and the
completion is not found afterwards.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from .app_state import STATE
from .auth import account
from .body import read_json
from .chain import kept_fallback, told_fallback
from .context import RequestContext, screened_values
from .errors import NotFound, WeirError
from .ids import shown_id
from .middleware import ROUTE_OPTS
from .pagination import listing, no_such_cursor, one, page, params
from .protocol import ChatCompletionRequest, Metadata, parse_model
from .record_store import Record, RecordStore, cache_redis, make_store
from .rendering import ChatAssembly
from .reply import Outcome, Stream
from .streaming import json_response
from .telemetry import error_fields, get_logger

log = get_logger("weir.stored_chat")

STORE: web.AppKey[RecordStore] = web.AppKey("weir_chat_store", RecordStore)


def wanted(ctx: RequestContext) -> bool:
    return isinstance(ctx.request, ChatCompletionRequest) and ctx.request.store is True


async def save(app: web.Application, ctx: RequestContext, completion: dict[str, Any]) -> None:
    """Keep `completion`, the answer to `ctx`'s request (`wanted(ctx)`)."""
    req = ctx.request
    assert isinstance(req, ChatCompletionRequest)
    cid = completion.get("id")
    if not isinstance(cid, str) or not cid:  # (an upstream's answer without one)
        log.warning("chat completion not stored: it has no id")
        return
    record: Record = kept_fallback({
        # When the request came (a listing's order, to the nanosecond; a stream is saved
        # when it ends, after requests that came later and ended sooner).
        "at": time.time_ns() - int((time.monotonic() - ctx.started) * 1e9),
        "completion": {**completion, "metadata": screened_values(dict(req.metadata or {}),
                                                                 ctx.screen_aside)},
        "messages": [_message(f"{cid}-{i}", m.model_dump(exclude_none=True))
                     for i, m in enumerate(req.messages)],
    }, ctx.response_headers)  # (a breaker's fallback answered: a GET says so)
    try:
        await _put(app[STORE], ctx.principal.tenant, record)
    except WeirError as e:  # the store logged why (or too large); the answer has gone out
        log.warning("chat completion not stored", completion_id=cid, reason=e.code)


async def _put(store: RecordStore, tenant: str, record: Record) -> None:
    """`record` under its completion's id, with what a listing filters it by."""
    await store.put(tenant, record["completion"]["id"], record, summary=_summary_of(record))


def _summary_of(record: Record) -> dict[str, Any]:
    c = record["completion"]
    return {"id": c["id"], "at": record.get("at", 0), "model": c.get("model"),
            "metadata": c.get("metadata") or {}}


def keep_when_completed(app: web.Application, ctx: RequestContext,
                        stream: Stream) -> Callable[[dict[str, Any]], None]:
    """Assemble `stream`'s chunks as they go out (the returned callable takes each) and
    store the completion when the stream ends completed. A chunk it cannot read stops
    the assembly (logged), never the stream."""
    chunks = ChatAssembly()

    def add(chunk: dict[str, Any]) -> None:
        if chunks.broken:
            return
        try:
            chunks.add(chunk)
        except (KeyError, TypeError, AttributeError) as e:
            chunks.broken = True
            log.warning("a streamed chat completion cannot be stored", **error_fields(e))

    async def ended(_stream: Stream, outcome: Outcome) -> None:
        if outcome == "completed" and not chunks.broken and (
                completion := chunks.completion(stream.usage)):
            await save(app, ctx, completion)

    stream.on_end(ended)
    return add


def _message(mid: str, m: dict[str, Any]) -> dict[str, Any]:
    """A request message as OpenAI lists it: its text as `content`, and its parts, when it
    was sent as parts, as `content_parts`."""
    content = m.get("content")
    parts = content if isinstance(content, list) else None
    if parts is not None:
        content = "".join(p.get("text") or "" for p in parts if p.get("type") == "text")
    out = {"id": mid, "role": m["role"], "content": content, "refusal": m.get("refusal"),
           "name": m.get("name"), "content_parts": parts}
    for extra in ("tool_calls", "tool_call_id"):
        if m.get(extra) is not None:
            out[extra] = m[extra]
    return out


# ------------------------------------------------------------------------------ routes

def _tenant(request: web.Request) -> str:
    return request.app[STATE].auth.authenticate(request.headers).tenant


async def _record(request: web.Request, tenant: str) -> Record:
    cid = request.match_info["completion_id"]
    record = _readable(await request.app[STORE].get(tenant, cid))
    if record is None:  # another tenant's is not found, as a missing one is
        raise _not_found(cid)
    return record


def _not_found(cid: str) -> NotFound:
    return NotFound(f"Chat completion with id '{shown_id(cid)}' not found.", param=None)


def _readable(record: Record | None) -> Record | None:
    """`record` if it is a stored chat completion's (not something else's under its key)."""
    if record is None or not isinstance(record.get("messages"), list):
        return None
    completion = record.get("completion")
    ok = isinstance(completion, dict) and isinstance(completion.get("id"), str)
    return record if ok else None


#: The most places of the listing read at a time (their summaries, not their records):
#: a page reads as many as it shows first, then more each time a filter passes some over.
_WINDOW = 200


async def list_completions(request: web.Request) -> web.Response:
    """`GET /v1/chat/completions?model=&metadata[k]=v&after=&limit=&order=`: oldest
    first unless `order=desc`. `after` may name a completion deleted or expired since
    its page was read (it keeps its place a while): paging goes on."""
    tenant = _tenant(request)
    q = request.query
    limit, order = params(q, "asc")
    # (each filter once: one given twice is a 400 naming it, not its first value read)
    wanted_meta = {k[len("metadata["):-1]: one(q, k) for k in q
                   if k.startswith("metadata[") and k.endswith("]")}
    model = one(q, "model")
    store = request.app[STORE]
    held: list[Record] = []  # the page's records, and one more if there is one
    cursor: str | None = one(q, "after")
    if cursor == "" or (cursor and "\x00" in cursor):  # (no id holds one: a store's own)
        raise no_such_cursor("stored chat completion")
    first = True
    size = min(limit + 1, _WINDOW)
    while len(held) <= limit:
        try:
            window, cursor = await store.scan(tenant, cursor, order == "desc", size)
        except KeyError:
            if first:
                raise no_such_cursor("stored chat completion") from None
            break  # (its place expired meanwhile: the listing ends there)
        first, size = False, min(size * 4, _WINDOW)
        found = [c for c in map(_summary, window) if c is not None
                 and (model is None or c.get("model") == model)
                 and all(c["metadata"].get(k) == v for k, v in wanted_meta.items())]
        while found and len(held) <= limit:
            batch, found = found[:limit + 1 - len(held)], found[limit + 1 - len(held):]
            records = await store.get_many(tenant, [c["id"] for c in batch])
            for c, record in zip(batch, map(_readable, records), strict=True):
                if record is None:  # expired or evicted: out of the listing too
                    await store.forget(tenant, c["id"])
                else:
                    held.append(record)
        if cursor is None:
            break
    return json_response(listing([r["completion"] for r in held[:limit]], len(held) > limit))


def _summary(s: dict[str, Any]) -> dict[str, Any] | None:
    """A listing's summary as `_put` writes it, or None (written by something else)."""
    ok = (isinstance(s.get("id"), str) and isinstance(s.get("at"), int | float)
          and isinstance(s.get("metadata"), dict))
    return s if ok else None


async def retrieve(request: web.Request) -> web.Response:
    record = await _record(request, _tenant(request))
    return json_response(record["completion"], told_fallback(record))


async def list_messages(request: web.Request) -> web.Response:
    messages = (await _record(request, _tenant(request)))["messages"]
    return json_response(page(messages, request.query, order="asc",
                      what="message of this chat completion"))


class _Update(BaseModel):
    model_config = ConfigDict(extra="forbid")
    metadata: Metadata | None = Field(...)


async def update(request: web.Request) -> web.Response:
    """`POST /v1/chat/completions/{id}` with `{"metadata": {...}}`: the metadata replaced
    (the only change OpenAI allows); `null` clears it. The record is read once the body
    has come, and written back only if it is still held (a delete meanwhile stands), with
    its expiry kept."""
    tenant = _tenant(request)
    data, _ = await read_json(request, request.app[STATE].settings.server.max_body_bytes,
                              account(tenant))
    change = parse_model(_Update, data)
    record = await _record(request, tenant)
    # (screened as the create path's: the sanitizer's redact detectors, where it has any)
    screen = next((s for p in request.app[STATE].plugins
                   if (s := p.screen_aside()) is not None), None)
    record["completion"]["metadata"] = screened_values(dict(change.metadata or {}), screen)
    cid = record["completion"]["id"]
    if not await request.app[STORE].replace(tenant, cid, record, _summary_of(record)):
        raise _not_found(cid)
    return json_response(record["completion"], told_fallback(record))


async def delete(request: web.Request) -> web.Response:
    cid = request.match_info["completion_id"]
    if not await request.app[STORE].delete(_tenant(request), cid):
        raise _not_found(cid)
    return json_response({"object": "chat.completion.deleted", "id": cid, "deleted": True})


async def _lifespan(app: web.Application) -> AsyncIterator[None]:
    st = app[STATE]
    app[STORE] = make_store(st.settings.responses, cache_redis(st.plugins), kind="chat")
    try:
        yield
    finally:
        await app[STORE].close()


def setup(app: web.Application) -> None:
    """Routes and the store's lifespan (called from `proxy.routes.add_routes`)."""
    app.cleanup_ctx.append(_lifespan)
    path = "/v1/chat/completions/{completion_id}"
    app.router.add_get("/v1/chat/completions", list_completions, **ROUTE_OPTS)
    app.router.add_get(path, retrieve, **ROUTE_OPTS)
    app.router.add_post(path, update, **ROUTE_OPTS)
    app.router.add_delete(path, delete, **ROUTE_OPTS)
    app.router.add_get(path + "/messages", list_messages, **ROUTE_OPTS)

