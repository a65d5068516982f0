"""Tool calling: request validation, the forced-call schema, the per-choice tracker, and
what the cache and rate limiter make of tools."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import jsonschema
import pytest

from plugins.cache import entry as E
from plugins.cache.keys import exact_key
from plugins.rate_limit.plugin import estimate_tokens
from proxy import tools as T
from proxy.auth import Principal
from proxy.context import RequestContext
from proxy.engine.base import SamplingOptions
from proxy.errors import InvalidRequest
from proxy.protocol import ChatCompletionRequest, CompletionRequest, parse_model
from tests.fakes import FakeToolParser, schema_instance

MSG = [{"role": "user", "content": "weather in Paris and Rome?"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}


def chat(**kw: Any) -> ChatCompletionRequest:
    return parse_model(ChatCompletionRequest, {"model": "m", "messages": MSG, **kw})


def bad_param(**kw: Any) -> str | None:
    with pytest.raises(InvalidRequest) as e:
        chat(**kw)
    assert e.value.status == 400
    return e.value.param


# ------------------------------------------------------------------------ validation


@pytest.mark.parametrize(("kw", "param"), [
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "objekt"}}}]}, "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]},
     "tools[0].function.name"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
    ({"tools": [WEATHER], "parallel_tool_calls": "maybe"}, "parallel_tool_calls"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "function": {
        "name": "f"}}]}]}, "messages[0].tool_calls[0].function.arguments"),
])
def test_bad_tool_input_names_the_param(kw: dict[str, Any], param: str) -> None:
    assert bad_param(**kw) == param


def test_tool_history_is_accepted() -> None:
    req = chat(tools=[WEATHER], messages=[*MSG, {"role": "assistant", "content": None,
                                                 "tool_calls": [{"id": "c1", "type": "function",
                                                                 "function": {"name": "get_weather",
                                                                              "arguments": "{}"}}]},
                                          {"role": "tool", "tool_call_id": "c1", "content": "9C"}])
    calls = T.template_calls(req.messages[1].tool_calls or [])
    assert calls == [{"id": "c1", "type": "function",
                      "function": {"name": "get_weather", "arguments": {}}}]


@pytest.mark.parametrize("arguments", ['{"t": 1e400}', '{"t": NaN}', '{"t": -Infinity}'])
def test_call_arguments_that_are_not_finite_json_are_shown_as_sent(arguments: str) -> None:
    """`json` reads them as infinities or NaN, which the template then wrote as
    `Infinity`/`NaN` (no JSON): the model is shown the text as it was sent."""
    call_ = {"id": "c1", "type": "function",
             "function": {"name": "get_weather", "arguments": arguments}}
    req = chat(tools=[WEATHER], messages=[
        *MSG, {"role": "assistant", "content": None, "tool_calls": [call_]},
        {"role": "tool", "tool_call_id": "c1", "content": "9C"}])
    [call] = T.template_calls(req.messages[1].tool_calls or [])
    assert call["function"]["arguments"] == arguments


@pytest.mark.parametrize("arguments", ['{"t": "\\ud800"}', '["\\uDFFF x"]',
                                       '{"\\udbff": 1}'])
def test_call_arguments_escaping_a_lone_surrogate_are_shown_as_sent(arguments: str) -> None:
    """JSON may escape a lone surrogate (`"\\ud800"`) where a body may not hold one: read
    as an object, the template wrote it raw and the tokenizer failed on it (a 400
    "the chat template rejected the messages: TextEncodeInput must be ..."). The model is
    shown the text as it was sent, and every string handed on encodes as UTF-8."""
    call_ = {"id": "c1", "type": "function",
             "function": {"name": "get_weather", "arguments": arguments}}
    req = chat(tools=[WEATHER], messages=[
        *MSG, {"role": "assistant", "content": None, "tool_calls": [call_]},
        {"role": "tool", "tool_call_id": "c1", "content": "9C"}])
    [call] = T.template_calls(req.messages[1].tool_calls or [])
    assert call["function"]["arguments"] == arguments
    json.dumps(call, ensure_ascii=False).encode("utf-8")


@pytest.mark.parametrize("arguments", ['"Berlin"', '"{\\"city\\": 1}"', '" "'])
def test_call_arguments_that_are_a_json_string_are_shown_as_sent(arguments: str) -> None:
    """Arguments that are one JSON string (a model's `"arguments": "Berlin"`, which a
    tool parser hands on as `'"Berlin"'`) were read into the bare text `Berlin`, and the
    template, which writes a string as it is, showed the model the call as
    `"arguments": Berlin}`, no JSON and not the call made: they go as sent."""
    from jinja2 import Environment

    from proxy.engine.smollm2_template import CHAT_TEMPLATE
    call_ = {"id": "c1", "type": "function",
             "function": {"name": "get_weather", "arguments": arguments}}
    req = chat(tools=[WEATHER], messages=[
        *MSG, {"role": "assistant", "content": None, "tool_calls": [call_]},
        {"role": "tool", "tool_call_id": "c1", "content": "9C"}])
    [call] = T.template_calls(req.messages[1].tool_calls or [])
    assert call["function"]["arguments"] == arguments
    env = Environment()
    env.filters["tojson"] = lambda v: json.dumps(v)
    prompt = env.from_string(CHAT_TEMPLATE).render(
        messages=[{"role": "assistant", "content": "", "tool_calls": [call]}], tools=None,
        add_generation_prompt=False)
    assert f'"arguments": {arguments}}}' in prompt


def test_call_arguments_with_paired_or_escaped_backslash_u_are_read_as_json() -> None:
    """A surrogate pair (an emoji) and an escaped backslash before `ud800` are no lone
    surrogates: the arguments are read as an object, as any others."""
    calls = [{"id": f"c{i}", "type": "function", "function": {"name": "get_weather",
                                                               "arguments": a}}
             for i, a in enumerate(['{"t": "\\ud83d\\ude00"}', '{"t": "\\\\ud800"}'])]
    req = chat(tools=[WEATHER], messages=[
        *MSG, {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c0", "content": "9C"},
        {"role": "tool", "tool_call_id": "c1", "content": "9C"}])
    got = [c["function"]["arguments"] for c in T.template_calls(req.messages[1].tool_calls or [])]
    assert got == [{"t": "\U0001f600"}, {"t": "\\ud800"}]


# ------------------------------------------------------------------- forced calls


def test_required_schema_admits_only_the_tools_calls() -> None:
    req = chat(tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False)
    schema = T.forced_schema(req)
    assert schema is not None and schema["maxItems"] == 1
    good = [{"name": "get_weather", "parameters": {"city": "Paris"}}]
    jsonschema.validate(good, schema)
    for bad in ([], [{"name": "other", "parameters": {}}],
                [{"name": "get_weather", "parameters": {}}], good * 2):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    assert T.parse_forced(req, json.dumps(good)) == [
        T.ParsedToolCall("get_weather", '{"city":"Paris"}')]


def test_required_calls_keep_their_numbers_as_the_model_wrote_them() -> None:
    """`1e400` came back as `Infinity` (no JSON) with `finish_reason: tool_calls`; an
    integer of thousands of digits, which Python refuses to convert, was read as a cut:
    the first call's arguments swallowed the rest, and later calls were lost."""
    req = chat(tools=[WEATHER, TIME], tool_choice="required")
    big = "9" * 5000
    text = ('[{"name": "get_weather", "parameters": {"city": "Paris", "n": 1e400, '
            f'"k": {big}, "f": -0.50, "ok": true, "none": null, "list": [1, 2.0]}}}}, '
            '{"name": "get_time", "parameters": {}}]')
    calls = T.parse_forced(req, text)
    assert [c.name for c in calls] == ["get_weather", "get_time"]
    assert calls[0].arguments == ('{"city":"Paris","n":1e400,"k":' + big + ',"f":-0.50,'
                                  '"ok":true,"none":null,"list":[1,2.0]}')
    assert calls[1].arguments == "{}"
    assert T.parse_forced(req, '[{"name": 5, "parameters": {}}]') == []  # a number: no name
    deep = '[{"name": "get_time", "parameters": ' + '{"a": ' * 700 + '1' + '}' * 701 + ']'
    assert T.parse_forced(req, deep) == []  # nested past what it writes back: no 500
    assert T.parse_forced(req, '[{"name": "get_time", "parameters": {"x": NaN}}]') == []


PERSON = {  # as pydantic writes a nested model: references to the schema's own root
    "type": "object", "required": ["name", "address"],
    "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/Address"},
                   "manager": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
    "$defs": {"Address": {"type": "object", "required": ["city"],
                          "properties": {"city": {"type": "string"}}}}}


def test_required_schema_keeps_each_tools_own_references() -> None:
    """Nested under the `required` schema, `#/$defs/Address` pointed at a root without
    it: vLLM refused the grammar (a 400 for any pydantic tool with a nested model)."""
    other = {"type": "function", "function": {"name": "save_pet", "parameters": {
        "type": "object", "properties": {"kind": {"$ref": "#/$defs/Address"}},
        "$defs": {"Address": {"type": "integer"}}}}}  # the same name, another schema
    req = chat(tools=[WEATHER, {"type": "function", "function": {
        "name": "save_person", "parameters": PERSON}}, other], tool_choice="required")
    schema = T.forced_schema(req)
    assert schema is not None
    check = jsonschema.Draft202012Validator(schema)
    person = {"name": "Ann", "address": {"city": "Rome"},
              "manager": {"name": "Bo", "address": {"city": "Oslo"}, "manager": None}}
    check.validate([{"name": "save_person", "parameters": person},
                    {"name": "save_pet", "parameters": {"kind": 3}},
                    {"name": "get_weather", "parameters": {"city": "Paris"}}])
    for bad in ({"name": "Ann", "address": {"city": 1}},
                {"name": "Ann", "address": {"city": "Rome"}, "manager": {"name": "Bo"}}):
        with pytest.raises(jsonschema.ValidationError):
            check.validate([{"name": "save_person", "parameters": bad}])
    with pytest.raises(jsonschema.ValidationError):
        check.validate([{"name": "save_pet", "parameters": {"kind": "Rome"}}])
    # without references, a tool's parameters stay in place
    assert schema["items"]["anyOf"][0]["properties"]["parameters"] == WEATHER["function"][
        "parameters"]


def test_rebasing_leaves_data_and_rebases_a_schema_with_its_own_id() -> None:
    """Only pointer references move (a reference to an anchor, `#foo`, is a 400 before
    this); `const`/`enum` values are data, kept as they are. A schema with its own `$id`
    resolves against itself in JSON Schema, but the grammar compiler ignores `$id`: left
    as it was, a valid request was a 400 ("Cannot find field $defs"); it is rebased as any
    other, without its `$id`."""
    anchored = {"type": "object", "properties": {
        "b": {"$ref": "#/$defs/B"},
        "c": {"const": {"$ref": "#/x"}},
        "default": {"$ref": "#/$defs/B"}},  # a property named like a keyword: a schema
        "$defs": {"A": {"$anchor": "foo", "type": "string"}, "B": {"type": "integer"}}}
    with_id = {"$id": "https://example.com/p", "type": "object",
               "properties": {"b": {"$ref": "#/$defs/B"}}, "$defs": {"B": {"type": "string"}}}
    req = chat(tools=[
        {"type": "function", "function": {"name": "f", "parameters": anchored}},
        {"type": "function", "function": {"name": "g", "parameters": with_id}}],
        tool_choice="required")
    schema = T.forced_schema(req)
    assert schema is not None
    moved = schema["$defs"]["tool0"]["properties"]
    assert moved["b"] == {"$ref": "#/$defs/tool0/$defs/B"}
    assert moved["c"] == {"const": {"$ref": "#/x"}}
    assert moved["default"] == {"$ref": "#/$defs/tool0/$defs/B"}
    assert schema["items"]["anyOf"][1]["properties"]["parameters"] == {
        "$ref": "#/$defs/tool1"}
    assert schema["$defs"]["tool1"]["properties"]["b"] == {"$ref": "#/$defs/tool1/$defs/B"}
    assert "$id" not in schema["$defs"]["tool1"]
    import xgrammar

    xgrammar.Grammar.from_json_schema(json.dumps({  # what the engine compiles
        **schema, "items": {**schema["items"], "anyOf": schema["items"]["anyOf"][1:]}}))


def test_named_schema_is_the_functions_parameters() -> None:
    req = chat(tools=[WEATHER, TIME], tool_choice={"type": "function",
                                                   "function": {"name": "get_time"}})
    assert T.forced_schema(req) == {"type": "object", "properties": {}}
    assert [c.name for c in T.parse_forced(req, "{}")] == ["get_time"]


def test_shape_options_constrains_forced_choices_over_response_format() -> None:
    req = chat(tools=[WEATHER], tool_choice="required", response_format={"type": "json_object"},
               messages=[{"role": "user", "content": "weather, in JSON?"}])
    opts = SamplingOptions(max_tokens=8, json_object=True)
    T.shape_options(req, opts, _Engine(parser=False))
    assert opts.json_schema == T.forced_schema(req) and not opts.json_object
    auto = SamplingOptions(max_tokens=8)
    T.shape_options(chat(tools=[WEATHER]), auto, _Engine(parser=True))
    assert auto.json_schema is None and auto.skip_special_tokens is False
    plain = SamplingOptions(max_tokens=8)
    T.shape_options(chat(tools=[WEATHER]), plain, _Engine(parser=False))
    assert plain.skip_special_tokens is True


def test_a_forced_schema_names_where_it_came_from() -> None:
    """The engine's refusal of a schema names the param it came from, not the
    response_format the request may not have."""
    opts = SamplingOptions(max_tokens=8)
    T.shape_options(chat(tools=[WEATHER], tool_choice="required"), opts, _Engine(False))
    assert opts.schema_param == "tools"
    named = SamplingOptions(max_tokens=8)
    T.shape_options(chat(tools=[WEATHER, TIME], tool_choice={
        "type": "function", "function": {"name": "get_time"}}), named, _Engine(False))
    assert named.schema_param == "tools[1].function.parameters"
    assert SamplingOptions(max_tokens=8).schema_param == "response_format"
    # a response format's schema is named as the request's own check names it (the
    # engine's refusal said `response_format`; a metaschema error said the schema)
    from proxy.preparing import prepare_chat
    from tests.fakes import FakeEngine
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}}
    assert prepare_chat(FakeEngine(), chat(response_format=fmt)).options.schema_param == (
        "response_format.json_schema.schema")
    assert prepare_chat(FakeEngine(), chat(
        response_format={"type": "json_object"}, messages=[
            {"role": "user", "content": "in JSON"}])).options.schema_param == "response_format"
    from proxy.errors import InvalidRequest as Bad
    from proxy.openai_responses.translate import rename_param
    assert rename_param(Bad("x", param="tools[1].function.parameters")).param == (
        "tools[1].parameters")  # a Responses tool is flat
    said = rename_param(Bad("The schemas ... (past it at `tools[0].function.parameters`)"
                            "; use ...", param="tools[0].function.parameters"))
    assert "past it at `tools[0].parameters`" in said.message  # (its text too)
    assert "function" not in said.message
    assert rename_param(Bad("x", param="response_format.json_schema.schema")).param == (
        "text.format.schema")


@pytest.mark.parametrize("schema", [
    {"$ref": "https://example.com/s.json"}, {"$ref": "other.json#/a"},
    {"type": "object", "properties": {"a": {"$ref": "file:///etc/passwd"}}}])
def test_a_schema_may_refer_only_inside_itself(schema: dict[str, Any]) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    assert bad_param(tools=[tool]) == "tools[0].function.parameters"
    assert bad_param(response_format={"type": "json_schema", "json_schema": {
        "name": "n", "schema": schema}}) == "response_format.json_schema.schema"
    local = {"type": "object", "properties": {"a": {"$ref": "#/definitions/a"}},
             "definitions": {"a": {"type": "string"}}}
    chat(tools=[{"type": "function", "function": {"name": "f", "parameters": local}}])


def test_a_cut_short_forced_answer_never_shows_its_wrapper() -> None:
    """`required` answers an array of {"name", "parameters"}: Weir's own format. Cut at
    max_tokens, whole calls stay calls and the last keeps its arguments as far as they
    came (as a named function's do, and as OpenAI answers); none of it is content."""
    req = chat(tools=[WEATHER, TIME], tool_choice="required")
    tracker = T.ToolCallTracker.for_request(req, lambda tools: None)
    assert tracker.whole('[{"name": "get_wea') == (None, [])
    assert tracker.reason("length") == "length"
    content, calls = T.ToolCallTracker.for_request(req, lambda tools: None).whole(
        '[{"name": "get_time", "parameters": {}}, {"name": "get_weather", '
        '"parameters": {"city": "Par')
    assert content is None
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        ("get_time", "{}"), ("get_weather", '{"city": "Par')]
    # cut once the name was whole, before its arguments began: a call with `arguments:
    # ""`, as a named function's cut there (it was dropped: a cut answer billed for its
    # tokens showed neither content nor a call)
    for cut, args in ((', "parameters": ', ""), (', "param', ""), ("", ""), (" ,", ""),
                      (', "parameters":{"ci', '{"ci')):
        _, calls = T.ToolCallTracker.for_request(req, lambda tools: None).whole(
            '[{"name": "get_time", "parameters": {}}, {"name": "get_weather"' + cut)
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
            ("get_time", "{}"), ("get_weather", args)], cut
    named = chat(tools=[WEATHER], tool_choice={"type": "function",
                                               "function": {"name": "get_weather"}})
    assert T.ToolCallTracker.for_request(named, lambda tools: None).whole("")[1][0][
        "function"] == {"name": "get_weather", "arguments": ""}
    # a name cut short names nothing: no call
    _, calls = T.ToolCallTracker.for_request(req, lambda tools: None).whole(
        '[{"name": "get_time", "parameters": {}}, {"name": "get_wea')
    assert [c["function"]["name"] for c in calls] == ["get_time"]
    streamed = T.ToolCallTracker.for_request(req, lambda tools: None)
    assert streamed.step('[{"name": "get_weather", "param', [], None) == (None, [], None)
    content, deltas, reason = streamed.step('eters": {"city": 1', [], "length")
    assert content is None and reason == "length"
    assert [(d["index"], d["function"]) for d in deltas] == [
        (0, {"name": "get_weather", "arguments": '{"city": 1'})]


class _Engine:
    def __init__(self, parser: bool) -> None:
        self.parser = parser

    def tool_parser(self, tools: list[dict[str, Any]]) -> FakeToolParser | None:
        return FakeToolParser() if self.parser else None


# ------------------------------------------------------------------------ tracker


def _forced_text(req: ChatCompletionRequest) -> str:
    schema = T.forced_schema(req)
    assert schema is not None
    return json.dumps(schema_instance(schema))


def test_forced_tracker_whole_and_streamed_agree() -> None:
    req = chat(tools=[WEATHER], tool_choice="required")
    text = _forced_text(req)
    whole = T.ToolCallTracker.for_request(req, _Engine(False).tool_parser)
    content, calls = whole.whole(text)
    assert content is None and calls[0]["function"] == {"name": "get_weather",
                                                        "arguments": '{"city":"x"}'}
    assert calls[0]["id"].startswith("call_") and whole.reason("stop") == "tool_calls"
    streamed = T.ToolCallTracker.for_request(req, _Engine(False).tool_parser)
    assert all(streamed.feed(text[i:i + 3], [1]) == (None, [])
               for i in range(0, len(text), 3))
    _, deltas = streamed.finish()
    assembler = T.CallAssembler()
    assembler.feed(deltas)
    assert [c["function"] for c in assembler.result()] == [calls[0]["function"]]
    assert streamed.reason("stop") == "tool_calls"


def test_named_tracker_streams_the_arguments_as_they_come() -> None:
    req = chat(tools=[WEATHER, TIME], tool_choice={"type": "function",
                                                   "function": {"name": "get_weather"}})
    tracker = T.ToolCallTracker.for_request(req, _Engine(True).tool_parser)
    text = '{"city": "Paris"}'
    steps = [tracker.step(text[i:i + 4], [1], None) for i in range(0, len(text), 4)]
    steps.append(tracker.step("", [], "stop"))
    first = steps[0][1][0]
    assert first["id"].startswith("call_") and first["function"]["name"] == "get_weather"
    assert all("id" not in d and "name" not in d.get("function", {})
               for _, deltas, _ in steps[1:] for d in deltas)
    assembler = T.CallAssembler()
    for content, deltas, _ in steps:
        assert content is None
        assembler.feed(deltas)
    assert assembler.result()[0]["function"]["arguments"] == text
    assert steps[-1][2] == "stop"  # a named function's call ends with stop, as on OpenAI
    whole = T.ToolCallTracker.for_request(req, _Engine(True).tool_parser)
    assert whole.whole(text)[1][0]["function"]["arguments"] == text


def test_parser_tracker_splits_content_from_calls() -> None:
    req = chat(tools=[WEATHER])
    text = 'Let me check. <call>{"name": "get_weather", "arguments": {"city": "Paris"}}</call>'
    streamed = T.ToolCallTracker.for_request(req, _Engine(True).tool_parser)
    assert streamed.mode == "parser"
    pieces, assembler = [], T.CallAssembler()
    for i in range(0, len(text), 5):
        c, deltas = streamed.feed(text[i:i + 5], [1])
        pieces.append(c or "")
        assembler.feed(deltas)
    assert "".join(pieces).strip() == "Let me check."
    got = assembler.result()
    assert got[0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert got[0]["id"] and streamed.reason("stop") == "tool_calls"


def test_text_the_parser_held_back_is_content_when_no_call_came() -> None:
    """An answer that began like a call and was cut before one was whole: streamed, the
    text the parser held back comes out at the end, as the whole answer's content."""
    req = chat(tools=[WEATHER])
    text = 'Sure: <call>{"name": "get_wea'
    streamed = T.ToolCallTracker.for_request(req, _Engine(True).tool_parser)
    steps = [streamed.step(text[i:i + 4], [1], None) for i in range(0, len(text), 4)]
    steps.append(streamed.step("", [], "length"))
    assert "".join(c or "" for c, _, _ in steps) == text
    assert all(not deltas for _, deltas, _ in steps) and steps[-1][2] == "length"


def test_parallel_tool_calls_false_keeps_the_first_call() -> None:
    two = ('<call>{"name": "get_weather", "arguments": {"city": "Paris"}}</call>'
           '<call>{"name": "get_weather", "arguments": {"city": "Rome"}}</call>')
    for parallel, expected in ((False, ["Paris"]), (None, ["Paris", "Rome"])):
        req = chat(tools=[WEATHER], parallel_tool_calls=parallel)
        streamed = T.ToolCallTracker.for_request(req, _Engine(True).tool_parser)
        assembler = T.CallAssembler()
        for i in range(0, len(two), 7):
            assembler.feed(streamed.step(two[i:i + 7], [1], None)[1])
        assembler.feed(streamed.step("", [], "stop")[1])
        assert [json.loads(c["function"]["arguments"])["city"]
                for c in assembler.result()] == expected


def test_text_modes_pass_text_through() -> None:
    for req, parser in ((chat(tools=[WEATHER], tool_choice="none"), True),
                        (chat(tools=[WEATHER]), False), (chat(), True)):
        tracker = T.ToolCallTracker.for_request(req, _Engine(parser).tool_parser)
        assert tracker.mode == "text"
        assert tracker.feed("hello", [1]) == ("hello", [])
        assert tracker.whole("hello") == ("hello", [])
        assert tracker.reason("stop") == "stop"


# ----------------------------------------------------------------- cache and limits


def _ctx(req: ChatCompletionRequest) -> RequestContext:
    return RequestContext(route="chat", request=req, principal=Principal("t", "user", "u"),
                          request_id="r")


def test_cache_keys_on_tools_choice_and_results() -> None:
    history = [*MSG, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather",
                                                      "arguments": '{"city": "Paris"}'}}]}]
    variants = [
        chat(),
        chat(tools=[WEATHER]),
        chat(tools=[WEATHER, TIME]),
        chat(tools=[WEATHER], tool_choice="required"),
        chat(tools=[WEATHER], tool_choice="required", parallel_tool_calls=False),
        chat(tools=[WEATHER], messages=[*history, {"role": "tool", "tool_call_id": "c1",
                                                   "content": "9C"}]),
        chat(tools=[WEATHER], messages=[*history, {"role": "tool", "tool_call_id": "c1",
                                                   "content": "31C"}]),
    ]
    keys = {exact_key(_ctx(r), "tenant") for r in variants}
    assert len(keys) == len(variants)


def test_rate_limit_estimate_counts_tool_definitions() -> None:
    assert estimate_tokens(_ctx(chat(tools=[WEATHER, TIME]))) > estimate_tokens(_ctx(chat())) + 20


def test_rate_limit_estimate_counts_each_prompt_and_message_as_a_token_at_least() -> None:
    """256 prompts of "x" are 256 prompts to read (a token each at least), not 65
    tokens: the characters are counted per prompt, rounded up, not summed once."""
    many = CompletionRequest.model_validate({"model": "m", "prompt": ["x"] * 256})
    ctx = RequestContext(route="completions", request=many,
                         principal=Principal("t", "user", "u"), request_id="r")
    assert estimate_tokens(ctx) >= 256
    ids = CompletionRequest.model_validate({"model": "m", "prompt": [[1, 2, 3]] * 10})
    assert estimate_tokens(RequestContext(route="completions", request=ids,
                                          principal=Principal("t", "user", "u"),
                                          request_id="r")) == 31  # (30, the request's 1)
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": "x"}
                for i in range(255)]
    assert estimate_tokens(_ctx(chat(messages=messages))) >= 255


CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


def _entry(choices: list[dict[str, Any]]) -> E.Entry:
    return E.Entry(key="k", route="chat", model="m", choices=choices,
                   usage={"prompt_tokens": 3, "completion_tokens": 4}, scope="t", tenant="t",
                   role="user", user="u", prompt="p")


def test_cache_captures_and_replays_tool_calls_whole() -> None:
    body = {"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": None, "tool_calls": [CALL]}}], "usage": {}}
    captured = E.capture_body(body, "chat")
    assert captured is not None
    entry = _entry(captured[0])
    replay = E.replay_body(E.Entry.from_json(entry.to_json()), chat(tools=[WEATHER]))
    msg = replay["choices"][0]["message"]
    assert _without_ids(msg["tool_calls"]) == _without_ids([CALL]) and msg["content"] is None
    assert replay["choices"][0]["finish_reason"] == "tool_calls"
    # Each replay's calls have ids of their own: a client matches results to calls by id.
    again = E.replay_body(entry, chat(tools=[WEATHER]))["choices"][0]["message"]["tool_calls"]
    ids = {CALL["id"], msg["tool_calls"][0]["id"], again[0]["id"]}
    assert len(ids) == 3 and all(i.startswith("call_") for i in ids)


def _without_ids(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in c.items() if k != "id"} for c in calls]


def test_a_streamed_answer_carries_its_calls_and_replays_as_calls() -> None:
    req = chat(tools=[WEATHER], tool_choice={"type": "function",
                                             "function": {"name": "get_weather"}})
    calls = T.StreamCalls(lambda: T.ToolCallTracker.for_request(req, _Engine(False).tool_parser))
    text = '{"city": "Paris"}'
    calls.step(0, text[:5], [1], None)
    _, _, reason = calls.step(0, text[5:], [1], "stop")
    answer = calls.answer([{"index": 0, "text": "", "finish_reason": reason}])
    (call,) = answer[0]["tool_calls"]
    assert call["function"] == CALL["function"] and reason == "stop"  # (named: OpenAI's)
    entry = _entry([{**answer[0], "tool_calls": [CALL]}])
    req = chat(tools=[WEATHER], stream=True)

    async def collect() -> list[dict[str, Any]]:
        return [c async for c in E.replay_stream(entry, req)]

    chunks = asyncio.run(collect())
    replayed = T.CallAssembler()
    for c in chunks:
        for ch in c["choices"]:
            replayed.feed(ch["delta"].get("tool_calls") or [])
    (got,) = replayed.result()
    assert _without_ids([got]) == _without_ids([CALL]) and got["id"] != CALL["id"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"  # as it was answered


# ------------------------------------------------------------------ schema budgets


def _wide(n: int) -> dict[str, Any]:
    """An object schema of n properties: n + 2 objects."""
    return {"type": "object", "properties": {f"p{j}": {"type": "string"} for j in range(n)}}


def _tool(i: int, n: int) -> dict[str, Any]:
    return {"type": "function", "function": {"name": f"f{i}", "parameters": _wide(n)}}


def refused(body: dict[str, Any], model: Any = ChatCompletionRequest) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as e:
        parse_model(model, body)
    assert e.value.status == 400 and e.value.code == "invalid_value"
    return e.value


def test_schemas_past_the_request_budget_are_refused_before_any_is_checked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    checked: list[Any] = []
    monkeypatch.setattr(jsonschema.Draft7Validator, "check_schema",
                        classmethod(lambda cls, s: checked.append(s)))
    tools = [_tool(i, 400) for i in range(128)]  # 51,456 objects: 14 s of checks before
    err = refused({"model": "m", "messages": MSG, "tools": tools})
    assert err.param is not None and err.param.startswith("tools[")
    assert err.param.endswith("].function.parameters") and checked == []


def test_what_the_engine_compiles_has_its_own_smaller_budget() -> None:
    body = {"model": "m", "messages": MSG, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": _wide(2000)}}}
    assert refused(body).param == "response_format.json_schema.schema"
    tools = [_tool(i, 600) for i in range(2)]  # 1,204 objects: fine unless forced
    ok = parse_model(ChatCompletionRequest, {"model": "m", "messages": MSG, "tools": tools,
                                             "tool_choice": "auto"})
    assert ok.tools is not None and len(ok.tools) == 2
    parse_model(ChatCompletionRequest, {"model": "m", "messages": MSG, "tools": tools,
                                        "tool_choice": {"type": "function",
                                                        "function": {"name": "f0"}}})
    err = refused({"model": "m", "messages": MSG, "tools": tools, "tool_choice": "required"})
    assert err.param == "tools[1].function.parameters" and "tool_choice" in err.message


def test_what_the_engine_compiles_has_a_budget_of_regex_and_literal_characters() -> None:
    """Nodes alone let one 250 KB `pattern` through: compiled one grammar at a time, it
    held every tenant's structured output for seconds."""
    from proxy.protocol import MAX_GRAMMAR_REGEX_CHARS, MAX_GRAMMAR_TEXT_CHARS

    def fmt(schema: dict[str, Any]) -> dict[str, Any]:
        return {"model": "m", "messages": MSG, "response_format": {
            "type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}

    long = "a" * (MAX_GRAMMAR_REGEX_CHARS // 2 + 1)
    two = {"type": "object", "properties": {
        "a": {"type": "string", "pattern": long},
        "b": {"type": "object", "patternProperties": {long: {"type": "string"}}}}}
    err = refused(fmt(two))
    assert err.param == "response_format.json_schema.schema" and "regexes" in err.message
    words = [f"w{i:05d}" * 10 for i in range(MAX_GRAMMAR_TEXT_CHARS // 60 + 1)]
    assert "enum" in refused(fmt({"type": "string", "enum": words})).message
    nested = {"k": ["x" * (MAX_GRAMMAR_TEXT_CHARS + 1)]}  # data, however nested
    assert "enum" in refused(fmt({"const": nested})).message
    assert "enum" in refused(fmt({"enum": [nested]})).message
    # A counted repeat is written out by the compiler (`{5000,9999}`: 8 s, 16 characters)
    for few_chars in ("[a-z]{5000,9999}", "(([a-z]{16}){16}){16}", "[a-z]{100,200}" * 2,
                      "^[a-z]{5000, 9999}$", "[a-z]{ 3000}", ".{300}"):  # (blanks: read too)
        assert "repeats" in refused(fmt({"type": "string", "pattern": few_chars})).message

    # A known string format is a built-in regex (1,000 `uri-reference`s: 4.7 s)
    def formats(kind: str, n: int) -> dict[str, Any]:
        return fmt({"type": "object", "properties": {
            f"p{i}": {"type": "string", "format": kind} for i in range(n)}})

    assert "format" in refused(formats("date", 129)).message
    assert "format" in refused(formats("uri-reference", 33)).message
    parse_model(ChatCompletionRequest, formats("date", 100))
    parse_model(ChatCompletionRequest, fmt({"type": "object", "properties": {
        "format": {"type": "string"}}}))  # a property so named is no format
    parse_model(ChatCompletionRequest, fmt({"type": "string",
                                            "pattern": r"^[A-Za-z0-9]{1,64}-\d{4}$"}))
    parse_model(ChatCompletionRequest, fmt({"type": "string", "pattern": "^[a-z]{3}$",
                                            "enum": words[:100]}))
    # not compiled (tool_choice auto): only the node budget holds
    tools = [{"type": "function", "function": {"name": "f", "parameters": two}}]
    parse_model(ChatCompletionRequest, {"model": "m", "messages": MSG, "tools": tools})
    assert refused({"model": "m", "messages": MSG, "tools": tools,
                    "tool_choice": "required"}).param == "tools[0].function.parameters"


def test_the_responses_api_shapes_are_counted_too() -> None:
    from proxy.openai_responses.models import ResponsesRequest

    tools = [{"type": "function", "name": f"f{i}", "parameters": _wide(600)} for i in range(2)]
    assert refused({"model": "m", "input": "hi", "tools": tools, "tool_choice": "required"},
                   ResponsesRequest).param == "tools[1].parameters"
    assert refused({"model": "m", "input": "hi", "text": {"format": {
        "type": "json_schema", "name": "x", "schema": _wide(1100)}}},
        ResponsesRequest).param == "text.format.schema"


def test_a_schema_that_passed_is_remembered_and_a_bad_one_is_refused_every_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []
    real = jsonschema.Draft7Validator.check_schema

    def spy(cls: Any, s: Any) -> None:
        calls.append(s)
        real(s)

    monkeypatch.setattr(jsonschema.Draft7Validator, "check_schema", classmethod(spy))
    good = {"type": "function", "function": {"name": "g", "parameters": {
        "type": "object", "properties": {"memo-test": {"type": "integer"}}}}}
    for _ in range(3):
        parse_model(ChatCompletionRequest, {"model": "m", "messages": MSG, "tools": [good]})
    assert len(calls) == 1
    bad = {"type": "function", "function": {"name": "b", "parameters": {"type": "strnig"}}}
    for _ in range(2):
        assert refused({"model": "m", "messages": MSG, "tools": [bad]}).param is not None
    assert len(calls) == 3


def test_a_forced_answer_nested_past_the_parser_is_no_call() -> None:
    req = chat(tools=[WEATHER], tool_choice="required")
    assert T.parse_forced(req, "[" + "[" * 5000 + "]" * 5001) == []


def test_schema_data_may_hold_what_looks_like_an_outside_ref() -> None:
    """`default`, `const`, `enum` and `examples` hold values, not schemas; a property
    named like one of them holds a schema, and is checked."""
    data = {"type": "object", "properties": {"a": {
        "type": "object", "default": {"$ref": "http://x"}, "enum": [{"$ref": "http://x"}]}}}
    chat(tools=[{"type": "function", "function": {"name": "f", "parameters": data}}])
    named = {"type": "object", "properties": {"default": {"$ref": "http://x"}}}
    assert bad_param(tools=[{"type": "function", "function": {
        "name": "f", "parameters": named}}]) == "tools[0].function.parameters"


def test_a_schema_nested_past_the_metaschema_check_is_a_400() -> None:
    deep: dict[str, Any] = {"type": "object"}
    node = deep
    for _ in range(300):
        node["properties"] = {"a": {"type": "object"}}
        node = node["properties"]["a"]
    assert bad_param(response_format={"type": "json_schema", "json_schema": {
        "name": "n", "schema": deep}}) == "response_format.json_schema.schema"


@pytest.mark.parametrize("choice", ["required", {"type": "function",
                                                 "function": {"name": "get_weather"}}])
def test_stop_strings_do_not_cut_a_forced_call(choice: Any) -> None:
    """`stop` ends text, not a call's arguments: a stop word inside them cut the JSON
    mid-string (`{"city":"` with finish_reason tool_calls); text answers keep it."""
    from proxy.preparing import prepare_chat
    from tests.fakes import FakeEngine

    forced = prepare_chat(FakeEngine(), chat(tools=[WEATHER], tool_choice=choice,
                                             stop=["Paris"]))
    assert forced.options.stop == [] and forced.options.json_schema is not None
    text = prepare_chat(FakeEngine(), chat(tools=[WEATHER], stop=["Paris"]))
    assert text.options.stop == ["Paris"]


@pytest.mark.parametrize(("parsed", "kept"), [
    (None, False), ("chatcmpl-tool-8c1f0e", False), ("Ab3dE9xYz", True),
    ("functions.get_weather:0", True)])
def test_call_ids_are_openai_s_unless_the_model_made_its_own(parsed: str | None,
                                                             kept: bool) -> None:
    """vLLM's random ids become `call_...` on every path (whole, streamed, replayed);
    a model's own (Mistral's nine characters, Kimi's) are kept for its template."""
    got = T.call_id(parsed)
    assert got == parsed if kept else got.startswith("call_") and len(got) == 29


class _CutParser:
    """A parser that has streamed a call whose arguments a stop string then cut."""

    def __init__(self, args: str) -> None:
        self.args, self.sent = args, False

    def feed(self, delta: str, token_ids: list[int]) -> tuple[str | None, list[Any]]:
        if self.sent:
            return None, []
        self.sent = True
        from proxy.engine.base import ToolCallDelta
        return None, [ToolCallDelta(0, None, "get_weather", self.args)]

    def finish(self, cut: bool = False) -> list[Any]:
        return []


@pytest.mark.parametrize(("args", "reason"), [('{"city": "Par', "stop"),
                                              ('{"city": "Paris"}', "tool_calls")])
def test_a_call_cut_by_a_stop_string_is_not_a_call_to_run(args: str, reason: str) -> None:
    """With a parser, a stop string can end the answer inside a call's arguments: the
    cut call is sent as it came, but the finish reason is `stop`, not `tool_calls` (a
    client would run arguments that are no JSON); a whole answer is the model's text."""
    req = chat(tools=[WEATHER])
    calls = T.StreamCalls(lambda: T.ToolCallTracker.for_request(req, lambda _: _CutParser(args)))
    calls.step(0, "<call>", [1], None)
    assert calls.step(0, "", [], "stop")[2] == reason
    assert calls.calls(0)[0]["function"]["arguments"] == args
    assert calls.text_instead(0) == (None if reason == "tool_calls" else "<call>")


@pytest.mark.parametrize("body", [
    {"choices": "abc"},
    {"choices": [{"index": 0, "finish_reason": "stop", "message": {
        "role": "assistant", "content": None, "tool_calls": "notalist"}}]},
    {"choices": [{"index": "zero", "finish_reason": "stop", "message": {
        "role": "assistant", "content": "hi"}}]},
    {"choices": [{"index": 0, "finish_reason": "stop", "message": None}]},
    {"choices": [{"index": 0, "finish_reason": "stop", "message": {
        "role": "assistant", "content": "hi"}}], "usage": {"prompt_tokens": "abc"}},
    {"choices": [{"index": 0, "finish_reason": "stop", "message": {
        "role": "assistant", "content": "hi"}}], "usage": [1, 2]},
])
def test_an_answer_of_another_shape_is_not_captured(body: dict[str, Any]) -> None:
    """(An upstream's.) It was stored, and each replay failed on it: a 500 for that
    prompt until the entry expired; some failed the capture itself with a 500."""
    assert E.capture_body(body, "chat") is None


def test_a_request_that_can_call_no_tool_has_no_tracker_to_step() -> None:
    """No `tools`, or `tool_choice: none`: the answer is text, stepped by no tracker (one
    per chunk cost the stream's hot path); tools that may be called keep theirs."""
    from proxy.preparing import prepare_chat
    from tests.fakes import FakeEngine
    assert prepare_chat(FakeEngine(), chat()).tracker is None
    assert prepare_chat(FakeEngine(), chat(tools=[WEATHER], tool_choice="none")).tracker is None
    for choice in ("auto", "required"):
        made = prepare_chat(FakeEngine(), chat(tools=[WEATHER], tool_choice=choice)).tracker
        assert made is not None and made().mode in ("text", "forced")
