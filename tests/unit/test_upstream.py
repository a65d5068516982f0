"""The upstream engine (proxy/upstream.py) against a stand-in OpenAI server on
127.0.0.1 (aiohttp's TestServer): model discovery, what is forwarded (body, key, request
id, traceparent), how upstream failures map (4xx passed through; 5xx, garbage, timeouts
and refused connections are engine failures), and the SSE relay."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from multidict import CIMultiDict

from proxy.auth import Principal
from proxy.chain import Completion, Stream
from proxy.context import RequestContext
from proxy.errors import EngineError, ModelNotFound, RateLimited, Timeout, WeirError
from proxy.protocol import ChatCompletionRequest, CompletionRequest
from proxy.settings import UpstreamEngineSettings
from proxy.streaming import SHUTDOWN
from proxy.upstream import ChoicesMissing, UpstreamError
from proxy.upstream import Upstream as UpstreamTerminal
from tests.openai_spec import validate

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
E = TypeVar("E", bound=BaseException)
ERROR = {"message": "too long", "type": "invalid_request_error", "param": "messages",
         "code": "context_length_exceeded"}
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
ANSWER: dict[str, Any] = {
    "id": "chatcmpl-up", "object": "chat.completion", "created": 1, "model": "up-model",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi",
                                         "refusal": None},
                 "finish_reason": "stop", "logprobs": None}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


class Upstream:
    """A stand-in OpenAI server whose chat handler each test chooses; it records requests."""

    def __init__(self) -> None:
        self.seen: list[tuple[CIMultiDict[str], dict[str, Any]]] = []
        self.chat: Handler = self.answer
        app = web.Application()
        self.list_models: Handler = self.models
        app.router.add_get("/v1/models", self.route_models)
        app.router.add_post("/v1/chat/completions", self.route)
        app.router.add_post("/v1/completions", self.route)
        self.server = TestServer(app, host="127.0.0.1")

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "up-model"},
                                                             {"id": "up-other"}]})

    async def route_models(self, request: web.Request) -> web.StreamResponse:
        return await self.list_models(request)

    async def route(self, request: web.Request) -> web.StreamResponse:
        self.seen.append((CIMultiDict(request.headers), await request.json()))
        return await self.chat(request)

    async def answer(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(ANSWER)

    @property
    def base_url(self) -> str:
        return str(self.server.make_url("/v1"))


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    up = Upstream()
    await up.server.start_server()
    yield up
    await up.server.close()


async def engine_for(base_url: str, **kw: Any) -> UpstreamTerminal:
    engine = UpstreamTerminal(UpstreamEngineSettings.model_validate({"base_url": base_url, **kw}))
    await engine.start()
    return engine


def ctx(model: str = "up-model", stream: bool = False,
        headers: dict[str, str] | None = None, request_id: str = "r",
        **fields: Any) -> RequestContext:
    req = ChatCompletionRequest.model_validate(
        {"model": model, "stream": stream, "max_tokens": 5,
         "messages": [{"role": "user", "content": "hello"}], **fields})
    return RequestContext(route="chat", request=req, principal=Principal("t", "user", "u"),
                          request_id=request_id, headers=headers or {})


async def test_models_are_discovered_when_none_are_configured(upstream: Upstream) -> None:
    engine = await engine_for(upstream.base_url, owned_by="central")
    try:
        assert engine.ready()
        assert [(m.id, m.owned_by) for m in engine.models()] == [
            ("up-model", "central"), ("up-other", "central")]
        with pytest.raises(ModelNotFound):
            await engine(ctx("elsewhere"))
    finally:
        await engine.close()
    assert not engine.ready()


async def test_what_serves_the_upstreams_models_is_in_its_answer_digest(
        upstream: Upstream) -> None:
    """Cache keys hold the terminal's answer digest: an upstream's is what it lists as
    serving each model (vLLM's `root` and `max_model_len`), so that another checkpoint
    behind the same name (Redis keeps answers a day) is not answered from the old one's;
    none where it lists neither, or was not asked (models configured)."""
    digests = []
    for root in ("/models/a", "/models/a", "/models/b"):
        async def models(request: web.Request, root: str = root) -> web.Response:
            return web.json_response({"object": "list", "data": [
                {"id": "up-model", "root": root, "max_model_len": 2048}]})
        upstream.list_models = models
        engine = await engine_for(upstream.base_url)
        digests.append(engine.answer_digest_for("up-model"))
        await engine.close()
    assert digests[0] is not None and digests[0] == digests[1] != digests[2]
    upstream.list_models = upstream.models
    for kw in ({}, {"models": ["up-model"]}):
        engine = await engine_for(upstream.base_url, **kw)
        assert engine.ready() and engine.answer_digest_for("up-model") is None
        await engine.close()


async def test_the_upstreams_answer_digest_follows_a_checkpoint_loaded_since_start(
        upstream: Upstream, monkeypatch: pytest.MonkeyPatch) -> None:
    """The digest was taken at start only: an upstream that loaded another checkpoint
    behind the same name kept the old one's, and Redis replayed the old model's answers
    for a day. Weir asks again every `MODELS_REFRESH_S`; one not answered keeps it."""
    from proxy import upstream as module
    from tests.waiting import eventually

    monkeypatch.setattr(module, "MODELS_REFRESH_S", 0.01)
    root = "/models/a"
    asked = 0

    async def models(request: web.Request) -> web.Response:
        nonlocal asked
        asked += 1
        if root == "down":
            return web.json_response({}, status=503)
        return web.json_response({"object": "list", "data": [
            {"id": "up-model", "root": root, "max_model_len": 2048}]})
    upstream.list_models = models
    engine = await engine_for(upstream.base_url)
    try:
        first = engine.answer_digest_for("up-model")
        assert first is not None
        root = "/models/b"
        await eventually(lambda: engine.answer_digest_for("up-model") != first)
        second = engine.answer_digest_for("up-model")
        root = "down"
        now = asked
        await eventually(lambda: asked >= now + 2)
        assert engine.answer_digest_for("up-model") == second and engine.ready()
    finally:
        await engine.close()
        upstream.list_models = upstream.models


async def test_each_upstream_model_has_its_own_answer_digest(
        upstream: Upstream, monkeypatch: pytest.MonkeyPatch) -> None:
    """The digest was one over the whole model list: an adapter vLLM loaded at runtime
    (or any model appearing or leaving) moved every model's cache keys, and every
    cached answer missed at once. Each model's is of its own entry (and, for an
    adapter, its base model's): others coming and going move nothing; its own entry
    changed (another checkpoint behind its name) moves its keys, and its adapters'."""
    from proxy import upstream as module
    from tests.waiting import eventually

    monkeypatch.setattr(module, "MODELS_REFRESH_S", 0.01)
    base = {"id": "up-model", "root": "/models/a", "parent": None, "max_model_len": 2048,
            "created": 1}
    other = {"id": "up-other", "root": "/models/o", "max_model_len": 4096}
    listed: list[dict[str, Any]] = [base, other]
    served = 0

    async def models(request: web.Request) -> web.Response:
        nonlocal served
        served += 1
        # (vLLM's `created` is the time of the listing: no part of what serves)
        return web.json_response({"object": "list", "data": [
            {**m, "created": m.get("created", 0) + served} for m in listed]})

    async def listing(now: list[dict[str, Any]]) -> None:
        nonlocal listed
        listed, asked = now, served
        await eventually(lambda: served >= asked + 2, timeout=10)  # (a whole refresh since)

    upstream.list_models = models
    engine = await engine_for(upstream.base_url)
    try:
        first = {m: engine.answer_digest_for(m) for m in ("up-model", "up-other")}
        assert None not in first.values() and len(set(first.values())) == 2
        # An adapter loaded at runtime, another model gone: nothing moves.
        lora = {"id": "sql-lora", "root": "/adapters/sql", "parent": "up-model"}
        await listing([base, lora])
        assert engine.answer_digest_for("up-model") == first["up-model"]
        adapter = engine.answer_digest_for("sql-lora")
        assert adapter is not None and adapter not in first.values()
        await listing([base, other])
        assert {m: engine.answer_digest_for(m) for m in first} == first
        # Another checkpoint behind `up-model`: its keys move (and its adapter's), only.
        await listing([{**base, "root": "/models/b"}, other, lora])
        assert engine.answer_digest_for("up-other") == first["up-other"]
        assert engine.answer_digest_for("up-model") != first["up-model"]
        assert engine.answer_digest_for("sql-lora") not in (adapter, None)
        assert engine.answer_digest_for("elsewhere") is None
    finally:
        await engine.close()
        upstream.list_models = upstream.models


async def test_an_upstream_that_names_no_models_is_not_ready_until_it_does(
        upstream: Upstream, monkeypatch: pytest.MonkeyPatch) -> None:
    """Down at start, it took any model name a client sent (each a new metric label,
    none answered) and said ready for good; now it is not ready, takes no name, and asks
    again until the upstream names its models."""
    from proxy import upstream as module
    from tests.waiting import eventually

    monkeypatch.setattr(module, "DISCOVERY_FIRST_S", 0.01)
    down = await engine_for(f"http://127.0.0.1:{closed_port()}/v1", connect_timeout_s=1)
    try:
        assert not down.ready() and down.models() == [] and not down.has_model("any-name")
    finally:
        await down.close()
    assert down._discovery is not None and down._discovery.done()  # its retries ended
    answers = [web.json_response({"error": "starting"}, status=503),
               web.json_response({"object": "list", "data": []})]
    real = upstream.models

    async def models(request: web.Request) -> web.Response:
        return answers.pop(0) if answers else await real(request)

    upstream.list_models = models
    engine = await engine_for(upstream.base_url)
    try:
        assert not engine.ready()
        await eventually(engine.ready, timeout=10)
        assert [m.id for m in engine.models()] == ["up-model", "up-other"] and not answers
    finally:
        await engine.close()


async def test_the_request_key_id_and_trace_go_upstream(upstream: Upstream) -> None:
    from opentelemetry import context as otel_context

    from proxy.tracing import extract

    engine = await engine_for(upstream.base_url, api_key="sk-central", models=["up-model"])
    # the caller's context, as the server's tracing middleware attaches it (a trusted
    # caller's: `tracing.trust_incoming`)
    token = otel_context.attach(extract({"traceparent": TRACEPARENT}))
    try:
        reply = await engine(ctx(headers={"x-request-id": "rid-9", "traceparent": TRACEPARENT,
                                          "authorization": "Bearer sk-client"},
                                 request_id="rid-9"))
        otel_context.detach(token)
        # A request id the gateway did not keep (key-shaped) is not the one sent on.
        await engine(ctx(headers={"x-request-id": "sk-live-abcdefghijklmnop"},
                         request_id="req-own"))
    finally:
        await engine.close()
    assert isinstance(reply, Completion) and reply.body == ANSWER
    (headers, body), (other, _) = upstream.seen
    assert other["x-request-id"] == "req-own"
    assert headers["Authorization"] == "Bearer sk-central"  # never the client's key
    assert headers["x-request-id"] == "rid-9"
    # the caller's context itself; where a test installed a tracer before, the call's own
    # span in the caller's trace
    from proxy.tracing import tracing_enabled

    sent = headers["traceparent"]
    assert sent.split("-")[1] == TRACEPARENT.split("-")[1]
    assert (sent != TRACEPARENT) if tracing_enabled() else (sent == TRACEPARENT)
    assert body["model"] == "up-model" and body["max_tokens"] == 5
    assert body["messages"] == [{"role": "user", "content": "hello"}]
    assert engine.stats().running == 0


async def test_top_p_zero_goes_upstream_as_greedy_decoding(upstream: Upstream) -> None:
    """`top_p: 0` is greedy on the local engine; a vLLM upstream refuses 0 (a 400 passed
    through), so it goes as what it means: temperature 0, top_p 1."""
    engine = await engine_for(upstream.base_url, models=["up-model"])
    try:
        for top_p, sent in ((0, (0, 1)), (0.5, (0.7, 0.5))):
            c = ctx()
            c.request = c.request.model_copy(update={"top_p": top_p, "temperature": 0.7})
            await engine(c)
            body = upstream.seen[-1][1]
            assert (body["temperature"], body["top_p"]) == sent
    finally:
        await engine.close()


async def test_a_temperature_below_epsilon_goes_upstream_as_greedy(upstream: Upstream,
                                                                   ) -> None:
    """A temperature below 1e-5 is greedy here (the cache keeps its answer as
    temperature 0's); a vLLM upstream would sample it at 0.01, so it goes as temperature
    0 (but with `n` > 1, which vLLM refuses at 0, as sent)."""
    engine = await engine_for(upstream.base_url, models=["up-model"])
    try:
        for n, sent in ((1, (0, 1)), (2, (1e-6, 0.5))):
            c = ctx()
            c.request = c.request.model_copy(update={"top_p": 0.5, "temperature": 1e-6,
                                                     "n": n})
            with contextlib.suppress(ChoicesMissing):  # (this upstream answers one)
                await engine(c)
            body = upstream.seen[-1][1]
            assert (body["temperature"], body["top_p"]) == sent
    finally:
        await engine.close()


async def test_an_upstream_4xx_is_passed_through(upstream: Upstream) -> None:
    e = await refused(upstream, answering(web.json_response({"error": ERROR}, status=400)),
                      UpstreamError)
    assert e.status == 400 and e.param == "messages"
    assert e.to_body()["error"] == ERROR


@pytest.mark.parametrize("reply", [
    web.json_response({"error": {"message": "boom"}}, status=500),
    web.Response(text="<html>bad gateway</html>", status=200, content_type="text/html"),
])
async def test_5xx_and_garbage_are_engine_failures(upstream: Upstream,
                                                   reply: web.Response) -> None:
    await refused(upstream, answering(reply), EngineError)


async def test_a_silent_upstream_times_out(upstream: Upstream) -> None:
    release = asyncio.Event()

    async def silent(request: web.Request) -> web.StreamResponse:
        await release.wait()
        return web.json_response(ANSWER)

    upstream.chat = silent
    engine = await engine_for(upstream.base_url, models=["up-model"], timeout_s=0.2)
    try:
        with pytest.raises(Timeout):
            await engine(ctx())
        assert engine.stats().running == 0
    finally:
        release.set()
        await engine.close()


async def test_a_request_aiohttp_refuses_to_send_leaves_nothing_running(
        upstream: Upstream, monkeypatch: pytest.MonkeyPatch) -> None:
    """An error the relay does not map (aiohttp refusing to build the request: a
    ValueError) still ends the call's count: it stayed in `running` (/health/ready, the
    engine gauge) for good, one more for each such request."""
    engine = await engine_for(upstream.base_url, models=["up-model"])

    async def refuse(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("Cannot combine AUTHORIZATION header with AUTH argument")

    try:
        monkeypatch.setattr(engine._session, "post", refuse)
        for stream in (False, True):
            with pytest.raises(ValueError):
                await engine(ctx(stream=stream))
        assert engine.stats().running == 0
    finally:
        await engine.close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_an_unreachable_upstream_is_an_engine_failure() -> None:
    engine = await engine_for(f"http://127.0.0.1:{closed_port()}/v1", models=["up-model"],
                              connect_timeout_s=1)
    try:
        with pytest.raises(EngineError):
            await engine(ctx())
    finally:
        await engine.close()


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("raw", [
    b"GARBAGE sk-secret-words\r\n\r\n",
    b"HTTP/1.1 abc OK\r\nContent-Length: 2\r\n\r\n{}",
    b"HTTP/1.1 200 OK\r\nSk Bad Header\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
    b"Transfer-Encoding: chunked\r\n\r\nzz-secret\r\n{}\r\n0\r\n\r\n",
], ids=["status-line", "status-code", "header", "chunked"])
async def test_an_answer_in_no_readable_http_is_not_an_unreachable_upstream(
        raw: bytes, stream: bool) -> None:
    """An upstream that answered in HTTP aiohttp cannot parse (a garbage status line, a
    bad header, a broken chunked encoding) was reported as "unreachable", which sent
    operators looking at the network: it is a 502 `engine_error` saying the upstream
    (host:port) sent an unreadable answer now, quoting none of what it sent."""
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            await reader.readexactly(length)
            writer.write(raw)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    engine = await engine_for(f"http://127.0.0.1:{port}/v1", models=["up-model"])
    try:
        with pytest.raises(EngineError) as e:
            await engine(ctx(stream=stream))
        assert e.value.status == 502 and e.value.code == "engine_error"
        assert "unreachable" not in e.value.message
        assert f"127.0.0.1:{port}" in e.value.message and "unreadable" in e.value.message
        assert "secret" not in e.value.message.lower() and "Sk" not in e.value.message
        assert engine.stats().running == 0
    finally:
        await engine.close()
        server.close()
        await server.wait_closed()


def sse(*chunks: Any) -> list[bytes]:
    """The events of `chunks` (a string is sent as it is); each chunk dict is given the
    head an OpenAI chunk has, and its choices their `finish_reason`, where it lacks one
    (in place, so a test's own list shows
    what is relayed; `_own_head` fills what an upstream leaves out)."""
    for c in chunks:
        if isinstance(c, dict) and "error" not in c:
            c.update({**HEAD, **c})
            for choice in c.get("choices") or ():
                choice.setdefault("finish_reason", None)
    return [b": comment line\n\n"] + [
        f"data: {c if isinstance(c, str) else json.dumps(c)}\n\n".encode() for c in chunks]


def sse_handler(pieces: list[bytes], step: int = 7,
                content_type: str = "text/event-stream") -> Handler:
    async def stream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": content_type})
        await resp.prepare(request)
        blob = b"".join(pieces)
        for i in range(0, len(blob), step):  # events split at arbitrary points
            await resp.write(blob[i:i + step])
        await resp.write_eof()
        return resp

    return stream


async def test_a_stream_is_relayed_chunk_by_chunk_until_done(upstream: Upstream) -> None:
    chunks = [{"id": "c", "choices": [{"index": 0, "delta": {"content": f"t{i}"},
                                       "finish_reason": "stop" if i == 4 else None}]}
              for i in range(5)]
    upstream.chat = sse_handler(sse(*chunks, "[DONE]", {"after": "done"}))
    engine = await engine_for(upstream.base_url, models=["up-model"])
    try:
        reply = await engine(ctx(stream=True))
        assert isinstance(reply, Stream) and engine.stats().running == 1
        got = [c async for c in reply]
        assert got == chunks  # the comment is skipped; nothing after [DONE]
        assert engine.stats().running == 0
    finally:
        await engine.close()


async def test_an_error_event_mid_stream_is_an_engine_failure(upstream: Upstream) -> None:
    first = {"id": "c", "choices": [{"index": 0, "delta": {"content": "a"}}]}
    upstream.chat = sse_handler(sse(first, {"error": {"message": "engine died"}}))
    engine = await engine_for(upstream.base_url, models=["up-model"])
    try:
        reply = await engine(ctx(stream=True))
        assert isinstance(reply, Stream)
        got = []
        with pytest.raises(EngineError):
            async for c in reply:
                got.append(c)
        assert got == [first] and engine.stats().running == 0
    finally:
        await engine.close()


async def test_a_refusal_in_the_stream_is_the_client_s_error(upstream: Upstream) -> None:
    """vLLM's server checks sampling values (token ids in `logit_bias`, ...) only as its
    stream starts, and says so in the stream with a 200 head: that is the client's 400,
    which the breaker does not count, not the upstream failing (one tenant's bad
    `logit_bias` opened the breaker for all)."""
    refusal = {"error": {"message": "token_id(s) [999999] in logit_bias contain "
                                    "out-of-vocab token ids.",
                         "type": "BadRequestError", "param": "logit_bias", "code": 400}}
    upstream.chat = sse_handler(sse(refusal, "[DONE]"))
    engine = await engine_for(upstream.base_url, models=["up-model"])
    try:
        with pytest.raises(UpstreamError) as e:
            await engine(ctx(stream=True))
        assert (e.value.status, e.value.param, e.value.type) == (
            400, "logit_bias", "invalid_request_error")
        assert "out-of-vocab" in e.value.message and engine.stats().running == 0
        # Once an answer came, an error is the upstream's, whatever it calls it (vLLM's
        # server calls any exception in generation, a detokenizer's, a 400): counted.
        first = {"id": "c", "choices": [{"index": 0, "delta": {"content": "a"}}]}
        upstream.chat = sse_handler(sse(first, {"error": {
            "message": "ValueError in detokenizer", "type": "BadRequestError",
            "code": 400}}, "[DONE]"))
        reply = await engine(ctx(stream=True))
        assert isinstance(reply, Stream)
        with pytest.raises(EngineError) as mid:
            async for _ in reply:
                pass
        assert not isinstance(mid.value, UpstreamError)
        # and an upstream's own failure (a 5xx in the stream) stays one
        for failure in ({"message": "boom", "type": "InternalServerError", "code": 500},
                        {"message": "down", "type": "server_error"}):
            upstream.chat = sse_handler(sse({"error": failure}))
            with pytest.raises(EngineError) as err:
                await engine(ctx(stream=True))
            assert not isinstance(err.value, UpstreamError)
    finally:
        await engine.close()


@pytest.mark.parametrize("reason", [None, SHUTDOWN])
async def test_a_whole_request_cut_while_the_upstream_has_it(upstream: Upstream,
                                                            reason: str | None) -> None:
    """Its client gone (or its deadline), the request is marked spent without a count
    (the upstream's usage comes only with the whole answer): the rate limiter charges its
    reservation. A drain's cut (a 503: retry elsewhere) is not; the running count goes
    back either way."""
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow(request: web.Request) -> web.StreamResponse:
        entered.set()
        await release.wait()
        return web.json_response(ANSWER)

    upstream.chat = slow
    engine = await engine_for(upstream.base_url, models=["up-model"])
    c = ctx()
    try:
        task = asyncio.create_task(engine(c))
        await entered.wait()
        task.cancel(reason)
        with pytest.raises(asyncio.CancelledError):
            await task
        assert c.spent_unknown is (reason is None)
        assert engine.stats().running == 0
    finally:
        release.set()
        await engine.close()


#: What every chunk an OpenAI upstream sends begins with.
HEAD = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "up-model"}
CHUNKS = [{**HEAD, "choices": [{"index": 0, "delta": {"content": f"t{i}"},
                                "finish_reason": None}]}
          for i in range(2)] + [{**HEAD, "choices": [{"index": 0, "delta": {
              "content": "t2"}, "finish_reason": "stop"}]}]


async def test_a_whole_answer_sent_as_events_is_assembled(upstream: Upstream) -> None:
    """An upstream that streams whatever it is asked (a 200 `text/event-stream` to a
    request with `stream: false`) was a 502 "unreadable answer": its events are read as
    a stream's and put together into the whole answer now, text, calls and usage; one
    that never finishes its answer is still a 502."""
    call = {"index": 0, "id": "call_1", "type": "function",
            "function": {"name": "f", "arguments": '{"a"'}}
    usage = {**HEAD, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4,
                                              "total_tokens": 7}}
    upstream.chat = sse_handler(sse(
        *CHUNKS[:2], {**HEAD, "system_fingerprint": "fp_1", "choices": [
            {"index": 0, "delta": {"tool_calls": [call]}}]},
        {**HEAD, "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": ": 1}"}}]}, "finish_reason": "tool_calls"}]},
        usage, "[DONE]"))
    reply = await answered(upstream)
    assert isinstance(reply, Completion), reply
    body = reply.body
    validate("CreateChatCompletionResponse", body)
    assert body["id"] == "c" and body["object"] == "chat.completion"
    message = body["choices"][0]["message"]
    assert message["content"] == "t0t1" and body["choices"][0]["finish_reason"] == "tool_calls"
    assert [(c["id"], c["function"]) for c in message["tool_calls"]] == [
        ("call_1", {"name": "f", "arguments": '{"a": 1}'})]
    assert body["usage"]["total_tokens"] == 7
    upstream.chat = sse_handler(sse(*CHUNKS[:2], "[DONE]"))  # (never finished)
    with pytest.raises(EngineError):
        await answered(upstream)


async def test_a_whole_completion_sent_as_events_is_assembled(upstream: Upstream) -> None:
    """As a chat answer sent as events is (above): a completion's, in its own shape."""
    head = {"id": "cmpl-up", "object": "text_completion", "created": 1, "model": "up-model"}
    upstream.chat = sse_handler(sse(
        {**head, "choices": [{"index": 0, "text": "he", "finish_reason": None,
                              "logprobs": None}]},
        {**head, "choices": [{"index": 0, "text": "llo", "finish_reason": "length",
                              "logprobs": None}]},
        {**head, "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2,
                                          "total_tokens": 3}}, "[DONE]"))
    req = CompletionRequest.model_validate({"model": "up-model", "prompt": "hi"})
    c = RequestContext(route="completion", request=req, principal=Principal("t", "user", "u"),
                       request_id="r", headers={})
    reply = await answered(upstream, c)
    assert isinstance(reply, Completion), reply
    validate("CreateCompletionResponse", reply.body)
    assert reply.body["object"] == "text_completion" and reply.body["id"] == "cmpl-up"
    assert [(x["text"], x["finish_reason"]) for x in reply.body["choices"]] == [
        ("hello", "length")]
    assert reply.body["usage"]["total_tokens"] == 3


@pytest.mark.parametrize("framing", ["crlf", "cr", "no-space", "split-crlf"])
async def test_every_sse_framing_the_spec_allows_is_relayed(upstream: Upstream,
                                                            framing: str) -> None:
    """CRLF (sse-starlette servers), bare CR, `data:` without its space: each was read as
    no event at all, and the stream passed for a whole, empty answer."""
    text = b"".join(sse(*CHUNKS, "[DONE]"))
    if framing in ("crlf", "split-crlf"):
        text = text.replace(b"\n", b"\r\n")
    elif framing == "cr":
        text = text.replace(b"\n", b"\r")
    else:
        text = text.replace(b"data: ", b"data:")
    # split-crlf: every piece ends between a CR and its LF
    pieces = ([text[i:i + 2] for i in range(0, len(text), 2)] if framing == "split-crlf"
              else [text])
    assert (await relayed(upstream, pieces))[0] == CHUNKS


@pytest.mark.parametrize("pieces", [
    sse(*CHUNKS[:2]),  # cut off before its finish_reason (and no [DONE])
    sse(*CHUNKS[:2], "[DONE]"),  # a [DONE] with no finish_reason: the answer never ended
    sse("[DONE]"),  # no answer at all
    [b'{"id": "c", "object": "chat.completion", "choices": []}'],  # JSON for a stream
    sse(CHUNKS[0], 1),  # a chunk that is not an object
    sse(CHUNKS[0], {"choices": [{"delta": {"content": "x"}}]}),  # a choice without index
    sse(CHUNKS[0], {"choices": [{"index": 0, "delta": {"content": 5},  # not text
                                 "finish_reason": "stop"}]}, "[DONE]"),
])
async def test_a_stream_that_does_not_finish_properly_is_an_engine_failure(
        upstream: Upstream, pieces: list[bytes]) -> None:
    """Each ended as a whole answer (a `[DONE]` for the client, `completed` for the
    plugins), or as a 500."""
    upstream.chat = sse_handler(pieces)
    engine = await engine_for(upstream.base_url, models=["up-model"])
    try:
        with pytest.raises(EngineError):  # before the first chunk, or after it
            reply = await engine(ctx(stream=True))
            assert isinstance(reply, Stream)
            async for _ in reply:
                pass
        assert engine.stats().running == 0
    finally:
        await engine.close()


def abrupt_handler(pieces: list[bytes]) -> Handler:
    """`pieces`, then the connection closed with the chunked body unfinished."""
    async def stream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"".join(pieces))
        await resp.drain()
        assert request.transport is not None
        request.transport.close()
        return resp

    return stream


@pytest.mark.parametrize("close", [sse_handler, abrupt_handler])
async def test_a_stream_closed_after_its_answer_ended_without_done_is_whole(
        upstream: Upstream, close: Callable[[list[bytes]], Handler]) -> None:
    """An upstream that sent its finish_reason and usage, then closed (cleanly or not)
    without `[DONE]`, had its complete answer followed by an in-band error; it ends as a
    whole answer. Cut before a finish_reason, or with a choice asked for missing, it is
    still a failure."""
    usage = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    upstream.chat = close(sse(*CHUNKS, {"id": "c", "choices": [], "usage": usage}))
    engine = await engine_for(upstream.base_url, models=["up-model"])
    try:
        reply = await engine(ctx(stream=True))
        assert isinstance(reply, Stream)
        got = [c async for c in reply]
        assert [c["choices"][0]["delta"]["content"] for c in got] == ["t0", "t1", "t2"]
        assert reply.answer == [{"index": 0, "text": "t0t1t2", "finish_reason": "stop"}]
        assert reply.usage == usage and engine.stats().running == 0
        # (ended, then broken before the usage chunk it was asked for: not whole; closed
        # cleanly there, it is: `test_a_stream_closed_cleanly_once_it_ended_is_whole`)
        cuts: list[tuple[list[dict[str, Any]], type[Exception], int]] = [
            (CHUNKS[:2], EngineError, 2),
            ([*CHUNKS, {"id": "c", "choices": [], "usage": usage}], ChoicesMissing, 2)]
        if close is abrupt_handler:
            cuts.insert(1, (CHUNKS, EngineError, 1))
        for cut, error, n in cuts:
            upstream.chat = close(sse(*cut))
            with pytest.raises(error):
                reply = await engine(ctx(stream=True, n=n))
                assert isinstance(reply, Stream)
                async for _ in reply:
                    pass
            assert engine.stats().running == 0
    finally:
        await engine.close()


@pytest.mark.parametrize("asked", [False, True])
async def test_a_stream_closed_cleanly_once_it_ended_is_whole(upstream: Upstream,
                                                              asked: bool) -> None:
    """An upstream that sent every choice's finish_reason, then closed its body cleanly
    with no usage and no `[DONE]` (one that ignores `stream_options` and never sends
    `[DONE]`) failed every stream mid-way, a 502 after the whole answer. It is whole, its
    usage not known (no usage chunk for the client, none for the plugins: the cache
    stores no such answer, the rate limiter keeps its reservation). Closed cleanly before
    a choice ended, or with a choice asked for missing, it is still a failure."""
    options: dict[str, Any] = {"stream_options": {"include_usage": True}} if asked else {}
    got, reply = await relayed(upstream, sse(*CHUNKS), ctx(stream=True, **options))
    assert got == CHUNKS
    assert reply.answer == [{"index": 0, "text": "t0t1t2", "finish_reason": "stop"}]
    assert reply.usage is None
    two = [{**HEAD, "choices": [{"index": i, "delta": {"content": "x"},
                                 "finish_reason": "stop" if i == 0 else None}]}
           for i in range(2)]
    for pieces, error, n in ((sse(*two), EngineError, 2), (sse(*CHUNKS), ChoicesMissing, 2)):
        with pytest.raises(error):
            await relayed(upstream, pieces, ctx(stream=True, n=n, **options))


async def test_a_stream_cut_before_its_usage_says_its_prompt_is_not_known(
        upstream: Upstream) -> None:
    """Cut before the upstream counted it (no usage came), a stream's usage is the
    pieces relayed, as tokens generated, and no prompt count: it said 0 prompt tokens,
    which the access log showed as counted. (The rate limiter charges its estimate of
    the prompt beside the pieces: `RateLimitPlugin`.) A running usage that came (vLLM's
    `continuous_usage_stats`) stands."""
    upstream.chat = abrupt_handler(sse(*CHUNKS[:2]))
    engine = await engine_for(upstream.base_url, models=["up-model"])
    try:
        reply = None
        with pytest.raises(EngineError):
            reply = await engine(ctx(stream=True))
            async for _ in reply:
                pass
        assert reply is not None
        assert reply.usage == {"completion_tokens": 2, "total_tokens": 2}
        running = {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8}
        upstream.chat = abrupt_handler(sse({**CHUNKS[0], "usage": running}, CHUNKS[1]))
        with pytest.raises(EngineError):
            reply = await engine(ctx(stream=True))
            async for _ in reply:
                pass
        assert reply.usage == running
    finally:
        await engine.close()


@pytest.mark.parametrize("asked", [False, True])
async def test_a_stream_s_usage_is_always_asked_for_and_shown_when_asked(
        upstream: Upstream, asked: bool) -> None:
    """The rate limiter and the cache count with the upstream's usage; the client sees the
    usage chunk only when it asked for one. A sanitizer's output ceiling goes upstream
    for a request that names no limit, as it does to the local engine."""
    usage = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    done = [{**HEAD, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}]
    # (an upstream asked for usage sends `"usage": null` on every other chunk)
    pieces = sse(*[{**c, "usage": None} for c in CHUNKS + done],
                 {"id": "c", "choices": [], "usage": usage}, "[DONE]")
    options: dict[str, Any] = {"stream_options": {"include_usage": True}} if asked else {}
    c = ctx(stream=True, max_tokens=None, **options)
    c.output_ceiling = 64
    got, reply = await relayed(upstream, pieces, c)
    # (`done` repeats CHUNKS' finish: dropped, a choice ends once)
    assert got[:3] == ([{**c, "usage": None} for c in CHUNKS] if asked else CHUNKS)
    assert [g.get("usage") for g in got[3:]] == ([usage] if asked else [])
    assert reply.usage == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    assert reply.answer == [{"index": 0, "text": "t0t1t2", "finish_reason": "stop"}]
    body = upstream.seen[-1][1]
    assert body["stream_options"]["include_usage"] is True
    assert body["max_completion_tokens"] == 64 and "max_tokens" not in body


async def relayed(upstream: Upstream, pieces: list[bytes],
                  c: RequestContext | None = None) -> tuple[list[dict[str, Any]], Stream]:
    """The chunks a stream the upstream sends as `pieces` is relayed as, and the stream
    (its answer and usage, as the plugins read them)."""
    upstream.chat = sse_handler(pieces)
    engine = await engine_for(upstream.base_url, models=["up-model"])
    try:
        reply = await engine(c or ctx(stream=True))
        assert isinstance(reply, Stream)
        return [chunk async for chunk in reply], reply
    finally:
        await engine.close()


async def test_a_relayed_stream_s_answer_keeps_its_tool_calls(upstream: Upstream) -> None:
    """The answer a plugin stores (the cache) had the text and the finish reason only: a
    replay said `tool_calls` and held none."""
    call = [{"index": 0, "id": "call_1", "type": "function",
             "function": {"name": "weather", "arguments": ""}}]
    args = [{"index": 0, "function": {"arguments": '{"city": "Oslo"}'}}]
    pieces = sse(
        {"id": "c", "choices": [{"index": 0, "delta": {"content": "Checking."}}]},
        {"id": "c", "choices": [{"index": 0, "delta": {"tool_calls": call}}]},
        {"id": "c", "choices": [{"index": 0, "delta": {"tool_calls": args}}]},
        {"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        "[DONE]")
    _, reply = await relayed(upstream, pieces)
    assert reply.answer == [{"index": 0, "text": "Checking.", "finish_reason": "tool_calls",
                             "tool_calls": [{"id": "call_1", "type": "function", "function": {
                                 "name": "weather", "arguments": '{"city": "Oslo"}'}}]}]


@pytest.mark.parametrize("name", ["", None, "absent"])
async def test_a_tool_call_without_a_name_is_an_unusable_answer(
        upstream: Upstream, name: str | None) -> None:
    """A tool call whose name never came was relayed, and stored, as `name: ""`: a call
    no client can run. An answer holding one is a 502 `engine_error` now, whole and
    streamed alike (the stream ends before that choice's end goes out, so no plugin
    stores it), and so is one streamed to a request that asked for a whole answer. The
    breaker does not count it: what a model calls is the request's to steer, and one
    tenant's requests must not open the circuit for all (as `ChoicesMissing`)."""
    from plugins.breaker.plugin import is_engine_failure
    fn: dict[str, Any] = {"arguments": "{}"} if name == "absent" else {
        "name": name, "arguments": "{}"}
    message = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": fn}]}
    upstream.chat = answering(web.json_response({**ANSWER, "choices": [
        {"index": 0, "message": message, "finish_reason": "tool_calls"}]}))
    with pytest.raises(WeirError, match="without a name") as whole:
        await answered(upstream)
    assert whole.value.status == 502 and whole.value.code == "engine_error"
    assert not is_engine_failure(whole.value)
    pieces = sse(
        {"id": "c", "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "call_1", "type": "function", "function": fn}]}}]},
        {"id": "c", "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": ""}}]}}]},
        {"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        "[DONE]")
    got: list[dict[str, Any]] = []
    with pytest.raises(WeirError, match="without a name") as e:
        upstream.chat = sse_handler(pieces)
        engine = await engine_for(upstream.base_url, models=["up-model"])
        try:
            reply = await engine(ctx(stream=True))
            assert isinstance(reply, Stream)
            got.extend([chunk async for chunk in reply])
        finally:
            await engine.close()
    assert e.value.status == 502 and e.value.code == "engine_error"
    assert not is_engine_failure(e.value)
    assert not any(c["choices"] and c["choices"][0]["finish_reason"] for c in got), got
    with pytest.raises(WeirError, match="without a name") as events:
        await answered(upstream)  # (the events, to a request for a whole answer)
    assert not is_engine_failure(events.value)


def answering(reply: web.StreamResponse | Exception) -> Handler:
    """A chat handler that always answers `reply` (or raises it: a redirect)."""
    async def handle(request: web.Request) -> web.StreamResponse:
        if isinstance(reply, Exception):
            raise reply
        return reply

    return handle


async def answered(upstream: Upstream, c: RequestContext | None = None) -> Any:
    """What the engine over `upstream` answers the request `c` (a whole chat one where
    none), the engine closed after."""
    engine = await engine_for(upstream.base_url, models=["up-model"])
    try:
        return await engine(c if c is not None else ctx())
    finally:
        await engine.close()


async def refused(upstream: Upstream, handler: Handler, error: type[E]) -> E:
    """What the engine raises (`error`) for a request the upstream answers with
    `handler`; it is left running nothing."""
    upstream.chat = handler
    engine = await engine_for(upstream.base_url, models=["up-model"])
    try:
        with pytest.raises(error) as e:
            await engine(ctx())
        assert engine.stats().running == 0
    finally:
        await engine.close()
    return e.value


@pytest.mark.parametrize("status", [401, 403])
async def test_an_upstream_refusing_the_gateway_s_key_is_an_engine_failure(
        upstream: Upstream, status: int) -> None:
    """Its message is about Weir's key ("Incorrect API key provided: sk-...abcd"), not the
    client's: passed through, it told the client its own key was wrong, named the
    operator's key's tail, and the breaker never fell back."""
    e = await refused(upstream, answering(web.json_response({"error": {
        "message": "Incorrect API key provided: sk-proj-****abcd.",
        "type": "invalid_request_error", "code": "invalid_api_key"}}, status=status)),
        EngineError)
    assert "abcd" not in e.message


async def test_an_upstream_429_is_told_in_the_gateway_s_words(upstream: Upstream) -> None:
    e = await refused(upstream, answering(web.json_response({"error": {
        "message": "Rate limit reached for gpt-4o in organization org-SECRET on tokens.",
        "type": "requests", "code": "rate_limit_exceeded"}}, status=429,
        headers={"retry-after": "7"})), RateLimited)
    assert "org-SECRET" not in e.message and e.headers["retry-after"] == "7"
    assert e.type == "requests"


@pytest.mark.parametrize(("status", "error"), [(429, RateLimited), (503, EngineError)])
@pytest.mark.parametrize(("sent", "told"), [
    ({"retry-after-ms": "2500"}, ("3", "2500")),
    ({"retry-after": "1", "retry-after-ms": "250.5"}, ("1", "251")),
    ({"retry-after": "7", "retry-after-ms": "soon"}, ("7", "7000")),
    ({"retry-after-ms": "99999999999999999999"}, ("3600", "3600000")),
    # A wait of none, or none that is a number, is as none sent (`Retry-After: 0` had
    # clients retry at once, in a loop): the upstream's `Retry-After`, else 1 s.
    ({"retry-after-ms": "0"}, ("1", "1000")),
    ({"retry-after-ms": "0.000"}, ("1", "1000")),
    ({"retry-after-ms": "0", "retry-after": "5"}, ("5", "5000")),
    ({"retry-after-ms": "-5"}, ("1", "1000")),
    ({"retry-after-ms": "0.2"}, ("1", "1")),
])
async def test_an_upstream_s_retry_after_ms_is_passed_on(
        upstream: Upstream, status: int, error: type[WeirError], sent: dict[str, str],
        told: tuple[str, str]) -> None:
    """An upstream's `retry-after-ms` (a Weir upstream's, OpenAI's: the OpenAI SDK reads
    it first) was dropped: sent alone, the client was told 1 s (a 2.5 s wait: back
    early, to another 429); it is the wait passed on, `Retry-After` rounded up."""
    e = await refused(upstream, answering(web.json_response({"error": {
        "message": "Rate limit reached.", "type": "requests",
        "code": "rate_limit_exceeded"}}, status=status, headers=sent)), error)
    assert (e.headers["retry-after"], e.headers["retry-after-ms"]) == told


async def test_an_upstream_429_s_kind_is_kept(upstream: Upstream) -> None:
    """Its type (`tokens` or `requests`, OpenAI's) tells the client which limit it met."""
    e = await refused(upstream, answering(web.json_response({"error": {
        "message": "Rate limit reached on tokens per min.", "type": "tokens",
        "code": "rate_limit_exceeded"}}, status=429)), RateLimited)
    assert e.to_body()["error"]["type"] == "tokens"


@pytest.mark.parametrize("headers", [{"x-should-retry": "false"}, {}])
async def test_an_upstream_429_no_wait_lets_through_is_not_told_to_retry(
        upstream: Upstream, headers: dict[str, str]) -> None:
    """A request larger than the upstream's tokens-per-minute limit on its own (a Weir
    upstream's "Request too large", with `x-should-retry: false` and no Retry-After, or
    OpenAI's, told by its message) was relayed as a retryable 429 with `Retry-After: 1`
    saying to retry after it: the SDK retried what no wait lets through. It is a 429
    `tokens` with `x-should-retry: false` and no Retry-After, as the upstream's."""
    e = await refused(upstream, answering(web.json_response({"error": {
        "message": "Request too large for gpt-4o in organization org-SECRET on tokens per "
                   "min (TPM): Limit 400, Requested 501.",
        "type": "tokens", "param": None, "code": "rate_limit_exceeded"}}, status=429,
        headers=headers)), RateLimited)
    assert e.type == "tokens" and e.headers.get("x-should-retry") == "false"
    assert not any(k.lower().startswith("retry-after") for k in e.headers)
    assert "org-SECRET" not in e.message and "Retry-After" not in e.message
    assert "too large" in e.message


async def stalled_error_body(upstream: Upstream, status: int, error: type[WeirError],
                             within_s: float, **engine: Any) -> None:
    """An upstream answers `status`, then its body stalls: the engine (with `engine`'s
    settings, `timeout_s` 600) raises `error` within `within_s`, running nothing."""
    release = asyncio.Event()

    async def stalled(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(status=status, headers={
            "content-type": "application/json", "content-length": "500"})
        await resp.prepare(request)
        await resp.write(b'{"error": ')
        await release.wait()
        return resp

    upstream.chat = stalled
    client = await engine_for(upstream.base_url, models=["up-model"], timeout_s=600,
                              **engine)
    try:
        with pytest.raises(error):
            await asyncio.wait_for(client(ctx()), within_s)
        assert client.stats().running == 0
    finally:
        release.set()
        await client.close()


@pytest.mark.parametrize(("status", "error"), [(429, RateLimited), (400, UpstreamError),
                                               (504, Timeout)])
async def test_an_upstream_error_whose_body_stalls_is_answered_by_its_status(
        upstream: Upstream, monkeypatch: pytest.MonkeyPatch, status: int,
        error: type[WeirError]) -> None:
    """An error's status came, then its body stalled (a proxy on the way, a server that
    hung writing it): the body, read only for the error's details, was waited for within
    the request's whole `timeout_s` (ten minutes by default), and the client got its 429
    that late. It is read within `ERROR_BODY_S`; the status answers without it."""
    import proxy.upstream as upstream_module

    monkeypatch.setattr(upstream_module, "ERROR_BODY_S", 0.2, raising=False)
    # (without the bound: the whole 600 s)
    await stalled_error_body(upstream, status, error, 60)


@pytest.mark.parametrize(("status", "error"), [(429, RateLimited), (400, UpstreamError),
                                               (504, Timeout)])
async def test_an_error_body_is_waited_for_no_longer_than_the_read_timeout(
        upstream: Upstream, monkeypatch: pytest.MonkeyPatch, status: int,
        error: type[WeirError]) -> None:
    """An error's body that stalled was waited for `ERROR_BODY_S` whatever the
    upstream's `read_timeout_s` (the longest no byte may come before the upstream has
    stalled): it is waited for the shorter of the two."""
    import proxy.upstream as upstream_module

    monkeypatch.setattr(upstream_module, "ERROR_BODY_S", 600, raising=False)
    # (without the bound: `ERROR_BODY_S`, 600 s)
    await stalled_error_body(upstream, status, error, 30, read_timeout_s=0.2)


async def test_an_upstream_429_that_says_not_to_retry_is_not_told_to_retry(
        upstream: Upstream) -> None:
    """`x-should-retry: false` on another 429 (OpenAI's exhausted quota) is kept, with no
    Retry-After, in the gateway's words."""
    e = await refused(upstream, answering(web.json_response({"error": {
        "message": "You exceeded your current quota (org-SECRET).",
        "type": "insufficient_quota", "code": "insufficient_quota"}}, status=429,
        headers={"x-should-retry": "false"})), RateLimited)
    assert e.headers.get("x-should-retry") == "false" and e.type == "requests"
    assert not any(k.lower().startswith("retry-after") for k in e.headers)
    assert "org-SECRET" not in e.message and "Retry-After" not in e.message


async def test_an_upstream_error_s_code_and_param_are_strings(upstream: Upstream) -> None:
    """vLLM's server sends `"code": 400`; OpenAI's schema has a string (or null)."""
    e = await refused(upstream, answering(web.json_response({"error": {
        "message": "bad", "type": "BadRequestError", "param": None, "code": 400}},
        status=400)), UpstreamError)
    body = e.to_body()
    validate("ErrorResponse", body)
    assert body["error"]["code"] == "400" and body["error"]["param"] is None


async def test_an_upstream_redirect_is_not_followed(upstream: Upstream) -> None:
    """A redirect would carry the request, and the gateway's key, somewhere else."""
    await refused(upstream, answering(web.HTTPSeeOther(upstream.base_url + "/models")),
                  EngineError)  # (/models would answer 200)


async def test_an_event_of_empty_data_and_unnumbered_calls_are_read_as_the_spec_says(
        upstream: Upstream) -> None:
    """`data:` alone is no event (it was parsed as JSON, and failed the stream). Calls
    sent without their index are told apart by their ids (a delta without one, or with
    the last call's again, goes on with it), for the stream's readers too."""
    calls = [{"id": f"call_{n}", "type": "function",
              "function": {"name": f"f{n}", "arguments": "{"}} for n in (1, 2)]
    more = {"id": "call_2", "function": {"arguments": "}"}}  # the last call's id again
    pieces = [b"data:\n\n", *sse(
        {"id": "c", "choices": [{"index": 0, "delta": {"tool_calls": [calls[0]]}}]},
        {"id": "c", "choices": [{"index": 0, "delta": {"tool_calls": [
            {"function": {"arguments": "}"}}]}}]},  # no id: the last call's
        {"id": "c", "choices": [{"index": 0, "delta": {"tool_calls": [calls[1], more]}}]},
        {"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        "[DONE]")]
    got, reply = await relayed(upstream, pieces)
    assert [d["index"] for c in got[:3] for d in c["choices"][0]["delta"]["tool_calls"]] == [
        0, 0, 1, 1]
    assert reply.answer is not None and reply.answer[0]["tool_calls"] == [
        {**c, "function": {**c["function"], "arguments": "{}"}} for c in calls]


async def test_calls_sharing_an_id_go_out_with_ids_of_their_own(upstream: Upstream) -> None:
    """Some servers' parsers give two calls one id, or none: relayed as they came, the
    client sending that turn back was refused (a call id is one call). Whole or streamed,
    each call gets an id of its own; one that repeats its id on each piece keeps one."""
    same = [{"id": "dup", "type": "function", "function": {"name": f"f{n}", "arguments": "{}"}}
            for n in (1, 2)] + [{"id": "", "type": "function",
                                 "function": {"name": "f3", "arguments": "{}"}}]

    async def whole(request: web.Request) -> web.Response:
        return web.json_response({**ANSWER, "choices": [{
            "index": 0, "finish_reason": "tool_calls",
            "message": {"role": "assistant", "content": None, "tool_calls": same}}]})

    upstream.chat = whole
    reply = await answered(upstream)
    assert isinstance(reply, Completion)
    got = [c["id"] for c in reply.body["choices"][0]["message"]["tool_calls"]]
    assert got[0] == "dup" and len(set(got)) == 3 and all(got)

    pieces = sse(*[{"id": "c", "choices": [{"index": 0, "delta": {"tool_calls": [
        {**call, "index": n}]}}]} for n, call in enumerate(same)],
        {"id": "c", "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 1, "id": "dup", "function": {"arguments": ""}}]}}]},  # its id again
        {"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        "[DONE]")
    chunks, stream = await relayed(upstream, pieces)
    sent = [(d["index"], d["id"]) for c in chunks for d in
            (c["choices"][0]["delta"].get("tool_calls") or []) if "id" in d]
    assert sent[0] == (0, "dup") and sent[1][1] == sent[3][1] != "dup" and all(i for _, i in sent)
    assert len({i for _, i in sent}) == 3
    assert stream.answer is not None
    assert len({c["id"] for c in stream.answer[0]["tool_calls"]}) == 3


@pytest.mark.parametrize(("status", "error"), [(429, RateLimited), (413, UpstreamError),
                                               (400, UpstreamError)])
async def test_an_upstream_error_page_that_is_not_json_keeps_its_status(
        upstream: Upstream, status: int, error: type[WeirError]) -> None:
    """A proxy's or CDN's HTML page: it was an unreadable answer, a 502 that the breaker
    counted against every tenant for one client's oversized body."""
    e = await refused(upstream, answering(web.Response(
        text="<html>nope</html>", status=status, content_type="text/html")), error)
    assert e.status == status


def _choice(**kw: Any) -> dict[str, Any]:
    return {**ANSWER, "choices": [{**ANSWER["choices"][0], **kw}]}


@pytest.mark.parametrize("body", [
    {"error": {"message": "engine died"}},  # an error, with status 200
    {**ANSWER, "choices": None},
    {k: v for k, v in ANSWER.items() if k != "choices"},
    {**ANSWER, "choices": "abc"},
    _choice(message=None),
    _choice(message={"role": "assistant", "content": 5}),
    _choice(message={"role": "assistant", "content": None, "tool_calls": "notalist"}),
    _choice(finish_reason=7),
    _choice(finish_reason=False),  # (a falsy one was read as none given, and passed on)
    _choice(finish_reason=0),
    _choice(message={"role": "assistant", "content": 0}),
    _choice(message={"role": "assistant", "content": False}),
    _choice(index="zero"),
    {**ANSWER, "usage": [1, 2]},
    {**ANSWER, "usage": {"prompt_tokens": -1, "completion_tokens": 1}},
    {**ANSWER, "choices": []},
    _choice(message={"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "{}"}}]}),  # no id
])
async def test_a_whole_answer_of_another_shape_is_an_engine_failure(
        upstream: Upstream, body: dict[str, Any]) -> None:
    """It was passed on as a 200, or stored by the cache, whose replays then failed
    (a 500 for that prompt until the entry expired)."""
    await refused(upstream, answering(web.json_response(body)), EngineError)


async def test_what_a_tenant_stores_is_not_stored_upstream_too(upstream: Upstream) -> None:
    """Weir keeps stored completions per tenant; the upstream sees every tenant under one
    key, and kept them all where any holder of that key could list them."""
    await answered(upstream, ctx(store=True, metadata={"owner": "tenant-t1"}))
    body = upstream.seen[-1][1]
    assert "store" not in body and "metadata" not in body


def test_an_upstream_refusal_is_an_invalid_request_a_route_renames() -> None:
    """The Responses route renames a chat param to its own (`max_output_tokens`); an
    upstream's refusal named `max_completion_tokens`."""
    from proxy.errors import InvalidRequest
    from proxy.openai_responses.translate import rename_param

    e = UpstreamError(400, {"error": {"message": "`max_completion_tokens` is too large",
                                      "param": "max_completion_tokens"}})
    assert isinstance(e, InvalidRequest) and e.status == 400
    assert rename_param(e).param == "max_output_tokens"


@pytest.mark.parametrize("kind", ["whole", "event", "events"])
async def test_an_answer_past_what_is_relayed_is_refused_but_not_counted(
        upstream: Upstream, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its buffer was unbounded (a stream's unfinished event) or it was not checked; and a
    long answer is no engine fault: any tenant may ask for one (n choices with their
    logprobs), so the breaker must not count it against every tenant. A stream of many
    events (`events`) was bounded by nothing: every piece of its text was kept, 1200
    events of 1 MiB took the gateway to 3.4 GB; it ends past the bound, with what it
    relayed charged."""
    from plugins.breaker.plugin import is_engine_failure
    from proxy.upstream import AnswerTooLarge

    monkeypatch.setattr("proxy.upstream.MAX_EVENT_BYTES", 1 << 20)
    monkeypatch.setattr("proxy.upstream.MAX_ANSWER_BYTES", 1 << 20)
    big = {**ANSWER, "choices": [{**ANSWER["choices"][0], "message": {
        "role": "assistant", "content": "x" * (2 << 20)}}]}
    piece = {"id": "c", "choices": [{"index": 0, "delta": {"content": "x" * (64 << 10)}}]}
    upstream.chat = {
        "whole": answering(web.json_response(big)),
        "event": sse_handler([b"data: " + b"x" * (1 << 19)] * 4, 4099),
        "events": sse_handler(sse(*[piece] * 40, "[DONE]"), 4099),  # 2.5 MiB, 64 KiB events
    }[kind]
    engine = await engine_for(upstream.base_url, models=["up-model"])
    relayed = 0
    try:
        with pytest.raises(AnswerTooLarge) as e:
            reply = await engine(ctx(stream=kind != "whole"))
            assert isinstance(reply, Stream)
            async for _ in reply:
                relayed += 1
        assert engine.stats().running == 0
    finally:
        await engine.close()
    assert e.value.status == 502 and not is_engine_failure(e.value)
    if kind == "events":
        assert 10 <= relayed <= 16  # 1 MiB's worth, then the end
        assert reply.usage is not None and reply.usage["completion_tokens"] == relayed


async def test_only_what_the_client_sent_goes_upstream(upstream: Upstream) -> None:
    """Not the defaults Weir's models fill in (`ignore_eos`, `min_tokens`, `n`,
    `logprobs`...): OpenAI's own server refuses a field it does not know, so every
    request to it was a 400 (and a breaker fallback to it passed that 400 on)."""
    await answered(upstream)
    assert set(upstream.seen[-1][1]) == {"model", "stream", "max_tokens", "messages"}


@pytest.mark.parametrize(("sent", "ceiling", "expected"), [
    ({}, 8, 8),  # the default 16 is over the ceiling: the ceiling goes
    ({}, 64, 16),  # the default 16 is within it: what OpenAI's server applies anyway
    ({"max_tokens": None}, 8, 8),  # null is the default 16: over the ceiling
    ({"max_tokens": None}, 64, 16),  # null is the default 16, not the ceiling
    ({"max_tokens": 4}, 8, 4),  # the client's, within the ceiling already
])
async def test_a_completions_output_ceiling_holds_upstream(
        upstream: Upstream, sent: dict[str, Any], ceiling: int, expected: int) -> None:
    """The sanitizer's ceiling binds a completion that names no limit (its default 16 is
    not the client's), as the local engine applies it."""
    from proxy.protocol import CompletionRequest

    async def completion(request: web.Request) -> web.Response:
        return web.json_response({
            "id": "cmpl-up", "object": "text_completion", "created": 1, "model": "up-model",
            "choices": [{"index": 0, "text": "hi", "finish_reason": "length",
                         "logprobs": None}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

    upstream.chat = completion
    req = CompletionRequest.model_validate({"model": "up-model", "prompt": "hi", **sent})
    c = RequestContext(route="completion", request=req, principal=Principal("t", "user", "u"),
                       request_id="r", headers={})
    c.output_ceiling = ceiling
    await answered(upstream, c)
    assert upstream.seen[-1][1]["max_tokens"] == expected


@pytest.mark.parametrize("secret", ["the-edge-own-secret", None])
async def test_the_caller_is_named_upstream_only_with_a_secret(upstream: Upstream,
                                                               secret: str | None) -> None:
    from proxy.auth import ON_BEHALF_OF, caller_digest

    engine = await engine_for(upstream.base_url, models=["up-model"], api_key="k",
                              on_behalf_of_secret=secret)
    try:
        await engine(ctx())
    finally:
        await engine.close()
    sent = upstream.seen[-1][0].get(ON_BEHALF_OF)
    assert sent == (caller_digest(Principal("t", "user", "u"), secret) if secret else None)


@pytest.mark.parametrize(("status", "headers", "error", "retry"), [
    (503, {"Retry-After": "7"}, "upstream_unavailable", "7"),
    (503, {}, "upstream_unavailable", "1"),
    (504, {}, "timeout", None),
])
async def test_an_upstream_503_or_504_keeps_its_meaning(
        upstream: Upstream, status: int, headers: dict[str, str], error: str,
        retry: str | None) -> None:
    """They were a 502 without the upstream's `Retry-After`: a central shedding load, or
    a balancer with no backend, told its clients nothing of when to come back. Both stay
    engine failures the breaker counts."""
    from plugins.breaker.plugin import is_engine_failure

    async def answer(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "busy"}}, status=status,
                                 headers=headers)

    upstream.chat = answer
    engine = await engine_for(upstream.base_url, models=["up-model"])
    try:
        with pytest.raises(WeirError) as e:
            await engine(ctx(stream=True))
    finally:
        await engine.close()
    assert (e.value.status, e.value.code) == (status, error)
    assert e.value.headers.get("retry-after") == retry
    assert e.value.headers.get("retry-after-ms") == (retry and str(int(retry) * 1000))
    assert is_engine_failure(e.value)


async def test_a_streamed_call_without_an_id_gets_one(upstream: Upstream) -> None:
    """Its first piece carried none: it went out, and was kept, without one."""
    call = {"index": 0, "type": "function", "function": {"name": "f", "arguments": "{"}}
    pieces = sse({"id": "c", "choices": [{"index": 0, "delta": {"tool_calls": [call]}}]},
                 {"id": "c", "choices": [{"index": 0, "delta": {"tool_calls": [
                     {"index": 0, "function": {"arguments": "}"}}]}}]},
                 {"id": "c", "choices": [{"index": 0, "delta": {},
                                          "finish_reason": "tool_calls"}]}, "[DONE]")
    chunks, stream = await relayed(upstream, pieces)
    first = chunks[0]["choices"][0]["delta"]["tool_calls"][0]
    assert first["id"] and "id" not in chunks[1]["choices"][0]["delta"]["tool_calls"][0]
    assert stream.answer is not None and stream.answer[0]["tool_calls"][0]["id"] == first["id"]


async def test_a_504_to_a_request_for_a_cached_answer_only_is_its_answer(
        upstream: Upstream) -> None:
    """An HTTP cache on the way says `only-if-cached` missed in its own words (a bare
    504): the client's own choice, not an engine failure for the breaker to count."""
    from plugins.breaker.plugin import is_engine_failure

    async def bare(request: web.Request) -> web.Response:
        return web.Response(status=504, text="Gateway Timeout")

    upstream.chat = bare
    engine = await engine_for(upstream.base_url, models=["up-model"])
    try:
        with pytest.raises(WeirError) as asked:
            await engine(ctx(headers={"cache-control": "only-if-cached"}))
        with pytest.raises(WeirError) as plain:
            await engine(ctx())
    finally:
        await engine.close()
    assert asked.value.code == "not_cached" and not is_engine_failure(asked.value)
    assert plain.value.code == "timeout" and is_engine_failure(plain.value)


async def test_an_answer_missing_choices_asked_for_is_refused_but_not_counted(
        upstream: Upstream) -> None:
    """`n: 2`, and the upstream (one that ignores `n`) answered one choice, whole: the
    stream passed for a whole answer once, then was a 502 the breaker counted (four
    opened it), while the same request not streamed was a 200 with one choice, cached
    and replayed so. Both are a 502 now, which the breaker does not count: the upstream
    answers everything else, and one tenant's `n` must not open the circuit for all."""
    from plugins.breaker.plugin import is_engine_failure
    from proxy.upstream import ChoicesMissing

    engine = await engine_for(upstream.base_url, models=["up-model"])
    try:
        upstream.chat = sse_handler(sse(*CHUNKS, "[DONE]"))
        reply = await engine(ctx(stream=True, n=2, temperature=1))
        assert isinstance(reply, Stream)
        with pytest.raises(ChoicesMissing) as streamed:
            async for _ in reply:
                pass
        upstream.chat = answering(web.json_response(ANSWER))
        with pytest.raises(ChoicesMissing) as whole:
            await engine(ctx(n=2, temperature=1))
        assert engine.stats().running == 0
        upstream.chat = sse_handler(sse(*CHUNKS, "[DONE]"))
        one = await engine(ctx(stream=True))  # one asked, one came: whole
        assert isinstance(one, Stream) and [c async for c in one] == CHUNKS
    finally:
        await engine.close()
    for e in (streamed.value, whole.value):
        assert (e.status, e.code) == (502, "upstream_choices_missing")
        assert not is_engine_failure(e) and "1 of the 2" in e.message


async def test_a_stream_whose_choice_never_ended_is_an_engine_failure(
        upstream: Upstream) -> None:
    """A choice that came and did not end by the `[DONE]` is a broken stream, counted,
    whichever choices came."""
    from plugins.breaker.plugin import is_engine_failure

    second = [{"id": "c", "choices": [{"index": 1, "delta": {"content": "t"}}]}]
    upstream.chat = sse_handler(sse(*CHUNKS, *second, "[DONE]"))
    engine = await engine_for(upstream.base_url, models=["up-model"])
    try:
        reply = await engine(ctx(stream=True, n=3, temperature=1))
        assert isinstance(reply, Stream)
        with pytest.raises(EngineError) as e:
            async for _ in reply:
                pass
    finally:
        await engine.close()
    assert is_engine_failure(e.value)


@pytest.mark.parametrize("continuous", [False, True])
async def test_a_relayed_stream_keeps_vllm_s_stop_reason_and_running_usage(
        upstream: Upstream, continuous: bool) -> None:
    """What a vLLM upstream sends goes on: the `stop_reason` beside a finish reason (and
    into the answer the cache stores), and, when the client asked for it
    (`continuous_usage_stats` beside `include_usage`), the usage in every chunk."""
    usage = {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}
    chunks = [{**HEAD, "choices": [{"index": 0, "delta": {"content": "t0"},
                                    "finish_reason": None}], "usage": {
                                        **usage, "completion_tokens": 1, "total_tokens": 8}},
              {**HEAD, "choices": [{"index": 0, "delta": {"content": "t1"},
                                    "finish_reason": "stop", "stop_reason": "###"}],
               "usage": usage}]
    pieces = sse(*chunks, {**HEAD, "choices": [], "usage": usage}, "[DONE]")
    options = {"include_usage": True, "continuous_usage_stats": True}
    c = ctx(stream=True, stream_options=options if continuous else {
        "continuous_usage_stats": True})
    got, reply = await relayed(upstream, pieces, c)
    sent = upstream.seen[-1][1]["stream_options"]
    assert sent == {"include_usage": True, "continuous_usage_stats": True}
    if continuous:
        assert got == [*chunks, {**HEAD, "choices": [], "usage": usage}]
    else:  # not asked (no `include_usage`): no usage at all
        assert got == [{k: v for k, v in chunk.items() if k != "usage"} for chunk in chunks]
    assert reply.answer == [{"index": 0, "text": "t0t1", "finish_reason": "stop",
                             "stop_reason": "###"}]
    assert reply.usage == usage


@pytest.mark.parametrize("done", [True, False])
@pytest.mark.parametrize("asked", ["none", "usage", "continuous"])
async def test_usage_sent_on_the_last_answer_chunk_goes_out_in_a_chunk_of_its_own(
        upstream: Upstream, asked: str, done: bool) -> None:
    """An upstream that puts its usage on its last answer chunk (not on a chunk of its
    own, as OpenAI's and vLLM's do): a client that asked for the usage gets it as OpenAI
    sends it, in a last chunk with no choices (`usage: null` on the others, unless it
    asked vLLM's `continuous_usage_stats` too); one that did not gets none. It had the
    usage on an answer chunk and no usage chunk (the OpenAI SDK's stream helpers, which
    read it from the chunk with no choices, saw none)."""
    usage = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    last = {**CHUNKS[-1], "usage": usage}
    pieces = sse(*CHUNKS[:-1], last, *(["[DONE]"] if done else []))
    options = {"none": {}, "usage": {"include_usage": True},
               "continuous": {"include_usage": True, "continuous_usage_stats": True}}[asked]
    got, reply = await relayed(upstream, pieces, ctx(stream=True, stream_options=options))
    if asked == "none":
        assert got == CHUNKS
    else:
        assert got[:2] == CHUNKS[:2]
        assert got[2] == {**CHUNKS[-1], "usage": usage if asked == "continuous" else None}
        assert got[3:] == [{**HEAD, "choices": [], "usage": usage}]
        validate("CreateChatCompletionStreamResponse", got[3])
    assert reply.usage == usage
    assert reply.answer == [{"index": 0, "text": "t0t1t2", "finish_reason": "stop"}]


@pytest.mark.parametrize("asked", [False, True])
async def test_usage_an_upstream_sends_under_x_groq_is_read(upstream: Upstream,
                                                            asked: bool) -> None:
    """Groq's server sends a stream's usage on its last chunk under `x_groq` (with its
    timings), not as OpenAI's `usage`: it was read as none (the rate limiter kept the
    whole reservation, the client that asked got no usage chunk). It is the usage."""
    usage = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    groq = {"id": "req_1", "usage": {**usage, "queue_time": 0.01, "total_time": 0.2}}
    last = {**CHUNKS[-1], "x_groq": groq}
    options = {"include_usage": True} if asked else {}
    got, reply = await relayed(upstream, sse(*CHUNKS[:-1], last, "[DONE]"),
                               ctx(stream=True, stream_options=options))
    assert reply.usage == usage
    assert got[:3] == [*CHUNKS[:-1], {**last, **({"usage": None} if asked else {})}]
    assert got[3:] == ([{**HEAD, "choices": [], "usage": usage}] if asked else [])


async def test_a_stream_without_usage_is_told_once_and_given_none(
        upstream: Upstream, logs: io.StringIO) -> None:
    """An upstream that ignores `stream_options.include_usage` and sends no usage: the
    client that asked for it gets no usage chunk (Weir holds no tokenizer for an
    upstream's model: an estimate would go out as a count, and OpenAI's usage has no
    word for an estimate), the stream's usage stays unknown (the rate limiter keeps
    the reservation), and the operator is told once, in a warning naming the model, so
    that tokens are not left uncounted in silence."""
    engine = await engine_for(upstream.base_url, models=["up-model"])
    upstream.chat = sse_handler(sse(*CHUNKS, "[DONE]"))
    try:
        for _ in range(2):
            reply = await engine(ctx(stream=True, stream_options={"include_usage": True}))
            assert isinstance(reply, Stream)
            assert [c async for c in reply] == CHUNKS
            assert reply.usage is None
    finally:
        await engine.close()
    told = [json.loads(ln) for ln in logs.getvalue().splitlines()
            if "sent no usage" in ln]
    assert len(told) == 1 and told[0]["model"] == "up-model"
    assert told[0]["level"] == "warning"


@pytest.mark.parametrize("choices", ["absent", None, "no-total"])
async def test_a_usage_chunk_without_its_choices_goes_out_with_none(
        upstream: Upstream, choices: Any) -> None:
    """An upstream's usage chunk that leaves out its `choices` (or sends null), or its
    usage's `total_tokens`: it was relayed so, and OpenAI's schema requires both (the
    choices an empty list in the usage chunk)."""
    usage = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    last: dict[str, Any] = {**HEAD, "usage": usage}
    if choices is None:
        last["choices"] = None
    if choices == "no-total":
        last = {**HEAD, "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}}
    got, reply = await relayed(upstream, sse(*CHUNKS, last, "[DONE]"),
                               ctx(stream=True, stream_options={"include_usage": True}))
    assert got == [*CHUNKS, {**HEAD, "choices": [], "usage": usage}]
    validate("CreateChatCompletionStreamResponse", got[-1])
    assert reply.usage == usage


async def test_a_completion_stream_s_usage_on_its_last_chunk_goes_out_on_its_own(
        upstream: Upstream) -> None:
    """`/v1/completions` alike: the usage an upstream put on the last text chunk goes out
    in a `text_completion` chunk of its own with no choices, and on no text chunk (a
    completion's chunks have no `usage: null`: OpenAI's schema does not let it be null,
    and Weir's own engine sends none)."""
    from proxy.protocol import CompletionRequest
    from tests.openai_spec import validate_completion_chunk

    usage = {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}
    head = {**HEAD, "object": "text_completion"}
    chunks = [{**head, "choices": [{"index": 0, "text": "a", "logprobs": None,
                                    "finish_reason": None}]},
              {**head, "choices": [{"index": 0, "text": "b", "logprobs": None,
                                    "finish_reason": "length"}], "usage": usage}]
    req = CompletionRequest.model_validate({"model": "up-model", "prompt": "hi",
                                            "stream": True, "max_tokens": 2,
                                            "stream_options": {"include_usage": True}})
    c = RequestContext(route="completion", request=req, principal=Principal("t", "user", "u"),
                       request_id="r", headers={})
    got, reply = await relayed(upstream, sse(*chunks, "[DONE]"), c)
    assert got == [chunks[0], {k: v for k, v in chunks[1].items() if k != "usage"},
                   {**head, "choices": [], "usage": usage}]
    for chunk in got:
        validate_completion_chunk(chunk)
    assert reply.usage == usage


@pytest.mark.parametrize("early", [
    [{**HEAD, "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 1}}],
    [],  # (the usage, on the last answer chunk only: made at the end)
])
async def test_a_usage_chunk_sent_before_the_answer_ended_goes_out_last_once(
        upstream: Upstream, early: list[dict[str, Any]]) -> None:
    """An upstream that sent a usage chunk (no choices) before its last answer chunk, or
    one so far and one at the end: each went out as it came, so the client's stream had
    a usage chunk before more text (OpenAI's is the last before `[DONE]`, and clients
    read it as the end) or two of them. One goes out, after every answer chunk, with the
    upstream's last usage (and the rest of its usage chunk: `system_fingerprint`)."""
    usage = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    interleaved = [{**HEAD, "choices": [{"index": i % 2, "delta": {"content": f"t{i}"},
                                         "finish_reason": "stop" if i > 1 else None}]}
                   for i in range(4)]
    tail = ({**HEAD, "choices": [], "usage": usage, "system_fingerprint": "fp"}
            if early else None)
    last = {**interleaved[3], "usage": usage} if not early else interleaved[3]
    pieces = sse(interleaved[0], *early, interleaved[1], {**interleaved[2], "usage": (
        {**usage, "completion_tokens": 2} if not early else None)}, last,
        *([tail] if tail else []), "[DONE]")
    got, reply = await relayed(upstream, pieces, ctx(
        stream=True, n=2, stream_options={"include_usage": True}))
    assert [g["choices"] for g in got[:-1]] == [c["choices"] for c in interleaved]
    assert all(g.get("usage") is None for g in got[:-1])
    assert got[-1] == {**HEAD, "choices": [], "usage": usage,
                       **({"system_fingerprint": "fp"} if early else {})}
    assert reply.usage == usage


@pytest.mark.parametrize("route", ["chat", "completion"])
async def test_running_usage_asked_but_not_sent_leaves_each_chunk_valid(
        upstream: Upstream, route: str) -> None:
    """A client that asked for the running usage (`continuous_usage_stats`) of an
    upstream that sends none, only `usage: null` on each answer chunk: a completion's
    chunks went out with that null, which OpenAI's schema does not allow there (the
    OpenAI SDK's types fail it). A completion's go out with none, a chat's null; the
    usage in the last chunk, and the running usage where the upstream sends it."""
    from proxy.protocol import CompletionRequest
    from tests.openai_spec import validate_completion_chunk

    usage = {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}
    options = {"stream": True, "stream_options": {"include_usage": True,
                                                  "continuous_usage_stats": True}}
    if route == "chat":
        c = ctx(**options)
        head = HEAD
        answer = [{**HEAD, "choices": [{"index": 0, "delta": {"content": t},
                                        "finish_reason": f}]}
                  for t, f in (("a", None), ("b", "stop"))]
    else:
        req = CompletionRequest.model_validate({"model": "up-model", "prompt": "hi",
                                                "max_tokens": 2, **options})
        c = RequestContext(route="completion", request=req,
                           principal=Principal("t", "user", "u"), request_id="r", headers={})
        head = {**HEAD, "object": "text_completion"}
        answer = [{**head, "choices": [{"index": 0, "text": t, "logprobs": None,
                                        "finish_reason": f}]}
                  for t, f in (("a", None), ("b", "length"))]
    running = {**usage, "completion_tokens": 1, "total_tokens": 8}
    pieces = sse({**answer[0], "usage": running}, {**answer[1], "usage": None},
                 {**head, "choices": [], "usage": usage}, "[DONE]")
    got, reply = await relayed(upstream, pieces, c)
    assert got == [{**answer[0], "usage": running},
                   {**answer[1], **({"usage": None} if route == "chat" else {})},
                   {**head, "choices": [], "usage": usage}]
    if route == "completion":
        for chunk in got:
            validate_completion_chunk(chunk)
    assert reply.usage == usage


async def test_running_usage_goes_out_with_its_total(upstream: Upstream) -> None:
    """The running usage (`continuous_usage_stats`, asked) of an upstream that leaves out
    its `total_tokens` (or sends another) went out so: OpenAI's usage requires it, and a
    client summing it got none. It goes out with the prompt's and completion's sum, as
    the last chunk's does."""
    running = [{**c, "usage": {"prompt_tokens": 7, "completion_tokens": i + 1,
                               **({"total_tokens": 99} if i else {})}}
               for i, c in enumerate(CHUNKS)]
    usage = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    got, reply = await relayed(upstream, sse(*running, {**HEAD, "choices": [],
                                                        "usage": usage}, "[DONE]"), ctx(
        stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True}))
    assert [g["usage"] for g in got] == [
        {"prompt_tokens": 7, "completion_tokens": i + 1, "total_tokens": 8 + i}
        for i in range(3)] + [usage]
    assert reply.usage == usage


@pytest.mark.parametrize("options", [{"include_usage": True, "continuous_usage_stats": True},
                                     {"include_usage": True}, None])
async def test_an_empty_usage_is_no_usage(upstream: Upstream, options: Any) -> None:
    """An upstream's usage `{}` (no count in it) passed the relay's checks: the running
    usage went out as `{}`, and a usage chunk with `usage: {}` went out as it came. It is
    no usage, as `null` is: not sent, not counted (the rate limiter keeps its
    reservation, the cache stores nothing)."""
    running = [{**c, "usage": {}} for c in CHUNKS]
    got, reply = await relayed(upstream, sse(*running, {**HEAD, "choices": [], "usage": {}},
                                             "[DONE]"),
                               ctx(stream=True, **({"stream_options": options}
                                                   if options else {})))
    assert got == ([{**c, "usage": None} for c in CHUNKS] if options else CHUNKS)
    assert reply.usage is None
    for chunk in got:
        validate("CreateChatCompletionStreamResponse", chunk)


async def test_running_usage_the_client_did_not_ask_for_is_not_on_its_answer_chunks(
        upstream: Upstream) -> None:
    """An upstream that sends the usage so far on every chunk (vLLM's
    `continuous_usage_stats`, which some servers send unasked): a client that asked for
    `include_usage` alone gets `usage: null` on each answer chunk, as OpenAI sends them,
    and the usage in the last chunk."""
    usage = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    running = [{**c, "usage": {**usage, "completion_tokens": i + 1,
                               "total_tokens": 8 + i}} for i, c in enumerate(CHUNKS)]
    pieces = sse(*running, {**HEAD, "choices": [], "usage": usage}, "[DONE]")
    got, reply = await relayed(upstream, pieces, ctx(
        stream=True, stream_options={"include_usage": True}))
    assert got == [*({**c, "usage": None} for c in CHUNKS),
                   {**HEAD, "choices": [], "usage": usage}]
    assert reply.usage == usage

@pytest.mark.parametrize("status", [429, 503])
@pytest.mark.parametrize(("given", "passed_on"), [
    ("7", "7"),
    ("²", "1"),  # ("²".isdigit(), which int() refuses: it was a 500)
    ("١٢", "1"),  # (Arabic-Indic digits: passed on raw)
    ("9" * 30, "3600"),  # (passed on raw: a client told to wait forever)
    ("Wed, 21 Oct 2099 07:28:00 GMT", "3600"),  # (an HTTP date: it was "1")
    ("Wed, 21 Oct 2015 07:28:00 GMT", "1"),  # (a date passed: it was "0", a loop)
    ("0", "1"),
    ("000", "1"),
    ("soon", "1"),
])
async def test_an_upstream_s_retry_after_is_read_strictly(
        upstream: Upstream, status: int, given: str, passed_on: str) -> None:
    """An upstream's `Retry-After` is ASCII digits or an HTTP date, within an hour;
    anything else is the default (1 s)."""
    upstream.chat = answering(web.json_response(
        {"error": {"message": "busy"}}, status=status, headers={"Retry-After": given}))
    e = await refused(upstream, upstream.chat, RateLimited if status == 429 else EngineError)
    assert e.headers["retry-after"] == passed_on
    assert e.headers["retry-after-ms"] == str(int(passed_on) * 1000)


@pytest.mark.parametrize(("given", "told"), [("1.5", ("2", "1500")), ("0.2", ("1", "200")),
                                            ("2.", ("2", "2000")), ("1.5.2", ("1", "1000")),
                                            ("-1.5", ("1", "1000")), (".5", ("1", "1000"))])
async def test_an_upstream_s_retry_after_in_decimal_seconds_is_its_wait(
        upstream: Upstream, given: str, told: tuple[str, str]) -> None:
    """`Retry-After: 1.5` (not RFC 9110's digits, but sent by some servers) was read as
    none, the default 1 s: the client came back early, to another 429. It is the wait
    it says, `Retry-After` rounded up to whole seconds."""
    upstream.chat = answering(web.json_response(
        {"error": {"message": "busy"}}, status=429, headers={"Retry-After": given}))
    e = await refused(upstream, upstream.chat, RateLimited)
    assert (e.headers["retry-after"], e.headers["retry-after-ms"]) == told


async def test_an_upstream_s_retry_after_as_a_date_counts_from_now(upstream: Upstream) -> None:
    import time
    from email.utils import formatdate

    upstream.chat = answering(web.json_response({"error": {"message": "busy"}}, status=503,
        headers={"Retry-After": formatdate(time.time() + 30, usegmt=True)}))
    e = await refused(upstream, upstream.chat, EngineError)
    assert 28 <= int(e.headers["retry-after"]) <= 31


DEEP = b"[" * 200_000 + b"]" * 200_000  # (JSON, nested past what the decoder's recursion takes)


@pytest.mark.parametrize(("status", "stream", "error"), [
    (200, False, EngineError),  # a whole answer
    (400, False, UpstreamError),  # an error's body: the status is the client's
    (200, True, EngineError),  # a stream's event
])
async def test_json_nested_too_deeply_is_an_unreadable_answer(
        upstream: Upstream, status: int, stream: bool, error: type[WeirError]) -> None:
    """It was a RecursionError out of the decoder: a 500."""
    async def deep(request: web.Request) -> web.StreamResponse:
        if stream:
            return await sse_handler([b"data: " + DEEP + b"\n\n"])(request)
        return web.Response(body=DEEP, status=status, content_type="application/json")

    upstream.chat = deep
    engine = await engine_for(upstream.base_url, models=["up-model"])
    try:
        with pytest.raises(error):
            reply = await engine(ctx(stream=stream))
            async for _ in reply:  # type: ignore[union-attr]
                pass
        assert engine.stats().running == 0
    finally:
        await engine.close()


async def test_a_model_list_nested_too_deeply_is_asked_again(
        upstream: Upstream, monkeypatch: pytest.MonkeyPatch) -> None:
    """At start it stopped Weir starting (a RecursionError out of `start`); while asking
    again it ended the task unseen, and Weir was not ready for good."""
    from proxy import upstream as module
    from tests.waiting import eventually

    monkeypatch.setattr(module, "DISCOVERY_FIRST_S", 0.01)
    answers = 2  # the first (at start) and the second (the task's) are too deep
    real = upstream.models

    async def models(request: web.Request) -> web.Response:
        nonlocal answers
        if answers:
            answers -= 1
            return web.Response(body=DEEP, content_type="application/json")
        return await real(request)

    upstream.list_models = models
    engine = await engine_for(upstream.base_url)
    try:
        assert not engine.ready()
        await eventually(engine.ready, timeout=10)
        assert [m.id for m in engine.models()] == ["up-model", "up-other"] and not answers
    finally:
        await engine.close()


async def test_model_discovery_outlives_a_failure_of_its_own(
        upstream: Upstream, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever fails while asking (a bug's exception, say) is a reason to ask again,
    logged: not an exception out of `start`, nor the retrying task's end."""
    from proxy import upstream as module
    from tests.waiting import eventually

    monkeypatch.setattr(module, "DISCOVERY_FIRST_S", 0.01)
    real = UpstreamTerminal._ask_models
    fails = 2

    async def ask(self: UpstreamTerminal) -> str | None:
        nonlocal fails
        if fails:
            fails -= 1
            raise RuntimeError("a bug")
        return await real(self)

    monkeypatch.setattr(UpstreamTerminal, "_ask_models", ask)
    engine = await engine_for(upstream.base_url)
    try:
        assert not engine.ready()
        await eventually(engine.ready, timeout=10)
        assert not fails
    finally:
        await engine.close()


def test_events_split_anywhere_read_the_same() -> None:
    """Every framing the spec allows, cut at every point (a CRLF's halves in two
    pieces), reads as the events whole."""
    from proxy.upstream import SseEvents

    text = (b": c\r\ndata: a\r\ndata:b\r\n\r\nevent: x\rdata: c\r\rdata: d\n\n"
            b"data: e\r\n\r\ndata: f\r\n")
    expected = [b"a\nb", b"c", b"d", b"e"]
    whole = SseEvents()
    assert whole.feed(text) + whole.end() == expected
    for cut in range(len(text) + 1):
        for second in range(cut, len(text) + 1):
            events = SseEvents()
            got = [*events.feed(text[:cut]), *events.feed(text[cut:second]),
                   *events.feed(text[second:]), *events.end()]
            assert got == expected, (cut, second)


def test_a_long_line_in_small_pieces_is_read_in_linear_time() -> None:
    """Each piece of an unfinished line copied the whole line so far: a 15 MB line in
    1 KB pieces took 8 s of CPU. (4 MiB in 1 KiB pieces: about 6 s before here, some
    milliseconds now.)"""
    import time

    from proxy.upstream import SseEvents

    events = SseEvents()
    piece = b"x" * 1024
    began = time.process_time()
    assert events.feed(b"data: ") == []
    for _ in range(4 * 1024):
        assert events.feed(piece) == []
    assert events.feed(b"\n\n") == [b"x" * (4 << 20)]
    assert time.process_time() - began < 1.0


@pytest.mark.parametrize("given", [
    {"prompt_tokens": 7, "completion_tokens": 3},  # (no total: some servers send none)
    {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": None},
    {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 12},  # not their sum
])
async def test_a_whole_answer_s_usage_goes_out_with_its_total(
        upstream: Upstream, given: dict[str, Any]) -> None:
    """A whole answer whose usage lacks its `total_tokens` (OpenAI's schema requires it),
    or holds another than its counts' sum: it went out so, and the rate limiter, which
    settles a reservation from the total, kept the whole reservation (up to `max_tokens`)
    instead of charging the 10 tokens counted. It is counted as a stream's usage is:
    prompt plus completion, its breakdowns kept."""
    details = {"prompt_tokens_details": {"cached_tokens": 2}}
    upstream.chat = lambda request: _json({**ANSWER, "usage": {**given, **details}})
    whole = await answered(upstream)
    assert isinstance(whole, Completion)
    assert whole.body["usage"] == {"prompt_tokens": 7, "completion_tokens": 3,
                                   "total_tokens": 10, **details}
    validate("CreateChatCompletionResponse", whole.body)


async def test_an_answer_without_its_head_goes_out_with_one(upstream: Upstream) -> None:
    """An OpenAI-compatible server may leave out an answer's id, object, created or
    model (or send another type): they were relayed as sent, and OpenAI's schema (the
    SDK's models, a stored completion) requires each. A stream's chunks share one id."""
    bare = {"choices": ANSWER["choices"], "usage": ANSWER["usage"], "created": "soon",
            "object": "text_completion"}
    upstream.chat = lambda request: _json(bare)
    whole = await answered(upstream)
    assert isinstance(whole, Completion)
    validate("CreateChatCompletionResponse", whole.body)
    assert whole.body["id"].startswith("chatcmpl-") and whole.body["model"] == "up-model"
    assert type(whole.body["created"]) is int and whole.body["object"] == "chat.completion"
    pieces = sse(*map(json.dumps, (
        {"choices": [{"index": 0, "delta": {"content": "a"}}]},
        {"id": 7, "model": "", "choices": [{"index": 0, "delta": {},
                                            "finish_reason": "stop"}]},
        {"id": "other", "choices": [], "usage": ANSWER["usage"]})), "[DONE]")
    chunks, _ = await relayed(upstream, pieces, ctx(stream=True,
                                                    stream_options={"include_usage": True}))
    for chunk in chunks:
        validate("CreateChatCompletionStreamResponse", chunk)
    assert len({c["id"] for c in chunks[:2]}) == 1 and chunks[2]["id"] == "other"
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert {c["model"] for c in chunks} == {"up-model"}


async def _json(body: dict[str, Any]) -> web.Response:
    return web.json_response(body)


@pytest.mark.parametrize("secret", ["the-edge-own-secret", None])
async def test_a_tenants_prefix_cache_salt_goes_upstream_only_when_asked(
        upstream: Upstream, secret: str | None) -> None:
    """A vLLM upstream salts its prefix cache by `cache_salt`: without one, every tenant
    of this gateway shares it there (a prefix another tenant sent answers faster). Sent
    only when asked (a Weir upstream refuses the field), one per tenant, keyed by the
    gateway's secret where it has one."""
    import hashlib
    import hmac

    from proxy.serving import cache_salt

    salts = []
    for asked in (False, True):
        engine = await engine_for(upstream.base_url, models=["up-model"], cache_salt=asked,
                                  on_behalf_of_secret=secret)
        try:
            for tenant, user in (("a", "u1"), ("a", "u2"), ("b", "u1")):
                c = ctx()
                c.principal = Principal(tenant, "user", user)
                await engine(c)
                salts.append(upstream.seen[-1][1].get("cache_salt"))
        finally:
            await engine.close()
    assert salts[:3] == [None, None, None]
    a, a2, b = salts[3:]
    assert a == a2 != b and isinstance(a, str) and len(a) == 32
    local = ctx()
    local.principal = Principal("a", "user", "u1")  # without a secret: the local engine's
    assert a == (hmac.new(secret.encode(), b"weir-tenant:a", hashlib.sha256).hexdigest()[:32]
                 if secret else cache_salt(local))


async def test_a_failed_model_discovery_logs_no_exception_message(
        upstream: Upstream, monkeypatch: pytest.MonkeyPatch, logs: Any) -> None:
    """An unexpected exception while asking the upstream for its models was logged with
    `log.exception`: its message and whole traceback in the line, which may quote the
    upstream's URL with its credentials, its key, or a body. The line names the error's
    type and where it was raised, as every other unexpected error's does."""
    from proxy import upstream as module
    from tests.waiting import eventually

    monkeypatch.setattr(module, "DISCOVERY_FIRST_S", 0.01)
    real = UpstreamTerminal._ask_models
    fails = 1
    secret = "sk-upstream-SECRET-0123456789"

    async def ask(self: UpstreamTerminal) -> str | None:
        nonlocal fails
        if fails:
            fails -= 1
            raise RuntimeError(f"http://weir:{secret}@upstream.internal/v1 said no")
        return await real(self)

    monkeypatch.setattr(UpstreamTerminal, "_ask_models", ask)
    engine = await engine_for(upstream.base_url)
    try:
        await eventually(engine.ready, timeout=10)
    finally:
        await engine.close()
    lines = [json.loads(line) for line in logs.getvalue().splitlines() if line.strip()]
    failed = [line for line in lines if line["event"] == "upstream model discovery failed"]
    assert failed and failed[0]["error"] == "RuntimeError", lines
    assert "test_upstream.py" in failed[0]["at"]
    assert secret not in logs.getvalue() and "said no" not in logs.getvalue()


async def test_an_upstream_down_at_refresh_is_said_once_not_every_minute(
        upstream: Upstream, monkeypatch: pytest.MonkeyPatch) -> None:
    """The list asked again every `MODELS_REFRESH_S`: an upstream down for a night
    logged a line each time (an unexpected error its traceback). Said once when the
    list stops coming, once when it comes again; the task ends with the terminal."""
    from proxy import upstream as module
    from tests.waiting import eventually

    said: list[str] = []

    class Spy:
        def __getattr__(self, level: str) -> Callable[..., None]:
            return lambda event, **fields: said.append(level)

    monkeypatch.setattr(module, "MODELS_REFRESH_S", 0.01)
    engine = await engine_for(upstream.base_url)
    state, asked, ask = "up", 0, engine._ask_models

    async def counted() -> str | None:
        nonlocal asked
        asked += 1
        if state == "broken":
            raise RuntimeError("a bug, not the upstream")
        return "status 503" if state == "down" else await ask()
    monkeypatch.setattr(engine, "_ask_models", counted)
    monkeypatch.setattr(module, "log", Spy())

    async def rounds(now: str, n: int) -> None:
        nonlocal state
        state, first = now, asked
        await eventually(lambda: asked >= first + n)
    try:
        for now in ("down", "up", "down", "up", "broken", "up"):
            await rounds(now, 5)
        assert said == ["warning", "info", "warning", "info", "error", "warning",
                        "info"]
        refresh = engine._refresh
        assert refresh is not None and not refresh.done()
    finally:
        await engine.close()
    assert refresh.done() and refresh.cancelled()


@pytest.mark.parametrize("other", [3, 1, -1, 0])
async def test_an_answer_with_a_choice_not_asked_for_is_unreadable(upstream: Upstream,
                                                                   other: int) -> None:
    """An upstream answer holding a choice whose index the request never asked for (`3`,
    `1` with `n: 1`, `-1`) or one index twice went out so, and the cache stored it: a
    client asking one choice got two, one of them the upstream's alone, and every replay
    too. Whole or streamed, it is an unreadable answer (a 502), as a malformed one is."""
    extra = {**ANSWER["choices"][0], "index": other}
    e = await refused(upstream, answering(web.json_response(
        {**ANSWER, "choices": [*ANSWER["choices"], extra]})), EngineError)
    assert "unreadable" in e.message
    chunk = {**HEAD, "choices": [{"index": other, "delta": {"content": "x"},
                                  "finish_reason": "stop"}]}
    if other:  # (a stream's index 0 again is the same choice)
        with pytest.raises(EngineError, match="unreadable"):
            await relayed(upstream, sse(CHUNKS[0], chunk, *CHUNKS[1:]))


def test_the_answer_digests_read_each_models_entries_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each model's digest held its base models' entries whole: a list naming each of K
    models K times, each time with another of them as its parent (K² entries, within
    the list's 16 MiB), had K³ entries digested, minutes of CPU on the event loop at
    each refresh of the list. Each model's entries are digested once, and a model's
    digest holds its bases' digests: the data digested stays within a few times the
    list's."""
    import orjson

    import proxy.upstream as upstream_module
    digested = [0]
    real = upstream_module.answer_digest

    def counting(settings: Any) -> str:
        digested[0] += len(orjson.dumps(settings, default=str))
        return real(settings)

    monkeypatch.setattr(upstream_module, "answer_digest", counting)
    k = 60
    listed = [{"id": f"m{i}", "object": "model", "parent": f"m{j}", "root": f"r{j}"}
              for i in range(k) for j in range(k)]
    digests = upstream_module.served_digests(listed)
    assert len(set(digests.values())) == k
    assert digested[0] < 4 * len(orjson.dumps(listed))


@pytest.mark.parametrize("usage", [
    {"prompt_tokens": True, "completion_tokens": 1},  # (Python's 1)
    {"prompt_tokens": 1, "completion_tokens": -2},
    {"prompt_tokens": 1.5, "completion_tokens": 1},
    {"prompt_tokens": 1, "completion_tokens": -1.0},
    {"prompt_tokens": "1", "completion_tokens": 1},
    {"prompt_tokens": 1e300, "completion_tokens": 1},
    {"prompt_tokens": 10 ** 20, "completion_tokens": 1},  # (no count: the limiter's)
    {"prompt_tokens": 1, "completion_tokens": 1, "prompt_tokens_details": {
        "cached_tokens": True}},
    {"prompt_tokens": 1, "completion_tokens": 1, "completion_tokens_details": {
        "reasoning_tokens": -1}},
    {"prompt_tokens": 1, "completion_tokens": 1, "prompt_tokens_details": {
        "cached_tokens": 0.5}},
])
async def test_an_upstream_s_usage_that_counts_no_whole_tokens_is_unreadable(
        upstream: Upstream, usage: dict[str, Any]) -> None:
    """Counts an upstream sends are read strictly: `true` (Python's 1), a negative, a
    fraction or a number past any answer's was counted, or a breakdown's dropped as if
    absent. Whole or streamed, such a usage is an unreadable answer (a 502), never a
    count passed on, charged or cached."""
    e = await refused(upstream, answering(web.json_response({**ANSWER, "usage": usage})),
                      EngineError)
    assert "unreadable" in e.message
    with pytest.raises(EngineError, match="unreadable"):
        await relayed(upstream, sse(*CHUNKS, {**HEAD, "choices": [], "usage": usage},
                                    "[DONE]"))


async def test_an_upstream_s_usage_in_whole_floats_is_read_as_its_counts(
        upstream: Upstream) -> None:
    """A usage counted in whole floats (`prompt_tokens: 12.0`, `cached_tokens: 0.0`: one
    number type in JSON, a server summing in floats) was a 502: each is the count it
    is, passed on, charged and cached as an int, whole or streamed."""
    usage = {"prompt_tokens": 12.0, "completion_tokens": 3.0, "total_tokens": 15.0,
             "prompt_tokens_details": {"cached_tokens": 4.0},
             "completion_tokens_details": {"reasoning_tokens": 0.0}}
    want = {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15,
            "prompt_tokens_details": {"cached_tokens": 4},
            "completion_tokens_details": {"reasoning_tokens": 0}}
    upstream.chat = answering(web.json_response({**ANSWER, "usage": usage}))
    reply = await answered(upstream)
    assert isinstance(reply, Completion)
    assert reply.body["usage"] == want
    assert all(type(v) is int for v in reply.body["usage"]["prompt_tokens_details"].values())
    chunks, stream = await relayed(upstream, sse(*CHUNKS, {**HEAD, "choices": [],
                                                           "usage": usage}, "[DONE]"),
                                   ctx(stream=True, stream_options={"include_usage": True}))
    assert chunks[-1]["usage"] == want and stream.usage == want
    assert type(chunks[-1]["usage"]["prompt_tokens"]) is int


@pytest.mark.parametrize("choice", [
    {"index": True, "delta": {"content": "x"}, "finish_reason": "stop"},  # (read as 1)
    {"index": 0.0, "delta": {"content": "x"}, "finish_reason": "stop"},
    {"index": 1, "delta": {"content": "x"}, "finish_reason": 7},
    # (a falsy one, `false`, `0`, `[]`, was read as none given: relayed as it came)
    {"index": 1, "delta": {"content": "x"}, "finish_reason": False},
    {"index": 1, "delta": {"content": 0}, "finish_reason": "stop"},
    {"index": 1, "delta": {"content": []}, "finish_reason": "stop"},
    {"index": 1, "delta": {"tool_calls": [{"index": True, "id": "call_1", "type": "function",
                                           "function": {"name": "f", "arguments": "{}"}}]},
     "finish_reason": "tool_calls"},
    {"index": 1, "delta": {"tool_calls": [{"index": -1, "id": "call_1", "type": "function",
                                           "function": {"name": "f", "arguments": "{}"}}]},
     "finish_reason": "tool_calls"},
    # (a numeric string: no server sends one, vLLM's, OpenAI's, TGI's send ints; read as
    # a count, "01" and "0" would be one call, or a later piece's "1 " another)
    {"index": 1, "delta": {"tool_calls": [{"index": "0", "id": "call_1", "type": "function",
                                           "function": {"name": "f", "arguments": "{}"}}]},
     "finish_reason": "tool_calls"},
])
async def test_a_stream_s_index_or_finish_reason_of_another_type_is_unreadable(
        upstream: Upstream, choice: dict[str, Any]) -> None:
    """A choice's `index: true` was read as choice 1 (`isinstance(True, int)`): with
    `n: 2` the answer passed for whole, relayed with `index: true` and cached so; a
    finish reason that is no string was relayed and stored, a tool call's `true` index
    renumbered, its `-1` relayed. Each is an unreadable chunk (a 502)."""
    with pytest.raises(EngineError, match="unreadable"):
        await relayed(upstream, sse(*CHUNKS, {**HEAD, "choices": [choice]}, "[DONE]"),
                      ctx(stream=True, n=2))


@pytest.mark.parametrize("index", [True, -1, 10 ** 20, 0.0])
async def test_a_whole_answer_s_choice_index_that_is_no_count_is_unreadable(
        upstream: Upstream, index: Any) -> None:
    """A whole answer's choice index was held to `type(...) is int` alone, where a
    stream's is a count (`rendering.is_count`): `-1` or `10**20` was read as a choice
    missing (`ChoicesMissing`, "fewer choices than asked": an upstream that ignores `n`,
    which the breaker does not count). Read as a stream's is: an unreadable answer."""
    choice = {**ANSWER["choices"][0], "index": index}
    e = await refused(upstream, answering(web.json_response({**ANSWER, "choices": [choice]})),
                      EngineError)
    assert "unreadable" in e.message


@pytest.mark.parametrize("usage", [{}, None, {"total_tokens": 3}])
async def test_a_whole_answer_s_empty_usage_is_no_usage(upstream: Upstream,
                                                        usage: Any) -> None:
    """A whole answer's `usage: {}` (no count in it) was a 502, where a stream's is no
    usage, as `null` is: so is a whole answer's, which goes out with none (OpenAI's has
    it absent, never null: a `null` went out so too) and is counted as not known (the
    rate limiter keeps its reservation, the cache stores nothing)."""
    upstream.chat = answering(web.json_response({**ANSWER, "usage": usage}))
    reply = await answered(upstream)
    assert isinstance(reply, Completion) and "usage" not in reply.body
    validate("CreateChatCompletionResponse", reply.body)


async def test_what_a_choice_streams_after_its_finish_is_dropped(upstream: Upstream) -> None:
    """OpenAI's streams send nothing for a choice after its finish reason. An upstream's
    text, calls or second reason after it were relayed and kept in the answer the cache
    stores (`t0t1t2 and more`, a replay so). They are dropped: the client gets the
    answer as it ended, the cache stores the same, the first finish reason stands; what
    else the chunk holds (another choice's text, the usage) goes on; a finish repeated
    is dropped too (a choice's finish reason goes out once)."""
    usage = {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    pieces = sse(*CHUNKS, {**HEAD, "choices": [{"index": 1, "delta": {"content": "u"}}]},
                 {**HEAD, "choices": [{"index": 0, "delta": {"content": " and more"}}]},
                 {**HEAD, "choices": [
                     {"index": 0, "delta": {"content": "!"}, "finish_reason": "length"},
                     {"index": 1, "delta": {"content": "v"}, "finish_reason": "stop"}]},
                 {**HEAD, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
                  "usage": usage}, "[DONE]")
    got, reply = await relayed(upstream, pieces, ctx(
        stream=True, n=2, stream_options={"include_usage": True}))
    assert [c["choices"] for c in got] == [
        *(c["choices"] for c in CHUNKS),
        [{"index": 1, "delta": {"content": "u"}, "finish_reason": None}],
        [{"index": 1, "delta": {"content": "v"}, "finish_reason": "stop"}], []]
    assert got[-1]["usage"] == usage
    assert reply.answer == [{"index": 0, "text": "t0t1t2", "finish_reason": "stop"},
                            {"index": 1, "text": "uv", "finish_reason": "stop"}]
    for chunk in got:
        validate("CreateChatCompletionStreamResponse", chunk)


async def test_a_finish_reason_repeated_goes_out_once(upstream: Upstream) -> None:
    """OpenAI's streams give each choice's finish reason once, in one chunk. An
    upstream that repeats it (an empty delta, or `length` after `stop`) had the repeat
    relayed, as the first reason: a client counting a choice's ends saw two. The repeat
    is dropped; what else such an entry carries (Azure's `content_filter_results`) goes
    on without it."""
    filtered = {"hate": {"filtered": False, "severity": "safe"}}
    got, reply = await relayed(upstream, sse(
        *CHUNKS, {**HEAD, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {**HEAD, "choices": [{"index": 0, "delta": {}, "finish_reason": "length",
                              "content_filter_results": filtered}]},
        "[DONE]"), ctx(stream=True))
    ends = [c for chunk in got for c in chunk["choices"] if c.get("finish_reason")]
    assert ends == [CHUNKS[-1]["choices"][0]]
    assert got[-1]["choices"] == [{"index": 0, "delta": {}, "finish_reason": None,
                                   "content_filter_results": filtered}]
    assert reply.answer == [{"index": 0, "text": "t0t1t2", "finish_reason": "stop"}]


async def test_an_upstream_s_own_usage_keys_are_not_passed_on_as_usage(
        upstream: Upstream) -> None:
    """OpenAI's `CompletionUsage` allows keys of its own (no `additionalProperties:
    false`), but Weir's usage is what it counts, stores and replays: counts and their
    breakdowns only. Groq's timings (`queue_time`: one request's, replayed stale by the
    cache) and DeepSeek's cache counts (`prompt_cache_hit_tokens`: the miss's prompt,
    wrong for a semantic hit's) are left out of it, whole or streamed; what else the
    upstream's chunk carries (Groq's `x_groq`) passes as it came."""
    own = {"queue_time": 0.02, "prompt_cache_hit_tokens": 5, "prompt_cache_miss_tokens": 2}
    usage = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    upstream.chat = lambda request: _json({**ANSWER, "usage": {**usage, **own}})
    whole = await answered(upstream)
    assert isinstance(whole, Completion) and whole.body["usage"] == usage
    groq = {"id": "req_1", "usage": {"queue_time": 0.02}}
    got, reply = await relayed(upstream, sse(
        *CHUNKS, {**HEAD, "choices": [], "usage": {**usage, **own}, "x_groq": groq},
        "[DONE]"), ctx(stream=True, stream_options={"include_usage": True}))
    assert got[-1]["usage"] == usage and got[-1]["x_groq"] == groq
    assert reply.usage == usage


async def test_each_upstream_s_told_once_warnings_name_that_upstream(
        logs: io.StringIO) -> None:
    """A stream that goes on after its finish, or comes without usage, is told once per
    upstream; the warning named the model alone, so of a primary upstream and a fallback
    serving the same model the second's was one more line the operator could not tell
    from the first's. Each names its upstream's host and port (never the credentials a
    `base_url` may hold)."""
    after = sse(*[dict(c) for c in CHUNKS],
                {**HEAD, "choices": [{"index": 0, "delta": {"content": "more"}}]}, "[DONE]")
    ups = [Upstream(), Upstream()]
    engines, named = [], []
    try:
        for up in ups:
            await up.server.start_server()
            named.append(f"127.0.0.1:{up.server.port}")
            up.chat = sse_handler(after)
            url = up.base_url.replace("://", "://user:sec-ret-password@")
            engines.append(await engine_for(url, models=["up-model"]))
        for engine in [*engines, *engines]:
            reply = await engine(ctx(stream=True))
            assert isinstance(reply, Stream)
            assert len([c async for c in reply]) == len(CHUNKS)
    finally:
        for engine in engines:
            await engine.close()
        for up in ups:
            await up.server.close()
    assert "sec-ret-password" not in logs.getvalue()
    for told in ("after its finish_reason", "sent no usage"):
        lines = [json.loads(ln) for ln in logs.getvalue().splitlines() if told in ln]
        assert sorted(ln["upstream"] for ln in lines) == sorted(named)


@pytest.mark.parametrize("usage", ["absent", None, {}])
async def test_a_whole_answer_without_usage_is_told_once(
        upstream: Upstream, logs: io.StringIO, usage: Any) -> None:
    """A stream without usage was warned of once; a whole answer so (none, `null`, or
    `{}`: no usage either) went uncounted in silence (no tokens in `weir_tokens_total`,
    the rate limiter keeping its reservation) however many came. It is told once too."""
    body = {k: v for k, v in ANSWER.items() if k != "usage"}
    if usage != "absent":
        body["usage"] = usage
    async def answer(request: web.Request) -> web.StreamResponse:
        return web.json_response(body)

    upstream.chat = answer
    engine = await engine_for(upstream.base_url, models=["up-model"])
    try:
        for _ in range(2):
            reply = await engine(ctx())
            assert isinstance(reply, Completion) and "usage" not in reply.body
    finally:
        await engine.close()
    told = [json.loads(ln) for ln in logs.getvalue().splitlines() if "sent no usage" in ln]
    assert [(t["level"], t["model"], t["streamed"]) for t in told] == [
        ("warning", "up-model", False)]


@pytest.mark.parametrize(("sent", "relayed_as"), [
    ("end_turn", "stop"), ("eos", "stop"), ("stop_sequence", "stop"), ("STOP", "stop"),
    ("max_tokens", "length"), ("MAX_TOKENS", "length"), ("tool_use", "tool_calls"),
    ("SAFETY", "content_filter"), ("length", "length"), ("made_up_reason", "stop"),
])
async def test_a_finish_reason_outside_the_spec_s_enum_is_relayed_as_the_spec_s(
        upstream: Upstream, sent: str, relayed_as: str) -> None:
    """Anthropic's `end_turn`, TGI's `eos`, Gemini's `STOP` or `MAX_TOKENS` was relayed as
    it came: an SDK checking the spec's enum refused the answer, and the cache stored it
    so. Known aliases are the spec's value; one unknown is `stop`. Whole or streamed."""
    choice = {**ANSWER["choices"][0], "finish_reason": sent}
    upstream.chat = answering(web.json_response({**ANSWER, "choices": [choice]}))
    reply = await answered(upstream)
    assert isinstance(reply, Completion)
    assert reply.body["choices"][0]["finish_reason"] == relayed_as
    validate("CreateChatCompletionResponse", reply.body)
    last = {**HEAD, "choices": [{"index": 0, "delta": {"content": "t2"},
                                 "finish_reason": sent}]}
    chunks, stream = await relayed(upstream, sse(*CHUNKS[:2], last, "[DONE]"))
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, relayed_as]
    assert stream.answer is not None and stream.answer[0]["finish_reason"] == relayed_as


async def test_a_finish_reason_unknown_is_told_once_without_the_answer(
        upstream: Upstream, logs: io.StringIO) -> None:
    """An unknown finish reason is relayed as `stop` and told once, naming the reason
    and the upstream, never the answer's text."""
    choice = {"index": 0, "message": {"role": "assistant", "content": "secret words"},
              "finish_reason": "weird_reason"}
    async def answer(request: web.Request) -> web.StreamResponse:
        return web.json_response({**ANSWER, "choices": [choice]})

    upstream.chat = answer
    engine = await engine_for(upstream.base_url, models=["up-model"])
    try:
        for _ in range(2):
            reply = await engine(ctx())
            assert isinstance(reply, Completion)
            assert reply.body["choices"][0]["finish_reason"] == "stop"
    finally:
        await engine.close()
    told = [json.loads(ln) for ln in logs.getvalue().splitlines() if "finish_reason" in ln]
    assert len(told) == 1
    assert told[0]["finish_reason"] == "weird_reason"
    assert "secret words" not in logs.getvalue()


def test_a_completion_s_finish_reason_is_the_completions_enum() -> None:
    """A completion has no calls: `tool_calls`, `tool_use` or `function_call` is `stop`
    there; `""` is no finish (the choice goes on)."""
    from proxy.upstream import spec_finish
    assert spec_finish("tool_calls", "completion") == ("stop", True)
    assert spec_finish("tool_use", "completion") == ("stop", True)
    assert spec_finish("function_call", "chat") == ("function_call", True)
    assert spec_finish("max_tokens", "completion") == ("length", True)
    assert spec_finish("", "chat") == (None, True)


@pytest.mark.parametrize("stream", [False, True])
async def test_an_error_said_with_a_200_is_the_upstream_s_error(
        upstream: Upstream, stream: bool) -> None:
    """A 200 whose JSON body is an OpenAI error (some servers and proxies answer so) was
    read as an unreadable answer (whole) or a stream that ended early (streamed): a 502
    the breaker counted, the client's own error (a model it does not serve, a value
    refused) lost. It is read as an in-band error is: the client's 400 where it says so,
    else the upstream's failure."""
    err = {"error": {"message": "bad value", "type": "invalid_request_error",
                     "param": "top_p", "code": None}}
    e = await refused(upstream, answering(web.json_response(err)), UpstreamError) \
        if not stream else None
    if stream:
        async def answer(request: web.Request) -> web.StreamResponse:
            return web.json_response(err)
        upstream.chat = answer
        with pytest.raises(UpstreamError) as got:
            await answered(upstream, ctx(stream=True))
        e = got.value
    assert e is not None and e.status == 400 and e.message == "bad value"
    failed = {"error": {"message": "boom", "type": "server_error", "code": 500}}
    upstream.chat = answering(web.json_response(failed))
    with pytest.raises(EngineError, match="an error in a 200"):
        await answered(upstream, ctx(stream=stream))


async def test_a_whole_answer_to_a_stream_request_is_an_engine_failure(
        upstream: Upstream) -> None:
    """An upstream that ignores `stream` and answers JSON was read as an event stream of
    no events: "ended before it finished". It is told as what it is."""
    upstream.chat = answering(web.json_response(ANSWER))
    with pytest.raises(EngineError, match="whole answer"):
        await answered(upstream, ctx(stream=True))


@pytest.mark.parametrize("entry", [{"delta": None}, {}])
async def test_a_chunk_s_delta_null_or_absent_goes_out_as_an_object(
        upstream: Upstream, entry: dict[str, Any]) -> None:
    """A chat chunk's choice with `delta: null` (or none: a server's bare finish chunk)
    was relayed so; the spec requires the delta, an object (an SDK reading
    `choice.delta.content` failed on `None`). It goes out as `{}`."""
    last = {**HEAD, "choices": [{"index": 0, **entry, "finish_reason": "stop"}]}
    chunks, stream = await relayed(upstream, sse(*CHUNKS[:2], last, "[DONE]"))
    assert chunks[-1]["choices"][0]["delta"] == {}
    for chunk in chunks:
        validate("CreateChatCompletionStreamResponse", chunk)
    assert stream.answer is not None and stream.answer[0]["text"] == "t0t1"


async def test_an_answer_with_error_null_is_an_answer(upstream: Upstream) -> None:
    """`"error": null` beside an answer (some proxies always send the key) was read as an
    error: a whole answer unreadable, a stream failed mid-way. Null is no error; the key
    is not passed on."""
    async def answer(request: web.Request) -> web.StreamResponse:
        return web.json_response({**ANSWER, "error": None})

    upstream.chat = answer
    reply = await answered(upstream)
    assert isinstance(reply, Completion) and "error" not in reply.body
    chunks, stream = await relayed(upstream, sse(*[{**c, "error": None} for c in CHUNKS],
                                                 "[DONE]"))
    assert len(chunks) == len(CHUNKS) and all("error" not in c for c in chunks)
    assert stream.answer is not None and stream.answer[0]["text"] == "t0t1t2"


@pytest.mark.parametrize("reason", [None, "", "absent"])
async def test_a_whole_answer_s_choice_without_a_finish_reason_ended_with_stop(
        upstream: Upstream, logs: io.StringIO, reason: Any) -> None:
    """A whole answer's choice with no finish reason (null, `""`, left out) went out
    with `finish_reason: null`, which the spec's enum for a whole answer does not allow
    (an SDK checking it refused the answer). Its choice ended: `stop`, told once."""
    choice = {k: v for k, v in ANSWER["choices"][0].items() if k != "finish_reason"}
    if reason != "absent":
        choice["finish_reason"] = reason
    upstream.chat = answering(web.json_response({**ANSWER, "choices": [choice]}))
    reply = await answered(upstream)
    assert isinstance(reply, Completion)
    assert reply.body["choices"][0]["finish_reason"] == "stop"
    validate("CreateChatCompletionResponse", reply.body)
    assert "outside OpenAI's enum" in logs.getvalue()


@pytest.mark.parametrize("call", [
    {"index": 0, "id": "call_1", "type": None, "function": {"name": "f", "arguments": "{}"}},
    {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f",
                                                                  "arguments": None}},
])
async def test_a_tool_call_delta_s_nulls_are_left_out(upstream: Upstream,
                                                       call: dict[str, Any]) -> None:
    """A tool call delta's `type: null`, `function: null` or a function's `name: null`
    (some servers send what a piece lacks so) was relayed as it came, outside the
    spec's chunk (absent, never null): an SDK checking it refused the chunk. The nulls
    are left out; the call is assembled as before."""
    more = {"index": 0, "type": "function", "function": None}
    name_null = {"index": 0, "function": {"name": None, "arguments": ""}}
    chunks, stream = await relayed(upstream, sse(
        {**HEAD, "choices": [{"index": 0, "delta": {"tool_calls": [call]}}]},
        {**HEAD, "choices": [{"index": 0, "delta": {"tool_calls": [more]}}]},
        {**HEAD, "choices": [{"index": 0, "delta": {"tool_calls": [name_null]},
                              "finish_reason": "tool_calls"}]}, "[DONE]"))
    for chunk in chunks:
        validate("CreateChatCompletionStreamResponse", chunk)
    assert stream.answer is not None
    assert stream.answer[0]["tool_calls"][0]["function"]["name"] == "f"


@pytest.mark.parametrize("message", [
    {"content": "x"},  # (no role)
    {"role": None, "content": "x"},
    {"role": "assistant", "content": "x", "tool_calls": None},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "function": {"name": "f", "arguments": "{}"}}]},  # (no type)
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": None, "function": {"name": "f", "arguments": "{}"}}]},
])
async def test_a_whole_answer_s_message_is_given_what_the_spec_requires(
        upstream: Upstream, message: dict[str, Any]) -> None:
    """A whole answer's message without its role (or `role: null`), with `tool_calls:
    null`, or a call without its `type` was relayed and cached so, outside the spec (an
    SDK checking it refused the answer): the role is `assistant`, a call's type
    `function`, and `tool_calls: null` is left out."""
    choice = {"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}
    upstream.chat = answering(web.json_response({**ANSWER, "choices": [choice]}))
    reply = await answered(upstream)
    assert isinstance(reply, Completion)
    validate("CreateChatCompletionResponse", reply.body)
    assert reply.body["choices"][0]["message"]["role"] == "assistant"


@pytest.mark.parametrize("delta", [{"role": None, "content": "t2"},
                                   {"content": "t2", "tool_calls": None}])
async def test_a_chunk_s_delta_nulls_are_left_out(upstream: Upstream,
                                                  delta: dict[str, Any]) -> None:
    """A chunk's delta with `role: null` or `tool_calls: null` (servers that send every
    field on every chunk) was relayed so, outside the spec's chunk (absent, never
    null). They are left out; the text is relayed as it came."""
    last = {**HEAD, "choices": [{"index": 0, "delta": delta, "finish_reason": "stop"}]}
    chunks, stream = await relayed(upstream, sse(*CHUNKS[:2], last, "[DONE]"))
    assert chunks[-1]["choices"][0]["delta"] == {"content": "t2"}
    for chunk in chunks:
        validate("CreateChatCompletionStreamResponse", chunk)
    assert stream.answer is not None and stream.answer[0]["text"] == "t0t1t2"


async def test_a_choice_going_on_after_its_finish_in_the_same_chunk_is_dropped(
        upstream: Upstream) -> None:
    """A chunk whose entries end a choice and then go on with it (two entries of one
    index, the first with its finish reason) had the second's text relayed and kept in
    the answer the cache stores, as a later chunk's is not: it is dropped too."""
    last = {**HEAD, "choices": [
        {"index": 0, "delta": {"content": "t2"}, "finish_reason": "stop"},
        {"index": 0, "delta": {"content": "more"}, "finish_reason": None}]}
    chunks, stream = await relayed(upstream, sse(*CHUNKS[:2], last, "[DONE]"))
    assert [e["delta"].get("content") for e in chunks[-1]["choices"]] == ["t2"]
    assert stream.answer is not None and stream.answer[0]["text"] == "t0t1t2"


@pytest.mark.parametrize("sent", ["abort", "error", "ERROR", "insufficient_system_resource",
                                  "network_error", "TIMEOUT", "USER_CANCEL"])
async def test_a_finish_reason_that_says_the_upstream_failed_is_an_engine_failure(
        upstream: Upstream, sent: str) -> None:
    """vLLM's `abort` and `error`, Cohere's `ERROR`, DeepSeek's
    `insufficient_system_resource`, Zhipu's `network_error` end a choice cut by the
    upstream's failure: relayed as `stop` (an unknown reason's), the cut answer was
    stored by the cache (which keeps `stop`, never `abort`) and replayed as whole. It is
    an engine failure, whole or streamed (in-band once chunks went out), never cached."""
    choice = {**ANSWER["choices"][0], "finish_reason": sent}
    upstream.chat = answering(web.json_response({**ANSWER, "choices": [choice]}))
    with pytest.raises(EngineError, match="ended a choice in failure"):
        await answered(upstream)
    last = {**HEAD, "choices": [{"index": 0, "delta": {"content": "t2"},
                                 "finish_reason": sent}]}
    upstream.chat = sse_handler(sse(*CHUNKS[:2], last, "[DONE]"))
    engine = await engine_for(upstream.base_url, models=["up-model"])
    try:
        reply = await engine(ctx(stream=True))
        assert isinstance(reply, Stream)
        with pytest.raises(EngineError, match="ended a choice in failure"):
            async for _ in reply:
                pass
        assert reply.answer is None
    finally:
        await engine.close()


@pytest.mark.parametrize(("sent", "want"), [
    ("ERROR_TOXIC", "content_filter"), ("sensitive", "content_filter"),
    ("IMAGE_SAFETY", "content_filter"), ("LANGUAGE", "content_filter"),
    ("OTHER", "content_filter"), ("compaction", "length"),
    ("model_context_window_exceeded", "length"), ("MALFORMED_FUNCTION_CALL", "stop"),
    ("ERROR_LIMIT", "length"),
])
def test_other_servers_finish_reasons_map_as_litellm_maps_them(sent: str, want: str) -> None:
    """Cohere's `ERROR_TOXIC`, Zhipu's `sensitive`, Gemini's image and language filters
    were unknown, so `stop`: an answer a filter cut went out (and was cached) as whole.
    They are the spec's `content_filter`; Anthropic's context-window ends `length`."""
    from proxy.upstream import spec_finish
    assert spec_finish(sent, "chat") == (want, True)


@pytest.mark.parametrize("error", [{}, "", False])
async def test_an_answer_with_an_empty_error_is_an_answer(upstream: Upstream,
                                                          error: Any) -> None:
    """`"error": {}` (or `""`, `false`) beside an answer was read as an error: a whole
    answer a 502, a stream failed. OpenAI's SDK reads an error only where `error` is
    truthy; so does Weir, and the empty key is not passed on."""
    async def answer(request: web.Request) -> web.StreamResponse:
        return web.json_response({**ANSWER, "error": error})

    upstream.chat = answer
    reply = await answered(upstream)
    assert isinstance(reply, Completion) and "error" not in reply.body
    chunks, stream = await relayed(upstream, sse(*[{**c, "error": error} for c in CHUNKS],
                                                 "[DONE]"))
    assert len(chunks) == len(CHUNKS) and all("error" not in c for c in chunks)
    assert stream.answer is not None and stream.answer[0]["text"] == "t0t1t2"


async def test_a_stream_sent_as_json_s_content_type_is_relayed(upstream: Upstream) -> None:
    """A server that sends its events under `Content-Type: application/json` had them
    relayed; reading every JSON-typed body to a stream request as a whole answer made
    them a 502 ("unreadable answer"). The body tells: events are relayed, a JSON body
    (an error said with a 200, a whole answer) is read as one."""
    upstream.chat = sse_handler(sse(*CHUNKS, "[DONE]"), content_type="application/json")
    engine = await engine_for(upstream.base_url, models=["up-model"])
    try:
        reply = await engine(ctx(stream=True))
        assert isinstance(reply, Stream)
        assert [c["choices"][0]["delta"]["content"] async for c in reply] == ["t0", "t1", "t2"]
        assert reply.answer is not None and reply.answer[0]["text"] == "t0t1t2"
    finally:
        await engine.close()


@pytest.mark.parametrize("role", ["model", "user", 5])
async def test_an_answer_s_role_other_than_assistant_goes_out_as_assistant(
        upstream: Upstream, role: Any) -> None:
    """A role the spec's answer does not have (`model`, as some Gemini shims send it, or
    no string at all) was relayed and cached as it came, though a missing or null one
    was made `assistant`: an SDK checking the enum refused it. Whole or streamed, the
    answer's role is `assistant`."""
    choice = {"index": 0, "message": {"role": role, "content": "x"}, "finish_reason": "stop"}
    upstream.chat = answering(web.json_response({**ANSWER, "choices": [choice]}))
    reply = await answered(upstream)
    assert isinstance(reply, Completion)
    validate("CreateChatCompletionResponse", reply.body)
    first = {**HEAD, "choices": [{"index": 0, "delta": {"role": role, "content": "t0"}}]}
    chunks, _ = await relayed(upstream, sse(first, *CHUNKS[1:], "[DONE]"))
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"


@pytest.mark.parametrize("delta", [[], "", False])
async def test_a_chunk_s_empty_delta_of_another_type_goes_out_as_an_object(
        upstream: Upstream, delta: Any) -> None:
    """A delta of `[]`, `""` or `false` was read as none (`{}`) for the answer, yet
    relayed as it came, where `null` went out as `{}`: an SDK reading `delta.content`
    failed. It goes out as `{}` too."""
    last = {**HEAD, "choices": [{"index": 0, "delta": delta, "finish_reason": "stop"}]}
    chunks, stream = await relayed(upstream, sse(*CHUNKS[:2], last, "[DONE]"))
    assert chunks[-1]["choices"][0]["delta"] == {}
    for chunk in chunks:
        validate("CreateChatCompletionStreamResponse", chunk)
    assert stream.answer is not None and stream.answer[0]["text"] == "t0t1"


async def test_an_answer_sent_as_events_keeps_its_logprobs_and_reasoning(
        upstream: Upstream) -> None:
    """A whole answer assembled from an upstream's events (`stream: false` answered with
    a stream) lost what `ChunkAssembler` does not keep: the logprobs asked for (the
    answer said `logprobs: null`, as if none were asked), the reasoning and a refusal.
    They are joined as the whole answer would have carried them now, chat's and a
    completion's alike."""
    def lp(token: str) -> dict[str, Any]:
        return {"content": [{"token": token, "logprob": -0.5, "bytes": None,
                             "top_logprobs": []}], "refusal": None}

    upstream.chat = sse_handler(sse(
        {**HEAD, "choices": [{"index": 0, "delta": {"reasoning_content": "think "},
                              "logprobs": None, "finish_reason": None}]},
        {**HEAD, "choices": [{"index": 0, "delta": {"reasoning_content": "more"},
                              "logprobs": None, "finish_reason": None}]},
        {**HEAD, "choices": [{"index": 0, "delta": {"content": "a"}, "logprobs": lp("a"),
                              "finish_reason": None}]},
        {**HEAD, "choices": [{"index": 0, "delta": {"content": "b"}, "logprobs": lp("b"),
                              "finish_reason": "stop"}]}, "[DONE]"))
    reply = await answered(upstream, ctx(logprobs=True))
    assert isinstance(reply, Completion), reply
    validate("CreateChatCompletionResponse", reply.body)
    choice = reply.body["choices"][0]
    assert choice["message"]["content"] == "ab"
    assert choice["message"]["reasoning_content"] == "think more"
    assert [t["token"] for t in choice["logprobs"]["content"]] == ["a", "b"]

    head = {"id": "cmpl-up", "object": "text_completion", "created": 1, "model": "up-model"}

    def piece(text: str, at: int, finish: str | None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "text": text, "finish_reason": finish,
                                     "logprobs": {"tokens": [text], "token_logprobs": [-1.0],
                                                  "top_logprobs": [{text: -1.0}],
                                                  "text_offset": [at]}}]}

    upstream.chat = sse_handler(sse(piece("he", 0, None), piece("llo", 2, "length"),
                                    "[DONE]"))
    req = CompletionRequest.model_validate({"model": "up-model", "prompt": "hi", "logprobs": 1})
    c = RequestContext(route="completion", request=req, principal=Principal("t", "user", "u"),
                       request_id="r", headers={})
    reply = await answered(upstream, c)
    assert isinstance(reply, Completion), reply
    validate("CreateCompletionResponse", reply.body)
    assert reply.body["choices"][0]["logprobs"] == {
        "tokens": ["he", "llo"], "token_logprobs": [-1.0, -1.0],
        "top_logprobs": [{"he": -1.0}, {"llo": -1.0}], "text_offset": [0, 2]}


async def test_events_to_a_whole_request_that_stall_are_the_upstream_s_timeout(
        upstream: Upstream) -> None:
    """An upstream that streams a request for a whole answer, then stalls, was told as a
    stream's `timeout_s` is (`UpstreamDeadline`: "ask for fewer tokens", a deadline the
    breaker never counts): a hung upstream that always answers so never opened it. A
    whole answer's wait is timed as one (no `read_timeout_s` on it), so running past
    `timeout_s` is the upstream's `Timeout`, as a JSON body's that stalls is."""
    from plugins.breaker.plugin import is_engine_failure
    release = asyncio.Event()

    async def stalled(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"".join(sse(CHUNKS[0])))
        await release.wait()
        return resp

    upstream.chat = stalled
    engine = await engine_for(upstream.base_url, models=["up-model"], timeout_s=0.2)
    try:
        with pytest.raises(Timeout) as e:
            await engine(ctx())
        assert type(e.value) is Timeout and is_engine_failure(e.value)
        assert engine.stats().running == 0
    finally:
        release.set()
        await engine.close()
