"""Request bodies -> JSON objects, with bounds that hostile input cannot get past.

Every body the gateway reads goes through `decode_json_object`, which answers a 400
(OpenAI-shaped, `param` naming the top-level field at fault where there is one) for
anything it will not accept, never a 500:

- not UTF-8, empty, not JSON, not an object;
- an integer literal longer than `MAX_INT_DIGITS` (Python refuses to build ints past
  4,300 digits with a ValueError that `json` does not wrap; nothing Weir accepts needs
  more than 20), the non-standard `NaN` / `Infinity` constants, and a float literal past
  a double's range (`1e400`, which `json` reads as infinity);
- nesting deeper than `MAX_DEPTH` (the OpenAI schema nests a few levels; a JSON schema
  in `response_format` or `tools` perhaps twenty). Everything downstream that walks user
  data (pydantic, the cache key's hash, the sanitizer) may then recurse safely;
- a lone UTF-16 surrogate escape (`"\\ud800"`): valid JSON, but not a character;
- more than `MAX_MESSAGES` messages, `MAX_TOOLS` tools or `MAX_PROMPTS` prompts (a
  completions batch: a list of texts or of token lists): refused before the models
  validate them, so a 100k-message body costs one `json.loads`, not seconds of
  validation on the event loop.

The walk that checks depth and surrogates is iterative (an explicit stack), so no input
can make it overflow Python's recursion limit.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import orjson

from .errors import InvalidRequest

MAX_DEPTH = 64
MAX_INT_DIGITS = 64
MAX_MESSAGES = 2048  # OpenAI's own limit on `messages`
MAX_TOOLS = 128  # OpenAI's own limit on `tools`
# A completions batch (OpenAI's spec bounds none; its embeddings' `input` is bounded so,
# as `messages` is): each prompt is a generation queued on the engine.
MAX_PROMPTS = 2048

# A \uD800-\uDFFF escape: only when the regex sees one are strings checked for a lone one.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_LONG_DIGITS = re.compile(rb"[0-9]{19}")


class _NumberTooLong(ValueError):
    pass


class _BadConstant(ValueError):
    pass


def _parse_int(literal: str) -> int:
    if len(literal.lstrip("-")) > MAX_INT_DIGITS:
        raise _NumberTooLong(literal[:12])
    return int(literal)


def _parse_constant(name: str) -> Any:
    raise _BadConstant(name)


def _parse_float(literal: str) -> float:
    value = float(literal)
    if math.isinf(value):  # a literal past a double's range ("1e400")
        raise ValueError(literal[:12])  # "a number that cannot be represented"
    return value


def loads_finite(text: str) -> Any:
    """`json.loads` that refuses (ValueError) what a body may not hold either: the
    `NaN`/`Infinity` constants, a float past a double's range, an integer past
    `MAX_INT_DIGITS`. For JSON inside strings (call arguments), which would otherwise
    be read as infinities the model is then shown as `Infinity`."""
    return json.loads(text, parse_int=_parse_int, parse_float=_parse_float,
                      parse_constant=_parse_constant)


def _loads(text: str) -> Any:
    try:
        return loads_finite(text)
    except json.JSONDecodeError as e:
        raise InvalidRequest(
            f"We could not parse the JSON body of your request: {e.msg} "
            f"(line {e.lineno}, column {e.colno}).",
            code="invalid_json",
        ) from None
    except _NumberTooLong:
        raise InvalidRequest(
            f"The request body holds an integer of more than {MAX_INT_DIGITS} digits.",
            code="invalid_json",
        ) from None
    except _BadConstant as e:
        raise InvalidRequest(
            f"`{e}` is not valid JSON; numbers must be finite.", code="invalid_json"
        ) from None
    except RecursionError:
        raise _too_deep(_deep_field(text)) from None
    except ValueError:  # any other limit of the decoder (a float literal it cannot hold)
        raise InvalidRequest("The request body holds a number that cannot be represented.",
                             code="invalid_json") from None


_WS = re.compile(r"[ \t\n\r]*")


def skip_ws(text: str, i: int) -> int:
    """The index of the first non-whitespace character (JSON's whitespace) from `i`."""
    m = _WS.match(text, i)
    return m.end() if m else i


def _deep_field(text: str) -> str | None:
    """The top-level field whose value is too deep for `json` itself, if the body is an
    object: its fields are decoded one by one (each in C) until one overflows."""
    dec = json.JSONDecoder(parse_int=_parse_int, parse_constant=_parse_constant)
    i = skip_ws(text, 0)
    if not text.startswith("{", i):
        return None
    i += 1
    try:
        while True:
            key, i = dec.raw_decode(text, skip_ws(text, i))
            i = skip_ws(text, i)
            if not isinstance(key, str) or not text.startswith(":", i):
                return None
            try:
                _, i = dec.raw_decode(text, skip_ws(text, i + 1))
            except RecursionError:
                return key
            i = skip_ws(text, i)
            if not text.startswith(",", i):
                return None
            i += 1
    except ValueError:
        return None


def _too_deep(param: str | None) -> InvalidRequest:
    where = f" in `{param}`" if param else ""
    return InvalidRequest(
        f"The JSON body is nested too deeply{where}: at most {MAX_DEPTH} levels are allowed.",
        param=param, code="invalid_json")


def _check_counts(data: dict[str, Any]) -> None:
    for field, limit in (("messages", MAX_MESSAGES), ("tools", MAX_TOOLS),
                         ("prompt", MAX_PROMPTS)):
        value = data.get(field)
        if field == "prompt" and isinstance(value, list) and value and isinstance(
                value[0], int):
            continue  # (one prompt's token ids: the context length bounds it)
        if isinstance(value, list) and len(value) > limit:
            raise InvalidRequest(  # (as every length past its bound is said)
                f"Invalid `{field}`: array too long. Expected an array with maximum length "
                f"{limit}, but got an array with length {len(value)} instead.", param=field,
                code="array_above_max_length")


def _lone_surrogate(s: str) -> bool:
    if s.isascii():
        return False
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def check_tree(data: dict[str, Any], *, surrogates: bool = True) -> None:
    """Refuse nesting deeper than MAX_DEPTH and (optionally) lone surrogates. Iterative.

    The stack holds (value, depth, top-level field) so the error can name the field.
    """
    stack: list[tuple[Any, int, str | None]] = [(data, 1, None)]
    while stack:
        value, depth, top = stack.pop()
        if depth > MAX_DEPTH:
            raise _too_deep(top)
        if isinstance(value, dict):
            items: Any = value.items()
        else:
            items = enumerate(value)
        for k, v in items:
            field = top if top is not None else str(k)
            if surrogates and isinstance(k, str) and _lone_surrogate(k):
                raise _surrogate(field)
            if isinstance(v, str):
                if surrogates and _lone_surrogate(v):
                    raise _surrogate(field)
            elif isinstance(v, (dict, list)):
                stack.append((v, depth + 1, field))


def _surrogate(param: str | None) -> InvalidRequest:
    """Named by its field, unless the field's own name is what holds the surrogate (or is
    past a field name's length): an error must not carry what it refuses."""
    named = param if param is not None and len(param) <= 64 and not _lone_surrogate(
        param) else None
    return InvalidRequest("The request body holds an unpaired UTF-16 surrogate escape; "
                          "strings must be valid Unicode.", param=named,
                          code="invalid_encoding")


def _fast_loads(body: bytes) -> Any:
    """orjson where it decodes exactly what `_loads` would, else None. orjson refuses
    everything `_loads` refuses (bad UTF-8, NaN, an infinite float, a lone surrogate, a
    BOM, deep nesting) and more, so its errors go to `_loads` for the message; what it
    accepts differently, an integer past 64 bits read as a float, is kept from it by
    sending any run of 19 or more digits to `_loads`."""
    if _LONG_DIGITS.search(body) is not None:
        return None
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


def decode_json_object(body: bytes) -> dict[str, Any]:
    """Bytes -> JSON object, or a 400 that says what was wrong (never a 500)."""
    data = _fast_loads(body)
    if isinstance(data, dict):
        _check_counts(data)
        if body.count(b"[") + body.count(b"{") > MAX_DEPTH:
            check_tree(data, surrogates=False)  # orjson refused any lone surrogate
        return data
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidRequest(
            f"The request body is not valid UTF-8 (byte {e.start}).", code="invalid_encoding"
        ) from None
    if not text.strip():
        raise InvalidRequest("The request body is empty; expected a JSON object.",
                             code="invalid_json")
    data = _loads(text)
    if not isinstance(data, dict):
        raise InvalidRequest("The request body must be a JSON object.", code="invalid_json")
    _check_counts(data)
    # Depth can only exceed the bound when there are that many brackets at all: most
    # bodies skip the walk; a string with escapes is only walked when one could be bad.
    deep = text.count("[") + text.count("{") > MAX_DEPTH
    surrogates = "\\u" in text and _SURROGATE_ESCAPE.search(text) is not None
    if deep or surrogates:
        check_tree(data, surrogates=surrogates)
    return data
