"""Error details that match recorded real-OpenAI answers (issue 13)."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.errors import InvalidRequest
from proxy.protocol import ChatCompletionRequest, parse_model

MSG = [{"role": "user", "content": "hi"}]


def bad_param(data: dict[str, Any]) -> str | None:
    with pytest.raises(InvalidRequest) as e:
        parse_model(ChatCompletionRequest, {"model": "m", "messages": MSG, **data})
    assert e.value.status == 400
    return e.value.param


def test_a_nested_field_is_named_by_its_path() -> None:
    assert bad_param({"stream": True, "stream_options": {"include_usage": "x"}}) == (
        "stream_options.include_usage")


def test_a_bad_logit_bias_value_names_the_field_not_the_token() -> None:
    assert bad_param({"logit_bias": {"12345": 500}}) == "logit_bias"


def test_fields_whose_names_start_like_type_tags_are_named() -> None:
    # `stream` and `stream_options` begin with "str", a pydantic union tag.
    assert bad_param({"stream": "foo"}) == "stream"
    assert bad_param({"stream_options": "foo", "stream": True}) == "stream_options"


def test_with_several_bad_fields_the_first_in_order_is_named() -> None:
    # A type error on an earlier field wins over a range error on a later one.
    assert bad_param({"stream": "foo", "n": 0}) == "stream"
    assert bad_param({"temperature": "hot", "stream": "foo"}) == "temperature"


def test_assistant_refusal_parts_are_accepted_as_history() -> None:
    req = parse_model(ChatCompletionRequest, {"model": "m", "messages": [
        *MSG, {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't."}]},
        {"role": "user", "content": "why?"}]})
    assert req.messages[1].text() == "I can't."


def test_a_45_character_stop_string_is_accepted() -> None:
    req = parse_model(ChatCompletionRequest, {"model": "m", "messages": MSG, "stop": "x" * 45})
    assert req.stop == "x" * 45


@pytest.mark.parametrize("fmt", [
    {"type": "json_schema", "json_schema": {"name": "p", "strict": True,
                                            "schema": {"type": "string"}}},
    {"type": "json_schema", "json_schema": {"name": "p", "strict": True,
                                            "schema": {"type": "object"}}},
    {"type": "xml"},
])
def test_a_message_ends_in_one_full_stop(fmt: dict[str, Any]) -> None:
    """A check whose own words end a sentence is not given a second full stop ("got
    'type: \\"string\\"'.." it was)."""
    with pytest.raises(InvalidRequest) as e:
        parse_model(ChatCompletionRequest, {"model": "m", "messages": MSG,
                                            "response_format": fmt})
    assert e.value.message.endswith(".") and not e.value.message.endswith("..")


@pytest.mark.parametrize(("after", "seconds", "ms"), [
    (2.5, "3", "2500"), (0.2, "1", "200"), (3.0, "3", "3000"), (1.0001, "2", "1001"),
    (0.3, "1", "300")])
def test_a_503_s_retry_after_is_rounded_up(after: float, seconds: str, ms: str) -> None:
    """Said as the rate limiter and the breaker say it: 2.5 s was `Retry-After: 2`, a
    client honouring it back before the time `retry-after-ms` gave."""
    from proxy.errors import Unavailable

    e = Unavailable("busy", retry_after=after)
    assert (e.headers["retry-after"], e.headers["retry-after-ms"]) == (seconds, ms)


@pytest.mark.parametrize(("wait_ms", "told"), [
    (0, ("1", "1")), (-5, ("1", "1")), (0.4, ("1", "1")), (2500, ("3", "2500")),
    (300.0000001, ("1", "300"))])
def test_a_wait_is_never_told_as_none(wait_ms: float, told: tuple[str, str]) -> None:
    """Every wait Weir tells is formed in one place, never `Retry-After: 0` (a client
    honouring it retries at once, in a loop) nor `retry-after-ms: 0`."""
    from proxy.errors import retry_headers

    assert (retry_headers(wait_ms)["retry-after"], retry_headers(wait_ms)["retry-after-ms"]
            ) == told


def test_an_engine_s_refusal_has_a_code_as_weir_s_own_checks_do() -> None:
    """A schema the grammar compiler refuses was a 400 with `code: null`; Weir's own
    check of the same kind says `invalid_value`."""
    from proxy.engine.base import EngineRejected
    from proxy.generation import map_engine_error

    e = map_engine_error(EngineRejected("could not compile", param="response_format"))
    assert isinstance(e, InvalidRequest)
    assert (e.param, e.code) == ("response_format", "invalid_value")
