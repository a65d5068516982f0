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
    # a weight is no currency: "lb" read as the pound sterling
    ("Is there a 50 lb limit on checked bags?", "Do checked bags have a £50 limit?"),
    ("How much is 5 lb of flour?", "What does £5 of flour come to?"),
    ("Can I buy 10 pounds of rice?", "Is it possible to buy £10 of rice?"),
    ("Is a 2 litre bottle allowed on board?", "Can I take a 2 gallon bottle on board?"),
    ("Can I carry 100 ml of liquid?", "Am I allowed to carry 100 oz of liquid?"),
])
def test_other_units_miss(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("How much is the yearly plan?", "What does the annual plan cost?"),
    ("Can I get billed quarterly?", "Is quarterly billing possible?"),
    ("Can I pay 10 dollars a month?", "Is it possible to pay $10 monthly?"),
    ("Why won't my card work?", "Why won't my card work?"),
    ("Can I buy 10 lbs of rice?", "Is it possible to buy 10 pounds of rice?"),
    ("Does the parcel weigh 3 pounds?", "Is the weight of the parcel 3 lbs?"),
])
def test_the_same_units_in_other_words_pass(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)


def test_units_leave_ordinals_and_contractions() -> None:
    assert units("can i add a second user? why won't it work for real?") == ()
    assert units("5 gigabytes per month, 20% off, $5") == ("gb", "month", "percent",
                                                           "dollar")


def test_weights_and_currencies_are_distinct() -> None:
    assert units("5 lb of flour") == ("lb",) != units("£5 of flour") == ("gbp",)
    assert units("5 pounds of flour") == ("lb",)
    assert units("does it weigh 3 pounds?") == ("lb",)
    assert units("is the ticket 10 pounds?") == ("gbp",)
    assert units("a 20 per cent discount") == units("a 20% discount") == ("percent",)


@pytest.mark.parametrize(("stored", "asked", "same"), [
    ("Can I get an appointment at 9am?", "Is there an appointment at 9 pm?", False),
    ("Is the pharmacy open at 8 a.m.?", "Is the pharmacy open at 8 p.m.?", False),
    ("Can I book an appointment at 3pm?", "Can I book an appointment at 3 p.m.?", True),
    ("Can I book an appointment at 3pm?", "Is it possible to book an appointment at 3 pm?", True),
])
def test_a_time_of_days_half_is_a_unit(stored: str, asked: str, same: bool) -> None:
    assert guard_ok(asked, stored) is same
    assert guard_ok(stored, asked) is same


def test_meridiem_only_after_a_number() -> None:
    assert units("i am at the store at 5 am") == ("am",)
    assert units("is it 10 a month? 5 amps?") == ("month",)


@pytest.mark.parametrize(("stored", "asked"), [
    ("Can I pay $10 a month?", "Can I pay 10 dollars a month?"),
    ("Is delivery free for orders over fifty dollars?", "Is delivery free for orders over $50?"),
    ("Can I withdraw €200 a day?", "Can I withdraw 200 euros a day?"),
])
def test_an_amount_after_its_sign_or_before_its_word_passes(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored) and guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("Is the deposit 20%?", "Is the deposit 20?"),
    ("Do I get 10 percent off my first order?", "Do I get 10 off my first order?"),
    ("Can you take 15% off the invoice?", "Could you take 15 off the invoice?"),
    ("Did the price go up by 5 percent?", "Did the price go up by 5?"),
])
def test_a_percentage_is_no_amount(stored: str, asked: str) -> None:
    """A percentage on one side only, the number the same: a share is not an amount,
    though only one side names a unit."""
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("Is the deposit 20 percent?", "Is the deposit twenty percent?"),
    ("What is 15% of 200?", "What's 15% of 200?"),
    ("Can I book an appointment at three pm?", "Can I book an appointment at 3 pm?"),
])
def test_a_percentage_both_sides_hits(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)
