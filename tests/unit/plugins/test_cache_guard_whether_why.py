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
