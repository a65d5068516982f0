"""HTTP routes of the Responses API: create, retrieve, delete, list input items, cancel.

Create runs the SAME plugin chain as chat: the request becomes a chat request in a
chat `RequestContext` (so the sanitizer, rate limiter, cache, breaker and admission
all apply), and the chat Reply becomes a Response (whole) or typed events (stream).
Stored responses are scoped to the caller's tenant.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web
from multidict import MultiMapping

from ..app_state import ABORTED, INFO, REQUEST_ID, RESPONSE_HEADERS, STATE, AppState
from ..auth import Principal, account
from ..chain import Completion, Reply, Stream, enter_ahead, kept_fallback, told_fallback
from ..context import RequestContext, Screen, header_map
from ..errors import InvalidRequest, NotFound, RecordTooLarge, Unavailable
from ..ids import shown_id
from ..inflight import count_abort, counting_cuts, generating
from ..middleware import ROUTE_OPTS
from ..pagination import flag, one, page
from ..protocol import ChatCompletionRequest, not_among, parse_model, with_model_defaults
from ..record_store import RecordStore, RedisStore, cache_redis, make_store, too_large
from ..routes import (
    StreamTiming,
    check_model,
    json_response,
    logging_prompt,
    note_usage,
    open_generation,
    read_json,
)
from ..streaming import STREAM_ERROR, dumps, typed_sse, write_sse
from ..tasks import detach, read_in
from ..telemetry import error_fields, get_logger
from . import background_http
from . import translate as X
from .background import RUNNING, Runner, as_read, lapsed, leasing, settle
from .events import OUTPUT_DELTAS, Rendering, kept_said, saves_settled
from .models import RESPONSES_ENUMS, ResponsesRequest
from .replay import can_replay, replayed

log = get_logger("weir.responses")

STORE: web.AppKey[RecordStore] = web.AppKey("weir_responses_store", RecordStore)
RUNNER: web.AppKey[Runner] = web.AppKey("weir_responses_runner", Runner)
#: The least a closing store waits for the responses still being stored.
_SAVES_AT_CLOSE_S = 2.0
#: The calls of one save the close may find under way: its record replaced, then (not
#: stored) dropped.
_SAVE_CALLS = 2


def saves_bound_s(store: RecordStore) -> float:
    """How long a closing store waits for the saves under way (background runs' ends,
    streams' ends a drain cut): as long as a save's calls may take with it (each gives
    up past the store's `timeout_s`), at least `_SAVES_AT_CLOSE_S`. A fixed 2 s closed
    a store whose calls may take longer under a write that would have landed."""
    return max(_SAVES_AT_CLOSE_S, _SAVE_CALLS * store.timeout_s + 0.5)


#: What a closing store leaves of the shutdown's deadline (`AppState.shutdown_by`) to
#: what closes after its wait: its own client, the plugins, the embedder, the engine.
_AFTER_SAVES_S = 2.0


def saves_wait_s(store: RecordStore, shutdown_by: float | None, now: float) -> float:
    """`saves_bound_s`, within the shutdown's deadline (less `_AFTER_SAVES_S`): a store
    with a long `timeout_s` (`redis.write_timeout_s` of 5 s waits 10.5 s) and a frozen
    Redis held the close past the deadline, and the shutdown ended as one that hung (exit
    1) where it had only saves still waiting (each logged as not stored)."""
    bound = saves_bound_s(store)
    if shutdown_by is None:
        return bound
    return max(0.0, min(bound, shutdown_by - now - _AFTER_SAVES_S))


def _store(request: web.Request) -> RecordStore:
    return request.app[STORE]


#: (tenant, id) -> the write of a streaming response's `in_progress` record, while it
#: runs: the stream does not wait for it (a frozen Redis held `response.created` for the
#: store's timeout), what reads or deletes that response here does.
_HOLDING: dict[tuple[str, str], asyncio.Future[None]] = {}


async def _held(tenant: str, rid: str) -> None:
    """Once the `in_progress` write of `rid` started here has settled (bounded by the
    store's timeout): a GET right after `response.created` finds it, and a DELETE is not
    undone by it."""
    holding = _HOLDING.get((tenant, rid))
    if holding is not None:
        await asyncio.wait((holding,))


async def create(request: web.Request) -> web.StreamResponse:
    st, principal = open_generation(request, "responses")
    with generating(st, request):  # (its body too: a drain waits for what it admitted)
        return await _create(request, st, principal)


async def _create(request: web.Request, st: AppState,
                  principal: Principal) -> web.StreamResponse:
    data, size = await read_json(request, st.settings.server.max_body_bytes,
                                 account(principal.tenant))
    req = parse_model(ResponsesRequest, data)
    info = request[INFO]
    info.update(route="responses", tenant=principal.tenant, stream=req.stream)
    check_model(st, principal, req.model)
    info["model"] = req.model  # a metric label: only names the server serves
    store = _store(request)
    history: list[dict[str, Any]] = []
    cut: frozenset[str] = frozenset()  # (the previous response's cut calls)
    earlier_cut: frozenset[str] = frozenset()  # (those of the responses before it)
    earlier_held: frozenset[str] = frozenset()  # (the ids of their items: `X.held_before`)
    if req.previous_response_id:
        record = await _stored(store, principal.tenant, req.previous_response_id)
        if record is None:  # OpenAI's answer: a 400, with a code clients look for
            raise InvalidRequest(f"Previous response with id "
                                 f"'{shown_id(req.previous_response_id)}' not found.",
                                 param="previous_response_id",
                                 code="previous_response_not_found")
        if record["response"].get("status") in RUNNING:
            # Its output is not there yet: a turn on it would go on without its answer.
            raise InvalidRequest(f"Previous response with id "
                                 f"'{shown_id(req.previous_response_id)}' is still in "
                                 "progress; go on from it once it has completed.",
                                 param="previous_response_id", code="invalid_value")
        X.refuse_held_again(req, record)
        history = record["conversation"]
        cut, earlier_cut = X.cut_calls(record["response"]), X.cut_before(record)
        earlier_held = X.held_before(record)
    # (a background run is generated as a stream: its events are kept for its streams)
    chat_req, conversation = X.chat_request(
        req.model_copy(update={"stream": True}) if req.background else req, history, cut,
        earlier_cut)
    # What each of its records keeps of the calls cut before it (`X.cut_before`).
    cut_field = {"cut": sorted(cut | earlier_cut)} if cut | earlier_cut else {}
    # ... and the ids of its chain's items (an item of two turns ago sent again is a 400).
    if earlier_held:
        cut_field["held"] = sorted(earlier_held)
    chat_req = with_model_defaults(chat_req, st.terminal.sampling_defaults())
    ctx = RequestContext(route="chat", request=chat_req, principal=principal,
                         request_id=request[REQUEST_ID],
                         headers=header_map(request.headers.items()),
                         body_bytes=size, aside_chars=X.aside_chars(req),
                         aside_metadata=req.metadata or None)
    request[RESPONSE_HEADERS] = ctx.response_headers  # an error answer carries them
    if req.background:
        # (what the chain refuses from the request's head alone, refused now: a 400,
        # not a `queued` answer whose record ends `failed`)
        try:
            enter_ahead(st.plugins, ctx, deadline_s=st.settings.server.request_timeout_s)
        except InvalidRequest as e:
            raise X.rename_param(e, bool(req.instructions)) from None
    rid = X.new_id("resp")
    inputs = X.input_items(req) if req.store else []
    given = inputs  # (what the chain's screen reads; `inputs` is what is kept)
    # A background response's record is stored before the chain screened its request,
    # and kept if the chain refuses it: what it keeps of it (its input, the
    # conversation a follow-up goes on from), screened as the chain will from the start
    # (`input_items` lists it at once). (One the chain will refuse unread, past the
    # sanitizer's limits, was refused above: `refuse_ahead`.)
    screen = (next((s for p in st.plugins if (s := p.screen_aside()) is not None), None)
              if req.background else None)
    # A long request's kept texts are read where the sanitizer reads its prompt, in its
    # own thread (`screen_thread`), not on the event loop.
    thread = next((t for p in st.plugins if (t := p.screen_thread(ctx)) is not None), None)
    if screen is not None:
        inputs, conversation = await read_in(thread, _screened_ahead, req, history, inputs,
                                             conversation, screen)
    if req.store and store.max_bytes is not None:
        # What the record will hold before any output: past the tenant's whole bound, it
        # could never be stored (a 413 now, before tokens are spent on it).
        held = len(dumps([inputs, conversation, cut_field]))  # (as the store measures it)
        if held > store.max_bytes:
            raise too_large("responses", held, store.max_bytes)

    def kept(response: dict[str, Any], said: list[dict[str, Any]] | None = None,
             ) -> dict[str, Any]:
        """The record that keeps `response`: its input, the conversation a follow-up
        goes on from (`said`: with its output; else as it stands), the calls cut before
        it, the fallback that made it."""
        return kept_fallback({"response": response, "input": inputs,
                              "conversation": conversation if said is None else said,
                              **cut_field, **kept_said(response)}, ctx.response_headers)

    async def save(response: dict[str, Any], fence: str | None = None) -> None:
        """`fence`: a background run's (only over its own record: one settled without
        it, or deleted, is not overwritten by its end)."""
        if req.store:
            if holding is not None:  # the final record is put after the `in_progress` one
                await asyncio.wait((holding,))
            # A failed or cut response goes on from what it finished (`X.said`).
            said = X.said(response)
            # A breaker's fallback answered (a fixed text, another server, a stale
            # answer): kept as the client saw it (a follow-up goes on from what it was
            # told), and a GET says so as the create did.
            record = kept(response, conversation + X.output_messages(said))
            try:
                if held:  # (one deleted while it streamed is not brought back)
                    if not await store.replace(principal.tenant, rid, record, fence=fence):
                        log.info("response's end not stored: its record is gone, or was "
                                 "settled without its run", response_id=rid)
                else:
                    await store.put(principal.tenant, rid, record)
            except (Unavailable, RecordTooLarge) as e:
                # The answer was generated: it goes out (as chat's does), saying it was
                # not stored (`store: false`); retrieving it, or going on from it, finds
                # nothing. (Too large: its output took it past the tenant's bound.)
                response["store"] = False
                log.warning("response not stored", response_id=rid, reason=e.code)
                if held:  # its `in_progress` record would be found so until it expired
                    try:
                        await store.delete(principal.tenant, rid, fence=fence)
                    except Unavailable:  # (Redis down: it expires, as ever)
                        log.warning("response in progress not dropped", response_id=rid)

    held = req.background  # an `in_progress` (or `queued`) record was put, which `save`
    # replaces
    holding: asyncio.Future[None] | None = None  # its write, while it runs

    async def hold(response: dict[str, Any]) -> None:
        """A stream's response stored `in_progress` as its id goes out, as OpenAI keeps
        it while it generates: retrieved then, it is found (its output not yet there).
        Written beside the stream, which does not wait for it; `fresh`: a write that
        timed out may still land in Redis after the final record, which it must not
        overwrite."""
        nonlocal holding
        if not req.store:
            return

        async def put() -> None:
            nonlocal held
            try:
                # (its fallback decided before its first output: a GET while it streams
                # says so, as its end's record will)
                await store.put(principal.tenant, rid, kept(response), fresh=True)
                held = True
            except (Unavailable, RecordTooLarge) as e:  # (its end is stored, or not)
                log.warning("response in progress not stored", response_id=rid,
                            reason=e.code)

        key = (principal.tenant, rid)
        holding = _HOLDING[key] = detach(put())
        holding.add_done_callback(lambda _: _HOLDING.pop(key, None))

    async def chained() -> Reply:
        """The chain's answer; what it screened (the input, the caller's texts) is what
        is kept and echoed from then on."""
        nonlocal req, inputs, conversation
        try:
            with counting_cuts(st, info, ctx), logging_prompt(st, info, ctx):
                reply = await st.chain(ctx)
        except InvalidRequest as e:
            raise X.rename_param(e, bool(req.instructions)) from None
        try:
            req, inputs, conversation = await read_in(thread, _screened, ctx, req, history,
                                                      given, conversation)
        except BaseException as e:
            # (read in the sanitizer's thread: a wait, where the request may be cut, its
            # client gone; a stream the chain handed back is ended, its generation
            # stopped and what its plugins hold for it given back)
            if isinstance(reply, Stream):
                await reply.end_shielded(
                    "cancelled" if isinstance(e, asyncio.CancelledError) else "failed", e)
            raise
        return reply

    if req.background:
        return await background_http.start(
            request, st, request.app[RUNNER], store, principal.tenant, req, rid, screen,
            ctx, chained, save, lambda: req, kept, thread)
    reply = await chained()
    if isinstance(reply, Completion):
        note_usage(st, info, reply.body)  # token metrics, as on the chat route
        response = X.response_from_chat(req, reply.body, id=rid,
                                        created_at=reply.body.get("created", 0),
                                        order=reply.order)
        await save(response)
        return json_response(response, {**ctx.response_headers, **reply.headers})
    # Iterating the chat Stream ends it (its plugins' end hooks run); the events are
    # a Stream of their own for the SSE writer, whole when the chat stream is (a
    # cached answer replayed: its events go out in one write).
    rendering = Rendering(req, rid)
    events = Stream(rendering.events(reply, save, hold), whole=reply.whole)
    timing = StreamTiming(st, ctx, info)

    def event(ev: dict[str, Any]) -> None:
        if ev["type"] in OUTPUT_DELTAS:
            timing.output()

    srv = st.settings.server
    try:
        # The Responses stream has no `[DONE]`: `response.completed` (or `error`)
        # ends it.
        resp = await write_sse(
            request, events, lambda: {**ctx.response_headers, **reply.headers},
            write_timeout=srv.write_timeout_s, keepalive=srv.keepalive_s,
            on_first=timing.first, on_chunk=event,
            on_abort=lambda reason: count_abort(st, request, reason),
            log_error=lambda e: log.error("stream failed", **error_fields(e)),
            terminator=b"", frame=typed_sse,
            error_events=lambda err: b"".join(
                typed_sse(ev) for ev in rendering.failed(err)))
    finally:  # (a stream cut, its client gone, spent what it generated: counted)
        timing.flush()
        if reply.usage:
            note_usage(st, info, {"usage": reply.usage})
    if (rendering.error_status is not None and STREAM_ERROR not in request
            and not request.get(ABORTED)):
        # The failure went out as this API's events (`error`, `response.failed`), not
        # as the writer's own: counted as its status all the same (unless its client
        # left while they were written: a 499, counted as gone).
        request[STREAM_ERROR] = rendering.error_status
    return resp


def _screened(ctx: RequestContext, req: ResponsesRequest, history: list[dict[str, Any]],
              inputs: list[dict[str, Any]], conversation: list[dict[str, Any]],
              ) -> tuple[ResponsesRequest, list[dict[str, Any]], list[dict[str, Any]]]:
    """The request, its input items and conversation as the chain's sanitizer passed
    them on: kept and echoed so, its redactions not undone in the store (the cache's
    Redis) nor in `input_items`."""
    if ctx.screen is not None:
        assert isinstance(ctx.request, ChatCompletionRequest)
        inputs = _screened_inputs(req, history, inputs, ctx.screen)
        conversation = X.screened_conversation(req, ctx.request)
        req = X.screened_request(req, ctx.request)
    elif ctx.screen_aside is not None:  # (the prompt had nothing to redact)
        inputs = X.screened_reasoning(inputs, ctx.screen_aside)
    if ctx.screen_aside is not None:  # (in no prompt: the chain never read them; its
        # metadata, the sanitizer read once, for its blocks and as kept)
        req = X.screened_caller_text(req, ctx.screen_aside, ctx.aside_said)
    return req, inputs, conversation


def _screened_ahead(req: ResponsesRequest, history: list[dict[str, Any]],
                    inputs: list[dict[str, Any]], conversation: list[dict[str, Any]],
                    screen: Screen) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A background response's input items and conversation screened by `screen` before
    the chain ran, as the chain will screen them."""
    return (_screened_inputs(req, history, inputs, screen),
            X.screened_messages(conversation, [req.instructions or ""], screen, ["system"]))


def _screened_inputs(req: ResponsesRequest, history: list[dict[str, Any]],
                     inputs: list[dict[str, Any]], screen: Screen) -> list[dict[str, Any]]:
    """`req`'s input items screened by `screen` as the chain reads them: after its
    instructions and the history's texts, as one conversation."""
    before = [req.instructions or "", *X.history_texts(history)]
    speakers = ["system", *X.history_speakers(history)]
    return X.screened_items(req, inputs, before, screen, speakers)


async def _record(request: web.Request) -> tuple[str, dict[str, Any]]:
    """The caller's tenant and its stored record of the response the path names; another
    tenant's is not found, as a missing one is."""
    st = request.app[STATE]
    tenant = st.auth.authenticate(request.headers).tenant
    rid = request.match_info["response_id"]
    record = await _stored(_store(request), tenant, rid)
    if record is None:
        raise NotFound(f"Response with id '{shown_id(rid)}' not found.", param=None)
    return tenant, record


async def _stored(store: RecordStore, tenant: str, rid: str) -> dict[str, Any] | None:
    """The stored response `rid` of `tenant` (once its `in_progress` write started here
    has settled), or None where nothing of a stored response's shape is there."""
    await _held(tenant, rid)
    record = _readable(await store.get(tenant, rid))
    if record is None or not leasing(record):
        return record
    now = await store.now()  # (a lease is judged by the store's clock, not this one's)
    if (failed := lapsed(record, now)) is not None:
        # Its lease lapsed: stored `failed` as read (its run, if its replica was only
        # paused, then stores nothing over it, and stops), not read so and then found
        # `completed` by the next read.
        try:
            record = _readable(await settle(store, tenant, rid, record, failed))
        except Unavailable:
            log.warning("lapsed response not settled", response_id=rid)
    return None if record is None else as_read(record, now)


def _readable(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """`record` if it is a stored response's, else None (not found): what else sits under
    its key (another version's shape, a hand edit) was served as the response (`5`, `{}`)
    or, continued with `previous_response_id`, a 500."""
    if record is None:
        return None
    response, conversation = record.get("response"), record.get("conversation")
    ok = (isinstance(response, dict) and isinstance(response.get("id"), str)
          and response.get("object") == "response"
          and isinstance(conversation, list)
          and all(isinstance(m, dict) for m in conversation)
          and isinstance(record.get("input", []), list))
    if not ok:
        log.warning("stored response of another shape; not found")
    return record if ok else None


async def retrieve(request: web.Request) -> web.StreamResponse:
    """`GET /v1/responses/{id}`: the stored response; with `stream=true`, a background
    response's events past `starting_after` (on the replica that runs it), or, where
    they are not held, an ended one's record told as events (`replay`). `include` is
    refused: none of what it names is available."""
    tenant, record = await _record(request)  # (a key first, then the id, as every route)
    query = request.query
    _refuse_include(query)
    # Each as the spec types it, read strictly (`stream=yes` streamed, `stream=` did not),
    # whether or not it is used: `include_obfuscation` has nothing to turn off here.
    stream = flag(query, "stream")
    flag(query, "include_obfuscation")
    given = one(query, "starting_after")  # (empty: no integer, a 400 as `x` is)
    # (ASCII digits only: `int` also reads a sign, spaces, `_` and other scripts' digits;
    # -1 names no event, as one past the last names none: left out, all are streamed)
    after = -1 if given is None else int(given) if re.fullmatch(r"[0-9]{1,18}", given) else -2
    if after < -1:
        raise InvalidRequest("Invalid value for `starting_after`: a sequence number "
                             "(an integer, 0 or more) is expected.",
                             param="starting_after", code="invalid_value")
    if not stream:
        return json_response(record["response"], told_fallback(record))
    response = record["response"]
    if not response.get("background"):
        raise InvalidRequest(
            "Only a response created with `background: true` can be streamed again; "
            "retrieve this one without `stream`.", param="stream", code="invalid_value")
    run = request.app[RUNNER].find(tenant, response["id"])
    if (after == -1 and can_replay(response)
            and (run is None or (run.ended and run.held_from > 0))):
        # Its own events are gone (another replica ran it, or this one before a restart,
        # or they aged out), or its first ones are (past `max_event_bytes`): its
        # record, told as events.
        return await background_http.replay(request, replayed(response, record.get("said")),
                                            told_fallback(record))
    if run is None:
        raise InvalidRequest(
            "The events of this background response are not held here: they are kept "
            "in memory only by the server that runs it, and only for a while. Retrieve "
            "it without `stream`, or, once it has ended, stream it without "
            "`starting_after` (its events told again from its record).",
            param="stream", code="events_not_available")
    return await background_http.follow(request, run, after, told_fallback(record))


def _refuse_include(query: MultiMapping[str]) -> None:
    """The `include` of a GET (`include=` or `include[]=`, repeated): a value outside
    OpenAI's list (`IncludeEnum`) is an invalid value naming it; one of them is refused,
    none of what it names being available here (as create refuses it). Empty: none."""
    given = [v for k in ("include", "include[]") for v in query.getall(k, []) if v]
    for v in given:
        if v not in RESPONSES_ENUMS["include[]"]:
            raise not_among(v, RESPONSES_ENUMS["include[]"], "include")
    if given:
        raise InvalidRequest(
            "Unsupported parameter: `include`: none of the extra output it names is "
            "available here.", param="include", code="unsupported_parameter")


async def list_input_items(request: web.Request) -> web.Response:
    """`GET /v1/responses/{id}/input_items?limit=&order=&after=`: the request's input,
    newest first unless `order=asc`; `include` as the retrieve route takes it."""
    record = (await _record(request))[1]  # (a key first, then the id, as every route)
    _refuse_include(request.query)
    items = list(record.get("input") or [])
    return json_response(page(items, request.query, order="desc",
                              what="input item of this response"))


async def cancel(request: web.Request) -> web.Response:
    """`POST /v1/responses/{id}/cancel`: a background response still running ends
    `cancelled` (its engine request aborted); one cancelled already is answered as it
    is; any other is a 400, as OpenAI and vLLM answer. Sent to a replica that does not
    run it, a flag in the shared store asks the one that does (which reads it within
    `responses.background.poll_s`): the answer is its record once it has stored it
    `cancelled` (`_cancelled_elsewhere`). Record and answer agree."""
    tenant, record = await _record(request)
    response = record["response"]
    if not response.get("background"):
        raise InvalidRequest("Cannot cancel a synchronous response: only responses "
                             "created with `background: true` can be cancelled (a stream "
                             "is cut by closing its connection).", param=None,
                             code="invalid_request")
    status = response.get("status")
    if status == "cancelled":
        return json_response(response, told_fallback(record))
    if status not in RUNNING:
        article = "an" if str(status)[:1] in tuple("aeiou") else "a"
        raise InvalidRequest(f"Cannot cancel {article} {status} response.", param=None,
                             code="invalid_request")
    rid = response["id"]
    store, runner = _store(request), request.app[RUNNER]
    here = await runner.cancel(tenant, rid)
    # (it ran here: its record is stored; or it ended here since the record was read,
    # which a flag would not cancel)
    if here or runner.find(tenant, rid) is not None:
        now = await _stored(store, tenant, rid)
        if now is not None and now["response"].get("status") not in RUNNING:
            return json_response(now["response"], told_fallback(now))
        if here and now is None:  # deleted meanwhile: nothing stored, as a GET finds
            raise NotFound(f"Response with id '{shown_id(rid)}' not found.", param=None)
    if here:  # (its end was not stored: the store failed)
        return json_response({**response, "status": "cancelled"}, told_fallback(record))
    with runner.ending(tenant, rid) as told:  # (before the flag: its end may come at once)
        flagged = await runner.flag_cancel(tenant, rid)
        if flagged:
            ended = await _cancelled_elsewhere(store, runner, tenant, rid, record, told)
    if not flagged:  # runs nowhere (records in memory are this process's alone): marked so
        ended = _readable(await settle(store, tenant, rid, record,
                                       {**response, "status": "cancelled"}))
    if ended is None:  # (deleted meanwhile)
        raise NotFound(f"Response with id '{shown_id(rid)}' not found.", param=None)
    if leasing(ended):  # (settled by its run meanwhile, as read past its lease)
        ended = as_read(ended, await store.now())
    return json_response(ended["response"], told_fallback(ended))


async def _cancelled_elsewhere(store: RecordStore, runner: Runner, tenant: str, rid: str,
                               record: dict[str, Any], told: asyncio.Future[None],
                               ) -> dict[str, Any] | None:
    """The record of a response cancelled on a replica that does not run it (its flag
    left, and told): once the replica that runs it stored its end (`cancelled`, with the
    output it had; or its end, had it ended first), read as that replica tells it has
    (`told`), else every quarter `poll_s`; if it has not within two `poll_s` (that
    replica paused, or gone), stored `cancelled` here, fenced (`settle`: that run stores
    nothing over it, and stops). The answer was `cancelled` at once, its record
    `in_progress` until that replica read the flag. None: deleted."""
    poll_s = runner.cfg.poll_s
    loop = asyncio.get_running_loop()
    until = loop.time() + 2 * poll_s
    while (left := until - loop.time()) > 0:
        await asyncio.wait((told,), timeout=min(poll_s / 4, left))
        if told.done():  # (heard once: the reads after it wait their quarter again)
            told = loop.create_future()
        now = await _stored(store, tenant, rid)
        if now is None:
            return now
        if now["response"].get("status") not in RUNNING:
            # (its run ended, the flag left after its replica dropped it perhaps: of no
            # more use. A record settled without its run, that run stops at its next
            # write all the same; the one this cancel settles keeps its flag.)
            await runner.unflag(tenant, rid)
            return now
        record = now
    return _readable(await settle(store, tenant, rid, record,
                                  {**record["response"], "status": "cancelled"}))


async def delete(request: web.Request) -> web.Response:
    st = request.app[STATE]
    principal = st.auth.authenticate(request.headers)
    rid = request.match_info["response_id"]
    store, runner = _store(request), request.app[RUNNER]
    # A background run of it generates for nobody once it is deleted (its end is not
    # stored): cancelled here, or flagged for the replica that runs it, as a cancel is.
    elsewhere = False
    if runner.flags is not None and runner.find(principal.tenant, rid) is None:
        record = await _stored(store, principal.tenant, rid)
        elsewhere = (record is not None and bool(record["response"].get("background"))
                     and record["response"].get("status") in RUNNING)
    await _held(principal.tenant, rid)
    if not await store.delete(principal.tenant, rid):
        raise NotFound(f"Response with id '{shown_id(rid)}' not found.", param=None)
    if not await runner.cancel(principal.tenant, rid) and elsewhere:
        try:
            await runner.flag_cancel(principal.tenant, rid)
        except Unavailable:  # (it is deleted: its run's end is not stored, as ever)
            log.warning("deleted response's run not flagged", response_id=rid)
    return web.json_response({"id": rid, "object": "response", "deleted": True})


async def _store_lifespan(app: web.Application) -> AsyncIterator[None]:
    st = app[STATE]
    cfg = st.settings.responses
    store = app[STORE] = make_store(cfg, cache_redis(st.plugins))
    # Cancels sent to a replica that does not run the response, where records are shared.
    # A flag serves a run only while its lease holds: past it, the run's record is
    # settled (read `failed`, or `cancelled` by the cancel after two polls) or deleted,
    # and the run's next write, fenced, stops it. Kept twice the lease, not a day: one
    # left by a delete or a cancel racing one, for a run whose replica died, lingered.
    flags = (make_store(cfg.model_copy(update={"ttl_s": min(
                 cfg.ttl_s, 2 * cfg.background.lease_s)}),
                        cache_redis(st.plugins), kind="response_cancels")
             if isinstance(store, RedisStore) else None)
    app[RUNNER] = Runner(st, cfg.background, store, flags)
    app[RUNNER].listen()
    try:
        yield
    finally:
        # (one bound for both: the shutdown's own deadline is near)
        now = asyncio.get_running_loop().time()
        wait = saves_wait_s(store, st.shutdown_by, now)
        until = now + wait
        await app[RUNNER].close(wait)  # background runs still going: failed
        # ... and the ends a drain's cut stores (a stream's, failed, or decided before it)
        await saves_settled(max(0.0, until - asyncio.get_running_loop().time()))
        await store.close()
        if flags is not None:
            await flags.close()


async def not_served(request: web.Request) -> web.Response:
    """OpenAI's endpoints under `/v1/responses/` that Weir does not serve: unknown URLs, as
    every other (matched by `{response_id}`, they were a 405 for a response id)."""
    raise web.HTTPNotFound()


#: OpenAI's POST endpoints beside the responses' ids (counting tokens, compacting).
_NOT_SERVED = ("/v1/responses/input_tokens", "/v1/responses/compact")


def setup(app: web.Application) -> None:
    """Routes and the store's lifespan (called from `proxy.routes.add_routes`)."""
    app.cleanup_ctx.append(_store_lifespan)
    app.router.add_post("/v1/responses", create, **ROUTE_OPTS)
    for path in _NOT_SERVED:  # (before `{response_id}`, which would take them: to every
        # method, or those but POST had a 405 whose `Allow` named POST, GET and DELETE)
        app.router.add_route("*", path, not_served, **ROUTE_OPTS)
    app.router.add_get("/v1/responses/{response_id}", retrieve, **ROUTE_OPTS)
    app.router.add_delete("/v1/responses/{response_id}", delete, **ROUTE_OPTS)
    app.router.add_get("/v1/responses/{response_id}/input_items", list_input_items, **ROUTE_OPTS)
    app.router.add_post("/v1/responses/{response_id}/cancel", cancel, **ROUTE_OPTS)
