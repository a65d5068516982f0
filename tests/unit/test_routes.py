"""The routes (proxy/routes.py) over aiohttp's test client and the fake engine: the order
of a generation route's checks (draining, readiness, auth, content type, size, body,
model permission), how a Reply and the chain's headers become the response, and the
small routes (models, health, metrics, dashboard)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from proxy.app_state import STATE
from proxy.chain import BasePlugin, Next, Reply, register, unregister
from proxy.context import RequestContext
from tests.conftest import MakeClient
from tests.fakes import FakeEngine
from tests.openai_spec import validate
from tests.sse import check_chat_stream, parse_sse

CHAT = {"model": "fake-model", "max_tokens": 3,
        "messages": [{"role": "user", "content": "hello"}]}
KEYS = {"mode": "keys", "keys": [{"key": "sk-any", "tenant": "a"},
                                 {"key": "sk-other", "tenant": "b", "models": ["other"]}]}
ANY = {"Authorization": "Bearer sk-any"}


async def error_of(resp: Any, status: int) -> dict[str, Any]:
    assert resp.status == status, await resp.text()
    body = await resp.json()
    validate("ErrorResponse", body)
    return body["error"]  # type: ignore[no-any-return]


async def keyed(make_client: MakeClient, **kw: Any) -> TestClient[Any, web.Application]:
    return await make_client(auth=KEYS, **kw)


async def test_draining_is_refused_before_anything_else(make_client: MakeClient) -> None:
    client = await keyed(make_client)
    client.app[STATE].draining = True
    r = await client.post("/v1/chat/completions", data=b"not json")  # no key, no JSON
    assert (await error_of(r, 503))["code"] == "shutting_down"


RESPONSE = {"model": "fake-model", "input": "hello"}


@pytest.mark.parametrize(("path", "good"), [
    ("/v1/chat/completions", CHAT),
    ("/v1/completions", {"model": "fake-model", "prompt": "hello", "max_tokens": 3}),
    ("/v1/responses", RESPONSE)])
async def test_loading_answers_a_malformed_body_400_and_a_good_one_503(
        make_client: MakeClient, fake_engine: FakeEngine, path: str,
        good: dict[str, Any]) -> None:
    """While the model loads, a body that can never be served is a 400 as at any other
    time (vLLM's server and OpenAI check the request first): a 503 "retry shortly" would
    have the client retry it for nothing. A good one is the 503 `not_ready`; a request
    without a key is still a 401, and a key's refused model a 403."""
    client = await keyed(make_client)
    fake_engine.set_ready(False)
    jsonish = {**ANY, "Content-Type": "application/json"}
    r = await client.post(path, data=b"not json", headers=jsonish)
    assert (await error_of(r, 400))["code"] == "invalid_json"
    r = await client.post(path, json={**good, "model": 5}, headers=ANY)
    assert (await error_of(r, 400))["param"] == "model"
    r = await client.post(path, json={k: v for k, v in good.items() if k != "model"},
                          headers=ANY)
    assert (await error_of(r, 400))["code"] == "missing_required_parameter"
    r = await client.post(path, json=good)
    await error_of(r, 401)
    r = await client.post(path, json=good, headers={"Authorization": "Bearer sk-other"})
    await error_of(r, 403)
    r = await client.post(path, json=good, headers=ANY)
    assert (await error_of(r, 503))["code"] == "not_ready" and r.headers["Retry-After"] == "5"
    fake_engine.die()
    r = await client.post(path, data=b"not json", headers=jsonish)
    await error_of(r, 400)
    r = await client.post(path, json=good, headers=ANY)
    assert (await error_of(r, 503))["code"] == "engine_failed"


async def test_auth_comes_before_the_body_is_read(make_client: MakeClient) -> None:
    client = await keyed(make_client)
    r = await client.post("/v1/chat/completions", data=b"x" * 100,
                          headers={"Content-Type": "text/plain"})
    await error_of(r, 401)  # not 400: an unauthenticated body is never looked at


@pytest.mark.parametrize(("ctype", "status"), [
    ("text/plain", 400), ("application/x-www-form-urlencoded", 400),
    ("application/json", 200), ("application/vnd.weir+json", 200)])
async def test_content_type(make_client: MakeClient, ctype: str, status: int) -> None:
    client = await make_client()
    r = await client.post("/v1/chat/completions", data=json.dumps(CHAT),
                          headers={"Content-Type": ctype})
    if status == 400:
        assert (await error_of(r, 400))["code"] == "invalid_content_type"
    else:
        assert r.status == 200


async def test_a_body_sent_with_no_content_type_is_told_so(make_client: MakeClient) -> None:
    """The message named `application/octet-stream`, a type the client never sent."""
    client = await make_client()
    r = await client.post("/v1/chat/completions", data=json.dumps(CHAT).encode(),
                          skip_auto_headers=["Content-Type"])
    error = await error_of(r, 400)
    assert error["code"] == "invalid_content_type" and "`none`" in error["message"]


async def test_a_declared_oversize_body_is_refused_before_it_is_read(
        make_client: MakeClient, fake_engine: FakeEngine) -> None:
    client = await make_client(server={"max_body_bytes": 1024})
    r = await client.post("/v1/chat/completions", json={**CHAT, "pad": "x" * 2000})
    await error_of(r, 413)
    assert fake_engine.calls == []


async def test_the_body_is_validated_before_the_model_permission(make_client: MakeClient,
                                                                  ) -> None:
    client = await keyed(make_client)
    other = {"Authorization": "Bearer sk-other"}
    r = await client.post("/v1/chat/completions", json={**CHAT, "temperature": 7},
                          headers=other)
    assert (await error_of(r, 400))["param"] == "temperature"
    r = await client.post("/v1/chat/completions", json=CHAT, headers=other)
    assert (await error_of(r, 403))["param"] == "model"


class StampHeaders(BasePlugin):
    """Sets a response header through the context and one on the reply itself."""

    name: ClassVar[str] = "t_stamp_headers"

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        ctx.response_headers["x-from-ctx"] = "1"
        reply = await call_next(ctx)
        reply.headers["x-from-reply"] = "2"
        return reply


@pytest.fixture
def stamp() -> Iterator[None]:
    register(StampHeaders)
    yield
    unregister(StampHeaders.name)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_reply_and_the_chains_headers_make_the_response(
        make_client: MakeClient, stamp: None, stream: bool) -> None:
    client = await make_client(plugins=[{"name": "t_stamp_headers"}])
    r = await client.post("/v1/chat/completions", json={**CHAT, "stream": stream})
    assert r.status == 200
    assert r.headers["x-from-ctx"] == "1" and r.headers["x-from-reply"] == "2"
    if stream:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        events, done = parse_sse(await r.text())
        assert done and check_chat_stream(events)
    else:
        validate("CreateChatCompletionResponse", await r.json())


async def test_models_are_filtered_by_the_keys_scope(make_client: MakeClient) -> None:
    client = await keyed(make_client)
    listed = await (await client.get("/v1/models", headers=ANY)).json()
    validate("ListModelsResponse", listed)
    assert [m["id"] for m in listed["data"]] == ["fake-model"]
    one = await (await client.get("/v1/models/fake-model", headers=ANY)).json()
    assert one["id"] == "fake-model" and one["max_model_len"] == 512
    other = {"Authorization": "Bearer sk-other"}
    assert (await (await client.get("/v1/models", headers=other)).json())["data"] == []
    await error_of(await client.get("/v1/models/fake-model", headers=other), 404)
    await error_of(await client.get("/v1/models"), 401)


async def test_embeddings_without_an_embedder_is_an_unknown_model(make_client: MakeClient,
                                                                  ) -> None:
    client = await make_client()
    r = await client.post("/v1/embeddings", json={"model": "any", "input": "hi"})
    assert (await error_of(r, 404))["code"] == "model_not_found"


async def test_health_metrics_and_dashboard(make_client: MakeClient,
                                            fake_engine: FakeEngine) -> None:
    client = await make_client()
    assert (await client.get("/health/live")).status == 200
    assert (await client.get("/health")).status == 200
    fake_engine.set_ready(False)
    r = await client.get("/health/ready")
    assert r.status == 503 and r.headers["Retry-After"] == "5"
    assert r.headers["retry-after-ms"] == "5000"  # (as every other wait Weir tells)
    assert (await client.get("/health/live")).status == 200  # alive while loading
    r = await client.get("/metrics")
    assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert "weir_requests_in_flight" in await r.text()
    r = await client.get("/dashboard")
    assert r.headers["Content-Type"].startswith("text/html")
    assert r.headers["Cache-Control"] == "no-cache" and "<html" in (await r.text()).lower()


async def test_an_engine_dead_once_started_fails_liveness(make_client: MakeClient,
                                                         fake_engine: FakeEngine) -> None:
    """vLLM's engine process died: the process serves nothing until it restarts, so the
    liveness probe (what restarts a pod) says so, as readiness and a request do; it said
    `ok` for good, with readiness and requests saying `loading` (retry shortly)."""
    client = await keyed(make_client)
    assert (await client.get("/health/live")).status == 200
    fake_engine.die()
    r = await client.get("/health/live")
    assert r.status == 503 and await r.json() == {"status": "failed"}
    r = await client.get("/health/ready")
    assert r.status == 503 and await r.json() == {"status": "failed"}
    r = await client.post("/v1/chat/completions", json=CHAT, headers=ANY)
    assert (await error_of(r, 503))["code"] == "engine_failed"
    fake_engine.dead = False  # (loading, never started: alive, not ready)
    assert (await client.get("/health/live")).status == 200
    assert (await client.get("/health/ready")).status == 503


@pytest.mark.parametrize("stream", [False, True])
async def test_the_request_id_is_echoed(make_client: MakeClient, stream: bool) -> None:
    client = await make_client()
    r = await client.post("/v1/chat/completions", json={**CHAT, "stream": stream},
                          headers={"x-request-id": "route-test-1"})
    await r.read()
    assert r.status == 200 and r.headers.get("x-request-id") == "route-test-1"


@pytest.mark.parametrize("stream", [False, True])
async def test_a_request_has_the_server_s_deadline_without_the_admission_plugin(
        make_client: MakeClient, fake_engine: FakeEngine, stream: bool) -> None:
    """No plugin sets a deadline (no admission): `server.request_timeout_s` is the
    request's, and a hung engine's request is a 504 `timeout` at it, not held until
    its client leaves."""
    fake_engine.token_gate = asyncio.Event()  # never set: the engine hangs
    client = await make_client(server={"request_timeout_s": 0.05})
    resp = await client.post("/v1/chat/completions", json={**CHAT, "stream": stream})
    err = await error_of(resp, 504)
    assert err["code"] == "timeout" and err["type"] == "timeout_error"
    assert not fake_engine.active  # its generation was aborted


async def test_without_admission_the_timeout_header_shortens_the_server_s_deadline(
        make_client: MakeClient, fake_engine: FakeEngine) -> None:
    """`x-weir-timeout-ms` is honoured without the admission plugin too (which reads it
    where it is in the chain): a hung engine's request is a 504 at the caller's 50 ms,
    not at the server's 600 s."""
    fake_engine.token_gate = asyncio.Event()  # never set: the engine hangs
    client = await make_client()  # (server.request_timeout_s: its default)
    resp = await client.post("/v1/chat/completions", json=CHAT,
                             headers={"x-weir-timeout-ms": "5000, 50"})
    err = await error_of(resp, 504)
    assert err["code"] == "timeout"


@pytest.mark.parametrize("plugins", [[], [{"name": "admission"}]])
@pytest.mark.parametrize("raw", ["0", "-1", "abc", ""])
async def test_a_timeout_header_that_is_no_positive_number_is_a_400(
        make_client: MakeClient, fake_engine: FakeEngine, raw: str,
        plugins: list[dict[str, Any]]) -> None:
    """`x-weir-timeout-ms: 0` (or `-1`, `abc`, nothing) was ignored, with or without the
    admission plugin: the client thought it had set a deadline. It is a 400 naming the
    header, before the engine is asked."""
    client = await make_client(plugins=plugins)
    resp = await client.post("/v1/chat/completions", json=CHAT,
                             headers={"x-weir-timeout-ms": raw})
    err = await error_of(resp, 400)
    assert err["type"] == "invalid_request_error" and err["code"] == "invalid_value"
    assert err["param"] is None and "`x-weir-timeout-ms` header" in err["message"]
    assert not fake_engine.calls


async def test_the_timeout_header_is_read_with_no_server_deadline_too(
        make_client: MakeClient, fake_engine: FakeEngine) -> None:
    """With `server.request_timeout_s: null` and no admission plugin the header was not
    read at all: a hung engine's request was held past the caller's 50 ms (until the
    client left), and `x-weir-timeout-ms: abc` was served, not the README's 400."""
    client = await make_client(server={"request_timeout_s": None})
    resp = await client.post("/v1/chat/completions", json=CHAT,
                             headers={"x-weir-timeout-ms": "abc"})
    assert (await error_of(resp, 400))["code"] == "invalid_value"
    assert (await client.post("/v1/chat/completions", json=CHAT)).status == 200
    fake_engine.token_gate = asyncio.Event()  # never set: the engine hangs
    for stream in (False, True):
        resp = await client.post("/v1/chat/completions", json={**CHAT, "stream": stream},
                                 headers={"x-weir-timeout-ms": "50"})
        assert (await error_of(resp, 504))["code"] == "timeout"
    assert not fake_engine.active  # (their generations aborted)


async def test_serve_warns_of_a_breaker_threshold_past_the_deadline(
        make_client: MakeClient, logs: Any) -> None:
    """As `check-config` does (`chain.deadline_warnings`): a hung engine never opens such
    a breaker."""
    await make_client(plugins=[{"name": "breaker"},
                               {"name": "admission", "config": {"deadline_s": 5}}])
    warned = [json.loads(line) for line in logs.getvalue().splitlines()
              if "past the requests' deadline" in line]
    assert [w["setting"] for w in warned] == ["plugins[0].config.slow_call_s",
                                              "plugins[0].config.half_open_max_wait_s"]


@pytest.mark.parametrize("error", [ValueError("x"), asyncio.CancelledError(), KeyboardInterrupt()])
def test_the_context_managers_around_the_chain_let_every_error_through(
        error: BaseException) -> None:
    """`counting_cuts` and `logging_prompt` (around every chain call) suppress nothing, a
    cancellation included: a cut notes the usage spent until it, and the prompt is logged
    whether the chain answered or not; an answer notes no usage there (it has its own)."""
    from types import SimpleNamespace

    from proxy.inflight import counting_cuts
    from proxy.protocol import ChatCompletionRequest, parse_model
    from proxy.routes import logging_prompt
    from proxy.telemetry import Metrics
    from tests.conftest import make_settings

    st: Any = SimpleNamespace(metrics=Metrics(), plugins=[],
                              settings=make_settings(logging={"include_prompts": True}))
    ctx: Any = SimpleNamespace(key_request=None, request=parse_model(ChatCompletionRequest, CHAT),
                               usage_so_far={"prompt_tokens": 3, "completion_tokens": 2})
    info: dict[str, Any] = {"model": "fake-model"}
    with pytest.raises(type(error)), counting_cuts(st, info, ctx), logging_prompt(st, info, ctx):
        raise error
    assert info == {"model": "fake-model", "prompt": "user: hello", "prompt_tokens": 3,
                    "completion_tokens": 2}

    def answered() -> str:
        with counting_cuts(st, info, ctx), logging_prompt(st, info, ctx):
            return "answer"

    info = {"model": "fake-model"}
    assert answered() == "answer"
    assert info == {"model": "fake-model", "prompt": "user: hello"}
