"""The body decoder's bounds: depth, integer digits, counts, lone surrogates."""

from __future__ import annotations

import json

import pytest

from proxy.errors import InvalidRequest
from proxy.jsonbody import (
    MAX_DEPTH,
    MAX_INT_DIGITS,
    MAX_MESSAGES,
    MAX_PROMPTS,
    check_tree,
    decode_json_object,
)


def nested(depth: int, leaf: str = "0") -> str:
    """`depth` containers in all, alternating lists and objects, around `leaf`."""
    opens = "".join("[" if i % 2 else '{"k":' for i in range(depth))
    closes = "".join("]" if i % 2 else "}" for i in reversed(range(depth)))
    return opens + leaf + closes


def refused(body: str | bytes) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as e:
        decode_json_object(body.encode() if isinstance(body, str) else body)
    assert e.value.status == 400
    return e.value


def test_depth_at_the_bound_passes_and_one_more_is_refused_naming_the_field() -> None:
    ok = decode_json_object(f'{{"tools": {nested(MAX_DEPTH - 1)}}}'.encode())
    assert "tools" in ok
    err = refused(f'{{"model": "m", "tools": {nested(MAX_DEPTH)}}}')
    assert err.param == "tools" and err.code == "invalid_json"


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 300, 970, 5_000, 200_000])
@pytest.mark.parametrize("field", ["messages", "tools", "response_format", "junk"])
def test_any_depth_in_any_field_is_a_400(depth: int, field: str) -> None:
    err = refused(f'{{"{field}": {nested(depth)}}}')
    assert err.param in (field, None)  # None only where json itself gave up first


@pytest.mark.parametrize("depth", [10, 300, 900])
def test_lone_surrogate_deep_inside_is_a_400_not_a_recursion_error(depth: int) -> None:
    lone = '"x\\ud800"'  # the six characters of an escape, as a client sends them
    err = refused('{"a": ' + nested(depth, lone) + "}")
    assert err.code in ("invalid_encoding", "invalid_json")
    paired = decode_json_object(b'{"a": ["\\ud83d\\ude00"]}')  # a pair is one character
    assert paired["a"] == ["\U0001f600"]


def test_lone_surrogate_in_a_key_is_refused() -> None:
    assert refused('{"\\udc00": 1}').code == "invalid_encoding"
    # the error never carries what it refuses, nor a field name past a name's length
    for key in ("<script>\\ud800", "k" * 3000):
        err = refused('{"' + key + '": "\\ud800"}')
        assert err.code == "invalid_encoding" and err.param is None, key
    assert refused('{"model": "\\ud800"}').param == "model"


@pytest.mark.parametrize("digits", [MAX_INT_DIGITS + 1, 4_300, 4_301, 100_000])
def test_long_integers_are_a_400(digits: int) -> None:
    err = refused('{"seed": ' + "9" * digits + "}")
    assert "digits" in err.message
    assert refused('{"seed": -' + "9" * digits + "}").status == 400


def test_integers_within_the_bound_reach_the_models() -> None:
    big = "9" * MAX_INT_DIGITS
    assert decode_json_object(f'{{"seed": {big}}}'.encode())["seed"] == int(big)


@pytest.mark.parametrize("const", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_constants_are_refused(const: str) -> None:
    assert refused(f'{{"temperature": {const}}}').code == "invalid_json"


@pytest.mark.parametrize("literal", ["1e400", "-1E+400", "9" * 400 + ".5"])
def test_a_float_past_a_double_s_range_is_refused_not_read_as_infinity(literal: str) -> None:
    """`json` reads it as infinity, which free-form fields (a tool's JSON schema) would
    carry on, and which no JSON can write back."""
    err = refused(f'{{"tools": [{{"type": "function", "function": {{"name": "f", '
                  f'"parameters": {{"type": "number", "maximum": {literal}}}}}}}]}}')
    assert err.code == "invalid_json" and "cannot be represented" in err.message
    assert decode_json_object(b'{"a": 1e-400, "b": 1e308}') == {"a": 0.0, "b": 1e308}


def test_too_many_messages_are_refused_by_count() -> None:
    msgs = [{"role": "user", "content": "hi"}] * (MAX_MESSAGES + 1)
    err = refused(json.dumps({"model": "m", "messages": msgs}))
    assert (err.param, err.code) == ("messages", "array_above_max_length")
    assert f"maximum length {MAX_MESSAGES}, but got an array with length" in err.message
    ok = decode_json_object(json.dumps({"model": "m", "messages": msgs[:MAX_MESSAGES]}).encode())
    assert len(ok["messages"]) == MAX_MESSAGES


@pytest.mark.parametrize("one", ["hi", [1, 2]], ids=["texts", "token lists"])
def test_a_completions_batch_past_its_bound_is_refused_by_count(one: object) -> None:
    """A batch of 100,000 prompts was taken: each a generation queued on the engine."""
    err = refused(json.dumps({"model": "m", "prompt": [one] * (MAX_PROMPTS + 1)}))
    assert (err.param, err.code) == ("prompt", "array_above_max_length")
    ok = decode_json_object(json.dumps({"model": "m", "prompt": [one] * MAX_PROMPTS}).encode())
    assert len(ok["prompt"]) == MAX_PROMPTS
    # (one prompt's token ids, however many: the context length is their bound)
    ids = decode_json_object(json.dumps({"model": "m", "prompt": [1] * 5000}).encode())
    assert len(ids["prompt"]) == 5000


def test_check_tree_is_iterative() -> None:
    deep: list[object] = []
    node = deep
    for _ in range(100_000):  # far past Python's recursion limit
        child: list[object] = []
        node.append(child)
        node = child
    with pytest.raises(InvalidRequest) as e:
        check_tree({"x": deep})
    assert e.value.param == "x"


# Bodies that the fast decoder (orjson) and the standard one must read alike: integers
# either side of 64 bits (orjson would read past them as floats), surrogate pairs, escapes,
# duplicate keys, floats at the edges, non-ASCII text.
SAME = [
    '{"seed": 9223372036854775807, "n": -9223372036854775808}',
    '{"seed": 18446744073709551615}',
    '{"seed": 123456789012345678901}',
    '{"seed": -123456789012345678901, "x": [1, 2.5, -0, 1e-400, 1.7976931348623157e308]}',
    '{"temperature": 0.1000000000000000055511151231257827}',
    '{"a": "\\ud83d\\ude00 \\u00e9 \\u0000 \\n", "b": "日本語", "a2": "x"}',
    '{"a": 1, "a": 2}',
    '{"messages": [{"role": "user", "content": "card 4111111111111111111"}]}',
    '  {"nested": {"deep": [[[{"k": null}]]]}, "t": true, "f": false}  ',
]


@pytest.mark.parametrize("text", SAME)
def test_the_fast_path_decodes_what_the_standard_library_does(text: str) -> None:
    got = decode_json_object(text.encode())
    want = json.loads(text)
    assert got == want
    assert [type(v) for v in got.values()] == [type(v) for v in want.values()]
    if "seed" in want:
        assert type(got["seed"]) is int and got["seed"] == want["seed"]


@pytest.mark.parametrize("text,code", [
    ('{"a": "\\udc00"}', "invalid_encoding"),
    ('{"a": "\\ud800x"}', "invalid_encoding"),
    ('{"a": 1e400}', "invalid_json"),
    ('\ufeff{"a": 1}', "invalid_json"),
    ('[1, 2]', "invalid_json"),
    ('{"a": 1,}', "invalid_json"),
])
def test_what_the_fast_path_refuses_gets_the_standard_answer(text: str, code: str,
                                                             ) -> None:
    """orjson refuses these; the standard decoder then answers with its own message."""
    assert refused(text).code == code
