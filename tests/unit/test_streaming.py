"""The SSE stream writer's keep-alives (proxy/streaming.py), seen only from outside: over
HTTP, with a fake engine that goes quiet after its first token until the test lets it go
on. While it is quiet the client receives `: keep-alive` comments; the stream then ends
as any other (comments are invisible to SSE clients)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

from proxy.engine.base import EngineOutput, SamplingOptions
from tests.conftest import MakeClient
from tests.fakes import FakeEngine
from tests.sse import check_chat_stream, parse_sse

CHAT = {"model": "fake-model", "max_tokens": 3, "stream": True,
        "messages": [{"role": "user", "content": "hello"}]}


class QuietAfterFirstToken(FakeEngine):
    """Yields its first output, then waits for `resume` before the rest."""

    def __init__(self) -> None:
        super().__init__()
        self.resume = asyncio.Event()

    async def generate(self, prompt: list[int], options: SamplingOptions, request_id: str,
                       **kw: Any) -> AsyncGenerator[EngineOutput, None]:
        n = 0
        async for out in super().generate(prompt, options, request_id, **kw):
            if n == 1:
                await self.resume.wait()
            n += 1
            yield out


async def test_a_quiet_engine_gets_keepalive_comments(make_client: MakeClient) -> None:
    engine = QuietAfterFirstToken()
    client = await make_client(engine=engine, server={"keepalive_s": 0.01})
    r = await client.post("/v1/chat/completions", json=CHAT)
    assert r.status == 200
    lines: list[bytes] = []
    async with asyncio.timeout(10):  # bounded: each line is awaited, not slept for
        while not lines or not lines[-1].startswith(b"data: "):
            lines.append(await r.content.readline())  # the first token's event
        keepalives = 0
        while keepalives < 2:  # the engine is held: only comments can come now
            line = await r.content.readline()
            lines.append(line)
            assert not line.startswith(b"data: "), line
            keepalives += line == b": keep-alive\n"
        engine.resume.set()
        rest = await r.read()
    text = b"".join(lines).decode() + rest.decode()
    events, done = parse_sse(text)
    assert done
    prompt = engine.calls[0][0]
    assert check_chat_stream(events) == FakeEngine.expected_text(prompt, 3)


async def test_a_steady_stream_has_no_keepalives(make_client: MakeClient) -> None:
    client = await make_client(server={"keepalive_s": 60})
    r = await client.post("/v1/chat/completions", json=CHAT)
    text = await r.text()
    assert ": keep-alive" not in text and parse_sse(text)[1]
