"""A chat answer as Responses output items, whole and streamed: the same items, with the
same statuses, either way."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from proxy.openai_responses import translate as X
from proxy.openai_responses.events import Rendering
from proxy.openai_responses.models import ResponsesRequest
from tests.openai_spec import validate

CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


def chunk(delta: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
    return {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": reason}]}


async def chunks_of(message: dict[str, Any], reason: str) -> AsyncIterator[dict[str, Any]]:
    yield chunk({"role": "assistant", "content": message.get("content") or ""})
    for i, c in enumerate(message.get("tool_calls") or []):
        yield chunk({"tool_calls": [{"index": i, **c}]})
    yield chunk({}, reason)


async def streamed(message: dict[str, Any], reason: str) -> dict[str, Any]:
    req = ResponsesRequest.model_validate({"model": "m", "input": "hi"})
    done: list[dict[str, Any]] = []

    async def on_done(response: dict[str, Any]) -> None:
        done.append(response)

    events = [e async for e in Rendering(req, "resp_1").events(chunks_of(message, reason),
                                                              on_done)]
    assert done and events[-1]["response"] == done[0]
    return done[0]


def shape(items: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(it["type"], it["status"]) for it in items]


@pytest.mark.parametrize("reason", ["length", "stop", "tool_calls"])
@pytest.mark.parametrize("message", [
    {"content": "Let me look.", "tool_calls": [CALL]},
    {"content": "Let me look.", "tool_calls": [CALL, {**CALL, "id": "call_2"}]},
    {"content": "Just text."},
    {"content": None, "tool_calls": [CALL]},
])
async def test_whole_and_streamed_items_agree(message: dict[str, Any], reason: str) -> None:
    """Cut at the token limit, only the last item is `incomplete`: the items before it
    ended (the stream closes each as the next begins). The whole answer marked every
    item `incomplete`."""
    whole = X.output_items(message, reason)
    final = await streamed(message, reason)
    assert shape(whole) == shape(final["output"])
    statuses = [it["status"] for it in whole]
    if reason == "length":
        assert statuses == ["completed"] * (len(whole) - 1) + ["incomplete"]
    else:
        assert set(statuses) == {"completed"}
    body = X.response_from_chat(
        ResponsesRequest.model_validate({"model": "m", "input": "hi"}),
        {"choices": [{"message": message, "finish_reason": reason}],
         "usage": {"prompt_tokens": 3, "completion_tokens": 5}}, id="resp_1", created_at=1)
    validate("Response", body)
    assert body["status"] == final["status"]
