"""Direction words of different families swapped, the rest the same ("My number is
cancelled" / "I kept my number"), and a word that opposes words of two families ("stop"
ends a term as "cancel" does; "keep" is the opposite of both)."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok


@pytest.mark.parametrize(("stored", "asked"), [
    ("My number is cancelled, what can I do?", "But I kept my number, what can I do?"),
    ("My number is cancelled, can I get it back?", "I kept my old number, can I get it back?"),
    ("My card was suspended, what now?", "My card was renewed, what now?"),
    ("How do I pause my plan?", "How do I freeze my plan?"),
    ("Why was my order returned?", "Why was my order approved?"),
])
def test_an_outcome_of_another_family_misses(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I cancel my subscription?", "I want to stop my subscription"),
    ("Can I keep my phone number if I switch carriers?",
     "If I change carriers, can I keep my number?"),
])
def test_the_same_outcome_in_another_word_passes(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)
    assert guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I archive a project?", "How do I restore an archived project?"),
    ("How do I delete a channel?", "How do I restore a deleted channel?"),
    ("Can I trash old emails?", "Can I recover trashed emails?"),
])
def test_bringing_a_thing_back_is_not_putting_it_away(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


def test_bringing_a_thing_back_in_other_words_passes() -> None:
    assert guard_ok("Can I restore a file I deleted?", "How do I recover a deleted file?")


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I hide my profile?", "How do I make my profile visible?"),
    ("Can I hide my phone number?", "Can I make my phone number public?"),
    ("How do I make my playlist invisible?", "How do I make my playlist public?"),
])
def test_hiding_is_the_private_side(stored: str, asked: str) -> None:
    """Hiding a thing switches it off and makes it private: against "visible" or
    "public" it is the other side."""
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


def test_hiding_hits_making_private() -> None:
    assert guard_ok("How do I make my profile hidden?", "How do I hide my profile?")


@pytest.mark.parametrize(("stored", "asked"), [
    ("How much notice do I need to give?", "How much notice will I get?"),
    ("How much notice do I have to give before I quit?",
     "How much notice do I get before I'm laid off?"),
    ("How do I give feedback on the app?", "How do I get feedback on the app?"),
    ("Can I give notice by email?", "Can I get notice by email?"),
])
def test_giving_is_not_getting(stored: str, asked: str) -> None:
    """The asker gives a thing on one side and gets it on the other (0.72-0.97)."""
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("Can you give me a refund?", "Can I get a refund?"),
    ("Can you give us a discount?", "Can we get a discount?"),
])
def test_given_to_the_asker_is_got(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)
    assert guard_ok(stored, asked)
