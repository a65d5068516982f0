"""Traces (in-memory exporter), logs (captured) and metrics (parsed) of real requests.

A planted API key and a marker prompt must never appear in logs, spans or error
bodies, unless `logging.include_prompts` asks for prompts (the positive control)."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from bench.redis_server import RedisServer
from proxy.settings import TracingSettings
from proxy.tracing import configure_tracing
from tests.conftest import MakeClient, make_settings
from tests.metrics import metric
from tests.waiting import eventually

KEY = "sk-planted-SECRET-0123456789abcdef"
MARKER = "MARKER-7f3a-do-not-log"
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

_exporter = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    configure_tracing(TracingSettings(), exporter=_exporter)  # once per process
    _exporter.clear()
    yield _exporter
    _exporter.clear()


def settings(redis_url: str | None = None, rpm: int = 600, **logging: Any) -> Any:
    cache: dict[str, Any] = {"semantic": {"enabled": False}, "store_truncated": True}
    if redis_url:
        cache |= {"l2": {"enabled": True}, "redis": {"url": redis_url,
                                                     "key_prefix": "weir:obs:"}}
    return make_settings(
        auth={"mode": "keys", "keys": [{"key": KEY, "tenant": "acme", "role": "admin"}]},
        logging={"access_log": True, **logging},
        plugins=[{"name": "sanitizer"},
                 {"name": "rate_limit", "config": {"rules": [{"per": "key", "rpm": rpm}]}},
                 {"name": "cache", "config": cache}])


def body(stream: bool = False) -> dict[str, Any]:
    return {"model": "fake-model", "temperature": 0, "max_tokens": 3, "stream": stream,
            "messages": [{"role": "user", "content": f"What is {MARKER}?"}]}


async def test_span_tree(make_client: MakeClient, spans: InMemorySpanExporter,
                         redis_server: RedisServer) -> None:
    client = await make_client(settings(redis_server.url))
    r = await client.post("/v1/chat/completions", json=body(),
                          headers={"Authorization": f"Bearer {KEY}", "traceparent": TRACEPARENT})
    assert r.status == 200
    finished = {s.name: s for s in spans.get_finished_spans()}
    server = finished["HTTP POST /v1/chat/completions"]
    assert format(server.context.trace_id, "032x") == TRACEPARENT.split("-")[1]
    assert server.parent is not None and format(server.parent.span_id, "016x") == "00f067aa0ba902b7"
    assert server.attributes["http.response.status_code"] == 200
    by_id = {s.context.span_id: s for s in spans.get_finished_spans()}
    chain = [finished[f"plugin {n}"] for n in ("sanitizer", "rate_limit", "cache")]
    assert chain[0].parent.span_id == server.context.span_id  # type: ignore[union-attr]
    assert chain[1].parent.span_id == chain[0].context.span_id  # type: ignore[union-attr]
    assert chain[2].parent.span_id == chain[1].context.span_id  # type: ignore[union-attr]
    engine = finished["engine.generate"]
    assert by_id[engine.parent.span_id].name == "plugin cache"  # type: ignore[union-attr]
    assert engine.attributes["gen_ai.usage.output_tokens"] == 3
    assert engine.attributes["gen_ai.usage.input_tokens"] > 0
    assert [e.name for e in engine.events] == ["first_token"]
    assert "redis get" in finished


async def test_streams_are_traced_to_their_end(make_client: MakeClient,
                                               spans: InMemorySpanExporter) -> None:
    client = await make_client(settings())
    r = await client.post("/v1/chat/completions", json=body(stream=True),
                          headers={"Authorization": f"Bearer {KEY}"})
    await r.text()
    names = [s.name for s in spans.get_finished_spans()]
    assert "engine.generate" in names and "HTTP POST /v1/chat/completions" in names


async def test_no_key_or_prompt_leaks(make_client: MakeClient, spans: InMemorySpanExporter,
                                      logs: io.StringIO) -> None:
    client = await make_client(settings())
    h = {"Authorization": f"Bearer {KEY}"}
    await client.post("/v1/chat/completions", json=body(), headers=h)
    await (await client.post("/v1/chat/completions", json=body(stream=True), headers=h)).text()
    bad = await client.post("/v1/chat/completions", headers=h,
                            json={**body(), "temperature": 99})
    error_body = await bad.text()
    wrong = await client.post("/v1/chat/completions", json=body(),
                              headers={"Authorization": f"Bearer {KEY}-wrong"})
    error_body += await wrong.text()
    # a path no route serves is the caller's text: it is not logged (nor traced)
    unknown = await client.post(f"/v1/{MARKER}", json=body(), headers=h)
    assert unknown.status == 404
    # nor is a route's parameter, which is the caller's text too (with a key or without)
    for method, path in [("GET", f"/v1/responses/{MARKER}"), ("DELETE", f"/v1/responses/{MARKER}"),
                         ("GET", f"/v1/responses/{MARKER}/input_items"),
                         ("GET", f"/v1/models/{MARKER}"),
                         ("GET", "/v1/responses/sk-" + "0123456789abcdef" * 2),
                         ("GET", "/v1/responses/key-" + "0123456789abcdef" * 2)]:
        for headers in (h, {}):
            r = await client.request(method, path, headers=headers)
            assert r.status in (401, 404), (method, path, r.status)
            await r.read()  # (its error may name the id back: the caller's own text)
    assert '"path": "/v1/responses/{response_id}"' in logs.getvalue()
    assert "0123456789abcdef" not in logs.getvalue()
    text = logs.getvalue()
    assert '"event": "request"' in text  # the access lines are there
    exported = json.dumps([s.to_json() for s in spans.get_finished_spans()])
    for haystack in (text, exported, error_body):
        assert KEY not in haystack
        assert MARKER not in haystack
        assert "Bearer" not in haystack and "authorization" not in haystack.lower()


async def test_a_405_is_logged_and_traced_under_its_routes_template(
        make_client: MakeClient, spans: InMemorySpanExporter, logs: io.StringIO) -> None:
    """A method a known path does not serve (a 405) was logged as `path: "(no route)"`
    and traced as `unmatched`, as though its path were unknown: its route's template
    is written (what the other methods of that path log), never its parameters (the
    caller's text: an id, a key)."""
    client = await make_client(settings())
    h = {"Authorization": f"Bearer {KEY}"}
    for method, path in [("PUT", "/v1/chat/completions"),
                         ("PATCH", f"/v1/responses/{MARKER}"),
                         ("POST", f"/v1/models/{KEY}")]:
        r = await client.request(method, path, headers=h)
        assert r.status == 405, (method, path)
        await r.read()
    lines = [json.loads(x) for x in logs.getvalue().splitlines() if '"request"' in x]
    assert [(x["method"], x["path"], x["status"]) for x in lines] == [
        ("PUT", "/v1/chat/completions", 405), ("PATCH", "/v1/responses/{response_id}", 405),
        ("POST", "/v1/models/{model}", 405)]
    routes = [s.attributes["http.route"] for s in spans.get_finished_spans()
              if s.name.startswith("HTTP ")]  # type: ignore[index]
    assert routes == ["/v1/chat/completions", "/v1/responses/{response_id}",
                      "/v1/models/{model}"]
    text = logs.getvalue() + json.dumps([s.to_json() for s in spans.get_finished_spans()])
    assert MARKER not in text and KEY not in text


async def test_a_configured_key_sent_as_request_id_is_never_logged(
        make_client: MakeClient, logs: io.StringIO) -> None:
    """A request id that looks like a vendor key was replaced, but a key of no vendor's
    shape (`openssl rand -hex 32`) sent as `x-request-id` was echoed and written on every
    log line of the request. One of the configured keys is replaced as well."""
    hex_key, dotted, other = "8f" * 32, "corp.gateway:7f3a91c2", "9e" * 32
    client = await make_client(make_settings(
        auth={"mode": "keys", "keys": [{"key": KEY}, {"key": hex_key, "tenant": "b"},
                                       {"key": dotted, "tenant": "c"}]},
        logging={"access_log": True}))
    for rid in (hex_key, dotted):  # configured keys of no vendor's shape
        r = await client.get("/v1/models", headers={"Authorization": f"Bearer {hex_key}",
                                                    "x-request-id": rid})
        assert r.status == 200 and r.headers["x-request-id"] != rid
    r = await client.get("/v1/models", headers={"Authorization": f"Bearer {hex_key}",
                                                "x-request-id": other})
    assert r.headers["x-request-id"] == other  # a hex id that is no key is the caller's
    text = logs.getvalue()
    assert hex_key not in text and dotted not in text
    assert f'"request_id": "{other}"' in text


async def test_a_key_inside_a_request_id_is_never_logged(
        make_client: MakeClient, logs: io.StringIO) -> None:
    """Only a request id that was a configured key, or that began with a vendor key's
    shape, was replaced: a key behind a prefix (`x.` + the caller's own key, `req-` + an
    OpenAI key) or before a suffix was echoed and written on every log line of the
    request. Ids that merely hold such letters stay the caller's."""
    hex_key = "8f" * 32
    client = await make_client(make_settings(
        auth={"mode": "keys", "keys": [{"key": KEY}, {"key": hex_key, "tenant": "b"}]},
        logging={"access_log": True}))
    h = {"Authorization": f"Bearer {hex_key}"}
    leaked = [f"x.{KEY}", f"req-{hex_key}", f"{hex_key}:7", f"a-{KEY}.b",
              "req-sk-proj-abcdef1234567890abcdef", "trace:ghp_abcdefghijklmnopqrstuvwxyz0123",
              "id.AKIAIOSFODNN7EXAMPLE", "u_eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0"]
    kept = ["task-12345", "orders-api-123", "desk_sk-1", "checkout.key-rotation", "build-npm-2"]
    for rid in leaked + kept:
        r = await client.get("/v1/models", headers={**h, "x-request-id": rid})
        assert r.status == 200
        assert (r.headers["x-request-id"] == rid) == (rid in kept), rid
    text = logs.getvalue()
    for secret in (KEY, hex_key, "sk-proj-abcdef", "ghp_abcdef", "AKIAIOSFODNN", "eyJhbGci"):
        assert secret not in text, secret


async def test_prompts_only_when_asked(make_client: MakeClient, logs: io.StringIO) -> None:
    client = await make_client(settings(include_prompts=True))
    await client.post("/v1/chat/completions", json=body(),
                      headers={"Authorization": f"Bearer {KEY}"})
    text = logs.getvalue()
    assert MARKER in text and KEY not in text


async def test_prompts_when_asked_on_the_responses_api_too(
        make_client: MakeClient, logs: io.StringIO) -> None:
    """`include_prompts` added the prompt to chat's and completions' request lines, not
    to a Responses API request's (the README: "adds the prompt to the request line")."""
    client = await make_client(settings(include_prompts=True))
    r = await client.post("/v1/responses", headers={"Authorization": f"Bearer {KEY}"},
                          json={"model": "fake-model", "max_output_tokens": 16,
                                "instructions": "Be brief.",
                                "input": f"What is {MARKER}?"})
    assert r.status == 200, await r.text()
    lines = [json.loads(ln) for ln in logs.getvalue().splitlines() if ln.startswith("{")]
    (line,) = [ln for ln in lines if ln.get("event") == "request"]
    assert line["route"] == "responses" and MARKER in line["prompt"]
    assert "Be brief." in line["prompt"] and KEY not in logs.getvalue()


USER_KEY = "ghp_aB3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF3hJ6"  # a key in a prompt


def request_lines(logs: io.StringIO) -> list[dict[str, Any]]:
    return [ln for ln in (json.loads(t) for t in logs.getvalue().splitlines()
                          if t.startswith("{")) if ln.get("event") == "request"]


@pytest.mark.parametrize("route", ["chat", "completions", "responses"])
async def test_a_prompt_is_logged_as_the_sanitizer_passed_it_on(
        make_client: MakeClient, logs: io.StringIO, route: str) -> None:
    """`include_prompts` logged the prompt as sent: a key the sanitizer redacted (or
    blocked) in it went to the log, which it keeps from the engine and every store."""
    s = settings(include_prompts=True)
    s.plugins[0].config = {"detectors": {"secret": "redact"},
                           "custom": [{"name": "order_id", "pattern": "ORD-\\d{6}",
                                       "action": "block"}]}
    client = await make_client(s)
    h = {"Authorization": f"Bearer {KEY}"}
    path, field = {"chat": ("/v1/chat/completions", "messages"),
                   "completions": ("/v1/completions", "prompt"),
                   "responses": ("/v1/responses", "input")}[route]

    def ask(text: str) -> dict[str, Any]:
        said: Any = ([{"role": "user", "content": text}] if route == "chat" else text)
        limit = "max_output_tokens" if route == "responses" else "max_tokens"
        return {"model": "fake-model", field: said, limit: 16}

    assert (await client.post(path, json=ask(f"{MARKER} {USER_KEY}"), headers=h)).status == 200
    r = await client.post(path, json=ask(f"{MARKER} ORD-123456 {USER_KEY}"), headers=h)
    assert r.status == 400
    redacted, blocked = request_lines(logs)
    assert MARKER in redacted["prompt"] and "[SECRET]" in redacted["prompt"]
    assert blocked["error"] == "content_policy_violation" and "prompt" not in blocked
    assert USER_KEY not in logs.getvalue() and "ORD-123456" not in logs.getvalue()


async def test_metrics_move(make_client: MakeClient) -> None:
    client = await make_client(settings(rpm=3))
    h = {"Authorization": f"Bearer {KEY}"}
    before = await (await client.get("/metrics")).text()
    await client.post("/v1/chat/completions", json=body(), headers=h)
    await client.post("/v1/chat/completions", json=body(), headers=h)  # a cache hit
    await (await client.post("/v1/chat/completions", json={**body(stream=True),
                                                           "max_tokens": 5,
                                                           "temperature": 0.5},
                             headers=h)).text()
    after = await (await client.get("/metrics")).text()
    ok = {"route": "chat", "model": "fake-model", "status": "200"}
    assert metric(after, "weir_requests_total", **ok) - metric(
        before, "weir_requests_total", **ok) == 3
    assert metric(after, "weir_request_duration_seconds_count", route="chat") == 3
    assert metric(after, "weir_time_to_first_token_seconds_count", route="chat") == 1
    assert metric(after, "weir_inter_token_latency_seconds_count", route="chat") == 4
    assert metric(after, "weir_tokens_total", kind="completion") == 3 + 3 + 5
    assert metric(after, "weir_cache_lookups_total", layer="l1", result="hit") == 1
    assert metric(after, "weir_cache_lookups_total", layer="all", result="bypass") == 1
    assert metric(after, "weir_cache_lookups_total", layer="all", result="hit") == 1
    assert metric(after, "weir_cache_lookups_total", layer="all", result="miss") == 1
    assert metric(after, "weir_engine_requests_running") == 0
    assert metric(after, "weir_rate_limit_rejections_total", per="key", limit="rpm") == 0
    limited = await client.post("/v1/chat/completions", json=body(), headers=h)
    assert limited.status == 429  # the fourth request within the minute, at rpm 3
    last = await (await client.get("/metrics")).text()
    assert metric(last, "weir_rate_limit_rejections_total", per="key", limit="rpm") == 1
    assert metric(last, "weir_requests_total", route="chat", model="fake-model",
                  status="429") == 1


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses"])
async def test_unknown_model_names_never_become_metric_labels(make_client: MakeClient,
                                                              path: str) -> None:
    """A model name is client text: only names the server serves label a metric, so a
    client sending made-up names cannot grow /metrics (or the spans) without bound."""
    client = await make_client(settings())
    h = {"Authorization": f"Bearer {KEY}"}
    names = [f"made-up-{i}-{MARKER}" for i in range(3)]
    for name in names:
        payload = ({"model": name, "input": "hi"} if path == "/v1/responses"
                   else {**body(), "model": name})
        r = await client.post(path, json=payload, headers=h)
        assert r.status == 404 and (await r.json())["error"]["code"] == "model_not_found"
    text = await (await client.get("/metrics")).text()
    assert MARKER not in text
    route = "responses" if path == "/v1/responses" else "chat"
    assert metric(text, "weir_requests_total", route=route, model="", status="404") == 3


async def test_refused_requests_are_counted_under_their_route(make_client: MakeClient) -> None:
    """A 401 or a body refused before the model is known counted nowhere: the requests
    metric undercounted errors. They count under their route, with no model."""
    client = await make_client(settings())
    before = await (await client.get("/metrics")).text()
    await client.post("/v1/chat/completions", json=body(),
                      headers={"Authorization": f"Bearer {KEY}-wrong"})
    await client.post("/v1/chat/completions", data=b"{not json",
                      headers={"Authorization": f"Bearer {KEY}",
                               "Content-Type": "application/json"})
    await client.post("/v1/responses", json={"model": "fake-model", "input": "hi",
                                             "max_output_tokens": "5"},
                      headers={"Authorization": f"Bearer {KEY}"})
    after = await (await client.get("/metrics")).text()

    def moved(**labels: str) -> float:
        return metric(after, "weir_requests_total", **labels) - metric(
            before, "weir_requests_total", **labels)

    assert moved(route="chat", model="", status="401") == 1
    assert moved(route="chat", model="", status="400") == 1
    assert moved(route="responses", model="", status="400") == 1


async def test_untrusted_callers_neither_parent_nor_unsample_their_traces(
        make_client: MakeClient, spans: InMemorySpanExporter) -> None:
    """`tracing.trust_incoming: false`: a caller's `traceparent` whose sampled flag is off
    hid its request from the traces, and its `tracestate` landed in the span. Each
    request is now a trace of its own, sampled by `sample_ratio` (1.0 here)."""
    s = settings()
    s.tracing.trust_incoming = False
    client = await make_client(s)
    unsampled = TRACEPARENT[:-2] + "00"
    r = await client.post("/v1/chat/completions", json=body(), headers={
        "Authorization": f"Bearer {KEY}", "traceparent": unsampled,
        "tracestate": "zqx=MARKER"})
    assert r.status == 200
    server = next(x for x in spans.get_finished_spans() if x.name.startswith("HTTP POST"))
    assert server.parent is None
    assert format(server.context.trace_id, "032x") != TRACEPARENT.split("-")[1]
    assert "MARKER" not in str(server.context.trace_state)
    # trusted (the default): the caller's unsampled flag is honoured, no span recorded
    spans.clear()
    client = await make_client(settings())
    r = await client.post("/v1/chat/completions", json=body(), headers={
        "Authorization": f"Bearer {KEY}", "traceparent": unsampled})
    assert r.status == 200
    assert not [x for x in spans.get_finished_spans() if x.name.startswith("HTTP POST")]


async def stream_under_way(make_client: MakeClient, engine: Any) -> tuple[Any, Any]:
    """A chat stream over `engine` past its first chunk, and the app state, draining."""
    from proxy.app_state import STATE

    client = await make_client(settings(), engine=engine)
    r = await client.post("/v1/chat/completions", json={**body(stream=True), "max_tokens": 50},
                          headers={"Authorization": f"Bearer {KEY}"})
    assert r.status == 200
    await r.content.readuntil(b"\n\n")  # the first chunk: the stream is under way
    st = client.app[STATE]
    st.draining = True
    return r, st


async def the_rest(r: Any) -> bytes:
    """What the stream sends until its connection ends (the cut ends it)."""
    import asyncio
    import contextlib

    import aiohttp

    seen = b""
    with contextlib.suppress(aiohttp.ClientError):
        async with asyncio.timeout(10):
            async for piece in r.content.iter_any():
                seen += piece
    return seen


async def test_a_stream_cut_by_the_shutdown_is_a_503_in_its_span_and_metrics(
        make_client: MakeClient, spans: InMemorySpanExporter, logs: io.StringIO) -> None:
    """Its head said 200; the drain's end cut it (told in-band): the server span said 499,
    as if its client had left, and was not marked as an error. Its code, the in-band
    error's, is the span's `error.type` and the access log's `error`, as any error's."""


    from tests.fakes import HoldingEngine

    r, st = await stream_under_way(make_client, HoldingEngine(after=2))
    assert await st.abort_all() == 1
    seen = await the_rest(r)
    assert b"shutting_down" in seen
    server = next(s for s in spans.get_finished_spans() if s.name.startswith("HTTP POST"))
    assert server.attributes["http.response.status_code"] == 503
    assert server.status.status_code.name == "ERROR"
    assert st.metrics.registry.get_sample_value("weir_requests_total", {
        "route": "chat", "model": "fake-model", "status": "503"}) == 1
    assert server.attributes.get("error.type") == "shutting_down"
    assert server.status.description == "shutting_down"
    lines = [json.loads(x) for x in logs.getvalue().splitlines() if '"request"' in x]
    assert [(x["status"], x.get("error")) for x in lines] == [(503, "shutting_down")]


async def test_a_shutdown_cut_stays_a_503_when_another_cancellation_follows(
        make_client: MakeClient) -> None:
    """The drain's cut reaches a stream whose engine is slow to let go, and a second
    cancellation comes meanwhile (its client leaving: aiohttp cancels the handler),
    carrying no shutdown message: the stream was not cut in-band, and was counted a 499
    with its client as gone. The drain marks what it cuts."""
    import asyncio
    from collections.abc import AsyncGenerator

    from tests.fakes import HoldingEngine

    class SlowToAbort(HoldingEngine):
        def __init__(self) -> None:
            super().__init__(after=2)
            self.closing = asyncio.Event()
            self.gate = asyncio.Event()

        async def generate(self, *args: Any, **kwargs: Any) -> AsyncGenerator[Any, None]:
            try:
                async for out in super().generate(*args, **kwargs):
                    yield out
            finally:
                self.closing.set()
                await self.gate.wait()

    engine = SlowToAbort()
    r, st = await stream_under_way(make_client, engine)
    handlers = list(st._inflight)
    abort = asyncio.create_task(st.abort_all())
    async with asyncio.timeout(10):
        await engine.closing.wait()  # cut in-band, its end settling
    for t in handlers:
        t.cancel()  # the second cancellation, without a message
    engine.gate.set()
    assert await abort == 1
    seen = await the_rest(r)
    assert b"shutting_down" in seen
    sample = st.metrics.registry.get_sample_value
    assert sample("weir_requests_total", {
        "route": "chat", "model": "fake-model", "status": "503"}) == 1
    assert not sample("weir_requests_total", {
        "route": "chat", "model": "fake-model", "status": "499"})
    assert not sample("weir_requests_aborted_total", {"reason": "client_gone"})


async def test_an_embeddings_requests_tokens_are_counted(make_client: MakeClient,
                                                         logs: io.StringIO) -> None:
    """`/v1/embeddings` reads tokens as chat does (its answer's usage says how many):
    they go into `weir_tokens_total` and the access-log line (they went into neither)."""
    from proxy import embeddings_api
    from proxy.app_state import STATE
    from proxy.chain import compose
    from tests.fakes import FakeEmbedder

    client = await make_client(make_settings(logging={"access_log": True}))
    st = client.app[STATE]
    st.embedder = FakeEmbedder()
    st.embed_chain = compose([], embeddings_api.terminal(st.embedder))
    r = await client.post("/v1/embeddings", json={"model": "fake-embedder",
                                                  "input": ["one two", "three"]})
    assert r.status == 200 and (await r.json())["usage"]["prompt_tokens"] == 3
    text = await (await client.get("/metrics")).text()
    assert metric(text, "weir_tokens_total", model="fake-embedder", kind="prompt") == 3
    line = next(json.loads(ln) for ln in logs.getvalue().splitlines()
                if '"request"' in ln and "/v1/embeddings" in ln)
    assert line["prompt_tokens"] == 3 and line["status"] == 200


class ChatUpstream:
    """An upstream serving chat (`async with`), whole and streamed (one choice, `hi`),
    with `usage` (None: it sends none); it keeps each request's `traceparent` (`seen`)
    and answers a 500 while `fail`."""

    def __init__(self, usage: dict[str, Any] | None) -> None:
        self.usage = usage
        self.seen: list[str] = []
        self.fail = False
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        self.server = TestServer(app, host="127.0.0.1")

    @property
    def url(self) -> str:
        return str(self.server.make_url("/v1"))

    async def __aenter__(self) -> ChatUpstream:
        await self.server.start_server()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.server.close()

    async def chat(self, request: web.Request) -> web.StreamResponse:
        if "traceparent" in request.headers:
            self.seen.append(request.headers["traceparent"])
        if self.fail:
            return web.json_response({"error": {"message": "down"}}, status=500)
        head = {"id": "chatcmpl-up", "created": 1, "model": "up-model"}
        usage = {} if self.usage is None else {"usage": self.usage}
        if not (await request.json()).get("stream"):
            return web.json_response({**head, "object": "chat.completion", **usage,
                                      "choices": [{"index": 0, "finish_reason": "stop",
                                                   "message": {"role": "assistant",
                                                               "content": "hi"}}]})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        chunks = [{**head, "object": "chat.completion.chunk", "choices": [
            {"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}]
        if usage:
            chunks.append({**head, "object": "chat.completion.chunk", "choices": [], **usage})
        for c in chunks:
            await resp.write(f"data: {json.dumps(c)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp


@pytest.mark.parametrize("stream", [False, True])
async def test_an_upstream_call_has_its_engine_span_the_upstream_s_parent(
        make_client: MakeClient, spans: InMemorySpanExporter, stream: bool) -> None:
    """`engine.kind: upstream` made no `engine.generate` span: the upstream's time, its
    failures and its tokens were in no span, and the upstream's server span hung off the
    innermost plugin's. The call is a client span now, the one its `traceparent` names,
    with the tokens the upstream counted and an error status when it failed."""
    from opentelemetry.trace import SpanKind, StatusCode

    usage = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    async with ChatUpstream(usage) as up:
        client = await make_client(make_settings(engine={
            "kind": "upstream", "base_url": up.url, "models": ["up-model"]}))
        payload = {"model": "up-model", "stream": stream,
                   "messages": [{"role": "user", "content": "hi"}]}
        r = await client.post("/v1/chat/completions", json=payload)
        assert r.status == 200
        await r.read()
        (engine,) = [s for s in spans.get_finished_spans() if s.name == "engine.generate"]
        assert engine.kind == SpanKind.CLIENT
        assert engine.attributes["gen_ai.request.model"] == "up-model"
        assert engine.attributes["gen_ai.usage.input_tokens"] == 5
        assert engine.attributes["gen_ai.usage.output_tokens"] == 3
        assert engine.status.status_code != StatusCode.ERROR
        (sent,) = up.seen
        assert sent.split("-")[1:3] == [format(engine.context.trace_id, "032x"),
                                        format(engine.context.span_id, "016x")]
        spans.clear()
        up.fail = True
        r = await client.post("/v1/chat/completions", json=payload)
        assert r.status == 502
        (engine,) = [s for s in spans.get_finished_spans() if s.name == "engine.generate"]
        assert engine.status.status_code == StatusCode.ERROR


@pytest.mark.parametrize("stream", [False, True])
async def test_an_upstream_answer_without_usage_counts_no_tokens_it_does_not_know(
        make_client: MakeClient, spans: InMemorySpanExporter, logs: io.StringIO,
        stream: bool) -> None:
    """An upstream that sends no usage (some ignore `stream_options.include_usage`):
    the engine span said 0 tokens in and out, as if counted; it says none. The
    access-log line leaves the counts null and `weir_tokens_total` is not moved, and a
    client that asked for the usage gets no usage chunk (none is known; Weir holds no
    tokenizer for an upstream's model, and an estimate would go out as a count)."""
    async with ChatUpstream(None) as up:
        client = await make_client(make_settings(logging={"access_log": True}, engine={
            "kind": "upstream", "base_url": up.url, "models": ["up-model"]}))
        payload = {"model": "up-model", "stream": stream,
                   "messages": [{"role": "user", "content": "hi"}]}
        if stream:
            payload["stream_options"] = {"include_usage": True}
        r = await client.post("/v1/chat/completions", json=payload)
        assert r.status == 200
        text = await r.text()
        assert '"usage": {' not in text and '"usage":{' not in text
        (engine,) = [s for s in spans.get_finished_spans() if s.name == "engine.generate"]
        assert "gen_ai.usage.input_tokens" not in engine.attributes
        assert "gen_ai.usage.output_tokens" not in engine.attributes
        scrape = await (await client.get("/metrics")).text()
        assert "weir_tokens_total{" not in scrape
        line = next(json.loads(ln) for ln in logs.getvalue().splitlines()
                    if '"request"' in ln and "/v1/chat/completions" in ln)
        assert line["status"] == 200
        assert "prompt_tokens" not in line and "completion_tokens" not in line


async def test_every_request_line_and_span_tell_the_cache_outcome(
        make_client: MakeClient, fake_engine: Any, spans: InMemorySpanExporter,
        logs: io.StringIO) -> None:
    """The access-log line's `cache` (and the span's `weir.cache`) came from the chat and
    completions routes' answers only: a Responses request, and a request the cache had
    looked up that then failed, told none, while `weir_cache_lookups_total` counted them.
    Each says what its `x-weir-cache` header said now."""
    client = await make_client(settings())
    h = {"Authorization": f"Bearer {KEY}"}
    ask = {"model": "fake-model", "input": f"What is {MARKER}?", "temperature": 0,
           "max_output_tokens": 16}
    for expected in ("miss", "exact"):
        r = await client.post("/v1/responses", json=ask, headers=h)
        assert r.status == 200 and r.headers["x-weir-cache"] == expected
    fake_engine.fail_after = 0
    r = await client.post("/v1/chat/completions", json={
        **body(), "messages": [{"role": "user", "content": "another question"}]}, headers=h)
    assert r.status == 502 and r.headers["x-weir-cache"] == "miss"
    lines = [json.loads(ln) for ln in logs.getvalue().splitlines() if '"request"' in ln]
    assert [(ln["route"], ln["status"], ln.get("cache")) for ln in lines
            if ln.get("event") == "request"] == [
        ("responses", 200, "miss"), ("responses", 200, "exact"), ("chat", 502, "miss")]
    told = [s.attributes.get("weir.cache") for s in spans.get_finished_spans()
            if s.name.startswith("HTTP POST")]
    assert told == ["miss", "exact", "miss"]


async def test_an_answer_a_fallback_gave_says_so_in_its_line_and_span(
        make_client: MakeClient, fake_engine: Any, spans: InMemorySpanExporter,
        logs: io.StringIO) -> None:
    """An engine that failed while the breaker's fallback answered left no trace in the
    log: the request's line was a 200 like any other (the engine's error was logged
    nowhere) and its span said nothing either. The line and the span name the fallback."""
    client = await make_client(make_settings(
        logging={"access_log": True},
        plugins=[{"name": "breaker", "config": {
            "fallback": [{"kind": "static", "content": "We are busy."}]}}]))
    fake_engine.fail_after = 0
    r = await client.post("/v1/chat/completions", json={**body(), "temperature": 1})
    assert r.status == 200 and r.headers["x-weir-fallback"] == "static"
    fake_engine.fail_after = None
    r = await client.post("/v1/chat/completions", json={**body(), "temperature": 1})
    assert r.status == 200 and "x-weir-fallback" not in r.headers
    lines = [json.loads(ln) for ln in logs.getvalue().splitlines() if '"request"' in ln]
    assert [(ln["status"], ln.get("fallback")) for ln in lines] == [(200, "static"),
                                                                   (200, None)]
    told = [s.attributes.get("weir.fallback") for s in spans.get_finished_spans()
            if s.name.startswith("HTTP POST")]
    assert told == ["static", None]


async def test_a_refusal_is_no_error_in_the_plugin_spans_either(
        make_client: MakeClient, fake_engine: Any, spans: InMemorySpanExporter) -> None:
    """A request the client's own limits refused (a 429) was no error in its server span
    (a 4xx), but every plugin span it crossed had an error status: trace backends' error
    rates, and tail sampling that keeps the traces with errors, counted each 429 (and
    each 400, each client gone) as a failure. A refusal is told by name, not as an error;
    a failure (an engine's 502) stays one."""
    from opentelemetry.trace import StatusCode

    client = await make_client(settings(rpm=1))
    h = {"Authorization": f"Bearer {KEY}"}
    assert (await client.post("/v1/chat/completions", json=body(), headers=h)).status == 200
    spans.clear()
    assert (await client.post("/v1/chat/completions", json=body(), headers=h)).status == 429
    got = {s.name: s for s in spans.get_finished_spans()}
    assert got["HTTP POST /v1/chat/completions"].status.status_code != StatusCode.ERROR
    for name in ("plugin sanitizer", "plugin rate_limit"):
        assert got[name].status.status_code != StatusCode.ERROR, name
    assert got["plugin rate_limit"].attributes["weir.refused"] == "RateLimited"
    # the client gone: no error either (the server span's is a 499)
    spans.clear()
    fake_engine.token_gate = asyncio.Event()  # (the engine makes no token until set)
    client = await make_client(settings())
    call = asyncio.ensure_future(client.post("/v1/chat/completions", json=body(), headers=h))
    await eventually(lambda: fake_engine.active)
    call.cancel()
    await eventually(lambda: any(s.name.startswith("HTTP") for s in spans.get_finished_spans()))
    got = {s.name: s for s in spans.get_finished_spans()}
    assert got["HTTP POST /v1/chat/completions"].attributes["http.response.status_code"] == 499
    for name in ("plugin sanitizer", "plugin cache", "engine.generate"):
        assert got[name].status.status_code != StatusCode.ERROR, name
        assert got[name].attributes["weir.cancelled"] is True, name


async def test_the_server_span_names_a_refusal_and_a_client_gone_too(
        make_client: MakeClient, fake_engine: Any, spans: InMemorySpanExporter) -> None:
    """The README's rule for every span (a refusal of the client's request named in
    `weir.refused`, a client gone in `weir.cancelled`) held for the plugin spans only:
    the server span of a 429 or a 499 carried neither, so a trace backend filtering
    on them missed every request refused or abandoned at the door."""
    client = await make_client(settings(rpm=1))
    h = {"Authorization": f"Bearer {KEY}"}
    assert (await client.post("/v1/chat/completions", json=body(), headers=h)).status == 200
    spans.clear()
    assert (await client.post("/v1/chat/completions", json=body(), headers=h)).status == 429
    server = next(s for s in spans.get_finished_spans() if s.name.startswith("HTTP POST"))
    assert server.attributes["weir.refused"] == "rate_limit_exceeded"
    assert "weir.cancelled" not in server.attributes
    spans.clear()
    fake_engine.token_gate = asyncio.Event()  # (the engine makes no token until set)
    client = await make_client(settings())
    call = asyncio.ensure_future(client.post("/v1/chat/completions", json=body(), headers=h))
    await eventually(lambda: fake_engine.active)
    call.cancel()
    await eventually(lambda: any(s.name.startswith("HTTP") for s in spans.get_finished_spans()))
    server = next(s for s in spans.get_finished_spans() if s.name.startswith("HTTP POST"))
    assert server.attributes["http.response.status_code"] == 499
    assert server.attributes["weir.cancelled"] is True
    assert "weir.refused" not in server.attributes
    # a success names neither
    spans.clear()
    fake_engine.token_gate = None
    assert (await client.post("/v1/chat/completions", json=body(), headers=h)).status == 200
    server = next(s for s in spans.get_finished_spans() if s.name.startswith("HTTP POST"))
    assert "weir.refused" not in server.attributes
    assert "weir.cancelled" not in server.attributes


async def test_an_engine_s_refusal_is_no_error_in_its_span(
        make_client: MakeClient, fake_engine: Any, spans: InMemorySpanExporter) -> None:
    """The engine's refusal (a schema its grammar compiler cannot take) is the client's
    400: its `engine.generate` span named it a refusal, as every other span does a 4xx,
    not an error (it ended with the engine's own exception, before it became the 400)."""
    from opentelemetry.trace import StatusCode

    from proxy.engine.base import EngineRejected

    async def refusing(*args: Any, **kw: Any) -> Any:
        raise EngineRejected("no grammar for this schema", param="response_format")
        yield  # (a generator, as the engine's is)

    fake_engine.generate = refusing
    client = await make_client(settings())
    r = await client.post("/v1/chat/completions", json=body(),
                          headers={"Authorization": f"Bearer {KEY}"})
    assert r.status == 400 and (await r.json())["error"]["code"] == "invalid_value"
    (engine,) = [s for s in spans.get_finished_spans() if s.name == "engine.generate"]
    assert engine.status.status_code != StatusCode.ERROR
    assert engine.attributes["weir.refused"] == "InvalidRequest"


async def test_a_chat_template_s_refusal_has_a_code(make_client: MakeClient,
                                                    fake_engine: Any) -> None:
    """As every refusal of the engine's: `invalid_value` (it was null)."""
    from proxy.engine.base import EngineRejected

    def refusing(*args: Any, **kw: Any) -> Any:
        raise EngineRejected("the template refuses these roles")

    fake_engine.render_chat = refusing
    client = await make_client(settings())
    r = await client.post("/v1/chat/completions", json=body(),
                          headers={"Authorization": f"Bearer {KEY}"})
    err = (await r.json())["error"]
    assert r.status == 400 and (err["param"], err["code"]) == ("messages", "invalid_value")


@pytest.mark.parametrize("shed", ["full", "wait", "deadline"])
async def test_a_shed_request_s_span_and_line_say_why(
        make_client: MakeClient, fake_engine: Any, spans: InMemorySpanExporter,
        logs: io.StringIO, shed: str) -> None:
    """A request admission shed (its queue full, no slot in time) or whose deadline
    passed while it queued was an error in its spans with no reason (the server span's
    status had no description), and its access-log line had none either: which of the
    three it was could not be told. Each says its error's code."""
    from opentelemetry.trace import StatusCode

    fake_engine.token_gate = asyncio.Event()
    queue = {"full": {"max_queue": 0}, "wait": {"max_queue_wait_s": 0.05},
             "deadline": {}}[shed]
    client = await make_client(make_settings(
        logging={"access_log": True},
        plugins=[{"name": "admission", "config": {"max_concurrent": 1, **queue}}]))
    b = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}],
         "max_tokens": 2}
    running = asyncio.ensure_future(client.post("/v1/chat/completions", json=b))
    await eventually(lambda: fake_engine.active)
    spans.clear()
    r = await client.post("/v1/chat/completions", json=b,
                          headers={"x-weir-timeout-ms": "50"} if shed == "deadline" else {})
    fake_engine.token_gate.set()
    assert (await running).status == 200
    code = {"full": "overloaded", "wait": "queue_timeout", "deadline": "timeout"}[shed]
    assert (r.status, (await r.json())["error"]["code"]) == (
        504 if shed == "deadline" else 503, code)
    (server,) = [s for s in spans.get_finished_spans() if s.name.startswith("HTTP")
                 and s.attributes["http.response.status_code"] == r.status]
    assert server.status.status_code == StatusCode.ERROR
    assert server.status.description == code
    assert server.attributes["error.type"] == code
    (admission,) = [s for s in spans.get_finished_spans() if s.name == "plugin admission"
                    and s.context.trace_id == server.context.trace_id]
    assert admission.attributes["error.type"] == code
    lines = [json.loads(x) for x in logs.getvalue().splitlines() if '"request"' in x]
    assert [x.get("error") for x in lines if x.get("status") == r.status] == [code]


async def test_every_error_answer_s_access_log_line_has_its_code(
        make_client: MakeClient, logs: io.StringIO) -> None:
    """The access log's `error` (README: an error answer's code) was given only for the
    errors a handler raised: a 404 `unknown_url`, a 405 `method_not_allowed` and a 413
    answered from the router's refusals had a line without it."""
    client = await make_client(make_settings(logging={"access_log": True},
                                             server={"max_body_bytes": 1024}))
    answers = [await client.get("/v1/nowhere"), await client.delete("/v1/models"),
               await client.post("/v1/chat/completions", data=b"x" * 4096,
                                 headers={"Content-Type": "application/json"})]
    lines = [json.loads(x) for x in logs.getvalue().splitlines() if '"request"' in x]
    assert [r.status for r in answers] == [404, 405, 413]
    assert [x.get("error") for x in lines] == [
        (await r.json())["error"]["code"] for r in answers]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions",
                                  "/v1/responses", "/v1/embeddings"])
async def test_a_request_refused_after_its_key_is_known_is_logged_with_its_tenant(
        make_client: MakeClient, spans: InMemorySpanExporter, logs: io.StringIO,
        path: str) -> None:
    """Its key was read: the access log's line (and the span) name its tenant, whatever
    is wrong with its body. A body that did not parse (a 400), an unknown field, or too
    large (a 413), and an embedding model not served (a 404) had a line without it: the
    tenant was noted only once the body had parsed (an embedding's, once its model was
    found)."""
    client = await make_client(settings())
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    answers = [await client.post(path, data=b"{not json", headers=headers),
               await client.post(path, json={"model": "none", "x": 1}, headers=headers),
               await client.post(path, json={"model": "none", "input": "hi"},
                                 headers=headers)]
    assert all(r.status >= 400 for r in answers)
    lines = [json.loads(x) for x in logs.getvalue().splitlines() if '"request"' in x]
    assert [x["status"] for x in lines] == [r.status for r in answers]
    assert [x.get("tenant") for x in lines] == ["acme"] * 3
    server = [s for s in spans.get_finished_spans() if s.name.startswith("HTTP")]
    assert [(s.attributes or {}).get("weir.tenant") for s in server] == ["acme"] * 3


async def test_every_api_route_is_counted_under_a_bounded_label(make_client: MakeClient
                                                                ) -> None:
    """`weir_requests_total` counted the generation routes only: a client's model lists,
    stored responses' reads, deletes and cancels, and its 404s on unknown paths were in
    no series. Each is counted under its route's template (never the path it was sent
    to: ids and unknown paths are the client's text), every unknown path under one
    label; probes and scrapes are no API traffic."""
    client = await make_client(settings())
    h = {"Authorization": f"Bearer {KEY}"}
    calls = [("GET", "/v1/models"), ("GET", "/v1/models/fake-model"),
             ("GET", f"/v1/responses/resp_{MARKER}"), ("DELETE", f"/v1/responses/resp_{MARKER}"),
             ("POST", f"/v1/responses/resp_{MARKER}/cancel"),
             ("GET", f"/v1/{MARKER}"), ("POST", f"/nowhere/{MARKER}"), ("GET", "/v1/files"),
             ("PURGE", "/v1/responses/compact"), ("GET", "/health/ready"), ("GET", "/metrics"),
             ("GET", "/healthz"), ("GET", "/metricsx")]  # (no probe nor scrape: unknown)
    for method, path in calls:
        async with client.request(method, path, headers=h) as r:
            assert r.status != 500, (method, path)
    text = await (await client.get("/metrics")).text()
    assert MARKER not in text

    def counted(route: str, status: str | None = None) -> float:
        return sum(metric(text, "weir_requests_total", route=route, model="", status=s)
                   for s in ([status] if status else ["200", "404", "405"]))

    assert counted("GET /v1/models", "200") == 1
    assert counted("GET /v1/models/{model}", "200") == 1
    assert counted("GET /v1/responses/{response_id}", "404") == 1
    assert counted("DELETE /v1/responses/{response_id}", "404") == 1
    assert counted("POST /v1/responses/{response_id}/cancel", "404") == 1
    assert counted("unmatched", "404") == 5  # (no `/v1/files`: one of the unknown paths)
    assert counted("OTHER /v1/responses/compact") == 1  # (no method of the client's own)
    labels = {s.labels["route"] for f in text_string_to_metric_families(text)
              for s in f.samples if s.name == "weir_requests_total"}
    assert not [r for r in labels if "health" in r or "metrics" in r or "PURGE" in r]


async def test_a_path_no_route_serves_is_unmatched_though_it_decodes_to_a_generation_route(
        make_client: MakeClient) -> None:
    """`POST /v1/chat%2Fcompletions` decodes to the chat route's path, which no route
    serves (a 404): it was counted under `chat`, whose latency percentiles and error
    rates any client could fill with its 404s."""
    from yarl import URL

    client = await make_client(settings())
    h = {"Authorization": f"Bearer {KEY}"}
    for path in ("/v1/chat%2Fcompletions", "/v1/embeddings%2F"):
        async with client.post(URL(path, encoded=True), headers=h, json={}) as r:
            assert r.status == 404
    text = await (await client.get("/metrics")).text()
    assert metric(text, "weir_requests_total", route="unmatched", model="", status="404") == 2
    routes = {s.labels["route"] for f in text_string_to_metric_families(text)
              for s in f.samples if s.name == "weir_requests_total"}
    assert routes == {"unmatched"}


async def test_every_metric_has_help_and_type_and_traffic_adds_no_series(
        make_client: MakeClient) -> None:
    """Every family /metrics exports, the plugins' included, says what it is (a HELP
    text, a TYPE), and its series are set by Weir's own bounded labels: a second round
    of traffic from other callers (new prompts, request ids, `user` fields, unknown
    models and paths, streams and errors) adds not one series, and carries none of
    their text. Each counter and histogram series had a `_created` gauge beside it,
    which the chart's dashboards and alerts never read: those are gone."""
    s = settings()
    s.plugins.append(make_settings(plugins=[{"name": "breaker"}]).plugins[0])
    s.plugins.append(make_settings(plugins=[{"name": "admission"}]).plugins[0])
    client = await make_client(s)
    h = {"Authorization": f"Bearer {KEY}"}

    async def traffic(tag: str) -> None:
        for i in range(3):
            hi = {**h, "x-request-id": f"rid-{tag}-{i}-{MARKER}"}
            payload = {**body(stream=bool(i % 2)), "user": f"user-{tag}-{i}",
                       "messages": [{"role": "user", "content": f"{tag} {i} {MARKER}"}]}
            async with client.post("/v1/chat/completions", json=payload, headers=hi) as r:
                await r.read()
            for bad in ({**payload, "model": f"model-{tag}-{MARKER}"},
                        {**payload, "temperature": 99}):
                async with client.post("/v1/chat/completions", json=bad, headers=hi) as r:
                    await r.read()
            async with client.get(f"/v1/{tag}-{MARKER}", headers=hi) as r:
                await r.read()
            async with client.post("/v1/chat/completions", json=payload,
                                   headers={"Authorization": f"Bearer sk-{tag}-{MARKER}"}) as r:
                await r.read()

    def series(text: str) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
        return {(smp.name, tuple(sorted(smp.labels.items())))
                for f in text_string_to_metric_families(text) for smp in f.samples}

    await traffic("one")
    first = await (await client.get("/metrics")).text()
    await traffic("two")
    second = await (await client.get("/metrics")).text()
    assert series(second) == series(first), series(second) - series(first)
    assert MARKER not in second and KEY not in second
    families = list(text_string_to_metric_families(second))
    assert {"weir_requests_total", "weir_cache_lookups_total", "weir_breaker_state",
            "weir_admission_queue_depth", "weir_rate_limit_rejections_total"} <= {
        f"{f.name}_total" if f.type == "counter" else f.name for f in families}
    # no `_created` twin of every counter and histogram series (a gauge of its start
    # time): as many series again for Prometheus to store, and nothing read from them
    assert not [f.name for f in families if f.name.endswith("_created")]
    for f in families:
        assert f.documentation.strip(), f.name
        assert f.type in ("counter", "gauge", "histogram"), (f.name, f.type)
        name = f"{f.name}_total" if f.type == "counter" else f.name
        assert f"# HELP {name} " in second and f"# TYPE {name} {f.type}\n" in second, name
