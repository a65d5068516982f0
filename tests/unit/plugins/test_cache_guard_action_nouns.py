"""The guard reads asking for a thing owed ("request", "claim") and buying one as actions
(guard_actions.py), and an action's word used as a noun ("my refund request", "a
disputed charge") as a thing, not an action both sides name: "How do I request a
refund?" / "How do I check my refund request?" (0.89 with MiniLM) ask to do two things."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok
from plugins.cache.guard_actions import NOUN, nouns


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I claim on my travel insurance?", "How do I buy travel insurance?"),
    ("How do I request a refund?", "How do I check my refund request?"),
    ("How do I request a copy of my birth certificate?",
     "How do I check the status of my birth certificate request?"),
    ("How do I dispute a charge?", "How do I check a disputed charge?"),
    ("How do I claim my tax refund?", "How do I check my tax refund claim?"),
    ("How do I request a transcript?", "How do I check my transcript request?"),
    ("How do I cancel my booking?", "How do I change my booking?"),
])
def test_doing_a_thing_is_not_another_action_on_its_noun(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I request a refund?", "How can I ask for a refund?"),
    ("How do I buy travel insurance?", "Where can I purchase travel insurance?"),
    ("How do I check my booking?", "How can I view my booking?"),
    ("How do I claim my tax refund?", "How can I get my tax refund?"),
    ("How do I order a new debit card?", "How can I get a replacement debit card?"),
])
def test_the_same_action_passes(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)
    assert guard_ok(stored, asked)


def test_a_noun_is_marked_after_its_determiner() -> None:
    assert nouns(("check", "my", "tax", "refund", "claim")) == (
        "check", "my", "tax", "refund", NOUN + "claim")
    assert nouns(("can", "i", "claim", "my", "refund")) == (
        "can", "i", "claim", "my", "refund")
    assert nouns(("a", "b", "c", "d", "claim")) == ("a", "b", "c", "d", "claim")


@pytest.mark.timeout(30)  # a guard against a hang, far above the milliseconds they take
@pytest.mark.parametrize("text", ["my claim " * 500, "the " * 1400 + "request",
                                  "a b c " * 700 + "claim"])
def test_long_questions_stay_linear(text: str) -> None:
    """Each word looks back at most three words (4,000 characters)."""
    nouns(tuple(text.split()))
    assert not guard_ok("how do i request " + text, "how do i check " + text)
