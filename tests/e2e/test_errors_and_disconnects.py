"""End to end: errors through the SDK and raw HTTP, and abandoned requests."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.conftest import KEY_A, KEY_B, MODEL
from tests.e2e.server import WeirProcess, sdk
from tests.openai_spec import validate

MSG = [{"role": "user", "content": "hello"}]
AUTH = {"Authorization": f"Bearer {KEY_A}"}


@pytest.mark.parametrize(
    ("kw", "param"),
    [
        ({"temperature": 5}, "temperature"),
        ({"n": 200, "temperature": 1}, "n"),
        ({"logprobs": True, "top_logprobs": 30}, "top_logprobs"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"max_tokens": 5000}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "word " * 3000}]}, "messages"),
    ],
)
def test_bad_requests_name_their_param(client: openai.OpenAI, kw: dict[str, Any],
                                       param: str) -> None:
    args: dict[str, Any] = {"model": MODEL, "messages": MSG, **kw}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(**args)
    assert e.value.status_code == 400
    assert e.value.param == param


PAST_THE_COMPILER = {"type": "object", "required": ["a"], "properties": {
    "a": {"type": "string", "pattern": "^(a{1,200}){1,200}$"}}}


@pytest.mark.parametrize("stream", [False, True])
def test_a_schema_the_engine_cannot_compile_is_a_400_not_an_empty_answer(
        client: openai.OpenAI, stream: bool) -> None:
    """vLLM's front-end check passed it and the engine process failed its grammar, ending
    the request in error (a 200 with empty content, then an engine-named 400); its
    counted repeats (40,000 atoms written out) are now past Weir's own budget, checked
    before anything compiles: a 400 naming the schema."""
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "x",
                                                       "schema": PAST_THE_COMPILER}}
    with pytest.raises(openai.BadRequestError) as e:
        r = client.chat.completions.create(model=MODEL, messages=MSG,  # type: ignore[call-overload]
                                           max_tokens=8, response_format=fmt, stream=stream)
        list(r) if stream else r
    assert e.value.param == "response_format.json_schema.schema"
    assert "counted repeats" in str(e.value.message)


def test_prompt_too_long_for_completions(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=[5] * 1100)
    assert e.value.param == "prompt" and e.value.code == "context_length_exceeded"


def test_auth_and_model_errors(weir: WeirProcess) -> None:
    bad = sdk(weir.url, "sk-wrong")
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model=MODEL, messages=MSG)  # type: ignore[arg-type]
    b = sdk(weir.url, KEY_B)
    with pytest.raises(openai.PermissionDeniedError):
        b.chat.completions.create(model=MODEL, messages=MSG)  # type: ignore[arg-type]
    a = sdk(weir.url, KEY_A)
    with pytest.raises(openai.NotFoundError) as e:
        a.chat.completions.create(model="gpt-17", messages=MSG)  # type: ignore[arg-type]
    assert e.value.code == "model_not_found"


@pytest.mark.parametrize(
    ("content", "ctype", "status"),
    [
        (b'{"model": ', "application/json", 400),
        (b'{"model": "\xc3\x28"}', "application/json", 400),
        (b'{"model": "weir-demo"}', "text/plain", 400),
        (b'{"model": "weir-demo", "messages": "' + b"x" * 5_000_000 + b'"}',
         "application/json", 413),
    ],
)
def test_raw_http_errors(weir: WeirProcess, content: bytes, ctype: str, status: int) -> None:
    r = httpx.post(f"{weir.url}/v1/chat/completions", content=content, timeout=60,
                   headers={**AUTH, "Content-Type": ctype})
    assert r.status_code == status
    validate("ErrorResponse", r.json())
    assert httpx.get(f"{weir.url}/health/ready").status_code == 200


def test_unknown_route(weir: WeirProcess) -> None:
    r = httpx.get(f"{weir.url}/v1/assistants", headers=AUTH)
    assert r.status_code == 404
    validate("ErrorResponse", r.json())


def engine_running(weir: WeirProcess) -> int:
    running: int = httpx.get(f"{weir.url}/health/ready").json()["engine"]["running"]
    return running


def wait_idle(weir: WeirProcess, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while engine_running(weir):
        assert time.monotonic() < deadline, "engine still has requests running"
        time.sleep(0.05)


async def test_fifty_abandoned_requests_leave_nothing_running(
        weir: WeirProcess, client: openai.OpenAI) -> None:
    """Hang up before any byte (queued or prefilling) and mid-stream, 50 times in all."""
    body = {"model": MODEL, "messages": MSG, "max_tokens": 800, "ignore_eos": True,
            "temperature": 0}
    async with httpx.AsyncClient(base_url=weir.url, headers=AUTH, timeout=60) as http:

        async def mid_stream() -> None:
            async with http.stream("POST", "/v1/chat/completions",
                                   json={**body, "stream": True}) as r:
                async for _ in r.aiter_bytes():
                    break  # first bytes arrived: hang up

        async def before_first_byte(count: int) -> None:
            tasks = [asyncio.create_task(http.post("/v1/chat/completions", json=body))
                     for _ in range(count)]
            # A whole (non-streamed) answer sends nothing until it ends; hang up once the
            # engine holds every one of them.
            deadline = time.monotonic() + 30
            while (await http.get("/health/ready")).json()["engine"]["running"] < count:
                assert time.monotonic() < deadline, "requests never reached the engine"
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        for _ in range(5):
            await before_first_byte(5)
            await asyncio.gather(*(mid_stream() for _ in range(5)))
    # The engine aborts each within a second of its disconnect.
    wait_idle(weir, timeout=10)
    r = client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=4)
    assert r.usage is not None and r.usage.completion_tokens == 4
