"""The guard reads a check of whether a thing was done ("How do I check if I am
registered to vote?") as a check, the action in its clause as the state checked
(guard_actions.checked): it does not pass the question that asks to do the thing ("How
do I register to vote?", 0.82 with MiniLM) as if both named one action."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok
from plugins.cache.guard_actions import checked


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I register to vote?", "How do I check if I am registered to vote?"),
    ("How do I register to vote?", "How do I know if I'm registered to vote?"),
    ("How do I renew my passport?", "How do I check whether my passport was renewed?"),
    ("How do I cancel my subscription?", "How do I check if my subscription is cancelled?"),
    ("How do I verify my email address?", "How can I tell if my email address is verified?"),
    ("How do I pay my council tax?", "How do I check if my council tax has been paid?"),
    ("How do I enrol in the course?", "How do I see if I am enrolled in the course?"),
])
def test_doing_a_thing_is_not_checking_it_was_done(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I check if I am registered to vote?", "How do I know if I'm registered to vote?"),
    ("How do I check if my payment went through?",
     "How can I see whether my payment went through?"),
])
def test_two_checks_pass(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)
    assert guard_ok(stored, asked)


def test_the_clause_checked_keeps_its_thing() -> None:
    assert checked(("how", "do", "i", "know", "if", "i", "m", "registered", "to", "vote")) == (
        "how", "do", "i", "check", "i", "to", "vote")
    assert checked(("what", "if", "i", "cancel")) == ("what", "if", "i", "cancel")
