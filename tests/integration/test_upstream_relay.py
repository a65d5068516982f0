"""An edge Weir (`engine.kind: upstream`) over real HTTP in front of a scripted upstream
(an aiohttp app whose chat handler each test chooses) and the breaker: what the client
sees, and what the breaker counts, when the upstream misbehaves or is merely busy."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from proxy.app_state import STATE
from tests.conftest import MakeClient, make_settings
from tests.openai_spec import validate
from tests.sse import parse_sse
from tests.waiting import eventually

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
CHAT = {"model": "up-model", "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 4}
USAGE = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
ANSWER = {"id": "chatcmpl-up", "object": "chat.completion", "created": 1, "model": "up-model",
          "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                       "finish_reason": "stop"}], "usage": USAGE}


def chunk(content: str | None = None, finish: str | None = None, index: int = 0,
          **extra: Any) -> dict[str, Any]:
    delta = {} if content is None else {"content": content}
    return {"id": "chatcmpl-up", "object": "chat.completion.chunk", "created": 1,
            "model": "up-model", "choices": [{"index": index, "delta": delta,
                                              "finish_reason": finish}], **extra}


def events(*chunks: dict[str, Any]) -> list[bytes]:
    """The SSE events of `chunks`, then the usage chunk and `[DONE]`."""
    usage = {"id": "chatcmpl-up", "object": "chat.completion.chunk", "created": 1,
             "model": "up-model", "choices": [], "usage": USAGE}
    return [f"data: {json.dumps(c)}\n\n".encode() for c in (*chunks, usage)] + [
        b"data: [DONE]\n\n"]


def streaming(pieces: list[bytes]) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for piece in pieces:
            await resp.write(piece)
        await resp.write_eof()
        return resp

    return handle


class Scripted:
    """The upstream: `chat` answers each chat request (it may read `request`)."""

    def __init__(self) -> None:
        self.chat: Handler = streaming(events(chunk("hi", "stop")))
        self.calls = 0
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.route)
        self.server = TestServer(app, host="127.0.0.1")

    async def route(self, request: web.Request) -> web.StreamResponse:
        self.calls += 1
        return await self.chat(request)

    @property
    def url(self) -> str:
        return str(self.server.make_url("/v1"))


@pytest.fixture
async def scripted() -> AsyncIterator[Scripted]:
    up = Scripted()
    await up.server.start_server()
    yield up
    await up.server.close()


async def edge(make_client: MakeClient, up: Scripted, *, minimum_calls: int = 2,
               **engine: Any) -> TestClient[Any, web.Application]:
    """An edge over `up`, its breaker opening after `minimum_calls` failures in a row."""
    return await make_client(make_settings(
        engine={"kind": "upstream", "base_url": up.url, "models": ["up-model"],
                "timeout_s": 10, "connect_timeout_s": 2, **engine},
        plugins=[{"name": "breaker", "config": {"minimum_calls": minimum_calls,
                                                "failure_rate": 0.5, "open_s": 60}}]))


async def cached(make_client: MakeClient, up: Scripted) -> TestClient[Any, web.Application]:
    """An edge over `up` with an exact-match cache (its semantic one off)."""
    return await make_client(make_settings(
        engine={"kind": "upstream", "base_url": up.url, "models": ["up-model"]},
        plugins=[{"name": "cache", "config": {"semantic": {"enabled": False}}}]))


async def asked_twice_each_way(
        client: TestClient[Any, web.Application]) -> list[tuple[bool, int, str]]:
    """One chat asked plain twice, then streamed twice (the second of each: the cache's
    replay, where the first was stored): each one's `stream`, status and text (UTF-8,
    strict: raises on a raw surrogate)."""
    ask = {**CHAT, "temperature": 0}
    answers = []
    for stream in (False, False, True, True):
        r = await client.post("/v1/chat/completions", json={
            **ask, "stream": stream, "max_tokens": 5 if stream else 4})
        answers.append((stream, r.status, (await r.read()).decode("utf-8")))
    return answers


async def breaker_state(client: TestClient[Any, web.Application]) -> str:
    ready = await (await client.get("/health/ready")).json()
    return str(ready["plugins"]["breaker"]["state"])


async def test_a_stream_past_the_answer_bound_ends_in_band_and_is_not_counted(
        make_client: MakeClient, scripted: Scripted, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bound on an answer (64 MiB) held for a whole answer only: a stream's events were
    relayed, and their text kept, without end (1200 events of 1 MiB took the gateway from
    95 MB to 3.4 GB). Now the stream ends in-band with a 502 `answer_too_large`, which
    the breaker does not count (any tenant may ask for a long answer)."""
    monkeypatch.setattr("proxy.upstream.MAX_ANSWER_BYTES", 256 << 10)
    text = "x" * (16 << 10)
    scripted.chat = streaming(events(*[chunk(text)] * 40, chunk(finish="stop")))
    client = await edge(make_client, scripted)
    for _ in range(3):
        r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        assert r.status == 200
        got, done = parse_sse(await r.text())
        assert done and got[-1]["error"]["code"] == "answer_too_large"
        relayed = got[:-1]
        assert 10 <= len(relayed) <= 16  # 256 KiB's worth, then the end
    assert await breaker_state(client) == "closed"


async def test_a_full_connection_pool_is_a_shed_not_an_upstream_failure(
        make_client: MakeClient, scripted: Scripted) -> None:
    """With every pooled connection busy, the next request waited its connect timeout in
    aiohttp's queue, then was a 504 "did not answer in time" that the breaker counted:
    a healthy but busy upstream opened it. It is a 503 `overloaded` with Retry-After
    now, which the breaker does not count."""
    release = asyncio.Event()

    async def held(request: web.Request) -> web.StreamResponse:
        await asyncio.wait_for(release.wait(), 10)
        return web.json_response(ANSWER)

    scripted.chat = held
    client = await edge(make_client, scripted, max_connections=1, connect_timeout_s=0.3)
    first = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT))
    try:
        await eventually(lambda: scripted.calls == 1, timeout=10)
        for _ in range(3):
            r = await client.post("/v1/chat/completions", json=CHAT)
            assert r.status == 503 and (await r.json())["error"]["code"] == "overloaded"
            assert r.headers["retry-after"] == "1"
        assert scripted.calls == 1 and await breaker_state(client) == "closed"
    finally:
        release.set()
        r = await first
    assert r.status == 200  # the one that held the connection was answered


@pytest.mark.parametrize("stalls", [False, True])
async def test_a_long_stream_is_cut_at_the_timeout_but_only_a_stalled_one_counts(
        make_client: MakeClient, scripted: Scripted, stalls: bool) -> None:
    """A stream whose chunks kept coming past `timeout_s` (a total timeout) was cut with a
    504 the breaker counted: an answer's length, the caller's choice, opened it. Now a
    stream is cut as a stalled upstream (counted) after `read_timeout_s` without a byte,
    and at `timeout_s` with its bytes still coming as a 504 the breaker does not count."""
    async def slow(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        with contextlib.suppress(ConnectionError):
            for i in range(200):  # (10 s at most: the edge cuts it well before)
                await resp.write(events(chunk(f"t{i}"))[0])
                await asyncio.sleep(4 if stalls and i == 1 else 0.05)
        return resp

    scripted.chat = slow
    # (margins wide enough that a loaded machine's late wake-up is no stall)
    client = await edge(make_client, scripted, timeout_s=1.5, read_timeout_s=1.0)
    for _ in range(2):  # (the breaker opens after 2 failures)
        r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        got, done = parse_sse(await r.text())
        assert r.status == 200 and done and got[-1]["error"]["code"] == "timeout"
        if stalls:  # cut after the stall's 2 chunks
            assert len(got) - 1 == 2
        else:  # cut at the total timeout: past the stall case's 2, short of the whole
            assert 2 < len(got) - 1 < 200
    assert await breaker_state(client) == ("open" if stalls else "closed")


@pytest.mark.parametrize("first_chunk", [False, True])
async def test_a_hung_upstream_stream_cut_at_its_deadline_counts_as_slow(
        make_client: MakeClient, scripted: Scripted, first_chunk: bool) -> None:
    """A stream the upstream sent nothing for (no headers, no first chunk) past
    `slow_call_s` was counted only when `read_timeout_s` (120 s) ended it: requests cut
    sooner by their own deadlines were released uncounted, so a hung upstream never
    opened the breaker (the in-process engine's hang did). Its first chunk is its first
    token now; a stream whose first chunk came at once and then was cut is not slow."""
    held = asyncio.Event()

    async def hung(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        if first_chunk:
            await resp.prepare(request)
            await resp.write(events(chunk("t0"))[0])
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(held.wait(), 10)
        return resp

    scripted.chat = hung
    # (margins wide enough that a loaded machine's slow first chunk is not slow)
    client = await make_client(make_settings(
        engine={"kind": "upstream", "base_url": scripted.url, "models": ["up-model"]},
        plugins=[{"name": "breaker", "config": {"minimum_calls": 2, "failure_rate": 0.5,
                                                "open_s": 60, "slow_call_s": 0.8}},
                 {"name": "admission", "config": {}}]))
    try:
        for _ in range(2):
            r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True},
                                  headers={"x-weir-timeout-ms": "2000"})
            body = await r.text()
            if first_chunk:
                got, done = parse_sse(body)
                assert r.status == 200 and done and got[-1]["error"]["code"] == "timeout"
            else:
                assert r.status == 504 and json.loads(body)["error"]["code"] == "timeout"
        assert await breaker_state(client) == ("closed" if first_chunk else "open")
    finally:
        held.set()


async def test_a_hung_upstream_whole_answer_opens_the_breaker_while_it_hangs(
        make_client: MakeClient, scripted: Scripted) -> None:
    """A whole answer tells nothing until its end: calls to an upstream that took them
    and never answered opened the breaker only when `timeout_s` or their deadline (600 s
    by default) ended them, every other request hanging meanwhile. Past `whole_call_s`
    they count as slow in flight: the breaker opens and the next request gets the
    fallback while they still hang."""
    held = asyncio.Event()

    async def hung(request: web.Request) -> web.StreamResponse:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(held.wait(), 10)
        return web.json_response(ANSWER)

    scripted.chat = hung
    client = await make_client(make_settings(
        engine={"kind": "upstream", "base_url": scripted.url, "models": ["up-model"]},
        plugins=[{"name": "breaker", "config": {
            "minimum_calls": 2, "failure_rate": 0.5, "open_s": 60, "whole_call_s": 0.3,
            "fallback": [{"kind": "static", "content": "Busy."}]}}]))
    calls = [asyncio.create_task(client.post("/v1/chat/completions", json=CHAT))
             for _ in range(2)]
    try:
        await eventually(lambda: scripted.calls == 2, timeout=5)
        breaker = next(p for p in client.app[STATE].plugins if p.name == "breaker")
        # (the threshold is a time to pass: each look sweeps the calls under way)
        await eventually(lambda: breaker.health()["state"] == "open", timeout=5)
        r = await client.post("/v1/chat/completions", json=CHAT)
        assert r.status == 200 and r.headers["x-weir-fallback"] == "static"
        assert scripted.calls == 2 and not any(c.done() for c in calls)
    finally:
        held.set()
    for r in await asyncio.gather(*calls):
        assert r.status == 200
        await r.read()


async def test_fewer_choices_than_asked_is_a_502_either_way_never_cached_nor_counted(
        make_client: MakeClient, scripted: Scripted) -> None:
    """An upstream that ignores `n`: streamed, a 200 then a 502 the breaker counted (four
    opened it); not streamed, a 200 with one choice, cached and replayed as one. A 502
    both ways now, never stored, and not counted."""
    async def one_choice(request: web.Request) -> web.StreamResponse:
        if (await request.json()).get("stream"):
            return await streaming(events(chunk("hi", "stop")))(request)
        return web.json_response(ANSWER)

    scripted.chat = one_choice
    client = await make_client(make_settings(
        engine={"kind": "upstream", "base_url": scripted.url, "models": ["up-model"]},
        plugins=[{"name": "cache", "config": {"semantic": {"enabled": False}}},
                 {"name": "breaker", "config": {"minimum_calls": 2, "failure_rate": 0.5,
                                                "open_s": 60}}]))
    ask = {**CHAT, "n": 2, "temperature": 0}
    for _ in range(2):
        r = await client.post("/v1/chat/completions", json=ask)
        assert r.status == 502
        assert (await r.json())["error"]["code"] == "upstream_choices_missing"
        r = await client.post("/v1/chat/completions", json={**ask, "stream": True})
        got, done = parse_sse(await r.text())
        assert done and got[-1]["error"]["code"] == "upstream_choices_missing"
    assert scripted.calls == 4  # nothing answered from the cache
    assert await breaker_state(client) == "closed"


async def test_a_stream_whose_choices_all_have_other_indices_is_no_answer(
        make_client: MakeClient, scripted: Scripted) -> None:
    """One choice asked, one came, index 1: none of the asked ones. It passed the
    choices check (none of them counted as every one) and was cached."""
    scripted.chat = streaming(events(chunk("hi", "stop", index=1)))
    client = await cached(make_client, scripted)
    ask = {**CHAT, "temperature": 0, "stream": True}
    for _ in range(2):
        got, done = parse_sse(await (await client.post("/v1/chat/completions",
                                                       json=ask)).text())
        assert done and got[-1]["error"]["code"] == "upstream_choices_missing"
    assert scripted.calls == 2  # nothing answered from the cache


async def test_a_stream_closed_cleanly_after_its_answer_with_no_usage_nor_done_is_whole(
        make_client: MakeClient, scripted: Scripted) -> None:
    """An upstream that ignores `stream_options` and never sends `[DONE]` (it closes its
    body once each choice ended): every stream was a 200 whose whole answer ended in a
    502 the breaker counted. It ends with `[DONE]` and no usage chunk (its usage is not
    known), is not stored by the cache (no usage: `captured_usage`), and counts as no
    failure."""
    scripted.chat = streaming([f"data: {json.dumps(c)}\n\n".encode()
                               for c in (chunk("h"), chunk("i", "stop"))])
    client = await make_client(make_settings(
        engine={"kind": "upstream", "base_url": scripted.url, "models": ["up-model"]},
        plugins=[{"name": "cache", "config": {"semantic": {"enabled": False}}},
                 {"name": "breaker", "config": {"minimum_calls": 2, "failure_rate": 0.5,
                                                "open_s": 60}}]))
    ask = {**CHAT, "temperature": 0, "stream": True,
           "stream_options": {"include_usage": True}}
    for _ in range(2):
        r = await client.post("/v1/chat/completions", json=ask)
        got, done = parse_sse(await r.text())
        assert r.status == 200 and done
        assert [c["choices"][0]["delta"].get("content") for c in got] == ["h", "i"]
        assert all("error" not in c and not c.get("usage") for c in got)
    assert scripted.calls == 2  # nothing answered from the cache
    assert await breaker_state(client) == "closed"


async def test_a_lone_surrogate_goes_out_as_utf_8_first_and_replayed(
        make_client: MakeClient, scripted: Scripted) -> None:
    """An upstream's JSON may escape a lone surrogate (`"a\\ud800b"`, valid JSON): it went
    out as its raw bytes, no UTF-8 (the OpenAI SDK's stream decoding raised). It goes
    out as the same escape now, in a whole answer, a stream and a cached replay alike."""
    odd = "a\ud800b"

    async def answer(request: web.Request) -> web.StreamResponse:
        if (await request.json()).get("stream"):
            return await streaming(events(chunk(odd, "stop")))(request)
        body = {**ANSWER, "choices": [{**ANSWER["choices"][0], "message": {
            "role": "assistant", "content": odd}}]}
        return web.json_response(body)  # (json.dumps: the escape, in ASCII)

    scripted.chat = answer
    client = await cached(make_client, scripted)
    for stream, _, text in await asked_twice_each_way(client):  # (a miss, then a hit)
        if stream:
            got, done = parse_sse(text)
            assert done and "".join(c["choices"][0]["delta"].get("content") or ""
                                    for c in got if c["choices"]) == odd
        else:
            assert json.loads(text)["choices"][0]["message"]["content"] == odd
    assert scripted.calls == 2  # each second one was a replay


@pytest.mark.parametrize("trusted", [True, False])
async def test_a_caller_s_trace_context_goes_upstream_only_when_trusted(
        make_client: MakeClient, scripted: Scripted, trusted: bool) -> None:
    """`tracing.trust_incoming: false` kept a caller's `traceparent` out of the server
    span, but the upstream still got it as sent (its sampled flag with it): the engine
    copied the header itself."""
    seen: list[str | None] = []
    answer = scripted.chat

    async def record(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get("traceparent"))
        return await answer(request)

    scripted.chat = record
    caller = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
    client = await make_client(make_settings(
        engine={"kind": "upstream", "base_url": scripted.url, "models": ["up-model"]},
        tracing={"trust_incoming": trusted}))
    r = await client.post("/v1/chat/completions", headers={"traceparent": caller}, json={
        "model": "up-model", "messages": [{"role": "user", "content": "hi"}],
        "stream": True})
    assert r.status == 200
    await r.read()
    (sent,) = seen
    # (the caller's context itself, or, where a test configured a tracer before, a span of
    # the caller's trace; untrusted: none, or a trace of Weir's own)
    trace = caller.split("-")[1]
    if trusted:
        assert sent is not None and sent.split("-")[1] == trace
    else:
        assert sent is None or sent.split("-")[1] != trace


@pytest.mark.parametrize("stream", [False, True])
async def test_a_fallback_answers_within_the_requests_deadline(
        make_client: MakeClient, scripted: Scripted, stream: bool) -> None:
    """The breaker's fallbacks run after admission gave up on the request, outside its
    deadline scope: an upstream fallback's answer came seconds past `x-weir-timeout-ms`,
    with a 200. It is a 504 at the deadline now, in-band for a stream under way."""
    from tests.fakes import FakeEngine

    async def slow(request: web.Request) -> web.StreamResponse:
        if not stream:
            await asyncio.sleep(3)
            return web.json_response({**ANSWER, "model": "fake-model"})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        with contextlib.suppress(ConnectionError):
            for i in range(30):  # (3 s, well past the deadline)
                await resp.write(events(chunk(f"t{i}"))[0])
                await asyncio.sleep(0.1)
            for piece in events(chunk("", "stop")):
                await resp.write(piece)
        return resp

    scripted.chat = slow
    engine = FakeEngine()
    engine.fail_after = 0  # the local engine fails: the upstream falls back
    client = await make_client(engine=engine, plugins=[
        {"name": "breaker", "config": {"fallback": [
            {"kind": "upstream", "base_url": scripted.url}]}},
        {"name": "admission", "config": {}}])
    r = await client.post("/v1/chat/completions",
                          json={**CHAT, "model": "fake-model", "stream": stream},
                          headers={"x-weir-timeout-ms": "400"})
    if stream:
        got, done = parse_sse(await r.text())
        assert r.headers["x-weir-fallback"] == "upstream" and done
        assert got[-1]["error"]["code"] == "timeout" and len(got) > 1
    else:
        assert r.status == 504 and (await r.json())["error"]["code"] == "timeout"


@pytest.mark.parametrize("mode", ["whole", "stream", "split"])
async def test_an_upstream_s_echo_is_the_prompt_as_the_caller_sent_it(
        make_client: MakeClient, mode: str) -> None:
    """A completion's `echo` over an upstream gave back the prompt the upstream was sent:
    the sanitizer's normalized one (look-alikes folded, invisible characters dropped),
    where the local engine echoes it as the caller sent it (OpenAI's). The upstream's
    echo is now given back as sent, whole and streamed, each prompt of several its own;
    with `logprobs` it stays the engine's (its tokens spell it). `split`: an upstream
    that streams the echo over several chunks, the first shorter than the prompt (it
    was given back as the upstream sent it)."""
    seen: list[Any] = []
    stream = mode != "whole"

    async def complete(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append(body["prompt"])
        prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
        n = body.get("n", 1)
        choices = [{"index": i, "text": prompts[i // n] + " ok", "logprobs": None,
                    "finish_reason": "stop"} for i in range(len(prompts) * n)]
        head = {"id": "cmpl-up", "object": "text_completion", "created": 1,
                "model": "up-model"}
        if not body.get("stream"):
            return web.json_response({**head, "choices": choices, "usage": USAGE})
        pieces = []
        for c in choices:  # the echo in a choice's first chunk, as vLLM's server sends it
            pieces.append({**head, "choices": [{**c, "text": "", "finish_reason": None}]})
            texts = [c["text"]] if mode == "stream" else [
                c["text"][i:i + 3] for i in range(0, len(c["text"]), 3)]
            pieces.extend({**head, "choices": [{**c, "text": t, "finish_reason": None}]}
                          for t in texts)
            pieces.append({**head, "choices": [{**c, "text": prompts[0], "finish_reason":
                                                "stop"}]})
        return await streaming([f"data: {json.dumps(p)}\n\n".encode() for p in (
            *pieces, {**head, "choices": [], "usage": USAGE})] + [b"data: [DONE]\n\n"])(request)

    app = web.Application()
    app.router.add_post("/v1/completions", complete)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        client = await make_client(make_settings(
            engine={"kind": "upstream", "base_url": str(server.make_url("/v1")),
                    "models": ["up-model"]},
            plugins=[{"name": "sanitizer", "config": {"normalize": True,
                                                      "engine_sees": "normalized"}}]))
        sent = ["Ｓay\u200b hello", "plain one"]
        body = {"model": "up-model", "prompt": sent, "echo": True, "n": 2, "stream": stream}
        r = await client.post("/v1/completions", json=body)
        assert r.status == 200, await r.text()
        assert seen[-1] == ["Say hello", "plain one"]  # (what the upstream read)
        texts: dict[int, str] = {}
        if stream:
            got, done = parse_sse(await r.text())
            assert done
            for c in got:
                for ch in c["choices"]:
                    texts[ch["index"]] = texts.get(ch["index"], "") + ch["text"]
        else:
            texts = {c["index"]: c["text"] for c in (await r.json())["choices"]}
        echoes = [sent[i // 2] + " ok" for i in range(4)]
        if stream:
            echoes = [e + "Say hello" for e in echoes]
        assert [texts[i] for i in range(4)] == echoes
        r = await client.post("/v1/completions", json={**body, "logprobs": 1,
                                                       "stream": False})
        assert (await r.json())["choices"][0]["text"] == "Say hello ok"
    finally:
        await server.close()


async def test_an_upstream_s_null_service_tier_is_no_word_on_the_tier(
        make_client: MakeClient, scripted: Scripted) -> None:
    """A vLLM server answers `"service_tier": null` (its response model's default; an
    OpenAI-compatible server may put it in its chunks too): that names no tier, so a
    request that set one is answered the tier that served it, `default`, as the
    in-process engine's answer is, not null. An upstream's tier is kept; a request that
    set none gets the upstream's answer as sent."""
    whole: dict[str, Any] = {**ANSWER, "service_tier": None, "system_fingerprint": None}

    async def answer(request: web.Request) -> web.StreamResponse:
        if (await request.json()).get("stream"):
            return await streaming(events(chunk("hi", service_tier=None),
                                          chunk(finish="stop", service_tier=None)))(request)
        return web.json_response(whole)

    scripted.chat = answer
    client = await edge(make_client, scripted)
    asked = {**CHAT, "service_tier": "priority"}
    body = await (await client.post("/v1/chat/completions", json=asked)).json()
    assert body["service_tier"] == "default", body
    r = await client.post("/v1/chat/completions", json={**asked, "stream": True})
    got, done = parse_sse(await r.text())
    assert done and [c["service_tier"] for c in got] == ["default"] * len(got), got
    whole = {**whole, "service_tier": "flex"}  # the upstream's own word on it
    body = await (await client.post("/v1/chat/completions", json=asked)).json()
    assert body["service_tier"] == "flex"
    whole = {**whole, "service_tier": None}
    body = await (await client.post("/v1/chat/completions", json=CHAT)).json()
    assert body["service_tier"] is None  # (not set: as the upstream sent it)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_null_fingerprint_and_an_unlisted_tier_are_dropped(
        make_client: MakeClient, scripted: Scripted, stream: bool) -> None:
    """`system_fingerprint: null` and a `service_tier` outside the spec's enum (`on_demand`,
    a list) were relayed as the upstream sent them, which OpenAI's schema refuses: both
    are dropped now, whole and streamed; a listed tier and a fingerprint are kept."""
    cases: list[tuple[Any, Any, dict[str, Any]]] = [
        ("on_demand", None, {}), ([1], 5, {}),
        ("flex", "fp_1", {"service_tier": "flex", "system_fingerprint": "fp_1"})]
    for tier, fingerprint, kept in cases:
        told: dict[str, Any] = {"service_tier": tier, "system_fingerprint": fingerprint}
        if stream:
            scripted.chat = streaming(events({**chunk("hi"), **told},
                                             {**chunk(finish="stop"), **told}))
        else:
            scripted.chat = _json({**ANSWER, **told})
        client = await edge(make_client, scripted)
        r = await client.post("/v1/chat/completions", json={**CHAT, "stream": stream})
        if stream:
            got, done = parse_sse(await r.text())
            assert done and len(got) == 2, got
        else:
            got = [await r.json()]
        for body in got:
            assert {k: body[k] for k in told if k in body} == kept, body
            validate("CreateChatCompletionStreamResponse" if stream
                     else "CreateChatCompletionResponse", body)


def _json(body: dict[str, Any]) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        return web.json_response(body)

    return handle


def _usage_free(counted: bool, empty: bool = False) -> web.Application:
    """An upstream of chat and completions, whole and streamed, that sends no usage
    (some ignore `stream_options.include_usage`) unless `counted`; `empty`: one that
    sends its usage as `{}`, counting nothing."""
    async def answer(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        chat = request.path.endswith("/chat/completions")
        head = ({"id": "chatcmpl-up", "object": "chat.completion", "created": 1,
                 "model": "up-model"} if chat else
                {"id": "cmpl-up", "object": "text_completion", "created": 1,
                 "model": "up-model"})
        usage = {"usage": USAGE} if counted else {"usage": {}} if empty else {}
        if not body.get("stream"):
            choice = ({"message": {"role": "assistant", "content": "hi"}} if chat
                      else {"text": "hi", "logprobs": None})
            return web.json_response({**head, **usage, "choices": [
                {"index": 0, "finish_reason": "stop", **choice}]})
        if chat:
            head["object"] = "chat.completion.chunk"
        piece = {"delta": {"content": "hi"}} if chat else {"text": "hi", "logprobs": None}
        chunks = [{**head, "choices": [{"index": 0, "finish_reason": "stop", **piece}]}]
        if usage:
            chunks.append({**head, "choices": [], **usage})
        return await streaming([f"data: {json.dumps(c)}\n\n".encode() for c in chunks]
                               + [b"data: [DONE]\n\n"])(request)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    app.router.add_post("/v1/completions", answer)
    return app


@pytest.mark.parametrize(("counted", "empty"), [(True, False), (False, False), (False, True)])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("route", ["chat", "completion", "responses"])
async def test_a_request_whose_upstream_sent_no_usage_keeps_its_token_reservation(
        make_client: MakeClient, route: str, stream: bool, counted: bool,
        empty: bool) -> None:
    """The rate limiter settles a request's token reservation from the upstream's usage;
    with none (whole or streamed, chat, completions or Responses) it is not refunded (a
    free ride under a token limit): the reservation stands, as charged at admission.
    With the usage, the tokens counted are charged instead. A usage of `{}` is none,
    whole as streamed (a whole answer's was a 502)."""
    server = TestServer(_usage_free(counted, empty), host="127.0.0.1")
    await server.start_server()
    try:
        client = await make_client(make_settings(
            engine={"kind": "upstream", "base_url": str(server.make_url("/v1")),
                    "models": ["up-model"]},
            plugins=[{"name": "rate_limit", "config": {
                "rules": [{"per": "tenant", "tpm": 1000}]}}]))
        st = client.app[STATE]
        path, body = {
            "chat": ("/v1/chat/completions", {**CHAT, "max_tokens": 500}),
            "completion": ("/v1/completions", {"model": "up-model", "prompt": "hello",
                                               "max_tokens": 500}),
            "responses": ("/v1/responses", {"model": "up-model", "input": "hello",
                                            "max_output_tokens": 500}),
        }[route]
        r = await client.post(path, json={**body, "stream": stream})
        assert r.status == 200, await r.text()
        await r.read()
        await eventually(lambda: st.in_flight == 0)
        r = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 1})
        assert r.status == 200
        left = int(r.headers["x-ratelimit-remaining-tokens"])
        # the first's reservation (500 and its prompt) still charged, or its 8 tokens
        assert (left < 600) is not counted, left
        assert left > 400
    finally:
        await server.close()


@pytest.mark.parametrize("sent", ["end_turn", "abort"])
async def test_a_finish_reason_outside_the_spec_is_cached_mapped_or_not_at_all(
        make_client: MakeClient, scripted: Scripted, sent: str) -> None:
    """An alias (`end_turn`) is relayed, cached and replayed as the spec's `stop`, whole
    and streamed alike; a reason that says the upstream failed (`abort`: the answer was
    cut) was relayed as `stop` and cached as whole: it is a 502, never stored."""
    async def answer(request: web.Request) -> web.StreamResponse:
        if (await request.json()).get("stream"):
            return await streaming(events(chunk("hi", sent)))(request)
        return web.json_response({**ANSWER, "choices": [{**ANSWER["choices"][0],
                                                         "finish_reason": sent}]})

    scripted.chat = answer
    client = await cached(make_client, scripted)
    for stream, status, text in await asked_twice_each_way(client):
        if sent == "abort":
            assert status == 502 or (stream and "error" in text), text
            continue
        assert status == 200
        if stream:
            got, done = parse_sse(text)
            assert done and [c["choices"][0]["finish_reason"] for c in got
                             if c["choices"]][-1] == "stop"
        else:
            assert json.loads(text)["choices"][0]["finish_reason"] == "stop"
    assert scripted.calls == (4 if sent == "abort" else 2)
