"""A question whether a thing is so, can be or was, and one why it is, ask two things,
however alike the rest reads (guard._whether_and_why)."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok


@pytest.mark.parametrize(("stored", "asked"), [
    ("Can the seller cancel my order?", "Why did the seller cancel my order?"),
    ("Can my order be cancelled?", "Why was my order cancelled?"),
    ("Could my account be suspended?", "Why was my account suspended?"),
    ("Can my refund be delayed?", "Why is my refund delayed?"),
    ("Does the app need location access?", "Why does the app need location access?"),
    ("Did the payment go through?", "Why did the payment go through?"),
    ("Should I update the app?", "Why should I update the app?"),
    ("Is my internet slow?", "Why is my internet so slow?"),
])
def test_whether_is_not_why(stored: str, asked: str) -> None:
    """They hit (0.79-0.91): "can" / "why" and the tense round them were scaffold to the
    one-slot check."""
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("Why can't I log in to my account?", "My login isn't working"),
    ("Why was I charged twice?", "There is a double charge on my card"),
    ("Why was my payment declined?", "Why did my payment get declined?"),
])
def test_why_against_a_statement_or_why_passes(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)
    assert guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("Why was my card declined?", "Is there a reason my card was declined?"),
    ("Why was my refund delayed?", "What's the reason my refund was delayed?"),
    ("Why is my account locked?", "What is the reason that my account is locked?"),
    ("Why was my card declined?", "How come my card was declined?"),
    ("Why do I need to verify my identity?", "Is there a reason I need to verify my identity?"),
])
def test_a_reason_asked_round_a_clause_is_why(stored: str, asked: str) -> None:
    """"Is there a reason", "what's the reason", "how come" before a clause ask why."""
    assert guard_ok(asked, stored)
    assert guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("Is there a reason my card was declined?", "Was my card declined?"),
    ("Is there a reason my card was declined?",
     "Is there a way to see if my card was declined?"),
    ("What's the reason my refund was delayed?", "Was my refund delayed?"),
    ("Is there a reason to upgrade my plan?", "Why did my plan get upgraded?"),
    ("Is there a reason you need my ID?", "Is there a reason I need my ID?"),
])
def test_a_reason_asked_round_a_clause_is_not_whether(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)
