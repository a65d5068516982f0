"""Every 400 a request body earns names the field at fault (`param`) and a machine-readable
`code`, as OpenAI's do: a sweep of bad bodies over the routes and the fake engine, and a
check that no refusal in the code is written without its code."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from proxy.errors import InvalidRequest
from proxy.protocol import EmbeddingRequest, parse_model
from tests.conftest import MakeClient
from tests.openai_spec import validate

ROOT = Path(__file__).resolve().parents[2]
MSG = [{"role": "user", "content": "hello"}]
CHAT = {"model": "fake-model", "messages": MSG}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
RTOOL = {"type": "function", "name": "f", "parameters": {"type": "object"}}

#: (route, bad body): each refused with a 400.
BAD: list[tuple[str, dict[str, Any]]] = [
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_schema"}}),
    ("/v1/chat/completions", {**CHAT, "stream_options": {"include_usage": True}}),
    ("/v1/chat/completions", {**CHAT, "stream": False, "stream_options": {}}),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_object"}}),
    ("/v1/chat/completions", {**CHAT, "top_logprobs": 2}),
    ("/v1/chat/completions", {**CHAT, "tool_choice": "auto"}),
    ("/v1/chat/completions", {**CHAT, "tools": [TOOL], "tool_choice": {
        "type": "function", "function": {"name": "g"}}}),
    ("/v1/chat/completions", {**CHAT, "parallel_tool_calls": True}),
    ("/v1/chat/completions", {**CHAT, "temperature": 3}),
    ("/v1/chat/completions", {**CHAT, "n": "two"}),
    ("/v1/chat/completions", {"model": "fake-model"}),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user"}]}),
    ("/v1/chat/completions", {**CHAT, "logit_bias": {"x": 1}}),
    ("/v1/chat/completions", {**CHAT, "min_tokens": 5, "max_tokens": 2}),
    ("/v1/chat/completions", {**CHAT, "continue_final_message": True}),
    ("/v1/completions", {"model": "fake-model", "prompt": "hi",
                         "stream_options": {"include_usage": True}}),
    ("/v1/completions", {"model": "fake-model", "prompt": "hi", "best_of": 1, "n": 2}),
    ("/v1/completions", {"model": "fake-model", "prompt": "hi", "max_tokens": -1}),
    ("/v1/completions", {"model": "fake-model"}),
    ("/v1/responses", {"model": "fake-model", "input": "hi",
                       "stream_options": {"include_usage": True}}),
    ("/v1/responses", {"model": "fake-model", "input": "hi", "tool_choice": "required"}),
    ("/v1/responses", {"model": "fake-model", "input": "hi", "tools": [RTOOL],
                       "tool_choice": {"type": "function", "name": "g"}}),
    ("/v1/responses", {"model": "fake-model", "input": "hi",
                       "text": {"format": {"type": "json_object"}}}),
    ("/v1/responses", {"model": "fake-model", "input": "hi", "background": True,
                       "store": False}),
    ("/v1/responses", {"model": "fake-model", "input": "hi", "max_output_tokens": 1}),
]


@pytest.mark.parametrize(("route", "body"), BAD)
async def test_every_400_names_its_param_and_code(make_client: MakeClient, route: str,
                                                  body: dict[str, Any]) -> None:
    client = await make_client()
    r = await client.post(route, json=body)
    assert r.status == 400, await r.text()
    err = (await r.json())["error"]
    validate("ErrorResponse", {"error": err})
    assert err["code"] and err["param"], err


def test_token_id_embeddings_are_refused_with_a_code() -> None:
    with pytest.raises(InvalidRequest) as e:
        parse_model(EmbeddingRequest, {"model": "m", "input": [1, 2, 3]})
    assert (e.value.param, e.value.code) == ("input", "unsupported_value")


def _uncoded() -> list[str]:
    """Each `InvalidRequest(...)` in the gateway's code that is given no `code=`."""
    found = []
    for path in sorted([*ROOT.glob("proxy/**/*.py"), *ROOT.glob("plugins/**/*.py")]):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id == "InvalidRequest" \
                    and "code" not in {k.arg for k in node.keywords}:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_no_400_is_raised_without_a_code() -> None:
    assert _uncoded() == []


LONG = "x" * 50_000
#: (method, route, body or None): each names `LONG` where an error quotes the caller.
ECHOING: list[tuple[str, str, dict[str, Any] | None]] = [
    ("POST", "/v1/chat/completions", {**CHAT, "model": LONG}),
    ("POST", "/v1/completions", {"model": LONG, "prompt": "hi"}),
    ("POST", "/v1/responses", {"model": LONG, "input": "hi"}),
    ("POST", "/v1/embeddings", {"model": LONG, "input": "hi"}),
    ("GET", f"/v1/models/{LONG[:4000]}", None),
    ("GET", f"/v1/{LONG[:4000]}", None),
    ("POST", "/v1/chat/completions", {**CHAT, "tools": [TOOL], "tool_choice": {
        "type": "function", "function": {"name": LONG}}}),
    ("POST", "/v1/responses", {"model": "fake-model", "input": "hi", "tools": [RTOOL],
                               "tool_choice": {"type": "function", "name": LONG}}),
    ("POST", "/v1/chat/completions", {**CHAT, "logit_bias": {LONG: 1}}),
    ("POST", "/v1/chat/completions", {**CHAT, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": [LONG, "null"]}}}]}),
    ("POST", "/v1/chat/completions", {**CHAT, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": LONG, "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "user", "content": "and?"}]}),
    ("POST", "/v1/chat/completions", {**CHAT, "response_format": {
        "type": "json_schema", "json_schema": {"name": "n", "schema": {
            "type": "object", "properties": {"a": {"$ref": "#/$defs/" + LONG}}}}}}),
    ("POST", "/v1/chat/completions", {**CHAT, "response_format": {
        "type": "json_schema", "json_schema": {"name": "n", "strict": True, "schema": {
            "type": "object", "additionalProperties": False,
            "properties": {LONG: {"type": "string"}}}}}}),
    ("POST", "/v1/chat/completions", {**CHAT, "response_format": {
        "type": "json_schema", "json_schema": {"name": "n", "strict": True,
                                               "schema": {"type": LONG}}}}),
]


@pytest.mark.parametrize(("method", "route", "body"), ECHOING)
async def test_an_error_quotes_a_long_value_cut(make_client: MakeClient, method: str,
                                                route: str, body: dict[str, Any] | None,
                                                ) -> None:
    client = await make_client()
    r = await client.request(method, route, json=body)
    assert 400 <= r.status < 500, await r.text()
    err = (await r.json())["error"]
    validate("ErrorResponse", {"error": err})
    assert len(err["message"]) < 600 and "xxx..." in err["message"], err["message"][:300]


async def test_an_unknown_model_is_the_same_404_on_every_route(make_client: MakeClient,
                                                               ) -> None:
    """`GET /v1/models/{id}` names the `model` as chat does (OpenAI's shape)."""
    client = await make_client()
    chat = await client.post("/v1/chat/completions", json={**CHAT, "model": "nope"})
    one = await client.get("/v1/models/nope")
    assert chat.status == one.status == 404
    assert (await chat.json()) == (await one.json())


@pytest.mark.parametrize(("prompt", "param"), [
    ("x" * 600, "prompt"), ([1] * 600, "prompt"), (["hi", "x" * 600, "y"], "prompt[1]"),
    ([[1], [2] * 600], "prompt[1]"), ([[1], [2, 5000]], "prompt[1][1]"),
    ([1, 5000], "prompt[1]")])
@pytest.mark.parametrize("echo_only", [False, True])
async def test_a_completion_error_names_the_prompt_at_fault(
        make_client: MakeClient, prompt: Any, param: str, echo_only: bool) -> None:
    """Of several prompts, the one too long for the context (or empty, or holding a
    token id past the vocabulary) is named as OpenAI names an array's member: it was
    `prompt` whichever it was."""
    client = await make_client()
    body = {"model": "fake-model", "prompt": prompt,
            **({"max_tokens": 0, "echo": True} if echo_only else {"max_tokens": 2})}
    r = await client.post("/v1/completions", json=body)
    assert r.status == 400, await r.text()
    assert (await r.json())["error"]["param"] == param


def test_an_embedding_input_too_long_names_its_member() -> None:
    from proxy.embedding import InputTooLong
    from proxy.embeddings_api import _too_long

    assert _too_long(InputTooLong(2, 900), 256, listed=True).param == "input[2]"
    assert _too_long(InputTooLong(0, 900), 256, listed=False).param == "input"
