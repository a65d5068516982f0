"""End to end: tool calling on /v1/chat/completions with the real engine (the random
demo model) through the official SDK, and a small agent (openai-agents) with two tools.

Forced choices (`required`, a named function) are structured output built from the
tools' schemas, so even the random model answers valid calls. Parameters are enums, so
its arguments stay short; `auto` without a configured parser answers text.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any, Literal

import jsonschema
import openai
import pydantic
import pytest

from tests.e2e.conftest import MODEL
from tests.e2e.server import WeirProcess, e2e_config
from tests.e2e.server import sdk as sdk_client
from tests.openai_spec import validate

KEY = "sk-tools"
WEATHER_PARAMS = {"type": "object", "additionalProperties": False, "required": ["city"],
                  "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}}}
TIME_PARAMS = {"type": "object", "additionalProperties": False, "required": ["zone"],
               "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}}}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                      "parameters": WEATHER_PARAMS}},
    {"type": "function", "function": {"name": "get_time", "description": "Time",
                                      "parameters": TIME_PARAMS}},
]
SCHEMAS = {"get_weather": WEATHER_PARAMS, "get_time": TIME_PARAMS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED: Any = {"type": "function", "function": {"name": "get_time"}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WeirProcess]:
    cfg = e2e_config(auth={"mode": "keys", "keys": [{"key": KEY, "tenant": "tools"}]},
                     plugins=[{"name": "cache", "config": {}}])
    proc = WeirProcess(tmp_path_factory.mktemp("weir-tools"), cfg).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def sdk(server: WeirProcess) -> openai.OpenAI:
    return sdk_client(server.url, KEY)  # type: ignore[no-any-return]


def _check_calls(calls: Any, names: set[str]) -> None:
    assert calls
    for c in calls:
        assert c.type == "function" and c.id and c.function.name in names
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])


def _create(sdk: openai.OpenAI, **kw: Any) -> Any:
    raw = sdk.chat.completions.with_raw_response.create(
        model=MODEL, messages=kw.pop("messages", ASK), tools=TOOLS,
        max_tokens=kw.pop("max_tokens", 200), temperature=0, **kw)
    body = raw.parse()
    validate("CreateChatCompletionResponse", json.loads(raw.text))
    return body, raw.headers.get("x-weir-cache")


def _stream(sdk: openai.OpenAI, **kw: Any) -> tuple[str, dict[int, dict[str, Any]], str | None]:
    text, calls, reason = "", {}, None
    for chunk in sdk.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS,
                                             max_tokens=kw.pop("max_tokens", 200),
                                             temperature=0, stream=True, **kw):
        validate("CreateChatCompletionStreamResponse", chunk.model_dump(exclude_unset=True))
        for ch in chunk.choices:
            text += ch.delta.content or ""
            for d in ch.delta.tool_calls or []:
                call = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
                if d.id:
                    assert call["id"] is None, "id only on a call's first delta"
                    call["id"] = d.id
                    assert d.function and d.function.name
                call["name"] += (d.function.name or "") if d.function else ""
                call["arguments"] += (d.function.arguments or "") if d.function else ""
            reason = ch.finish_reason or reason
    return text, calls, reason


@pytest.mark.parametrize("choice", ["required", NAMED])
def test_forced_choice_whole_returns_valid_calls(sdk: openai.OpenAI, choice: Any) -> None:
    body, _ = _create(sdk, tool_choice=choice, parallel_tool_calls=False)
    choice0 = body.choices[0]
    # a named function's call ends with stop, as on OpenAI (and vLLM's server)
    assert choice0.finish_reason == ("stop" if isinstance(choice, dict) else "tool_calls")
    assert choice0.message.content is None
    names = {"get_time"} if isinstance(choice, dict) else set(SCHEMAS)
    _check_calls(choice0.message.tool_calls, names)
    assert len(choice0.message.tool_calls) == 1


@pytest.mark.parametrize("choice", ["required", NAMED])
def test_forced_choice_streamed_returns_valid_calls(sdk: openai.OpenAI, choice: Any) -> None:
    text, calls, reason = _stream(sdk, tool_choice=choice, parallel_tool_calls=False)
    # a named function's call ends with stop, as on OpenAI (and vLLM's server)
    assert reason == ("stop" if isinstance(choice, dict) else "tool_calls") and text == ""
    assert len(calls) == 1
    call = calls[0]
    assert call["id"] and call["name"] in SCHEMAS
    jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])


def test_required_with_a_pydantic_tool_that_nests_models(sdk: openai.OpenAI) -> None:
    """pydantic writes a nested model as a reference to the schema's own `$defs`; under
    `required` it was a 400 (vLLM could not resolve `#/$defs/Address` in the combined
    schema). The SDK's own `pydantic_function_tool`, and a second tool beside it."""

    class Address(pydantic.BaseModel):  # enums: the random model's answers stay short
        city: Literal["Rome", "Oslo"]

    class Person(pydantic.BaseModel):
        name: Literal["Ann", "Bo"]
        address: Address

    person = openai.pydantic_function_tool(Person, name="save_person")
    completion = sdk.chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": "Ann lives in Rome."}],
        tools=[person, {"type": "function", "function": {**TOOLS[0]["function"],
                                                          "strict": True}}],
        tool_choice="required", parallel_tool_calls=False,
        max_tokens=120, temperature=0)
    calls = completion.choices[0].message.tool_calls
    assert completion.choices[0].finish_reason == "tool_calls" and len(calls) == 1
    if calls[0].function.name == "save_person":
        Person.model_validate_json(calls[0].function.arguments)
    else:
        jsonschema.validate(json.loads(calls[0].function.arguments), WEATHER_PARAMS)


@pytest.mark.parametrize("choice", ["auto", "none"])
def test_auto_without_a_parser_and_none_answer_text(sdk: openai.OpenAI, choice: str) -> None:
    body, _ = _create(sdk, tool_choice=choice, max_tokens=8)
    assert body.choices[0].message.tool_calls is None
    assert body.choices[0].finish_reason in ("stop", "length")
    text, calls, reason = _stream(sdk, tool_choice=choice, max_tokens=8)
    assert text
    assert calls == {} and reason in ("stop", "length")


def test_start_up_says_auto_answers_text(server: WeirProcess) -> None:
    assert "no engine.tool_parser configured" in server.log_text()


def test_two_step_tool_loop(sdk: openai.OpenAI) -> None:
    body, _ = _create(sdk, tool_choice="required", parallel_tool_calls=False)
    call = body.choices[0].message.tool_calls[0]
    messages: Any = [*ASK, body.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21C"}]
    answer, _ = _create(sdk, messages=messages, max_tokens=12)
    assert answer.choices[0].message.tool_calls is None
    assert answer.choices[0].message.content


def test_a_cached_tool_call_replays_as_calls(sdk: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Time in Rome, cached?"}]
    first, layer = _create(sdk, messages=messages, tool_choice=NAMED)
    again, layer2 = _create(sdk, messages=messages, tool_choice=NAMED)
    assert (layer, layer2) == ("miss", "exact")
    before = [c.model_dump() for c in first.choices[0].message.tool_calls]
    replayed = [c.model_dump() for c in again.choices[0].message.tool_calls]
    assert [c["function"] for c in replayed] == [c["function"] for c in before]
    # The replay's calls have ids of their own (a client matches results to them).
    assert {c["id"] for c in replayed}.isdisjoint(c["id"] for c in before)
    assert again.choices[0].finish_reason == first.choices[0].finish_reason == "stop"


def test_bad_tool_input_is_a_400_naming_the_param(sdk: openai.OpenAI) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice.function.name"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": 7}}}]}, "tools[0].function.parameters"),
    ]
    for extra, param in cases:
        with pytest.raises(openai.BadRequestError) as e:
            sdk.chat.completions.create(model=MODEL, messages=ASK, **{"tools": TOOLS, **extra})
        assert e.value.body["param"] == param  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as e:
        sdk.chat.completions.create(model=MODEL, messages=ASK, tool_choice="required")
    assert e.value.body["param"] == "tool_choice"  # type: ignore[index]


def test_an_agent_with_two_function_tools(server: WeirProcess) -> None:
    # Arguments are enums: the random model's free strings would run to the token limit.
    agents = pytest.importorskip("agents")
    calls: list[str] = []

    @agents.function_tool
    def get_weather(city: Literal["Paris", "Rome"]) -> str:
        """Weather of a city."""
        calls.append(f"weather:{city}")
        return "Sunny"

    @agents.function_tool
    def get_time(zone: Literal["UTC", "CET"]) -> str:
        """Time in a zone."""
        calls.append(f"time:{zone}")
        return "12:00"

    agents.set_tracing_disabled(True)

    async def run() -> Any:
        async with openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0,
                                      timeout=120) as client:
            return await agents.Runner.run(agent(client), "Weather in Paris?", max_turns=2)

    def agent(client: openai.AsyncOpenAI) -> Any:
        return agents.Agent(
            name="assistant", instructions="Use the tools.", tools=[get_weather, get_time],
            model=agents.OpenAIResponsesModel(model=MODEL, openai_client=client),
            # The model must call a tool (the random model would never stop talking), and
            # the tool's result is the agent's answer.
            model_settings=agents.ModelSettings(tool_choice="required",
                                                parallel_tool_calls=False, max_tokens=64,
                                                temperature=0),
            tool_use_behavior="stop_on_first_tool")

    result = asyncio.run(run())
    assert len(calls) == 1 and calls[0] in ("weather:Paris", "weather:Rome", "time:UTC",
                                            "time:CET")
    assert result.final_output == ("Sunny" if calls[0].startswith("weather") else "12:00")


def _auto_request(tools: list[dict[str, Any]]) -> Any:
    """What the tracker reads of a chat request with `tools` in `auto` (the tools as the
    parser adapter takes them: dicts)."""
    return type("Req", (), {"tools": tools, "tool_choice": "auto",
                            "parallel_tool_calls": None, "tool_dicts": lambda self: tools})()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # vllm's and torch's imports
def test_a_vllm_parser_s_call_to_a_function_not_offered_is_dropped() -> None:
    """vLLM's hermes parser hands on a call to any name the model writes; the tracker
    keeps only calls of the tools offered (the first call here is made up), numbered
    from 0 (no server: the demo tokenizer)."""
    from transformers import AutoTokenizer

    from proxy.engine.demo_model import ensure_demo_model
    from proxy.engine.vllm import _tool_parser_class, _ToolParserAdapter
    from proxy.tools import CallAssembler, ToolCallTracker

    tok = AutoTokenizer.from_pretrained(str(ensure_demo_model()))
    tools = list(TOOLS)
    cls = _tool_parser_class("hermes", tok)
    assert cls is not None
    req = _auto_request(tools)
    for text, names in (
            ('<tool_call>{"name": "launch", "arguments": {"n": 1}}</tool_call>', []),
            ('<tool_call>{"name": "launch", "arguments": {"n": 1}}</tool_call>\n<tool_call>'
             '{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>',
             ["get_weather"])):
        tracker = ToolCallTracker.for_request(
            req, lambda t: _ToolParserAdapter(cls, tok, t))
        assembler, streamed = CallAssembler(), ""
        for i in range(0, len(text), 3):
            piece, deltas, _ = tracker.step(text[i:i + 3], [0], None)
            streamed += piece or ""
            assembler.feed(deltas)
        piece, deltas, reason = tracker.step("", [], "stop")
        assembler.feed(deltas)
        assert [c["function"]["name"] for c in assembler.result()] == names
        assert sorted(assembler.calls) == list(range(len(names)))  # (numbered from 0)
        assert reason == ("tool_calls" if names else "stop")
        assert "launch" not in streamed + (piece or "")


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # vllm's and torch's imports
def test_a_vllm_parser_s_call_with_arguments_no_json_object_is_text_whole() -> None:
    """vLLM's hermes parser streams arguments as the model wrote them: a JSON string, or
    text that is no JSON, is sent as it came, the answer ending with `stop`; the whole
    answer is the model's text (no server: the demo tokenizer)."""
    from transformers import AutoTokenizer

    from proxy.engine.demo_model import ensure_demo_model
    from proxy.engine.vllm import _tool_parser_class, _ToolParserAdapter
    from proxy.tools import StreamCalls, ToolCallTracker

    tok = AutoTokenizer.from_pretrained(str(ensure_demo_model()))
    cls = _tool_parser_class("hermes", tok)
    assert cls is not None
    req = _auto_request(list(TOOLS))
    for args, text_instead in (('{"city": "Paris"}', False), ('"Paris"', True),
                               ('{"city": Paris}', True)):
        text = f'Sure. <tool_call>{{"name": "get_weather", "arguments": {args}}}</tool_call>'
        calls = StreamCalls(lambda: ToolCallTracker.for_request(
            req, lambda t: _ToolParserAdapter(cls, tok, t)))
        for i in range(0, len(text), 3):
            calls.step(0, text[i:i + 3], [0], None)
        reason = calls.step(0, "", [], "stop")[2]
        (call,) = calls.calls(0)
        # (this vLLM streams the cut call's closing brace too: `{"city": Paris}}`)
        assert call["function"]["arguments"].startswith(args)
        assert reason == ("stop" if text_instead else "tool_calls")
        assert calls.text_instead(0) == (text if text_instead else None)


def test_vllms_tool_parsers_read_their_syntax_whole_and_streamed() -> None:
    """The engine's adapter over vLLM's own parsers (no server: the demo tokenizer)."""
    from transformers import AutoTokenizer

    from proxy.engine.demo_model import ensure_demo_model
    from proxy.engine.vllm import _tool_parser_class, _ToolParserAdapter
    from proxy.tools import CallAssembler, ToolCallTracker

    tok = AutoTokenizer.from_pretrained(str(ensure_demo_model()))
    tools = list(TOOLS)
    outputs = {"hermes": ('Sure. <tool_call>{"name": "get_weather", "arguments": '
                          '{"city": "Paris"}}</tool_call>', "Sure."),
               "pythonic": ('[get_weather(city="Paris")]', "")}
    for name, (text, content) in outputs.items():
        cls = _tool_parser_class(name, tok)
        assert cls is not None
        req = _auto_request(tools)
        tracker = ToolCallTracker.for_request(
            req, lambda t, cls=cls: _ToolParserAdapter(cls, tok, t))
        assembler, streamed = CallAssembler(), ""
        for i in range(0, len(text), 3):
            piece, deltas, _ = tracker.step(text[i:i + 3], [0], None)
            streamed += piece or ""
            assembler.feed(deltas)
        _, deltas, reason = tracker.step("", [], "stop")
        assembler.feed(deltas)
        (call,) = assembler.result()
        assert call["function"]["name"] == "get_weather" and call["id"]
        assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
        assert reason == "tool_calls" and streamed.strip() == content
        # an answer that began like a call and was cut before one: streamed, the text
        # comes out (as the whole answer's content)
        cut = text[: text.index("get_weather") + 3]  # before a name is whole
        tracker = ToolCallTracker.for_request(
            req, lambda t, cls=cls: _ToolParserAdapter(cls, tok, t))
        pieces = [tracker.step(cut[i:i + 3], [0], None) for i in range(0, len(cut), 3)]
        pieces.append(tracker.step("", [], "length"))
        assert not any(d for _, d, _ in pieces)
        assert "".join(p or "" for p, _, _ in pieces) == cut
        if name == "hermes":  # cut after the name: a call, with no made-up "{}" arguments
            cut = text[: text.index('"arguments"')]
            tracker = ToolCallTracker.for_request(
                req, lambda t, cls=cls: _ToolParserAdapter(cls, tok, t))
            assembler = CallAssembler()
            for i in range(0, len(cut), 3):
                assembler.feed(tracker.step(cut[i:i + 3], [0], None)[1])
            assembler.feed(tracker.step("", [], "length")[1])
            (call,) = assembler.result()
            assert call["function"] == {"name": "get_weather", "arguments": ""}
            # a call the model closed with no arguments has {}, and is a call
            closed = '<tool_call>{"name": "get_time"}</tool_call>'
            tracker = ToolCallTracker.for_request(
                req, lambda t, cls=cls: _ToolParserAdapter(cls, tok, t))
            assembler = CallAssembler()
            for i in range(0, len(closed), 3):
                assembler.feed(tracker.step(closed[i:i + 3], [0], None)[1])
            _, deltas, reason = tracker.step("", [], "stop")
            assembler.feed(deltas)
            (call,) = assembler.result()
            assert call["function"] == {"name": "get_time", "arguments": "{}"}
            assert reason == "tool_calls"
    with pytest.raises(ValueError, match="unknown parser `nope`"):
        _tool_parser_class("nope", tok)
    with pytest.raises(ValueError, match="does not fit this model"):
        _tool_parser_class("llama3_json", tok)  # needs <|python_tag|>, which it lacks
