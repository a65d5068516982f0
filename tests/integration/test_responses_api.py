"""The Responses API over the fake engine: shapes against the official spec, events in
order, storage scoped by tenant, the same plugin chain as chat."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from bench.redis_server import RedisServer
from tests.conftest import MakeClient, make_settings
from tests.fakes import FakeEngine
from tests.openai_spec import validate
from tests.sse import check_event_names, parse_sse

BASE = {"model": "fake-model", "input": "hi", "max_output_tokens": 16}
TOOL = {"type": "function", "name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}


def keyed(*tenants: str) -> Any:
    return make_settings(auth={"mode": "keys", "keys": [
        {"key": f"sk-{t}", "tenant": t} for t in tenants]})


def auth(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer sk-{tenant}"}


async def test_create_matches_spec_and_echoes_settings(make_client: MakeClient,
                                                       fake_engine: FakeEngine) -> None:
    client = await make_client()
    r = await client.post("/v1/responses", json={**BASE, "instructions": "Be brief.",
                                                 "metadata": {"k": "v"}, "temperature": 0.5})
    assert r.status == 200
    body = await r.json()
    validate("Response", body)
    prompt, opts, _ = fake_engine.calls[0]
    assert body["status"] == "incomplete"  # the fake engine always runs to the limit
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][0]["content"][0]["text"] == FakeEngine.expected_text(prompt, 16)
    assert body["instructions"] == "Be brief." and body["metadata"] == {"k": "v"}
    assert body["usage"]["output_tokens"] == 16 and opts.temperature == 0.5


async def test_vllms_sampling_extensions_reach_the_engine(make_client: MakeClient,
                                                          fake_engine: FakeEngine) -> None:
    """`top_k`, `min_p` and `repetition_penalty`, as vLLM's own Responses API takes them
    (they were accepted and dropped); out of bounds, a 400 naming them."""
    client = await make_client()
    r = await client.post("/v1/responses", json={**BASE, "top_k": 5, "min_p": 0.1,
                                                 "repetition_penalty": 1.3})
    assert r.status == 200
    _, opts, _ = fake_engine.calls[0]
    assert (opts.top_k, opts.min_p, opts.repetition_penalty) == (5, 0.1, 1.3)
    r = await client.post("/v1/responses", json={**BASE, "repetition_penalty": 0})
    assert r.status == 400 and (await r.json())["error"]["param"] == "repetition_penalty"


async def test_stream_events_are_ordered_numbered_and_valid(make_client: MakeClient) -> None:
    client = await make_client()
    whole = await (await client.post("/v1/responses", json={**BASE, "store": False})).json()
    r = await client.post("/v1/responses", json={**BASE, "stream": True})
    assert r.status == 200
    body = await r.text()
    events, done = parse_sse(body)
    assert not done and "[DONE]" not in body  # the Responses stream ends with its event
    assert check_event_names(body) == len(events)
    for e in events:
        validate("ResponseStreamEvent", e)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    types = [e["type"] for e in events]
    assert types[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.incomplete"]
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == whole["output"][0]["content"][0]["text"]
    final = events[-1]["response"]
    assert final["output"][0]["content"][0]["text"] == text
    stored = await (await client.get(f"/v1/responses/{final['id']}")).json()
    assert stored["output"] == final["output"]


async def test_retrieve_and_delete_are_scoped_to_the_tenant(make_client: MakeClient) -> None:
    client = await make_client(keyed("a", "b"))
    body = await (await client.post("/v1/responses", json=BASE, headers=auth("a"))).json()
    rid = body["id"]
    got = await client.get(f"/v1/responses/{rid}", headers=auth("a"))
    assert got.status == 200 and (await got.json())["id"] == rid
    other = await client.get(f"/v1/responses/{rid}", headers=auth("b"))
    assert other.status == 404
    validate("ErrorResponse", await other.json())
    assert (await client.delete(f"/v1/responses/{rid}", headers=auth("b"))).status == 404
    follow = await client.post("/v1/responses", headers=auth("b"),
                               json={**BASE, "previous_response_id": rid})
    assert follow.status == 400  # as OpenAI answers an id it does not know
    assert (await follow.json())["error"]["param"] == "previous_response_id"
    assert (await follow.json())["error"]["code"] == "previous_response_not_found"
    deleted = await client.delete(f"/v1/responses/{rid}", headers=auth("a"))
    assert await deleted.json() == {"id": rid, "object": "response", "deleted": True}
    assert (await client.get(f"/v1/responses/{rid}", headers=auth("a"))).status == 404


async def test_retrieve_refuses_a_stream_or_include_it_cannot_give(
        make_client: MakeClient) -> None:
    """`GET /v1/responses/{id}?stream=true` answered the JSON, which the SDK read as a
    stream of no events, silently; `include` was ignored (create refuses it). (A stream
    is a background response's alone: for this one, an invalid value.)"""
    client = await make_client()
    rid = (await (await client.post("/v1/responses", json=BASE)).json())["id"]
    for query, param, code in (
            ("stream=true", "stream", "invalid_value"),
            ("stream=True", "stream", "invalid_value"),
            ("include[]=message.output_text.logprobs", "include", "unsupported_parameter"),
            ("include=reasoning.encrypted_content", "include", "unsupported_parameter")):
        r = await client.get(f"/v1/responses/{rid}?{query}")
        assert r.status == 400, query
        body = await r.json()
        validate("ErrorResponse", body)
        assert (body["error"]["param"], body["error"]["code"]) == (param, code)
    for query in ("", "?stream=false", "?include[]="):
        r = await client.get(f"/v1/responses/{rid}{query}")
        assert r.status == 200 and (await r.json())["id"] == rid
    assert (await client.get("/v1/responses/resp_nope?stream=true")).status == 404


@pytest.mark.parametrize("path", ["", "/input_items"])
async def test_include_on_a_get_is_checked_alike_on_both_routes(make_client: MakeClient,
                                                                path: str) -> None:
    """`input_items` ignored `include`, even a made-up value, while the retrieve route
    refused every one as unsupported: on both, a value outside OpenAI's list is an
    invalid value naming `include`, and one of its values is refused as unsupported (none
    of what it names is available here); an empty one asks nothing."""
    client = await make_client()
    rid = (await (await client.post("/v1/responses", json=BASE)).json())["id"]
    for query, code in (("include=bogus", "invalid_value"),
                        ("include[]=message.output_text.logprob", "invalid_value"),
                        ("include=reasoning.encrypted_content&include=bogus", "invalid_value"),
                        ("include[]=message.input_image.image_url", "unsupported_parameter"),
                        ("include=reasoning.encrypted_content", "unsupported_parameter")):
        r = await client.get(f"/v1/responses/{rid}{path}?{query}")
        assert r.status == 400, query
        body = await r.json()
        validate("ErrorResponse", body)
        assert (body["error"]["param"], body["error"]["code"]) == ("include", code), query
    r = await client.get(f"/v1/responses/{rid}{path}?include[]=")
    assert r.status == 200
    assert (await client.get(f"/v1/responses/resp_nope{path}?include=bogus")).status == 404


async def test_one_tenant_filling_the_store_never_evicts_another(make_client: MakeClient,
                                                                 ) -> None:
    settings = keyed("a", "b")
    settings.responses.max_in_memory = 5
    client = await make_client(settings)
    mine = (await (await client.post("/v1/responses", json=BASE, headers=auth("a"))).json())
    theirs = [(await (await client.post("/v1/responses", json=BASE, headers=auth("b"))).json()
               )["id"] for _ in range(8)]
    assert (await client.get(f"/v1/responses/{mine['id']}", headers=auth("a"))).status == 200
    follow = await client.post("/v1/responses", headers=auth("a"),
                               json={**BASE, "previous_response_id": mine["id"]})
    assert follow.status == 200
    # b pushed out its own oldest: it holds what is left of the 5 after a's 2
    kept = [(await client.get(f"/v1/responses/{rid}", headers=auth("b"))).status
            for rid in theirs]
    assert kept == [404] * 5 + [200] * 3


async def test_input_items_are_listed_paged_and_scoped(make_client: MakeClient) -> None:
    client = await make_client(keyed("a", "b"))
    items = [{"role": "system", "content": "Be brief."},
             {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
             {"type": "function_call", "call_id": "c1", "name": "get_weather",
              "arguments": '{"city": "Paris"}', "id": "fc_given"},
             {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
             {"role": "assistant", "content": "It is sunny."},
             {"role": "user", "content": "thanks"}]
    body = await (await client.post("/v1/responses", headers=auth("a"),
                                    json={**BASE, "tools": [TOOL], "input": items})).json()
    url = f"/v1/responses/{body['id']}/input_items"
    listed = await (await client.get(url, headers=auth("a"))).json()
    validate("ResponseItemList", listed)
    data = listed["data"]
    assert [d["type"] for d in data] == ["message", "message", "function_call_output",
                                         "function_call", "message", "message"]  # newest first
    assert data[0]["content"] == [{"type": "input_text", "text": "thanks"}]
    assert data[3]["id"] == "fc_given" and data[2]["output"] == "sunny"
    assert listed["has_more"] is False and listed["first_id"] == data[0]["id"]
    asc = await (await client.get(url, headers=auth("a"),
                                  params={"order": "asc", "limit": "2"})).json()
    assert [d["id"] for d in asc["data"]] == [d["id"] for d in data[::-1][:2]]
    assert asc["has_more"] is True and asc["last_id"] == asc["data"][-1]["id"]
    rest = await (await client.get(url, headers=auth("a"), params={
        "order": "asc", "after": asc["last_id"]})).json()
    assert [d["id"] for d in rest["data"]] == [d["id"] for d in data[::-1][2:]]
    for bad, param in (({"limit": "0"}, "limit"), ({"limit": "x"}, "limit"),
                       ({"order": "up"}, "order"), ({"after": "nope"}, "after"),
                       # (given twice: which one was meant is not known)
                       ([("limit", "2"), ("limit", "500")], "limit"),
                       ([("order", "asc"), ("order", "desc")], "order"),
                       ([("after", asc["last_id"]), ("after", "x")], "after")):
        r = await client.get(url, headers=auth("a"), params=bad)
        assert r.status == 400 and (await r.json())["error"]["param"] == param
    other = await client.get(url, headers=auth("b"))
    assert other.status == 404
    validate("ErrorResponse", await other.json())


async def test_cancel_is_for_background_responses_only(make_client: MakeClient) -> None:
    client = await make_client(keyed("a", "b"))
    body = await (await client.post("/v1/responses", json=BASE, headers=auth("a"))).json()
    r = await client.post(f"/v1/responses/{body['id']}/cancel", headers=auth("a"))
    assert r.status == 400
    validate("ErrorResponse", await r.json())
    assert "background" in (await r.json())["error"]["message"]
    assert (await client.post(f"/v1/responses/{body['id']}/cancel",
                              headers=auth("b"))).status == 404
    assert (await client.post("/v1/responses/resp_nope/cancel",
                              headers=auth("a"))).status == 404


@pytest.mark.parametrize("path", ["input_tokens", "compact"])
async def test_the_responses_endpoints_not_served_are_unknown_urls(make_client: MakeClient,
                                                                   path: str) -> None:
    """OpenAI's `POST /v1/responses/input_tokens` and `/compact` (the SDK's
    `responses.input_tokens.count`, `responses.compact`) were read as a response id: a
    405 saying POST is not allowed there, only GET and DELETE. They are not served: a 404
    `unknown_url`, as every endpoint Weir does not serve."""
    client = await make_client()
    r = await client.post(f"/v1/responses/{path}", json={**BASE})
    body = await r.json()
    validate("ErrorResponse", body)
    assert (r.status, body["error"]["code"]) == (404, "unknown_url")
    assert f"POST /v1/responses/{path}" in body["error"]["message"]


@pytest.mark.parametrize("method", ["PUT", "PATCH", "TRACE", "GET", "DELETE"])
@pytest.mark.parametrize("path", ["input_tokens", "compact"])
async def test_the_responses_endpoints_not_served_are_unknown_urls_to_every_method(
        make_client: MakeClient, path: str, method: str) -> None:
    """Unknown to POST, they were known to the other methods: a 405 whose `Allow` named
    POST (a 404 there), GET and DELETE. Every method gets the 404 of an unknown URL."""
    client = await make_client()
    r = await client.request(method, f"/v1/responses/{path}")
    assert r.status == 404 and "Allow" not in r.headers
    assert (await r.json())["error"]["code"] == "unknown_url"


async def test_store_false_keeps_nothing(make_client: MakeClient) -> None:
    client = await make_client()
    body = await (await client.post("/v1/responses", json={**BASE, "store": False})).json()
    assert (await client.get(f"/v1/responses/{body['id']}")).status == 404


async def test_previous_response_id_rebuilds_the_conversation(make_client: MakeClient,
                                                              fake_engine: FakeEngine) -> None:
    client = await make_client()
    first = await (await client.post("/v1/responses", json={
        **BASE, "instructions": "Only for the first turn."})).json()
    await client.post("/v1/responses", json={**BASE, "input": "and then?",
                                             "previous_response_id": first["id"]})
    prompt = fake_engine.calls[1][0]
    answer = first["output"][0]["content"][0]["text"]
    expected = fake_engine.render_chat([
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": answer},
        {"role": "user", "content": "and then?"}], None)
    assert prompt == expected  # the earlier turn, without its instructions


async def test_an_item_the_previous_response_holds_sent_again_is_a_400(
        make_client: MakeClient, fake_engine: FakeEngine) -> None:
    """With `previous_response_id`, the previous response's items are the conversation
    already: its output sent back as input (`input=prev.output + [...]`) would be said
    twice to the model (and listed under the id its first turn has). OpenAI answers
    "Duplicate item found with id ..."; so does Weir, for its output and its input."""
    client = await make_client()
    first = await (await client.post("/v1/responses", json={
        **BASE, "input": [{"role": "user", "content": "hi", "id": "msg_mine"}]})).json()
    for item in (first["output"][0],
                 {"type": "message", "role": "user", "content": "hi", "id": "msg_mine"}):
        r = await client.post("/v1/responses", json={
            **BASE, "previous_response_id": first["id"],
            "input": [item, {"role": "user", "content": "and then?"}]})
        assert r.status == 400
        body = await r.json()
        validate("ErrorResponse", body)
        assert body["error"]["param"] == "input"
        assert body["error"]["code"] is None  # (OpenAI's has none)
        assert body["error"]["message"].startswith(f"Duplicate item found with id {item['id']}")
    assert len(fake_engine.calls) == 1  # neither reached the engine
    # An item of an id of its own goes on from it, as does the same text without an id.
    r = await client.post("/v1/responses", json={
        **BASE, "previous_response_id": first["id"],
        "input": [{"role": "user", "content": "hi", "id": "msg_other"}]})
    assert r.status == 200
    # An output that made calls, sent back whole with their outputs, is its own turn
    # (the calls are answered, not made again): taken, as it was.
    calls = await (await client.post("/v1/responses", json={
        **BASE, "tools": [TOOL], "tool_choice": "required"})).json()
    assert [o["type"] for o in calls["output"]] == ["function_call"]
    r = await client.post("/v1/responses", json={
        **BASE, "previous_response_id": calls["id"], "tools": [TOOL],
        "input": [*calls["output"], {"type": "function_call_output",
                                     "call_id": calls["output"][0]["call_id"], "output": "sunny"}]})
    assert r.status == 200, await r.text()


@pytest.mark.parametrize("item", [
    {"type": "message", "role": "user", "content": "hi", "id": "msg_mine"},
    {"type": "message", "role": "assistant", "id": "msg_mine",
     "content": [{"type": "output_text", "text": "hello"}]},
    {"type": "function_call", "id": "fc_mine", "call_id": "call_1", "name": "get_weather",
     "arguments": "{}"},
    {"type": "reasoning", "id": "rs_mine", "summary": []},
])
async def test_one_item_sent_twice_in_one_input_is_a_400(
        make_client: MakeClient, fake_engine: FakeEngine, item: dict[str, Any]) -> None:
    """The same item id twice in one `input` was taken, the second given an id of its
    own, and the model read the item twice. OpenAI refuses it: "Duplicate item found
    with id ..." (param `input`); so does Weir, whatever the item. Items without ids,
    the same text twice, never clash."""
    client = await make_client()
    tail: list[dict[str, Any]] = (
        [{"type": "function_call_output", "call_id": "call_1", "output": "sunny"}]
        if item["type"] == "function_call" else [])
    r = await client.post("/v1/responses", json={
        **BASE, "tools": [TOOL], "input": [item, *tail, item, *tail,
                                           {"role": "user", "content": "and?"}]})
    assert r.status == 400, await r.text()
    body = await r.json()
    validate("ErrorResponse", body)
    assert body["error"]["param"] == "input"
    assert body["error"]["code"] is None  # (OpenAI's has none)
    assert body["error"]["message"].startswith(f"Duplicate item found with id {item['id']}")
    assert not fake_engine.calls
    same = {"role": "user", "content": "hi"}
    r = await client.post("/v1/responses", json={**BASE, "input": [same, same]})
    assert r.status == 200, await r.text()


async def part_refused(client: TestClient[Any, web.Application],
                       fake_engine: FakeEngine, role: str, part: str, allowed: str
                       ) -> list[dict[str, Any]]:
    """A message of `role` with a text part of type `part` (the second of three input
    items) is OpenAI's 400 naming the part and the types `allowed`, the engine not
    asked; the items sent, for more."""
    items: list[dict[str, Any]] = [
        {"role": "user", "content": "hi"},
        {"role": role, "content": [{"type": part, "text": "a"}]},
        {"role": "user", "content": "go on"}]
    r = await client.post("/v1/responses", json={**BASE, "input": items})
    assert r.status == 400, await r.text()
    body = await r.json()
    validate("ErrorResponse", body)
    assert body["error"] == {
        "message": f"Invalid value: '{part}'. Supported values are: {allowed}.",
        "type": "invalid_request_error", "param": "input[1].content[0]",
        "code": "invalid_value"}
    assert not fake_engine.calls
    return items


@pytest.mark.parametrize(("role", "part", "allowed"), [
    ("user", "output_text", "'input_text', 'input_image', and 'input_file'"),
    ("system", "output_text", "'input_text', 'input_image', and 'input_file'"),
    ("developer", "output_text", "'input_text', 'input_image', and 'input_file'"),
    ("assistant", "input_text", "'output_text' and 'refusal'"),
])
async def test_a_text_part_of_the_other_role_is_a_400(
        make_client: MakeClient, fake_engine: FakeEngine, role: str, part: str,
        allowed: str) -> None:
    """An input message's text parts are its role's, as OpenAI holds them: a user's
    (system's, developer's) `input_text`, an assistant's `output_text`. The other's
    was read to the model as if it were right; OpenAI refuses it ("Invalid value:
    'input_text'. Supported values are: 'output_text' and 'refusal'.", param
    `input[1].content[0]`), and so does Weir. Each in its own role, and a plain string,
    is taken."""
    client = await make_client()
    items = await part_refused(client, fake_engine, role, part, allowed)
    own = "output_text" if role == "assistant" else "input_text"
    for content in ([{"type": own, "text": "a"}], "a"):
        items[1]["content"] = content
        r = await client.post("/v1/responses", json={**BASE, "input": items})
        assert r.status == 200, await r.text()


async def test_an_item_a_response_earlier_in_the_chain_holds_sent_again_is_a_400(
        make_client: MakeClient, fake_engine: FakeEngine) -> None:
    """The chain's earlier responses are the conversation too, not only the previous
    one: an app that sends its whole history with `previous_response_id` (the answer
    of two turns ago, with its id, before a turn whose answer made a call) had it said
    twice to the model. Refused as the previous response's own items are."""
    client = await make_client()
    first = await (await client.post("/v1/responses", json=BASE)).json()
    said = first["output"][0]
    calls = await (await client.post("/v1/responses", json={
        **BASE, "previous_response_id": first["id"], "tools": [TOOL],
        "tool_choice": "required", "input": "and the weather?"})).json()
    call = calls["output"][0]
    answer = {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}
    r = await client.post("/v1/responses", json={
        **BASE, "previous_response_id": calls["id"], "tools": [TOOL],
        "input": [said, {"role": "user", "content": "and the weather?"}, call, answer]})
    assert r.status == 400, await r.text()
    body = await r.json()
    assert body["error"]["message"].startswith(f"Duplicate item found with id {said['id']}")
    # Its calls sent back with their outputs go on, as they did; and so does a turn
    # after, with the same item sent again.
    done = await client.post("/v1/responses", json={
        **BASE, "previous_response_id": calls["id"], "tools": [TOOL],
        "input": [call, answer]})
    assert done.status == 200, await done.text()
    r = await client.post("/v1/responses", json={
        **BASE, "previous_response_id": (await done.json())["id"],
        "input": [said, {"role": "user", "content": "thanks"}]})
    assert r.status == 400, await r.text()


async def test_what_a_failed_response_cut_may_be_sent_again(
        make_client: MakeClient, fake_engine: FakeEngine) -> None:
    """The message a failure cut half written is no turn of the conversation a
    follow-up goes on from: sent back (`input=prev.output + [...]`), it is said once, not
    twice, and is no duplicate (it was refused as one). A response after it still holds
    it: sent again there, it is one."""
    fake_engine.fail_after = 3
    client = await make_client()
    events, _ = parse_sse(await (await client.post("/v1/responses", json={
        **BASE, "stream": True})).text())
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["output"][0]["status"] == "incomplete"
    fake_engine.fail_after = None
    r = await client.post("/v1/responses", json={
        **BASE, "previous_response_id": failed["id"],
        "input": [*failed["output"], {"role": "user", "content": "go on"}]})
    assert r.status == 200, await r.text()
    seen = "".join(chr(i - 2) for i in fake_engine.calls[-1][0][1:])  # (its encoding)
    text = failed["output"][0]["content"][0]["text"]
    assert seen.count(text) == 1
    r = await client.post("/v1/responses", json={
        **BASE, "previous_response_id": (await r.json())["id"],
        "input": [*failed["output"], {"role": "user", "content": "once more"}]})
    assert r.status == 400, await r.text()


async def test_function_call_items_round_trip_to_the_template(make_client: MakeClient,
                                                              fake_engine: FakeEngine) -> None:
    client = await make_client()
    r = await client.post("/v1/responses", json={**BASE, "tools": [TOOL], "input": [
        {"role": "user", "content": "weather?"},
        {"type": "function_call", "call_id": "c1", "name": "get_weather",
         "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"}]})
    assert r.status == 200
    assert fake_engine.calls[0][0] == fake_engine.render_chat([
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": ""},
        {"role": "tool", "content": "sunny"}], None)


async def test_reasoning_items_are_taken_listed_and_left_out_of_the_prompt(
        make_client: MakeClient, fake_engine: FakeEngine) -> None:
    """Apps replay a reasoning model's output items (the Agents SDK does): this model does
    not reason, so they are listed with the input but never reach the template."""
    client = await make_client()
    reasoning = {"type": "reasoning", "id": "rs_1", "status": "completed",
                 "summary": [{"type": "summary_text", "text": "thought about it"}],
                 "encrypted_content": "opaque"}
    r = await client.post("/v1/responses", json={**BASE, "tools": [TOOL], "input": [
        {"role": "user", "content": "weather?"}, reasoning,
        {"type": "function_call", "call_id": "c1", "name": "get_weather",
         "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {**reasoning, "id": "rs_2", "content": [{"type": "reasoning_text", "text": "hm"}]}]})
    assert r.status == 200, await r.text()
    assert fake_engine.calls[0][0] == fake_engine.render_chat([
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": ""},
        {"role": "tool", "content": "sunny"}], None)
    listed = await (await client.get(
        f"/v1/responses/{(await r.json())['id']}/input_items?order=asc")).json()
    validate("ResponseItemList", listed)
    assert [i["type"] for i in listed["data"]] == [
        "message", "reasoning", "function_call", "function_call_output", "reasoning"]
    assert listed["data"][1] == reasoning and listed["data"][4]["id"] == "rs_2"
    assert "thought about it" not in fake_engine.calls[0][0]


async def test_an_empty_answer_is_one_empty_message_whole_and_streamed(
        make_client: MakeClient, fake_engine: FakeEngine) -> None:
    """A model that ends its turn at once answers an empty message, whole or streamed
    (the stream had no item at all)."""
    client = await make_client()
    fake_engine.script = ""
    whole = await (await client.post("/v1/responses", json=BASE)).json()
    r = await client.post("/v1/responses", json={**BASE, "stream": True})
    events, _ = parse_sse(await r.text())
    for e in events:
        validate("ResponseStreamEvent", e)
    final = events[-1]["response"]
    assert events[-1]["type"] == "response.completed"
    for got in (whole["output"], final["output"]):
        assert [(i["type"], i["content"][0]["text"]) for i in got] == [("message", "")]
    assert not [e for e in events if e["type"] == "response.output_text.delta"]
    assert [e["text"] for e in events if e["type"] == "response.output_text.done"] == [""]


async def test_a_call_output_without_its_call_is_refused(make_client: MakeClient) -> None:
    client = await make_client()
    for items in ([{"role": "user", "content": "hi"},
                   {"type": "function_call_output", "call_id": "call_nomatch", "output": "x"}],
                  [{"role": "user", "content": "hi"},
                   {"type": "function_call", "call_id": "c1", "name": "get_weather",
                    "arguments": "{}"},
                   {"type": "function_call_output", "call_id": "c2", "output": "x"}]):
        r = await client.post("/v1/responses", json={**BASE, "tools": [TOOL], "input": items})
        assert r.status == 400
        body = await r.json()
        validate("ErrorResponse", body)
        assert body["error"]["param"] == "input" and "messages" not in body["error"]["message"]


async def test_required_tool_choice_answers_a_function_call(make_client: MakeClient) -> None:
    client = await make_client()
    r = await client.post("/v1/responses", json={**BASE, "max_output_tokens": 64,
                                                 "tools": [TOOL], "tool_choice": "required"})
    body = await r.json()
    validate("Response", body)
    call = body["output"][0]
    assert call["type"] == "function_call" and call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == {"city": "x"}
    assert body["status"] == "completed"


async def test_a_forced_call_cut_before_it_began_has_no_output_whole_or_streamed(
        make_client: MakeClient) -> None:
    client = await make_client()
    long_name = {**TOOL, "name": "get_the_weather_" + "x" * 44}  # 16 tokens end inside it
    req = {**BASE, "max_output_tokens": 16, "tools": [long_name], "tool_choice": "required"}
    whole = await (await client.post("/v1/responses", json=req)).json()
    events, _ = parse_sse(await (await client.post("/v1/responses", json={
        **req, "stream": True})).text())
    streamed = events[-1]["response"]
    assert whole["status"] == streamed["status"] == "incomplete"
    assert whole["output"] == streamed["output"] == []
    validate("Response", whole)


async def test_required_tool_choice_streams_argument_events(make_client: MakeClient) -> None:
    client = await make_client()
    r = await client.post("/v1/responses", json={**BASE, "max_output_tokens": 64, "stream": True,
                                                 "tools": [TOOL], "tool_choice": {
                                                     "type": "function", "name": "get_weather"}})
    events, _ = parse_sse(await r.text())
    for e in events:
        validate("ResponseStreamEvent", e)
    done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    deltas = [e["delta"] for e in events
              if e["type"] == "response.function_call_arguments.delta"]
    assert "".join(deltas) == done["arguments"] and json.loads(done["arguments"]) == {"city": "x"}
    assert done["name"] == "get_weather"
    assert events[-1]["type"] == "response.completed"


async def test_bad_input_names_the_responses_param(make_client: MakeClient) -> None:
    client = await make_client()
    cases = [
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
         "input[0].content[0]"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tools": [TOOL], "tool_choice": {"type": "function", "name": "nope"}},
         "tool_choice.name"),
        ({"text": {"format": {"type": "json_schema"}}}, "text.format.schema"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"max_output_tokens": 10_000}, "max_output_tokens"),
        ({"input": "x" * 3000}, "input"),
        ({"max_output_tokens": "64"}, "max_output_tokens"),
        ({"text": {"format": {"type": "json_schema", "name": "a b", "schema": {}}}},
         "text.format.name"),
        ({"truncation": "foo"}, "truncation"),
        ({"truncation": "auto"}, "truncation"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
        ({"input": [{"role": "user", "content": "hi"}, {"type": "reasoning", "summary": "x"}]},
         "input[1].summary"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input"),
        ({"input": [{"type": "function_call", "call_id": "", "name": "f", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "", "output": "x"}]},
         "input[0].call_id"),
        # (OpenAI's bound on an output's call_id; the call's own has none)
        ({"input": [{"type": "function_call", "call_id": "c" * 65, "name": "f",
                     "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "c" * 65, "output": "x"}]},
         "input[1].call_id"),
    ]
    cases.append(({"service_tier": "premium"}, "service_tier"))  # (was let through)
    said = {}
    for extra, param in cases:
        r = await client.post("/v1/responses", json={**BASE, **extra})
        assert r.status == 400, extra
        body = await r.json()
        validate("ErrorResponse", body)
        assert body["error"]["param"] == param, (extra, body)
        # The text names what the caller sent, never the chat form's fields.
        message = body["error"]["message"]
        assert not any(n in message for n in ("max_completion_tokens", "messages",
                                                "response_format")), message
        said[str(extra)] = body["error"]
    # an unknown value is told as one; an item kind is named, not taken for a message
    assert said[str({"truncation": "foo"})]["code"] == "invalid_value"
    assert said[str({"truncation": "auto"})]["code"] == "unsupported_parameter"
    # a built-in tool is OpenAI's own: refused as such, by its kind (it was a type error)
    web = said[str({"tools": [{"type": "web_search"}]})]
    assert web["code"] == "unsupported_parameter" and "`web_search`" in web["message"]
    r = await client.post("/v1/responses", json={**BASE, "tools": [TOOL], "tool_choice": {
        "type": "allowed_tools", "mode": "auto", "tools": []}})
    err = (await r.json())["error"]
    assert r.status == 400 and (err["param"], err["code"]) == (
        "tool_choice.type", "unsupported_parameter")
    r = await client.post("/v1/chat/completions", json={
        "model": "fake-model", "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "custom", "custom": {"name": "grep"}}]})
    err = (await r.json())["error"]
    assert r.status == 400 and (err["param"], err["code"]) == (
        "tools[0].type", "unsupported_parameter")
    item = said[str({"input": [{"type": "item_reference", "id": "msg_1"}]})]["message"]
    assert "`item_reference` input items are not supported" in item and "'message'" not in item
    assert "only reasoning items" in said[str({"input": [
        {"type": "reasoning", "summary": []}]})]["message"]


async def test_a_message_too_long_is_named_as_instructions_or_input(
        make_client: MakeClient) -> None:
    """The chat form's first message holds the instructions: a limit on it names
    `instructions` (it named `input`, which the caller had kept short)."""
    client = await make_client(make_settings(plugins=[{"name": "sanitizer", "config": {
        "limits": {"max_message_chars": 100}}}]))
    for extra, param in [({"instructions": "x" * 200}, "instructions"),
                         ({"instructions": "be brief", "input": "x" * 200}, "input"),
                         ({"input": "x" * 200}, "input")]:
        r = await client.post("/v1/responses", json={**BASE, **extra})
        body = await r.json()
        assert r.status == 400 and body["error"]["param"] == param, (extra, body)


async def test_chat_completions_parameters_are_refused_not_ignored(
        make_client: MakeClient, fake_engine: FakeEngine) -> None:
    """A Chat Completions parameter sent to the Responses API was ignored: `max_tokens`
    left the answer uncapped, `response_format` unenforced. OpenAI answers 400 naming
    the Responses API's own parameter where there is one."""
    client = await make_client()
    for extra, moved in (({"max_tokens": 16}, "max_output_tokens"),
                         ({"max_completion_tokens": 16}, "max_output_tokens"),
                         ({"response_format": {"type": "json_object"}}, "text.format"),
                         ({"messages": [{"role": "user", "content": "hi"}]}, "input"),
                         ({"n": 2}, None), ({"logprobs": True}, None),
                         ({"reasoning_effort": "low"}, None),
                         ({"verbosity": "low"}, None),
                         ({"modalities": ["text", "audio"]}, None),
                         ({"web_search_options": {}}, None),
                         ({"prediction": {"type": "content", "content": "x"}}, None)):
        r = await client.post("/v1/responses", json={**BASE, **extra})
        assert r.status == 400, extra
        err = (await r.json())["error"]
        (name,) = extra
        assert (err["param"], err["code"]) == (name, "unsupported_parameter")
        if moved:
            assert f"moved to `{moved}`" in err["message"]
    assert fake_engine.calls == []
    # null asks for nothing (as clients that send every field send it)
    assert (await client.post("/v1/responses", json={**BASE, "max_tokens": None})).status == 200
    for tier in ("auto", "priority", "ultrafast", None):  # OpenAI's tiers: checked only
        r = await client.post("/v1/responses", json={**BASE, "service_tier": tier})
        assert r.status == 200, tier
    for text, status in (({"verbosity": "high"}, 400), ({"verbosity": "medium"}, 200)):
        r = await client.post("/v1/responses", json={**BASE, "text": text})
        assert r.status == status
    assert (await r.json())["object"] == "response"
    err = (await (await client.post("/v1/responses", json={
        **BASE, "text": {"verbosity": "low"}})).json())["error"]
    assert (err["param"], err["code"]) == ("text.verbosity", "unsupported_parameter")


async def test_the_chain_applies_rate_limit(make_client: MakeClient) -> None:
    settings = make_settings(plugins=[{"name": "rate_limit", "config": {
        "rules": [{"per": "key", "rpm": 1}]}}])
    client = await make_client(settings)
    assert (await client.post("/v1/responses", json=BASE)).status == 200
    r = await client.post("/v1/responses", json=BASE)
    assert r.status == 429
    validate("ErrorResponse", await r.json())


async def test_stored_in_the_caches_redis_and_shared_by_replicas(
        make_client: MakeClient, redis_server: RedisServer) -> None:
    settings = make_settings(plugins=[{"name": "cache", "config": {
        "redis": {"url": redis_server.url, "key_prefix": "east:"}, "l2": {"enabled": True}}}],
        responses={"ttl_s": 60})
    other = make_settings(plugins=[{"name": "cache", "config": {
        "redis": {"url": redis_server.url, "key_prefix": "west:"}, "l2": {"enabled": True}}}])
    one, two = await make_client(settings), await make_client(settings)
    elsewhere = await make_client(other)  # another deployment sharing the Redis
    body = await (await one.post("/v1/responses", json=BASE)).json()
    got = await two.get(f"/v1/responses/{body['id']}")  # another replica, same Redis
    assert got.status == 200 and (await got.json())["output"] == body["output"]
    assert (await elsewhere.get(f"/v1/responses/{body['id']}")).status == 404
    ttl = await _redis_ttl_ms(redis_server.url, body["id"])
    assert 0 < ttl <= 60_000
    assert (await two.delete(f"/v1/responses/{body['id']}")).status == 200
    assert (await one.get(f"/v1/responses/{body['id']}")).status == 404


async def _redis_ttl_ms(url: str, response_id: str) -> int:
    import redis.asyncio as aioredis

    r = aioredis.Redis.from_url(url)
    try:
        keys = [k async for k in r.scan_iter(match=f"east:responses:*:{response_id}")]
        assert len(keys) == 1
        return int(await r.pttl(keys[0]))
    finally:
        await r.aclose()


async def test_an_error_mid_stream_is_an_error_event_then_failed(
        make_client: MakeClient, fake_engine: FakeEngine) -> None:
    fake_engine.fail_after = 3
    client = await make_client()
    r = await client.post("/v1/responses", json={**BASE, "stream": True})
    assert r.status == 200
    body = await r.text()
    events, done = parse_sse(body)
    assert not done and check_event_names(body) == len(events)
    for e in events:
        validate("ResponseStreamEvent", e)
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    assert events[-1]["response"]["status"] == "failed"
    # the message under way ends incomplete, holding what went out, in the failed
    # response too (its content was empty, its status in_progress, with no `.done`)
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    done = [e for e in events if e["type"] == "response.output_item.done"]
    assert text and len(done) == 1 and done[0]["item"]["status"] == "incomplete"
    for item in (done[0]["item"], events[-1]["response"]["output"][0]):
        assert item["content"][0]["text"] == text and item["status"] == "incomplete"
    assert events[-1]["response"]["error"]["code"] == "server_error"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    # Kept as OpenAI keeps a failed response (`store` defaults to true), with what went
    # out before the failure; one with `store: false` is not.
    rid = events[-1]["response"]["id"]
    got = await client.get(f"/v1/responses/{rid}")
    assert got.status == 200 and await got.json() == events[-1]["response"]
    # Going on from it: what the failure cut (the message half written) is no turn.
    fake_engine.fail_after = None
    r = await client.post("/v1/responses", json={**BASE, "input": "again",
                                                 "previous_response_id": rid})
    assert r.status == 200
    seen = "".join(chr(i - 2) for i in fake_engine.calls[-1][0][1:])  # (its encoding)
    assert "hi" in seen and "again" in seen and text not in seen
    fake_engine.fail_after = 3
    r = await client.post("/v1/responses", json={**BASE, "stream": True, "store": False})
    events, _ = parse_sse(await r.text())
    assert events[-1]["type"] == "response.failed"
    rid = events[-1]["response"]["id"]
    assert (await client.get(f"/v1/responses/{rid}")).status == 404


async def test_a_stream_the_client_left_is_kept_as_it_stood(
        make_client: MakeClient, fake_engine: FakeEngine) -> None:
    """The client had the response's id (`response.created`) and left mid-answer: the
    response is kept `cancelled`, its message `incomplete` with the text generated by
    then, so the id retrieves it (it was a 404) and a next turn can build on it."""
    from proxy.openai_responses.events import saves_settled

    client = await make_client()
    fake_engine.delay = 0.02  # 64 tokens: over a second, and the client leaves at once
    r = await client.post("/v1/responses", json={**BASE, "stream": True,
                                                 "max_output_tokens": 64})
    head = await r.content.readuntil(b"response.output_text.delta")
    rid = json.loads(head.split(b"data: ", 1)[1].split(b"\n", 1)[0])["response"]["id"]
    r.close()
    await fake_engine.wait_until(lambda: not fake_engine.active)
    assert fake_engine.aborted  # the client's leaving cut the generation
    await saves_settled(5.0)  # kept by a task of its own
    got = await client.get(f"/v1/responses/{rid}")
    assert got.status == 200
    body = await got.json()
    validate("Response", body)
    assert body["status"] == "cancelled" and body["completed_at"] is None
    (item,) = body["output"]
    assert item["status"] == "incomplete" and item["content"][0]["text"]
    r = await client.post("/v1/responses", json={**BASE, "input": "go on",
                                                 "previous_response_id": rid})
    assert r.status == 200  # the cut message is no turn to build on; the question is
    seen = "".join(chr(i - 2) for i in fake_engine.calls[-1][0][1:])  # (its encoding)
    assert "hi" in seen and "go on" in seen and item["content"][0]["text"] not in seen


async def test_a_store_that_fails_with_the_stream_adds_no_second_failure(
        make_client: MakeClient, fake_engine: FakeEngine, monkeypatch: Any) -> None:
    """The engine fails mid-stream and the response store (Redis) is down too: the
    stream ends with the engine's one `error` and `response.failed`, not a second
    failure naming the store."""
    from proxy.errors import Unavailable
    from proxy.openai_responses import routes

    fake_engine.fail_after = 3
    client = await make_client()

    async def put(self: Any, *a: Any, **k: Any) -> None:
        raise Unavailable("The response store is unreachable.")

    monkeypatch.setattr(type(client.app[routes.STORE]), "put", put)
    events, _ = parse_sse(await (await client.post("/v1/responses", json={
        **BASE, "stream": True})).text())
    types = [e["type"] for e in events]
    assert types.count("error") == 1 and types[-2:] == ["error", "response.failed"]
    assert "store" not in events[-1]["response"]["error"]["message"]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_store_that_fails_does_not_fail_the_answer(
        make_client: MakeClient, monkeypatch: Any, stream: bool) -> None:
    """The answer was generated: it goes out, as chat's does, saying it was not stored
    (`store: false`), and nothing is found under its id."""
    from proxy.errors import Unavailable
    from proxy.openai_responses import routes

    client = await make_client()

    async def put(self: Any, *a: Any, **k: Any) -> None:
        raise Unavailable("The response store is unreachable.", code="store_unavailable")

    monkeypatch.setattr(type(client.app[routes.STORE]), "put", put)
    r = await client.post("/v1/responses", json={**BASE, "stream": stream})
    assert r.status == 200
    if stream:
        events, _ = parse_sse(await r.text())
        assert events[-1]["type"] == "response.incomplete"  # (BASE's max_output_tokens)
        response = events[-1]["response"]
    else:
        response = await r.json()
    validate("Response", response)
    assert response["status"] == "incomplete" and response["store"] is False
    assert response["output"][0]["content"][0]["text"]
    monkeypatch.undo()
    assert (await client.get(f"/v1/responses/{response['id']}")).status == 404


async def test_an_id_of_any_length_is_quoted_short(make_client: MakeClient) -> None:
    """An id is the caller's text: a 404 (or a chain's 400) quotes at most 80 characters
    of it, as the stored chat routes do."""
    client = await make_client()
    long = "resp_" + "a" * 5000
    for r in (await client.get(f"/v1/responses/{long}"),
              await client.delete(f"/v1/responses/{long}"),
              await client.post("/v1/responses", json={**BASE, "previous_response_id": long})):
        assert r.status in (400, 404)
        message = (await r.json())["error"]["message"]
        assert len(message) < 200 and "aaa..." in message


async def test_an_error_before_any_output_keeps_its_http_status(
        make_client: MakeClient, fake_engine: FakeEngine) -> None:
    fake_engine.fail_after = 0
    client = await make_client()
    r = await client.post("/v1/responses", json={**BASE, "stream": True})
    assert r.status == 502
    validate("ErrorResponse", await r.json())


async def test_tokens_are_counted_in_metrics(make_client: MakeClient) -> None:
    client = await make_client()

    async def completion_tokens() -> float:
        text = await (await client.get("/metrics")).text()
        line = next((ln for ln in text.splitlines() if ln.startswith("weir_tokens_total{")
                     and 'kind="completion"' in ln), None)
        return float(line.rsplit(" ", 1)[1]) if line else 0.0

    before = await completion_tokens()
    await client.post("/v1/responses", json=BASE)
    r = await client.post("/v1/responses", json={**BASE, "stream": True})
    await r.text()
    assert await completion_tokens() == before + 32


async def test_text_then_a_parsed_call_are_two_output_items(make_client: MakeClient) -> None:
    engine = FakeEngine(tool_parser=True)
    engine.script = 'Checking. <call>{"name": "get_weather", "arguments": {"city": "Rome"}}</call>'
    client = await make_client(engine=engine)
    whole = await (await client.post("/v1/responses", json={**BASE, "tools": [TOOL],
                                                            "max_output_tokens": 64})).json()
    validate("Response", whole)
    assert [i["type"] for i in whole["output"]] == ["message", "function_call"]
    r = await client.post("/v1/responses", json={**BASE, "tools": [TOOL], "stream": True,
                                                 "max_output_tokens": 64})
    events, _ = parse_sse(await r.text())
    for e in events:
        validate("ResponseStreamEvent", e)
    added = [e["item"]["type"] for e in events if e["type"] == "response.output_item.added"]
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert added == ["message", "function_call"] and len(done) == 2
    assert done[0]["content"][0]["text"].strip() == "Checking."
    assert json.loads(done[1]["arguments"]) == {"city": "Rome"}
    assert events[-1]["type"] == "response.completed"
    assert [i["type"] for i in events[-1]["response"]["output"]] == ["message", "function_call"]


async def test_a_streamed_cache_hit_goes_out_in_one_write(make_client: MakeClient,
                                                           fake_engine: FakeEngine,
                                                           monkeypatch: Any) -> None:
    """A cached answer replayed as Response events is a whole stream (one write, as on
    the chat route); an engine's answer streams event by event. Both the same answer."""
    from proxy.openai_responses import routes

    wholes: list[bool] = []
    write_sse = routes.write_sse

    async def recording(request: Any, stream: Any, *args: Any, **kwargs: Any) -> Any:
        wholes.append(stream.whole)
        return await write_sse(request, stream, *args, **kwargs)

    monkeypatch.setattr(routes, "write_sse", recording)
    client = await make_client(make_settings(plugins=[{"name": "cache", "config": {
        "semantic": {"enabled": False}, "store_truncated": True}}]))
    req = {**BASE, "stream": True, "temperature": 0, "store": False}  # (cut at 16 tokens)
    runs = []
    for _ in range(2):
        r = await client.post("/v1/responses", json=req)
        assert r.status == 200
        body = await r.text()
        events, _ = parse_sse(body)
        assert check_event_names(body) == len(events)
        for e in events:
            validate("ResponseStreamEvent", e)
        runs.append(events)
    assert wholes == [False, True] and len(fake_engine.calls) == 1
    # (the replay's text is one delta; the engine's came token by token)
    assert [e["type"] for e in runs[1]][-3:] == [e["type"] for e in runs[0]][-3:]
    texts = [run[-1]["response"]["output"][0]["content"][0]["text"] for run in runs]
    assert texts[0] == texts[1] != ""


async def test_a_stream_times_its_first_token_and_its_gaps(make_client: MakeClient) -> None:
    """Responses streams feed the time-to-first-token and inter-token histograms (route
    `responses`), as chat streams do."""
    from proxy.app_state import STATE

    client = await make_client()
    r = await client.post("/v1/responses", json={**BASE, "stream": True})
    events, _ = parse_sse(await r.text())
    deltas = sum(e["type"] == "response.output_text.delta" for e in events)
    reg = client.app[STATE].metrics.registry
    labels = {"route": "responses", "model": "fake-model"}
    assert reg.get_sample_value("weir_time_to_first_token_seconds_count", labels) == 1
    assert reg.get_sample_value("weir_inter_token_latency_seconds_count", labels) == deltas - 1


async def test_stream_options_need_a_stream(make_client: MakeClient) -> None:
    client = await make_client()
    for options in ({"include_obfuscation": False}, {}):
        r = await client.post("/v1/responses", json={**BASE, "stream_options": options})
        assert r.status == 400
        body = await r.json()
        validate("ErrorResponse", body)
        assert body["error"]["param"] == "stream_options"
    bad = await client.post("/v1/responses", json={
        **BASE, "stream": True, "stream_options": {"include_obfuscation": "no"}})
    assert bad.status == 400 and (await bad.json())["error"]["code"] == "invalid_type"
    r = await client.post("/v1/responses", json={
        **BASE, "stream": True, "stream_options": {"include_obfuscation": False}})
    events, _ = parse_sse(await r.text())
    assert r.status == 200 and events[-1]["type"] in ("response.completed", "response.incomplete")


async def test_a_card_split_around_a_reply_is_redacted_in_the_stored_items(
        make_client: MakeClient, fake_engine: FakeEngine) -> None:
    """"my card is 4111 1111" / (assistant) "go on" / "1111 1111": the chain joins one
    speaker's turns across the other's and redacts the card; the stored input items
    were screened without the speakers and kept it in clear."""
    settings = make_settings(plugins=[
        {"name": "sanitizer", "config": {"detectors": {"card": "redact"}}}])
    client = await make_client(settings)
    for history in ([], [{"role": "user", "content": "card 4111 1111"},
                         {"role": "assistant", "content": "go on"}]):
        first = [] if history else [{"role": "user", "content": "my card is 4111 1111"},
                                    {"role": "assistant", "content": "go on"}]
        if history:  # the first half in a stored conversation, the rest in the input
            r = await client.post("/v1/responses", json={**BASE, "input": history[:1]})
            prev = {"previous_response_id": (await r.json())["id"]}
        else:
            prev = {}
        r = await client.post("/v1/responses", json={
            **BASE, **prev, "input": [*first, {"role": "user", "content": "1111 1111 ok"}]})
        assert r.status == 200, await r.text()
        rid = (await r.json())["id"]
        got = await (await client.get(f"/v1/responses/{rid}/input_items")).text()
        assert "[CARD]" in got and "1111 1111" not in got, got
    assert "1111 1111" not in str(fake_engine.calls[0])


async def test_a_stored_response_keeps_what_the_sanitizer_redacted(
        make_client: MakeClient, redis_server: RedisServer, fake_engine: FakeEngine) -> None:
    """With `redact`, the engine got "[EMAIL]", but the stored Response (the cache's
    Redis, for a week) kept the address: in `instructions`, in `input_items`, and in the
    conversation a follow-up builds on (a stored chat completion keeps the redacted
    messages). Stored and echoed as the sanitizer passed them on."""
    import redis.asyncio as aioredis

    settings = make_settings(plugins=[
        {"name": "sanitizer", "config": {"detectors": {"email": "redact", "card": "redact"}}},
        {"name": "cache", "config": {"redis": {"url": redis_server.url,
                                               "key_prefix": "screen:"},
                                     "l2": {"enabled": True}}}])
    client = await make_client(settings)
    mail = "leak.check@example.com"
    call = {"type": "function_call", "call_id": "c1", "name": "get_weather",
            "arguments": json.dumps({"to": mail})}
    for stream in (False, True):
        r = await client.post("/v1/responses", json={
            **BASE, "stream": stream, "instructions": f"Reply to {mail}.", "tools": [
                {**TOOL, "description": f"Weather, mailed to {mail}"}],
            "input": [{"role": "user", "content": "my card is 4111 1111"},
                      {"role": "user", "content": "1111 1111, thanks"},  # split over two
                      {"role": "user", "content": [{"type": "input_text",
                                                     "text": f"write to {mail}"}]},
                      call, {"type": "function_call_output", "call_id": "c1",
                             "output": f"sent to {mail}"}]})
        text = await r.text()
        assert r.status == 200 and mail not in text, text
        rid = (parse_sse(text)[0][-1]["response"] if stream else json.loads(text))["id"]
        for path in (f"/v1/responses/{rid}", f"/v1/responses/{rid}/input_items"):
            got = await (await client.get(path)).text()
            assert "[EMAIL]" in got and mail not in got, got
            assert "1111 1111" not in got and "4111 1111" not in got, got
        follow = await client.post("/v1/responses", json={
            **BASE, "previous_response_id": rid, "input": "and then?"})
        assert follow.status == 200
    assert fake_engine.calls and mail not in str(fake_engine.calls)
    assert "1111 1111" not in str(fake_engine.calls)  # (ids are hex: no spaced groups)
    # read as the chain reads them: a card split between the instructions and the input,
    # or between a message and a call's output with the call between; an address in a
    # call's arguments written with a JSON escape
    escaped = json.dumps({"to": mail}).replace("@", "\\u0040")
    split = [{"role": "user", "content": "hi"},
             {"role": "assistant", "content": "mail leak.ch"}, call,
             {"role": "assistant", "content": "eck@example.com ok"},
             {"type": "function_call_output", "call_id": "c1", "output": "done"}]
    for extra in ({"instructions": "card 4111 1111", "input": "1111 1111 thanks"},
                  {"input": split},  # assistant text around a call: one turn
                  {"input": [{"role": "user", "content": "card 4111 1111"},
                             {**call, "arguments": escaped},
                             {"type": "function_call_output", "call_id": "c1",
                              "output": "1111 1111 charged"}]}):
        rid = (await (await client.post("/v1/responses", json={**BASE, **extra})).json())["id"]
        for path in (f"/v1/responses/{rid}", f"/v1/responses/{rid}/input_items"):
            got = await (await client.get(path)).text()
            assert "1111 1111" not in got and "4111 1111" not in got, got
            assert "u0040" not in got and "leak.ch" not in got, got
    r = aioredis.from_url(redis_server.url)
    try:
        keys = [k async for k in r.scan_iter("screen:*")]
        assert keys
        for k in keys:
            if await r.type(k) == b"string":
                value = await r.get(k) or b""
                assert mail.encode() not in value and b"1111 1111" not in value, k
    finally:
        await r.aclose()


async def test_reasoning_items_are_stored_as_the_sanitizer_redacts(
        make_client: MakeClient, fake_engine: FakeEngine) -> None:
    """No prompt holds a reasoning item, so the chain never read one: its summary and
    content went to the store and `input_items` in clear beside a redacted message."""
    settings = make_settings(plugins=[
        {"name": "sanitizer", "config": {"detectors": {"email": "redact", "card": "redact"}}}])
    client = await make_client(settings)
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [
        {"type": "summary_text", "text": "card 4111 1111 1111 1111"},
        {"type": "summary_text", "text": "nothing here"}],
        "content": [{"type": "reasoning_text", "text": "mail bob@example.com"}]}
    r = await client.post("/v1/responses", json={**BASE, "input": [
        reasoning, {"role": "user", "content": "mail bob@example.com"}]})
    assert r.status == 200
    rid = (await r.json())["id"]
    listed = await (await client.get(f"/v1/responses/{rid}/input_items")).json()
    validate("ResponseItemList", listed)
    got = next(it for it in listed["data"] if it["type"] == "reasoning")
    assert [p["text"] for p in got["summary"]] == ["card [CARD]", "nothing here"]
    assert [p["text"] for p in got["content"]] == ["mail [EMAIL]"]
    assert "bob@example.com" not in json.dumps(listed)


async def test_reasoning_items_are_redacted_when_nothing_in_the_prompt_is(
        make_client: MakeClient) -> None:
    """Reasoning items were screened only beside a prompt the sanitizer had redacted:
    with a clean message, a card in a reasoning item was stored and listed in clear."""
    settings = make_settings(plugins=[
        {"name": "sanitizer", "config": {"detectors": {"email": "redact", "card": "redact"}}}])
    client = await make_client(settings)
    reasoning = {"type": "reasoning", "summary": [
        {"type": "summary_text", "text": "card 4111 1111 1111 1111"}],
        "content": [{"type": "reasoning_text", "text": "mail bob@example.com"}]}
    for stream in (False, True):
        r = await client.post("/v1/responses", json={**BASE, "stream": stream, "input": [
            reasoning, {"role": "user", "content": "hello"}]})
        assert r.status == 200
        rid = (await r.json())["id"] if not stream else parse_sse(
            await r.text())[0][0]["response"]["id"]
        listed = await (await client.get(f"/v1/responses/{rid}/input_items")).json()
        got = next(it for it in listed["data"] if it["type"] == "reasoning")
        assert [p["text"] for p in got["summary"]] == ["card [CARD]"]
        assert [p["text"] for p in got["content"]] == ["mail [EMAIL]"]
        user = next(it for it in listed["data"] if it["type"] == "message")
        assert user["content"][0]["text"] == "hello"


@pytest.mark.parametrize("path", ["whole", "stream", "replayed", "background"])
@pytest.mark.parametrize("name", ["f", "f" * 48])  # (cut mid-arguments; before them)
async def test_a_call_cut_mid_arguments_is_no_turn_a_follow_up_owes_an_output(
        make_client: MakeClient, path: str, name: str) -> None:
    """Cut at `max_output_tokens` inside a forced call's arguments (or before they began:
    `arguments: ""`), the response is `incomplete` with that call `incomplete`: going on
    from it asked for the call's output ("No tool output found"), which no one can give
    to half-written arguments. So whether it was streamed, replayed by the cache or run
    in the background."""
    settings = make_settings(plugins=[{"name": "cache", "config": {
        "semantic": {"enabled": False}, "store_truncated": True}}])
    client = await make_client(settings if path == "replayed" else None)
    names = [f"p{i}" for i in range(12)]  # arguments longer than 16 tokens
    tool = {"type": "function", "name": name, "parameters": {
        "type": "object", "properties": {n: {"type": "string"} for n in names},
        "required": names}}
    ask = {**BASE, "input": "x", "tools": [tool], "tool_choice": "required",
           "max_output_tokens": 16, "temperature": 0, "stream": path != "whole",
           "background": path == "background"}
    for _ in range(2 if path == "replayed" else 1):  # (the second is the cache's)
        r = await client.post("/v1/responses", json=ask)
        if path == "whole":
            cut = await r.json()
        else:
            cut = parse_sse(await r.text())[0][-1]["response"]
    assert path != "replayed" or r.headers["x-weir-cache"] == "exact"
    assert cut["status"] == "incomplete"
    assert [(o["type"], o["status"]) for o in cut["output"]] == [
        ("function_call", "incomplete")]
    assert (cut["output"][0]["arguments"] == "") == (name != "f")
    r = await client.post("/v1/responses", json={
        **BASE, "input": "go on", "previous_response_id": cut["id"]})
    assert r.status == 200, await r.text()


async def test_an_output_for_a_call_the_token_limit_cut_is_told_so(
        make_client: MakeClient) -> None:
    """An agent loop answers every `function_call` of a response, the one cut at
    `max_output_tokens` too (its `status` is `incomplete`). That call is no turn to build
    on, so its output is refused, but the 400 named no call and said none was found in
    the earlier responses, where the client sees it: it names the call and says why."""
    client = await make_client()
    names = [f"p{i}" for i in range(12)]  # arguments longer than 16 tokens
    tool = {"type": "function", "name": "f", "parameters": {
        "type": "object", "properties": {n: {"type": "string"} for n in names},
        "required": names}}
    r = await client.post("/v1/responses", json={
        **BASE, "input": "x", "tools": [tool], "tool_choice": "required",
        "max_output_tokens": 16, "temperature": 0})
    cut = await r.json()
    assert [(o["type"], o["status"]) for o in cut["output"]] == [
        ("function_call", "incomplete")]
    call_id = cut["output"][0]["call_id"]
    r = await client.post("/v1/responses", json={
        **BASE, "previous_response_id": cut["id"], "tools": [tool],
        "input": [{"type": "function_call_output", "call_id": call_id, "output": "{}"}]})
    assert r.status == 400, await r.text()
    error = (await r.json())["error"]
    assert error["param"] == "input" and error["code"] == "invalid_value"
    assert call_id in error["message"] and "max_output_tokens" in error["message"]


async def _ended(client: Any, rid: str) -> dict[str, Any]:
    """Background response `rid` once its run stored its end."""
    import asyncio

    from proxy.openai_responses.routes import RUNNER

    run = client.app[RUNNER].find("public", rid)
    if run is not None and run.task is not None:
        await asyncio.wait_for(asyncio.shield(run.task), 10)
    got = await client.get(f"/v1/responses/{rid}")
    assert got.status == 200, await got.text()
    response: dict[str, Any] = await got.json()
    return response


async def test_an_output_for_a_call_cut_two_responses_back_is_told_so(
        make_client: MakeClient) -> None:
    """A response cut its call at `max_output_tokens`; the next went on from it with a
    message; the one after sends an output for the cut call. The 400 said no call was
    found (only the previous response's cut calls were known): every earlier response's
    are, background or not, and the 400 names the call and says it was cut."""
    client = await make_client()
    names = [f"p{i}" for i in range(12)]  # arguments longer than 16 tokens
    tool = {"type": "function", "name": "f", "parameters": {
        "type": "object", "properties": {n: {"type": "string"} for n in names},
        "required": names}}
    r = await client.post("/v1/responses", json={
        **BASE, "input": "x", "tools": [tool], "tool_choice": "required",
        "max_output_tokens": 16, "temperature": 0})
    cut = await r.json()
    assert [(o["type"], o["status"]) for o in cut["output"]] == [
        ("function_call", "incomplete")]
    call_id = cut["output"][0]["call_id"]
    previous = cut["id"]
    for background in (False, True, False):  # (a background one's records keep it too)
        r = await client.post("/v1/responses", json={
            **BASE, "previous_response_id": previous, "input": "go on",
            "max_output_tokens": 16, "background": background})
        assert r.status == 200, await r.text()
        previous = (await r.json())["id"]
        if background:
            previous = (await _ended(client, previous))["id"]
    r = await client.post("/v1/responses", json={
        **BASE, "previous_response_id": previous, "tools": [tool],
        "input": [{"type": "function_call_output", "call_id": call_id, "output": "{}"}]})
    assert r.status == 400, await r.text()
    error = (await r.json())["error"]
    validate("ErrorResponse", {"error": error})
    assert error["param"] == "input" and error["code"] == "invalid_value"
    assert call_id in error["message"] and "was cut" in error["message"]


async def test_what_vllm_s_responses_api_takes_besides_openai_s_reaches_the_engine(
        make_client: MakeClient, fake_engine: FakeEngine) -> None:
    """vLLM's Responses API takes `seed`, `stop`, the penalties, `logit_bias` and its
    token extensions: they were accepted and dropped (or refused as Chat Completions'
    names). They go into the chat request the answer comes from, under chat's rules:
    honoured, or refused by name where the in-process engine cannot honour them."""
    client = await make_client()
    r = await client.post("/v1/responses", json={
        **BASE, "seed": 7, "stop": ["zz"], "presence_penalty": 0.5, "frequency_penalty": 0.25,
        "logit_bias": {"5": 1}, "stop_token_ids": [99], "include_stop_str_in_output": True,
        "ignore_eos": True, "skip_special_tokens": False, "request_id": "mine"})
    assert r.status == 200, await r.text()
    o = fake_engine.calls[-1][1]
    assert (o.seed, o.stop, o.presence_penalty, o.frequency_penalty) == (7, ["zz"], 0.5, 0.25)
    assert o.logit_bias == {5: 1.0} and o.stop_token_ids == [99]
    assert o.include_stop_str_in_output and o.ignore_eos and not o.skip_special_tokens
    for extra, param in (({"structured_outputs": {"regex": "a+"}}, "structured_outputs"),
                         ({"priority": 3}, "priority"),
                         ({"enable_response_messages": True}, "enable_response_messages"),
                         ({"stop_token_ids": [-1]}, "stop_token_ids[0]")):
        r = await client.post("/v1/responses", json={**BASE, **extra})
        assert r.status == 400, extra
        body = await r.json()
        validate("ErrorResponse", body)
        assert body["error"]["param"] == param, body


@pytest.mark.parametrize("where", ["memory", "redis"])
async def test_a_response_streaming_is_retrievable_in_progress(
        make_client: MakeClient, fake_engine: FakeEngine, where: str,
        request: pytest.FixtureRequest) -> None:
    """Its id went out with `response.created`, but a GET (or a cancel) while it streamed
    was a 404: OpenAI keeps a stored response `in_progress` while it generates. A cancel
    is still a 400 (not a background response); a follow-up on it is refused until it
    ends; once it ended, the GET gives the final response."""
    settings = None
    if where == "redis":
        url = request.getfixturevalue("redis_server").url
        settings = make_settings(plugins=[{"name": "cache", "config": {
            "redis": {"url": url, "key_prefix": "prog:"}, "l2": {"enabled": True}}}])
    client = await make_client(settings)
    fake_engine.delay = 0.02
    r = await client.post("/v1/responses", json={**BASE, "stream": True,
                                                 "max_output_tokens": 64})
    head = await r.content.readuntil(b"response.output_text.delta")
    rid = json.loads(head.split(b"data: ", 1)[1].split(b"\n", 1)[0])["response"]["id"]
    got = await client.get(f"/v1/responses/{rid}")
    assert got.status == 200
    body = await got.json()
    validate("Response", body)
    assert body["status"] == "in_progress" and body["id"] == rid
    items = await client.get(f"/v1/responses/{rid}/input_items")
    assert items.status == 200 and (await items.json())["data"][0]["content"][0]["text"] == "hi"
    cancel = await client.post(f"/v1/responses/{rid}/cancel")
    assert cancel.status == 400
    err = (await cancel.json())["error"]
    assert "background" in err["message"] and "not in progress" not in err["message"]
    follow = await client.post("/v1/responses", json={**BASE, "previous_response_id": rid})
    assert follow.status == 400
    assert (await follow.json())["error"]["param"] == "previous_response_id"
    events, _ = parse_sse(head.decode().rsplit("\n", 1)[0] + (await r.text()))
    final = events[-1]["response"]
    assert final["status"] == "incomplete"
    assert await (await client.get(f"/v1/responses/{rid}")).json() == final
    # deleted while it streamed, it is not brought back by its end
    r = await client.post("/v1/responses", json={**BASE, "stream": True,
                                                 "max_output_tokens": 64})
    head = await r.content.readuntil(b"response.output_text.delta")
    rid = json.loads(head.split(b"data: ", 1)[1].split(b"\n", 1)[0])["response"]["id"]
    assert (await client.delete(f"/v1/responses/{rid}")).status == 200
    await r.text()
    assert (await client.get(f"/v1/responses/{rid}")).status == 404


@pytest.mark.parametrize("stream", [False, True])
async def test_caller_fields_are_echoed_as_the_response_schema_has_them(
        make_client: MakeClient, stream: bool) -> None:
    """`prompt_cache_key`, `safety_identifier` and `prompt_cache_retention` were taken and
    left out of the Response; `service_tier` too (the tier that served it: one engine
    serves every request alike, `default`)."""
    client = await make_client()
    given = {"prompt_cache_key": "pk-1", "safety_identifier": "sid-1",
             "prompt_cache_retention": "24h", "service_tier": "flex"}
    for extra, want in ((given, {**given, "service_tier": "default"}),
                        ({}, {"prompt_cache_key": None, "safety_identifier": None,
                              "prompt_cache_retention": None, "service_tier": "default"})):
        r = await client.post("/v1/responses", json={**BASE, **extra, "stream": stream})
        body = parse_sse(await r.text())[0][-1]["response"] if stream else await r.json()
        validate("Response", body)
        assert {k: body.get(k, "absent") for k in want} == want
        stored = await (await client.get(f"/v1/responses/{body['id']}")).json()
        assert {k: stored.get(k, "absent") for k in want} == want


async def test_caller_text_the_response_keeps_is_screened(make_client: MakeClient) -> None:
    """`metadata` (and `user`, `safety_identifier`, `prompt_cache_key`), stored and echoed
    with the Response, were kept as sent while the sanitizer redacted the same address in
    the input: screened as the input is, whether or not the input held anything."""
    settings = make_settings(plugins=[
        {"name": "sanitizer", "config": {"detectors": {"email": "redact", "card": "redact"}}}])
    client = await make_client(settings)
    mail = "leak.check@example.com"
    given = {"metadata": {"contact": mail, "card": "4111 1111 1111 1111", "plain": "ok"},
             "user": mail, "safety_identifier": mail, "prompt_cache_key": mail}
    for stream in (False, True):
        for text in ("hello", f"write to {mail}"):
            r = await client.post("/v1/responses", json={
                **BASE, **given, "input": text, "stream": stream})
            raw = await r.text()
            assert r.status == 200 and mail not in raw and "4111" not in raw, raw
            body = parse_sse(raw)[0][-1]["response"] if stream else json.loads(raw)
            assert body["metadata"] == {"contact": "[EMAIL]", "card": "[CARD]", "plain": "ok"}
            assert body["user"] == body["safety_identifier"] == "[EMAIL]"
            got = await (await client.get(f"/v1/responses/{body['id']}")).text()
            assert mail not in got and "4111" not in got, got


@pytest.mark.parametrize("cut", [False, True])
async def test_text_after_a_call_is_in_the_same_order_whole_and_streamed(
        make_client: MakeClient, cut: bool) -> None:
    """Text the model wrote after its call: the stream sends [call, message] (and, cut in
    that text, the message `incomplete`), the whole answer said [message, call] with the
    whole call `incomplete`, which the stored turn then dropped. Both in the order the
    model wrote them."""
    engine = FakeEngine(tool_parser=True)
    engine.script = ('Checking. <call>{"name": "get_weather", "arguments": {"city": "Rome"}}'
                     '</call> and then some words after the call')
    client = await make_client(engine=engine)
    limit = (engine.script.index("</call>") + 16) // 4 if cut else 200  # (4 chars a token)
    shapes = []
    for stream in (False, True):
        r = await client.post("/v1/responses", json={**BASE, "tools": [TOOL], "stream": stream,
                                                     "max_output_tokens": limit})
        body = parse_sse(await r.text())[0][-1]["response"] if stream else await r.json()
        validate("Response", body)
        shapes.append([(it["type"], it["status"], it.get("arguments") or it["content"][0]["text"])
                       for it in body["output"]])
    assert shapes[0] == shapes[1]
    assert [s[:2] for s in shapes[0]] == [
        ("message", "completed"), ("function_call", "completed"),
        ("message", "incomplete" if cut else "completed")]


async def test_a_text_format_s_prose_is_kept_as_the_sanitizer_redacted_it(
        make_client: MakeClient) -> None:
    """The sanitizer redacted `text.format`'s description and its schema's prose in what
    the engine got, but the stored and echoed Response kept them as sent (its tools'
    were kept redacted)."""
    settings = make_settings(plugins=[
        {"name": "sanitizer", "config": {"detectors": {"email": "redact", "card": "redact"}}}])
    client = await make_client(settings)
    mail = "leak.check@example.com"
    fmt = {"type": "json_schema", "name": "p", "description": f"for {mail}", "schema": {
        "type": "object", "description": f"to {mail}",
        "properties": {"a": {"type": "integer", "description": mail}}}}
    for stream in (False, True):
        r = await client.post("/v1/responses", json={
            **BASE, "input": f"json for {mail}", "text": {"format": fmt}, "stream": stream})
        raw = await r.text()
        assert r.status == 200 and mail not in raw, raw
        body = parse_sse(raw)[0][-1]["response"] if stream else json.loads(raw)
        assert body["text"]["format"]["description"] == "for [EMAIL]"
        assert body["text"]["format"]["schema"]["properties"]["a"]["description"] == "[EMAIL]"
        assert mail not in await (await client.get(f"/v1/responses/{body['id']}")).text()


@pytest.mark.parametrize("error", ["unavailable", "too_large"])
async def test_a_stream_whose_end_is_not_stored_leaves_no_record_in_progress(
        make_client: MakeClient, monkeypatch: Any, error: str) -> None:
    """Its `in_progress` record was put as it started; its end's write failed (a Redis
    blip, or the output took the record past the tenant's bound): the response said
    `store: false`, but a GET still found it `in_progress` (and a follow-up on it was
    refused as still in progress) until it expired."""
    from proxy.errors import RecordTooLarge, Unavailable
    from proxy.openai_responses import routes

    client = await make_client()

    async def replace(self: Any, *a: Any, **k: Any) -> bool:
        if error == "too_large":
            raise RecordTooLarge("Too large.", param="store", code="stored_record_too_large")
        raise Unavailable("The response store is unreachable.", code="store_unavailable")

    monkeypatch.setattr(type(client.app[routes.STORE]), "replace", replace)
    events, _ = parse_sse(await (await client.post("/v1/responses", json={
        **BASE, "stream": True})).text())
    response = events[-1]["response"]
    assert response["store"] is False
    monkeypatch.undo()
    assert (await client.get(f"/v1/responses/{response['id']}")).status == 404


async def test_a_stream_does_not_wait_for_its_in_progress_record(
        make_client: MakeClient) -> None:
    """The `in_progress` record was written before `response.created` went out: a frozen
    Redis held the stream's first event for the store's timeout. It is written beside
    the stream now; a GET here waits for that write (it finds the response), and the
    final record is put after it."""
    import asyncio

    from proxy.app_state import STATE
    from proxy.openai_responses.routes import STORE

    client = await make_client()
    store = client.app[STORE]
    real, gate = store.put, asyncio.Event()

    async def slow_hold(*args: Any, **kw: Any) -> None:
        if args[2]["response"]["status"] == "in_progress":
            await gate.wait()  # (a frozen store)
        await real(*args, **kw)

    store.put = slow_hold  # type: ignore[method-assign]
    try:
        async def head() -> tuple[Any, bytes]:
            r = await client.post("/v1/responses", json={**BASE, "stream": True})
            return r, await r.content.readuntil(b"response.in_progress")

        # (a guard, not a timing: without the fix this waits for the gate for ever)
        r, first = await asyncio.wait_for(head(), timeout=30)
        rid = json.loads(first.split(b"data: ", 1)[1].split(b"\n", 1)[0])["response"]["id"]
        # The store thaws once the GET is in its handler (it authenticates first): the
        # GET finds the record only by waiting for the write under way.
        auth = client.app[STATE].auth
        authenticate = auth.authenticate

        def thawing(headers: Any) -> Any:
            gate.set()
            return authenticate(headers)

        auth.authenticate = thawing  # type: ignore[method-assign]
        found = await client.get(f"/v1/responses/{rid}")
        auth.authenticate = authenticate  # type: ignore[method-assign]
        assert found.status == 200 and (await found.json())["id"] == rid
        events, _ = parse_sse(first.decode() + (await r.text()))
        assert await (await client.get(f"/v1/responses/{rid}")).json() == events[-1]["response"]
    finally:
        gate.set()


async def test_an_in_progress_record_that_lands_late_does_not_overwrite_the_final(
        make_client: MakeClient) -> None:
    """An `in_progress` write that timed out may still run in Redis after the final
    record's: it is put only where no record is held, so the final one stands."""
    from proxy.errors import Unavailable
    from proxy.openai_responses.routes import STORE

    client = await make_client()
    store = client.app[STORE]
    real = store.put
    late: list[tuple[Any, Any]] = []

    async def timing_out(*args: Any, **kw: Any) -> None:
        if args[2]["response"]["status"] == "in_progress":
            late.append((args, kw))  # on its way still: it lands later
            raise Unavailable("The response store is unavailable; retry shortly.",
                              code="store_unavailable")
        await real(*args, **kw)

    store.put = timing_out  # type: ignore[method-assign]
    r = await client.post("/v1/responses", json={**BASE, "stream": True})
    events, _ = parse_sse(await r.text())
    final = events[-1]["response"]
    assert final["store"] is True and late
    for args, kw in late:
        await real(*args, **kw)
    assert await (await client.get(f"/v1/responses/{final['id']}")).json() == final


@pytest.mark.parametrize("miss_streams", [False, True])
async def test_a_cached_answer_keeps_its_text_and_calls_in_their_order(
        make_client: MakeClient, miss_streams: bool) -> None:
    """An answer with text on both sides of a call, from the cache (whole and streamed,
    stored from a whole miss and from a streamed one): the items in the order the model
    wrote them, as the miss gave them (a hit listed the text first, its order not kept)."""
    engine = FakeEngine(tool_parser=True)
    engine.script = ('Checking. <call>{"name": "get_weather", "arguments": {"city": "Rome"}}'
                     '</call> and then some words after the call')
    settings = make_settings(plugins=[{"name": "cache", "config": {
        "semantic": {"enabled": False}}}])
    client = await make_client(settings, engine=engine)
    ask = {**BASE, "tools": [TOOL], "temperature": 0, "max_output_tokens": 200}

    async def items(stream: bool) -> tuple[list[Any], str | None]:
        r = await client.post("/v1/responses", json={**ask, "stream": stream})
        body = parse_sse(await r.text())[0][-1]["response"] if stream else await r.json()
        validate("Response", body)
        return [(it["type"], it.get("arguments") or it["content"][0]["text"])
                for it in body["output"]], r.headers.get("x-weir-cache")

    miss, layer = await items(miss_streams)
    assert layer == "miss" and [t for t, _ in miss] == ["message", "function_call", "message"]
    for stream in (False, True):
        assert await items(stream) == (miss, "exact"), stream
    assert len(engine.calls) == 1


async def test_an_answer_of_dropped_calls_alone_is_one_empty_message_both_ways(
        make_client: MakeClient) -> None:
    """A call to a function not offered is dropped: an answer that was only such a call
    is an empty text answer, one empty message whole and streamed (the stream had no
    item at all, the whole answer one empty message)."""
    engine = FakeEngine(tool_parser=True)
    engine.script = '<call>{"name": "launch_rockets", "arguments": {"n": 3}}</call>'
    client = await make_client(engine=engine)
    outputs = []
    for stream in (False, True):
        r = await client.post("/v1/responses", json={**BASE, "tools": [TOOL],
                                                      "stream": stream})
        body = parse_sse(await r.text())[0][-1]["response"] if stream else await r.json()
        validate("Response", body)
        outputs.append([(it["type"], [c["text"] for c in it["content"]])
                        for it in body["output"]])
    assert outputs == [[("message", [""])]] * 2


@pytest.mark.parametrize(("extra", "param", "code"), [
    ({"top_logprobs": 50}, "top_logprobs", "integer_above_max_value"),
    ({"top_logprobs": -1}, "top_logprobs", "integer_below_min_value"),
    ({"top_logprobs": 2.5}, "top_logprobs", "invalid_type"),
    ({"max_tool_calls": "3"}, "max_tool_calls", "invalid_type"),
    ({"context_management": [{"type": "compaction", "compact_threshold": 10}]},
     "context_management[0].compact_threshold", "integer_below_min_value"),
    # within OpenAI's range: refused as what this server does not do, as before
    ({"top_logprobs": 5}, "top_logprobs", "unsupported_parameter"),
    ({"context_management": [{"type": "compaction", "compact_threshold": 1000}]},
     "context_management", "unsupported_parameter"),
])
async def test_a_number_outside_openais_range_is_invalid_before_unsupported(
        make_client: MakeClient, extra: dict[str, Any], param: str, code: str) -> None:
    """`top_logprobs: 50` was refused as unsupported: OpenAI's spec takes 0 to 20, and a
    value past it is the caller's mistake, told as chat's `top_logprobs` tells it, before
    what this server cannot honour; so for every number the request model leaves
    undeclared."""
    client = await make_client()
    r = await client.post("/v1/responses", json={**BASE, **extra})
    assert r.status == 400
    body = await r.json()
    validate("ErrorResponse", body)
    assert (body["error"]["param"], body["error"]["code"]) == (param, code)
    if extra.get("top_logprobs") == 50:  # (in chat's words)
        chat = await client.post("/v1/chat/completions", json={
            "model": "fake-model", "messages": [{"role": "user", "content": "hi"}],
            "logprobs": True, "top_logprobs": 50})
        assert (await chat.json())["error"] == body["error"]
    assert (await client.post("/v1/responses", json={**BASE, "top_logprobs": 0})).status == 200


@pytest.mark.parametrize(("extra", "param", "code"), [
    ({"reasoning": {"effort": "extreme"}}, "reasoning.effort", "invalid_value"),
    ({"reasoning": {"effort": 5}}, "reasoning.effort", "invalid_type"),
    ({"reasoning": {"summary": "short"}}, "reasoning.summary", "invalid_value"),
    ({"reasoning": {"generate_summary": "short"}}, "reasoning.generate_summary",
     "invalid_value"),
    ({"include": ["message.output_text.logprob"]}, "include[0]", "invalid_value"),
    ({"include": "reasoning.encrypted_content"}, "include", "invalid_type"),
    # OpenAI's values: refused as what this server does not do, as before
    ({"reasoning": {"effort": "high"}}, "reasoning", "unsupported_parameter"),
    ({"include": ["message.output_text.logprobs"]}, "include", "unsupported_parameter"),
])
async def test_a_value_outside_openais_list_is_invalid_before_unsupported(
        make_client: MakeClient, extra: dict[str, Any], param: str, code: str) -> None:
    """`reasoning` and `include` were refused as unsupported whatever they held: a
    misspelt effort or include value is the caller's mistake, told as one (as chat's
    `reasoning_effort: "extreme"` is), before what this server cannot honour."""
    client = await make_client()
    r = await client.post("/v1/responses", json={**BASE, **extra})
    assert r.status == 400
    body = await r.json()
    validate("ErrorResponse", body)
    assert (body["error"]["param"], body["error"]["code"]) == (param, code)


@pytest.mark.parametrize(("fmt", "param"), [
    ({"type": "json_schema", "name": "x"}, "text.format.schema"),
    ({"type": "json_schema", "schema": {"type": "object"}}, "text.format.name")])
async def test_a_json_schema_format_missing_a_part_says_so(
        make_client: MakeClient, fmt: dict[str, Any], param: str) -> None:
    """A `json_schema` format without its schema was a 400 with no code (its name's
    missing had OpenAI's `missing_required_parameter`): both have it now, worded alike."""
    client = await make_client()
    r = await client.post("/v1/responses", json={**BASE, "text": {"format": fmt}})
    assert r.status == 400
    body = await r.json()
    validate("ErrorResponse", body)
    assert body["error"]["code"] == "missing_required_parameter"
    assert body["error"]["param"] == param
    assert body["error"]["message"] == f"Missing required parameter: `{param}`."


@pytest.mark.parametrize("mode", ["whole", "stream", "background"])
async def test_a_stored_response_a_fallback_made_says_so_when_retrieved(
        make_client: MakeClient, fake_engine: FakeEngine, mode: str) -> None:
    """A response the breaker's fallback answered (here its fixed text) was stored as any
    other: retrieved later, nothing told it was no answer of the model. Its record keeps
    the fallback's kind, and a GET carries `x-weir-fallback` as the create did; a
    follow-up goes on from it as the client was told it (documented)."""
    import asyncio

    client = await make_client(plugins=[{"name": "breaker", "config": {
        "minimum_calls": 1000, "fallback": [{"kind": "static", "content": "Busy, sorry."}]}}])
    fake_engine.fail_after = 0
    body = {**BASE, "temperature": 0, "stream": mode == "stream",
            "background": mode == "background"}
    r = await client.post("/v1/responses", json=body)
    assert r.status == 200 and r.headers["x-weir-fallback"] == "static"
    text = await r.text()
    rid = (parse_sse(text)[0][0]["response"] if mode == "stream" else json.loads(text))["id"]
    if mode == "background":  # (its end is stored by its run's task)
        from proxy.openai_responses.routes import RUNNER

        run = client.app[RUNNER].find("public", rid)
        assert run is not None and run.task is not None
        await asyncio.wait_for(asyncio.shield(run.task), 10)
    got = await client.get(f"/v1/responses/{rid}")
    assert (await got.json())["status"] == "completed"
    assert got.headers.get("x-weir-fallback") == "static"
    validate("Response", await got.json())
    assert (await got.json())["output"][0]["content"][0]["text"] == "Busy, sorry."
    if mode == "background":
        # ... its events streamed again, and a cancel's answer, say so too (they
        # carried no header)
        again = await client.get(f"/v1/responses/{rid}?stream=true")
        assert again.status == 200 and again.headers.get("x-weir-fallback") == "static"
        await again.read()
        from proxy.openai_responses.routes import STORE

        store = client.app[STORE]
        record = await store.get("public", rid)
        assert record is not None and record["fallback"] == "static"
        record["response"]["status"] = "cancelled"  # (as one cancelled mid-answer)
        await store.put("public", rid, record)
        cancelled = await client.post(f"/v1/responses/{rid}/cancel")
        assert cancelled.status == 200 and (await cancelled.json())["status"] == "cancelled"
        assert cancelled.headers.get("x-weir-fallback") == "static"
    fake_engine.fail_after = None
    follow = await client.post("/v1/responses", json={
        **BASE, "input": "again", "previous_response_id": rid})
    assert follow.status == 200 and "x-weir-fallback" not in follow.headers
    fid = (await follow.json())["id"]
    plain = await client.get(f"/v1/responses/{fid}")
    assert plain.status == 200 and "x-weir-fallback" not in plain.headers


async def test_a_streamed_response_a_fallback_makes_says_so_while_it_is_in_progress(
        make_client: MakeClient, fake_engine: FakeEngine) -> None:
    """A stored response streamed is kept `in_progress` from its first output (a GET
    finds it while it streams); answered by a breaker's fallback, that record did not
    keep the fallback's kind (a background run's does): a GET meanwhile carried no
    `x-weir-fallback`, though what it will hold is the fallback's answer."""
    import asyncio

    from proxy.openai_responses.routes import STORE

    client = await make_client(plugins=[{"name": "breaker", "config": {
        "minimum_calls": 1000, "fallback": [{"kind": "static", "content": "Busy, sorry."}]}}])
    fake_engine.fail_after = 0
    store = client.app[STORE]
    storing, gate = asyncio.Event(), asyncio.Event()
    replace, ids = store.replace, []

    async def held_end(tenant: str, rid: str, record: Any, *args: Any, **kwargs: Any) -> Any:
        ids.append(rid)
        storing.set()
        await gate.wait()  # (the end's record, held while the GET reads)
        return await replace(tenant, rid, record, *args, **kwargs)

    store.replace = held_end  # type: ignore[method-assign]
    posting = asyncio.ensure_future(client.post("/v1/responses", json={
        **BASE, "temperature": 0, "stream": True}))
    await asyncio.wait_for(storing.wait(), 10)
    got = await client.get(f"/v1/responses/{ids[0]}")
    assert got.status == 200 and (await got.json())["status"] == "in_progress"
    assert got.headers.get("x-weir-fallback") == "static"
    gate.set()
    r = await posting
    assert r.status == 200 and r.headers["x-weir-fallback"] == "static"
    await r.read()
    got = await client.get(f"/v1/responses/{ids[0]}")
    assert (await got.json())["status"] == "completed"
    assert got.headers.get("x-weir-fallback") == "static"


async def test_a_stream_a_drain_cuts_while_its_end_is_stored_ends_as_stored(
        make_client: MakeClient) -> None:
    """A stored response streamed: its end is stored before its terminal event goes out.
    A drain cutting it meanwhile took it for a cut: the whole answer stored over as
    `failed` ("shut down"), the client told `error` and `response.failed`. The end
    decided first is the one stored and told."""
    import asyncio

    from proxy.app_state import STATE
    from proxy.openai_responses.events import saves_settled
    from proxy.openai_responses.routes import STORE

    client = await make_client()
    store = client.app[STORE]
    storing, gate = asyncio.Event(), asyncio.Event()
    replace, ids = store.replace, []

    async def held_end(tenant: str, rid: str, record: Any, *args: Any, **kwargs: Any) -> Any:
        ids.append(rid)
        if not gate.is_set():
            storing.set()
            await gate.wait()
        return await replace(tenant, rid, record, *args, **kwargs)

    store.replace = held_end  # type: ignore[method-assign]
    r = await client.post("/v1/responses", json={**BASE, "stream": True})
    await asyncio.wait_for(storing.wait(), 10)
    aborting = asyncio.ensure_future(client.app[STATE].abort_all())
    text = (await r.read()).decode()  # (the drain ends its stream)
    gate.set()
    await aborting
    await saves_settled(10)
    events, _ = parse_sse(text)
    for e in events:
        validate("ResponseStreamEvent", e)
    types = [e["type"] for e in events]
    assert types[-1] == "response.incomplete" and "error" not in types, types
    assert events[-1]["response"]["status"] == "incomplete"  # (its max_output_tokens)
    record = await store.get("public", ids[0])
    assert record is not None and record["response"] == events[-1]["response"]


async def test_a_call_id_holding_a_secret_is_kept_as_sent_for_its_tenant_alone(
        make_client: MakeClient, logs: Any) -> None:
    """A `call_id` (or an item's id) holding a secret goes upstream as its hash (the
    sanitizer's `_call_ids`), and is stored and listed as sent: the client refers to its
    calls by their ids, and the record is its tenant's alone. It reaches nothing else: no
    log line, no metric, no other tenant (stop 50's review of that choice)."""
    secret = "sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zQ7"
    cid = f"call_{secret}"
    client = await make_client(make_settings(
        auth={"mode": "keys", "keys": [{"key": f"sk-{t}", "tenant": t} for t in "ab"]},
        logging={"access_log": True},
        plugins=[{"name": "sanitizer", "config": {"detectors": {"secret": "redact"}}}]))
    r = await client.post("/v1/responses", headers=auth("a"), json={
        **BASE, "tools": [TOOL], "input": [
            {"role": "user", "content": "weather?"},
            {"type": "function_call", "id": f"fc_{secret}", "call_id": cid,
             "name": "get_weather", "arguments": '{"city": "Paris"}'},
            {"type": "function_call_output", "call_id": cid, "output": "sunny"}]})
    assert r.status == 200
    rid = (await r.json())["id"]
    listed = await client.get(f"/v1/responses/{rid}/input_items?order=asc", headers=auth("a"))
    items = (await listed.json())["data"]
    assert [i.get("call_id") for i in items[1:]] == [cid, cid]  # as the client sent them
    for path in (f"/v1/responses/{rid}", f"/v1/responses/{rid}/input_items"):
        other = await client.get(path, headers=auth("b"))
        assert other.status == 404 and secret not in await other.text()
    metrics = await (await client.get("/metrics")).text()
    assert secret not in metrics and secret not in logs.getvalue()


async def test_a_background_answer_sent_before_its_fallback_was_chosen_cannot_say_so(
        make_client: MakeClient, fake_engine: FakeEngine) -> None:
    """What the README says of `x-weir-fallback`: a background create answered `queued`
    once the chain reached the engine, and a stream of its events opened while it was
    `queued`, went out before the engine failed and the fallback answered: their
    headers cannot carry it (OpenAI's schemas have no field for it in the body). A GET
    once it ended, and a stream opened then, do."""
    import asyncio

    from proxy.openai_responses.routes import RUNNER

    client = await make_client(plugins=[{"name": "breaker", "config": {
        "minimum_calls": 1000, "fallback": [{"kind": "static", "content": "Busy, sorry."}]}}])
    fake_engine.fail_after, fake_engine.token_gate = 0, asyncio.Event()
    r = await client.post("/v1/responses", json={**BASE, "background": True})
    assert r.status == 200 and "x-weir-fallback" not in r.headers
    rid = (await r.json())["id"]
    early = await client.get(f"/v1/responses/{rid}?stream=true")
    assert early.status == 200 and "x-weir-fallback" not in early.headers
    fake_engine.token_gate.set()
    events, _ = parse_sse(await early.text())
    for e in events:
        validate("ResponseStreamEvent", e)
    assert events[-1]["type"] == "response.completed"
    run = client.app[RUNNER].find("public", rid)
    assert run is not None and run.task is not None
    await asyncio.wait_for(asyncio.shield(run.task), 10)
    got = await client.get(f"/v1/responses/{rid}")
    assert got.headers.get("x-weir-fallback") == "static"
    assert (await got.json())["output"][0]["content"][0]["text"] == "Busy, sorry."
    again = await client.get(f"/v1/responses/{rid}?stream=true")
    assert again.headers.get("x-weir-fallback") == "static"
    await again.read()


async def test_a_strict_schema_strict_mode_cannot_hold_is_openais_400(
        make_client: MakeClient, fake_engine: FakeEngine) -> None:
    """`strict: true` on a schema strict mode cannot hold (here a property with no type)
    is OpenAI's 400: its message, the schema's param and its code, on either API; sent
    without `strict`, the Responses API serves the tool non-strict as sent."""
    client = await make_client()
    loose = {"type": "object", "properties": {"a": {"description": "anything"}},
             "required": ["a"], "additionalProperties": False}
    problem = "In context=('properties', 'a'), schema must have a 'type' key."
    cases = [
        ("/v1/responses", {**BASE, "tools": [
            {"type": "function", "name": "f", "parameters": loose, "strict": True}]},
         "Invalid schema for function 'f'", "tools[0].parameters",
         "invalid_function_parameters"),
        ("/v1/responses", {**BASE, "text": {"format": {
            "type": "json_schema", "name": "n", "schema": loose, "strict": True}}},
         "Invalid schema for response_format 'n'", "text.format.schema",
         "invalid_json_schema"),
        ("/v1/chat/completions", {"model": "fake-model", "messages": [
            {"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {
                "name": "f", "parameters": loose, "strict": True}}]},
         "Invalid schema for function 'f'", "tools[0].function.parameters",
         "invalid_function_parameters"),
        ("/v1/chat/completions", {"model": "fake-model", "messages": [
            {"role": "user", "content": "hi"}], "response_format": {
                "type": "json_schema", "json_schema": {
                    "name": "n", "schema": loose, "strict": True}}},
         "Invalid schema for response_format 'n'", "response_format", None),
    ]
    for path, body, what, param, code in cases:
        r = await client.post(path, json=body)
        assert r.status == 400, await r.text()
        error = await r.json()
        validate("ErrorResponse", error)
        assert error["error"] == {"message": f"{what}: {problem}",
                                  "type": "invalid_request_error", "param": param,
                                  "code": code}
    assert not fake_engine.calls
    r = await client.post("/v1/responses", json={**BASE, "tools": [
        {"type": "function", "name": "f", "parameters": loose}]})
    assert r.status == 200, await r.text()
    tool = (await r.json())["tools"][0]
    assert tool["strict"] is False and tool["parameters"] == loose


@pytest.mark.parametrize("role", ["user", "system", "developer", "assistant"])
@pytest.mark.parametrize("part", [
    {"type": "summary_text", "text": "a"},
    {"type": "computer_screenshot", "image_url": "data:image/png;base64,AA=="}])
async def test_a_summary_or_screenshot_part_is_an_openai_shaped_400(
        make_client: MakeClient, fake_engine: FakeEngine, role: str,
        part: dict[str, Any]) -> None:
    """The spec's `Message` lists `summary_text` and `computer_screenshot` parts, which
    Weir does not serve: a 400 `invalid_request_error` naming the part (as the other
    refusals of a part name it), `invalid_value`, saying what the role takes; never read
    to the model, never a 500."""
    client = await make_client()
    items: list[dict[str, Any]] = [
        {"role": "user", "content": "hi"}, {"role": role, "content": [part]}]
    r = await client.post("/v1/responses", json={**BASE, "input": items})
    assert r.status == 400, await r.text()
    body = await r.json()
    validate("ErrorResponse", body)
    served = ("`output_text` or `refusal` parts" if role == "assistant" else
              "`input_text` parts (an assistant's: `output_text` or `refusal`)")
    assert body["error"] == {
        "message": f"Invalid value for `input[1].content[0]`: `{part['type']}` parts are "
                   f"not supported; send {served}.",
        "type": "invalid_request_error", "param": "input[1].content[0]",
        "code": "invalid_value"}
    assert not fake_engine.calls


@pytest.mark.parametrize(("role", "part", "allowed"), [
    ("user", "text", "'input_text', 'input_image', and 'input_file'"),
    ("system", "text", "'input_text', 'input_image', and 'input_file'"),
    ("developer", "text", "'input_text', 'input_image', and 'input_file'"),
    ("assistant", "text", "'output_text' and 'refusal'"),
    ("user", "image_url", "'input_text', 'input_image', and 'input_file'"),
    ("assistant", "foo", "'output_text' and 'refusal'"),
])
async def test_a_part_type_the_api_does_not_know_is_a_400(
        make_client: MakeClient, fake_engine: FakeEngine, role: str, part: str,
        allowed: str) -> None:
    """Chat Completions' `text` part (and any other type the Responses API has no part
    of) was read to the model in any role. OpenAI refuses it: "Invalid value: 'text'.
    Supported values are: ..." (`invalid_value`, param `input[i].content[j]`); Weir
    names the parts the message's role takes, as it does for the other role's part."""
    await part_refused(await make_client(), fake_engine, role, part, allowed)


async def test_a_function_tool_without_strict_is_strict_as_on_openai(
        make_client: MakeClient, fake_engine: FakeEngine) -> None:
    """OpenAI's Responses API makes a function tool sent without `strict` strict: its
    schema normalized into strict mode (`additionalProperties: false`, every property
    required) and echoed `strict: true`; Weir echoed `strict: null`. `strict: false`
    keeps the schema as given; one strict mode cannot hold (a keyword it refuses) is
    served non-strict, as given, rather than refused."""
    client = await make_client()
    nested = {"type": "object", "properties": {
        "city": {"type": "string"},
        "when": {"type": "object", "properties": {"day": {"type": "string"}}}}}
    loose = {"type": "object", "properties": {"n": {"type": "integer", "not": {"const": 3}}}}
    r = await client.post("/v1/responses", json={**BASE, "tools": [
        TOOL, {**TOOL, "name": "nested", "parameters": nested},
        {**TOOL, "name": "off", "strict": False},
        {**TOOL, "name": "loose", "parameters": loose}]})
    assert r.status == 200, await r.text()
    body = await r.json()
    validate("Response", body)
    tools = {t["name"]: t for t in body["tools"]}
    assert tools["get_weather"]["strict"] is True
    assert tools["get_weather"]["parameters"] == {**TOOL["parameters"],  # type: ignore[dict-item]
                                                 "additionalProperties": False}
    assert tools["nested"]["strict"] is True
    assert tools["nested"]["parameters"] == {
        "type": "object", "additionalProperties": False, "required": ["city", "when"],
        "properties": {"city": {"type": "string"}, "when": {
            "type": "object", "properties": {"day": {"type": "string"}},
            "additionalProperties": False, "required": ["day"]}}}
    assert tools["off"]["strict"] is False
    assert tools["off"]["parameters"] == TOOL["parameters"]
    assert tools["loose"]["strict"] is False and tools["loose"]["parameters"] == loose


@pytest.mark.parametrize("part", ["text", "output_text", "refusal", "foo"])
async def test_a_function_call_outputs_part_is_input_text(
        make_client: MakeClient, fake_engine: FakeEngine, part: str) -> None:
    """A function call's output given as parts takes `input_text` (images and files,
    which are not served here): another part (Chat Completions' `text`, an assistant's
    `output_text`) was read to the model as the output. OpenAI refuses it ("Invalid
    value: 'output_text'. Supported values are: 'input_text', 'input_image', ...",
    param `input[i].output[j]`), and so does Weir."""
    client = await make_client()
    call = {"type": "function_call", "call_id": "call_1", "name": "get_weather",
            "arguments": "{}"}
    output: dict[str, Any] = {"type": "function_call_output", "call_id": "call_1",
                              "output": [{"type": "input_text", "text": "sun"},
                                         {"type": part, "text": "ny"}]}
    r = await client.post("/v1/responses", json={**BASE, "tools": [TOOL],
                                                 "input": [call, output]})
    assert r.status == 400, await r.text()
    body = await r.json()
    validate("ErrorResponse", body)
    assert body["error"] == {
        "message": f"Invalid value: '{part}'. Supported values are: 'input_text', "
                   "'input_image', and 'input_file'.",
        "type": "invalid_request_error", "param": "input[1].output[1]",
        "code": "invalid_value"}
    assert not fake_engine.calls
    output["output"][1]["type"] = "input_text"
    r = await client.post("/v1/responses", json={**BASE, "tools": [TOOL],
                                                 "input": [call, output]})
    assert r.status == 200, await r.text()


async def test_a_forced_tool_past_the_grammar_budget_once_strict_is_served_as_sent(
        make_client: MakeClient, fake_engine: FakeEngine) -> None:
    """A tool sent without `strict` is normalized into strict mode, which adds a
    `required` list to each object: a forced schema under the engine's bound as sent can
    pass it so. It was the chat form's 400; it is served non-strict as sent (see the
    test below). (A 400 the chat form raises about a tool names the tool's param in its
    text: `test_tools.py`, `rename_param`.)"""
    client = await make_client()
    params = {"type": "object", "properties": {
        f"p{i}": {"type": "object", "properties": {"x": {"type": "string"}}}
        for i in range(300)}}  # (902 objects and arrays as sent, 1,203 in strict mode)
    tool = {"type": "function", "name": "big", "parameters": params}
    r = await client.post("/v1/responses", json={**BASE, "tools": [tool],
                                                 "tool_choice": "required"})
    assert r.status == 200, await r.text()
    assert (await r.json())["tools"][0]["strict"] is False
    r = await client.post("/v1/responses", json={**BASE, "tool_choice": "required",
                                                 "tools": [{**tool, "strict": False}]})
    assert r.status == 200, await r.text()


async def test_a_tool_without_strict_is_not_refused_for_its_normalized_size(
        make_client: MakeClient, fake_engine: FakeEngine) -> None:
    """Normalized into strict mode, a schema gains a `required` list on every object: a
    forced tool within the compiled schemas' limit as sent could pass it so, and was a
    400 for a size its sender never sent. It is served non-strict as sent (as OpenAI
    falls back where strict mode cannot hold a schema); a small one beside it stays
    strict, and `strict: true` on a schema past the limit as sent is still the 400."""
    props = {f"p{i}": {"type": "object", "properties": {"a": {"type": "string"}}}
             for i in range(300)}
    big = {"type": "object", "properties": props}  # 902 objects and arrays; 1203 normalized
    client = await make_client()
    r = await client.post("/v1/responses", json={
        **BASE, "tools": [{**TOOL, "name": "big", "parameters": big}, TOOL],
        "tool_choice": {"type": "function", "name": "big"}})
    assert r.status == 200, await r.text()
    body = await r.json()
    validate("Response", body)
    tools = {t["name"]: t for t in body["tools"]}
    assert tools["big"]["strict"] is False and tools["big"]["parameters"] == big
    assert tools["get_weather"]["strict"] is True
    assert fake_engine.calls[-1][1].json_schema == big
    bigger = {"type": "object", "properties": {**props, **{
        f"q{i}": {"type": "object", "properties": {"a": {"type": "string"}}}
        for i in range(50)}}, "additionalProperties": False}
    r = await client.post("/v1/responses", json={
        **BASE, "tools": [{**TOOL, "name": "big", "parameters": bigger, "strict": True}],
        "tool_choice": {"type": "function", "name": "big"}})
    assert r.status == 400
    assert (await r.json())["error"]["param"] == "tools[0].parameters"


async def test_the_tool_that_grew_most_is_the_one_served_non_strict(
        make_client: MakeClient) -> None:
    """Under `tool_choice: required` every tool's schema is compiled: past the limit once
    normalized, the tool that grew most is served non-strict, not the one the count
    passed the limit at, and the others stay strict."""
    def schema(n: int) -> dict[str, Any]:
        return {"type": "object", "properties": {
            f"p{i}": {"type": "object", "properties": {"a": {"type": "string"}}}
            for i in range(n)}}
    client = await make_client()  # 2 + 3n objects and arrays each as sent, 3 + 4n so
    r = await client.post("/v1/responses", json={
        **BASE, "tool_choice": "required", "tools": [
            {**TOOL, "name": "big", "parameters": schema(200)},
            {**TOOL, "name": "small", "parameters": schema(60)}]})
    assert r.status == 200, await r.text()
    tools = {t["name"]: t for t in (await r.json())["tools"]}
    assert tools["big"]["strict"] is False and tools["big"]["parameters"] == schema(200)
    assert tools["small"]["strict"] is True
