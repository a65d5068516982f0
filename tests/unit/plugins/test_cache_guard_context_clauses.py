"""A context clause joined with "but" as with "and" ("I forgot my PIN and my card is
blocked, ..." / "I forgot my PIN but I have my card, ..."): the conjunction asks
nothing, so the state one side drops is the one edit the guard sees."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok


@pytest.mark.parametrize(("stored", "asked"), [
    ("I forgot my PIN and my card is blocked, how do I pay?",
     "I forgot my PIN but I have my card, how do I pay?"),
    ("My flight was delayed and my bag is missing, who do I contact?",
     "My flight was delayed but I have my bag, who do I contact?"),
])
def test_a_state_dropped_from_the_context_misses(stored: str, asked: str) -> None:
    """"but" joins clauses as "and" does: it asks nothing, so the state one context
    clause drops ("my card is blocked") is the one edit the guard sees."""
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


def test_a_context_said_with_but_hits() -> None:
    assert guard_ok("I forgot my password but have my phone, how can I log in?",
                    "I forgot my password but I have my phone, how do I log in?")


@pytest.mark.parametrize(("stored", "asked"), [
    ("The parcel came and the box was damaged, can I return it?",
     "The parcel came but the box was fine, can I return it?"),
    ("My laptop arrived and the screen is cracked, is it covered?",
     "My laptop arrived but the screen is intact, is that covered?"),
    ("I lost my wallet and it is still missing, should I cancel my cards?",
     "I lost my wallet but it was found, should I cancel my cards?"),
    ("My bike was stolen last week, does my insurance pay?",
     "My bike got recovered last week, will my insurance pay?"),
])
def test_a_state_replaced_by_its_opposite_misses(stored: str, asked: str) -> None:
    """A thing's state for its opposite (damaged / fine, missing / found), in a context
    clause the question's frame does not see: the direction families hold them."""
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)

