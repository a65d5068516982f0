"""Client regexes the grammar compiler would quote in the log.

xgrammar (vLLM's grammar compiler) writes a warning straight to the process's stderr for
a regex feature it ignores (a lookahead, an anchor in the middle, an escape it does not
know), quoting the whole regex: a client's text in the server's log, as large as the
client made it, from the gateway's process (vLLM checks a schema as it takes the request)
and again from the engine's (which compiles it). The two share stderr, and xgrammar has
no switch for it.

So each regex a schema holds (a `pattern`, a `patternProperties` name) is tried here
once, with stderr sent to a file for that moment: one the compiler warns about is left
out of the constraint (the README's rule for what the compiler cannot enforce), so
neither process ever compiles it. What other threads wrote to stderr meanwhile is put
back. A regex the compiler refuses outright is kept: vLLM's own check refuses the
request with a 400, and prints nothing.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

import xgrammar

from ..protocol import rewritten, schema_nodes

#: The compiler's own lines: `[hh:mm:ss] /path/file.cc:123: Warning: ...`.
_COMPILER_LINE = re.compile(rb"^\[\d\d:\d\d:\d\d\] \S+\.(?:cc|h):\d+: ")
_STDERR_LOCK = threading.Lock()


@functools.lru_cache(maxsize=4096)
def quiet(regex: str) -> bool:
    """Whether the compiler takes `regex` without a warning (or refuses it outright).
    Where stderr cannot be set aside (no room for the file, no stderr), no: the regex is
    left out rather than risk the log."""
    try:
        written = _compiled_aside(regex)
    except OSError:
        return False
    warned = False
    others = []
    for line in written.splitlines(keepends=True):
        if _COMPILER_LINE.match(line):
            warned = True
        else:
            others.append(line)
    if others:  # another thread's, in that moment
        os.write(2, b"".join(others))
    return not warned


def _compiled_aside(regex: str) -> bytes:
    """What compiling `regex` wrote to stderr (fd 2), which is a file meanwhile (a file,
    not a pipe: a warning as long as the regex never blocks the writer)."""
    with _STDERR_LOCK, tempfile.TemporaryFile() as sink:
        _flush()
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            xgrammar.Grammar.from_json_schema(json.dumps({"type": "string",
                                                          "pattern": regex}))
        except Exception:  # refused: vLLM's check says so to the client
            pass
        finally:
            _flush()
            os.dup2(saved, 2)
            os.close(saved)
        sink.seek(0)
        return sink.read()


def _flush() -> None:
    if sys.stderr is not None:
        sys.stderr.flush()


def regexes(schema: Any) -> Iterator[str]:
    """Every regex in a schema: `pattern` values and `patternProperties` names (not in
    data, `enum` and the like; and a property named `pattern` is a name)."""
    for node in schema_nodes(schema):
        pattern, names = node.get("pattern"), node.get("patternProperties")
        if isinstance(pattern, str):
            yield pattern
        if isinstance(names, dict):
            yield from names


def without(node: Any, noisy: frozenset[str]) -> Any:
    """`node` (a schema) without the regexes in `noisy`: such a `pattern` is dropped,
    and so is such a `patternProperties` entry, with the object's
    `additionalProperties` and `unevaluatedProperties` (the properties it matched fall
    to them: `false` there would forbid what it allowed). Looser, never stricter."""

    def cut(node: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        dropped = isinstance(kept := node.get("patternProperties"), dict) and any(
            k in noisy for k in kept)
        for key, value in node.items():
            if key == "pattern" and isinstance(value, str) and value in noisy:
                continue
            if dropped and key in ("additionalProperties", "unevaluatedProperties"):
                continue
            if key == "patternProperties" and isinstance(value, dict):
                value = {k: v for k, v in value.items() if k not in noisy}
            out[key] = value
        return out
    return rewritten(node, cut)


def screened(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` without the regexes the compiler would quote in the log (as given when
    it holds none)."""
    noisy = frozenset(r for r in set(regexes(schema)) if not quiet(r))
    return without(schema, noisy) if noisy else schema  # type: ignore[no-any-return]
