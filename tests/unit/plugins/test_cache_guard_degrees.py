"""The guard refuses a question that asks for another extreme or comparison
(guard_degrees.py), and keeps the ones that ask for the same in other words."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok
from plugins.cache.guard_degrees import degrees


@pytest.mark.parametrize(("stored", "asked"), [
    ("Which plan is the cheapest?", "Which plan offers the best value?"),
    ("Which courier is the fastest?", "Which courier is the most reliable?"),
    ("Is the Pro plan cheaper than Basic?", "Is the Pro plan faster than Basic?"),
    ("What is the newest phone you sell?", "What is the most popular phone you sell?"),
    ("What's the best plan for a family?", "What's the cheapest plan for a family?"),
    ("Which laptop is the lightest?", "Which laptop is the most powerful?"),
    ("Which is the safest way to pay?", "Which is the quickest way to pay?"),
    ("What is the highest tier?", "What is the most popular tier?"),
    ("Which seat is the most comfortable?", "Which seat is the cheapest?"),
    ("Which store is nearest to me?", "Which store is the biggest near me?"),
])
def test_another_extreme_misses(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("What is your cheapest plan?", "What's your most affordable plan?"),
    ("Where is your nearest store?", "Where's the closest store to me?"),
])
def test_the_same_extreme_in_other_words_passes(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)


def test_words_ending_in_est_are_not_all_superlatives() -> None:
    assert degrees("i'm interested in a test request, other than the guest one") == set()
    assert degrees("is it less expensive than the most affordable one?") == {
        "cheaper than", "cheapest"}
