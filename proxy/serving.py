"""The chain's terminal step: an OpenAI request in, a Completion or Stream out.

`prepare_*` turns a validated request into token ids and engine-neutral
`SamplingOptions`, and refuses what the engine cannot do with a 400 naming the param
(prompt longer than the context, greedy `n > 1`, a bad `logit_bias` token).
`LocalServing` then runs the engine and renders its deltas through `proxy.responses`.

Every engine generator is entered with `aclosing`, so a closed Stream (client gone,
deadline, shutdown) closes the engine iterator at once, and vLLM aborts the request.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.trace import SpanKind, Status, StatusCode

from . import responses as R
from . import tools as T
from .chain import Completion, Reply, Stream
from .context import RequestContext
from .engine.base import (
    Engine,
    EngineFailed,
    EngineOutput,
    EngineOverloaded,
    EngineRejected,
    SamplingOptions,
    TokenLogprob,
)
from .errors import EngineError, InvalidRequest, ModelNotFound, Unavailable, WeirError
from .protocol import ChatCompletionRequest, CompletionRequest, OtherPart, ResponseFormat
from .tracing import tracer


@dataclass(slots=True)
class Prepared:
    prompts: list[list[int]]
    options: SamplingOptions
    top_logprobs: int = 0
    echo_texts: list[str] = field(default_factory=list)
    #: Chat: a fresh per-choice tool-call tracker (model text -> tool_calls).
    tracker: Any = None


def _message_dicts(req: ChatCompletionRequest) -> list[dict[str, Any]]:
    out = []
    for i, m in enumerate(req.messages):
        if isinstance(m.content, list):
            for j, part in enumerate(m.content):
                if isinstance(part, OtherPart):
                    raise InvalidRequest(
                        f"Content parts of type `{part.type}` are not supported by this "
                        "model; only `text` parts are.",
                        param=f"messages[{i}].content[{j}].type",
                        code="unsupported_content",
                    )
        d: dict[str, Any] = {"role": m.role, "content": m.text()}
        if m.name:
            d["name"] = m.name
        if m.tool_calls:
            d["tool_calls"] = T.template_calls(m.tool_calls)
        if m.tool_call_id:
            d["tool_call_id"] = m.tool_call_id
        out.append(d)
    return out


def _structured(fmt: ResponseFormat | None) -> tuple[dict[str, Any] | None, bool]:
    if fmt is None or fmt.type == "text":
        return None, False
    if fmt.type == "json_object":
        return None, True
    assert fmt.json_schema is not None
    return (fmt.json_schema.schema_ or {"type": "object"}), False


def _logit_bias(raw: dict[str, float] | None, vocab: int | None) -> dict[int, float] | None:
    if not raw:
        return None
    out = {}
    for k, v in raw.items():
        try:
            tid = int(k)
        except ValueError:
            raise InvalidRequest(f"Invalid token id `{k}` in `logit_bias`.",
                                 param="logit_bias") from None
        if tid < 0 or (vocab is not None and tid >= vocab):
            raise InvalidRequest(f"Token id {tid} in `logit_bias` is out of the vocabulary.",
                                 param="logit_bias")
        out[tid] = v
    return out


def _options(
    req: ChatCompletionRequest | CompletionRequest,
    prompt_len: int,
    max_model_len: int,
    logprobs: int | None,
    vocab: int | None,
    prompt_param: str,
) -> SamplingOptions:
    if prompt_len >= max_model_len:
        raise InvalidRequest(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"prompt has {prompt_len} tokens.",
            param=prompt_param,
            code="context_length_exceeded",
        )
    limit = req.output_limit
    room = max_model_len - prompt_len
    if limit is not None and limit > room:
        param = "max_completion_tokens" if getattr(req, "max_completion_tokens", None) else (
            "max_tokens")
        raise InvalidRequest(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {prompt_len + limit} tokens ({prompt_len} in the prompt, {limit} for "
            "the completion). Please reduce the prompt or the completion length.",
            param=param,
            code="context_length_exceeded",
        )
    temperature = 1.0 if req.temperature is None else req.temperature
    if req.n > 1 and temperature == 0.0:
        raise InvalidRequest("`n` greater than 1 needs a temperature above 0.", param="n")
    schema, json_object = _structured(req.response_format)
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    return SamplingOptions(
        max_tokens=limit if limit is not None else room,
        temperature=temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=req.top_k,
        n=req.n,
        stop=stop,
        seed=req.seed,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        logit_bias=_logit_bias(req.logit_bias, vocab),
        logprobs=logprobs,
        min_tokens=req.min_tokens,
        ignore_eos=req.ignore_eos,
        json_schema=schema,
        json_object=json_object,
    )


def prepare_chat(engine: Engine, req: ChatCompletionRequest) -> Prepared:
    messages = _message_dicts(req)
    try:
        ids = engine.render_chat(messages, req.tool_dicts())
    except EngineRejected as e:
        raise InvalidRequest(str(e), param=e.param or "messages") from None
    top = req.top_logprobs or 0
    opts = _options(req, len(ids), engine.max_model_len, top if req.logprobs else None,
                    getattr(engine, "vocab_size", None), "messages")
    T.shape_options(req, opts, engine)
    return Prepared([ids], opts, top_logprobs=top,
                    tracker=lambda: T.ToolCallTracker.for_request(req, engine.tool_parser))


def prepare_completion(engine: Engine, req: CompletionRequest) -> Prepared:
    if req.suffix:
        raise InvalidRequest("`suffix` is not supported by this model.", param="suffix")
    if req.best_of is not None and req.best_of != req.n:
        raise InvalidRequest("`best_of` other than `n` is not supported.", param="best_of")
    prompts: list[list[int]] = []
    echo: list[str] = []
    for p in req.prompts():
        if isinstance(p, str):
            prompts.append(engine.encode(p))
            echo.append(p)
        else:
            prompts.append(list(p))
            echo.append("")
    longest = max(len(p) for p in prompts)
    opts = _options(req, longest, engine.max_model_len, req.logprobs,
                    getattr(engine, "vocab_size", None), "prompt")
    return Prepared(prompts, opts, top_logprobs=req.logprobs or 0, echo_texts=echo)


def cache_salt(ctx: RequestContext) -> str:
    """Per-tenant salt for vLLM's prefix cache: one tenant's cached prefix never speeds
    up (and so never reveals itself to) another tenant's request."""
    return hashlib.sha256(f"weir-tenant:{ctx.principal.tenant}".encode()).hexdigest()[:32]


def _map_engine_error(e: Exception) -> WeirError:
    if isinstance(e, EngineRejected):
        return InvalidRequest(str(e), param=e.param)
    if isinstance(e, EngineOverloaded):
        return Unavailable("The engine is overloaded; retry shortly.", code="overloaded")
    return EngineError("The engine failed while generating this answer.")


async def _engine_steps(
    engine: Engine, prep: Prepared, ctx: RequestContext
) -> AsyncGenerator[tuple[int, EngineOutput], None]:
    """Run every prompt concurrently; yield (prompt index, output) as they come."""
    salt = cache_salt(ctx)
    base = f"weir-{uuid.uuid4().hex}"
    if len(prep.prompts) == 1:
        async with aclosing(engine.generate(prep.prompts[0], prep.options, base,
                                            cache_salt=salt)) as it:
            async for out in it:
                yield 0, out
        return
    queue: asyncio.Queue[tuple[int, EngineOutput | BaseException | None]] = asyncio.Queue()

    async def pump(i: int, prompt: list[int]) -> None:
        try:
            async with aclosing(engine.generate(prompt, prep.options, f"{base}-{i}",
                                                cache_salt=salt)) as it:
                async for out in it:
                    await queue.put((i, out))
            await queue.put((i, None))
        except BaseException as e:  # forwarded to the consumer, which re-raises
            await queue.put((i, e))

    tasks = [asyncio.create_task(pump(i, p)) for i, p in enumerate(prep.prompts)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _guarded(
    it: AsyncGenerator[tuple[int, EngineOutput], None], model: str,
) -> AsyncGenerator[tuple[int, EngineOutput], None]:
    """Engine errors to OpenAI errors, and the `engine.generate` span.

    The span is started, not made current: it lives across this generator's yields,
    where making it current would leak it into the consumer's context."""
    s = tracer().start_span("engine.generate", kind=SpanKind.CLIENT,
                            attributes={"gen_ai.request.model": model})
    started = time.perf_counter()
    first = True
    prompt_tokens: dict[int, int] = {}
    completion = 0
    try:
        async with aclosing(it):
            async for item in it:
                pi, out = item
                if first:
                    first = False
                    s.add_event("first_token",
                                {"weir.ttft_ms": round((time.perf_counter() - started) * 1e3, 2)})
                prompt_tokens[pi] = out.prompt_tokens
                completion += sum(len(c.token_ids) for c in out.choices)
                yield item
    except (EngineRejected, EngineOverloaded, EngineFailed) as e:
        s.set_status(Status(StatusCode.ERROR, type(e).__name__))
        raise _map_engine_error(e) from e
    finally:
        s.set_attribute("gen_ai.usage.input_tokens", sum(prompt_tokens.values()))
        s.set_attribute("gen_ai.usage.output_tokens", completion)
        s.end()


class LocalServing:
    """Terminal step over an in-process Engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def _check_model(self, ctx: RequestContext) -> None:
        if ctx.model not in {m.id for m in self.engine.models()}:
            raise ModelNotFound(ctx.model)

    async def __call__(self, ctx: RequestContext) -> Reply:
        self._check_model(ctx)
        req = ctx.request
        if isinstance(req, ChatCompletionRequest):
            prep = prepare_chat(self.engine, req)
        else:
            prep = prepare_completion(self.engine, req)
        ctx.prompt_tokens = sum(len(p) for p in prep.prompts)
        steps = _guarded(_engine_steps(self.engine, prep, ctx), req.model)
        if isinstance(req, ChatCompletionRequest):
            if req.stream:
                return Stream(_chat_stream(steps, req, prep, ctx))
            return await _chat_whole(steps, req, prep)
        if req.stream:
            return Stream(_completion_stream(steps, req, prep, ctx))
        return await _completion_whole(steps, req, prep)


# ---------------------------------------------------------------------- accumulation


@dataclass(slots=True)
class _Acc:
    text: list[str] = field(default_factory=list)
    tokens: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)
    reason: str | None = None


async def _collect(
    steps: AsyncGenerator[tuple[int, EngineOutput], None], n: int, prompts: int
) -> tuple[dict[int, _Acc], int, int]:
    accs: dict[int, _Acc] = {}
    prompt_tokens: dict[int, int] = {}
    cached = 0
    async with aclosing(steps):
        async for pi, out in steps:
            if pi not in prompt_tokens:
                prompt_tokens[pi] = out.prompt_tokens
                cached += out.cached_tokens
            for c in out.choices:
                a = accs.setdefault(pi * n + c.index, _Acc())
                a.text.append(c.text)
                a.tokens += len(c.token_ids)
                if c.logprobs:
                    a.logprobs.extend(c.logprobs)
                if c.finish_reason:
                    a.reason = c.finish_reason
    for i in range(n * prompts):
        accs.setdefault(i, _Acc(reason="stop"))
    return accs, sum(prompt_tokens.values()), cached


async def _chat_whole(steps: AsyncGenerator[tuple[int, EngineOutput], None],
                      req: ChatCompletionRequest, prep: Prepared) -> Completion:
    accs, ptoks, cached = await _collect(steps, req.n, 1)
    choices = [
        prep.tracker().whole_choice(R.chat_choice(
            i, "".join(a.text), R.finish(a.reason),
            R.chat_logprobs(a.logprobs, prep.top_logprobs) if req.logprobs else None,
        ))
        for i, a in sorted(accs.items())
    ]
    ctoks = sum(a.tokens for a in accs.values())
    return Completion(R.chat_completion(
        id=R.new_id("chatcmpl"), model=req.model, created=R.now(), choices=choices,
        usage_=R.usage(ptoks, ctoks, cached),
    ))


async def _completion_whole(steps: AsyncGenerator[tuple[int, EngineOutput], None],
                            req: CompletionRequest, prep: Prepared) -> Completion:
    accs, ptoks, cached = await _collect(steps, req.n, len(prep.prompts))
    choices = []
    for i, a in sorted(accs.items()):
        prefix = prep.echo_texts[i // req.n] if req.echo else ""
        lp = (R.completion_logprobs(a.logprobs, prep.top_logprobs, len(prefix))
              if req.logprobs is not None else None)
        choices.append(R.completion_choice(i, prefix + "".join(a.text), R.finish(a.reason), lp))
    ctoks = sum(a.tokens for a in accs.values())
    return Completion(R.completion_body(
        id=R.new_id("cmpl"), model=req.model, created=R.now(), choices=choices,
        usage_=R.usage(ptoks, ctoks, cached),
    ))


# -------------------------------------------------------------------------- streaming


async def _chat_stream(steps: AsyncGenerator[tuple[int, EngineOutput], None],
                       req: ChatCompletionRequest, prep: Prepared, ctx: RequestContext,
                       ) -> AsyncIterator[dict[str, Any]]:
    cid, created, model = R.new_id("chatcmpl"), R.now(), req.model
    include_usage = req.include_usage
    started: set[int] = set()
    finished: set[int] = set()
    trackers = [prep.tracker() for _ in range(req.n)]
    ptoks = ctoks = cached = 0
    async with aclosing(steps):
        async for _, out in steps:
            ptoks, cached = out.prompt_tokens, out.cached_tokens
            choices = []
            for c in out.choices:
                ctoks += len(c.token_ids)
                if c.index in finished:
                    continue
                reason = R.finish(c.finish_reason) if c.finish_reason else None
                text, calls, reason = trackers[c.index].step(c.text, c.token_ids, reason)
                if not text and not calls and reason is None and c.index in started:
                    continue
                lp = (R.chat_logprobs(c.logprobs or [], prep.top_logprobs)
                      if req.logprobs else None)
                choices.append(T.with_call_deltas(R.chat_chunk_choice(
                    c.index, content=text, first=c.index not in started, reason=reason,
                    logprobs=lp), calls))
                started.add(c.index)
                if reason:
                    finished.add(c.index)
            if choices:
                yield R.chat_chunk(id=cid, model=model, created=created, choices=choices,
                                   include_usage=include_usage)
    missing = [i for i in range(req.n) if i not in finished]
    if missing:  # the engine ended without a reason for some choice: close it once
        yield R.chat_chunk(id=cid, model=model, created=created, include_usage=include_usage,
                           choices=[R.chat_chunk_choice(i, content=None if i in started else "",
                                                        first=i not in started, reason="stop",
                                                        logprobs=None) for i in missing])
    ctx.usage = R.usage(ptoks, ctoks, cached)
    if include_usage:
        yield R.usage_chunk(id=cid, model=model, created=created,
                            object_="chat.completion.chunk", usage_=ctx.usage)


async def _completion_stream(steps: AsyncGenerator[tuple[int, EngineOutput], None],
                             req: CompletionRequest, prep: Prepared, ctx: RequestContext,
                             ) -> AsyncIterator[dict[str, Any]]:
    cid, created, model = R.new_id("cmpl"), R.now(), req.model
    total = req.n * len(prep.prompts)
    finished: set[int] = set()
    echoed: set[int] = set()
    ptoks: dict[int, int] = {}
    ctoks = cached = 0
    offsets: dict[int, int] = {}
    async with aclosing(steps):
        async for pi, out in steps:
            if pi not in ptoks:
                ptoks[pi] = out.prompt_tokens
                cached += out.cached_tokens
            choices = []
            for c in out.choices:
                idx = pi * req.n + c.index
                ctoks += len(c.token_ids)
                if idx in finished:
                    continue
                text = c.text
                if req.echo and idx not in echoed:
                    text = prep.echo_texts[pi] + text
                    echoed.add(idx)
                reason = R.finish(c.finish_reason) if c.finish_reason else None
                if not text and reason is None:
                    continue
                lp = None
                if req.logprobs is not None:
                    lp = R.completion_logprobs(c.logprobs or [], prep.top_logprobs,
                                               offsets.get(idx, 0))
                offsets[idx] = offsets.get(idx, 0) + len(text)
                choices.append(R.completion_choice(idx, text, reason, lp))
                if reason:
                    finished.add(idx)
            if choices:
                yield R.completion_body(id=cid, model=model, created=created, choices=choices,
                                        usage_=None)
    missing = [i for i in range(total) if i not in finished]
    if missing:
        yield R.completion_body(id=cid, model=model, created=created, usage_=None,
                                choices=[R.completion_choice(i, "", "stop", None)
                                         for i in missing])
    ctx.usage = R.usage(sum(ptoks.values()), ctoks, cached)
    if req.include_usage:
        yield R.usage_chunk(id=cid, model=model, created=created, object_="text_completion",
                            usage_=ctx.usage)
