"""Fallback replies: a static answer in OpenAI's shapes (whole or streamed), given only to
requests a fixed text can answer."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from proxy import responses as R
from proxy.chain import Completion, Reply, Stream
from proxy.context import RequestContext
from proxy.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    NamedToolChoice,
    continuous_usage,
)


def static_fits(ctx: RequestContext, text: str) -> bool:
    """Whether a fixed text answers the request as asked. Not: a forced tool call
    (`required` or a named function: the client expects a call), a JSON schema (the text
    does not follow it), JSON mode with a text that is not a JSON object, logprobs (there
    are none to give), or an echoed prompt. Such a request goes on to the next fallback,
    or gets its error, rather than a 200 that breaks the contract it asked for."""
    req = ctx.request
    if isinstance(req, ChatCompletionRequest):
        if req.logprobs or req.tool_choice == "required" or isinstance(
                req.tool_choice, NamedToolChoice):
            return False
    elif isinstance(req, CompletionRequest):
        if req.logprobs is not None or req.echo:
            return False
    else:
        return False
    fmt = req.response_format
    if fmt is None or fmt.type == "text":
        return True
    if fmt.type == "json_schema":
        return False
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def static_reply(ctx: RequestContext, text: str) -> Reply:
    """The text as every choice the request asks for (`n` per prompt), with no usage (a
    stream says so on the Stream too: without it the rate limiter charged a completed
    stream its whole reservation, where the same answer whole was charged nothing)."""
    model, created, count = ctx.model, R.now(), ctx.request.sequences
    if ctx.route == "chat":
        if not ctx.stream:
            return Completion(R.chat_completion(
                id=R.new_id("chatcmpl"), model=model, created=created, usage_=R.usage(0, 0),
                choices=[R.chat_choice(i, text, "stop", None) for i in range(count)]))
        stream = Stream(_chat_chunks(ctx, text, count), whole=True)
    elif not ctx.stream:
        return Completion(R.completion_body(
            id=R.new_id("cmpl"), model=model, created=created, usage_=R.usage(0, 0),
            choices=[R.completion_choice(i, text, "stop", None) for i in range(count)]))
    else:
        stream = Stream(_completion_chunks(ctx, text, count), whole=True)
    stream.usage = R.usage(0, 0)
    return stream


async def _chat_chunks(ctx: RequestContext, text: str,
                       count: int) -> AsyncIterator[dict[str, Any]]:
    cid, created, usage = R.new_id("chatcmpl"), R.now(), ctx.request.include_usage
    yield R.chat_chunk(id=cid, model=ctx.model, created=created, include_usage=usage,
                       usage_=R.usage(0, 0) if continuous_usage(ctx.request) else None,
                       choices=[R.chat_chunk_choice(i, content=text, first=True, reason="stop",
                                                    logprobs=None) for i in range(count)])
    if usage:
        yield R.usage_chunk(id=cid, model=ctx.model, created=created,
                            object_="chat.completion.chunk", usage_=R.usage(0, 0))


async def _completion_chunks(ctx: RequestContext, text: str,
                             count: int) -> AsyncIterator[dict[str, Any]]:
    cid, created = R.new_id("cmpl"), R.now()
    yield R.completion_body(id=cid, model=ctx.model, created=created,
                            usage_=R.usage(0, 0) if continuous_usage(ctx.request) else None,
                            choices=[R.completion_choice(i, text, "stop", None)
                                     for i in range(count)])
    if ctx.request.include_usage:
        yield R.usage_chunk(id=cid, model=ctx.model, created=created, object_="text_completion",
                            usage_=R.usage(0, 0))
