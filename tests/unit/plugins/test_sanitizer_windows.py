"""Sanitizer: the windows read around a text's escapes and around a detector's places
(`credentials._reaches`, shared by `_escape_windows` and `windows_around`) are the ones
the two loops it replaced merged: each place widened by the reach, overlapping ones
merged, None past the most windows; a key format's pattern compiled with its literal
first (`literal_first`) matches as the pattern written does."""

from __future__ import annotations

import random

import pytest

from plugins.sanitizer import credentials
from plugins.sanitizer.credentials import _WINDOW_REACH, _WINDOWS_MOST


def _merged_as_before(places: list[tuple[int, int]]) -> list[tuple[int, int]] | None:
    out: list[list[int]] = []
    for lo, hi in ((a - _WINDOW_REACH, b + _WINDOW_REACH) for a, b in places):
        if not out or lo > out[-1][1]:
            out.append([lo, hi])  # (a new window)
        else:
            out[-1][1] = hi
    return None if len(out) > _WINDOWS_MOST else [(lo, hi) for lo, hi in out]


@pytest.mark.parametrize("seed", range(20))
def test_reaches_merge_as_the_two_loops_did(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(200):
        starts = sorted(rng.randrange(0, 80_000) for _ in range(rng.randrange(0, 40)))
        places = [(s, s + rng.choice((1, 1, 3, 6))) for s in starts]
        assert credentials._reaches(places) == _merged_as_before(places)


# ------------------------------- a format's literal first, its "\b" a look-behind after

def _format_texts(seed: int, needs: tuple[str, ...]) -> list[str]:
    rng = random.Random(seed)
    glue = [" ", "\n", "_", "-", ".", "é", "x", "9", "\"", "=", "/", "ж", "", ":"]
    body = "ABCDEFabcdef0123456789_-+/=.xyzXYZ"
    out = []
    for _ in range(60):
        parts: list[str] = []
        for _ in range(rng.randrange(1, 8)):
            need = rng.choice(needs)
            need = rng.choice([need, need.upper(), need.capitalize(), need.title()])
            parts += [rng.choice(glue), need,
                      "".join(rng.choice(body) for _ in range(rng.randrange(0, 120)))]
        out.append("".join(parts))
    return out


@pytest.mark.parametrize("k", range(len(credentials._FORMATS)))
def test_a_format_with_its_literal_first_matches_as_written(k: int) -> None:
    """`literal_first` moves a format's leading "\\b" after its literal (the engine then
    skips to the literal): every match, and every group of each, is the pattern's as
    written."""
    import re

    from tests.unit.plugins.test_sanitizer_gates import CORPUS
    needs, pattern = credentials._FORMATS[k]
    written, fast = re.compile(pattern), credentials._FORMAT_RX[k][1]
    for text in [*CORPUS, *_format_texts(k, needs)]:
        assert ([(m.span(), m.groups()) for m in fast.finditer(text)]
                == [(m.span(), m.groups()) for m in written.finditer(text)]), (pattern, text)


def test_literal_first_turns_only_a_plain_head_about() -> None:
    turn = credentials.literal_first
    assert turn(r"\bsk-(?:a|b)x") == r"sk-(?<!\w.{3})(?:a|b)x"
    assert turn(r"\b(?:AKIA|ASIA)(?P<a>\d)") == r"(?:AKIA|ASIA)(?<!\w.{4})(?P<a>\d)"
    assert turn(r"\bhv[sb]\.(?P<b>x)") == r"hv[sb]\.(?<!\w.{4})(?P<b>x)"
    for kept in (r"\b(?:bot)?\d", r"\bab?c", r"\b(?:ab|c)d", r"(?i:\bbearer)\s", r"x\by"):
        assert turn(kept) == kept


# ------------------------- `_encoded`'s patterns read in the runs they can match in only

def _encoded_texts(seed: int) -> list[str]:
    import base64

    rng = random.Random(seed)
    bits = [base64.b64encode(b"sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z").decode(),
            base64.urlsafe_b64encode(bytes(range(120, 160))).decode(),
            b"ghp_aB3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF3hJ6".hex(), "0x", "=", "==",
            "===", "+", "/", "_", "-", " ", "\n", "é", "ж", "state=", "abcdefghijkl",
            "ABCDEF012345", "9f86d081884c7d659a2feaa0c55ad015", '"', ".", ":"]
    return ["".join(rng.choice(bits) for _ in range(rng.randrange(1, 24)))
            for _ in range(3000)]


@pytest.mark.parametrize("name", ["_B64_RUN", "_B64URL_RUN", "_HEX_RUN"])
def test_encoded_patterns_read_in_runs_match_as_over_the_text(name: str) -> None:
    from tests.unit.plugins.test_sanitizer_gates import CORPUS
    rx = getattr(credentials, name)
    found = 0
    for text in [*CORPUS, *_encoded_texts(11)]:
        runs = [m.span() for m in credentials._ENCODED_RUN.finditer(text)]
        want = [(m.span(), m.groups()) for m in rx.finditer(text)]
        assert [(m.span(), m.groups()) for m in credentials.in_runs(rx, text, runs)] == want
        found += len(want)
    assert found


# ------------------- a value's word read back to its opening quote, found first (stop 55)

@pytest.mark.parametrize("seed", range(6))
def test_a_value_s_start_is_the_word_s_after_its_last_quote(seed: int) -> None:
    """`_value_pieces` finds its first value's opening quote first and walks back to
    it only (a run of quoted values with no blank, "`sk-ab1`,`sk-cd1`,...", was walked
    back 512 characters at every literal): the start the word's start and the last
    quote in it gave."""
    rng = random.Random(seed)
    bits = ["sk-", "`", '"', "'", " ", "\n", ",", "+", "ab1", "Xy9", "-", "_", "\\"]
    for _ in range(400):
        text = "".join(rng.choice(bits) for _ in range(rng.randrange(1, 400)))
        for at in credentials._scan(text.lower()).needs_at:
            word = credentials._word_start(text, at)
            want = max(word, *(text.rfind(q, word, at) + 1 for q in "\"'`"))
            pieces = credentials._value_pieces(text, at)
            if pieces is not None:
                assert pieces[0][1] == want, (text, at)
