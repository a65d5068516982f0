"""A chat answer as Responses output items, whole and streamed: the same items, with the
same statuses, either way."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from proxy.errors import InvalidRequest
from proxy.openai_responses import translate as X
from proxy.openai_responses.events import Rendering
from proxy.openai_responses.models import ResponsesRequest
from tests.openai_spec import validate

CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


def chunk(delta: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
    return {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": reason}]}


async def chunks_of(message: dict[str, Any], reason: str) -> AsyncIterator[dict[str, Any]]:
    yield chunk({"role": "assistant", "content": message.get("content") or ""})
    for i, c in enumerate(message.get("tool_calls") or []):
        yield chunk({"tool_calls": [{"index": i, **c}]})
    yield chunk({}, reason)


async def streamed(message: dict[str, Any], reason: str) -> dict[str, Any]:
    req = ResponsesRequest.model_validate({"model": "m", "input": "hi"})
    done: list[dict[str, Any]] = []

    async def on_done(response: dict[str, Any]) -> None:
        done.append(response)

    events = [e async for e in Rendering(req, "resp_1").events(chunks_of(message, reason),
                                                              on_done)]
    assert done and events[-1]["response"] == done[0]
    return done[0]


def shape(items: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(it["type"], it["status"]) for it in items]


@pytest.mark.parametrize("reason", ["length", "stop", "tool_calls"])
@pytest.mark.parametrize("message", [
    {"content": "Let me look.", "tool_calls": [CALL]},
    {"content": "Let me look.", "tool_calls": [CALL, {**CALL, "id": "call_2"}]},
    {"content": "Just text."},
    {"content": None, "tool_calls": [CALL]},
])
async def test_whole_and_streamed_items_agree(message: dict[str, Any], reason: str) -> None:
    """Cut at the token limit, only the last item is `incomplete`: the items before it
    ended (the stream closes each as the next begins). The whole answer marked every
    item `incomplete`."""
    whole = X.output_items(message, reason)
    final = await streamed(message, reason)
    assert shape(whole) == shape(final["output"])
    statuses = [it["status"] for it in whole]
    if reason == "length":
        assert statuses == ["completed"] * (len(whole) - 1) + ["incomplete"]
    else:
        assert set(statuses) == {"completed"}
    body = X.response_from_chat(
        ResponsesRequest.model_validate({"model": "m", "input": "hi"}),
        {"choices": [{"message": message, "finish_reason": reason}],
         "usage": {"prompt_tokens": 3, "completion_tokens": 5}}, id="resp_1", created_at=1)
    validate("Response", body)
    assert body["status"] == final["status"]


def _call(cid: str) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": "f", "arguments": "{}"}}


@pytest.mark.parametrize("order", ["grouped", "interleaved"])
def test_a_stored_turns_calls_sent_again_with_their_outputs_are_that_turn(order: str) -> None:
    """After `previous_response_id`, the stored response's calls sent again with their
    outputs, grouped or each before its output, answer the stored turn (interleaved,
    the second call was taken for a new turn, and the stored one as unanswered: a 400)."""
    history = [{"role": "user", "content": "hi"},
               {"role": "assistant", "content": None, "tool_calls": [_call("a"), _call("b")]}]
    fc = {i: {"type": "function_call", "call_id": i, "name": "f", "arguments": "{}"}
          for i in "ab"}
    fco = {i: {"type": "function_call_output", "call_id": i, "output": i.upper()}
           for i in "ab"}
    items = ([fc["a"], fc["b"], fco["a"], fco["b"]] if order == "grouped"
             else [fc["a"], fco["a"], fc["b"], fco["b"]])
    req = ResponsesRequest.model_validate({"model": "m", "input": items})
    chat, conversation = X.chat_request(req, history)
    assert conversation == [*history, {"role": "tool", "tool_call_id": "a", "content": "A"},
                            {"role": "tool", "tool_call_id": "b", "content": "B"}]
    assert [m.role for m in chat.messages] == ["user", "assistant", "tool", "tool"]


def test_a_new_call_after_the_stored_turns_outputs_is_a_new_turn() -> None:
    history = [{"role": "user", "content": "hi"},
               {"role": "assistant", "content": None, "tool_calls": [_call("a")]}]
    req = ResponsesRequest.model_validate({"model": "m", "input": [
        {"type": "function_call_output", "call_id": "a", "output": "A"},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "C"}]})
    _, conversation = X.chat_request(req, history)
    assert [m["role"] for m in conversation[2:]] == ["tool", "assistant", "tool"]


def test_a_stored_turns_calls_sent_again_with_its_cut_one_tell_that_ones_output_so() -> None:
    """A response whose end cut its second call (`incomplete`: kept out of its
    conversation) and whose calls an agent loop sends again, grouped as its output
    listed them, with an output each: the 400 said the kept call had no output (it has
    one); it names the cut call and says it was cut."""
    history = [{"role": "user", "content": "hi"},
               {"role": "assistant", "content": None, "tool_calls": [_call("a")]}]
    fc = {i: {"type": "function_call", "call_id": i, "name": "f", "arguments": "{}"}
          for i in "ab"}
    fco = {i: {"type": "function_call_output", "call_id": i, "output": i.upper()}
           for i in "ab"}
    req = ResponsesRequest.model_validate({"model": "m", "input": [
        fc["a"], fc["b"], fco["a"], fco["b"]]})
    with pytest.raises(InvalidRequest) as e:
        X.chat_request(req, history, frozenset({"b"}))
    assert e.value.param == "input" and "Function call b was cut" in str(e.value)


class _Counted(str):
    """A call id that counts the comparisons made with it."""

    made = 0

    def __eq__(self, other: object) -> bool:
        _Counted.made += 1
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        _Counted.made += 1
        return str.__ne__(self, other)

    __hash__ = str.__hash__


def _comparisons(n: int, resent: bool) -> int:
    """The call-id comparisons `chat_request` makes going on from a stored turn of `n`
    calls with their `n` outputs (`resent`: each output after its call sent again)."""
    ids = [_Counted(f"call_{i}") for i in range(n)]
    history = [{"role": "user", "content": "q"}, {"role": "assistant", "content": None,
                                                   "tool_calls": [{**CALL, "id": c}
                                                                  for c in ids]}]
    items: list[dict[str, Any]] = []
    for i in range(n):
        if resent:
            items.append({"type": "function_call", "call_id": f"call_{i}", "name": "f",
                          "arguments": "{}"})
        items.append({"type": "function_call_output", "call_id": f"call_{i}", "output": "x"})
    req = ResponsesRequest.model_validate({"model": "m", "input": items})
    _Counted.made = 0
    X.chat_request(req, history)
    return _Counted.made


@pytest.mark.parametrize("resent", [False, True])
def test_checking_a_turns_outputs_grows_with_them_not_with_their_square(resent: bool) -> None:
    """Each output was checked against every call still open, and each call sent again
    against every output kept: a 4 MB input of calls and outputs held the event loop for
    tens of seconds. The work is linear: twice the calls, about twice the comparisons."""
    assert _comparisons(400, resent) <= 2.5 * max(_comparisons(200, resent), 1)


class _Copied(str):
    """An item's text that counts the characters copied to put text before it."""

    copied = 0

    def __radd__(self, other: str) -> str:
        _Copied.copied += len(other)
        return other + str(self)


def test_assistant_text_after_a_call_is_joined_once_not_copied_item_by_item() -> None:
    """Assistant text after a call joins the call's turn; each item's text was added to
    what the turn held, copying it again: a 4 MB input of such items held the event loop
    for seconds. The texts are joined once."""
    from proxy.openai_responses.models import FunctionCallItem, MessageItem

    n = 200
    items: list[Any] = [
        FunctionCallItem(type="function_call", call_id="c", name="f", arguments="{}"),
        *(MessageItem.model_construct(type="message", role="assistant",
                                      content=_Copied("text ")) for _ in range(n))]
    _Copied.copied = 0
    [turn] = X.input_messages(items)
    assert turn["content"] == "text " * n and len(turn["tool_calls"]) == 1
    assert _Copied.copied <= len(turn["content"])


async def _events_of(*chunks: dict[str, Any]) -> list[dict[str, Any]]:
    async def source() -> AsyncIterator[dict[str, Any]]:
        for c in chunks:
            yield c

    async def on_done(response: dict[str, Any]) -> None:
        pass

    req = ResponsesRequest.model_validate({"model": "m", "input": "hi"})
    return [e async for e in Rendering(req, "resp_1").events(source(), on_done)]


def _args(arguments: str, **head: Any) -> dict[str, Any]:
    return chunk({"tool_calls": [{"index": 0, **head, "function": {
        **({"name": "f"} if head else {}), "arguments": arguments}}]})


@pytest.mark.parametrize("reason", ["tool_calls", "length"])
async def test_text_while_a_call_is_open_does_not_close_it_before_its_arguments_end(
        reason: str) -> None:
    """A tool parser may send text while a call is under way and that call's last
    arguments after it (vLLM's parsers hold a call's tail back until the answer ends).
    The text closed the call: its `arguments.done` and `output_item.done` said half its
    arguments, and its last `arguments.delta` came after them. The text is held until
    the call ends, and goes out as the message after it."""
    events = await _events_of(chunk({"role": "assistant", "content": ""}),
                              _args('{"x": ', id="call_1", type="function"),
                              chunk({"content": "done"}),
                              chunk({"content": "."}),
                              _args("1}"), chunk({}, reason))
    for e in events:
        validate("ResponseStreamEvent", e)
    final = events[-1]["response"]
    call, message = final["output"]
    assert call["arguments"] == '{"x": 1}' and message["content"][0]["text"] == "done."
    closed: set[int] = set()
    for e in events:  # nothing of an item after its `output_item.done`
        assert e.get("output_index") not in closed, e
        if e["type"] == "response.output_item.done":
            closed.add(e["output_index"])
            assert e["item"] == final["output"][e["output_index"]]
    done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    assert done["arguments"] == '{"x": 1}'
    assert [it["status"] for it in final["output"]] == (
        ["completed", "incomplete"] if reason == "length" else ["completed", "completed"])


async def test_text_held_behind_a_call_is_kept_when_the_stream_ends_without_a_reason() -> None:
    """A stream that ends with no finish reason (an upstream server that sends none)
    after text held behind an open call: the text is the message after the call, not
    dropped from the events and the stored response."""
    events = await _events_of(chunk({"role": "assistant", "content": ""}),
                              _args('{"x": 1}', id="call_1", type="function"),
                              chunk({"content": "after"}))
    for e in events:
        validate("ResponseStreamEvent", e)
    call, message = events[-1]["response"]["output"]
    assert call["arguments"] == '{"x": 1}' and message["content"][0]["text"] == "after"
    assert [e["delta"] for e in events if e["type"] == "response.output_text.delta"] == [
        "after"]


@pytest.mark.parametrize("message", [
    {"content": "", "tool_calls": []}, {"content": "Just text."},
    {"content": None, "tool_calls": [CALL]}])
def test_a_known_order_changes_nothing_without_both_text_and_calls(
        message: dict[str, Any]) -> None:
    """The order a tool parser saw (`Completion.order`) only places text around calls: an
    empty answer is still its one empty message."""
    order: list[str | int] = [message["content"]] if message.get("content") else []
    order += list(range(len(message.get("tool_calls") or [])))
    assert shape(X.output_items(message, "stop", order)) == shape(
        X.output_items(message, "stop"))


def test_an_ended_responses_calls_and_text_are_told_again_as_a_run_tells_them() -> None:
    """`replay.replayed`: a record's message and call, each added, its text or arguments
    in one delta, done; a call a failure cut is done without its arguments' `.done` (as
    the run's own events were)."""
    from proxy.openai_responses import replay
    from proxy.openai_responses import translate as X
    from tests.openai_spec import validate

    msg = X.message_item("Let me look.", "completed", "msg_1")
    call = X.call_item("call_1", "lookup", '{"q": "x"}', "completed", "fc_1")
    response = {"id": "resp_1", "object": "response", "created_at": 1, "status": "completed",
                "completed_at": 2, "error": None, "incomplete_details": None,
                "instructions": None, "max_output_tokens": None, "model": "m",
                "output": [msg, call], "parallel_tool_calls": True,
                "previous_response_id": None, "store": True, "background": True,
                "temperature": 1.0, "top_p": 1.0, "text": {"format": {"type": "text"}},
                "tool_choice": "auto", "tools": [], "truncation": "disabled", "metadata": {},
                "usage": {"input_tokens": 3, "input_tokens_details": {"cached_tokens": 0,
                                                                  "cache_write_tokens": 0},
                          "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 0},
                          "total_tokens": 8}}
    validate("Response", response)
    events = replay.replayed(response)
    for e in events:
        validate("ResponseStreamEvent", e)
    assert [e["type"] for e in events] == [
        "response.created", "response.queued", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed"]
    assert [e["item"] for e in events if e["type"] == "response.output_item.done"] == [
        msg, call]
    cut = {**response, "status": "failed", "completed_at": None,
           "error": {"code": "server_error", "message": "The engine failed."},
           "output": [msg, {**call, "status": "incomplete"}]}
    events = replay.replayed(cut)
    for e in events:
        validate("ResponseStreamEvent", e)
    types = [e["type"] for e in events]
    assert "response.function_call_arguments.done" not in types
    assert types[-2:] == ["error", "response.failed"]
    # a record its replica left under way (read `failed` once its lease lapsed)
    lapsed = {**cut, "output": [{**msg, "status": "in_progress"}]}
    types = [e["type"] for e in replay.replayed(lapsed)]
    assert "response.output_text.done" not in types and "response.output_item.done" in types
