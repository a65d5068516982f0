"""Fallback replies: a static answer in OpenAI's shapes (whole or streamed)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from proxy import responses as R
from proxy.chain import Completion, Reply, Stream
from proxy.context import RequestContext


def static_reply(ctx: RequestContext, text: str) -> Reply:
    model, created = ctx.model, R.now()
    if ctx.route == "chat":
        if not ctx.stream:
            return Completion(R.chat_completion(
                id=R.new_id("chatcmpl"), model=model, created=created, usage_=R.usage(0, 0),
                choices=[R.chat_choice(0, text, "stop", None)]))
        return Stream(_chat_chunks(ctx, text), whole=True)
    if not ctx.stream:
        return Completion(R.completion_body(
            id=R.new_id("cmpl"), model=model, created=created, usage_=R.usage(0, 0),
            choices=[R.completion_choice(0, text, "stop", None)]))
    return Stream(_completion_chunks(ctx, text), whole=True)


async def _chat_chunks(ctx: RequestContext, text: str) -> AsyncIterator[dict[str, Any]]:
    cid, created, usage = R.new_id("chatcmpl"), R.now(), ctx.request.include_usage
    yield R.chat_chunk(id=cid, model=ctx.model, created=created, include_usage=usage,
                       choices=[R.chat_chunk_choice(0, content=text, first=True, reason="stop",
                                                    logprobs=None)])
    if usage:
        yield R.usage_chunk(id=cid, model=ctx.model, created=created,
                            object_="chat.completion.chunk", usage_=R.usage(0, 0))


async def _completion_chunks(ctx: RequestContext, text: str) -> AsyncIterator[dict[str, Any]]:
    cid, created = R.new_id("cmpl"), R.now()
    yield R.completion_body(id=cid, model=ctx.model, created=created, usage_=None,
                            choices=[R.completion_choice(0, text, "stop", None)])
    if ctx.request.include_usage:
        yield R.usage_chunk(id=cid, model=ctx.model, created=created, object_="text_completion",
                            usage_=R.usage(0, 0))
