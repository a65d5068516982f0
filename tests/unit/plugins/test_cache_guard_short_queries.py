"""A query of two bare words that swaps one of them asks another thing ("refund policy?"
/ "refund status?"): the one-slot check keeps two words round its slot, so it never saw
these; a typo, a plural or a filler word is still the same query."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok


@pytest.mark.parametrize(("stored", "asked"), [
    ("return policy?", "return label?"),
    ("delivery address", "delivery date"),
    ("password reset", "password change"),
    ("invoice download", "invoice dispute"),
    ("Premium features?", "Premium price?"),
])
def test_a_swapped_word_of_two_misses(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("pricing plans?", "pricing plan?"),
    ("return policy?", "return policy"),
    ("account settings", "acount settings"),
    ("pricing?", "pricing please"),
])
def test_the_same_two_words_hit(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)
