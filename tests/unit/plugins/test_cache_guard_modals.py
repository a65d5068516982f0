"""A permission, an obligation and an advice are three questions ("Can I opt out?" / "Do
I have to opt out?"), the modal often a phrase of several words (guard_modals)."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok
from plugins.cache.guard_modals import modals


@pytest.mark.parametrize(("stored", "asked"), [
    ("Can I opt out of the survey?", "Do I have to opt out of the survey?"),
    ("Is it possible to pay in cash at the counter?",
     "Is it mandatory to pay in cash at the counter?"),
    ("I lost my card, can I order a new one?", "I lost my card, should I order a new one?"),
    ("What can I bring on board?", "What do I need to bring on board?"),
    ("May we bring our own food to the venue?", "Are we required to bring our own food?"),
])
def test_another_modal_kind_misses(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("Do I have to show ID at pickup?", "Must I show ID at pickup?"),
    ("Can I return an item after 30 days?", "Is it possible to return an item after 30 days?"),
    ("How can I pay my bill?", "How do I pay my bill?"),
])
def test_the_same_modal_kind_in_other_words_passes(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)
    assert guard_ok(stored, asked)


@pytest.mark.parametrize(("question", "kinds"), [
    ("can you send me the invoice?", ()),  # a favour
    ("how can i pay?", ()),  # a way
    ("do you have gift wrapping?", ()),  # no obligation
    ("do i need a visa?", ("must",)),
    ("is it allowed to wear a helmet?", ("can",)),
    ("would it be wise to update now?", ("should",)),
])
def test_what_counts_as_a_modal(question: str, kinds: tuple[str, ...]) -> None:
    assert modals(question) == kinds


@pytest.mark.timeout(30)  # a guard against a hang, far above the milliseconds they take
@pytest.mark.parametrize("text", [
    ", " * 8000, ",," * 8000, "so, " * 4000, "? " * 8000 + "can i", ". hi hey so " * 1500,
])
def test_long_runs_stay_linear(text: str) -> None:
    """Every clause start reads a bounded run: 4,000 chars of ", " took 3 s, 16,000 some
    minutes (the run of punctuation read again from each comma, and backtracked)."""
    modals(text)


def test_a_modal_after_a_run_of_punctuation_and_lead_ins_still_counts() -> None:
    assert modals("hi!!! so, what... can i pay? and must i?") == ("can", "must")


@pytest.mark.parametrize(("stored", "asked"), [
    ("Could I get a refund?", "Would I need a refund?"),
    ("Can I register online?", "I need to register online?"),
    ("May we bring our own food?", "We have to bring our own food?"),
    ("Can I pay in cash?", "Will I have to pay in cash?"),
])
def test_an_obligation_said_otherwise_is_one(stored: str, asked: str) -> None:
    """"Would I need ...", "Will I have to ...", and a must said as a statement with a
    question mark ask an obligation, not a permission."""
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("Do I need to register online?", "Would I need to register online?"),
    ("Do I have to bring my passport?", "I have to bring my passport?"),
])
def test_an_obligation_said_otherwise_hits_an_obligation(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)
