"""Every sampling value is checked against the engine's real limits at parse time: a value
vLLM would refuse (or could not carry to its engine process) is a 400 naming the param,
never a request that reaches the engine."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.errors import InvalidRequest
from proxy.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    parse_model,
)

MSG = [{"role": "user", "content": "hi"}]
NAN, INF = float("nan"), float("inf")


def chat(**kw: Any) -> ChatCompletionRequest:
    return parse_model(ChatCompletionRequest, {"model": "m", "messages": MSG, **kw})


def rejected(model: type, data: dict[str, Any]) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as e:
        parse_model(model, data)
    assert e.value.status == 400 and e.value.type == "invalid_request_error"
    return e.value


@pytest.mark.parametrize(
    ("kw", "param"),
    [
        ({"seed": 2**64}, "seed"),  # the engine's transport cannot carry it (issue 16)
        ({"seed": 2**63}, "seed"),
        ({"seed": -(2**63) - 1}, "seed"),
        ({"seed": 10**30}, "seed"),
        ({"temperature": NAN}, "temperature"),
        ({"temperature": INF}, "temperature"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": NAN}, "top_p"),
        ({"top_p": 1.01}, "top_p"),
        ({"min_p": 1.5}, "min_p"),  # vLLM's extensions, within vLLM's own bounds
        ({"min_p": -0.1}, "min_p"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"repetition_penalty": -1}, "repetition_penalty"),
        ({"repetition_penalty": NAN}, "repetition_penalty"),
        ({"top_k": -2}, "top_k"),
        ({"top_k": 2**31}, "top_k"),
        ({"top_k": 2**64}, "top_k"),
        ({"presence_penalty": NAN}, "presence_penalty"),
        ({"frequency_penalty": -INF}, "frequency_penalty"),
        ({"frequency_penalty": -2.01}, "frequency_penalty"),
        ({"logit_bias": {"7": NAN}}, "logit_bias"),  # as OpenAI names it
        ({"logit_bias": {"7": -100.5}}, "logit_bias"),  # as OpenAI names it
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"logit_bias": {"-1": 1}}, "logit_bias"),
        ({"logit_bias": {str(2**64): 1}}, "logit_bias"),
        ({"logit_bias": {"１２": 1}}, "logit_bias"),  # full-width digits are not an id
        ({"logit_bias": {str(i): 1 for i in range(1025)}}, "logit_bias"),
        ({"max_tokens": 2**31}, "max_tokens"),
        ({"max_completion_tokens": 2**64}, "max_completion_tokens"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"min_tokens": 2**64}, "min_tokens"),
        ({"min_tokens": 9, "max_tokens": 8}, "min_tokens"),
        ({"min_tokens": 9, "max_completion_tokens": 8, "max_tokens": 100}, "min_tokens"),
        ({"n": 129, "temperature": 1}, "n"),
        ({"stop": ""}, "stop"),
        ({"stop": ["ok", ""]}, "stop[1]"),
        ({"stop": "x" * 1025}, "stop"),
        ({"stop": ["x"] * 5}, "stop"),  # OpenAI's spec: up to 4 (it was 16)
        ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
        ({"top_logprobs": -1, "logprobs": True}, "top_logprobs"),
    ],
)
def test_chat_values_outside_the_engine_limits_name_the_param(kw: dict[str, Any],
                                                              param: str) -> None:
    err = rejected(ChatCompletionRequest, {"model": "m", "messages": MSG, **kw})
    assert err.param == param
    # a number or a length past a bound in OpenAI's codes (`integer_above_max_value`,
    # `decimal_below_min_value`, `array_above_max_length`, ...), anything else a value
    assert err.code in _OPENAI_RANGE_CODES | {"invalid_value"}
    value = kw[param.split("[")[0]]
    if isinstance(value, int | float) and value == value and abs(value) != INF and (
            param not in ("logit_bias", "min_tokens")):
        # the field's kind, not the value's: an integer past a decimal field's bound
        kind = "integer" if param in ("seed", "top_k", "max_tokens", "max_completion_tokens",
                                      "n", "top_logprobs") else "decimal"
        assert err.code.startswith(kind) and err.code in _OPENAI_RANGE_CODES, err.code


def test_a_bound_is_said_as_openai_says_it() -> None:
    err = rejected(ChatCompletionRequest, {"model": "m", "messages": MSG, "temperature": 3})
    assert (err.code, err.message) == ("decimal_above_max_value", "Invalid `temperature`: "
                                       "decimal above maximum value. Expected a value <= 2, "
                                       "but got 3 instead.")
    err = rejected(ChatCompletionRequest, {"model": "m", "messages": MSG, "stop": ["x" * 1025]})
    assert (err.param, err.code) == ("stop[0]", "string_above_max_length")


_OPENAI_RANGE_CODES = {f"{kind}_{side}" for kind in ("integer", "decimal")
                       for side in ("below_min_value", "above_max_value")} | {
    f"{kind}_{side}" for kind in ("string", "array")
    for side in ("below_min_length", "above_max_length")} | {
    "empty_string", "empty_array", "object_below_min_properties",
    "object_above_max_properties"}


@pytest.mark.parametrize(
    ("model", "kw", "param", "code", "said"),
    [
        (ChatCompletionRequest, {"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata",
         "object_above_max_properties", "too many properties. Expected an object with at "
         "most 16 properties, but got an object with 17 properties instead."),
        (ChatCompletionRequest, {"metadata": {"k": "v" * 513}}, "metadata",
         "string_above_max_length", "string too long. Expected a string with maximum "
         "length 512, but got a string with length 513 instead."),
        (ChatCompletionRequest, {"stop": ["x"] * 5}, "stop", "array_above_max_length",
         "array too long. Expected an array with maximum length 4, but got an array with "
         "length 5 instead."),
        (ChatCompletionRequest, {"stop": [""]}, "stop[0]", "empty_string",
         "empty string. Expected a string with minimum length 1, but got an empty string "
         "instead."),
        (ChatCompletionRequest, {"messages": []}, "messages", "empty_array",
         "empty array. Expected an array with minimum length 1, but got an empty array "
         "instead."),
        (EmbeddingRequest, {"input": ["x"] * 2049}, "input", "array_above_max_length",
         "array too long. Expected an array with maximum length 2048, but got an array "
         "with length 2049 instead."),
    ],
)
def test_a_length_is_said_as_openai_says_it(model: Any, kw: dict[str, Any], param: str,
                                             code: str, said: str) -> None:
    """OpenAI's words and codes for a length or a count of properties (a client reads
    "maximum length (\\d+)" to cut its request down): an object's are properties, not an
    array's items, and an empty string is `empty_string`, as an empty array is
    `empty_array`."""
    body = {"model": "m", **({"messages": MSG} if model is ChatCompletionRequest
                              else {"input": "x"}), **kw}
    err = rejected(model, body)
    assert (err.param, err.code, err.message) == (param, code, f"Invalid `{param}`: {said}")


@pytest.mark.parametrize(
    ("kw", "param"),
    [
        ({"seed": 2**64}, "seed"),
        ({"stop": ["x"] * 5}, "stop"),  # OpenAI's `StopConfiguration` holds for both
        ({"logprobs": 6}, "logprobs"),
        ({"best_of": 21}, "best_of"),
        ({"max_tokens": 2**40}, "max_tokens"),
        ({"min_tokens": 17}, "min_tokens"),  # over the default max_tokens of 16
        ({"prompt": [2**31]}, "prompt[0]"),
        ({"prompt": [[1], [2**64]]}, "prompt[1][0]"),
    ],
)
def test_completion_values_outside_the_engine_limits(kw: dict[str, Any], param: str) -> None:
    err = rejected(CompletionRequest, {"model": "m", "prompt": "x", **kw})
    assert err.param == param


@pytest.mark.parametrize(
    "kw",
    [
        {"seed": 2**63 - 1}, {"seed": -(2**63)}, {"seed": 0},
        {"temperature": 0}, {"temperature": 2}, {"top_p": 1e-9}, {"top_p": 1},
        {"top_k": -1}, {"top_k": 0}, {"top_k": 2**31 - 1},
        {"presence_penalty": -2}, {"frequency_penalty": 2},
        {"logit_bias": {"0": -100, str(2**31 - 1): 100}},
        {"max_tokens": 2**31 - 1}, {"min_tokens": 8, "max_tokens": 8},
        {"min_tokens": 5},  # no output limit given: the engine's room decides later
        {"n": 128, "temperature": 0.5}, {"n": 2},  # temperature unset: 1.0
        {"n": 2, "temperature": 0}, {"n": 2, "temperature": 1e-6},  # greedy: one answer
        {"stop": "x" * 1024}, {"stop": ["a"] * 4}, {"stop": []},
        {"top_logprobs": 20, "logprobs": True},
    ],
)
def test_values_at_the_limits_are_accepted(kw: dict[str, Any]) -> None:
    chat(**kw)
