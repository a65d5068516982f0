"""The members of a tool call's JSON object as a model writes it, read as far as it goes
(a call streamed token by token is JSON cut anywhere): which key each member has, where
its value starts, and where it ends, if it has ended.

For parsers that find a call's `name` and `arguments` in its text (vLLM's hermes reads
the text after `"arguments":` to the object's end, so a member after the arguments, or
arguments written before the name, went out as part of them). A parser reads a streamed
call's text again at each token: a `Reader` resumes each read where the one before it,
of the text so far, stopped, so one call's reading is linear in its text over the whole
stream, not in each token's text (a long argument, a file's text, re-read at each token
held the event loop for seconds). No vllm here."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from ..jsonbody import skip_ws

#: A string's text up to its closing quote (escapes as pairs), matched in C; stops
#: before a closing quote, or a backslash that ends the text.
_STRING_BODY = re.compile(r'(?:[^"\\]++|\\.)*+', re.DOTALL)
#: What a container's scan stops at: a string's opening quote, or a bracket.
_STRUCTURE = re.compile(r'["{}\[\]]')
#: A literal (number, true, false, null) up to what ends it.
_LITERAL = re.compile(r'[^,}\] \t\r\n]*')

#: Where a value's scan stopped at the text's end: its depth of brackets, where it goes
#: on, and whether that is inside a string.
_Scan = tuple[int, int, bool]


def _string_from(text: str, j: int) -> tuple[int | None, int]:
    """(After a string's closing quote, or None where it runs on; where its scan goes on)
    for a string whose text is read from `j`."""
    q = _STRING_BODY.match(text, j).end()  # type: ignore[union-attr]  # (matches "")
    if q < len(text) and text[q] == '"':
        return q + 1, q + 1
    return None, q


def _string_end(text: str, i: int) -> int | None:
    """After the string that opens at `i` (a quote), or None where it runs on."""
    return _string_from(text, i + 1)[0]


def _value_end(text: str, i: int, scan: _Scan | None = None) -> tuple[int | None, _Scan | None]:
    """After the JSON value that starts at `i`, or None where it runs on (or may: a
    number at the text's end); and where it ran on, the scan to go on with (`scan`: that
    of a read of the text before it)."""
    c = text[i]
    if c not in '"{[':
        j = _LITERAL.match(text, i).end()  # type: ignore[union-attr]  # (matches "")
        return (j if j < len(text) else None), None
    if scan is None:
        scan = (0, i + 1, True) if c == '"' else (0, i, False)
    depth, j, in_string = scan
    while True:
        if in_string:
            end, j = _string_from(text, j)
            if end is None:
                return None, (depth, j, True)
            if depth == 0:
                return end, None
            in_string = False
        m = _STRUCTURE.search(text, j)
        if m is None:
            return None, (depth, len(text), False)
        j = m.end()
        if m.group() == '"':
            in_string = True
            continue
        depth += 1 if m.group() in "{[" else -1
        if depth == 0:
            return j, None


@dataclass(slots=True)
class Reading:
    """What a read of an object's text found, for a read of a text that extends it."""

    text: str = ""
    #: The members whose value ended: (key, where it starts, where it ends).
    ended: list[tuple[str, int, int]] = field(default_factory=list)
    #: The member whose value ran on: where it starts, and its scan.
    running: tuple[int, _Scan] | None = None


class Reader:
    """The readings of the texts a parser reads (a call's as it grows; several calls,
    each its own): a text that extends one read before goes on from it. The `keep`
    latest are kept (past that many calls, a call's text is read whole again)."""

    def __init__(self, keep: int = 8) -> None:
        self._keep = keep
        self._readings: list[Reading] = []

    def __call__(self, text: str) -> Reading:
        best = max((r for r in self._readings if text.startswith(r.text)),
                   key=lambda r: len(r.text), default=None)
        if best is None:
            best = Reading()
        else:
            self._readings.remove(best)
        self._readings.append(best)
        del self._readings[:-self._keep]
        return best


def members(text: str, reading: Reading | None = None,
            ) -> Iterator[tuple[str, int, int | None]]:
    """(key, where its value starts, where it ends or None) for each member of the
    object `text` opens with, in order, as far as they go: a member whose value has not
    begun is not given, nor any past one that runs on. `reading`: a read of a text that
    `text` extends, gone on from (and left as this read finds it)."""
    r = reading if reading is not None else Reading()
    if not text.startswith(r.text):
        r.ended, r.running = [], None
    r.text = text
    yield from list(r.ended)
    if r.ended:
        i = skip_ws(text, r.ended[-1][2])
        if i >= len(text) or text[i] != ",":
            return
    else:
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
        went = r.running[1] if r.running is not None and r.running[0] == start else None
        end, scan = _value_end(text, start, went)
        if end is None:
            r.running = (start, scan) if scan is not None else None
            yield key, start, None
            return
        r.running = None
        r.ended.append((key, start, end))
        yield key, start, end
        i = skip_ws(text, end)
        if i >= len(text) or text[i] != ",":
            return
        i += 1


def member_text(text: str, key: str, reader: Reader | None = None) -> str | None:
    """The text of member `key`'s value in the object `text` opens with, as far as it
    goes; None where it has not begun. `reader`: the parser's (`Reader`)."""
    for k, start, end in members(text, reader(text) if reader is not None else None):
        if k == key:
            return text[start:end] if end is not None else text[start:]
    return None


def member_string(text: str, key: str, reader: Reader | None = None) -> str | None:
    """Member `key`'s value where it is a whole JSON string, else None."""
    value = member_text(text, key, reader)
    if value is None or not value.startswith('"') or _string_end(value, 0) != len(value):
        return None
    try:
        out = json.loads(value)
    except ValueError:
        return None
    return out if isinstance(out, str) and out else None
