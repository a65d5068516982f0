"""Fuzz the HTTP layer with the sanitizer on: random Unicode, oversized and malformed
bodies. Every answer is a 2xx or an OpenAI error object, never a 500, and the server
keeps serving."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.app import create_app
from tests.conftest import make_settings
from tests.fakes import FakeEngine
from tests.openai_spec import validate
from tests.threaded_server import serve_in_thread


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """A real aiohttp server (fake engine, sanitizer on) in a thread of its own."""
    settings = make_settings(
        server={"max_body_bytes": 65536},
        plugins=[{"name": "sanitizer"}])
    with serve_in_thread(lambda: create_app(settings, engine=FakeEngine(max_model_len=100_000))
                         ) as url:
        yield url


def check(resp: httpx.Response) -> None:
    assert resp.status_code != 500 and resp.status_code < 600, resp.text
    if resp.status_code >= 400:
        validate("ErrorResponse", resp.json())


texts = st.text(st.characters(codec="utf-8"), max_size=300)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False) | texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=20)

FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


@FUZZ
@given(content=texts, role=st.sampled_from(["user", "system", "assistant", "tool", "x"]),
       extra=st.dictionaries(st.sampled_from(
           ["temperature", "n", "max_tokens", "stop", "top_p", "logprobs", "stream",
            "seed", "logit_bias", "response_format", "stream_options", "top_logprobs"]),
           json_values, max_size=3))
def test_random_chat_requests(server: str, content: str, role: str,
                              extra: dict[str, Any]) -> None:
    body = {"model": "fake-model", "messages": [{"role": role, "content": content}],
            "max_tokens": 3, **extra}
    check(httpx.post(f"{server}/v1/chat/completions", json=body, timeout=30))


@FUZZ
@given(raw=st.binary(max_size=2000))
def test_random_bytes(server: str, raw: bytes) -> None:
    check(httpx.post(f"{server}/v1/chat/completions", content=raw, timeout=30,
                     headers={"Content-Type": "application/json"}))


@FUZZ
@given(value=json_values)
def test_random_json(server: str, value: Any) -> None:
    check(httpx.post(f"{server}/v1/completions", content=json.dumps(value).encode(),
                     timeout=30, headers={"Content-Type": "application/json"}))


@settings(max_examples=20, deadline=None)
@given(size=st.integers(min_value=66_000, max_value=200_000))  # server.max_body_bytes
def test_oversized_bodies(server: str, size: int) -> None:
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "x" * size}]}
    r = httpx.post(f"{server}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 413
    validate("ErrorResponse", r.json())


def test_still_serving_after_the_fuzz(server: str) -> None:
    r = httpx.post(f"{server}/v1/chat/completions", timeout=30, json={
        "model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert r.status_code == 200
