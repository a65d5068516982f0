"""The chain's terminal step over an in-process Engine: a request in, a Reply out.

`LocalServing` prepares the request (`proxy.preparing`), starts the engine (several
prompts of one completion request run concurrently, merged into one sequence of
outputs) and renders the outputs (`proxy.rendering`): collected into a Completion, or a
Stream whose first chunk is awaited before it is returned, so an engine that refuses or
fails before any output answers with a real status where the breaker can still fall back.

Per streamed chunk the work is one engine step, one renderer step and one write: the
engine's own generator feeds the renderer directly (no relay generator, no queue), engine
errors are mapped inside the renderer, and the `engine.generate` span is a plain object,
not another frame.

Every engine generator is closed when its Stream ends (client gone, deadline, shutdown),
which aborts the request in the engine.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from contextlib import aclosing
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from . import rendering
from .auth import tenant_salt
from .chain import Reply, Stream
from .context import RequestContext
from .engine.base import Engine, EngineOutput, EngineStats, ModelInfo
from .errors import GatewayFault, InvalidRequest, ModelNotFound, WeirError
from .generation import EngineSpan
from .ids import new_hex
from .preparing import (
    Prepared,
    check_min_tokens,
    prepare_chat,
    prepare_completion,
    prompt_tokens,
)
from .protocol import ChatCompletionRequest, CompletionRequest
from .tasks import OFF_LOOP_CHARS, cancel_and_wait
from .telemetry import error_fields, get_logger
from .tools import tool_chars

if TYPE_CHECKING:
    from .terminal import Route

T = TypeVar("T")

log = get_logger("weir.serving")


def cache_salt(ctx: RequestContext) -> str:
    """Per-tenant salt for vLLM's prefix cache: one tenant's cached prefix never speeds
    up (and so never reveals itself to) another tenant's request."""
    return tenant_salt(ctx.principal.tenant)


def engine_outputs(engine: Engine, prep: Prepared,
                   ctx: RequestContext) -> AsyncGenerator[EngineOutput, None]:
    """The engine's outputs for every prompt, each tagged with its prompt's index."""
    salt = cache_salt(ctx)
    base = f"weir-{new_hex()}"
    if len(prep.prompts) == 1:  # the common case: the engine's own generator, as is
        outputs = engine.generate(prep.prompts[0], prep.options, base, cache_salt=salt)
        ids = [base]
    else:
        outputs = _merged(engine, prep, base, salt)
        ids = [f"{base}-{i}" for i in range(len(prep.prompts))]
    counted = getattr(engine, "generated_tokens", None)
    if counted is not None:
        # (a whole answer tells no token until its end: the breaker asks, past its
        # `slow_call_s`, whether the engine has made any; and whether a half-open trial
        # under way, whole or streamed, is still making them)
        ctx.engine_progress = lambda: _total([counted(i) for i in ids])
    n = ctx.request.n
    return outputs if prep.options.n == n else _fanned_out(outputs, n)


def _total(counts: list[int | None]) -> int | None:
    """The tokens a request's prompts have made, or None where any cannot be told."""
    return None if None in counts else sum(c for c in counts if c is not None)


async def _fanned_out(outputs: AsyncGenerator[EngineOutput, None],
                      n: int) -> AsyncGenerator[EngineOutput, None]:
    """One greedy answer as `n` choices (they would all be the same)."""
    async with aclosing(outputs):
        async for out in outputs:
            out.choices = [replace(c, index=i) for c in out.choices for i in range(n)]
            yield out


async def _merged(engine: Engine, prep: Prepared, base: str,
                  salt: str) -> AsyncGenerator[EngineOutput, None]:
    queue: asyncio.Queue[tuple[int, EngineOutput | BaseException | None]] = asyncio.Queue()

    async def pump(i: int, prompt: list[int]) -> None:
        try:
            async with aclosing(engine.generate(prompt, prep.options, f"{base}-{i}",
                                                cache_salt=salt)) as it:
                async for out in it:
                    out.prompt_index = i
                    await queue.put((i, out))
            await queue.put((i, None))
        except BaseException as e:  # forwarded to the consumer, which re-raises
            await queue.put((i, e))

    tasks = [asyncio.create_task(pump(i, p)) for i, p in enumerate(prep.prompts)]
    try:
        remaining = len(tasks)
        while remaining:
            _, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        await cancel_and_wait(*tasks)


# A prompt of `OFF_LOOP_CHARS` characters or more (its messages' texts and tools, or its
# prompts) is prepared (rendered and tokenized) in a thread of its own, not on the event
# loop (a cheap 400 past the context took as long, each time a client sent one).


def _prompt_chars(req: ChatCompletionRequest | CompletionRequest) -> int:
    if isinstance(req, ChatCompletionRequest):
        return sum(len(m.text()) for m in req.messages) + tool_chars(req)
    return sum(len(p) for p in req.prompts())


class LocalServing:
    """The Terminal over an in-process Engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._models: frozenset[str] | None = None
        # One thread: long prompts are prepared one at a time (the tokenizer is one).
        self._preparing = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="weir-prepare")

    async def start(self) -> None:
        await self.engine.start()

    async def close(self) -> None:
        await self.engine.close()
        self._preparing.shutdown(wait=False, cancel_futures=True)

    async def prepare(self, ctx: RequestContext) -> None:
        """A long prompt (`OFF_LOOP_CHARS`) prepared ahead, before admission gives it an
        engine permit: waiting for the one preparing thread behind other long prompts,
        it held a permit the engine could have given a short request meanwhile (shed, or
        queued, with the engine idle). A short one is prepared by the call, on the loop:
        it waits for nothing. (What is prepared is held while the request queues for
        its permit: its token ids, within the model's context, for a bounded queue.)"""
        if self.prepares_ahead(ctx):
            ctx.prepared = (ctx.request, await self._prepare(ctx))

    def prepares_ahead(self, ctx: RequestContext) -> bool:
        req = ctx.request
        return (isinstance(req, ChatCompletionRequest | CompletionRequest)
                and _prompt_chars(req) >= OFF_LOOP_CHARS and self.has_model(ctx.model))

    async def _prepare(self, ctx: RequestContext) -> Prepared:
        """`ctx`'s request prepared; what fails in preparing it as the client is told."""
        req = ctx.request
        if isinstance(req, ChatCompletionRequest):
            prepare: Any = lambda: prepare_chat(self.engine, req)  # noqa: E731
        else:
            sent = ctx.sent if isinstance(ctx.sent, CompletionRequest) else None
            prepare = lambda: prepare_completion(self.engine, req, sent)  # noqa: E731
        try:
            return await self._off_loop_if_long(req, prepare)  # type: ignore[no-any-return]
        except WeirError:
            raise
        except RecursionError:  # a structure nested past what the template can render
            raise InvalidRequest("The request nests too deeply to be rendered.", param=(
                "messages" if isinstance(req, ChatCompletionRequest) else "prompt"),
                code="invalid_value") from None
        except Exception as e:  # where, not what: the message may quote the request
            log.error("preparing a request failed", **error_fields(e))
            raise GatewayFault() from None

    async def _off_loop_if_long(self, req: ChatCompletionRequest | CompletionRequest,
                                work: Callable[[], T]) -> T:
        """`work()` (rendering or tokenizing `req`'s prompt): on the loop for a short
        prompt, in the preparing thread for a long one (`OFF_LOOP_CHARS`)."""
        if _prompt_chars(req) < OFF_LOOP_CHARS:
            return work()
        return await asyncio.get_running_loop().run_in_executor(self._preparing, work)

    def ready(self) -> bool:
        return self.engine.ready()

    def failed(self) -> bool:
        return self.engine.failed()

    def models(self) -> list[ModelInfo]:
        return self.engine.models()

    def stats(self) -> EngineStats:
        return self.engine.stats()

    def routes(self) -> list[Route]:
        from .engine.faults import FaultyEngine

        if isinstance(self.engine, FaultyEngine):
            from .admin_faults import fault_routes

            return fault_routes(self.engine)
        return []

    def sampling_defaults(self) -> Mapping[str, Any]:
        return self.engine.sampling_defaults

    def read_tokens(self, token_ids: list[int]) -> str | None:
        vocab = self.engine.vocab_size
        if not self.engine.ready() or vocab is None or any(
                not 0 <= t < vocab for t in token_ids):
            return None
        try:
            return self.engine.decode(token_ids)
        except Exception:  # (the request's own checks answer for ids the tokenizer refuses)
            return None

    def answer_digest_for(self, model: str) -> str | None:
        return self.engine.answer_digest  # (the one model it serves)

    async def count_prompt(self, request: ChatCompletionRequest | CompletionRequest,
                           ) -> int | None:
        # The render a miss makes before the engine (where a miss makes it: on the loop,
        # ~0.4 ms for a one-question chat with SmolLM2's template; a long prompt's in the
        # preparing thread), paid by hits of another prompt only.
        if not self.engine.ready():
            return None
        try:
            return await self._off_loop_if_long(
                request, lambda: prompt_tokens(self.engine, request))
        except Exception:  # (a miss would answer for what the template refuses)
            return None

    def has_model(self, model: str) -> bool:
        if self._models is None:
            ids = frozenset(m.id for m in self.engine.models())
            if not self.engine.ready():
                return model in ids  # names may still change while loading
            self._models = ids
        return model in self._models

    async def __call__(self, ctx: RequestContext) -> Reply:
        if not self.has_model(ctx.model):
            raise ModelNotFound(ctx.model)
        req = ctx.request
        ahead, ctx.prepared = ctx.prepared, None  # (once: its options are changed below)
        # (prepared ahead for this request: one a plugin replaced since is prepared anew)
        prep = ahead[1] if ahead is not None and ahead[0] is req else await self._prepare(ctx)
        if ctx.output_ceiling is not None:  # a limit the caller named is within it already
            prep.options.max_tokens = min(prep.options.max_tokens, ctx.output_ceiling)
            check_min_tokens(prep.options, ctx.output_ceiling)
        ctx.prompt_tokens = sum(len(p) for p in prep.prompts)
        prep.options.final_only = not req.stream and not prep.streams_calls
        ctx.engine_live = not prep.options.final_only
        ctx.engine_started, ctx.engine_timed = time.monotonic(), True
        ctx.waiting()
        outputs = engine_outputs(self.engine, prep, ctx)
        span = EngineSpan(req.model)
        if not req.stream:
            return await rendering.whole(outputs, req, prep, span, ctx)
        stream = Stream()
        stream.attach(rendering.chunks(outputs, req, prep, span, ctx, stream))
        return await stream.prime()
