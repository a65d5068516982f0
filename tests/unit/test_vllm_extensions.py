"""vLLM's own request extensions (its server's `CompletionRequest` and
`ChatCompletionRequest` fields): each one is honoured by the in-process engine, refused
there with a 400 naming it when it asks for something, or a deliberate no-op. Weir's
models take unknown fields (`extra="allow"`), so a field that is none of these was
accepted and silently ignored: a 200 with another answer than the one asked for."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from proxy.errors import InvalidRequest
from proxy.preparing import prepare_chat, prepare_completion
from proxy.protocol import (
    CHAT_UNSUPPORTED,
    LOCAL_UNSUPPORTED,
    MAX_ALLOWED_TOKEN_IDS,
    MAX_BAD_WORDS,
    MAX_STOP_TOKEN_IDS,
    VLLM_CHAT_UNSUPPORTED,
    VLLM_COMPLETION_UNSUPPORTED,
    VLLM_FORMER,
    VLLM_NO_OPS,
    ChatCompletionRequest,
    CompletionRequest,
    Unsupported,
    parse_model,
)
from tests.fakes import FakeEngine

with warnings.catch_warnings():  # torch's own import-time deprecations
    warnings.simplefilter("ignore", DeprecationWarning)
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionRequest as VllmChat,
    )
    from vllm.entrypoints.openai.completion.protocol import (
        CompletionRequest as VllmCompletion,
    )

MSG = [{"role": "user", "content": "hi"}]
CHAT: dict[str, Any] = {"model": "m", "messages": MSG}
COMPLETION: dict[str, Any] = {"model": "m", "prompt": "hi"}

#: What the in-process engine refuses (or, for chat's OpenAI table, any engine).
REFUSED_CHAT: Unsupported = {**CHAT_UNSUPPORTED, **LOCAL_UNSUPPORTED, **VLLM_CHAT_UNSUPPORTED}
REFUSED_COMPLETION: Unsupported = VLLM_COMPLETION_UNSUPPORTED


@pytest.mark.parametrize(("vllm_model", "weir_model", "refused"), [
    (VllmChat, ChatCompletionRequest, REFUSED_CHAT),
    (VllmCompletion, CompletionRequest, REFUSED_COMPLETION),
])
def test_every_field_vllm_declares_is_honoured_refused_or_a_deliberate_no_op(
        vllm_model: Any, weir_model: Any, refused: Unsupported) -> None:
    """A vLLM upgrade that adds a request field fails here until the field is honoured
    (a field of Weir's model), refused (a table), or named a no-op (`VLLM_NO_OPS`)."""
    honoured = set(weir_model.model_fields)
    unaccounted = sorted(set(vllm_model.model_fields) - honoured - set(refused)
                         - set(VLLM_NO_OPS))
    assert not unaccounted, f"vLLM fields neither honoured, refused nor no-ops: {unaccounted}"
    # and none is two of them at once (a table entry for an honoured field never fires)
    assert not honoured & (set(refused) | set(VLLM_NO_OPS))
    assert not set(refused) & set(VLLM_NO_OPS)


def test_each_table_entry_is_a_field_vllm_declares() -> None:
    """(but its former fields, which it no longer declares: `VLLM_FORMER`)"""
    vllm = set(VllmChat.model_fields) | set(VllmCompletion.model_fields)
    assert set(VLLM_CHAT_UNSUPPORTED) | set(VLLM_COMPLETION_UNSUPPORTED) | set(
        VLLM_NO_OPS) <= vllm | set(VLLM_FORMER)
    assert not set(VLLM_FORMER) & vllm  # (one vLLM declares again is accounted for anew)


def _vllm_default(model: Any, name: str) -> Any:
    if name in VLLM_FORMER:  # (not declared: sent by a client of an older vLLM)
        return None
    field = model.model_fields[name]
    return None if field.default_factory is not None else field.default


ASKING: dict[str, Any] = {  # a value that asks something, for each refused field
    "use_beam_search": True, "length_penalty": 0.5, "watermarking": True,
    "truncate_prompt_tokens": 8, "truncation_side": "left", "prompt_logprobs": 1,
    "logprob_token_ids": [5], "return_tokens_as_token_ids": True, "return_token_ids": True,
    "routed_experts_prompt_start": 2, "structured_outputs": {"regex": "a+"},
    "priority": 5, "cache_salt": "salty", "kv_transfer_params": {"a": 1},
    "ec_transfer_params": {"a": 1}, "vllm_xargs": {"k": 1},
    "repetition_detection": {"max_pattern_size": 4}, "thinking_token_budget": 10,
    "stream_interval": 4, "echo": True, "documents": [{"title": "t", "text": "x"}],
    "chat_template": "{{ messages }}", "chat_template_kwargs": {"enable_thinking": True},
    "media_io_kwargs": {"image": {}}, "mm_processor_kwargs": {"x": 1},
    "return_prompt_text": True, "prompt_embeds": "AAAA", "reasoning_effort": "low",
    "guided_json": {"type": "object"}, "guided_regex": "a+", "guided_choice": ["yes", "no"],
    "guided_grammar": "root ::= \"a\"",
}


@pytest.mark.parametrize("name", sorted(set(VLLM_CHAT_UNSUPPORTED) | set(LOCAL_UNSUPPORTED)))
def test_a_chat_extension_not_honoured_is_refused_when_it_asks_and_passes_when_not(
        name: str) -> None:
    value = {"add_special_tokens": True}.get(name, ASKING.get(name))
    req = parse_model(ChatCompletionRequest, {**CHAT, name: value})
    with pytest.raises(InvalidRequest) as e:
        prepare_chat(FakeEngine(), req)
    assert (e.value.param, e.value.code) == (name, "unsupported_parameter")
    assert f"`{name}`" in str(e.value)
    # vLLM's default asks nothing: accepted (a client that sends every field as vLLM's
    # SDK models do); so does null
    for inert in ({"reasoning_effort": "none"}.get(name, _vllm_default(VllmChat, name)),
                  None):
        prepare_chat(FakeEngine(), parse_model(ChatCompletionRequest, {**CHAT, name: inert}))


@pytest.mark.parametrize("name", sorted(VLLM_COMPLETION_UNSUPPORTED))
def test_a_completion_extension_not_honoured_is_refused_when_it_asks(name: str) -> None:
    value = {"add_special_tokens": False}.get(name, ASKING.get(name))
    req = parse_model(CompletionRequest, {**COMPLETION, name: value})
    with pytest.raises(InvalidRequest) as e:
        prepare_completion(FakeEngine(), req)
    assert (e.value.param, e.value.code) == (name, "unsupported_parameter")
    for inert in (_vllm_default(VllmCompletion, name), None):
        prepare_completion(FakeEngine(), parse_model(CompletionRequest,
                                                     {**COMPLETION, name: inert}))


def test_the_no_ops_are_accepted() -> None:
    extra = {"request_id": "abc", "session_id": "s", "return_token_offsets": True,
             "mm_payload": "none", "return_mm_kwargs": False, "include_reasoning": False}
    assert set(extra) == set(VLLM_NO_OPS)
    prepare_chat(FakeEngine(), parse_model(ChatCompletionRequest, {**CHAT, **extra}))


# ----------------------------------------------------------------------- honoured


@pytest.mark.parametrize("make", ["chat", "completion"])
def test_honoured_extensions_reach_the_engine_options(make: str) -> None:
    kw = {"stop_token_ids": [7, 9], "include_stop_str_in_output": True,
          "skip_special_tokens": False, "spaces_between_special_tokens": False,
          "allowed_token_ids": [3, 4, 5], "bad_words": ["foo", "bar baz"]}
    prep = (prepare_chat(FakeEngine(), parse_model(ChatCompletionRequest, {**CHAT, **kw}))
            if make == "chat" else
            prepare_completion(FakeEngine(), parse_model(CompletionRequest,
                                                         {**COMPLETION, **kw})))
    o = prep.options
    assert o.stop_token_ids == [7, 9] and o.include_stop_str_in_output
    assert not o.skip_special_tokens and not o.spaces_between_special_tokens
    assert o.allowed_token_ids == [3, 4, 5] and o.bad_words == ["foo", "bar baz"]
    # and the defaults are vLLM's
    plain = prepare_chat(FakeEngine(), parse_model(ChatCompletionRequest, CHAT)).options
    assert (plain.stop_token_ids, plain.allowed_token_ids, plain.bad_words) == (None,) * 3
    assert plain.skip_special_tokens and plain.spaces_between_special_tokens
    assert not plain.include_stop_str_in_output


@pytest.mark.parametrize("param", ["stop_token_ids", "allowed_token_ids"])
def test_token_ids_past_the_vocabulary_are_a_400_naming_the_param(param: str) -> None:
    req = parse_model(ChatCompletionRequest, {**CHAT, param: [5, 1000]})
    with pytest.raises(InvalidRequest) as e:
        prepare_chat(FakeEngine(vocab_size=1000), req)
    assert (e.value.param, e.value.code) == (param, "invalid_value")
    assert "1000" in str(e.value)
    prepare_chat(FakeEngine(vocab_size=1001), req)


@pytest.mark.parametrize(("body", "param", "code"), [
    ({"stop_token_ids": [-1]}, "stop_token_ids[0]", "integer_below_min_value"),
    ({"stop_token_ids": [True]}, "stop_token_ids[0]", "invalid_type"),
    ({"stop_token_ids": list(range(MAX_STOP_TOKEN_IDS + 1))}, "stop_token_ids",
     "array_above_max_length"),
    ({"allowed_token_ids": []}, "allowed_token_ids", "empty_array"),  # vLLM refuses it
    ({"allowed_token_ids": list(range(MAX_ALLOWED_TOKEN_IDS + 1))}, "allowed_token_ids",
     "array_above_max_length"),
    ({"allowed_token_ids": "5"}, "allowed_token_ids", "invalid_type"),
    ({"bad_words": [""]}, "bad_words[0]", "empty_string"),  # vLLM refuses it
    ({"bad_words": ["w"] * (MAX_BAD_WORDS + 1)}, "bad_words", "array_above_max_length"),
    ({"bad_words": ["x" * 1025]}, "bad_words[0]", "string_above_max_length"),
    ({"include_stop_str_in_output": "yes"}, "include_stop_str_in_output", "invalid_type"),
    ({"skip_special_tokens": 0}, "skip_special_tokens", "invalid_type"),
    ({"add_generation_prompt": "false"}, "add_generation_prompt", "invalid_type"),
])
def test_extension_values_vllm_would_refuse_are_a_400_at_parse(
        body: dict[str, Any], param: str, code: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        parse_model(ChatCompletionRequest, {**CHAT, **body})
    assert (e.value.param, e.value.code) == (param, code)


def test_null_extensions_are_their_defaults() -> None:
    req = parse_model(ChatCompletionRequest, {**CHAT, **dict.fromkeys(
        ("stop_token_ids", "allowed_token_ids", "bad_words", "skip_special_tokens",
         "include_stop_str_in_output", "add_generation_prompt", "continue_final_message"))})
    assert req.skip_special_tokens and req.add_generation_prompt
    assert not req.continue_final_message and req.allowed_token_ids is None


# ---------------------------------------------------------------- template controls

PREFILL = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure,"}]


def test_the_template_controls_reach_the_renderer() -> None:
    fake = FakeEngine()
    default = prepare_chat(fake, parse_model(ChatCompletionRequest, {**CHAT,
                                                                     "messages": PREFILL}))
    no_header = prepare_chat(fake, parse_model(ChatCompletionRequest, {
        **CHAT, "messages": PREFILL, "add_generation_prompt": False}))
    prefill = prepare_chat(fake, parse_model(ChatCompletionRequest, {
        **CHAT, "messages": PREFILL, "add_generation_prompt": False,
        "continue_final_message": True}))
    rendered = fake.render_chat(PREFILL, None)
    assert default.prompts == [rendered]
    assert no_header.prompts == [fake.render_chat(PREFILL, None, add_generation_prompt=False)]
    assert prefill.prompts == [fake.render_chat(PREFILL, None, add_generation_prompt=False,
                                                continue_final_message=True)]
    assert len({tuple(p.prompts[0]) for p in (default, no_header, prefill)}) == 3


@pytest.mark.parametrize(("body", "param"), [
    # vLLM refuses both; `add_generation_prompt` is true unless sent false
    ({"messages": PREFILL, "continue_final_message": True}, "add_generation_prompt"),
    ({"messages": PREFILL, "continue_final_message": True, "add_generation_prompt": True},
     "add_generation_prompt"),
    # what is continued is an assistant's text
    ({"messages": MSG, "continue_final_message": True, "add_generation_prompt": False},
     "messages[0]"),
    ({"messages": [*MSG, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "1"}],
      "continue_final_message": True, "add_generation_prompt": False}, "messages[2]"),
])
def test_continue_final_message_needs_a_final_assistant_message_and_no_new_turn(
        body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        parse_model(ChatCompletionRequest, {**CHAT, **body})
    assert (e.value.param, e.value.code) == (param, "invalid_value")


def test_an_assistant_call_without_content_cannot_be_continued() -> None:
    turns = [*MSG, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]
    with pytest.raises(InvalidRequest) as e:
        parse_model(ChatCompletionRequest, {**CHAT, "messages": turns,
                                            "continue_final_message": True,
                                            "add_generation_prompt": False})
    # (its calls unanswered is what OpenAI's rule names first)
    assert e.value.param in ("messages[1]", "messages[1].tool_calls")


def test_a_forced_tool_call_ignores_stop_tokens_as_it_ignores_stop_strings() -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    prep = prepare_chat(FakeEngine(), parse_model(ChatCompletionRequest, {
        **CHAT, "tools": [tool], "tool_choice": "required", "stop_token_ids": [5],
        "stop": ["x"]}))
    assert prep.options.stop == [] and prep.options.stop_token_ids is None


def test_every_field_vllm_s_responses_api_declares_is_accounted_for() -> None:
    """vLLM's own `ResponsesRequest`: each field is Weir's (`ResponsesRequest`), passed
    into the chat request the answer comes from (`translate.VLLM_PASSED`, where chat's
    rules honour or refuse it), refused by the Responses API itself, or a no-op."""
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest as VllmResponses

    from proxy.openai_responses.models import RESPONSES_UNSUPPORTED, ResponsesRequest
    from proxy.openai_responses.translate import VLLM_PASSED

    accounted = (set(ResponsesRequest.model_fields) | VLLM_PASSED | set(RESPONSES_UNSUPPORTED)
                 | set(VLLM_NO_OPS) | {"prompt_cache_key"})  # (OpenAI's caching hint)
    unaccounted = sorted(set(VllmResponses.model_fields) - accounted)
    assert not unaccounted, f"vLLM Responses fields neither honoured, refused nor no-ops: " \
        f"{unaccounted}"
    assert not set(ResponsesRequest.model_fields) & VLLM_PASSED


@pytest.mark.parametrize("name", ["guided_json", "guided_regex", "guided_choice",
                                  "guided_grammar"])
def test_vllm_s_former_guided_fields_are_refused_not_ignored(name: str) -> None:
    """vLLM's server ignores its former guided-decoding fields now; here they were
    ignored too, and a client of an older vLLM got unconstrained text without a word.
    They are a 400 naming them where they ask something (null asks nothing)."""
    value = {"guided_json": {"type": "object"}, "guided_regex": "a+",
             "guided_choice": ["yes", "no"], "guided_grammar": 'root ::= "a"'}[name]
    for model, prepare, body in ((ChatCompletionRequest, prepare_chat, CHAT),
                                 (CompletionRequest, prepare_completion, COMPLETION)):
        with pytest.raises(InvalidRequest) as e:
            prepare(FakeEngine(), parse_model(model, {**body, name: value}))  # type: ignore[operator]
        assert (e.value.param, e.value.code) == (name, "unsupported_parameter")
        assert "response_format" in str(e.value)
        prepare(FakeEngine(), parse_model(model, {**body, name: None}))  # type: ignore[operator]
