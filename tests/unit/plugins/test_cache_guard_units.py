"""The guard refuses a question that names other units (guard_units.py): billing
periods, data sizes, measures, currencies, however the frame is reworded round them."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok
from plugins.cache.guard_units import units


@pytest.mark.parametrize(("stored", "asked"), [
    ("How much is the monthly plan?", "What does the yearly plan cost?"),
    ("How much is the monthly plan?", "What's the price of the annual plan?"),
    ("Can I pay for my subscription monthly?",
     "Is it possible to pay for my subscription yearly?"),
    ("How much is the weekly pass?", "What does the daily pass cost?"),
    ("Can I get billed quarterly?", "Is annual billing possible?"),
    ("How do I switch to annual billing?", "How can I switch to monthly billing?"),
    ("Can I upload a 5 GB file?", "Is it possible to upload a 5 MB file?"),
    ("Can I get a refund in euros?", "Is it possible to get my refund in dollars?"),
    ("Is the discount 20% off?", "Is the discount $20 off?"),
    ("Does the box weigh 30 kg?", "Is the box 30 lbs?"),
    ("How many days does delivery take?", "How many weeks will delivery take?"),
    ("Is the price in GBP?", "Can I see the price in yen?"),
])
def test_other_units_miss(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("How much is the yearly plan?", "What does the annual plan cost?"),
    ("Can I get billed quarterly?", "Is quarterly billing possible?"),
    ("Can I pay 10 dollars a month?", "Is it possible to pay $10 monthly?"),
    ("Why won't my card work?", "Why won't my card work?"),
])
def test_the_same_units_in_other_words_pass(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)


def test_units_leave_ordinals_and_contractions() -> None:
    assert units("can i add a second user? why won't it work for real?") == ()
    assert units("5 gigabytes per month, 20% off, $5") == ("gb", "month", "percent",
                                                           "dollar")
