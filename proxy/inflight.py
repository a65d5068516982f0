"""A generation request under way: tracked for the drain, its client's abort counted
once, and answered 503 if a drain ends before its response began.

Every generation route (chat, completions, the Responses API, embeddings) runs inside
`generating`; the stream writer reports a client it saw go with `count_abort`; each
route notes the tokens its answer spent with `note_usage`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any

from aiohttp import web

from .app_state import ABORTED, AppState
from .context import RequestContext
from .errors import Unavailable
from .streaming import ANSWERED, PREPARED, WRITE_TIMED_OUT, cut_by_shutdown
from .telemetry import get_logger, labelled

log = get_logger("weir.routes")


def refuse_if_draining(st: AppState) -> None:
    """A new generation while the server drains: a 503 that sends the client elsewhere
    (the balancer is dropping this replica)."""
    if st.draining:
        raise Unavailable("The server is shutting down; retry on another replica.",
                          code="shutting_down")


@contextmanager
def generating(st: AppState, request: web.Request) -> Iterator[None]:
    """A generation under way: tracked for the drain, and counted if its client leaves.

    Cut at the end of a drain (`AppState.abort_all`) before its response began (waiting
    for the engine, or queued for a slot), it is answered 503 `shutting_down`, as a
    request arriving during the drain is; a stream already begun is cut in-band by the
    stream writer."""
    with st.track(request):
        try:
            yield
        except asyncio.CancelledError as e:
            if not cut_by_shutdown(request, e):  # the client went away (aiohttp cancels it)
                if not request.get(ANSWERED):  # (not after reading its whole answer)
                    _count_abort(st, request)
                raise
            if request.get(PREPARED):
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()  # answered after all: the response below still goes out
            raise Unavailable("The server shut down before this request was answered; "
                              "retry on another replica.", code="shutting_down") from None


def count_abort(st: AppState, request: web.Request, reason: str) -> None:
    """A stream cut because its client stopped reading or went away."""
    if _count_abort(st, request):
        log.warning("stream cut: client stopped reading or went away", reason=reason)


def _count_abort(st: AppState, request: web.Request) -> bool:
    """Count the request as aborted by its client, once (the stream writer sees a client
    go, then aiohttp's handler cancellation reaches `generating`): whether it was new.
    The reason is `write_timeout` where the writer cut a client that stopped reading
    (whichever of the two sees it first), else `client_gone`."""
    if request.get(ABORTED):
        return False
    request[ABORTED] = True
    reason = "write_timeout" if request.get(WRITE_TIMED_OUT) else "client_gone"
    labelled(st.metrics.aborted, reason).inc()
    return True


class AroundChain:
    """A context manager around a chain call, given the app's state, the access-log
    line's fields and the request's context: its `__exit__` does its work, and
    suppresses nothing. (A class, not a generator's context manager: half the cost, on
    every request.)"""

    __slots__ = ("_ctx", "_info", "_st")

    def __init__(self, st: AppState, info: dict[str, Any], ctx: RequestContext) -> None:
        self._st, self._info, self._ctx = st, info, ctx

    def __enter__(self) -> None:
        return None


class counting_cuts(AroundChain):  # (lower case: used as the function it was)
    """Around a whole answer's generation: one cut before it came back (its client gone,
    its deadline) spent what the engine read and generated (`ctx.usage_so_far`, which
    the rate limiter charges): counted as a cut stream's tokens are (they were not)."""

    __slots__ = ()

    def __exit__(self, kind: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        if kind is not None and self._ctx.usage_so_far:
            note_usage(self._st, self._info, {"usage": self._ctx.usage_so_far})


def note_usage(st: AppState, info: dict[str, Any], body: dict[str, Any]) -> None:
    """An answer's usage (its `usage` object): on its access-log line and in
    `weir_tokens_total`. A count it lacks (an upstream that sent none) is not known:
    left off the line (the access log drops a field without a value), nothing added
    to the counter."""
    u = body.get("usage") or {}
    info.update(prompt_tokens=u.get("prompt_tokens"), completion_tokens=u.get("completion_tokens"))
    model = info.get("model", "")
    for kind in ("prompt", "completion"):
        if type(n := u.get(f"{kind}_tokens")) is int:
            labelled(st.metrics.tokens, model, kind).inc(n)
