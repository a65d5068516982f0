"""The embedding model behind `/v1/embeddings` and the semantic cache.

`Embedder` is the protocol (test fakes implement it too); `LocalEmbedder` runs one of the
runtimes in embed_models.py (by default MiniLM on onnxruntime, ~2-3 ms a query on one
core) in one worker thread, off the event loop, with `threads` intra-op threads (1 by
default), so it never takes more than its core from the engine, at a lower scheduling
priority (`nice`, 10 by default), so under CPU contention serving goes first.

Scheduling, so a large batch cannot starve a cache lookup:
- small calls (at most `URGENT_TEXTS` texts and `BULK_PASS_CHARS` characters: a cache
  lookup, a short embeddings request) wait in the urgent lane, larger ones in the bulk
  lane;
- each forward pass takes at most `batch_max` texts: first every urgent call queued
  meanwhile (they batch together), then as many bulk texts as fit, the bulk calls taking
  turns slice by slice; an urgent call thus waits at most one pass, and one large call
  cannot hold up another for its whole length;
- a pass takes bulk texts of at most `BULK_PASS_CHARS` characters in all (at least one
  text): 32 long documents are a second or more on one core, past any lookup's
  deadline, so one tenant's large embeddings request would turn every tenant's
  semantic lookups into misses while it ran;
- a caller that gives up (a lookup's deadline, a client gone) cancels its call: its
  texts not yet embedded are skipped; so are those of a call that refuses texts past
  the model's window (`refuse_over`) once a pass has found one.
Vectors are unit-length (cosine = dot product).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from prometheus_client import CollectorRegistry, Histogram

from .embed_models import Runtime, load_runtime
from .errors import Unavailable
from .settings import EmbeddingSettings
from .tasks import cancel_and_wait
from .telemetry import error_fields, get_logger

log = get_logger("weir.embedding")
URGENT_TEXTS = 4
BULK_PASS_CHARS = 2048  # ~500 tokens: tens of milliseconds of MiniLM on one core
Vectors = tuple[np.ndarray, list[int]]


class InputTooLong(Exception):
    """Text `index` of a call holds `tokens` tokens, past the call's `refuse_over`."""

    def __init__(self, index: int, tokens: int) -> None:
        super().__init__(f"text {index} holds {tokens} tokens")
        self.index = index
        self.tokens = tokens


def refuse_long(counts: list[int], limit: int | None, first: int = 0) -> None:
    """Raise InputTooLong for the first count past `limit` (texts from index `first`)."""
    if limit is not None:
        for i, n in enumerate(counts):
            if n > limit:
                raise InputTooLong(first + i, n)


class Embedder(Protocol):
    """texts -> (unit vectors [n, dim] float32, token counts), batched with other callers."""

    model_id: str
    dim: int
    #: The most tokens a text is embedded with: a longer one is cut, and its count says so.
    max_tokens: int

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def ready(self) -> None: ...

    async def embed(self, texts: list[str], refuse_over: int | None = None) -> Vectors:
        """`refuse_over`: a text of more tokens fails the call with InputTooLong (else it
        is embedded cut to `max_tokens`)."""
        ...


@dataclass(slots=True, eq=False)
class _Call:
    texts: list[str]
    future: asyncio.Future[Vectors]
    refuse_over: int | None = None
    cursor: int = 0  # texts handed to a pass so far
    done: int = 0  # texts embedded so far
    vecs: list[np.ndarray] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)


def _lower_priority(nice: int) -> None:
    """The calling thread's scheduling niceness raised by `nice` (Linux)."""
    if nice and hasattr(os, "setpriority"):
        tid = threading.get_native_id()
        try:  # on Linux, a thread id as the "process" sets that thread's niceness
            os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + nice)
        except OSError as e:
            log.warning("could not lower the embedding thread's priority",
                        error=type(e).__name__)  # (its message may name a path)


class LocalEmbedder:
    def __init__(self, settings: EmbeddingSettings, registry: CollectorRegistry | None = None,
                 runtime: Callable[[], Runtime] | None = None) -> None:
        """`runtime` builds the model (in the worker thread); default: `settings.model`."""
        self.settings = settings
        self._make_runtime = runtime
        self.model_id = settings.served_model_name
        self.dim = 384
        self.max_tokens = settings.max_input_tokens
        self.batches = 0
        self.thread_id: int | None = None  # the worker thread's (native) id, once loaded
        #: What a text's length counts for at most: longer ones are cut to the same cost.
        self._char_cap = 8 * settings.max_input_tokens
        self._runtime: Runtime | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="weir-embed")
        #: Where a long text that may be past a caller's `refuse_over` is counted, before
        #: it queues for the model (`_refuse_long_first`).
        self._counting = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="weir-embed-count", initializer=_lower_priority,
            initargs=(settings.nice,))
        self._urgent: collections.deque[_Call] = collections.deque()
        self._bulk: collections.deque[_Call] = collections.deque()
        self._wake: asyncio.Event | None = None
        self._worker: asyncio.Task[None] | None = None
        self._loaded: asyncio.Future[None] | None = None
        self.latency = Histogram(
            "weir_embedding_duration_seconds", "Embedding calls, queueing included.",
            ["lane"], registry=registry,
            buckets=(0.001, 0.002, 0.003, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5))
        self.pass_time = Histogram(
            "weir_embedding_pass_seconds", "Forward passes of the embedding model.",
            registry=registry, buckets=(0.001, 0.002, 0.003, 0.005, 0.01, 0.025, 0.05, 0.1,
                                        0.25, 1))

    def _load(self) -> None:
        s = self.settings
        self.thread_id = threading.get_native_id()
        _lower_priority(s.nice)
        self._runtime = (self._make_runtime() if self._make_runtime is not None else
                         load_runtime(s.model, s.max_input_tokens, s.threads))
        self.dim = self._runtime.dim

    async def start(self) -> None:
        self._wake = asyncio.Event()
        self._loaded = asyncio.get_running_loop().run_in_executor(self._pool, self._load)
        self._worker = asyncio.create_task(self._run())

    async def close(self) -> None:
        await cancel_and_wait(self._worker)
        for call in (*self._urgent, *self._bulk):
            call.future.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._counting.shutdown(wait=False, cancel_futures=True)

    async def ready(self) -> None:
        assert self._loaded is not None, "LocalEmbedder.start() was not called"
        await asyncio.shield(self._loaded)

    async def embed(self, texts: list[str], refuse_over: int | None = None) -> Vectors:
        assert self._wake is not None, "LocalEmbedder.start() was not called"
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32), []
        if refuse_over is not None:
            await self._refuse_long_first(texts, refuse_over)
        call = _Call(list(texts), asyncio.get_running_loop().create_future(), refuse_over)
        urgent = (len(texts) <= URGENT_TEXTS
                  and sum(min(len(t), self._char_cap) for t in texts) <= BULK_PASS_CHARS)
        (self._urgent if urgent else self._bulk).append(call)
        self._wake.set()
        started = time.perf_counter()
        try:
            return await call.future  # cancelling us cancels the call
        finally:
            self.latency.labels("urgent" if urgent else "bulk").observe(
                time.perf_counter() - started)

    async def _refuse_long_first(self, texts: list[str], limit: int) -> None:
        """Texts long enough to hold more than `limit` tokens (past `_char_cap`
        characters) counted whole in a thread of their own, and one past `limit` refused,
        before any queues for the model: the worker's pass tokenized a 2 MB text cut,
        then counted it whole, ~5 s during which every tenant's semantic lookups waited
        (and missed). (No count by characters alone can refuse it: a 2 MB word is one
        `[UNK]`, 2 MB of spaces none.) A runtime that cannot count alone finds it in
        its pass."""
        count: Callable[[list[str]], list[int]] | None = getattr(self._runtime, "count", None)
        long = [i for i, t in enumerate(texts) if len(t) > self._char_cap]
        if count is None or not long:
            return
        gone = threading.Event()

        def first_past() -> InputTooLong | None:
            """In order, and no further than the first past `limit` (or the caller's
            leaving): a large batch's count is seconds too."""
            for i in long:
                if gone.is_set():
                    return None
                if (n := count([texts[i]])[0]) > limit:
                    return InputTooLong(i, n)
            return None

        try:
            past = await asyncio.get_running_loop().run_in_executor(self._counting,
                                                                    first_past)
        except asyncio.CancelledError:
            gone.set()
            raise
        if past is not None:
            raise past

    def _take(self) -> list[tuple[_Call, int, int]]:
        """(call, start, end) slices for one pass: urgent calls first, then bulk."""
        room = self.settings.batch_max
        chars = BULK_PASS_CHARS
        cap = self._char_cap
        out: list[tuple[_Call, int, int]] = []
        for lane in (self._urgent, self._bulk):
            while lane and room > 0:
                call = lane[0]
                if call.future.done():
                    lane.popleft()
                    continue
                end = min(len(call.texts), call.cursor + room)
                if lane is self._urgent and end < len(call.texts) and out:
                    break  # a small call is never split: it waits for the next pass
                if lane is self._bulk:
                    first = chars == BULK_PASS_CHARS  # no bulk text in this pass yet
                    for i in range(call.cursor, end):
                        size = min(len(call.texts[i]), cap)
                        if size > chars and not (first and i == call.cursor):
                            end = i
                            break
                        chars -= size
                    if end == call.cursor:
                        break  # the pass is full of bulk text
                out.append((call, call.cursor, end))
                room -= end - call.cursor
                call.cursor = end
                if end == len(call.texts):
                    lane.popleft()
                elif lane is self._bulk:
                    lane.rotate(-1)  # bulk calls take turns, slice by slice
        return out

    async def _run(self) -> None:
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        try:
            await self.ready()
            failed = False
        except Exception as e:
            # (its type and place: its message may quote a secret, a path, a URL's token)
            log.error("embedding model failed to load", **error_fields(e))
            failed = True
        while True:
            await self._wake.wait()
            self._wake.clear()
            while slices := self._take():
                if failed:
                    for call, _, _ in slices:
                        if not call.future.done():  # an error of its own for each caller
                            call.future.set_exception(Unavailable(
                                "The embedding model failed to load; the server log says "
                                "why.", code="model_unavailable", retry_after=None))
                    continue
                texts = [t for call, a, b in slices for t in call.texts[a:b]]
                started = time.perf_counter()
                try:
                    assert self._runtime is not None
                    vecs, counts = await loop.run_in_executor(self._pool, self._runtime, texts)
                except Exception as e:
                    log.error("embedding failed", error=type(e).__name__)
                    for call, _, _ in slices:
                        if not call.future.done():
                            call.future.set_exception(e)
                    continue
                self.pass_time.observe(time.perf_counter() - started)
                self.batches += 1
                self._deliver(slices, vecs, counts)

    @staticmethod
    def _deliver(slices: list[tuple[_Call, int, int]], vecs: np.ndarray,
                 counts: list[int]) -> None:
        pos = 0
        for call, a, b in slices:
            n = b - a
            part = counts[pos:pos + n]
            if not call.future.done():
                try:
                    refuse_long(part, call.refuse_over, a)
                except InputTooLong as e:  # the call ends: its later texts are skipped
                    call.future.set_exception(e)
                else:
                    call.vecs.append(vecs[pos:pos + n])
                    call.counts += part
                    call.done += n
                    if call.done == len(call.texts):
                        out = (call.vecs[0] if len(call.vecs) == 1
                               else np.concatenate(call.vecs))
                        call.future.set_result((out, call.counts))
            pos += n
