"""The guard's word-level checks (one slot changed, a span added, words reordered) read
a small word's contraction as the word and "is" ("Where's" / "Where is"), and words that
ask the same thing in a question's frame as one ("What time does it open?" / "When
...", "Do you have ...?" / "Do you offer ...?", "the cheapest" / "the most affordable"):
these paraphrases were refused as one word swapped."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok


@pytest.mark.parametrize(("stored", "asked"), [
    ("Where is the nearest store?", "Where's the nearest store?"),
    ("What is the warranty period?", "What\u2019s the warranty period?"),
    ("When does the pharmacy counter open?", "What time does the pharmacy counter open?"),
    ("Do you have gift wrapping?", "Do you offer gift wrapping?"),
    ("Does the shop provide gift wrapping?", "Does the shop provide gift wrapping?"),
    ("What is your cheapest plan?", "What's your most affordable plan?"),
    ("What is the cheapest plan?", "What's the least expensive plan?"),
])
def test_the_same_question_in_other_small_words_passes(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)
    assert guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("Where is my order?", "Where's my refund?"),
    ("What's the cheapest plan?", "What's the most expensive plan?"),
    ("What time does the store open?", "When does the store close?"),
    ("Do you have gift wrapping?", "Do you offer gift cards?"),
    ("Where's the app's language setting?", "Where's the app's theme setting?"),
    ("What's the nearest store?", "What's the biggest store?"),
    ("Who's the account owner?", "Who's the account admin?"),
])
def test_near_misses_in_those_words_still_miss(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("What is the capital of France?", "What's the capital city of France?"),
    ("How do I verify my email?", "How do I verify my email address?"),
    ("Can I change my phone?", "Can I change my phone number?"),
])
def test_a_noun_that_only_restates_the_one_before_is_no_added_span(stored: str,
                                                                   asked: str) -> None:
    """With "What's" read as "What is", "the capital city of France" was one span added
    to "the capital of France" ("a recipe" / "a vegan recipe"), and refused (the e2e
    suite's paraphrase on the real model missed); "city" after "capital", "address"
    after "email", "number" after "phone" say nothing more."""
    assert guard_ok(asked, stored)
    assert guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("What is the capital of France?", "What is the capital region of France?"),
    ("How do I verify my email?", "How do I verify my work email?"),
])
def test_other_added_nouns_still_miss(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)
