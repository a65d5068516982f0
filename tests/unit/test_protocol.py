from __future__ import annotations

from typing import Any

import pytest

from proxy.errors import InvalidRequest
from proxy.openai_responses.models import ResponsesRequest
from proxy.preparing import prepare_chat, prepare_completion
from proxy.protocol import (
    CHAT_ENUMS,
    CHAT_UNSUPPORTED,
    LOCAL_UNSUPPORTED,
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    decode_json_object,
    parse_model,
    strict_problem,
)
from tests.fakes import FakeEngine

MSG = [{"role": "user", "content": "hi"}]


def chat(**kw: Any) -> ChatCompletionRequest:
    return parse_model(ChatCompletionRequest, {"model": "m", "messages": MSG, **kw})


def bad_param(model: type, data: dict[str, Any]) -> str | None:
    with pytest.raises(InvalidRequest) as e:
        parse_model(model, data)
    assert e.value.status == 400
    return e.value.param


@pytest.mark.parametrize(
    ("data", "param"),
    [
        ({"messages": MSG}, "model"),
        ({"model": "m"}, "messages"),
        ({"model": "m", "messages": []}, "messages"),
        ({"model": "m", "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"model": "m", "messages": MSG, "temperature": 2.5}, "temperature"),
        ({"model": "m", "messages": MSG, "top_p": -0.1}, "top_p"),
        ({"model": "m", "messages": MSG, "top_p": 1.01}, "top_p"),
        ({"model": "m", "messages": MSG, "n": 0}, "n"),
        ({"model": "m", "messages": MSG, "max_tokens": 0}, "max_tokens"),
        ({"model": "m", "messages": MSG, "presence_penalty": 3}, "presence_penalty"),
        ({"model": "m", "messages": MSG, "stop": ["x"] * 5}, "stop"),
        ({"model": "m", "messages": MSG, "top_logprobs": 21, "logprobs": True}, "top_logprobs"),
        ({"model": "m", "messages": MSG, "top_logprobs": 2}, "top_logprobs"),
        ({"model": "m", "messages": MSG, "stream_options": {"include_usage": True}},
         "stream_options"),
        ({"model": "m", "messages": MSG, "response_format": {"type": "xml"}},
         "response_format.type"),
        ({"model": "m", "messages": MSG, "response_format": {"type": "json_schema"}},
         "response_format.json_schema"),
        ({"model": "m", "messages": MSG, "logit_bias": {"5": 101}}, "logit_bias"),
        ({"model": "m", "messages": MSG, "tool_choice": {"type": "function"},
          "tools": [{"type": "function", "function": {"name": "f"}}]}, "tool_choice.function"),
        # OpenAI's 400: only with tools
        ({"model": "m", "messages": MSG, "parallel_tool_calls": False}, "parallel_tool_calls"),
    ],
)
def test_chat_errors_name_the_param(data: dict[str, Any], param: str) -> None:
    assert bad_param(ChatCompletionRequest, data) == param


def test_unknown_fields_are_accepted() -> None:
    req = chat(some_future_field={"x": 1})
    assert req.model_extra == {"some_future_field": {"x": 1}}


def test_content_parts_are_joined_line_by_line_as_vllm_joins_them() -> None:
    """vLLM's chat renderer reads a message's text parts one per line ("\\n".join): two
    parts "Hello" and "world" are not the word "Helloworld" to the model. The engine's
    prompt, the cache's key and the Responses API's input all read them so."""
    parts = [{"type": "text", "text": "Hello"}, {"type": "refusal", "refusal": "no"},
             {"type": "text", "text": "world"}]
    req = parse_model(ChatCompletionRequest, {"model": "m", "messages": [
        {"role": "assistant", "content": parts}, {"role": "user", "content": "go on"}]})
    assert req.messages[0].text() == "Hello\nno\nworld"
    one = parse_model(ChatCompletionRequest, {"model": "m", "messages": [
        {"role": "assistant", "content": "Hello\nno\nworld"},
        {"role": "user", "content": "go on"}]})
    fake = FakeEngine()
    assert prepare_chat(fake, req).prompts == prepare_chat(fake, one).prompts
    # A template that reads a message's parts itself writes them one after another:
    # vLLM hands it the parts, and the engine says so (`Engine.part_separator`).
    fake.part_separator = ""
    glued = parse_model(ChatCompletionRequest, {"model": "m", "messages": [
        {"role": "assistant", "content": "Hellonoworld"}, {"role": "user", "content": "go on"}]})
    assert prepare_chat(fake, req).prompts == prepare_chat(fake, glued).prompts
    responses = parse_model(ResponsesRequest, {"model": "m", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Hello"},
                                     {"type": "input_text", "text": "world"}]}]})
    assert not isinstance(responses.input, str)
    assert responses.input[0].text() == "Hello\nworld"  # type: ignore[union-attr]


@pytest.mark.parametrize(("role", "allowed"), [
    ("user", "'text', 'image_url', 'input_audio', and 'file'"),
    ("system", "'text'"), ("developer", "'text'"), ("tool", "'text'")])
def test_a_refusal_part_is_an_assistant_s_alone(role: str, allowed: str) -> None:
    """OpenAI's spec gives `refusal` parts to assistant messages only (an earlier
    refusal sent back): in another role's content it is a 400 naming the part, as
    OpenAI answers, not read to the model as that role's own words."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
    if role == "tool":
        messages.append({"role": "assistant", "tool_calls": [{
            "id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]})
    messages.append({"role": role, "content": [
        {"type": "text", "text": "a"}, {"type": "refusal", "refusal": "I can't."}],
        **({"tool_call_id": "c1"} if role == "tool" else {})})
    with pytest.raises(InvalidRequest) as e:
        parse_model(ChatCompletionRequest, {"model": "m", "messages": messages})
    i = len(messages) - 1
    assert (e.value.param, e.value.code) == (f"messages[{i}].content[1].type", "invalid_value")
    assert e.value.message == f"Invalid value: 'refusal'. Supported values are: {allowed}."


@pytest.mark.parametrize("role", ["user", "assistant"])
def test_an_unsupported_responses_part_names_the_parts_its_role_takes(role: str) -> None:
    """An image in an input message is refused; its hint named `output_text` and
    `refusal` to a user's message too, parts its role is refused (a 400 of their own).
    In an assistant's message an image is no part the role takes at all: OpenAI's
    "Invalid value: 'input_image'. Supported values are: 'output_text' and 'refusal'."
    (it was told images are not supported, as if they were an assistant's to send)."""
    with pytest.raises(InvalidRequest) as e:
        parse_model(ResponsesRequest, {"model": "m", "input": [{"role": role, "content": [
            {"type": "input_image", "image_url": "https://example.com/a.png"}]}]})
    assert (e.value.param, e.value.code) == ("input[0].content[0]", "invalid_value")
    if role == "assistant":
        assert e.value.message == ("Invalid value: 'input_image'. Supported values are: "
                                   "'output_text' and 'refusal'.")
        return
    assert e.value.message.endswith("`input_image` parts are not supported; send "
                                    "`input_text` parts (an assistant's: `output_text` or "
                                    "`refusal`).")


@pytest.mark.parametrize("part", ["input_image", "input_file"])
def test_an_unsupported_part_of_a_function_call_output_names_its_own_parts(part: str) -> None:
    """An image or a file in a function call's output (OpenAI takes them there, Weir
    does not serve them) is refused with the parts that output takes, not an
    assistant's (`output_text`, `refusal`: a 400 there of their own)."""
    with pytest.raises(InvalidRequest) as e:
        parse_model(ResponsesRequest, {"model": "m", "input": [
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": [{"type": part}]}]})
    assert (e.value.param, e.value.code) == ("input[1].output[0]", "invalid_value")
    assert e.value.message == (f"Invalid value for `input[1].output[0]`: `{part}` parts "
                               "are not supported; send `input_text` parts.")


@pytest.mark.parametrize("role", ["user", "system", "developer"])
def test_a_responses_refusal_part_is_an_assistant_s_alone(role: str) -> None:
    """As on Chat Completions: a `refusal` part in an input message of another role than
    the assistant's is a 400 naming the part; it was read to the model as that role's
    own words."""
    refusal = {"type": "refusal", "refusal": "I can't."}
    items: list[dict[str, Any]] = [
        {"role": "assistant", "content": [refusal]},  # (an earlier refusal sent back)
        {"role": role, "content": [{"type": "input_text", "text": "a"}, refusal]}]
    with pytest.raises(InvalidRequest) as e:
        parse_model(ResponsesRequest, {"model": "m", "input": items})
    assert (e.value.param, e.value.code) == ("input[1].content[1]", "invalid_value")
    assert e.value.message.startswith("Invalid value: 'refusal'.")
    parse_model(ResponsesRequest, {"model": "m", "input": [
        *items[:1], {"role": "user", "content": "go on"}]})


@pytest.mark.parametrize(("extra", "param", "code"), [
    ({"safety_identifier": "u" * 65}, "safety_identifier", "string_above_max_length"),
    ({"safety_identifier": 5}, "safety_identifier", "invalid_type"),
    ({"prompt_cache_key": ["k"]}, "prompt_cache_key", "invalid_type"),
    ({"prompt_cache_retention": "forever"}, "prompt_cache_retention", "invalid_value"),
    ({"prompt_cache_options": {"ttl": "1h"}}, "prompt_cache_options.ttl", "invalid_value"),
    ({"prompt_cache_options": {"mode": "never"}}, "prompt_cache_options.mode",
     "invalid_value"),
    ({"prompt_cache_options": "30m"}, "prompt_cache_options", "invalid_type"),
    ({"prediction": "the file"}, "prediction", "invalid_type"),
    ({"prediction": {"type": "content"}}, "prediction.content", "missing_required_parameter"),
    ({"prediction": {"type": "content", "content": []}}, "prediction.content", "empty_array"),
    ({"stream": True, "stream_options": {"include_obfuscation": "no"}},
     "stream_options.include_obfuscation", "invalid_type"),
])
def test_openai_s_fields_that_change_no_answer_are_still_checked(
        extra: dict[str, Any], param: str, code: str) -> None:
    """Fields the engine has no use for (who asks, prompt caching, a predicted output,
    stream obfuscation) are still OpenAI's, typed and bounded as OpenAI checks them: a
    wrong one is the 400 OpenAI gives, not accepted unread. (The Responses API takes the
    first three too.)"""
    with pytest.raises(InvalidRequest) as e:
        parse_model(ChatCompletionRequest, {"model": "m", "messages": MSG, **extra})
    assert (e.value.param, e.value.code) == (param, code)
    if "prediction" not in extra and "stream_options" not in extra:
        with pytest.raises(InvalidRequest) as e:
            parse_model(ResponsesRequest, {"model": "m", "input": "hi", **extra})
        assert (e.value.param, e.value.code) == (param, code)
    good = {"safety_identifier": "u" * 64, "prompt_cache_key": "k",
            "prompt_cache_retention": "24h", "prediction": {"type": "content", "content": [
                {"type": "text", "text": "x"}]},
            "prompt_cache_options": {"ttl": "30m", "mode": "explicit"}}
    parse_model(ChatCompletionRequest, {"model": "m", "messages": MSG, **good, "stream": True,
                                        "stream_options": {"include_obfuscation": False}})


def test_max_completion_tokens_wins() -> None:
    assert chat(max_tokens=5, max_completion_tokens=7).output_limit == 7


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [("x", ["x"]), (["a", "b"], ["a", "b"]), ([1, 2], [[1, 2]]), ([[1], [2, 3]], [[1], [2, 3]])],
)
def test_completion_prompt_forms(prompt: Any, expected: Any) -> None:
    req = parse_model(CompletionRequest, {"model": "m", "prompt": prompt})
    assert req.prompts() == expected
    assert req.max_tokens == 16  # OpenAI's default for completions


@pytest.mark.parametrize("prompt", [[], [1, "a"], [-1], None, 5])
def test_bad_completion_prompts(prompt: Any) -> None:
    param = bad_param(CompletionRequest, {"model": "m", "prompt": prompt})
    assert param is not None and param.startswith("prompt")


@pytest.mark.parametrize(("n", "best_of", "code"), [
    (3, 2, "invalid_value"), (2, 1, "invalid_value"), (2, 3, "unsupported_parameter")])
def test_best_of_fewer_than_n_is_an_invalid_value(n: int, best_of: int, code: str) -> None:
    """Fewer candidates than choices returned is a contradiction on any server (an
    upstream's too), not a parameter this one lacks: `invalid_value`, where it was
    `unsupported_parameter`. More candidates than `n` is what the engine cannot do."""
    body = {"model": "m", "prompt": "hi", "n": n, "best_of": best_of}
    with pytest.raises(InvalidRequest) as e:
        prepare_completion(FakeEngine(), parse_model(CompletionRequest, body))
    assert (e.value.status, e.value.param, e.value.code) == (400, "best_of", code)
    prepare_completion(FakeEngine(), parse_model(CompletionRequest, {**body, "best_of": n}))


@pytest.mark.parametrize("extra", [{"suffix": "x"}, {"best_of": 2}])
def test_completion_s_unsupported_parameters_are_said_as_the_others(
        extra: dict[str, Any]) -> None:
    """"Unsupported parameter: `x`: why", as every other unsupported parameter is said
    (they said "`suffix` is not supported by this model.")."""
    body = {"model": "m", "prompt": "hi", **extra}
    with pytest.raises(InvalidRequest) as e:
        prepare_completion(FakeEngine(), parse_model(CompletionRequest, body))
    (name,) = extra
    assert (e.value.param, e.value.code) == (name, "unsupported_parameter")
    assert e.value.message.startswith(f"Unsupported parameter: `{name}`: ")


def test_completion_logprobs_bound() -> None:
    assert bad_param(CompletionRequest, {"model": "m", "prompt": "x", "logprobs": 6}) == "logprobs"


@pytest.mark.parametrize(
    ("body", "code"),
    [(b"", "invalid_json"), (b"{", "invalid_json"), (b"\xff\xfe", "invalid_encoding"),
     (b"[1, 2]", "invalid_json"), (b"[" * 100000, "invalid_json")],
)
def test_decode_json_object_rejects(body: bytes, code: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        decode_json_object(body)
    assert e.value.code == code


def test_decode_json_object_accepts_unicode() -> None:
    assert decode_json_object('{"a": "é中"}'.encode()) == {"a": "é中"}


# -------------------------------------------------------------------- strict types
# OpenAI refuses a value of the wrong JSON type; pydantic's lax mode would have read
# "5" as 5, true as 1 and [true] as token id 1.


@pytest.mark.parametrize(
    ("model", "data", "param", "said"),
    [
        (ChatCompletionRequest, {"max_tokens": "5"}, "max_tokens",
         "expected an integer, but got a string"),
        (ChatCompletionRequest, {"max_tokens": 5.0}, "max_tokens",
         "expected an integer, but got a decimal number"),
        (ChatCompletionRequest, {"temperature": True}, "temperature",
         "expected a number, but got a boolean"),
        (ChatCompletionRequest, {"temperature": "0.5"}, "temperature",
         "expected a number, but got a string"),
        (ChatCompletionRequest, {"n": True}, "n", "expected an integer, but got a boolean"),
        (ChatCompletionRequest, {"stream": 1}, "stream", "expected a boolean, but got an integer"),
        (ChatCompletionRequest, {"logprobs": "true"}, "logprobs", "expected a boolean"),
        (ChatCompletionRequest, {"messages": [{"role": "user", "content": 5}]},
         "messages[0].content", "but got an integer"),
        (ChatCompletionRequest,
         {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
         "messages[0].content[0].text", "expected a string, but got an integer"),
        (CompletionRequest, {"prompt": [True]}, "prompt[0]", "but got a boolean"),
        (CompletionRequest, {"prompt": "x", "max_tokens": "16"}, "max_tokens",
         "expected an integer, but got a string"),
        (CompletionRequest, {"prompt": None}, "prompt", "but got null"),
    ],
)
def test_a_value_of_the_wrong_type_is_refused(model: type, data: dict[str, Any], param: str,
                                              said: str) -> None:
    base: dict[str, Any] = {"model": "m"}
    base.update({"messages": MSG} if model is ChatCompletionRequest else {})
    with pytest.raises(InvalidRequest) as e:
        parse_model(model, {**base, **data})
    assert (e.value.param, e.value.code) == (param, "invalid_type")
    assert f"Invalid type for `{param}`" in e.value.message and said in e.value.message


def test_integers_still_serve_for_numbers() -> None:
    req = chat(temperature=1, top_p=1, presence_penalty=0)
    assert (req.temperature, req.top_p) == (1.0, 1.0)


@pytest.mark.parametrize("role", ["user", "system", "tool", "assistant"])
def test_a_message_without_content_is_refused(role: str) -> None:
    for message in ({"role": role}, {"role": role, "content": None}):
        with pytest.raises(InvalidRequest) as e:
            parse_model(ChatCompletionRequest, {"model": "m", "messages": [message]})
        assert (e.value.param, e.value.code) == (
            "messages[0].content", "missing_required_parameter")


def test_an_assistant_refusal_sent_back_as_openai_answered_it_is_its_turn() -> None:
    """OpenAI answers a refusal as `content: null` beside `refusal`; a client sending
    that message back (the SDK's `message.model_dump()`) was told its content was
    missing. The refusal is the turn's text, as a `refusal` part is; a user's is not."""
    turns = [{"role": "user", "content": "do it"},
             {"role": "assistant", "content": None, "refusal": "I can't help with that."},
             {"role": "user", "content": "why?"}]
    req = parse_model(ChatCompletionRequest, {"model": "m", "messages": turns})
    assert req.messages[1].text() == "I can't help with that."
    engine = FakeEngine()
    said = prepare_chat(engine, req).prompts[0]
    assert said == engine.render_chat([{"role": m["role"], "content": m["content"] or
                                        m.get("refusal")} for m in turns], None)
    turns[1] = {"role": "assistant", "content": "Sure.", "refusal": None}
    assert parse_model(ChatCompletionRequest, {"model": "m", "messages": turns}
                       ).messages[1].text() == "Sure."
    with pytest.raises(InvalidRequest) as e:  # (only an assistant refuses)
        parse_model(ChatCompletionRequest, {"model": "m", "messages": [
            {"role": "user", "content": None, "refusal": "no"}]})
    assert e.value.param == "messages[0].content"


@pytest.mark.parametrize("message", [{"role": "tool", "content": "ok"},
                                     {"role": "tool", "content": "ok", "tool_call_id": None},
                                     {"role": "tool", "content": "ok", "tool_call_id": ""}])
def test_a_tool_result_needs_the_id_of_its_call(message: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest) as e:
        parse_model(ChatCompletionRequest, {"model": "m", "messages": [*MSG, message]})
    assert (e.value.param, e.value.code) == (
        "messages[1].tool_call_id", "missing_required_parameter")


CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


@pytest.mark.parametrize(("turns", "at"), [
    ([{"role": "tool", "tool_call_id": "c1", "content": "42"}], 1),  # no call at all
    ([{"role": "assistant", "content": None, "tool_calls": [CALL]},
      {"role": "tool", "tool_call_id": "c2", "content": "42"}], 2),  # another call's id
    ([{"role": "assistant", "content": None, "tool_calls": [CALL]},
      {"role": "tool", "tool_call_id": "c1", "content": "42"},
      {"role": "user", "content": "and?"},
      {"role": "tool", "tool_call_id": "c1", "content": "42"}], 4),  # not right after it
    ([{"role": "assistant", "content": "no calls"},
      {"role": "tool", "tool_call_id": "c1", "content": "42"}], 2),
    ([{"role": "assistant", "content": None, "tool_calls": [CALL]},  # answered, then a
      {"role": "tool", "tool_call_id": "c1", "content": "42"},  # result after a user
      {"role": "user", "content": "and?"},  # turn: misplaced, not a duplicate
      {"role": "tool", "tool_call_id": "c1", "content": "42"}], 4),
])
def test_a_tool_result_must_answer_a_call_just_before_it(turns: list[dict[str, Any]],
                                                         at: int) -> None:
    with pytest.raises(InvalidRequest) as e:
        parse_model(ChatCompletionRequest, {"model": "m", "messages": [*MSG, *turns]})
    assert (e.value.status, e.value.param, e.value.code) == (
        400, f"messages[{at}].tool_call_id", "invalid_value")
    assert "answers no call" in e.value.message


@pytest.mark.parametrize("turns", [
    [{"role": "assistant", "content": None, "tool_calls": [CALL]}],  # the last turn
    [{"role": "assistant", "content": None, "tool_calls": [CALL]},
     {"role": "user", "content": "and?"}],
    [{"role": "assistant", "content": None, "tool_calls": [CALL, {**CALL, "id": "c2"}]},
     {"role": "tool", "tool_call_id": "c2", "content": "2"}],  # one of two answered
])
def test_every_call_of_an_assistant_turn_must_be_answered(turns: list[dict[str, Any]]
                                                          ) -> None:
    """OpenAI's rule: an assistant message with `tool_calls` is followed by a `tool`
    message for each of its calls (it was generated from, as if they were answered)."""
    with pytest.raises(InvalidRequest) as e:
        parse_model(ChatCompletionRequest, {"model": "m", "messages": [*MSG, *turns]})
    assert (e.value.status, e.value.param, e.value.code) == (
        400, "messages[1].tool_calls", "invalid_value")
    assert "c1" in e.value.message and "c2" not in e.value.message
    assert e.value.message.startswith("An assistant message with 'tool_calls' must be "
                                      "followed by tool messages")


@pytest.mark.parametrize(("turns", "param"), [
    ([{"role": "assistant", "content": None, "tool_calls": [CALL, CALL]},
      {"role": "tool", "tool_call_id": "c1", "content": "1"}], "messages[1].tool_calls"),
    ([{"role": "assistant", "content": None, "tool_calls": [CALL, {**CALL, "id": "c2"}]},
      {"role": "tool", "tool_call_id": "c1", "content": "1"},
      {"role": "tool", "tool_call_id": "c1", "content": "again"},
      {"role": "tool", "tool_call_id": "c2", "content": "2"}], "messages[3].tool_call_id"),
])
def test_a_call_id_is_one_call_with_one_result(turns: list[dict[str, Any]],
                                               param: str) -> None:
    """Two calls under one id, or two results for one call: which result answers which
    call is anyone's guess (OpenAI: "Duplicate value for 'tool_call_id'")."""
    with pytest.raises(InvalidRequest) as e:
        parse_model(ChatCompletionRequest, {"model": "m", "messages": [*MSG, *turns]})
    assert (e.value.status, e.value.param, e.value.code) == (400, param, "invalid_value")
    assert "Duplicate value for" in e.value.message


def test_several_tool_results_answer_several_calls() -> None:
    two = [CALL, {**CALL, "id": "c2"}]
    req = parse_model(ChatCompletionRequest, {"model": "m", "messages": [
        *MSG, {"role": "assistant", "content": None, "tool_calls": two},
        {"role": "tool", "tool_call_id": "c2", "content": "2"},
        {"role": "tool", "tool_call_id": "c1", "content": "1"},
        {"role": "assistant", "content": "both done"}]})
    assert [m.role for m in req.messages][-3:] == ["tool", "tool", "assistant"]


@pytest.mark.parametrize("content", [None, "the transcript"])
def test_an_assistant_turn_referring_to_an_audio_answer_is_refused_by_name(
        content: str | None) -> None:
    """OpenAI's assistant message may stand for an earlier audio answer (`audio: {id}`,
    no content): it was told its content was missing (or, with content, the audio was
    dropped silently); the error names the audio and says what to send."""
    turns = [{"role": "user", "content": "hi"},
             {"role": "assistant", "content": content, "audio": {"id": "audio_1"}},
             {"role": "user", "content": "and?"}]
    with pytest.raises(InvalidRequest) as e:
        parse_model(ChatCompletionRequest, {"model": "m", "messages": turns})
    assert (e.value.param, e.value.code) == ("messages[1].audio", "unsupported_parameter")
    assert "transcript" in e.value.message
    turns[1] = {"role": "assistant", "content": "the transcript", "audio": None}
    parse_model(ChatCompletionRequest, {"model": "m", "messages": turns})


@pytest.mark.parametrize("choice", [None, "auto", "required",
                                    {"type": "function", "function": {"name": "f"}}])
def test_two_function_tools_of_one_name_are_refused(choice: Any) -> None:
    """A call names its function: with two tools named `f`, the caller could not tell
    which was called, and a forced call held its arguments to the first one's schema
    alone. A 400 naming the second (Chat Completions and the Responses API alike)."""
    def tool(prop: str) -> dict[str, Any]:
        return {"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {prop: {"type": "string"}}}}}
    tools = [tool("a"), {**tool("b"), "function": {"name": "g"}}, tool("c")]
    body = {"model": "m", "messages": MSG, "tools": tools, "tool_choice": choice}
    with pytest.raises(InvalidRequest) as e:
        parse_model(ChatCompletionRequest, body)
    assert (e.value.param, e.value.code) == ("tools[2].function.name", "invalid_value")
    parse_model(ChatCompletionRequest, {**body, "tools": tools[:2]})
    flat = [{"type": "function", **t["function"]} for t in tools]
    with pytest.raises(InvalidRequest) as e:
        parse_model(ResponsesRequest, {"model": "m", "input": "hi", "tools": flat})
    assert (e.value.param, e.value.code) == ("tools[2].name", "invalid_value")


def test_an_assistant_call_needs_no_content() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    req = chat(messages=[*MSG, {"role": "assistant", "content": None, "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": "c1", "content": "ok"}])
    assert req.messages[1].content is None


def test_a_missing_field_is_said_as_openai_says_it() -> None:
    with pytest.raises(InvalidRequest) as e:
        parse_model(ChatCompletionRequest,
                    {"model": "m", "messages": [{"role": "user", "content": [{"text": "x"}]}]})
    assert e.value.param == "messages[0].content[0].type"
    assert e.value.message == "Missing required parameter: `messages[0].content[0].type`."


@pytest.mark.parametrize("name", ["has space", "", "x" * 65, "naïve"])
def test_a_json_schema_name_follows_openais_pattern(name: str) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": name, "schema": {"type": "object"}}}
    assert bad_param(ChatCompletionRequest, {"model": "m", "messages": MSG,
                                             "response_format": fmt}) == (
        "response_format.json_schema.name")


def test_legacy_function_turns_may_go_without_content() -> None:
    req = chat(messages=[*MSG, {"role": "assistant", "content": None,
                                "function_call": {"name": "f", "arguments": "{}"}},
                         {"role": "function", "name": "f", "content": None}])
    assert [m.content for m in req.messages[1:]] == [None, None]


@pytest.mark.parametrize(("model", "data", "param"), [
    (ChatCompletionRequest, {"messages": [{"role": "user", "content": [
        {"type": ["text"], "text": "hi"}]}]}, "messages[0].content[0].type"),
    (ChatCompletionRequest, {"messages": [{"role": "user", "content": [
        {"type": {}, "text": "hi"}]}]}, "messages[0].content[0].type"),
    (ResponsesRequest, {"input": [{"type": {}, "role": "user", "content": "hi"}]},
     "input[0].type"),
    (ResponsesRequest, {"input": [{"role": "user", "content": [
        {"type": ["input_text"], "text": "hi"}]}]}, "input[0].content[0].type"),
    (ResponsesRequest, {"input": [{"role": "user", "content": [
        {"type": "input_text", "text": 5}]}]}, "input[0].content[0].text"),
    (ResponsesRequest, {"input": [{"role": "user", "content": [
        {"type": "input_image"}]}]}, "input[0].content[0]"),
])
def test_a_kind_of_any_json_type_is_a_400_naming_it(model: type, data: dict[str, Any],
                                                      param: str) -> None:
    """A part's or item's `type` picks its model: a list or an object there is refused
    like any bad value (it was a 500), and no model tag appears in the param."""
    assert bad_param(model, {"model": "m", **data}) == param


def test_null_reads_as_absent_where_a_parameter_has_a_default() -> None:
    """OpenAI reads `"n": null` as no `n` at all; a strict type check must not refuse it."""
    req = chat(n=None, stream=None, logprobs=None, ignore_eos=None, min_tokens=None)
    assert (req.n, req.stream, req.logprobs, req.ignore_eos, req.min_tokens) == (
        1, False, False, False, 0)
    done = parse_model(CompletionRequest, {"model": "m", "prompt": "x", "echo": None,
                                           "max_tokens": None})
    assert done.echo is False and done.max_tokens == 16  # null: the default, as vLLM's
    resp = parse_model(ResponsesRequest, {"model": "m", "input": "x", "store": None,
                                          "stream": None})
    assert resp.store is True and resp.stream is False
    assert bad_param(ChatCompletionRequest, {"model": "m", "messages": MSG, "n": "2"}) == "n"


def test_null_reads_as_absent_inside_stream_options() -> None:
    """`stream_options` holds parameters with defaults too: `"include_usage": null` was a
    400 `invalid_type` (vLLM's server reads it as its default, as the top level's nulls
    are read here)."""
    req = chat(stream=True, stream_options={"include_usage": None,
                                            "continuous_usage_stats": None,
                                            "include_obfuscation": None})
    assert req.stream_options is not None
    assert not req.include_usage and not req.stream_options.continuous_usage_stats
    assert req.stream_options.include_obfuscation is True
    done = parse_model(CompletionRequest, {"model": "m", "prompt": "x", "stream": True,
                                           "stream_options": {"include_usage": None}})
    assert not done.include_usage
    assert bad_param(ChatCompletionRequest, {"model": "m", "messages": MSG, "stream": True,
                                             "stream_options": {"include_usage": "yes"}}
                     ) == "stream_options.include_usage"


@pytest.mark.parametrize(("model", "extra"), [
    (ChatCompletionRequest, {"functions": [{"name": "f", "parameters": {}}]}),
    (ChatCompletionRequest, {"function_call": {"name": "f"}}),
    (ChatCompletionRequest, {"function_call": "auto"}),
    (ChatCompletionRequest, {"modalities": ["text", "audio"]}),
    (ChatCompletionRequest, {"audio": {"voice": "alloy", "format": "wav"}}),
    (ChatCompletionRequest, {"web_search_options": {}}),
    (ChatCompletionRequest, {"verbosity": "low"}),
    (ChatCompletionRequest, {"moderation": {"model": "omni-moderation-latest"}}),
    # Chat's names on /v1/completions: ignored, the answer ran to the default 16 tokens
    # and carried no logprobs
    (CompletionRequest, {"max_completion_tokens": 5}),
    (CompletionRequest, {"top_logprobs": 2}),
    # (were ignored: the answer was text, a forced call never made)
    (CompletionRequest, {"tools": [{"type": "function", "function": {"name": "f"}}]}),
    (CompletionRequest, {"tool_choice": "required"}),
    (CompletionRequest, {"parallel_tool_calls": False}),
    (ResponsesRequest, {"conversation": "conv_123"}),
    (ResponsesRequest, {"prompt": {"id": "pmpt_1"}}),
    (ResponsesRequest, {"include": ["message.output_text.logprobs"]}),
    (ResponsesRequest, {"top_logprobs": 5}),
    (ResponsesRequest, {"max_tool_calls": 1}),
    (ResponsesRequest, {"truncation": "auto"}),
    (ResponsesRequest, {"reasoning": {"effort": "high"}}),
    # (were ignored: no compaction ran, no moderation ran, and the answer said nothing)
    (ResponsesRequest, {"context_management": [{"type": "compaction",
                                                "compact_threshold": 1000}]}),
    (ResponsesRequest, {"moderation": {"model": "omni-moderation-latest"}}),
])
def test_a_parameter_that_cannot_be_honoured_is_refused_by_name(model: type,
                                                                extra: dict[str, Any]) -> None:
    """Ignored, the answer would claim what was not done (a background response
    answered at once, `truncation: "disabled"` echoed for `auto`)."""
    base: dict[str, Any] = ({"model": "m", "messages": MSG} if model is ChatCompletionRequest
                            else {"model": "m", "prompt": "hi"} if model is CompletionRequest
                            else {"model": "m", "input": "hi"})
    with pytest.raises(InvalidRequest) as e:
        parse_model(model, {**base, **extra})
    name = next(iter(extra))
    assert (e.value.status, e.value.param, e.value.code) == (400, name, "unsupported_parameter")
    assert f"`{name}`" in e.value.message


@pytest.mark.parametrize(("field", "value"), [
    ("defer_loading", True), ("allowed_callers", ["programmatic"]), ("allowed_callers", []),
])
def test_a_function_tool_asking_for_tool_search_or_programmatic_calls_is_refused(
        field: str, value: Any) -> None:
    """A deferred tool (loaded only by OpenAI's tool search) or one the model may not call
    itself (`allowed_callers` without `direct`) was taken as a plain tool: the model was
    offered, and could call, what the client had kept from it."""
    tools = [{"type": "function", "name": "f"}, {"type": "function", "name": "g", field: value}]
    with pytest.raises(InvalidRequest) as e:
        parse_model(ResponsesRequest, {"model": "m", "input": "hi", "tools": tools})
    assert (e.value.status, e.value.param, e.value.code) == (
        400, f"tools[1].{field}", "unsupported_parameter")
    tools[1][field] = {"defer_loading": False, "allowed_callers": ["direct", "programmatic"]
                       }[field]  # (what every tool here is: offered, called by the model)
    parse_model(ResponsesRequest, {"model": "m", "input": "hi", "tools": tools})


@pytest.mark.parametrize(("model", "extra"), [
    (ChatCompletionRequest, {"functions": [], "function_call": None, "modalities": ["text"],
                             "audio": None, "web_search_options": None, "verbosity": "medium",
                             "moderation": None}),
    (ResponsesRequest, {"background": False, "conversation": None, "prompt": None,
                        "include": [], "top_logprobs": 0, "max_tool_calls": None,
                        "truncation": "disabled", "reasoning": {"effort": "none"},
                        "reasoning_effort": "none", "verbosity": "medium",
                        "context_management": None, "moderation": None}),
    (CompletionRequest, {"max_completion_tokens": None, "top_logprobs": None, "tools": [],
                         "tool_choice": "none", "parallel_tool_calls": None}),
])
def test_the_same_parameters_asking_nothing_are_accepted(model: type,
                                                         extra: dict[str, Any]) -> None:
    base: dict[str, Any] = ({"model": "m", "messages": MSG} if model is ChatCompletionRequest
                            else {"model": "m", "prompt": "hi"} if model is CompletionRequest
                            else {"model": "m", "input": "hi"})
    parse_model(model, {**base, **extra})


def _with_value_at(path: str, value: Any) -> tuple[dict[str, Any], str]:
    """A request body with `value` at a `CHAT_ENUMS` path (`[]`: the array's first item),
    and that value's param."""
    body: dict[str, Any] = {}
    node, param = body, ""
    steps = path.split(".")
    for i, step in enumerate(steps):
        name, each = step.removesuffix("[]"), step.endswith("[]")
        param = f"{param}.{name}" if param else name
        last = i == len(steps) - 1
        inner: Any = value if last else {}
        node[name] = [inner] if each else inner
        param += "[0]" if each else ""
        node = inner
    return body, param


@pytest.mark.parametrize("path", sorted(CHAT_ENUMS))
@pytest.mark.parametrize(("value", "code"), [("bogus", "invalid_value"), (5, "invalid_type")])
def test_an_enum_parameter_outside_its_values_is_an_invalid_value_naming_it(
        path: str, value: Any, code: str) -> None:
    """`reasoning_effort: "bogus"` was refused as an unsupported parameter (and passed on
    to an upstream as sent): a value outside OpenAI's list is the caller's mistake, a 400
    `invalid_value` (`invalid_type` for another JSON type) naming it, as OpenAI answers."""
    extra, param = _with_value_at(path, value)
    with pytest.raises(InvalidRequest) as e:
        parse_model(ChatCompletionRequest, {"model": "m", "messages": MSG, **extra})
    assert (e.value.status, e.value.param, e.value.code) == (400, param, code)
    assert "Supported values are" in e.value.message or code == "invalid_type"
    if path.endswith("[]"):  # (the array itself of another type)
        with pytest.raises(InvalidRequest) as e:
            parse_model(ChatCompletionRequest, {"model": "m", "messages": MSG,
                                                path[:-2]: value})
        assert (e.value.param, e.value.code) == (path[:-2], "invalid_type")


def test_enum_values_are_the_specs() -> None:
    """Every enum of a chat parameter the request model does not declare (an unsupported
    one, or one an upstream gets as sent) is in `CHAT_ENUMS`, with the spec's values."""
    from tests.openai_spec import _schemas
    schemas = _schemas()  # (the spec's, extracted into tests/spec/)

    def enums(node: Any, path: str, depth: int = 0) -> dict[str, tuple[str, ...]]:
        out: dict[str, tuple[str, ...]] = {}
        if depth > 8 or not isinstance(node, dict):
            return out
        if "$ref" in node:
            return enums(schemas[node["$ref"].rsplit("/", 1)[1]], path, depth + 1)
        if isinstance(node.get("enum"), list) and all(isinstance(v, str) for v in node["enum"]):
            out[path] = tuple(node["enum"])
        alternatives = (*node.get("anyOf", ()), *node.get("oneOf", ()))
        if any(a.get("type") == "string" and "enum" not in a for a in alternatives):
            return out  # (any string: a voice's name or a custom one's)
        for sub in (*alternatives, *node.get("allOf", ())):
            out.update(enums(sub, path, depth + 1))
        if isinstance(node.get("items"), dict):
            out.update(enums(node["items"], f"{path}[]", depth + 1))
        for name, sub in (node.get("properties") or {}).items():
            out.update(enums(sub, f"{path}.{name}", depth + 1))
        return out

    params: dict[str, Any] = {}
    for part in schemas["CreateChatCompletionRequest"]["allOf"]:
        if "$ref" in part:
            part = schemas[part["$ref"].rsplit("/", 1)[1]]
        params.update(part.get("properties") or {})
    # (and every parameter is known: declared, or refused by name; none is an unknown
    # field, which the cache would key as something that changes the answer)
    known = {*ChatCompletionRequest.model_fields, *CHAT_UNSUPPORTED, *LOCAL_UNSUPPORTED}
    assert set(params) - known == set()
    found: dict[str, tuple[str, ...]] = {}
    for name, schema in params.items():
        if name not in ChatCompletionRequest.model_fields and name != "model":
            found.update(enums(schema, name))
    assert found == CHAT_ENUMS


@pytest.mark.parametrize(("model", "data", "param"), [
    (EmbeddingRequest, {"model": "m", "input": ""}, "input"),
    (EmbeddingRequest, {"model": "m", "input": ["a", ""]}, "input[1]"),
    (ChatCompletionRequest, {"model": "m", "messages": [{"role": "user", "content": []}]},
     "messages[0].content"),
])
def test_empty_text_where_openai_needs_some_is_refused(model: type, data: dict[str, Any],
                                                       param: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        parse_model(model, data)
    assert (e.value.status, e.value.param) == (400, param)


def _responses_chat(items: list[dict[str, Any]], history: list[dict[str, Any]] | None = None,
                    ) -> Any:
    from proxy.openai_responses.translate import chat_request
    return chat_request(parse_model(ResponsesRequest, {"model": "m", "input": items}),
                        history or [])


CALL_ITEM = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
OUTPUT_ITEM = {"type": "function_call_output", "call_id": "c1", "output": "42"}


def test_assistant_text_after_a_call_joins_its_turn_so_the_output_still_answers_it() -> None:
    """A streamed answer that writes text after its call is stored [call, message]; the
    next turn's output for that call must still be accepted (as in the Agents SDK's
    replayed histories)."""
    chat_req, _ = _responses_chat([{"role": "user", "content": "hi"}, CALL_ITEM,
                                   {"role": "assistant", "content": "Let me check."},
                                   OUTPUT_ITEM])
    assert [m.role for m in chat_req.messages] == ["user", "assistant", "tool"]
    assert chat_req.messages[1].content == "Let me check."
    from proxy.openai_responses.translate import output_messages
    stored = output_messages([
        {"type": "message", "content": [{"type": "output_text", "text": "Sure."}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "message", "content": [{"type": "output_text", "text": "One moment."}]}])
    chat_req, _ = _responses_chat([OUTPUT_ITEM], [{"role": "user", "content": "hi"}, *stored])
    assert [m.role for m in chat_req.messages] == ["user", "assistant", "tool"]


def test_an_output_cut_off_from_its_call_by_a_message_is_a_responses_400() -> None:
    with pytest.raises(InvalidRequest) as e:
        _responses_chat([CALL_ITEM, OUTPUT_ITEM, {"role": "user", "content": "and?"},
                         OUTPUT_ITEM])
    assert (e.value.param, e.value.code) == ("input", "invalid_value")
    assert "function_call_output" in e.value.message and "tool_calls" not in e.value.message


@pytest.mark.parametrize("items", [
    [CALL_ITEM], [CALL_ITEM, {"role": "user", "content": "and?"}]])
def test_a_function_call_without_its_output_is_a_responses_400(items: list[Any]) -> None:
    """As OpenAI answers it: "No tool output found for function call <id>." """
    with pytest.raises(InvalidRequest) as e:
        _responses_chat(items)
    assert (e.value.param, e.value.code) == ("input", "invalid_value")
    assert e.value.message == f"No tool output found for function call {CALL_ITEM['call_id']}."


@pytest.mark.parametrize("items", [
    [CALL_ITEM, CALL_ITEM, OUTPUT_ITEM],  # two calls, one id
    [CALL_ITEM, OUTPUT_ITEM, OUTPUT_ITEM],  # two outputs for one call
])
def test_a_call_id_is_one_call_with_one_output_in_responses(items: list[Any]) -> None:
    with pytest.raises(InvalidRequest) as e:
        _responses_chat(items)
    assert (e.value.param, e.value.code) == ("input", "invalid_value")
    assert "Duplicate" in e.value.message


def test_responses_take_parallel_tool_calls_without_tools_as_openai_does() -> None:
    req = parse_model(ResponsesRequest, {"model": "m", "input": "hi",
                                         "parallel_tool_calls": False})
    from proxy.openai_responses.translate import chat_request
    chat_req, _ = chat_request(req, [])
    assert chat_req.parallel_tool_calls is None and not chat_req.tools


def test_an_empty_previous_response_id_is_refused() -> None:
    assert bad_param(ResponsesRequest, {"model": "m", "input": "hi",
                                        "previous_response_id": ""}) == "previous_response_id"


def test_input_items_given_one_id_twice_are_refused() -> None:
    """One id is one item: sent twice, the model would read it twice (and paging with
    `after` at that id would return the same page for ever). OpenAI's 400."""
    with pytest.raises(InvalidRequest) as e:
        parse_model(ResponsesRequest, {"model": "m", "input": [
            {"role": "user", "content": "a", "id": "msg_same"},
            {"role": "user", "content": "b", "id": "msg_same"}]})
    # OpenAI's 400 has no code: {"param": "input", "code": null}
    assert (e.value.param, e.value.code) == ("input", None)
    assert e.value.message.startswith("Duplicate item found with id msg_same.")


@pytest.mark.parametrize(("model", "tool", "param"), [
    (ChatCompletionRequest, {"type": "function", "function": {
        "name": "f", "parameters": {"type": "string"}}}, "tools[0].function.parameters"),
    (ResponsesRequest, {"type": "function", "name": "f", "parameters": {"type": "array"}},
     "tools[0].parameters"),
])
def test_a_functions_parameters_are_an_object(model: type, tool: dict[str, Any],
                                              param: str) -> None:
    """OpenAI refuses parameters of another type (the arguments would not be an object)."""
    base: dict[str, Any] = ({"model": "m", "messages": MSG} if model is ChatCompletionRequest
                            else {"model": "m", "prompt": "hi"} if model is CompletionRequest
                            else {"model": "m", "input": "hi"})
    with pytest.raises(InvalidRequest) as e:
        parse_model(model, {**base, "tools": [tool]})
    assert (e.value.status, e.value.param, e.value.code) == (
        400, param, "invalid_function_parameters")
    ok = {**tool, "function": {**tool["function"], "parameters": {"properties": {}}}} if (
        "function" in tool) else {**tool, "parameters": {"type": ["object", "null"]}}
    parse_model(model, {**base, "tools": [ok]})


def test_a_stored_responses_calls_sent_again_with_their_outputs_are_read_once() -> None:
    """After a response that ended in calls, some clients send those calls again with
    their outputs (and `previous_response_id`): one assistant turn, answered."""
    history = [{"role": "user", "content": "hi"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "c1", "type": "function",
                    "function": {"name": "f", "arguments": "{}"}}]}]
    _, conversation = _responses_chat([CALL_ITEM, OUTPUT_ITEM], history)
    assert [m["role"] for m in conversation] == ["user", "assistant", "tool"]
    _, conversation = _responses_chat([OUTPUT_ITEM], history)  # the usual way
    assert [m["role"] for m in conversation] == ["user", "assistant", "tool"]
    with pytest.raises(InvalidRequest):  # a user turn while the call waits: refused
        _responses_chat([{"role": "user", "content": "and?"}], history)


@pytest.mark.parametrize("schema", [
    {"$ref": "#"},
    {"type": "object", "properties": {"a": {"$ref": "#/properties/a"}}, "required": ["a"]},
    {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b", "description": "x"},
                                    "b": {"$ref": "#/$defs/a"}}},
])
def test_a_ref_loop_with_no_way_out_is_a_400_before_the_engine(schema: Any) -> None:
    """No value matches a `$ref` that leads back to itself through references only; the
    engine's grammar failed on it mid-answer (a 502 the breaker counted: one tenant
    could open the circuit for all)."""
    for body in ({"model": "m", "messages": [{"role": "user", "content": "x"}],
                  "response_format": {"type": "json_schema",
                                      "json_schema": {"name": "x", "schema": schema}}},
                 {"model": "m", "messages": [{"role": "user", "content": "x"}],
                  "tools": [{"type": "function", "function": {
                      "name": "f", "parameters": schema}}]}):
        with pytest.raises(InvalidRequest, match="refers back to itself"):
            parse_model(ChatCompletionRequest, body)


def test_a_recursive_schema_with_a_way_out_is_served() -> None:
    node = {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}}
    parse_model(ChatCompletionRequest, {
        "model": "m", "messages": [{"role": "user", "content": "x"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "$ref": "#/$defs/node", "$defs": {"node": node}}}}})


def test_a_long_ref_chain_is_followed_once_per_link(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each `$ref` is resolved once: walking the chain again from every link took
    seconds on a chain of 4,000 (under the node budget), on the event loop."""
    import proxy.protocol as P

    calls = []
    real = P._pointed

    def counted(schema: dict[str, Any], ref: str) -> Any:
        calls.append(ref)
        return real(schema, ref)

    monkeypatch.setattr(P, "_pointed", counted)
    n = 2000
    defs: dict[str, Any] = {f"a{i}": {"$ref": f"#/$defs/a{i + 1}"} for i in range(n)}
    defs[f"a{n}"] = {"type": "string"}
    P._no_ref_loops({"properties": {"x": {"$ref": "#/$defs/a0"}}, "$defs": defs})
    assert len(calls) == n + 1
    defs[f"a{n}"] = {"$ref": "#/$defs/a0"}  # closed into a loop: found, still linearly
    calls.clear()
    with pytest.raises(ValueError, match="refers back to itself"):
        P._no_ref_loops({"properties": {"x": {"$ref": "#/$defs/a0"}}, "$defs": defs})
    assert len(calls) == n + 1


@pytest.mark.parametrize(("data", "param"), [
    ({"tools": []}, "tools"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "assistant", "content": "x", "tool_calls": []},
                   {"role": "user", "content": "y"}]}, "messages[0].tool_calls"),
])
def test_an_empty_array_is_refused_as_openai_refuses_it(data: dict[str, Any],
                                                        param: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        chat(**data)
    assert (e.value.param, e.value.code) == (param, "empty_array")
    assert "empty array" in e.value.message


def test_json_mode_needs_the_word_json_in_the_messages() -> None:
    with pytest.raises(InvalidRequest) as e:
        chat(response_format={"type": "json_object"})
    assert e.value.param == "messages" and "'json'" in e.value.message
    chat(response_format={"type": "json_object"},
         messages=[{"role": "system", "content": "Answer in JSON."}, *MSG])
    with pytest.raises(InvalidRequest) as e:
        _responses_json("Give me an object.")
    assert e.value.param == "input" and "`text.format`" in e.value.message
    _responses_json("Give me an object.", instructions="Reply with json.")
    _responses_json("Give me a JSON object.")


def _responses_json(text: str, **kw: Any) -> Any:
    from proxy.openai_responses.translate import chat_request
    return chat_request(parse_model(ResponsesRequest, {
        "model": "m", "input": text, "text": {"format": {"type": "json_object"}}, **kw}), [])


def _nested(levels: int) -> dict[str, Any]:
    """A strict schema of `levels` objects, each the one property of the one above."""
    node: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        node = {"type": "object", "properties": {"n": node}, "required": ["n"],
                "additionalProperties": False}
    return node


NESTED_11 = _nested(11)

STRICT_OK = {"type": "object", "properties": {"a": {"type": "string"}, "b": {
    "type": "array", "items": {"type": "object", "properties": {"x": {"type": "integer"}},
                               "required": ["x"], "additionalProperties": False}}},
    "required": ["a", "b"], "additionalProperties": False}


@pytest.mark.parametrize(("schema", "said"), [
    ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
     "In context=(), 'additionalProperties' is required to be supplied and to be false"),
    ({**STRICT_OK, "required": ["a"]}, "Missing 'b'"),
    ({**STRICT_OK, "required": ["a", "b", "zzz"]}, "Extra required key 'zzz' supplied."),
    ({**STRICT_OK, "$defs": {"a": {"type": "object", "properties": {}}}},
     "In context=('$defs', 'a'), 'additionalProperties'"),
    ({**STRICT_OK, "dependencies": {"a": ["b"]}}, "In context=(), 'dependencies' is not "
                                                  "permitted."),
    ({**STRICT_OK, "properties": {**STRICT_OK["properties"], "a": {
        "type": "string", "not": {"const": "x"}}}},
     "In context=('properties', 'a'), 'not' is not permitted."),
    ({**STRICT_OK, "properties": {**STRICT_OK["properties"], "c": {
        "type": "array", "items": {"type": "integer"}, "contains": {"const": 1}}},
      "required": ["a", "b", "c"]}, "In context=('properties', 'c'), 'contains' is not "
                                    "permitted."),
    ({**STRICT_OK, "if": {"properties": {"a": {"const": "x"}}}, "then": {"required": ["b"]}},
     "In context=(), 'if' is not permitted."),
    # (OpenAI supports `anyOf` alone: a discriminated union's `oneOf` is refused)
    ({**STRICT_OK, "properties": {**STRICT_OK["properties"], "a": {"oneOf": [
        {"type": "string"}, {"type": "integer"}]}}},
     "In context=('properties', 'a'), 'oneOf' is not permitted."),
    ({**STRICT_OK, "properties": {**STRICT_OK["properties"], "b": {"type": "array", "items": {
        "type": "object", "properties": {"x": {"type": "integer"}}}}}},
     "In context=('properties', 'b', 'items'), 'additionalProperties'"),

    # an untyped subschema (any value: the grammar holds nothing there)
    ({**STRICT_OK, "properties": {**STRICT_OK["properties"], "a": {"description": "x"}}},
     "In context=('properties', 'a'), schema must have a 'type' key."),
    ({**STRICT_OK, "properties": {**STRICT_OK["properties"], "a": True}},
     "In context=('properties', 'a'), schema must have a 'type' key."),
    ({**STRICT_OK, "properties": {**STRICT_OK["properties"], "b": {
        "type": "array", "items": {}}}},
     "In context=('properties', 'b', 'items'), schema must have a 'type' key."),
    ({**STRICT_OK, "properties": {**STRICT_OK["properties"], "a": {"anyOf": [
        {"type": "string"}, {}]}}},
     "In context=('properties', 'a', 'anyOf', '1'), schema must have a 'type' key."),
    # an array that says nothing of its items (any values, OpenAI's words)
    ({**STRICT_OK, "properties": {**STRICT_OK["properties"], "b": {"type": "array"}}},
     "In context=('properties', 'b'), array schema missing items."),
    ({**STRICT_OK, "properties": {**STRICT_OK["properties"], "b": {
        "type": ["array", "null"]}}},
     "In context=('properties', 'b'), array schema missing items."),
    # an object with no properties (closed, it could take `{}` alone)
    ({**STRICT_OK, "properties": {**STRICT_OK["properties"], "a": {
        "type": "object", "additionalProperties": False}}},
     "In context=('properties', 'a'), object schema missing properties."),
    # (said first, as OpenAI says it for `{"type": "object"}` and a map of strings)
    ({**STRICT_OK, "properties": {**STRICT_OK["properties"], "a": {"type": "object"}}},
     "In context=('properties', 'a'), object schema missing properties."),
    ({**STRICT_OK, "properties": {**STRICT_OK["properties"], "a": {
        "type": "object", "additionalProperties": {"type": "string"}}}},
     "In context=('properties', 'a'), object schema missing properties."),
    # past OpenAI's documented limits
    (NESTED_11, "11 levels of nesting exceeds limit of 10."),
    ({**STRICT_OK, "properties": {**STRICT_OK["properties"], "a": {
        "type": "string", "enum": [f"v{i}" for i in range(1001)]}}},
     "1001 enum values exceeds limit of 1000."),
    ({**STRICT_OK, "properties": {**STRICT_OK["properties"], "a": {
        "type": "string", "enum": [f"{i:03}" + "x" * 60 for i in range(251)]}}},
     "In context=('properties', 'a'), 15813 characters of enum values exceeds limit of "
     "15000 for an enum of more than 250 values."),
])
def test_strict_schemas_follow_openais_strict_mode(schema: dict[str, Any], said: str) -> None:
    """`strict: true` on a schema OpenAI's strict mode refuses is a 400 saying why (it was
    accepted, and the answer held to a shape the caller did not describe); without
    `strict` the same schema is served."""
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
    # (OpenAI's params and codes: the schema's param, `response_format` with no code)
    cases = [
        (lambda s: chat(tools=[{**tool, "function": {**tool["function"], "strict": s}}]),
         "tools[0].function.parameters", "invalid_function_parameters", "function 'f'"),
        (lambda s: chat(response_format={**fmt, "json_schema": {**fmt["json_schema"],
                                                                "strict": s}}),
         "response_format", None, "response_format 'n'"),
        (lambda s: parse_model(ResponsesRequest, {"model": "m", "input": "x", "tools": [
            {"type": "function", "name": "f", "parameters": schema, "strict": s}]}),
         "tools[0].parameters", "invalid_function_parameters", "function 'f'"),
        (lambda s: parse_model(ResponsesRequest, {"model": "m", "input": "x", "text": {
            "format": {"type": "json_schema", "name": "n", "schema": schema, "strict": s}}}),
         "text.format.schema", "invalid_json_schema", "response_format 'n'"),
    ]
    for make, param, code, what in cases:
        with pytest.raises(InvalidRequest) as e:
            make(True)
        assert (e.value.status, e.value.param, e.value.code) == (400, param, code)
        # (a limit past, in OpenAI's words, says no context: "N ... exceeds limit of L.")
        where = "" if "exceeds limit" in said and "context" not in said else "In context="
        assert e.value.message.startswith(f"Invalid schema for {what}: {where}")
        assert said in e.value.message and e.value.message.endswith(".")
        make(False)
        make(None)


class _CountedList(list[Any]):
    """A list that counts the membership tests made of it."""

    tests = 0

    def __contains__(self, item: object) -> bool:
        _CountedList.tests += 1
        return super().__contains__(item)


def test_the_strict_check_is_linear(monkeypatch: pytest.MonkeyPatch) -> None:
    """The strict check's work is linear in the schema: where a subschema stands is
    written only where one is refused (4,000 subschemas under a 110,000-character
    property name wrote the name 4,000 times, seconds of CPU), and an object's
    `required` is not searched once per property (4,000 properties: 16 million
    comparisons)."""
    import proxy.protocol as protocol
    from proxy.errors import shown as real
    written = []

    def counted(value: object, limit: int = 200) -> str:
        written.append(len(str(value)))
        return real(value, limit)

    monkeypatch.setattr(protocol, "shown", counted)
    name = "k" * 110_000
    deep: dict[str, Any] = {"type": "object", "properties": {name: {"type": "array", "items": {
        "anyOf": [{"type": "string"} for _ in range(4000)]}}}, "required": [name],
            "additionalProperties": False}
    assert strict_problem(deep) is None
    assert sum(written) < 1000
    deep["properties"][name]["items"]["anyOf"].append({"description": "any"})
    said = strict_problem(deep) or ""
    assert said.startswith("In context=('properties', 'kkk") and len(said) < 400
    wide = {"type": "object", "additionalProperties": False,
            "properties": {f"p{i}": {"type": "string"} for i in range(4000)},
            "required": _CountedList(f"p{i}" for i in range(3999, -1, -1))}
    _CountedList.tests = 0
    assert strict_problem(wide) is None
    assert _CountedList.tests < 10


def test_strict_modes_other_limits_are_said() -> None:
    """The limits a request's own (4,096 objects and arrays, 65,536 characters of enum
    values in a compiled schema) may meet first: 5,000 properties in all, 120,000
    characters of names and enum values."""
    wide = {"type": "object", "additionalProperties": False, "required": [], "properties": {},
            "$defs": {f"d{i}": {"type": "object", "additionalProperties": False,
                                "required": [f"p{j}" for j in range(500)],
                                "properties": {f"p{j}": {"type": "null"} for j in range(500)}}
                      for i in range(11)}}
    # (OpenAI's words, as a client quoted them: "144 parameters exceed the limit of 100.")
    assert strict_problem(wide) == "5500 parameters exceed the limit of 5000."
    del wide["$defs"]["d10"]
    assert strict_problem(wide) is None
    long = {**STRICT_OK, "properties": {**STRICT_OK["properties"], "a": {
        "type": "string", "enum": ["x" * 60_001, "y" * 60_000]}}}
    assert (strict_problem(long) or "").endswith(
        " characters of property names, definition names, enum and const values exceeds "
        "limit of 120000.")
    long["properties"]["a"]["enum"] = ["x" * 60_000, "y" * 59_000]
    assert strict_problem(long) is None


def test_strict_nesting_is_counted_through_refs() -> None:
    """Objects nest as deep through `$ref`s as inline: a chain of 11 Pydantic models (the
    SDK sends each in `$defs`) is past strict mode's 10 levels, 10 are within it, and a
    recursive model (a reference back to a schema it is inside) is taken."""
    import openai
    from openai.lib._parsing._completions import type_to_response_format_param
    from pydantic import BaseModel, create_model

    def chain(levels: int) -> type[BaseModel]:
        model: type[BaseModel] = create_model("M0", n=(int, ...))
        for i in range(1, levels):
            model = create_model(f"M{i}", n=(model, ...))
        return model

    for make in (lambda m: chat(tools=[openai.pydantic_function_tool(m)]),
                 lambda m: chat(response_format=type_to_response_format_param(m))):
        with pytest.raises(InvalidRequest) as e:
            make(chain(11))
        assert e.value.message.endswith(": 11 levels of nesting exceeds limit of 10.")
        make(chain(10))

    class Tree(BaseModel):
        name: str
        children: list[Tree]

    chat(tools=[openai.pydantic_function_tool(Tree)])
    chat(response_format=type_to_response_format_param(Tree))


def test_strict_nesting_through_a_diamond_of_refs_is_linear(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each `$def` of a chain of 60 refers to the next twice (2^60 paths): the depth is
    found reading each subschema a bounded number of times, taken where the chain is of
    unions (one object deep) and refused where it is of objects (60 deep)."""
    import proxy.protocol as protocol
    real = protocol.subschemas
    read = [0]

    def counted(node: dict[str, Any]) -> Any:
        read[0] += 1
        return real(node)

    monkeypatch.setattr(protocol, "subschemas", counted)
    leaf = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"],
            "additionalProperties": False}
    unions: dict[str, Any] = {"d60": leaf}
    objects: dict[str, Any] = {"d60": leaf}
    for i in range(60):
        ref = {"$ref": f"#/$defs/d{i + 1}"}
        unions[f"d{i}"] = {"anyOf": [ref, dict(ref)]}
        objects[f"d{i}"] = {"type": "object", "properties": {"l": ref, "r": dict(ref)},
                            "required": ["l", "r"], "additionalProperties": False}
    for defs, refused in ((unions, False), (objects, True)):
        schema = {"type": "object", "properties": {"x": {"$ref": "#/$defs/d0"}},
                  "required": ["x"], "additionalProperties": False, "$defs": defs}
        read[0] = 0
        said = strict_problem(schema)
        assert (said is not None) == refused
        assert read[0] < 10 * 200


def _strict_object(props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props),
            "additionalProperties": False}


def test_strict_nesting_through_a_recursion_adds_nothing_in_any_order() -> None:
    """A recursion through `$ref`s (schemas that lead back to each other) adds nothing,
    however many schemas take part and in whatever order the walk meets them: twelve
    mutually recursive Pydantic models (a union of node kinds, each holding a node) are
    taken, and a pair that refer to each other nests as deep whichever the properties
    name first; what hangs off a recursion without leading back still counts."""
    import openai
    from openai.lib._parsing._completions import type_to_response_format_param

    kinds = [f"K{i}" for i in range(12)]
    union = " | ".join(kinds)
    space: dict[str, Any] = {}
    exec("from typing import Literal\nfrom pydantic import BaseModel\n" + "".join(
        f"class {k}(BaseModel):\n    kind: Literal['{k}']\n    child: {union} | None\n"
        for k in kinds), space)
    for k in kinds:
        space[k].model_rebuild(_types_namespace=space)
    chat(tools=[openai.pydantic_function_tool(space["K0"])])
    chat(response_format=type_to_response_format_param(space["K0"]))

    def pair(first: str, links: int) -> dict[str, Any]:
        # (A and B refer to each other; A also holds a chain of `links` objects)
        defs = {f"C{i}": _strict_object(
            {"c": {"$ref": f"#/$defs/C{i + 1}"}} if i < links - 1 else {"v": {"type": "string"}})
            for i in range(links)}
        defs["A"] = _strict_object({"b": {"$ref": "#/$defs/B"}, "deep": {"$ref": "#/$defs/C0"}})
        defs["B"] = _strict_object({"a": {"anyOf": [{"$ref": "#/$defs/A"}, {"type": "null"}]}})
        props = {"a": {"$ref": "#/$defs/A"}, "b": {"$ref": "#/$defs/B"}}
        if first == "b":
            props = dict(reversed(props.items()))
        return {**_strict_object(props), "$defs": defs}

    for first in ("a", "b"):  # (the root, A, then the chain: 10 objects; then 11)
        assert strict_problem(pair(first, 8)) is None
        assert strict_problem(pair(first, 9)) == "11 levels of nesting exceeds limit of 10."


def test_the_sdks_strict_schemas_of_ordinary_models_are_taken() -> None:
    """What the OpenAI SDK's strict helpers send for ordinary Pydantic models (optional,
    enum, literal, nested and recursive models, lists, sets, tuples, dates, UUIDs) is
    served under `strict: true`: the keywords strict mode refuses are none of theirs (a
    `set` says `uniqueItems`, which is taken)."""
    import datetime
    import enum
    import uuid
    from typing import Literal

    import openai
    from openai.lib._parsing._completions import type_to_response_format_param
    from pydantic import BaseModel, Field

    class Colour(enum.Enum):
        RED = "red"
        BLUE = "blue"

    class Inner(BaseModel):
        n: int = Field(ge=0, le=9)
        child: Inner | None = None

    class Everything(BaseModel):
        name: str | None
        colour: Colour
        mode: Literal["a", "b"]
        inner: Inner
        items: list[Inner]
        tags: set[str]
        pair: tuple[int, str]
        when: datetime.datetime
        day: datetime.date
        id: uuid.UUID

    chat(tools=[openai.pydantic_function_tool(Everything)])
    chat(response_format=type_to_response_format_param(Everything))


@pytest.mark.parametrize("root", ["array", ["object", "null"], None, "untyped"])
def test_a_strict_formats_root_is_an_object(root: Any) -> None:
    """A format's root must say `type: "object"` (OpenAI's root is an object): another
    type, an `anyOf`, or no type at all (a function's parameters may say none)."""
    untyped = {k: v for k, v in STRICT_OK.items() if k != "type"}
    schema = untyped if root == "untyped" else {**STRICT_OK, "type": root} if root else {
        "anyOf": [STRICT_OK]}
    for make, param in (
            (lambda s: chat(response_format={"type": "json_schema", "json_schema": {
                "name": "n", "schema": schema, "strict": s}}), "response_format"),
            (lambda s: parse_model(ResponsesRequest, {"model": "m", "input": "x", "text": {
                "format": {"type": "json_schema", "name": "n", "schema": schema,
                           "strict": s}}}), "text.format.schema")):
        with pytest.raises(InvalidRequest) as e:
            make(True)
        assert e.value.param == param
        assert "schema must be a JSON Schema of 'type: \"object\"', got 'type: " in (
            e.value.message)
        make(False)
    if root == "untyped":
        chat(tools=[{"type": "function", "function": {"name": "f", "strict": True,
                                                      "parameters": schema}}])


def test_a_strict_schema_that_follows_strict_mode_is_served() -> None:
    chat(tools=[{"type": "function", "function": {"name": "f", "strict": True,
                                                  "parameters": STRICT_OK}}])
    # a vendor extension's value is data, not a schema
    chat(tools=[{"type": "function", "function": {"name": "f", "strict": True, "parameters": {
        **STRICT_OK, "x-meta": {"type": "object", "owner": "team"}}}}])
    chat(response_format={"type": "json_schema", "json_schema": {
        "name": "n", "strict": True, "schema": STRICT_OK}})


def test_a_ref_to_an_anchor_is_a_400_naming_the_schema() -> None:
    """The grammar compiler follows JSON pointers only: it dropped an anchor's reference
    (`#name`) with a warning on stderr, and the strict answer held any value there."""
    schema = {"type": "object", "properties": {"a": {"$ref": "#num"}}, "required": ["a"],
              "$defs": {"N": {"$anchor": "num", "type": "integer"}}}
    for make, param in (
            (lambda: chat(tools=[{"type": "function", "function": {
                "name": "f", "parameters": schema}}]), "tools[0].function.parameters"),
            (lambda: chat(response_format={"type": "json_schema", "json_schema": {
                "name": "n", "schema": schema}}), "response_format.json_schema.schema"),
            (lambda: parse_model(ResponsesRequest, {"model": "m", "input": "x", "text": {
                "format": {"type": "json_schema", "name": "n", "schema": schema}}}),
             "text.format.schema")):
        with pytest.raises(InvalidRequest) as e:
            make()
        assert e.value.param == param and e.value.code == "invalid_value"
        assert "`$ref` '#num' names an anchor" in e.value.message
    # the same schema by a pointer is served; an anchor declared but not used is no harm
    pointed = {**schema, "properties": {"a": {"$ref": "#/$defs/N"}}}
    chat(tools=[{"type": "function", "function": {"name": "f", "parameters": pointed}}])
    chat(response_format={"type": "json_schema", "json_schema": {"name": "n",
                                                                 "schema": pointed}})


def test_a_ref_to_nothing_is_a_400_naming_it() -> None:
    """(the grammar compiler's error named Weir's rewrite of the schema, `$defs/tool0`)"""
    with pytest.raises(InvalidRequest) as e:
        chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"$ref": "#/$defs/Missing"}}}}}])
    assert e.value.param == "tools[0].function.parameters"
    assert "`#/$defs/Missing` points at nothing" in e.value.message
    for escaped in ("a~1b", "a%20b"):  # valid pointers the grammar compiler cannot follow
        with pytest.raises(InvalidRequest) as e:
            chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {
                "type": "object", "properties": {"a": {"$ref": f"#/$defs/{escaped}"}},
                "$defs": {"a/b": {"type": "string"}, "a b": {"type": "string"}}}}}])
        assert "escaped name" in e.value.message and "tool0" not in e.value.message
    with pytest.raises(InvalidRequest) as e:  # an array's item: the compiler cannot follow
        chat(response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": {
            "type": "object", "properties": {
                "a": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
                "b": {"$ref": "#/properties/a/anyOf/0"}}}}})
    assert "`#/properties/a/anyOf/0` points into an array" in e.value.message
    chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {  # not escaped
        "type": "object", "properties": {"a": {"$ref": "#/$defs/a%"}},
        "$defs": {"a%": {"type": "string"}}}}}])
    chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"$ref": "#/$defs/A"}},
        "$defs": {"A": {"type": "string"}}}}}])


@pytest.mark.parametrize(("model", "extra", "param", "code", "said"), [
    (ChatCompletionRequest, {"response_format": {"type": "xml"}}, "response_format.type",
     "invalid_value", "Invalid value: 'xml'. Supported values are: 'text', 'json_object', "
     "and 'json_schema'."),
    (ChatCompletionRequest, {"prompt_cache_retention": "1h"}, "prompt_cache_retention",
     "invalid_value", "Invalid value: '1h'. Supported values are: 'in_memory' and '24h'."),
    (ChatCompletionRequest, {"messages": [{"role": 5, "content": "x"}]}, "messages[0].role",
     "invalid_type", "Invalid type for `messages[0].role`: expected one of 'system', "
     "'developer', 'user', 'assistant', 'tool', and 'function', but got an integer instead."),
    (ChatCompletionRequest, {"verbosity": "loud"}, "verbosity", "invalid_value",
     "Invalid value: 'loud'. Supported values are: 'low', 'medium', and 'high'."),
    (ChatCompletionRequest, {"messages": [{"role": "system", "content": [
        {"type": "refusal", "refusal": "no"}]}]}, "messages[0].content[0].type",
     "invalid_value", "Invalid value: 'refusal'. Supported values are: 'text'."),
    (ResponsesRequest, {"truncation": "sometimes"}, "truncation", "invalid_value",
     "Invalid value: 'sometimes'. Supported values are: 'auto' and 'disabled'."),
    (ResponsesRequest, {"truncation": 5}, "truncation", "invalid_type",
     "Invalid type for `truncation`: expected one of 'auto' and 'disabled', but got an "
     "integer instead."),
    (ResponsesRequest, {"input": [{"role": "user", "content": [
        {"type": "refusal", "refusal": "no"}]}]}, "input[0].content[0]", "invalid_value",
     "Invalid value: 'refusal'. Supported values are: 'input_text', 'input_image', and "
     "'input_file'."),
])
def test_every_list_of_supported_values_is_worded_alike(
        model: Any, extra: dict[str, Any], param: str, code: str, said: str) -> None:
    """One helper words them all, as OpenAI does: the enum table's, a `Literal` field's
    (it said "Input should be 'a', 'b' or 'c'"), a misplaced part's and the Responses
    API's `truncation` (it listed 'disabled' alone, and a number was an invalid value)."""
    body = ({"model": "m", "messages": MSG} if model is ChatCompletionRequest
            else {"model": "m", "input": "hi"})
    with pytest.raises(InvalidRequest) as e:
        parse_model(model, {**body, **extra})
    assert (e.value.param, e.value.code, e.value.message) == (param, code, said)


def test_an_object_where_a_string_or_an_object_goes_is_told_what_is_wrong_inside() -> None:
    """`tool_choice` is one of its strings or a named function: an object whose
    `function` is null is told so (`tool_choice.function`), not that the object is not
    'none', 'auto' or 'required'."""
    with pytest.raises(InvalidRequest) as e:
        parse_model(ChatCompletionRequest, {
            "model": "m", "messages": MSG, "tools": [{"type": "function", "function": {
                "name": "f"}}], "tool_choice": {"type": "function", "function": None}})
    assert (e.value.param, e.value.code) == ("tool_choice.function", "invalid_type")
    assert e.value.message == ("Invalid type for `tool_choice.function`: expected an object, "
                               "but got null instead.")


@pytest.mark.parametrize(("model", "extra", "expected"), [
    (ResponsesRequest, {"reasoning": "high"}, "an object"),
    (ResponsesRequest, {"reasoning": []}, "an object"),
    (ResponsesRequest, {"conversation": 5}, "a string"),
    (ResponsesRequest, {"prompt": "pmpt_1"}, "an object"),
    (ResponsesRequest, {"context_management": {"type": "compaction"}}, "an array"),
    (ResponsesRequest, {"moderation": True}, "an object"),
    (ChatCompletionRequest, {"audio": "alloy"}, "an object"),
    (ChatCompletionRequest, {"web_search_options": 5}, "an object"),
    (ChatCompletionRequest, {"functions": "f"}, "an array"),
    (ChatCompletionRequest, {"functions": {"name": "f"}}, "an array"),
    (ChatCompletionRequest, {"moderation": "strict"}, "an object"),
])
def test_an_unsupported_parameter_of_the_wrong_type_is_told_its_type(
        model: type, extra: dict[str, Any], expected: str) -> None:
    """`reasoning: "high"` was refused as "this model does not reason" where a
    `max_tool_calls: "3"` (or chat's `modalities: "text"`) is told its type: OpenAI checks
    a parameter's type before anything else, and a caller sending the wrong shape should
    hear that, not that the feature is missing (fixing only that would meet the next
    400)."""
    base: dict[str, Any] = ({"model": "m", "messages": MSG} if model is ChatCompletionRequest
                            else {"model": "m", "input": "hi"})
    name = next(iter(extra))
    with pytest.raises(InvalidRequest) as e:
        parse_model(model, {**base, **extra})
    assert (e.value.param, e.value.code) == (name, "invalid_type"), e.value.message
    assert f"Invalid type for `{name}`: expected {expected}" in e.value.message


class _ReadWhole(list):  # type: ignore[type-arg]
    """A prompt that fails a test that reads it whole."""

    def __iter__(self) -> Any:
        raise AssertionError("the prompt was read whole")


@pytest.mark.parametrize(("prompt", "count"), [
    ([5, 6, 7], 1), ([[5, 6], [7]], 2), (["a", "b", "c"], 3)])
def test_a_completion_s_choices_are_counted_without_reading_its_prompt(
        prompt: list[Any], count: int) -> None:
    """A request's choice count (`sequences`), read on every completion (the route's
    framing of several choices, the upstream, the admission gate), scanned and copied a
    token-id prompt whole: 2 ms for 32k tokens, each time. It looks at its first item."""
    req = CompletionRequest.model_validate({"model": "m", "prompt": prompt, "n": 2})
    object.__setattr__(req, "prompt", _ReadWhole(req.prompt))
    assert req.sequences == 2 * count
