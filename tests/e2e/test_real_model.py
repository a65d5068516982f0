"""End to end on the real default model: `builtin:smollm2` (SmolLM2-135M-Instruct), served
as config/weir.yaml serves it, with the sanitizer and the cache in front, through the
OpenAI SDK. One server for the module: converting the model (first run only, ~30 s) and
starting the engine (~50 s) dominate.

The prompts are ones this model answers on its own (finish_reason `stop`) well within
`max_tokens`, greedy (temperature 0), so each run sees the same answers.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest
import yaml

from tests.e2e.server import ROOT, WeirProcess, e2e_config, sdk

MODEL = "smollm2-135m-instruct"
KEY = "sk-test-tenant-a"


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WeirProcess]:
    # The engine as config/weir.yaml serves it (dtype, eager mode, context length).
    engine = yaml.safe_load((ROOT / "config" / "weir.yaml").read_text())["engine"]
    assert engine["model"] == "builtin:smollm2" and engine["served_model_name"] == MODEL
    cfg = e2e_config(
        engine={k: engine[k] for k in ("model", "served_model_name", "dtype",
                                       "max_model_len", "extra_args")},
        embeddings={"enabled": True},
        plugins=[{"name": "sanitizer", "config": {}}, {"name": "cache", "config": {}}])
    proc = WeirProcess(tmp_path_factory.mktemp("weir-real"), cfg).start(timeout=420)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(real: WeirProcess) -> openai.OpenAI:
    return sdk(real.url, KEY)  # type: ignore[no-any-return]


def ask(client: openai.OpenAI, question: str, **kw: Any) -> tuple[Any, str, str]:
    """(completion, x-weir-cache, request id) for one greedy question."""
    request_id = uuid.uuid4().hex
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": question}], temperature=0,
        max_tokens=kw.pop("max_tokens", 256), extra_headers={"x-request-id": request_id},
        **kw)
    return raw.parse(), raw.headers["x-weir-cache"], request_id


def server_latency_ms(weir: WeirProcess, request_id: str, timeout: float = 10.0) -> float:
    """The latency the server's access log reports for one request. The line is written
    as the handler returns, so it is normally there already; the wait is bounded."""
    deadline = time.monotonic() + timeout
    while True:
        for line in weir.log_text().splitlines():
            if request_id in line and '"event": "request"' in line:
                return float(json.loads(line)["latency_ms"])
        if time.monotonic() > deadline:
            raise AssertionError(f"no access log line for {request_id}:\n{weir.tail()}")
        time.sleep(0.05)  # polling a file another process writes


def test_the_model_is_listed(client: openai.OpenAI) -> None:
    # The engine's model, and the embedding model /v1/embeddings serves.
    assert [m.id for m in client.models.list().data] == [MODEL, "all-MiniLM-L6-v2"]


@pytest.mark.parametrize(("question", "expected"), [
    ("What is the capital of France?", "paris"),
    ("What is 2 + 2?", "4"),
    ("Name three primary colors.", "red"),
])
def test_answers_are_real_and_end_on_their_own(client: openai.OpenAI, question: str,
                                                expected: str) -> None:
    reply, _, _ = ask(client, question)
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    assert reply.usage.completion_tokens < 256
    assert expected in (choice.message.content or "").lower()


def test_logprob_tokens_join_to_an_answer_that_ended_on_its_own(
        client: openai.OpenAI) -> None:
    """The end-of-turn token is no part of the content: no logprob entry for it."""
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is the capital of Italy?"}],
        temperature=0, max_tokens=128, logprobs=True, top_logprobs=1,
        extra_headers={"Cache-Control": "no-store"})
    choice = r.choices[0]
    assert choice.finish_reason == "stop" and choice.logprobs and choice.logprobs.content
    assert "".join(t.token for t in choice.logprobs.content) == choice.message.content
    assert "<|im_end|>" not in [t.token for t in choice.logprobs.content]


def test_streamed_answer_ends_with_stop(client: openai.OpenAI) -> None:
    parts: list[str] = []
    finish = None
    for chunk in client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Say hello in French."}],
            temperature=0, max_tokens=128, stream=True):
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    assert finish == "stop"
    assert "bonjour" in "".join(parts).lower()


def test_json_schema_answer_validates(client: openai.OpenAI) -> None:
    schema = {"type": "object",
              "properties": {"city": {"type": "string", "maxLength": 40},
                             "country": {"type": "string", "maxLength": 40}},
              "required": ["city", "country"], "additionalProperties": False}
    reply, _, _ = ask(client, "Give the capital of France and its country as JSON.",
                      max_tokens=100,
                      response_format={"type": "json_schema", "json_schema": {
                          "name": "capital", "strict": True, "schema": schema}})
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    answer = json.loads(choice.message.content)
    jsonschema.validate(answer, schema)
    assert answer["city"].lower() == "paris"


WEATHER: Any = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                   "properties": {"city": {"type": "string", "maxLength": 40}}}}}


def test_the_tools_reach_the_model_and_a_forced_call_is_valid(client: openai.OpenAI) -> None:
    """SmolLM2's own chat template renders no tools: a request's `tools` never reached
    the model. Served with Weir's (`smollm2_template`), the prompt lists each tool's
    schema and the `<tool_call>` form (it grows by them), and a forced call (decoding
    constrained to the tool's parameters) names the city the question asks about. Under
    `auto` (no parser configured) the 135M model answers text, as it did."""
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    bare = client.chat.completions.create(model=MODEL, messages=question, temperature=0,
                                          max_tokens=1)
    forced = client.chat.completions.create(
        model=MODEL, messages=question, temperature=0, max_tokens=60, tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert bare.usage and forced.usage
    assert forced.usage.prompt_tokens - bare.usage.prompt_tokens > 100  # the tools block
    (call,) = forced.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, WEATHER["function"]["parameters"])
    assert "paris" in args["city"].lower()
    auto = client.chat.completions.create(model=MODEL, messages=question, temperature=0,
                                          max_tokens=40, tools=[WEATHER])
    assert auto.usage and auto.usage.prompt_tokens == forced.usage.prompt_tokens
    assert auto.choices[0].message.tool_calls is None and auto.choices[0].message.content


def test_repeat_is_served_from_cache_100x_faster(real: WeirProcess,
                                                 client: openai.OpenAI) -> None:
    question = "How can I contact customer support?"
    first, layer, miss_id = ask(client, question)
    assert layer == "miss" and first.choices[0].finish_reason == "stop"
    second, layer, hit_id = ask(client, question)
    assert layer == "exact"
    assert second.choices[0].message.content == first.choices[0].message.content
    # The bar, on the durations the server itself logs (no client or network
    # noise): a generated answer of ~100+ tokens takes seconds on CPU, a hit about a
    # millisecond, so 100x leaves a margin of an order of magnitude or more.
    miss_ms = server_latency_ms(real, miss_id)
    hit_ms = server_latency_ms(real, hit_id)
    assert miss_ms >= 100 * hit_ms, (miss_ms, hit_ms)


def test_paraphrase_hits_the_semantic_layer(client: openai.OpenAI) -> None:
    first, layer, _ = ask(client, "What is the capital of France?", max_tokens=64)
    assert layer in ("miss", "exact")
    second, layer, _ = ask(client, "What's the capital city of France?", max_tokens=64)
    assert layer == "semantic"
    assert second.choices[0].message.content == first.choices[0].message.content
