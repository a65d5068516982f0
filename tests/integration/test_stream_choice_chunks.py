"""A stream of several choices (n > 1, or a completion's prompts) sends one choice an
event, as OpenAI's and vLLM's servers do: many clients read only `choices[0]` of each
chunk. Made by the engine, replayed from the cache, or coalesced onto another request's
answer alike; the usage chunk (no choices) as it was."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest

from proxy.app_state import STATE
from tests.conftest import MakeClient, make_settings
from tests.fakes import HoldingEngine
from tests.sse import parse_sse

CHAT: dict[str, Any] = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4, "temperature": 0, "n": 2}
COMPLETION: dict[str, Any] = {"model": "fake-model", "prompt": ["hi", "there"], "max_tokens": 4,
              "temperature": 0, "n": 2}
ROUTES = [("/v1/chat/completions", CHAT, 2), ("/v1/completions", COMPLETION, 4)]
CACHE = {"plugins": [{"name": "cache", "config": {"semantic": {"enabled": False},
                                                "store_truncated": True}}]}


def texts(events: list[dict[str, Any]], n: int) -> list[str]:
    """Each choice's text, every event carrying one choice but the usage chunk."""
    out = [""] * n
    for e in events:
        assert len(e["choices"]) == 1 or (e["choices"] == [] and e.get("usage")), e
        for c in e["choices"]:
            out[c["index"]] += (c["delta"].get("content") or "" if "delta" in c
                                else c["text"])
    return out


def whole(body: dict[str, Any]) -> list[str]:
    return [c["message"]["content"] if "message" in c else c["text"]
            for c in sorted(body["choices"], key=lambda c: c["index"])]


@pytest.mark.parametrize(("path", "ask", "n"), ROUTES)
async def test_each_event_carries_one_choice_made_or_replayed(
        make_client: MakeClient, path: str, ask: dict[str, Any], n: int) -> None:
    client = await make_client(make_settings(**CACHE))
    told, made = [], []
    for _ in range(2):  # a miss (the engine's), then the cache's replay of it
        body = {**ask, "stream": True, "stream_options": {"include_usage": True}}
        r = await client.post(path, json=body)
        told.append(r.headers.get("x-weir-cache"))
        events, done = parse_sse(await r.text())
        assert done and events[-1]["choices"] == [] and events[-1]["usage"]
        assert all(e.get("usage") is None for e in events[:-1])
        made.append(texts(events, n))
    assert made[0] == made[1] and all(made[0])
    expected = whole(await (await client.post(path, json=ask)).json())
    assert made[0] == expected
    assert told == ["miss", "exact"]


@pytest.mark.parametrize(("path", "ask", "n"), ROUTES)
async def test_coalesced_waiters_get_one_choice_an_event(
        make_client: MakeClient, monkeypatch: pytest.MonkeyPatch, path: str,
        ask: dict[str, Any], n: int) -> None:
    engine = HoldingEngine(after=1)
    client = await make_client(make_settings(**CACHE), engine=engine)
    body = {**ask, "stream": True}
    cache: Any = next(p for p in client.app[STATE].plugins if p.name == "cache")
    follow, following = type(cache)._follow, asyncio.Event()

    async def followed(self: Any, *args: Any, **kw: Any) -> Any:
        following.set()
        return await follow(self, *args, **kw)

    monkeypatch.setattr(type(cache), "_follow", followed)

    async def asked() -> tuple[str | None, list[str]]:
        r = await client.post(path, json=body)
        events, done = parse_sse(await r.text())
        assert done
        return r.headers.get("x-weir-cache"), texts(events, n)

    first = asyncio.create_task(asked())
    await engine.wait_until(lambda: engine.held == 1)
    second = asyncio.create_task(asked())
    await asyncio.wait_for(following.wait(), 10)  # (the second waits on the first)
    engine.hold.set()
    got = await asyncio.gather(first, second)
    assert {told for told, _ in got} == {"miss", "coalesced"}
    assert got[0][1] == got[1][1] and all(got[0][1])


async def test_the_sdks_stream_helper_assembles_each_choice(
        make_client: MakeClient) -> None:
    client = await make_client()
    sdk = openai.AsyncOpenAI(api_key="k", base_url=str(client.make_url("/v1")),
                             max_retries=0)
    async with sdk:
        done = await sdk.chat.completions.create(**CHAT)
        async with sdk.chat.completions.stream(**CHAT) as stream:
            async for event in stream:
                if event.type == "chunk":
                    assert len(event.chunk.choices) == 1
            final = stream.current_completion_snapshot
    assert [c.message.content for c in final.choices] == [
        c.message.content for c in done.choices]
    assert all(c.message.content for c in final.choices)
