"""Engine outputs rendered as OpenAI answers: whole, or as stream chunks.

One per-choice tracker (`Choices`) serves every renderer, so the bookkeeping the four
shapes share (which choice has started, which has finished, text so far, token counts,
the usage) is written once. A streamed choice's role comes in its first delta, its
finish reason exactly once; a choice the engine ended without a reason is closed with
`stop` after the last output. When a stream ends normally the renderer leaves `usage`
and `answer` (the choices' text and finish reasons) on its Stream, for the plugins that
settle tokens or store the answer: they never re-parse the chunks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import responses as R
from . import tools as T
from .chain import Completion, Stream
from .engine.base import ChoiceDelta, EngineOutput, TokenLogprob
from .errors import InvalidRequest
from .generation import ENGINE_ERRORS, EngineSpan, map_engine_error
from .protocol import ChatCompletionRequest, CompletionRequest, continuous_usage
from .streaming import SHUTDOWN

if TYPE_CHECKING:
    from .context import RequestContext
    from .preparing import Prepared

Request = ChatCompletionRequest | CompletionRequest

#: Logprob entries (each token's, and each of its alternatives) a whole answer holds at
#: most, its choices' and echoed prompts' together: ~250 bytes each in memory while the
#: body is built (~60 in its JSON). Unbounded, `n: 128` with `top_logprobs: 20` built
#: gigabytes for one request (10 KB a token) before anything went out. A stream holds
#: none of it: it is the way to such answers.
MAX_WHOLE_LOGPROBS = 1 << 19


class AnswerTooLarge(InvalidRequest):
    """A whole answer's logprobs past `MAX_WHOLE_LOGPROBS`: its generation is stopped."""

    default_code = "answer_too_large"

    def __init__(self, param: str) -> None:
        super().__init__(
            f"The answer's logprobs are larger than this server builds in one response "
            f"({MAX_WHOLE_LOGPROBS} tokens and alternatives in all): ask for fewer choices, "
            f"tokens or logprobs, or stream the answer (`stream: true`).", param=param)


@dataclass(slots=True)
class _Choice:
    text: list[str] = field(default_factory=list)
    tokens: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)
    reason: str | None = None
    #: What ended it (vLLM's `stop_reason`: a stop string or stop token id), once ended.
    stop_reason: int | str | None = None
    started: bool = False
    # A stream's logprob entries of steps that sent nothing (text held back while a stop
    # string or a tool call might be forming): they go out with the next chunk.
    held: list[TokenLogprob] = field(default_factory=list)

    def entries(self, new: list[TokenLogprob] | None) -> list[TokenLogprob]:
        """The held entries and `new`, to go out now."""
        out, self.held = self.held + (new or []), []
        return out


class Choices:
    """Every choice of one answer (n per prompt), indexed as OpenAI numbers them.

    Also the engine call's bookkeeping, as a context manager around the loop over its
    outputs: the span's first-token event and token counts, engine exceptions mapped to
    OpenAI errors on the way out, and an answer cut short left with the usage spent so
    far, which the rate limiter charges: on its stream (`stream.usage`, any early end: the
    tokens reached the client; a stream that ends normally sets its own) and, when the
    client or the deadline cut it, on the request (`ctx.usage_so_far`: the answer never
    came back, but the engine read its prompt and generated; a drain's cut is not
    charged, its 503 says to retry elsewhere)."""

    __slots__ = ("_ctx", "_prep", "_prompt_tokens", "_span", "_stream", "by_index", "cached",
                 "n", "prompt_logprobs", "total")

    def __init__(self, n: int, prep: Prepared, span: EngineSpan, ctx: RequestContext,
                 stream: Stream | None = None) -> None:
        self._stream = stream
        self._ctx = ctx
        self._prep = prep
        self.n = n
        self.total = n * len(prep.prompts)
        self.by_index: dict[int, _Choice] = {}
        self._prompt_tokens: dict[int, int] = {}
        #: Each prompt's own logprobs (a completion's `echo` with `logprobs`), by prompt.
        self.prompt_logprobs: dict[int, list[TokenLogprob]] = {}
        self.cached = 0
        self._span: EngineSpan | None = span

    def __enter__(self) -> Choices:
        return self

    def __exit__(self, kind: type[BaseException] | None, e: BaseException | None,
                 tb: Any) -> None:
        if self._span is not None:
            u = self.usage()
            # (the error as the client gets it: an engine's refusal is a 400, no failure)
            self._span.end(u["prompt_tokens"], u["completion_tokens"],
                           map_engine_error(e) if e is not None else None)
            self._span = None
        if e is not None:
            if self._ctx.engine_ttft_s is None and self._prep.options.generated:
                # a whole answer cut before its end had tokens all the same (when the
                # first came is not known): an engine at work, not a hung one
                self._ctx.engine_ttft_s = 0.0
            spent = self._spent()
            if self._stream is not None and self._stream.usage is None:
                self._stream.usage = spent
            if ((isinstance(e, asyncio.CancelledError) and e.args != (SHUTDOWN,))
                    or isinstance(e, AnswerTooLarge)):  # (a drain's cut is a 503: nothing)
                self._ctx.usage_so_far = spent
        if isinstance(e, ENGINE_ERRORS):
            raise map_engine_error(e) from e

    def output(self, out: EngineOutput) -> None:
        if out.prompt_index not in self._prompt_tokens:
            if not self._prompt_tokens and self._span is not None:
                self._span.first_token()
            self._prompt_tokens[out.prompt_index] = out.prompt_tokens
            self.cached += out.cached_tokens
        if out.prompt_logprobs is not None:
            self.prompt_logprobs[out.prompt_index] = out.prompt_logprobs
        if self._ctx.engine_ttft_s is None:  # the first prompt's first token: the call's
            self._ctx.engine_ttft_s = (out.ttft_s if out.ttft_s is not None else
                                       time.monotonic() - (self._ctx.engine_started
                                                           or self._ctx.started))

    def choice(self, out: EngineOutput, c: ChoiceDelta) -> tuple[int, _Choice]:
        idx = out.prompt_index * self.n + c.index
        ch = self.by_index.get(idx)
        if ch is None:
            ch = self.by_index[idx] = _Choice()
        if not self._prep.echo_only:  # (its one token is not the answer's: none shown)
            ch.tokens += len(c.token_ids)
        return idx, ch

    def unfinished(self) -> list[int]:
        return [i for i in range(self.total)
                if (c := self.by_index.get(i)) is None or c.reason is None]

    def counts(self, idx: int) -> dict[str, int]:
        """One choice's own tokens so far: its prompt's, and those it generated."""
        ch = self.by_index.get(idx)
        return {"prompt_tokens": self._prompt_tokens.get(idx // self.n, 0),
                "completion_tokens": ch.tokens if ch else 0}

    def choice_usage(self, idx: int) -> dict[str, Any]:
        """One choice's usage so far, as vLLM's `continuous_usage_stats` puts it in the
        chunk that carries that choice (one choice a chunk): its prompt's tokens and the
        tokens that choice generated, not the answer's totals."""
        c = self.counts(idx)
        return R.usage(c["prompt_tokens"], c["completion_tokens"])

    def running(self, choices: list[dict[str, Any]]
                ) -> Iterator[tuple[list[dict[str, Any]], dict[str, Any]]]:
        """A chunk's choices split one a chunk, each with its choice's usage so far
        (`continuous_usage_stats`, as vLLM's server sends them)."""
        for c in choices:
            yield [c], self.choice_usage(c["index"])

    def usage(self) -> dict[str, Any]:
        return R.usage(sum(self._prompt_tokens.values()),
                       sum(c.tokens for c in self.by_index.values()), self.cached)

    def _spent(self) -> dict[str, Any]:
        """The usage until an early end: the prompts the engine had read (their first
        tokens out), and the tokens generated: those that came out, and what an engine
        that hands over only final outputs says the prompts it was cut on generated
        (`options.generated`; they never came out)."""
        generated = self._prep.options.generated
        prompt = sum(self._prompt_tokens.values())
        if generated and len(self._prompt_tokens) < len(self._prep.prompts):
            prompt = sum(map(len, self._prep.prompts))  # (cut ones read theirs: no finer)
        return R.usage(prompt, sum(c.tokens for c in self.by_index.values()) + generated,
                       self.cached)

    def answer(self) -> list[dict[str, Any]]:
        """Each choice's text, finish and stop reasons, and own usage (`counts`: what a
        replay of it gives its chunks with `continuous_usage_stats`)."""
        return [{"index": i, "text": "".join(c.text), "finish_reason": c.reason or "stop",
                 "stop_reason": c.stop_reason, "usage": self.counts(i)}
                for i, c in sorted(self.by_index.items())]

    def usages(self) -> dict[int, dict[str, int]]:
        """Each choice's own usage by its index (`Completion.usages`)."""
        return {i: self.counts(i) for i in self.by_index}


# ------------------------------------------------------------------------ whole answers


async def whole(outputs: AsyncGenerator[EngineOutput, None], req: Request, prep: Prepared,
                span: EngineSpan, ctx: RequestContext) -> Completion:
    """Collect every output, then build the body."""
    track = Choices(req.n, prep, span, ctx)
    # A tool parser reads the answer as the stream would (step by step), so a whole
    # answer is what its stream would have sent, assembled (or its text, where a call's
    # arguments are no JSON object: `StreamCalls.text_instead`).
    calls = T.StreamCalls(prep.tracker) if prep.streams_calls else None
    per_token = 1 + prep.top_logprobs
    logprobs = 0  # entries held
    with track:
        async with aclosing(outputs):
            async for out in outputs:
                track.output(out)
                logprobs += per_token * (len(out.prompt_logprobs or ()) + sum(
                    len(c.logprobs) for c in out.choices if c.logprobs))
                if logprobs > MAX_WHOLE_LOGPROBS:  # (closing `outputs` stops the engine)
                    raise AnswerTooLarge("top_logprobs" if isinstance(
                        req, ChatCompletionRequest) and req.top_logprobs else "logprobs")
                for c in out.choices:
                    idx, ch = track.choice(out, c)
                    text: str | None = c.text
                    reason = c.finish_reason
                    if calls is not None and ch.reason is None:
                        text, _, reason = calls.step(idx, c.text, c.token_ids,
                                                     R.finish(reason) if reason else None)
                    ch.text.append(text or "")
                    if c.logprobs:
                        ch.logprobs.extend(c.logprobs)
                    if reason:
                        ch.reason = reason
                    if c.finish_reason:
                        ch.stop_reason = c.stop_reason
    for i in track.unfinished():
        track.by_index.setdefault(i, _Choice()).reason = "stop"
    usage = track.usage()
    if isinstance(req, ChatCompletionRequest):
        def choice(i: int, ch: _Choice) -> dict[str, Any]:
            lp = R.chat_logprobs(ch.logprobs, prep.top_logprobs) if req.logprobs else None
            if calls is None:
                return T.whole_choice(prep.tracker, R.chat_choice(
                    i, "".join(ch.text), R.finish(ch.reason), lp, ch.stop_reason))
            text = calls.text_instead(i)
            if text is not None:  # (a call no client can run: its reason is no tool_calls)
                return R.chat_choice(i, text, R.finish(ch.reason), lp, ch.stop_reason)
            reason = ch.reason if ch.reason == "tool_calls" else R.finish(ch.reason)
            return T.with_calls(R.chat_choice(i, "".join(ch.text), reason, lp, ch.stop_reason),
                                calls.calls(i))

        choices = [choice(i, ch) for i, ch in sorted(track.by_index.items())]
        return Completion(R.chat_completion(id=R.new_id("chatcmpl"), model=req.model,
                                            created=R.now(), choices=choices, usage_=usage),
                          order=calls.order(0) if calls is not None
                          and calls.text_instead(0) is None else None,
                          usages=track.usages())
    out_choices = []
    for i, ch in sorted(track.by_index.items()):
        prefix = prep.echo_texts[i // req.n] if req.echo else ""
        # `max_tokens: 0`: the engine's one token is not part of the answer
        text, entries = ("", []) if prep.echo_only else ("".join(ch.text), ch.logprobs)
        lp = (R.completion_logprobs(entries, prep.top_logprobs, len(prefix),
                                    track.prompt_logprobs.get(i // req.n))
              if req.logprobs is not None else None)
        out_choices.append(R.completion_choice(
            i, prefix + text, _completion_finish(prep, ch.reason), lp,
            None if prep.echo_only else ch.stop_reason))
    return Completion(R.completion_body(id=R.new_id("cmpl"), model=req.model,
                                        created=R.now(), choices=out_choices, usage_=usage),
                      usages=track.usages())


def _completion_finish(prep: Prepared, reason: str | None) -> str:
    """A completion choice's finish reason: the engine's in OpenAI's terms ("stop" where
    it gave none), and "length" for `max_tokens: 0` (its one hidden token is not the
    answer: the answer stopped at its limit, as OpenAI's says)."""
    return "length" if prep.echo_only else R.finish(reason)


# ------------------------------------------------------------------------------ streams


def chunks(outputs: AsyncGenerator[EngineOutput, None], req: Request, prep: Prepared,
           span: EngineSpan, ctx: RequestContext, stream: Stream
           ) -> AsyncIterator[dict[str, Any]]:
    track = Choices(req.n, prep, span, ctx, stream)
    if isinstance(req, ChatCompletionRequest):
        return _chat_chunks(outputs, req, prep, track, stream)
    return _completion_chunks(outputs, req, prep, track, stream)


async def _chat_chunks(outputs: AsyncGenerator[EngineOutput, None], req: ChatCompletionRequest,
                       prep: Prepared, track: Choices,
                       stream: Stream) -> AsyncIterator[dict[str, Any]]:
    cid, created, model = R.new_id("chatcmpl"), R.now(), req.model
    include_usage, running = req.include_usage, continuous_usage(req)
    want_logprobs = bool(req.logprobs)
    calls = T.StreamCalls(prep.tracker)
    tooled = prep.tracker is not None  # (else every step is its text: no call to step)
    # No tool, logprobs or running usage: a started choice's text delta is built here, as
    # R.chat_chunk_choice and R.chat_chunk build it (the steady state, a chunk a token)
    plain = not tooled and not want_logprobs and not running
    with track:
        async with aclosing(outputs):
            async for out in outputs:
                track.output(out)
                choices = []
                for c in out.choices:
                    idx, ch = track.choice(out, c)
                    if ch.reason is not None:
                        continue
                    if plain and ch.started and not c.finish_reason:
                        if c.text:
                            ch.text.append(c.text)
                            choices.append({"index": idx, "delta": {"content": c.text},
                                            "logprobs": None, "finish_reason": None})
                        continue
                    reason = R.finish(c.finish_reason) if c.finish_reason else None
                    if tooled:
                        text, deltas, reason = calls.step(idx, c.text, c.token_ids, reason)
                    else:
                        text, deltas = c.text, []
                    shows = want_logprobs and calls.has_text(idx)
                    if not text and not deltas and reason is None and ch.started:
                        if shows:
                            ch.held += c.logprobs or []
                        continue
                    ch.text.append(text or "")
                    lp = (R.chat_logprobs(ch.entries(c.logprobs), prep.top_logprobs)
                          if shows else None)
                    stop_reason = c.stop_reason if reason is not None else None
                    choice = R.chat_chunk_choice(
                        idx, content=text, first=not ch.started, reason=reason, logprobs=lp,
                        stop_reason=stop_reason)
                    choices.append(T.with_call_deltas(choice, deltas) if deltas else choice)
                    ch.started = True
                    ch.reason, ch.stop_reason = reason, stop_reason
                if not choices:
                    continue
                # (no call deltas without a tracker: nothing to take apart; no running
                # usage: the chunk as it is, with none)
                if plain:
                    chunk = {"id": cid, "object": "chat.completion.chunk",
                             "created": created, "model": model, "choices": choices}
                    if include_usage:
                        chunk["usage"] = None
                    yield chunk
                    continue
                for part in T.finish_apart(choices) if tooled else (choices,):
                    if not running:
                        yield R.chat_chunk(id=cid, model=model, created=created, choices=part,
                                           include_usage=include_usage)
                        continue
                    for each, so_far in track.running(part):
                        yield R.chat_chunk(id=cid, model=model, created=created, choices=each,
                                           include_usage=include_usage, usage_=so_far)
    stream.usage = track.usage()  # (before the closing chunk: a cut there is charged)
    missing = track.unfinished()
    if missing:  # the engine ended without a reason for some choice: close it once
        closing = []
        for i in missing:
            ch = track.by_index.setdefault(i, _Choice())
            closing.append(R.chat_chunk_choice(i, content=None if ch.started else "",
                                               first=not ch.started, reason="stop",
                                               logprobs=None))
            ch.reason = "stop"
        for each, usage in _split(track, closing, running):
            yield R.chat_chunk(id=cid, model=model, created=created,
                               include_usage=include_usage, choices=each, usage_=usage)
    stream.answer = calls.answer(track.answer())
    if include_usage:
        yield R.usage_chunk(id=cid, model=model, created=created,
                            object_="chat.completion.chunk", usage_=stream.usage)


async def _completion_chunks(outputs: AsyncGenerator[EngineOutput, None], req: CompletionRequest,
                             prep: Prepared, track: Choices,
                             stream: Stream) -> AsyncIterator[dict[str, Any]]:
    cid, created, model = R.new_id("cmpl"), R.now(), req.model
    running = continuous_usage(req)
    offsets: dict[int, int] = {}  # where a choice's next token sits in its text
    with track:
        async with aclosing(outputs):
            async for out in outputs:
                track.output(out)
                choices = []
                for c in out.choices:
                    idx, ch = track.choice(out, c)
                    if ch.reason is not None:
                        continue
                    # `max_tokens: 0`: the engine's one token is not part of the answer
                    text, new = ("", None) if prep.echo_only else (c.text, c.logprobs)
                    prompt_lp = None
                    if req.echo and not ch.started:
                        text = prep.echo_texts[out.prompt_index] + text
                        offsets[idx] = len(prep.echo_texts[out.prompt_index])
                        prompt_lp = track.prompt_logprobs.get(out.prompt_index)
                    ch.started = True
                    reason = _completion_finish(prep, c.finish_reason) if c.finish_reason else None
                    if not text and reason is None:
                        if req.logprobs is not None:  # (an echo of no text: its entries too)
                            ch.held += [*(prompt_lp or []), *(new or [])]
                        continue
                    ch.text.append(text)
                    lp = None
                    if req.logprobs is not None:
                        entries = ch.entries(new)
                        lp = R.completion_logprobs(entries, prep.top_logprobs,
                                                   offsets.get(idx, 0), prompt_lp)
                        # each token's place in the text: advanced by the tokens reported,
                        # not the text sent (text held back for a stop string lags them)
                        offsets[idx] = offsets.get(idx, 0) + sum(len(e.token) for e in entries)
                    stop_reason = (c.stop_reason if reason is not None and not prep.echo_only
                                   else None)
                    choices.append(R.completion_choice(idx, text, reason, lp, stop_reason))
                    ch.reason, ch.stop_reason = reason, stop_reason
                for each, usage in _split(track, choices, running) if choices else ():
                    yield R.completion_body(id=cid, model=model, created=created,
                                            choices=each, usage_=usage)
    stream.usage = track.usage()  # (before the closing chunk: a cut there is charged)
    missing = track.unfinished()
    if missing:
        closing = _completion_finish(prep, None)  # (as the whole answer says)
        for i in missing:
            track.by_index.setdefault(i, _Choice()).reason = closing
        for each, usage in _split(track, [R.completion_choice(i, "", closing, None)
                                          for i in missing], running):
            yield R.completion_body(id=cid, model=model, created=created, usage_=usage,
                                    choices=each)
    stream.answer = track.answer()
    if req.include_usage:
        yield R.usage_chunk(id=cid, model=model, created=created, object_="text_completion",
                            usage_=stream.usage)


def _split(track: Choices, choices: list[dict[str, Any]], running: bool
           ) -> Iterator[tuple[list[dict[str, Any]], dict[str, Any] | None]]:
    """A chunk's choices as the chunks to send, with their usage: all in one without
    `continuous_usage_stats`, else one a chunk, each with its choice's usage so far."""
    if running:
        yield from track.running(choices)
    else:
        yield choices, None


#: The most a count an upstream sends (a usage's tokens, a choice's index) may be: past
#: it a JSON number is no exact integer to a JavaScript client, and no answer's count.
MAX_COUNT = (1 << 53) - 1


def is_count(value: Any) -> bool:
    """Whether `value` (an upstream's JSON) is a count: a whole number from 0 to
    `MAX_COUNT`; not `true` (Python's `isinstance(True, int)` read it as 1), `1.0`, a
    negative one or one of a hundred digits."""
    return type(value) is int and 0 <= value <= MAX_COUNT


def as_count(value: Any) -> int | None:
    """An upstream's usage count (`is_count`) as an int, None where it is none: a whole
    float (`12.0`, as a server that sums its counts in floats sends them) is the int it
    is, as JSON has one number type; `2.5`, `-1.0`, `true` or `"3"` is no count."""
    if type(value) is float and value.is_integer():
        value = int(value)
    return value if is_count(value) else None


def usage_ok(usage: Any) -> bool:
    """Whether `usage` (an upstream's) counts tokens as OpenAI's does: its prompt's and
    completion's tokens as counts (`as_count`: `12.0` is 12), and each number its
    breakdowns give (`prompt_tokens_details`, ...) too; a breakdown's null, text or
    object is no count and is dropped (`R.usage_details`), but a number that is no
    count (`true`, `-3`, `2.5`) is a usage misread, not one to drop."""
    if not isinstance(usage, dict) or not all(
            as_count(usage.get(k)) is not None for k in ("prompt_tokens", "completion_tokens")):
        return False
    for name in R.USAGE_DETAILS:
        d = usage.get(name)
        if isinstance(d, dict) and not all(
                as_count(v) is not None for v in d.values() if isinstance(v, int | float)):
            return False
    return True


def whole_usage(usage: dict[str, Any]) -> dict[str, Any]:
    """An upstream's usage (`usage_ok`) as OpenAI's, in dicts of its own: its counts
    (ints: a whole float's too), their sum as its total, and its breakdowns. Nothing
    else: OpenAI's `CompletionUsage` allows keys of a server's own, but this usage is
    what Weir counts, stores and replays, and such keys are not counts of this answer
    (Groq's `queue_time`, one request's timing, replayed stale by the cache; DeepSeek's
    `prompt_cache_hit_tokens`, the miss's prompt's, wrong for a semantic hit's). The
    chunk's own fields (Groq's `x_groq`) pass on as they came."""
    details = {name: {k: as_count(v) if type(v) is float else v for k, v in d.items()}
               for name in R.USAGE_DETAILS if isinstance(d := usage.get(name), dict)}
    prompt, completion = as_count(usage["prompt_tokens"]), as_count(usage["completion_tokens"])
    return {**R.usage(prompt or 0, completion or 0), **R.usage_details(details)}


class ChunkAssembler:
    """A stream's answer and usage assembled from its chunks, for producers that relay
    chunks they did not render (an upstream server's)."""

    def __init__(self, route: str) -> None:
        self.route = route
        self.texts: dict[int, list[str]] = {}
        self.calls: dict[int, T.CallAssembler] = {}
        self.reasons: dict[int, str] = {}
        self.stop_reasons: dict[int, Any] = {}  # what the upstream said ended each
        self.usage: dict[str, Any] | None = None  # the upstream's, as OpenAI's usage
        self.error = False
        #: Pieces of text relayed: a stream's tokens, as OpenAI-compatible servers stream
        #: one (or a few) per chunk.
        self.pieces = 0

    def feed(self, chunk: dict[str, Any]) -> None:
        if "error" in chunk:
            self.error = True
            return
        for c in chunk.get("choices") or []:
            i = c["index"]
            delta = c.get("delta") or {}
            piece = delta.get("content") if self.route == "chat" else c.get("text")
            reason = c.get("finish_reason")
            if (piece is not None and not isinstance(piece, str)) or not is_count(i) or (
                    reason is not None and not isinstance(reason, str)):  # (`false`: no none)
                raise TypeError("a choice's index, text or finish reason")
            calls = delta.get("tool_calls") if self.route == "chat" else None
            if calls and (not isinstance(calls, list) or not all(
                    isinstance(d, dict) and is_count(d.get("index")) for d in calls)):
                raise TypeError("a tool call's index")
            self.texts.setdefault(i, []).append(piece or "")
            if calls:
                self.calls.setdefault(i, T.CallAssembler()).feed(calls)
            self.pieces += bool(piece or delta.get("tool_calls")
                                or delta.get("reasoning_content"))
            if reason and i not in self.reasons:  # (the first stands)
                self.reasons[i] = reason
                if "stop_reason" in c:  # (vLLM's; OpenAI's servers send none)
                    self.stop_reasons[i] = c["stop_reason"]
        if chunk.get("usage"):
            u = chunk["usage"]
            if not usage_ok(u):
                raise ValueError("usage")
            self.usage = whole_usage(u)

    def cut(self, stream: Stream) -> None:
        """The stream ended before the upstream's last chunk: leave what it reported, or
        else the pieces relayed as the tokens generated, and no prompt count (not known:
        a 0 would be logged and counted as one; the rate limiter charges its estimate)."""
        if stream.usage is None:
            stream.usage = self.usage if self.usage is not None else {
                "completion_tokens": self.pieces, "total_tokens": self.pieces}

    def ended(self) -> bool:
        """Whether some choice came, and each that came ended (its `finish_reason`)."""
        return bool(self.texts) and set(self.texts) <= set(self.reasons)

    def came(self, choices: int) -> int | None:
        """None where each of the answer's `choices` (indices 0 to `choices` - 1) came,
        else how many of them did (0: none of them, whatever other indices came)."""
        got = len(set(range(choices)) & set(self.texts))
        return None if got == choices else got

    def finish(self, stream: Stream) -> None:
        """Leave the answer (when every choice ended) and the usage on `stream`."""
        if self.usage is not None:
            stream.usage = self.usage
        if self.error or not self.texts or set(self.texts) != set(self.reasons):
            return
        # (each choice's pieces let go as its text is joined: not two copies of the answer)
        answer = [{"index": i, "text": "".join(self.texts.pop(i)),
                   "finish_reason": self.reasons[i]} for i in sorted(self.texts)]
        for c in answer:
            if c["index"] in self.stop_reasons:
                c["stop_reason"] = self.stop_reasons[c["index"]]
            if c["index"] in self.calls:
                c["tool_calls"] = self.calls[c["index"]].result()
        stream.answer = answer


class ChatAssembly:
    """A chat completion put back together from its stream's chunks (pieces kept in lists,
    joined once at the end): the one stored (`stored_chat`), and the whole answer an
    upstream streamed to a request for one (`upstream`)."""

    def __init__(self) -> None:
        self.head: dict[str, Any] | None = None
        self.choices: dict[int, _ChatPieces] = {}
        self.usage: dict[str, Any] | None = None
        self.broken = False

    def add(self, chunk: dict[str, Any]) -> None:
        if self.head is None:
            self.head = {"id": chunk["id"], "object": "chat.completion",
                         "created": chunk["created"], "model": chunk["model"]}
            for told in ("system_fingerprint", "service_tier"):
                if chunk.get(told) is not None:
                    self.head[told] = chunk[told]
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for c in chunk.get("choices") or ():
            i = c["index"]
            (self.choices.get(i) or self.choices.setdefault(i, _ChatPieces())).add(c)

    def completion(self, usage: dict[str, Any] | None) -> dict[str, Any] | None:
        if self.head is None:
            return None
        choices = [self.choices[i].whole(i) for i in sorted(self.choices)]
        # (none known, an upstream's that sent none: absent, as a whole answer's is;
        # OpenAI's chat completion has no `usage: null`)
        known = self.usage or usage
        return {**self.head, "choices": choices, **({"usage": known} if known else {})}


_CHAT_TEXTS = ("content", "refusal")


class _ChatPieces:
    """One choice's pieces: texts and logprobs by field (a field never sent stays null),
    calls, finish reason (and vLLM's `stop_reason` beside it)."""

    __slots__ = ("calls", "logprobs", "reason", "stop_reason", "texts")

    def __init__(self) -> None:
        self.texts: dict[str, list[str]] = {}
        self.logprobs: dict[str, list[Any]] | None = None
        self.calls = T.CallAssembler()
        self.reason: str | None = None
        self.stop_reason: int | str | None = None

    def add(self, c: dict[str, Any]) -> None:
        delta = c.get("delta") or {}
        for name in _CHAT_TEXTS:
            if delta.get(name) is not None:
                self.texts.setdefault(name, []).append(delta[name])
        if delta.get("tool_calls"):
            self.calls.feed(delta["tool_calls"])
        if c.get("logprobs"):
            held = self.logprobs = self.logprobs if self.logprobs is not None else {}
            for name in _CHAT_TEXTS:
                if c["logprobs"].get(name) is not None:
                    held.setdefault(name, []).extend(c["logprobs"][name])
        if c.get("finish_reason") is not None:
            self.reason = c["finish_reason"]
            self.stop_reason = c.get("stop_reason")

    def whole(self, index: int) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", **{
            n: "".join(self.texts[n]) if n in self.texts else None for n in _CHAT_TEXTS}}
        if self.calls.calls:
            message["tool_calls"] = self.calls.result()
        logprobs = None if self.logprobs is None else {
            f: self.logprobs.get(f) for f in _CHAT_TEXTS}
        return {"index": index, "message": message, "logprobs": logprobs,
                "finish_reason": self.reason, "stop_reason": self.stop_reason}
