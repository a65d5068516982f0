"""The chat renderer's fast path (a request that can call no tool has no tool-call
tracker; a chunk with no call deltas is not taken apart; no running usage unless asked)
streams exactly what the tracked path streams: the same chunks, byte for byte, for
requests with and without tools, several choices, logprobs, usage, stops and cuts."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

import proxy.serving
from proxy import tools as T
from proxy.preparing import Prepared, prepare_chat
from tests.conftest import MakeClient
from tests.fakes import FakeEngine

MSG = [{"role": "user", "content": "hi"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
# the fake parser's call markup and a hermes-style one: text, where no tool can be called
SCRIPTS = [None, 'Sure. <call>{"name": "get_weather", "arguments": {"city": "Paris"}}</call> ok',
           'ok <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>']
EXTRAS: list[dict[str, Any]] = [
    {}, {"n": 2}, {"logprobs": True, "top_logprobs": 2}, {"max_tokens": 3}, {"stop": ["o"]},
    {"stream_options": {"include_usage": True}},
    {"stream_options": {"continuous_usage_stats": True}},
    {"n": 2, "logprobs": True, "max_tokens": 5,
     "stream_options": {"include_usage": True, "continuous_usage_stats": True}}]
TOOLS: list[dict[str, Any]] = [
    {}, {"tools": [WEATHER], "tool_choice": "none"}, {"tools": [WEATHER]},
    {"tools": [WEATHER], "tool_choice": "required"},
    {"tools": [WEATHER], "tool_choice": {"type": "function",
                                         "function": {"name": "get_weather"}}}]


def _normal(body: str) -> str:
    body = re.sub(r'"(chatcmpl|call)[-_][A-Za-z0-9_-]+"', r'"\1-X"', body)
    body = re.sub(r'"fake-\d+"', '"fake-X"', body)
    return re.sub(r'"created":\d+', '"created":0', body)


async def _streams(make_client: MakeClient, parser: bool) -> list[str]:
    engine = FakeEngine(tool_parser=parser)
    client = await make_client(engine=engine)
    out = []
    for script in SCRIPTS:
        engine.script = script
        for tools in TOOLS:
            for extra in EXTRAS:
                body = {"model": "fake-model", "messages": MSG, "stream": True,
                        **tools, **extra}
                resp = await client.post("/v1/chat/completions", json=body)
                out.append(f"{json.dumps(body)} {resp.status}\n{_normal(await resp.text())}")
    return out


@pytest.mark.parametrize("parser", [False, True])
async def test_the_fast_path_streams_what_a_text_tracker_streamed(
        make_client: MakeClient, monkeypatch: pytest.MonkeyPatch, parser: bool) -> None:
    fast = await _streams(make_client, parser)

    def tracked(engine: Any, req: Any) -> Prepared:
        prep = prepare_chat(engine, req)
        if prep.tracker is None:  # (as before: every request stepped through a tracker)
            prep.tracker = lambda: T.ToolCallTracker.for_request(req, engine.tool_parser)
        return prep

    monkeypatch.setattr(proxy.serving, "prepare_chat", tracked)
    slow = await _streams(make_client, parser)
    assert len(fast) == len(SCRIPTS) * len(TOOLS) * len(EXTRAS)
    assert any('"tool_calls"' in s for s in fast) and any(  # (markup as text)
        '"content":"_cal"' in s for s in fast)
    for a, b in zip(fast, slow, strict=True):
        assert a == b
