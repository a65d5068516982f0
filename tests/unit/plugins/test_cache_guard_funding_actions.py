"""The guard reads adding to a thing, putting money on it and entering (redeeming) a
code or a card as actions (guard_actions.py), so another action on the same thing
misses: "How do I add money to my gift card?" / "Where do I enter a gift card?" (0.76
with MiniLM), "add data to my plan" / "check the data on my plan". The money is the
action's ("add money", "top up", "load cash": one action), not the thing acted on."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok
from plugins.cache.guard_actions import merged


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I add money to my gift card?", "Where do I enter a gift card?"),
    ("How do I add money to my gift card?", "How do I redeem my gift card?"),
    ("How do I top up my travel card?", "How do I check my travel card?"),
    ("How do I load my travel card?", "How do I check my travel card?"),
    ("How do I add data to my plan?", "How do I check the data on my plan?"),
    ("How do I add credit to my phone?", "How do I check the credit on my phone?"),
    ("How do I add minutes to my plan?", "How do I check the minutes on my plan?"),
    ("How do I add storage to my account?", "How do I check the storage in my account?"),
    ("Where do I enter my PIN?", "How do I reset my PIN?"),
])
def test_another_action_on_the_same_thing_misses(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I top up my prepaid card?", "How can I add money to my prepaid card?"),
    ("How do I add money to my PayPal account?", "How can I top up my PayPal account?"),
    ("How do I put money on my gift card?", "How can I load money onto my gift card?"),
    ("Where do I enter a promo code?", "Where can I type in a promo code?"),
    ("How do I redeem a promo code?", "Where do I enter a promo code?"),
    ("How do I add a user to my account?", "How can I create a user in my account?"),
    ("How do I redeem my points?", "How can I use my reward points?"),
])
def test_the_same_action_passes(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)
    assert guard_ok(stored, asked)


def test_money_is_read_with_its_verb() -> None:
    assert merged(("how", "do", "i", "add", "money", "to", "my", "card")) == (
        "how", "do", "i", "topup", "to", "my", "card")
    assert merged(("top", "up", "my", "card")) == ("topup", "my", "card")
    assert merged(("how", "much", "money", "is", "on", "it")) == (
        "how", "much", "money", "is", "on", "it")
