"""Stopping background tasks.

A cancellation can be lost. On Python 3.11, `asyncio.wait_for` returns the result of
the operation it waits on, instead of raising, when that operation finishes just as the
cancellation arrives; redis-py sends every command through `wait_for` (its socket
timeout). A loop that lost its cancellation runs on, and whoever waits for it to end
waits forever: a replica's Redis listener kept a shutdown (and a CI run) waiting that
way, one close in about a hundred. So a task is cancelled again until it has ended
(`cancel_and_wait`), and a call that may lose one raises it again (`lost_cancellation`):
a request whose client left during a Redis command would otherwise run on, and
generate, for nobody. A call that must end within a time runs as a task of its own
that is cancelled and left, not waited for, when the time is up (`abandon_after`): a timeout's
own cancellation can be lost the same way.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterator
from concurrent.futures import Executor
from contextlib import contextmanager
from typing import Any, TypeVar

from .telemetry import get_logger

log = get_logger(__name__)
T = TypeVar("T")

#: A request with this many characters or more to read is read in a thread, not on the
#: event loop, where the work grows with its text: its prompt rendered and tokenized
#: (`proxy.serving`: 262,144 characters took ~0.3 s to tokenize), its texts read by the
#: sanitizer's detectors (~30 ms over 64 KB of prose); either held every other request's
#: stream that long. Shorter ones, nearly all, stay on the loop: the hop costs more than
#: they do.
OFF_LOOP_CHARS = 16_384


async def read_in(thread: Executor | None, work: Callable[..., T], *args: Any) -> T:
    """`work(*args)`, in `thread` where one is given (a long request's texts, read where
    the sanitizer reads its prompt: `Plugin.screen_thread`), else here on the loop."""
    if thread is None:
        return work(*args)
    return await asyncio.get_running_loop().run_in_executor(thread, work, *args)

#: How long the first cancellation gets before it is repeated; each repeat waits twice
#: as long as the one before, up to `RECANCEL_MAX_S`, so a task that cleans up on its
#: way out (an abort sent to the engine, a connection closed) is not cut short by a
#: repeat unless that cleanup is slow.
RECANCEL_S = 0.1
RECANCEL_MAX_S = 2.0


async def cancel_and_wait(*tasks: asyncio.Future[Any] | None) -> None:
    """Cancel `tasks` (None is skipped) and return once each has ended. What a task
    raised on its way out is retrieved and dropped, as `gather(return_exceptions=True)`
    would. If the caller is cancelled meanwhile, it still waits for the tasks to end
    (as a cancelled `gather` does), then raises the cancellation."""
    given = [t for t in tasks if t is not None]
    pending = {t for t in given if not t.done()}
    wait, interrupted = RECANCEL_S, False
    repeats = 0
    while pending:
        for t in pending:
            t.cancel()
        try:
            _, pending = await asyncio.wait(pending, timeout=wait)
        except asyncio.CancelledError:
            interrupted = True
            pending = {t for t in pending if not t.done()}
            continue
        if pending:
            repeats += 1
            wait = min(wait * 2, RECANCEL_MAX_S)
    if repeats:
        log.debug("cancelled again: a task ran on after its cancellation", repeats=repeats)
    for t in given:
        if not t.cancelled():
            t.exception()
    if interrupted:
        raise asyncio.CancelledError


#: Tasks left to finish on their own (the event loop keeps only weak references).
_DETACHED: set[asyncio.Future[Any]] = set()


def background(work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """A task of the process's own (a probe, a renewal, a reaper), started by whichever
    request came upon the need: run in an empty context, not that request's, so its log
    lines carry no request's id and its spans join no request's trace (the request may
    have ended long before)."""
    return asyncio.get_running_loop().create_task(work, context=contextvars.Context())


def detach(work: Awaitable[T]) -> asyncio.Future[T]:
    """Run `work` (a coroutine or future) to its end as a task of its own, referenced
    until it ends: what a cancelled caller leaves to finish (an end hook, a discard)."""
    task = asyncio.ensure_future(work)
    _DETACHED.add(task)
    task.add_done_callback(_DETACHED.discard)
    return task


def run_now(work: Coroutine[Any, Any, Any]) -> Awaitable[None] | None:
    """Run `work`, a coroutine that does not pause (the in-memory rate limiter's
    settling: async for its interface's sake, with nothing to wait on), to its end here,
    with no task and no await; None once it has. Should it pause after all, what is left
    of it comes back, to be awaited (its caller's caller hands it to a task: a stream's
    end hooks)."""
    try:
        waiting = work.send(None)
    except StopIteration:
        return None
    return _Resumed(work, waiting)


class _Resumed:
    """The rest of a coroutine that paused on `waiting` outside any task: awaiting this
    waits on `waiting`, then runs the coroutine on to its end (what is thrown in, a
    cancellation, goes to it)."""

    __slots__ = ("_waiting", "_work")

    def __init__(self, work: Coroutine[Any, Any, Any], waiting: Any) -> None:
        self._work, self._waiting = work, waiting

    def __await__(self) -> Generator[Any, Any, None]:
        work, waiting = self._work, self._waiting
        while True:
            try:
                sent = yield waiting
            except GeneratorExit:
                work.close()
                raise
            except BaseException as e:
                try:
                    waiting = work.throw(e)
                except StopIteration:
                    return
            else:
                try:
                    waiting = work.send(sent)
                except StopIteration:
                    return


@contextmanager
def lost_cancellation() -> Iterator[None]:
    """Around a call that may lose a cancellation: if the task was cancelled during the
    call and the call returned all the same, raise the cancellation here. (A timeout
    inside the call that fired takes its own cancellation back, so it does not count.)"""
    task = asyncio.current_task()
    before = task.cancelling() if task is not None else 0
    yield
    if task is not None and task.cancelling() > before:
        raise asyncio.CancelledError


#: The slices a call's time is waited in (`abandon_after`). Time is the clock's, but the
#: call is run by the event loop: a loop too busy to run it (a long synchronous step, a
#: GC pause, a queue of ready callbacks) held back a reply its store sent in time, and a
#: 50 ms Redis call timed out under ordinary load on two cores (the rate limiter fell
#: back to its local limiter, the cache missed). Waited in slices, each timed from when
#: the loop ran it, the time a slice's timer fired late (the loop's lag) is added to the
#: call's, not taken from it: on an idle loop the call times out after `timeout_s`, on a
#: busy one once it has had at least `timeout_s` and as many turns of the loop as there
#: are slices (a Redis call takes about three). Bounded: `timeout_s` plus the slices' lag.
TIME_SLICES = 4


async def abandon_after(work: Awaitable[T], timeout_s: float) -> T:
    """`work`'s result if it ends within `timeout_s` and `TIME_SLICES` turns of the loop
    (`TIME_SLICES`), else TimeoutError then. It runs as a task of its own,
    cancelled and left to end on its own (`detach`) when the time is up or the caller
    is cancelled. An `asyncio.timeout` around a Redis command waited for the command to
    take its cancellation: one that lost it (redis-py opening a connection to a frozen
    Redis, under load) ran on to its socket timeout, 4 s where 50 ms was asked."""
    task = detach(work)
    try:
        for _ in range(TIME_SLICES):
            await asyncio.wait((task,), timeout=timeout_s / TIME_SLICES)
            if task.done():
                return task.result()
    except asyncio.CancelledError:
        _abandon(task)
        raise
    _abandon(task)
    raise TimeoutError


def _abandon(task: asyncio.Future[Any]) -> None:
    task.cancel()
    task.add_done_callback(lambda t: t.cancelled() or t.exception())
