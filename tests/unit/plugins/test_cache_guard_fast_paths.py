"""The guard's signature skips passes that cannot match (a cheap look first) and reads
ASCII text lowered without IGNORECASE: each shortcut gives what the full pass gives, on
every labelled question and its upper-case and symbol variants."""

from __future__ import annotations

import itertools
import re
import string
from functools import cache
from pathlib import Path

import pytest
import yaml

from plugins.cache import guard

DATA = Path(__file__).resolve().parents[2] / "data"


@cache
def _questions() -> list[str]:
    out: set[str] = set()
    for path in sorted(DATA.glob("semantic_*.yaml")):
        data = yaml.safe_load(path.read_text())
        near = data["near_miss"]
        rows = [p for group in (near.values() if isinstance(near, dict) else [near])
                for p in group]
        out |= {q for pair in [*data["paraphrase"], *rows] for q in pair}
    base = sorted(out)
    return base + [q.upper() for q in base] + [q + " x = a[0] + b" for q in base[:200]] + [
        "Turn On the lights (turn on)", "DON'T cancel", "Dec 25th", "TWO bags", "ſ K İ not"]


def test_negations_read_ascii_lowered_as_ignorecase_reads_the_text() -> None:
    for q in _questions():
        assert guard._negations(q) == len(guard._NEGATION.findall(q)), q


def test_counts_read_ascii_lowered_as_ignorecase_reads_the_text() -> None:
    for q in _questions():
        assert guard._counts(q) == tuple(
            guard._count(m.group(1).lower())
            for m in guard._COUNT_WORD.finditer(q)), q


def test_a_question_without_an_operator_character_has_no_code_symbol() -> None:
    for q in _questions():
        if q.isascii() and guard._SYMBOL_CHARS.isdisjoint(q):
            assert not guard._CODE_SYMBOLS.findall(q), q


@pytest.mark.parametrize("ascii_only", [True, False])
def test_no_instruction_found_at_once_is_none_found_by_kind(ascii_only: bool) -> None:
    kinds = guard._INSTRUCTIONS_ASCII if ascii_only else guard._INSTRUCTIONS
    for q in _questions():
        seen = q.lower() if ascii_only else q
        if not (guard._ANY_INSTRUCTION_ASCII if ascii_only
                else guard._ANY_INSTRUCTION).search(seen):
            assert not any(p.search(seen) for p in kinds.values()), q


def test_no_two_words_of_a_phrase_in_a_row_is_no_phrase() -> None:
    for q in _questions():
        low = q.lower()
        words = guard._LETTERS.findall(low)
        pairs = set(itertools.pairwise(words))
        if not pairs & guard._PHRASE_PAIRS:
            assert not guard._PHRASE.search(low), q
        if guard._VERB_FIRST.isdisjoint(words):
            assert not guard._VERB_PHRASE.search(low), q
        if not re.search(r"\d", low):
            assert not guard._ORDINAL.search(low) and not guard._DAY_MONTH.search(low), q


def test_act_and_its_result_is_bounded_on_long_questions(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """stop 49 review: `_result_of` tried every word of one side against every
    participle of the other, each try scanning the other side again (cubic): two
    2,000-character questions of distinct participles took most of a second. Past the
    edit check's bound the pair is refused there, and the act check tries nothing."""
    names = ["".join(p) for p in itertools.product(string.ascii_lowercase, repeat=3)]
    asked = " ".join(f"my {n}ed" for n in names[:200])
    stored = " ".join(f"{n}s" for n in names[200:600])
    calls = 0
    real = guard._verb_forms

    def counted(x: str, y: str) -> bool:
        nonlocal calls
        calls += 1
        return real(x, y)

    monkeypatch.setattr(guard, "_verb_forms", counted)
    assert not guard.guard_ok(asked, stored)
    assert calls < 5_000


@pytest.mark.timeout(30)  # a guard against the hang, far above the time it takes now
@pytest.mark.parametrize("unit", ["\u00d7\u00d7in ", "**in ", "i.e. \u00d7"])
def test_emphasis_that_never_closes_stays_linear(unit: str) -> None:
    """Each markdown emphasis opening looked for its close to the end of its line: a
    question of openings that never close (U+00D7 is read as `*`) cost its length squared,
    an 8,000-character one 0.2 s of the event loop. A span is at most 256 characters."""
    text = unit * 60_000
    assert guard._symbols(text)  # (its signs are kept: no emphasis closes)
    assert guard._symbols("What is the **refund** policy?") == ()
    assert guard._symbols("**" + "b" * 300 + "**") != ()  # (too long to be one span)


@pytest.mark.timeout(30)  # a guard against the hang, far above the time it takes now
@pytest.mark.parametrize("unit", ["two- ", "Hundred- ", "twenty-and "])
def test_spelled_numbers_none_of_which_ends_stay_linear(unit: str) -> None:
    """Each spelled number's start ran on through every spelled word after it, and back,
    where each is followed by a hyphen (none ends a number): a question of them cost its
    length squared, 8,000 characters 0.7 s of the event loop in each look (2.8 s for one
    comparison). A number is at most 17 words."""
    assert guard._spelled(unit * 60_000) == []
    assert guard._spelled("one million two hundred and thirty four thousand five "
                          "hundred and sixty seven apples") == [(0, 77, "1234567")]
    assert guard._spelled("twenty-two bags") == [(0, 10, "22")]
