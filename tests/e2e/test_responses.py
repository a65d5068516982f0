"""End to end: the Responses API on the real engine through the official SDK: create
(whole and streamed), retrieve, previous_response_id, delete, tenant isolation, and a
forced function call."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.conftest import MODEL
from tests.e2e.server import WeirProcess, e2e_config
from tests.e2e.server import sdk as sdk_client
from tests.openai_spec import validate

KEYS = [{"key": "sk-resp-a", "tenant": "a"}, {"key": "sk-resp-b", "tenant": "b"}]
TOOL: Any = {"type": "function", "name": "get_weather", "description": "Weather",
             "parameters": {"type": "object", "additionalProperties": False,
                            "required": ["city"],
                            "properties": {"city": {"type": "string",
                                                    "enum": ["Paris", "Rome"]}}}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WeirProcess]:
    cfg = e2e_config(auth={"mode": "keys", "keys": KEYS})
    proc = WeirProcess(tmp_path_factory.mktemp("weir-responses"), cfg).start()
    yield proc
    proc.stop()


def sdk(server: WeirProcess, key: str = "sk-resp-a") -> openai.OpenAI:
    return sdk_client(server.url, key)  # type: ignore[no-any-return]


def test_create_whole_and_retrieve(server: WeirProcess) -> None:
    c = sdk(server)
    resp = c.responses.create(model=MODEL, input="Hello there", instructions="Be brief.",
                              max_output_tokens=16, temperature=0, metadata={"run": "e2e"})
    validate("Response", resp.model_dump(exclude_unset=True))
    assert resp.output_text and resp.usage and resp.usage.output_tokens > 0
    got = c.responses.retrieve(resp.id)
    assert got.id == resp.id and got.output_text == resp.output_text
    assert got.metadata == {"run": "e2e"}
    items = c.responses.input_items.list(resp.id)  # the SDK's own call and parsing
    assert [(i.type, i.role) for i in items.data] == [("message", "user")]
    assert items.data[0].content[0].text == "Hello there"  # type: ignore[union-attr]
    with pytest.raises(openai.BadRequestError) as e:  # only background ones cancel
        c.responses.cancel(resp.id)
    assert "background" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:  # (it is read from the store)
        c.responses.create(model=MODEL, input="Hello", background=True, store=False)
    assert e.value.body["param"] == "background"  # type: ignore[index]


def test_background_streamed_resumed_and_cancelled(server: WeirProcess) -> None:
    """`background: true` through the SDK: streamed live, its events resumed past a
    sequence number, retrieved at its end; another one cancelled while it runs."""
    c = sdk(server)
    stream = c.responses.create(model=MODEL, input="Count to five.", max_output_tokens=16,
                                temperature=0, background=True, stream=True)
    events = [e.model_dump(exclude_unset=True) for e in stream]
    for e in events:
        validate("ResponseStreamEvent", e)
    assert [e["type"] for e in events[:2]] == ["response.created", "response.queued"]
    assert events[0]["response"]["status"] == "queued"
    assert events[-1]["type"] in ("response.completed", "response.incomplete")
    rid = events[0]["response"]["id"]
    again = c.responses.retrieve(rid, stream=True, starting_after=2)
    resumed = [e.model_dump(exclude_unset=True) for e in again]
    assert resumed == events[3:]
    got = c.responses.retrieve(rid)
    assert got.background is True and got.status == events[-1]["response"]["status"]
    assert got.output_text == "".join(
        e["delta"] for e in events if e["type"] == "response.output_text.delta")
    long = c.responses.create(model=MODEL, input="Write a long story.",
                              max_output_tokens=900, background=True)
    assert long.status in ("queued", "in_progress")
    try:
        cancelled = c.responses.cancel(long.id)
    except openai.BadRequestError:  # (it ended first: a cancel is then refused)
        assert c.responses.retrieve(long.id).status in ("completed", "incomplete")
    else:
        assert cancelled.status == "cancelled"
        assert c.responses.retrieve(long.id).status == "cancelled"
        assert c.responses.cancel(long.id).status == "cancelled"


def test_create_streamed(server: WeirProcess) -> None:
    c = sdk(server)
    events = list(c.responses.create(model=MODEL, input="Stream please", stream=True,
                                     max_output_tokens=16, temperature=0))
    for e in events:
        validate("ResponseStreamEvent", e.model_dump(exclude_unset=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created"
    assert events[-1].type in ("response.completed", "response.incomplete")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response  # type: ignore[union-attr]
    assert text and final.output_text == text
    assert c.responses.retrieve(final.id).output_text == text


def test_previous_response_id_continues_the_conversation(server: WeirProcess) -> None:
    c = sdk(server)
    first = c.responses.create(model=MODEL, input="My name is Ada.", max_output_tokens=16,
                               temperature=0)
    second = c.responses.create(model=MODEL, input="What is my name?",
                                previous_response_id=first.id, max_output_tokens=16,
                                temperature=0)
    assert second.previous_response_id == first.id
    # The second prompt holds the first turn (its user message alone is several tokens).
    alone = c.responses.create(model=MODEL, input="What is my name?", max_output_tokens=16,
                               temperature=0, store=False)
    assert second.usage and alone.usage
    assert second.usage.input_tokens > alone.usage.input_tokens + 3


def test_stored_responses_are_tenant_scoped(server: WeirProcess) -> None:
    resp = sdk(server).responses.create(model=MODEL, input="secret of tenant a",
                                        max_output_tokens=16, temperature=0)
    other = sdk(server, "sk-resp-b")
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(resp.id)
    with pytest.raises(openai.NotFoundError):
        other.responses.delete(resp.id)
    with pytest.raises(openai.BadRequestError) as e:  # OpenAI's 400 for an unknown id
        other.responses.create(model=MODEL, input="and?", previous_response_id=resp.id)
    assert e.value.body["param"] == "previous_response_id"  # type: ignore[index]
    assert e.value.code == "previous_response_not_found"
    sdk(server).responses.delete(resp.id)
    with pytest.raises(openai.NotFoundError):
        sdk(server).responses.retrieve(resp.id)


def test_forced_function_call_and_its_result(server: WeirProcess) -> None:
    c = sdk(server)
    resp = c.responses.create(model=MODEL, input="Weather in Paris?", tools=[TOOL],
                              tool_choice="required", parallel_tool_calls=False,
                              max_output_tokens=200, temperature=0)
    validate("Response", resp.model_dump(exclude_unset=True))
    call = resp.output[0]
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments)["city"] in ("Paris", "Rome")
    answer = c.responses.create(model=MODEL, previous_response_id=resp.id, tools=[TOOL],
                                input=[{"type": "function_call_output", "call_id": call.call_id,
                                        "output": "Sunny"}],
                                max_output_tokens=16, temperature=0)
    assert answer.output[0].type == "message" and answer.output_text


def test_streamed_function_call_events(server: WeirProcess) -> None:
    c = sdk(server)
    events = list(c.responses.create(model=MODEL, input="Weather?", tools=[TOOL], stream=True,
                                     tool_choice={"type": "function", "name": "get_weather"},
                                     max_output_tokens=200, temperature=0))
    for e in events:
        validate("ResponseStreamEvent", e.model_dump(exclude_unset=True))
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and json.loads(done[0].arguments)["city"] in ("Paris", "Rome")
    assert events[-1].type == "response.completed"


def test_bad_input_is_a_400_naming_the_param(server: WeirProcess) -> None:
    r = httpx.post(f"{server.url}/v1/responses", headers={"Authorization": "Bearer sk-resp-a"},
                   json={"model": MODEL, "input": "x", "tools": [{"type": "web_search"}]})
    assert r.status_code == 400
    body = r.json()
    validate("ErrorResponse", body)
    assert body["error"]["param"] == "tools[0].type"
