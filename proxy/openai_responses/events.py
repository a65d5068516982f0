"""A stream of chat chunks as the Responses API's typed events.

Order, as OpenAI sends it: `response.created`, `response.in_progress`; per output item
`response.output_item.added`, then for a message `response.content_part.added`,
`response.output_text.delta`... `response.output_text.done`,
`response.content_part.done`, or for a function call
`response.function_call_arguments.delta`... `.done`; `response.output_item.done` (text
sent while a call is under way is held until the call ends: a parser may send the call's
last arguments after it); and
last `response.completed` (or `response.incomplete` when cut at the token limit). Every
event carries a `sequence_number`, counting from 0.

The first chat chunk is awaited before `response.created` goes out, so an error before
any output (a 429, an engine refusal) still gets its HTTP status. An error after that
goes out in-band as an `error` event, then `response.failed`.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from ..errors import ServerError, WeirError
from ..tasks import detach
from ..telemetry import error_fields, get_logger
from . import translate as X
from .models import ResponsesRequest

log = get_logger("weir.responses")

OnDone = Callable[[dict[str, Any]], Awaitable[None]]
T = TypeVar("T")

#: The message of a response whose end could not be stored for a fault of the server's.
NOT_STORED = "The server had an error storing this response; create it again."


class Failed(dict[str, Any]):
    """A failed Response, with what its `error` event said (`said`: the error's own
    `code` and `param`, which the Response's `error` cannot hold: its codes are a closed
    list, an engine's failure there `server_error`). Its record keeps them (`kept_said`),
    so that its events told again from it say what the run's said."""

    def __init__(self, response: dict[str, Any], said: dict[str, Any]) -> None:
        super().__init__(response)
        self.said = said


def kept_said(response: dict[str, Any]) -> dict[str, Any]:
    """What a record of `response` keeps of its `error` event (`Failed`): `{"said":
    {"code", "param"}}`, or nothing (it did not fail so: its replay says its `error`)."""
    return {"said": response.said} if isinstance(response, Failed) else {}


class _Events:
    """Builds events in order, numbering them."""

    def __init__(self, req: ResponsesRequest, response_id: str) -> None:
        self.req, self.id, self.created = req, response_id, int(time.time())
        self.seq = 0
        self.announced = False  # the response's id went out (`response.created`)
        #: A background run's: `response.created` went out `queued`, before any output.
        self.queued = False
        #: The store of a response cut short, from a task of its own (`_keep_detached`).
        self.saving: asyncio.Future[Any] | None = None
        self.output: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None  # the item being streamed
        self.open_text: list[str] = []  # the open message's text so far
        #: Text sent while a call was open, held until that call ends (`release`).
        self.held: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}  # chat tool-call index -> item
        self.usage: dict[str, Any] | None = None
        self.reason: str | None = None
        self.texts = False  # the answer is text (its content is a string, maybe empty)
        self.finished = False  # a terminal event went out
        #: The events of an end decided but not yet handed to the writer (a failure's;
        #: a whole answer's terminal event, while its record is stored): a cut
        #: meanwhile (a shutdown, a cancel, the client gone) ends the stream and its
        #: record with these, not with a cut of its own.
        self.ending: list[dict[str, Any]] = []
        #: The status of the error the stream's own failure went out as (its head said
        #: 200): what the access log and the request metrics count it as.
        self.error_status: int | None = None
        #: The `.done` events of the item a cut left open (`_cut`): a background run's
        #: streams end with them, cancelled or cut by a shutdown (`Rendering.cancelled_as`,
        #: `Rendering.failed_as`).
        self.cut_events: list[dict[str, Any]] = []

    def ev(self, type_: str, **fields: Any) -> dict[str, Any]:
        return {"type": type_, "sequence_number": None, **fields}

    def number(self, e: dict[str, Any]) -> dict[str, Any]:
        e["sequence_number"] = self.seq
        self.seq += 1
        if e["type"] in TERMINAL:
            self.finished = True
        return e

    def response(self, status: str, error: dict[str, Any] | None = None) -> dict[str, Any]:
        return X.response_object(self.req, id=self.id, created_at=self.created, status=status,
                                 output=copy.deepcopy(self.output), usage_=X.usage(self.usage),
                                 error=error)

    # ------------------------------------------------------------------- items

    def _add(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        out = self.close()
        self.output.append(item)
        self.open = item
        out.append(self.ev("response.output_item.added", output_index=len(self.output) - 1,
                           item=copy.deepcopy(item)))
        return out

    def text(self, delta: str) -> list[dict[str, Any]]:
        if self.open is not None and self.open["type"] == "function_call":
            # A parser may send text while a call is under way, and the call's last
            # arguments after it: the call is not done until the next call or the end.
            self.held.append(delta)
            return []
        return self._text(delta)

    def release(self) -> list[dict[str, Any]]:
        """The text held while the open call went on, as the message after it (the call
        closes first: its arguments are whole)."""
        if not self.held:
            return []
        text, self.held = "".join(self.held), []
        return [*self.close(), *self._text(text)]

    def _text(self, delta: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self.open is None or self.open["type"] != "message":
            out += self._add(X.message_item("", "in_progress"))
            out.append(self.ev("response.content_part.added", item_id=self.open_id,
                               output_index=self.index, content_index=0,
                               part=X.text_part("")))
            self.open_text = []
        if not delta:  # (an empty answer: its message, and no delta)
            return out
        self.open_text.append(delta)
        out.append(self.ev("response.output_text.delta", item_id=self.open_id,
                           output_index=self.index, content_index=0, delta=delta, logprobs=[]))
        return out

    def call(self, d: dict[str, Any]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        fn = d.get("function") or {}
        item = self.calls.get(d["index"])
        if item is None:
            item = X.call_item(d.get("id") or X.new_id("call"), fn.get("name") or "", "",
                               "in_progress")
            self.calls[d["index"]] = item
            out += self.release()
            out += self._add(item)
        elif fn.get("name"):
            item["name"] += fn["name"]
        if fn.get("arguments"):
            item["arguments"] += fn["arguments"]
            out.append(self.ev("response.function_call_arguments.delta", item_id=item["id"],
                               output_index=self.output.index(item), delta=fn["arguments"]))
        return out

    @property
    def open_id(self) -> str:
        assert self.open is not None
        return str(self.open["id"])

    @property
    def index(self) -> int:
        return len(self.output) - 1

    def close(self) -> list[dict[str, Any]]:
        """Finish the open item: its `.done` events."""
        item, self.open = self.open, None
        if item is None:
            return []
        status = "incomplete" if self.reason in ("length", "failed", "cut") else "completed"
        idx = self.output.index(item)
        out = []
        failed = self.reason in ("failed", "cut")
        if item["type"] == "message":
            text = "".join(self.open_text)
            part = X.text_part(text)
            if not failed:  # (a text's `.done` is the whole text: SDKs parse it as such)
                out.append(self.ev("response.output_text.done", item_id=item["id"],
                                   output_index=idx, content_index=0, text=text,
                                   logprobs=[]))
                out.append(self.ev("response.content_part.done", item_id=item["id"],
                                   output_index=idx, content_index=0, part=part))
            item["content"] = [part]
        elif not failed:
            out.append(self.ev("response.function_call_arguments.done", item_id=item["id"],
                               output_index=idx, name=item["name"],
                               arguments=item["arguments"]))
        item["status"] = status
        out.append(self.ev("response.output_item.done", output_index=idx,
                           item=copy.deepcopy(item)))
        return out

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        out: list[dict[str, Any]] = []
        for c in chunk.get("choices") or []:
            if c.get("index", 0) != 0:
                continue
            delta = c.get("delta") or {}
            self.texts = self.texts or isinstance(delta.get("content"), str)
            if delta.get("content"):
                out += self.text(delta["content"])
            for d in delta.get("tool_calls") or []:
                out += self.call(d)
            if c.get("finish_reason"):
                out += self.release()  # (before the reason: the call ended, uncut)
                self.reason = c["finish_reason"]
        return out


TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})

#: The events that carry output as it is generated (a stream's inter-token gaps).
OUTPUT_DELTAS = frozenset({"response.output_text.delta",
                           "response.function_call_arguments.delta"})


class Rendering:
    """A Response's events from chat chunks (`events`), and the events that end it with
    an error wherever it stands (`failed`: a stream cut by a shutdown, in the writer)."""

    def __init__(self, req: ResponsesRequest, response_id: str) -> None:
        self._e = _Events(req, response_id)
        self._on_done: OnDone | None = None

    def queued(self) -> list[dict[str, Any]]:
        """A background run's first events, sent before it has any output:
        `response.created` and `response.queued`, the response `queued` (its events from
        the chain then begin with `response.in_progress`)."""
        e = self._e
        e.queued = e.announced = True
        return [e.number(e.ev("response.created", response=e.response("queued"))),
                e.number(e.ev("response.queued", response=e.response("queued")))]

    def use(self, req: ResponsesRequest) -> None:
        """Echo `req` from now on (a background run's, as the chain screened it)."""
        self._e.req = req

    def response(self, status: str) -> dict[str, Any]:
        """The response as it stands, with `status`."""
        return self._e.response(status)

    @property
    def finished(self) -> bool:
        """Its terminal event went out (completed, incomplete or failed)."""
        return self._e.finished

    @property
    def saving(self) -> asyncio.Future[Any] | None:
        """The store of the response cut short (its stream closed before its end), under
        way in a task of its own; None: none was cut."""
        return self._e.saving

    async def fail(self, err: WeirError, on_done: OnDone) -> list[dict[str, Any]]:
        """A background run's failure before any output (the chain refused it: a 429, a
        400 of the sanitizer): its events, once the failed response is stored (cut
        meanwhile, they are `owed`)."""
        self._e.ending = _failed(self._e, err)
        await _keeping(self._e, on_done, self._e.ending[-1]["response"])
        return self.owed()

    def cut(self) -> dict[str, Any]:
        """The response as a cut ends it: its own end where that was decided (a failure,
        a whole answer; its events not all gone out: `owed`), else cut short as it
        stands (`cancelled`), its open item `incomplete`."""
        return _ending(self._e)

    def owed(self) -> list[dict[str, Any]]:
        """The events of an end decided but not gone out: the stream's own failure, or
        its whole answer's terminal event, cut while its record was stored (they were
        lost to a background run's streams, which ended with no terminal event, or with
        a cut's). Once."""
        e = self._e
        if e.finished or not e.ending:
            return []
        events, e.ending = [e.number(ev) for ev in e.ending], []
        return events

    def failed_as(self, response: dict[str, Any]) -> list[dict[str, Any]]:
        """The events that end a stream with `response`, failed as it is stored (a
        background run cut by the shutdown): the item it cut `incomplete` (its
        `output_item.done`, as a stream's own failure closes it), `error`, then
        `response.failed`."""
        e, error = self._e, response["error"]
        if e.finished:
            return []
        events, e.cut_events = e.cut_events, []
        return [*(e.number(ev) for ev in events),
                e.number(e.ev("error", code=error["code"], message=error["message"],
                              param=None)),
                e.number(e.ev("response.failed", response=copy.deepcopy(response)))]

    def cancelled_as(self, response: dict[str, Any]) -> list[dict[str, Any]]:
        """The events that end a stream with `response`, cancelled as it is stored (a
        background run cancelled): the item it cut `incomplete`, then
        `response.incomplete` with the response `cancelled`. OpenAI's stream events have
        no `response.cancelled` (that is a webhook's); without these the stream just
        stopped, its item never done, as a broken connection does."""
        e = self._e
        if e.finished:
            return []
        events, e.cut_events = e.cut_events, []
        return [e.number(ev) for ev in events] + [
            e.number(e.ev("response.incomplete", response=copy.deepcopy(response)))]

    def events(self, chunks: AsyncIterable[dict[str, Any]], on_done: OnDone,
               on_start: OnDone | None = None) -> AsyncIterator[dict[str, Any]]:
        """`on_start(response)` before `response.created` goes out (the response
        `in_progress`: its id is the client's from then on); `on_done(response)` once it
        ended: completed, incomplete or failed (OpenAI keeps a failed response too, with
        what went out before the failure)."""
        self._on_done = on_done
        return _render(self._e, chunks, on_done, on_start)

    @property
    def error_status(self) -> int | None:
        """The status of the failure the stream ended with (None: it did not fail)."""
        return self._e.error_status

    def failed(self, err: WeirError) -> list[dict[str, Any]]:
        e = self._e
        if e.finished:
            return []
        decided = bool(e.ending)
        if decided:  # the stream's own end under way: its events not yet sent
            events, e.ending = [e.number(ev) for ev in e.ending], []
        else:
            events = [e.number(ev) for ev in _failed(e, err)]
        # (the writer's own failure: it cannot wait; not stored again where that end
        # is being stored already, and stored after a cut's write under way, the
        # stream's close storing it `cancelled`: both at once, the record could end
        # `cancelled`, its stream told `failed`)
        if self._on_done is not None and not (decided and e.saving is not None):
            e.saving = _keep_detached(self._on_done, events[-1]["response"], e.saving)
        return events


#: Failed responses being stored from a task of their own (a drain's cut): the store
#: waits for them before it closes (`saves_settled`).
_SAVES: set[asyncio.Future[Any]] = set()


async def saves_settled(timeout: float) -> None:
    """Wait, at most `timeout` seconds, for the failed responses still being stored."""
    if _SAVES:
        await asyncio.wait(set(_SAVES), timeout=timeout)


def _keep_detached(on_done: OnDone, response: dict[str, Any],
                   after: asyncio.Future[Any] | None = None) -> asyncio.Future[None]:
    """`on_done(response)` in a task of its own (from where nothing can wait for it: a
    writer's failure, a stream being closed), once `after` (an earlier write of the same
    record) has ended; the store waits for it before it closes."""
    return _saves(detach(_kept(on_done, response, after)))


def _saves(save: asyncio.Future[T]) -> asyncio.Future[T]:
    """`save`, a record's write, waited for by the store before it closes."""
    _SAVES.add(save)
    save.add_done_callback(_SAVES.discard)
    return save


async def _outcome(on_done: OnDone, response: dict[str, Any]) -> Exception | None:
    """`on_done(response)`: the exception it raised, if any (for whoever waits for it,
    from a task a cut does not cancel)."""
    try:
        await on_done(response)
    except Exception as exc:
        return exc
    return None


async def _kept(on_done: OnDone, response: dict[str, Any],
                after: asyncio.Future[Any] | None = None) -> None:
    """`on_done` for a failed response (once `after` has ended): a store that fails too
    is logged, and the failure that goes out stays the request's own."""
    if after is not None:
        await asyncio.wait((after,))
    try:
        await on_done(response)
    except Exception as exc:
        log.warning("failed response not stored", error=type(exc).__name__)


async def _render(e: _Events, chunks: AsyncIterable[dict[str, Any]], on_done: OnDone,
                  on_start: OnDone | None = None) -> AsyncIterator[dict[str, Any]]:
    it = aiter(chunks)
    started = False  # its first output came (errors before it are the caller's)
    try:
        first = await anext(it, None)  # errors before any output keep their HTTP status
        e.announced = started = True
        if on_start is not None:  # (it starts a write it need not wait for: its end's
            await on_start(e.response("in_progress"))  # record is put after it)
        if not e.queued:  # (a background run's went out `queued`)
            yield e.number(e.ev("response.created", response=e.response("in_progress")))
        yield e.number(e.ev("response.in_progress", response=e.response("in_progress")))
        try:
            chunk = first
            while chunk is not None:
                for event in e.feed(chunk):
                    yield e.number(event)
                chunk = await anext(it, None)
        except WeirError as err:
            failure = _failed(e, err)
        except Exception as exc:  # a bug: logged, and a generic failure in-band
            log.error("responses stream failed", **error_fields(exc))
            failure = _failed(e, ServerError())
        else:
            failure = []
        if failure:
            async for event in _failing(e, failure, on_done):
                yield event
            return
        if not e.output and e.texts:  # an empty answer is an empty message, as a whole one
            for event in e.text(""):
                yield e.number(event)
        for event in [*e.release(), *e.close()]:  # (text held behind a call: no reason came)
            yield e.number(event)
        status = "incomplete" if e.reason == "length" else "completed"
        final = e.response(status)
        # Decided: cut while its record is stored, it ends so (`_ending`), not as a
        # cut (a drain stored a whole answer `failed`, a cancel `cancelled`).
        e.ending = [e.ev(f"response.{status}", response=final)]
        # In a task of its own, which a cut (a drain, a cancel) waits for rather than
        # cancels: cut, its write was cancelled (landed or not) and started again from
        # scratch as the store closed.
        storing = _saves(detach(_outcome(on_done, final)))
        try:
            unkept = await asyncio.shield(storing)
        except asyncio.CancelledError:
            e.saving = _saves(detach(_settled(e, storing, on_done)))
            raise
        if unkept is not None:
            # Not the store's outage or the record's size (`on_done` answers those: the
            # answer goes out, not stored): a bug, or a store failing as none should.
            # Its streams and its record end `failed`, a generic server error: a
            # background run's followers got no terminal event, a stream was told the
            # end never kept, and the record stayed `in_progress`.
            log.error("response's end not stored", **error_fields(unkept))
            async for event in _failing(e, _failed(e, ServerError(NOT_STORED)), on_done):
                yield event
            return
        yield e.number(e.ending.pop())
    finally:
        if started and not e.finished and e.saving is None:
            # Cut short (the client left): its id went out with `response.created`, so
            # it is kept as it stood, and a client can retrieve it or go on from it.
            e.saving = _keep_detached(on_done, _ending(e))
        close = getattr(it, "aclose", None)
        if close is not None:
            await close()


async def _settled(e: _Events, storing: asyncio.Future[Exception | None],
                   on_done: OnDone) -> None:
    """A whole answer's end, whose write a cut (a drain, a cancel, its client gone) waits
    for: where storing it raised (a bug), it ends `failed` as it does uncut (`_render`):
    its record (else `in_progress`: a run's until its lease lapsed, a stream's until it
    expired), and the events not yet out (a background run's streams, `owed`; a stream
    the writer ended already was told its end, which it cannot take back)."""
    unkept = await storing
    if unkept is None:
        return
    log.error("response's end not stored", **error_fields(unkept))
    failure = _failed(e, ServerError(NOT_STORED))
    if not e.finished:
        e.ending = failure
    await _kept(on_done, failure[-1]["response"])


async def _failing(e: _Events, failure: list[dict[str, Any]],
                   on_done: OnDone) -> AsyncIterator[dict[str, Any]]:
    """A stream's own failure's events (`_failed`), its failed response kept before its
    terminal event goes out, as a completed one is."""
    e.ending = failure
    while e.ending:
        if len(e.ending) == 1:
            await _keeping(e, on_done, e.ending[0]["response"])
        yield e.number(e.ending.pop(0))


async def _keeping(e: _Events, on_done: OnDone, response: dict[str, Any]) -> None:
    """A failed response kept (`_kept`) in a task of its own, which a cut (a drain, a
    cancel) waits for rather than cancels (`saving`): cut, its write was cancelled,
    landed or not, and started again from scratch (the stream's close, a run's cut)."""
    save = _keep_detached(on_done, response)
    try:
        await asyncio.shield(save)
    except asyncio.CancelledError:
        e.saving = save
        raise


def _ending(e: _Events) -> dict[str, Any]:
    """The response a stream cut short ends as: its own end where one was decided
    (`ending`: a failure, a whole answer; its events not all gone out), else `_cut`."""
    return e.ending[-1]["response"] if e.ending else _cut(e)


def _cut(e: _Events) -> dict[str, Any]:
    """A response whose stream was cut short, as it stood: the item under way ends
    `incomplete` with what it holds, the response `cancelled`."""
    e.reason = "cut"
    e.cut_events = e.close()  # (only a background run's streams carry them)
    return e.response("cancelled")


def _failed(e: _Events, err: WeirError) -> list[dict[str, Any]]:
    """The item under way ends `incomplete` with what it holds (`output_item.done` only:
    the text's and arguments' `.done` events say they are whole, and SDKs parse them),
    then the error and the failed response, which keeps the output that went out."""
    body = err.to_body()["error"]
    e.reason = "failed"
    e.error_status = err.status
    said = {"code": body["code"], "param": body["param"]}
    return [*e.close(), e.ev("error", **said, message=body["message"]),
            e.ev("response.failed", response=Failed(e.response(
                "failed", error={"code": error_code(err), "message": body["message"]}),
                said))]


def error_code(err: WeirError) -> str:
    """The code of a failed Response's `error` (OpenAI's `ResponseErrorCode`, a closed
    list) for `err`: a refusal of the request itself (a 400: its prompt past the
    model's context, the sanitizer's refusal; a 413) is `invalid_prompt`, as the HTTP
    error the request would have been answered without `background`; a 429
    `rate_limit_exceeded`; anything else `server_error`."""
    if err.status == 429:
        return "rate_limit_exceeded"
    return "invalid_prompt" if err.status in (400, 413) else "server_error"
