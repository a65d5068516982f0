"""What the chain returns: a whole answer (`Completion`) or a `Stream`.

A Stream is consumed once (by the SSE writer, or whoever iterates it) and ends once,
with an outcome, on every path; plugins see its end through hooks, never by wrapping it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from types import AsyncGeneratorType
from typing import Any, Literal

from .context import Within
from .tasks import detach
from .telemetry import error_fields, get_logger

_log = get_logger("weir.reply")


@dataclass(slots=True)
class Completion:
    """A whole answer: the OpenAI response object, JSON-ready. `order`: where a tool
    parser read it, its first choice's content and calls in the order the model wrote
    them (text pieces, and each call's index in `tool_calls`), which the chat message's
    one `content` beside its `tool_calls` does not keep (the Responses API's items do);
    None where not known (no parser, a cached or relayed answer). `usages`: each
    choice's own usage by its index (`{"prompt_tokens": its prompt's, "completion_tokens":
    its own}`), what a stream of it with `continuous_usage_stats` gives that choice's
    last chunk; None where the producer did not count them (a relayed answer)."""

    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    order: list[str | int] | None = None
    usages: dict[int, dict[str, int]] | None = None


Outcome = Literal["completed", "failed", "cancelled"]
#: Called once when a stream ends: (the stream, how it ended). May be async.
EndHook = Callable[["Stream", Outcome], Awaitable[None] | None]


class Stream:
    """A streamed answer: OpenAI chunk objects (dicts), and what is known about them.

    One pass per chunk: plugins do not wrap the chunk iterator. A plugin that cares how a
    stream ends registers `on_end(hook)`; the one consumer (the SSE writer, or whoever
    iterates it) calls `end(outcome)` exactly once on every path: completed, failed
    (`error` says why: a deadline, an engine fault) or cancelled (client gone, shutdown).
    `end` closes the iterator (which aborts the engine request) and then runs the hooks in
    the order they were registered: innermost plugin first (admission frees its slot
    before the breaker records, the cache stores and the rate limiter settles).

    The producer fills in what consumers would otherwise re-parse from the chunks:
    `usage` (prompt and completion tokens, once known) and `answer` (the choices' text and
    finish reasons, for the cache to store; None where the producer does not assemble
    them, e.g. an upstream relay). `first` is the first chunk when the producer awaited it
    before returning (`prime()`): errors before any output then surface from the chain
    call itself, with a real HTTP status, where the breaker can still fall back.
    """

    __slots__ = ("_ended", "_hooks", "_hooks_started", "_it", "_outcome", "answer", "deadline",
                 "error", "first", "headers", "primed_at", "usage", "whole")

    def __init__(
        self,
        chunks: AsyncIterator[dict[str, Any]] | None = None,
        headers: dict[str, str] | None = None,
        *,
        whole: bool = False,
    ) -> None:
        self._it = chunks
        #: Every chunk is in hand at once (a stored answer replayed, a static fallback):
        #: the SSE writer sends them, and what ends the body, in one write.
        self.whole = whole
        self.headers: dict[str, str] = headers if headers is not None else {}
        self.usage: dict[str, Any] | None = None
        self.answer: list[dict[str, Any]] | None = None
        self.error: BaseException | None = None
        self.first: dict[str, Any] | None = None
        #: time.monotonic() when the first chunk was in hand (prime()); None: not primed.
        self.primed_at: float | None = None
        #: time.monotonic() by which the stream must end (one per request; the consumer
        #: enforces it, ending the stream with DeadlineExceeded). None: no deadline.
        self.deadline: float | None = None
        self._hooks: list[EndHook] = []
        self._ended = False
        self._hooks_started = False
        self._outcome: Outcome = "cancelled"

    def attach(self, chunks: AsyncIterator[dict[str, Any]]) -> Stream:
        """Set the chunk source (for producers that hand the Stream to their generator)."""
        self._it = chunks
        return self

    async def prime(self) -> Stream:
        """Await the first chunk now. An error before it propagates (the stream ends
        `failed`); an empty stream is fine."""
        assert self._it is not None and self.first is None
        try:
            self.first = await self._it.__anext__()
        except StopAsyncIteration:
            pass
        except BaseException as e:
            await self.end("cancelled" if isinstance(e, asyncio.CancelledError) else "failed",
                           e)
            raise
        self.primed_at = time.monotonic()
        return self

    def rest(self) -> AsyncIterator[dict[str, Any]]:
        """The chunks after `first`: the consumer's hot path (no extra frame)."""
        assert self._it is not None
        return self._it

    @property
    def ended(self) -> bool:
        return self._ended

    def on_end(self, hook: EndHook) -> None:
        """Run `hook` when the stream ends, after the hooks registered before it; once the
        hooks have run (or are running), at once, in a task of its own, with the outcome
        the stream ended with: what the plugin holds is freed either way."""
        if self._hooks_started:
            detach(self._run_hooks(self._outcome, [hook]))
            return
        self._hooks.append(hook)

    async def end(self, outcome: Outcome, error: BaseException | None = None) -> None:
        """Close the chunk source and run the end hooks; only the first call counts.
        Hooks run even if closing fails, and one hook failing does not stop the rest."""
        if self._ended:
            return
        self._ended = True
        self._outcome = outcome
        if error is not None and self.error is None:
            self.error = error
        close = getattr(self._it, "aclose", None)
        try:
            if close is not None:
                try:
                    await close()
                except Exception as e:
                    _log.error("closing a stream failed", **error_fields(e))
        finally:  # a cancellation while closing (an engine abort under way) skips no hook
            self._hooks_started = True
            await self._run_hooks(outcome, self._hooks)

    async def end_shielded(self, outcome: Outcome, error: BaseException | None = None,
                           ) -> None:
        """`end`, run to its end even if the caller is cancelled meanwhile (the caller
        still gets the cancellation).

        Where nothing of it can pause (the chunk source ran to its end, so closing it
        is nothing to await, and each hook is a plain function that returns None), it
        runs here, with no task: a task per stream (its creation, a shield, a loop
        turn) cost ~8 us a request. From the first hook that hands back an awaitable on,
        the rest runs in a task of its own as before; that awaitable has not started (a
        coroutine runs nothing until it is awaited), so nothing of it ran in the
        caller's task: a timeout it enters is its own task's, not the caller's."""
        if self._ended:
            return
        if not _spent(self._it):
            await asyncio.shield(detach(self.end(outcome, error)))
            return
        self._ended = self._hooks_started = True
        self._outcome = outcome
        if error is not None and self.error is None:
            self.error = error
        hooks = self._hooks
        for i, hook in enumerate(hooks):
            try:
                result = hook(self, outcome)
            except asyncio.CancelledError:
                # Raised by the hook itself (a cancelled future's result): a plain call
                # receives no cancellation of its caller's. A failed hook, as in a task
                # (`_run_hooks`); those after it still run.
                _log.warning("a stream end hook was cancelled", hook=_named(hook))
                continue
            except Exception as e:
                _log.error("a stream end hook failed", hook=_named(hook), **error_fields(e))
                continue
            if result is not None:
                await asyncio.shield(detach(self._run_hooks(outcome, hooks[i + 1:],
                                                            (hook, result))))
                return

    async def _run_hooks(self, outcome: Outcome, hooks: list[EndHook],
                         started: tuple[EndHook, Awaitable[None]] | None = None) -> None:
        """Run `hooks` in order (after awaiting `started`: a hook already called, and
        what it returned). Cut short by a cancellation inside an async hook, the
        ones after it still run, in a task of their own: each frees what its plugin holds
        (an engine slot, a lease), and one skipped would hold it for good."""
        if started is not None:
            hooks = [started[0], *hooks]
        for i, hook in enumerate(hooks):
            try:
                if i == 0 and started is not None:
                    result: Awaitable[None] | None = started[1]
                else:
                    result = hook(self, outcome)
                if result is not None:
                    await result
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and not task.cancelling():
                    # Not our cancellation (a task the hook awaited was cancelled, at
                    # loop teardown say): a failed hook, like any other.
                    _log.warning("a stream end hook was cancelled", hook=_named(hook))
                    continue
                if i + 1 < len(hooks):
                    detach(self._run_hooks(outcome, hooks[i + 1:]))
                raise
            except Exception as e:
                _log.error("a stream end hook failed", hook=_named(hook), **error_fields(e))

    # Consumers other than the SSE writer (tests, translations into other APIs) iterate
    # the stream; the iteration ends it.
    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[dict[str, Any]]:
        outcome: Outcome = "cancelled"
        error: BaseException | None = None
        try:
            if self.first is not None:
                first, self.first = self.first, None
                yield first
            while self._it is not None:
                # A scope per chunk here (a timeout cannot span a generator's yields);
                # the SSE writer, the hot path, has one for the whole stream.
                try:
                    async with Within(self.deadline):
                        chunk = await self._it.__anext__()
                except StopAsyncIteration:
                    break
                yield chunk
            outcome = "completed"
        except GeneratorExit:
            raise
        except asyncio.CancelledError:
            raise
        except BaseException as e:
            outcome, error = "failed", e
            raise
        finally:
            await self.end_shielded(outcome, error)

    async def aclose(self) -> None:
        """End the stream as cancelled (the consumer gave up on it)."""
        await self.end("cancelled")


def _named(hook: EndHook) -> str:
    """An end hook as a log line names it."""
    return getattr(hook, "__qualname__", repr(hook))


def _spent(chunks: AsyncIterator[dict[str, Any]] | None) -> bool:
    """Whether closing `chunks` is nothing to await: none, or an async generator that
    ran to its end (or was closed). Any other iterator may have an `aclose` to run."""
    if chunks is None:
        return True
    return isinstance(chunks, AsyncGeneratorType) and chunks.ag_frame is None


Reply = Completion | Stream
