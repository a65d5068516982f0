"""Sanitizer: the shortcuts that save its detectors CPU read exactly what the long way
reads. An injection family's pattern tried only where its first words are (`_anchored`)
finds what its scan of the whole text finds; a phone, SSN or NINO word found once per
text (`_said_places`) is found where a search before each run of digits finds it; the
phone and card patterns, asking for their digits before their look-behinds, match as
they did. Texts: every string of the sanitizer's own tests, and fuzz built from the
patterns' words and pieces."""

from __future__ import annotations

import ast
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

try:
    from re import _parser  # type: ignore[attr-defined]
except ImportError:  # (before Python 3.11)
    import sre_parse as _parser  # type: ignore[no-redef]

from plugins.sanitizer import detectors
from plugins.sanitizer.injection import (
    _ANY_TRIGGER,
    _EXTENDED,
    _FIRST_WORDS,
    _INJECTION,
    _INJECTION_RX,
    _anchored,
    _starts,
    _triggers,
)

_HERE = Path(__file__).parent


def _strings(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value:
            yield node.value


CORPUS = sorted({s for p in sorted(_HERE.glob("test_sanitizer*.py")) for s in _strings(p)})
_WORDS = sorted(set(re.findall(r"[a-z]{2,}", " ".join(_INJECTION).lower()))
                | {w for ws in _FIRST_WORDS if ws for w in ws} | {"DAN", "Do"})
_GLUE = [" ", " ", " ", "  ", "\n", ", ", ". ", ": ", "-", "#", "'", " ... ", "x"]


def _fuzz(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts: list[str] = []
        for _ in range(rng.randrange(1, 30)):
            w = rng.choice(_WORDS)
            parts += ["".join(c.upper() if rng.random() < 0.3 else c for c in w),
                      rng.choice(_GLUE)]
        out.append("".join(parts))
    return out


def _sample(parsed: Any, rng: random.Random) -> str:
    """A random string the parsed pattern may match (look-arounds and anchors left out:
    a sample need not match; most do, and each branch of each family is reached)."""
    out: list[str] = []
    for op, arg in parsed:
        name = str(op)
        if name == "LITERAL":
            out.append(chr(arg))
        elif name == "NOT_LITERAL":
            out.append(" ")  # (not "." nor a line's end: what the patterns exclude)
        elif name == "ANY":
            out.append(" ")
        elif name == "IN":
            options = []
            for kind, value in arg:
                if str(kind) == "LITERAL":
                    options.append(chr(value))
                elif str(kind) == "RANGE":
                    options.append(chr(rng.randint(*value)))
                elif str(kind) == "CATEGORY":
                    options.append({"CATEGORY_SPACE": " ", "CATEGORY_DIGIT": "7"}.get(
                        str(value), "a"))
            out.append(rng.choice(options) if options and str(arg[0][0]) != "NEGATE"
                       else " ")
        elif name == "BRANCH":
            out.append(_sample(rng.choice(arg[1]), rng))
        elif name == "SUBPATTERN":
            out.append(_sample(arg[-1], rng))
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            lo, hi, item = arg
            n = rng.randint(lo, min(hi, lo + 2))
            out += [_sample(item, rng) for _ in range(n)]
        elif name == "CATEGORY":
            out.append(" " if "SPACE" in str(arg) else "7" if "DIGIT" in str(arg) else "a")
    return "".join(out)


def _phrases(seed: int, n: int) -> list[str]:
    """Texts of fuzz around phrases sampled from every family's pattern."""
    rng = random.Random(seed)
    families = [_parser.parse(p, re.IGNORECASE) for p in _INJECTION]
    fuzz = _fuzz(seed, n)
    out = []
    for i in range(n):
        phrase = _sample(families[i % len(families)], rng)
        phrase = "".join(c.upper() if rng.random() < 0.2 else c for c in phrase)
        cut = rng.randrange(len(fuzz[i]) + 1)
        out.append(fuzz[i][:cut] + rng.choice(_GLUE) + phrase + rng.choice(_GLUE)
                   + fuzz[i][cut:])
    return out


def test_every_family_names_its_first_words() -> None:
    assert len(_FIRST_WORDS) == len(_INJECTION)


@pytest.mark.parametrize("seed", range(4))
def test_anchored_families_find_what_their_scan_finds(seed: int) -> None:
    texts = ([t for t in CORPUS if t.isascii()] if seed == 0
             else _fuzz(seed, 2000) + _phrases(seed, 2000))
    found = 0
    for text in texts:
        low, memo = text.lower(), dict[str, list[int]]()
        for rx, firsts in zip(_INJECTION_RX, _FIRST_WORDS, strict=True):
            if firsts is None:
                continue
            whole = [m.span() for m in rx.finditer(text)]
            assert [m.span() for m in _anchored(rx, text, _starts(low, firsts, memo))] == \
                whole, (rx.pattern[:40], text)
            found += len(whole)
    assert found  # (the texts hold phrases: the comparison is not of nothing)


def _said_slow(text: str, words: tuple[str, ...], pattern: re.Pattern[str],
               reach: int) -> list[tuple[int, int]]:
    """`detectors._said` as it was: each run's words searched in its lower-cased lead."""
    out, last = [], 0
    for a, b in detectors._numeric_runs(text):
        lo = max(last, a - detectors._SAID_REACH)
        if any(w in text[lo:a].lower() for w in words):
            out += [m.span() for m in pattern.finditer(text, lo, min(len(text), b + reach))]
        last = a
    return out


@pytest.mark.parametrize("text", [
    "call me on 07700 900123 or mob: 0151/23456789, TEL 030 12345678",
    "Phone\u0130: 4155550132, Tél: 06 12 34 56 78, móvil 612 345 678",
    "SSN: 123456789 and ssn 078-05-1120; NINO AB123456C",
    "电话 010 1234 5678 then 2024-01-01 and call-back 555 0100 nothing",
])
def test_said_words_found_once_read_as_searched(text: str) -> None:
    for words, pattern in ((detectors._PHONE_WORDS, detectors._PHONE_SAID),
                           (detectors._SSN_WORDS, detectors._SSN_SAID),
                           (detectors._NINO_WORDS, detectors._NINO_SAID)):
        try:
            fast = [m.span() for m in detectors._said(text, words, pattern,
                                                      lambda a, b: b + 64)]
            assert fast == _said_slow(text, words, pattern, 64)
        finally:
            detectors.forget()


def test_said_words_on_fuzz() -> None:
    rng = random.Random(7)
    bits = [*detectors._PHONE_WORDS, *detectors._SSN_WORDS, "İ", "Σ", " ", ": ", "\n",
            "0", "12", "415", "555", "0132", "-", "(", ")", "+44 ", "20 7946 0958"]
    seen = 0
    for _ in range(2000):
        text = "".join(rng.choice(bits) for _ in range(rng.randrange(1, 40)))
        for words, pattern in ((detectors._PHONE_WORDS, detectors._PHONE_SAID),
                               (detectors._SSN_WORDS, detectors._SSN_SAID)):
            try:
                fast = [m.span() for m in detectors._said(text, words, pattern,
                                                          lambda a, b: b + 64)]
                assert fast == _said_slow(text, words, pattern, 64), text
                seen += len(fast)
            finally:
                detectors.forget()
    assert seen


_NUMBER_BITS = ["+", "00", "tel", "Mob", "phone", "hotel", "C++", "n", " ", "-", ".", "(0)",
                "(", ")", "1", "44", "20", "7946", "0958", "415", "555", "0132", "\u2013",
                "x", "4111", "1111", "5500", "0000", "0004", "378282", "246310005", "No.",
                "ref.", "Nr.", "img.", ",", "/", "_", "12/28", " - ", ", ", "123", "000000", "+0",
                "0"]


@pytest.mark.parametrize(("pattern", "ahead"), [(detectors._PHONE, "(?=(?:\\+|00)[1-9])"),
                                                (detectors._CARD, "(?=\\d{4})")])
def test_numbers_looked_for_first_are_found_the_same(pattern: str, ahead: str) -> None:
    """`_PHONE` asks for its "+" or "00" and a digit, `_CARD` for its four digits, before their
    look-behinds: the same matches as without that look-ahead."""
    fast = re.compile(pattern)
    slow = re.compile(pattern.replace(ahead, "", 1))
    assert slow.pattern != fast.pattern
    rng = random.Random(3)
    texts = CORPUS + ["".join(rng.choice(_NUMBER_BITS) for _ in range(rng.randrange(1, 30)))
                      for _ in range(4000)]
    found = 0
    for text in texts:
        spans = [m.span() for m in slow.finditer(text)]
        assert [m.span() for m in fast.finditer(text)] == spans, text
        found += len(spans)
    assert found


def test_triggers_skip_only_hits_whose_triggers_are_found() -> None:
    """`_triggers` skips a hit whose every trigger is found already: the same set as
    checking each hit."""
    for text in CORPUS + _fuzz(5, 1000) + _phrases(5, 1000):
        low = text.lower()
        each = {t for hit in _ANY_TRIGGER.finditer(low) for t in _EXTENDED[hit.group()]
                if low.startswith(t, hit.start())}
        assert _triggers(low) == each, text


def test_a_quad_names_a_host_as_ipaddress_reads_it() -> None:
    """`_quad_names_a_host` reads a dotted quad's octets: the answer `ipaddress` gives
    (`_names_a_host`) for every quad `_IPV4` finds, padded octets too."""
    import ipaddress

    rng = random.Random(7)
    edges = [0, 1, 9, 10, 126, 127, 128, 168, 169, 170, 223, 224, 239, 240, 253, 254, 255]
    quads = [[rng.choice(edges) if rng.random() < 0.7 else rng.randrange(256)
              for _ in range(4)] for _ in range(20000)]
    for q in quads:
        quad = ".".join(f"{o:03d}" if rng.random() < 0.2 else str(o) for o in q)
        assert re.fullmatch(detectors._IPV4, quad), quad
        want = detectors._names_a_host(ipaddress.IPv4Address(".".join(map(str, q))))
        assert detectors._quad_names_a_host(quad) == want, quad
