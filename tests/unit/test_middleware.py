"""The aiohttp middlewares (proxy/middleware.py), each called directly on a mocked request
with a stub handler: the request id, the error mapping, the access log and its metrics."""

from __future__ import annotations

import asyncio
import io
import json
from typing import Any

import pytest
import structlog
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer, make_mocked_request

from proxy.app_state import INFO, REQUEST_ID
from proxy.errors import InvalidRequest, RateLimited
from proxy.middleware import (
    errors_middleware,
    make_access_log,
    make_tracing,
    request_id_middleware,
)
from proxy.telemetry import Metrics
from tests.openai_spec import validate


def request(path: str = "/v1/chat/completions", method: str = "POST",
            headers: dict[str, str] | None = None) -> web.Request:
    req = make_mocked_request(method, path, headers=headers or {}, app=web.Application())
    req.transport.is_closing.return_value = False  # type: ignore[union-attr]  # (a Mock)
    return req


def body_of(resp: web.StreamResponse) -> dict[str, Any]:
    assert isinstance(resp, web.Response) and resp.body is not None
    data: dict[str, Any] = json.loads(resp.body)  # type: ignore[arg-type]
    return data


# ------------------------------------------------------------------------ request id


@pytest.mark.parametrize("given", ["abc-123", "trace.id:7_x", "a" * 128])
async def test_a_sane_request_id_is_honoured_and_echoed(given: str) -> None:
    seen: dict[str, Any] = {}

    async def handler(r: web.Request) -> web.StreamResponse:
        seen["id"], seen["info"] = r[REQUEST_ID], r[INFO]
        seen["logged"] = structlog.contextvars.get_contextvars().get("request_id")
        return web.Response(text="ok")

    resp = await request_id_middleware(request(headers={"x-request-id": given}), handler)
    assert seen == {"id": given, "info": {}, "logged": given}
    assert resp.headers["x-request-id"] == given
    assert "request_id" not in structlog.contextvars.get_contextvars()  # unbound after


@pytest.mark.parametrize("given", [
    "", "has space", "a" * 129, "semi;colon", "ünïcode",
    # a key sent as a request id: it would be on every log line of the request
    "sk-live-0123456789abcdef0123", "sk-proj-AbC_dEf-123", "ghp_0123456789abcdefABCDEF",
    "AKIAIOSFODNN7EXAMPLE", "xoxb-123-456-abc", "key-0123456789abcdef", "API_KEY_123",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.abc",
])
async def test_an_unusable_request_id_is_replaced(given: str) -> None:
    async def handler(r: web.Request) -> web.StreamResponse:
        return web.Response(text=r[REQUEST_ID])

    resp = await request_id_middleware(request(headers={"x-request-id": given}), handler)
    made = resp.headers["x-request-id"]
    assert made != given and len(made) == 32 and int(made, 16) >= 0
    assert isinstance(resp, web.Response) and resp.text == made


# ---------------------------------------------------------------------------- errors


async def fails_with(exc: BaseException, path: str = "/v1/chat/completions",
                     method: str = "POST") -> web.StreamResponse:
    async def handler(r: web.Request) -> web.StreamResponse:
        raise exc

    req = request(path, method)
    req[REQUEST_ID] = "rid-1"
    return await errors_middleware(req, handler)


async def test_a_weir_error_becomes_its_openai_body_with_headers() -> None:
    resp = await fails_with(RateLimited("slow down", headers={"retry-after": "3"}))
    body = body_of(resp)
    validate("ErrorResponse", body)
    assert resp.status == 429 and body["error"]["message"] == "slow down"
    assert resp.headers["retry-after"] == "3" and resp.headers["x-request-id"] == "rid-1"
    resp = await fails_with(InvalidRequest("bad role", param="messages[0].role"))
    assert resp.status == 400 and body_of(resp)["error"]["param"] == "messages[0].role"


@pytest.mark.parametrize(("exc", "status", "kind", "code"), [
    (web.HTTPNotFound(), 404, "invalid_request_error", "unknown_url"),
    (web.HTTPRequestEntityTooLarge(max_size=10, actual_size=20), 413,
     "invalid_request_error", None),
    (web.HTTPBadRequest(reason="Bad framing"), 400, "invalid_request_error", None),
    (web.HTTPServiceUnavailable(), 503, "server_error", None),
])
async def test_aiohttp_http_errors_become_openai_bodies(exc: web.HTTPException, status: int,
                                                        kind: str, code: str | None) -> None:
    resp = await fails_with(exc)
    body = body_of(resp)
    validate("ErrorResponse", body)
    assert resp.status == status and body["error"]["type"] == kind
    if code is not None:
        assert body["error"]["code"] == code


async def test_a_wrong_method_names_the_allowed_ones() -> None:
    resp = await fails_with(web.HTTPMethodNotAllowed("PUT", ["POST", "GET"]), method="PUT")
    body = body_of(resp)
    validate("ErrorResponse", body)
    assert resp.status == 405 and "allowed: GET, POST" in body["error"]["message"]
    assert resp.headers["Allow"] == "GET, POST"


async def test_a_redirect_is_not_an_error() -> None:
    with pytest.raises(web.HTTPFound):
        await fails_with(web.HTTPFound("/elsewhere"))


async def test_a_bug_is_a_generic_500_with_where_only_in_the_log(logs: io.StringIO) -> None:
    """The log says what failed and where (type, file:line in function), not the
    exception's message: it may quote the request (a prompt, a key)."""
    resp = await fails_with(RuntimeError("secret detail 0xdeadbeef"))
    body = body_of(resp)
    validate("ErrorResponse", body)
    assert resp.status == 500 and body["error"]["type"] == "server_error"
    assert "deadbeef" not in json.dumps(body)
    line = json.loads(next(x for x in logs.getvalue().splitlines() if "unhandled error" in x))
    assert line["error"] == "RuntimeError" and "test_middleware.py" in line["at"]
    assert "in handler" in line["at"] and "deadbeef" not in logs.getvalue()


@pytest.mark.parametrize("exc", [asyncio.CancelledError(), ConnectionResetError()])
async def test_a_gone_client_is_not_answered(exc: BaseException) -> None:
    with pytest.raises(type(exc)):
        await fails_with(exc)


# ------------------------------------------------------------------------ access log


def count(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


async def test_access_log_counts_requests_by_route_model_and_status(logs: io.StringIO) -> None:
    metrics = Metrics()
    mw = make_access_log(metrics, enabled=True)

    async def handler(r: web.Request) -> web.StreamResponse:
        r[INFO].update(route="chat", model="m", tenant="acme", cache=None)
        return web.Response(status=201)

    req = request(headers={"Authorization": "Bearer sk-secret-key"})
    req[INFO] = {}
    await mw(req, handler)
    labels = {"route": "chat", "model": "m"}
    assert count(metrics, "weir_requests_total", **labels, status="201") == 1
    assert count(metrics, "weir_request_duration_seconds_count", **labels, status="201") == 1
    [line] = [json.loads(x) for x in logs.getvalue().splitlines()]
    assert line["event"] == "request" and line["status"] == 201 and line["tenant"] == "acme"
    assert "cache" not in line  # None values are left out
    assert "sk-secret-key" not in logs.getvalue()


async def test_access_log_records_a_cancelled_request_as_499() -> None:
    metrics = Metrics()
    mw = make_access_log(metrics, enabled=False)

    async def handler(r: web.Request) -> web.StreamResponse:
        r[INFO].update(route="completion", model="m")
        raise asyncio.CancelledError

    req = request()
    req[INFO] = {}
    with pytest.raises(asyncio.CancelledError):
        await mw(req, handler)
    assert count(metrics, "weir_requests_total", route="completion", model="m",
                 status="499") == 1


async def test_access_log_skips_health_and_counts_unrouted_requests_as_unmatched(
        logs: io.StringIO) -> None:
    """Probes and scrapes are no API traffic, by the route they matched: a path no route
    serves that only starts like one (`/healthz`, `/metricsx`, `/dashboards`) is a 404
    counted and logged as `unmatched`, as any other unknown path is (it was in neither)."""
    metrics = Metrics()
    app = web.Application(middlewares=[make_access_log(metrics, enabled=True),
                                       errors_middleware])

    async def handler(r: web.Request) -> web.StreamResponse:
        return web.Response(text="ok")

    for path in ("/health", "/health/live", "/health/ready", "/metrics", "/dashboard"):
        app.router.add_get(path, handler)
    async with TestClient(TestServer(app)) as client:
        for path in ("/health/ready", "/health", "/metrics"):
            assert (await client.get(path)).status == 200
        assert logs.getvalue() == ""
        assert "weir_requests_total{" not in metrics.render().decode()  # (no API traffic)
        assert (await client.get("/dashboard")).status == 200  # (logged: a person reads it)
        assert "weir_requests_total{" not in metrics.render().decode()
        assert [json.loads(x)["path"] for x in logs.getvalue().splitlines()] == ["/dashboard"]
        unknown = ("/healthz", "/health/nope", "/metricsx", "/dashboards", "/v1/models")
        for path in unknown:
            assert (await client.get(path)).status == 404
    lines = [json.loads(x) for x in logs.getvalue().splitlines()][1:]
    assert [(x["path"], x["status"]) for x in lines] == [("(no route)", 404)] * len(unknown)
    assert count(metrics, "weir_requests_total", route="unmatched", model="",
                 status="404") == len(unknown)
    await make_access_log(metrics, enabled=True)(request("/v1/models", "GET"), handler)
    assert count(metrics, "weir_requests_total", route="unmatched", model="",
                 status="200") == 1


async def test_untraced_paths_pass_straight_through() -> None:
    async def handler(r: web.Request) -> web.StreamResponse:
        return web.Response(status=204)

    for path in ("/health/live", "/metrics", "/dashboard"):
        resp = await make_tracing(True)(request(path, "GET"), handler)
        assert resp.status == 204


@pytest.mark.parametrize("trusted", [True, False])
@pytest.mark.parametrize("caller", [
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", None])
async def test_without_a_tracer_provider_the_callers_context_still_goes_upstream(
        monkeypatch: pytest.MonkeyPatch, caller: str | None, trusted: bool) -> None:
    """No span is made when nothing would record it, but what the handler sends upstream
    carries the caller's `traceparent` as it came (and none when it came without one,
    or when callers are not trusted: `tracing.trust_incoming: false`)."""
    import proxy.tracing as tracing

    monkeypatch.setattr(tracing, "_configured", False)
    sent: dict[str, str] = {}

    async def handler(r: web.Request) -> web.StreamResponse:
        tracing.inject(sent)
        return web.Response(status=204)

    headers = {"traceparent": caller} if caller else {}
    resp = await make_tracing(trusted)(request(headers=headers), handler)
    assert resp.status == 204
    assert sent.get("traceparent") == (caller if trusted else None)
    after: dict[str, str] = {}
    tracing.inject(after)  # the caller's context ended with the request
    assert after == {}
