"""The breaker's static fallback (plugins/breaker/fallback.py): a fixed answer in the
shape the request asked for, whole or streamed, chat or completion, with usage when asked,
each validated against OpenAI's schemas."""

from __future__ import annotations

from typing import Any

import pytest

from plugins.breaker.fallback import static_reply
from proxy.auth import Principal
from proxy.chain import Completion, Stream
from proxy.context import RequestContext
from proxy.protocol import ChatCompletionRequest, CompletionRequest
from tests.openai_spec import validate, validate_completion_chunk
from tests.sse import check_chat_stream

TEXT = "The service is busy; please retry."


def ctx(route: str, stream: bool = False, usage: bool = False) -> RequestContext:
    body: dict[str, Any] = {"model": "m", "stream": stream}
    if usage:
        body["stream_options"] = {"include_usage": True}
    if route == "chat":
        req: Any = ChatCompletionRequest.model_validate(
            {**body, "messages": [{"role": "user", "content": "hi"}]})
    else:
        req = CompletionRequest.model_validate({**body, "prompt": "hi"})
    return RequestContext(route=route, request=req,  # type: ignore[arg-type]
                          principal=Principal("t", "user", "u"), request_id="r")


async def chunks(reply: Any) -> list[dict[str, Any]]:
    assert isinstance(reply, Stream)
    return [c async for c in reply]


def test_whole_chat_answer() -> None:
    reply = static_reply(ctx("chat"), TEXT)
    assert isinstance(reply, Completion)
    validate("CreateChatCompletionResponse", reply.body)
    choice = reply.body["choices"][0]
    assert choice["message"]["content"] == TEXT and choice["finish_reason"] == "stop"
    assert reply.body["model"] == "m" and reply.body["usage"]["total_tokens"] == 0


@pytest.mark.parametrize("usage", [False, True])
async def test_streamed_chat_answer(usage: bool) -> None:
    reply = static_reply(ctx("chat", stream=True, usage=usage), TEXT)
    assert isinstance(reply, Stream) and reply.whole  # written in one go
    got = await chunks(reply)
    if usage:  # a last chunk with the (zero) usage and no choices
        *got, last = got
        validate("CreateChatCompletionStreamResponse", last)
        assert last["choices"] == [] and last["usage"]["total_tokens"] == 0
        assert last["id"] == got[0]["id"] and all(c["usage"] is None for c in got)
    assert len(got) == 1 and check_chat_stream(got) == TEXT


def test_whole_completion_answer() -> None:
    reply = static_reply(ctx("completion"), TEXT)
    assert isinstance(reply, Completion)
    validate("CreateCompletionResponse", reply.body)
    assert reply.body["choices"][0]["text"] == TEXT and reply.body["object"] == "text_completion"


@pytest.mark.parametrize("usage", [False, True])
async def test_streamed_completion_answer(usage: bool) -> None:
    reply = static_reply(ctx("completion", stream=True, usage=usage), TEXT)
    assert isinstance(reply, Stream) and reply.whole
    got = await chunks(reply)
    validate_completion_chunk(got[0])
    assert got[0]["choices"][0]["text"] == TEXT and got[0]["choices"][0]["finish_reason"] == "stop"
    assert len({c["id"] for c in got}) == 1
    if usage:
        assert len(got) == 2 and got[1]["choices"] == [] and got[1]["usage"]["total_tokens"] == 0
    else:
        assert len(got) == 1
