"""The members of a tool call's JSON object as a model writes it, read as far as it goes
(a call streamed token by token is JSON cut anywhere): which key each member has, where
its value starts, and where it ends, if it has ended.

For parsers that find a call's `name` and `arguments` in its text (vLLM's hermes reads
the text after `"arguments":` to the object's end, so a member after the arguments, or
arguments written before the name, went out as part of them). No vllm here."""

from __future__ import annotations

import json
from collections.abc import Iterator

from ..jsonbody import skip_ws

_LITERAL_END = ",}] \t\r\n"


def _string_end(text: str, i: int) -> int | None:
    """After the string that opens at `i` (a quote), or None where it runs on."""
    escaped = False
    for j in range(i + 1, len(text)):
        c = text[j]
        if escaped:
            escaped = False
        elif c == "\\":
            escaped = True
        elif c == '"':
            return j + 1
    return None


def _value_end(text: str, i: int) -> int | None:
    """After the JSON value that starts at `i`, or None where it runs on (or may: a
    number at the text's end)."""
    c = text[i]
    if c == '"':
        return _string_end(text, i)
    if c not in "{[":
        j = i
        while j < len(text) and text[j] not in _LITERAL_END:
            j += 1
        return j if j < len(text) else None
    depth, j = 0, i
    while j < len(text):
        c = text[j]
        if c == '"':
            end = _string_end(text, j)
            if end is None:
                return None
            j = end
            continue
        if c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return None


def members(text: str) -> Iterator[tuple[str, int, int | None]]:
    """(key, where its value starts, where it ends or None) for each member of the
    object `text` opens with, in order, as far as they go: a member whose value has not
    begun is not given, nor any past one that runs on."""
    i = skip_ws(text, 0)
    if i >= len(text) or text[i] != "{":
        return
    i += 1
    while True:
        i = skip_ws(text, i)
        if i >= len(text) or text[i] != '"':
            return
        key_end = _string_end(text, i)
        if key_end is None:
            return
        try:
            key = json.loads(text[i:key_end])
        except ValueError:
            return
        i = skip_ws(text, key_end)
        if i >= len(text) or text[i] != ":":
            return
        start = skip_ws(text, i + 1)
        if start >= len(text):
            return
        end = _value_end(text, start)
        yield key, start, end
        if end is None:
            return
        i = skip_ws(text, end)
        if i >= len(text) or text[i] != ",":
            return
        i += 1


def member_text(text: str, key: str) -> str | None:
    """The text of member `key`'s value in the object `text` opens with, as far as it
    goes; None where it has not begun."""
    for k, start, end in members(text):
        if k == key:
            return text[start:end] if end is not None else text[start:]
    return None


def member_string(text: str, key: str) -> str | None:
    """Member `key`'s value where it is a whole JSON string, else None."""
    value = member_text(text, key)
    if value is None or not value.startswith('"') or _string_end(value, 0) != len(value):
        return None
    try:
        out = json.loads(value)
    except ValueError:
        return None
    return out if isinstance(out, str) and out else None
