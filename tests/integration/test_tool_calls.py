"""Tool calls on /v1/chat/completions over the fake engine: forced choices (the fake
engine honours the JSON schema, as structured output does), a configured parser for
`auto`, text otherwise; whole and streamed agree; the cache replays calls as calls."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import MakeClient, make_settings
from tests.fakes import FakeEngine
from tests.openai_spec import validate
from tests.sse import parse_sse

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "required": ["city"],
                                          "properties": {"city": {"type": "string"}}}}}
TIME = {"type": "function", "function": {"name": "get_time"}}
BASE: dict[str, Any] = {"model": "fake-model", "max_tokens": 64, "tools": [WEATHER, TIME],
                        "messages": [{"role": "user", "content": "weather in Paris?"}]}
SCRIPT = 'Checking. <call>{"name": "get_weather", "arguments": {"city": "Paris"}}</call>'


def assemble(events: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]], list[str]]:
    """(content, whole calls, finish reasons) of a stream, checking OpenAI's shapes."""
    content, calls, reasons = "", {}, []
    for e in events:
        validate("CreateChatCompletionStreamResponse", e)
        for c in e["choices"]:
            content += c["delta"].get("content") or ""
            for d in c["delta"].get("tool_calls") or []:
                if d["index"] not in calls:
                    assert d["id"] and d["type"] == "function" and d["function"]["name"], (
                        "id, type and name come on a call's first delta")
                    calls[d["index"]] = {"id": d["id"], "type": "function",
                                         "function": {"name": "", "arguments": ""}}
                else:
                    assert "id" not in d
                fn = d.get("function") or {}
                calls[d["index"]]["function"]["name"] += fn.get("name") or ""
                calls[d["index"]]["function"]["arguments"] += fn.get("arguments") or ""
            if c["finish_reason"]:
                reasons.append(c["finish_reason"])
    return content, [calls[i] for i in sorted(calls)], reasons


def sdk_done_calls(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(name, arguments) of each call the official SDK's stream helper reports done
    (`tool_calls.function.arguments.done`), fed the stream's chunks."""
    from openai.lib.streaming.chat import ChatCompletionStreamState
    from openai.types.chat import ChatCompletionChunk

    state: Any = ChatCompletionStreamState()
    done = []
    for e in events:
        for ev in state.handle_chunk(ChatCompletionChunk.model_validate(e)):
            if ev.type == "tool_calls.function.arguments.done":
                done.append((ev.name, ev.arguments))
    return done


async def test_required_whole_and_streamed(make_client: MakeClient) -> None:
    client = await make_client()
    body = await (await client.post("/v1/chat/completions",
                                    json={**BASE, "tool_choice": "required"})).json()
    validate("CreateChatCompletionResponse", body)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city":"x"}'}
    r = await client.post("/v1/chat/completions",
                          json={**BASE, "tool_choice": "required", "stream": True})
    events, done = parse_sse(await r.text())
    content, calls, reasons = assemble(events)
    assert done and content == "" and reasons == ["tool_calls"]
    assert [c["function"] for c in calls] == [call["function"]]
    # (the finish reason comes in a chunk of its own, as OpenAI sends it: beside the
    # last deltas, the SDK's helper never said the call was done)
    assert sdk_done_calls(events) == [("get_weather", '{"city":"x"}')]


async def test_a_forced_call_has_no_content_logprobs_whole_or_streamed(
        make_client: MakeClient) -> None:
    """The constrained JSON is no content (`required`'s is Weir's own wrapper): its
    tokens' logprobs are not shown, whole or streamed; a text answer keeps them."""
    client = await make_client()
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        ask = {**BASE, "tool_choice": choice, "logprobs": True, "top_logprobs": 2}
        body = await (await client.post("/v1/chat/completions", json=ask)).json()
        validate("CreateChatCompletionResponse", body)
        assert body["choices"][0]["logprobs"] == {"content": None, "refusal": None}
        r = await client.post("/v1/chat/completions", json={**ask, "stream": True})
        events, done = parse_sse(await r.text())
        assert done and not any(c.get("logprobs") for e in events for c in e["choices"])
    text = {**BASE, "tool_choice": "none", "logprobs": True}
    body = await (await client.post("/v1/chat/completions", json=text)).json()
    assert body["choices"][0]["logprobs"]["content"]


async def test_logprobs_of_held_back_text_go_out_with_it(make_client: MakeClient) -> None:
    """Steps whose text the parser holds back send nothing; their logprob entries go out
    with the text when it comes (they were dropped: the tokens no longer joined to the
    content)."""
    engine = FakeEngine(tool_parser=True)
    engine.script = "Sure <not a call after all> done."
    client = await make_client(engine=engine)
    r = await client.post("/v1/chat/completions",
                          json={**BASE, "stream": True, "logprobs": True, "max_tokens": 64})
    events, done = parse_sse(await r.text())
    content = "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
    tokens = "".join(t["token"] for e in events for c in e["choices"]
                     for t in ((c.get("logprobs") or {}).get("content") or []))
    assert done and content == engine.script and tokens == content


async def test_named_function(make_client: MakeClient, fake_engine: FakeEngine) -> None:
    client = await make_client()
    body = await (await client.post("/v1/chat/completions", json={
        **BASE, "tool_choice": {"type": "function", "function": {"name": "get_time"}}})).json()
    assert fake_engine.calls[0][1].json_schema == {"type": "object", "properties": {}}
    assert body["choices"][0]["message"]["tool_calls"][0]["function"] == {
        "name": "get_time", "arguments": "{}"}
    # OpenAI ends a named function's call with stop (`tool_calls` is for auto/required)
    assert body["choices"][0]["finish_reason"] == "stop"


async def test_auto_with_a_parser_whole_and_streamed(make_client: MakeClient) -> None:
    engine = FakeEngine(tool_parser=True)
    engine.script = SCRIPT
    client = await make_client(engine=engine)
    body = await (await client.post("/v1/chat/completions", json=BASE)).json()
    validate("CreateChatCompletionResponse", body)
    msg = body["choices"][0]["message"]
    assert msg["content"] == "Checking. "  # the text before the call, as it streams
    assert msg["tool_calls"][0]["function"] == {"name": "get_weather",
                                                "arguments": '{"city": "Paris"}'}
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    assert engine.calls[0][1].skip_special_tokens is False
    r = await client.post("/v1/chat/completions", json={**BASE, "stream": True})
    content, calls, reasons = assemble(parse_sse(await r.text())[0])
    assert content == msg["content"] and reasons == ["tool_calls"]
    assert [c["function"] for c in calls] == [msg["tool_calls"][0]["function"]]


async def test_a_call_to_a_function_not_offered_is_dropped(make_client: MakeClient) -> None:
    """`auto`: a call the model makes to a function not among `tools` never reaches the
    client (it cannot run it; OpenAI answers only calls of the tools offered), whole or
    streamed; the calls kept are numbered from 0, and `parallel_tool_calls: false` keeps
    the first of them. Its text is not content either."""
    engine = FakeEngine(tool_parser=True)
    client = await make_client(engine=engine)
    made_up = '<call>{"name": "launch_rockets", "arguments": {"n": 3}}</call>'
    weather = '<call>{"name": "get_weather", "arguments": {"city": "Paris"}}</call>'
    time = '<call>{"name": "get_time", "arguments": {}}</call>'
    for script, extra, content, names in (
            ("Sure. " + made_up, {}, "Sure. ", []),
            ("Sure. " + made_up + weather, {}, "Sure. ", ["get_weather"]),
            (made_up + weather + time, {"parallel_tool_calls": False}, "", ["get_weather"]),
            (weather + made_up + time, {}, "", ["get_weather", "get_time"])):
        engine.script = script
        ask = {**BASE, **extra}
        body = await (await client.post("/v1/chat/completions", json=ask)).json()
        validate("CreateChatCompletionResponse", body)
        choice = body["choices"][0]
        calls = choice["message"].get("tool_calls") or []
        assert [c["function"]["name"] for c in calls] == names, script
        assert (choice["message"]["content"] or "") == content, script
        assert choice["finish_reason"] == ("tool_calls" if names else "stop"), script
        r = await client.post("/v1/chat/completions", json={**ask, "stream": True})
        got, streamed, reasons = assemble(parse_sse(await r.text())[0])
        assert (got, [c["function"] for c in streamed], reasons) == (
            content, [c["function"] for c in calls], [choice["finish_reason"]]), script


async def test_an_answer_of_dropped_calls_alone_is_empty_text_whole_and_streamed(
        make_client: MakeClient) -> None:
    """An answer whose only output is a call to a function not offered (dropped) is an
    empty text answer: content "" whole, and a string in its stream too (it had no
    content at all: the SDK assembled null where the whole answer said "")."""
    engine = FakeEngine(tool_parser=True)
    client = await make_client(engine=engine)
    engine.script = '<call>{"name": "launch_rockets", "arguments": {"n": 3}}</call>'
    body = await (await client.post("/v1/chat/completions", json=BASE)).json()
    assert body["choices"][0]["message"]["content"] == ""
    r = await client.post("/v1/chat/completions", json={**BASE, "stream": True})
    events = parse_sse(await r.text())[0]
    assert assemble(events) == ("", [], ["stop"])
    assert any(isinstance(c["delta"].get("content"), str)
               for e in events for c in e["choices"])


async def test_with_a_parser_a_whole_answer_is_its_stream_assembled(
        make_client: MakeClient) -> None:
    """Wherever the parser's whole and streaming readings differ (an answer cut inside a
    call, a second call cut after a first whole one), the whole answer is what the
    stream sends: the stream cannot take back a call it sent (unless a call's arguments
    are no JSON: then the whole answer is text, below)."""
    engine = FakeEngine(tool_parser=True)
    client = await make_client(engine=engine)
    whole_call = '<call>{"name": "get_weather", "arguments": {"city": "Paris"}}</call>'
    for script in (SCRIPT, "Sure " + whole_call + '<call>{"name": "get_ti',
                   "Hmm <call>{\"name", "plain text only"):
        engine.script = script
        for max_tokens in (64, 9):
            ask = {**BASE, "max_tokens": max_tokens}
            body = await (await client.post("/v1/chat/completions", json=ask)).json()
            validate("CreateChatCompletionResponse", body)
            choice = body["choices"][0]
            r = await client.post("/v1/chat/completions", json={**ask, "stream": True})
            content, calls, reasons = assemble(parse_sse(await r.text())[0])
            assert (choice["message"]["content"] or "") == content, (script, max_tokens)
            assert [c["function"] for c in choice["message"].get("tool_calls") or []] == [
                c["function"] for c in calls], (script, max_tokens)
            assert [choice["finish_reason"]] == reasons, (script, max_tokens)


async def test_a_whole_answer_with_a_call_whose_arguments_are_no_json_is_text(
        make_client: MakeClient) -> None:
    """`auto`: where a call the parser read has arguments that are no JSON, a whole
    answer is the model's text as content, no calls, ended as the engine ended it
    (`stop`, `length`), as vLLM's server answers (its whole-answer parser fails and
    hands back the text); a valid call beside it goes too. A stream sends the call as
    it came (it cannot take it back; vLLM's sends it too) and ends with `stop` (vLLM's
    says `tool_calls`: Weir's stream already ended such a call so)."""
    engine = FakeEngine(tool_parser=True)
    client = await make_client(engine=engine)
    broken = '<call>{"name": "get_weather", "arguments": {"city": "Par}</call>'
    weather = '<call>{"name": "get_weather", "arguments": {"city": "Paris"}}</call>'
    for script, max_tokens, reason in (("Sure. " + broken, 64, "stop"),
                                       (weather + broken, 64, "stop"),
                                       ("Sure. " + broken + " and more text", 20, "length")):
        engine.script = script
        ask = {**BASE, "max_tokens": max_tokens, "logprobs": True}
        body = await (await client.post("/v1/chat/completions", json=ask)).json()
        validate("CreateChatCompletionResponse", body)
        choice = body["choices"][0]
        text = "".join(script[i:i + 4] for i in range(0, len(script), 4)[:max_tokens])
        assert choice["message"]["content"] == text and "tool_calls" not in choice[
            "message"], script
        assert choice["finish_reason"] == reason, script
        assert "".join(t["token"] for t in choice["logprobs"]["content"]) == text
        r = await client.post("/v1/chat/completions", json={**ask, "stream": True})
        _, calls, reasons = assemble(parse_sse(await r.text())[0])
        assert calls[-1]["function"] == {"name": "get_weather", "arguments": '{"city": "Par'}
        assert reasons == [reason], script


async def test_a_call_whose_arguments_are_json_but_no_object_is_no_call(
        make_client: MakeClient) -> None:
    """Arguments that are JSON but no object (a string, an array, null) are no call
    either: OpenAI's are always an object, as a function's parameters are, and vLLM's
    `required` path and several of its parsers (gigachat3, dots) refuse them (hermes
    hands them on). A whole answer is the model's text; a stream ends with `stop`."""
    engine = FakeEngine(tool_parser=True)
    client = await make_client(engine=engine)
    for args in ('"Paris"', '["Paris"]', "null", '"{\\"city\\": \\"Paris\\"}"'):
        engine.script = 'Sure. <call>{"name": "get_weather", "arguments": ' + args + "}</call>"
        body = await (await client.post("/v1/chat/completions", json=BASE)).json()
        validate("CreateChatCompletionResponse", body)
        choice = body["choices"][0]
        assert choice["message"]["content"] == engine.script, args
        assert "tool_calls" not in choice["message"] and choice["finish_reason"] == "stop"
        r = await client.post("/v1/chat/completions", json={**BASE, "stream": True})
        _, calls, reasons = assemble(parse_sse(await r.text())[0])
        assert [c["function"]["arguments"] for c in calls] == [args] and reasons == ["stop"]


async def test_a_cached_stream_with_a_call_that_is_no_json_replays_as_text(
        make_client: MakeClient) -> None:
    """What the cache keeps of such a stream is the whole answer's text: a whole answer
    replayed from it is the model's text, never the call a live one would not give."""
    engine = FakeEngine(tool_parser=True)
    engine.script = 'Sure. <call>{"name": "get_weather", "arguments": {"city": "Par}</call>'
    client = await make_client(make_settings(plugins=[{"name": "cache", "config": {
        "semantic": {"enabled": False}}}]), engine=engine)
    ask = {**BASE, "temperature": 0}
    r = await client.post("/v1/chat/completions", json={**ask, "stream": True})
    assert r.headers["x-weir-cache"] == "miss" and parse_sse(await r.text())[1]
    r = await client.post("/v1/chat/completions", json=ask)
    assert r.headers["x-weir-cache"] == "exact"
    body = await r.json()
    validate("CreateChatCompletionResponse", body)
    msg = body["choices"][0]["message"]
    assert msg["content"] == engine.script and "tool_calls" not in msg
    assert body["choices"][0]["finish_reason"] == "stop"


async def test_auto_without_a_parser_and_none_answer_text(make_client: MakeClient) -> None:
    engine = FakeEngine()
    engine.script = SCRIPT
    client = await make_client(engine=engine)
    for choice in ("auto", "none"):
        body = await (await client.post("/v1/chat/completions",
                                        json={**BASE, "tool_choice": choice})).json()
        msg = body["choices"][0]["message"]
        assert msg["content"] == SCRIPT and "tool_calls" not in msg
        assert body["choices"][0]["finish_reason"] == "stop"


class _ToolsInPrompt(FakeEngine):
    """Renders the tools' definitions into the prompt, a token a character (the fake
    engine's own render leaves them out), as a chat template writes them."""

    def render_chat(self, messages: list[dict[str, Any]], tools: Any, **kw: Any) -> list[int]:
        return super().render_chat(messages, tools, **kw) + (
            [7] * len(json.dumps(tools)) if tools else [])


async def test_a_prompt_too_long_for_its_tools_names_them(make_client: MakeClient) -> None:
    """`context_length_exceeded` names `tools` where the tool definitions alone are past
    the context, or are the larger part of the prompt; `messages` otherwise (and where
    there are no tools). The message says how many tokens each took, as OpenAI's does."""
    engine = _ToolsInPrompt(max_model_len=512)
    client = await make_client(engine=engine)

    def tool(size: int) -> dict[str, Any]:
        return {"type": "function", "function": {"name": "f", "description": "x" * size}}

    def ask(size: int) -> list[dict[str, Any]]:
        return [{"role": "user", "content": "y" * size}]

    for tools, messages, param in (
            ([tool(600)], ask(10), "tools"),  # the tools alone are past the context
            ([tool(600)], ask(800), "tools"),  # (so even beside longer messages)
            ([tool(240)], ask(240), "tools"),  # neither alone, the tools the larger part
            ([tool(200)], ask(400), "messages"),
            (None, ask(600), "messages")):
        r = await client.post("/v1/chat/completions",
                              json={**BASE, "messages": messages, "tools": tools})
        body = await r.json()
        validate("ErrorResponse", body)
        error = body["error"]
        assert r.status == 400 and error["code"] == "context_length_exceeded", error
        assert error["param"] == param, error
        assert error["type"] == "invalid_request_error"
        assert error["message"].startswith("This model's maximum context length is 512 "
                                           "tokens. However, your prompt has ")
        if tools:
            n_tools = len(json.dumps([{"type": "function", "function": t["function"]}
                                      for t in tools]))
            assert error["message"].endswith(f" in `messages`, {n_tools} in `tools`). "
                                             "Please reduce the length of `messages` or "
                                             "`tools`.")
    # the Responses API names its own params, as in its other errors
    r = await client.post("/v1/responses", json={
        "model": "fake-model", "input": "hi", "store": False,
        "tools": [{"type": "function", "name": "f", "description": "x" * 600}]})
    error = (await r.json())["error"]
    assert (r.status, error["param"], error["code"]) == (400, "tools",
                                                         "context_length_exceeded")
    assert "`input`" in error["message"] and "messages" not in error["message"]
    assert not engine.calls


async def test_tool_results_round_trip(make_client: MakeClient, fake_engine: FakeEngine) -> None:
    client = await make_client()
    first = await (await client.post("/v1/chat/completions",
                                     json={**BASE, "tool_choice": "required"})).json()
    msg = first["choices"][0]["message"]
    call = msg["tool_calls"][0]
    r = await client.post("/v1/chat/completions", json={**BASE, "max_tokens": 3, "messages": [
        *BASE["messages"], msg, {"role": "tool", "tool_call_id": call["id"], "content": "9C"}]})
    assert r.status == 200
    assert (await r.json())["choices"][0]["message"]["content"]


def without_ids(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in c.items() if k != "id"} for c in calls]


async def test_cached_calls_replay_whole_and_streamed(make_client: MakeClient) -> None:
    client = await make_client(make_settings(plugins=[{"name": "cache", "config": {}}]))
    req = {**BASE, "tool_choice": "required", "temperature": 0}
    r1 = await client.post("/v1/chat/completions", json=req)
    first = await r1.json()
    r2 = await client.post("/v1/chat/completions", json=req)
    assert (r1.headers["x-weir-cache"], r2.headers["x-weir-cache"]) == ("miss", "exact")
    again = await r2.json()
    validate("CreateChatCompletionResponse", again)
    first_calls = first["choices"][0]["message"]["tool_calls"]
    again_calls = again["choices"][0]["message"]["tool_calls"]
    assert without_ids(again_calls) == without_ids(first_calls)
    r3 = await client.post("/v1/chat/completions", json={**req, "stream": True})
    assert r3.headers["x-weir-cache"] == "exact"
    replayed = parse_sse(await r3.text())[0]
    content, calls, reasons = assemble(replayed)
    assert content == "" and reasons == ["tool_calls"]
    assert without_ids(calls) == without_ids(first_calls)
    assert sdk_done_calls(replayed) == [("get_weather", '{"city":"x"}')]
    # Every answer's calls have ids of their own (a client matches results to them).
    assert len({c["id"] for c in first_calls + again_calls + calls}) == 3 * len(first_calls)
    other = await client.post("/v1/chat/completions", json={**req, "tools": [WEATHER]})
    assert other.headers["x-weir-cache"] == "miss"
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "x"}


async def test_a_cached_answer_with_text_around_a_call_streams_back_as_it_came(
        make_client: MakeClient) -> None:
    """A parser's answer with text before and after its call, replayed from the cache as
    a chat stream in the order the model wrote it (each piece a chunk): valid chunks, the
    role once, the same content and calls as the miss, and the SDK's stream helper sees
    the call done."""
    engine = FakeEngine(tool_parser=True)
    engine.script = SCRIPT + " Done."
    client = await make_client(make_settings(plugins=[{"name": "cache", "config": {
        "semantic": {"enabled": False}}}]), engine=engine)
    ask = {**BASE, "temperature": 0, "stream": True}
    r = await client.post("/v1/chat/completions", json=ask)
    live = assemble(parse_sse(await r.text())[0])
    r = await client.post("/v1/chat/completions", json=ask)
    assert r.headers["x-weir-cache"] == "exact"
    events = parse_sse(await r.text())[0]
    replayed = assemble(events)
    assert (replayed[0], without_ids(replayed[1]), replayed[2]) == (
        live[0], without_ids(live[1]), live[2])
    assert [e["choices"][0]["delta"].get("role") for e in events].count("assistant") == 1
    assert [bool(e["choices"][0]["delta"].get("tool_calls")) for e in events] == [
        False, True, False]  # text, the call, text (with the finish reason)
    assert sdk_done_calls(events) == [("get_weather", '{"city": "Paris"}')]


@pytest.mark.parametrize("choice", ["required", {"type": "function",
                                                 "function": {"name": "get_weather"}}])
@pytest.mark.parametrize("stream", [False, True])
async def test_a_forced_call_ignores_stop_and_ends_length_when_cut(
        make_client: MakeClient, fake_engine: FakeEngine, choice: Any, stream: bool) -> None:
    """A forced call's JSON is not cut by `stop` (it ends text, not arguments: vLLM's
    server applies it and hands back a call of cut JSON); one cut at `max_tokens` ends
    with `length`, as vLLM's server and OpenAI end it, never `tool_calls` or `stop`."""
    client = await make_client()
    body = {**BASE, "tool_choice": choice, "stop": ['"', "{"], "stream": stream}
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status == 200, await r.text()
    assert fake_engine.calls[-1][1].stop == []
    if stream:
        events, done = parse_sse(await r.text())
        assert done
        _, calls, reasons = assemble(events)
    else:
        out = await r.json()
        calls = out["choices"][0]["message"]["tool_calls"]
        reasons = [out["choices"][0]["finish_reason"]]
    assert calls and all(json.loads(c["function"]["arguments"]) is not None for c in calls)
    assert reasons == ["tool_calls" if choice == "required" else "stop"]
    r = await client.post("/v1/chat/completions", json={**body, "max_tokens": 2})
    assert r.status == 200, await r.text()
    if stream:
        events, done = parse_sse(await r.text())
        assert done
        reasons = assemble(events)[2]
    else:
        reasons = [(await r.json())["choices"][0]["finish_reason"]]
    assert reasons == ["length"]
