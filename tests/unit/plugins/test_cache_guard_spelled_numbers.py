"""A number spelled in words reads as its digits where it counts or measures a thing:
"two bags" / "2 bags" is one question, "two bags" / "3 bags" two, and the gate agrees;
and a date reads alike in its short and long forms ("Dec 25" / "December 25th")."""

from __future__ import annotations

import pytest

from plugins.cache.guard import _numbers, gate, guard_ok


@pytest.mark.parametrize(("stored", "asked"), [
    ("Can I bring two carry-on bags?", "Can I bring 2 carry-on bags?"),
    ("Can I book a room for three nights?", "Can I book a room for 3 nights?"),
    ("Can I book an appointment at three pm?", "Can I book an appointment at 3 pm?"),
    ("Is the fee twenty dollars?", "Is the fee $20?"),
    ("Does the plan include a hundred minutes?", "Does the plan include 100 minutes?"),
    ("Is the fee twenty-five dollars?", "Is the fee 25 dollars?"),
])
def test_the_same_number_in_words_and_digits_passes(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored) and guard_ok(stored, asked)
    assert gate(asked) == gate(stored)


@pytest.mark.parametrize(("stored", "asked"), [
    ("Can I bring 2 carry-on bags?", "Can I bring three carry-on bags?"),
    ("Book a room for two nights", "Book a room for 3 nights"),
    ("Can I get a refund of twenty dollars?", "Can I get a $30 refund?"),
    ("Is version 3 still supported?", "Is version three point one still supported?"),
    ("Do I get five free returns per year?", "Do I get fifty free returns per year?"),
])
def test_another_number_in_words_or_digits_misses(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored) and not guard_ok(stored, asked)


def test_words_that_name_a_kind_or_a_time_are_no_number() -> None:
    assert _numbers("two factor authentication on my account") == ()
    assert _numbers("is this a one time payment? in one place") == ()
    assert _numbers("I was charged twice, or two times") == ()  # `_counts` reads these
    assert _numbers("two hundred and fifty points") == ("250",)
    assert _numbers("a table for two") == ("2",)


@pytest.mark.parametrize(("stored", "asked", "same"), [
    ("Is the office open on December 25th?", "Is the office open on Dec 25?", True),
    ("Is my appointment on Thursday?", "Is my appointment on Thurs.?", True),
    ("Is the office open on Dec 24?", "Is the office open on December 25th?", False),
    ("Is the office open on Dec 25?", "Is the office open on Nov 25?", False),
])
def test_short_names_of_months_and_days(stored: str, asked: str, same: bool) -> None:
    assert guard_ok(asked, stored) is same
    assert guard_ok(stored, asked) is same
