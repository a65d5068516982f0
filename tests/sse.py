"""Parse an SSE body into events, and check a stream's OpenAI invariants."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from tests.openai_spec import validate
from tests.waiting import eventually


def parse_sse(text: str) -> tuple[list[dict[str, Any]], bool]:
    """(JSON events, whether the stream ended with [DONE]). Comments are skipped."""
    events: list[dict[str, Any]] = []
    done = False
    for block in text.split("\n\n"):
        lines = [ln for ln in block.split("\n") if ln and not ln.startswith(":")]
        if not lines:
            continue
        assert not done, "data after [DONE]"
        data = "\n".join(ln.removeprefix("data: ") for ln in lines if ln.startswith("data: "))
        if data == "[DONE]":
            done = True
            continue
        events.append(json.loads(data))
    return events, done


def check_chat_stream(events: list[dict[str, Any]], n: int = 1, usage: bool = False) -> str:
    """Assert OpenAI's stream invariants; return choice 0's text."""
    assert events, "empty stream"
    ids = {e["id"] for e in events}
    assert len(ids) == 1, "every chunk must carry the same id"
    texts = {i: "" for i in range(n)}
    roles: dict[int, int] = {}
    finishes: dict[int, int] = {}
    body = events[:-1] if usage else events
    for e in body:
        validate("CreateChatCompletionStreamResponse", e)
        assert e["choices"], "only the usage chunk may have no choices"
        assert len(e["choices"]) == 1, "one choice a chunk, as OpenAI's streams send them"
        for c in e["choices"]:
            i = c["index"]
            if "role" in c["delta"]:
                assert i not in roles and texts[i] == "", "role must come once, first"
                roles[i] = roles.get(i, 0) + 1
            texts[i] += c["delta"].get("content") or ""
            if c["finish_reason"]:
                finishes[i] = finishes.get(i, 0) + 1
    assert roles == {i: 1 for i in range(n)}, f"role once per choice, got {roles}"
    assert finishes == {i: 1 for i in range(n)}, f"finish_reason once per choice: {finishes}"
    if usage:
        last = events[-1]
        validate("CreateChatCompletionStreamResponse", last)
        assert last["choices"] == [] and last["usage"]["total_tokens"] > 0
        assert all(e["usage"] is None for e in body)
    else:
        assert all("usage" not in e or e["usage"] is None for e in events)
    return texts[0]


async def streams_cut_until_refused(client: Any, body: dict[str, Any], *, events: int,
                                    rounds: int, idle: Callable[[], bool]) -> list[int]:
    """Stream `body` and hang up after `events` events, again and again (at most
    `rounds` times, each once `idle()` holds), until a request is refused with a token
    limit's 429. The statuses, the refusal last."""
    statuses: list[int] = []
    for _ in range(rounds):
        r = await client.post("/v1/chat/completions", json=body)
        statuses.append(r.status)
        if r.status != 200:
            error = (await r.json())["error"]
            assert error["code"] == "rate_limit_exceeded"
            assert "tokens per minute" in error["message"]
            break
        seen = b""
        async with asyncio.timeout(10):
            while seen.count(b"data: ") < events:
                seen += await r.content.readany()
        r.close()  # gone before the answer's end
        await eventually(idle)
    return statuses


def check_event_names(text: str) -> int:
    """Every event of a Responses API stream is named as OpenAI names it: an `event:`
    line with its `type`, before its data. The number of events."""
    blocks = [b for b in text.split("\n\n") if b.strip()]
    for block in blocks:
        lines = block.split("\n")
        assert len(lines) == 2 and lines[0].startswith("event: "), block[:200]
        assert lines[0].removeprefix("event: ") == json.loads(
            lines[1].removeprefix("data: "))["type"]
    return len(blocks)
