""""What happens when ...?" asks what follows a condition, as "What happens if ...?"
does: its "when" asks no time. A question that asks when stays another question."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok


@pytest.mark.parametrize(("stored", "asked"), [
    ("What happens if I miss a payment?", "What happens when I miss a payment?"),
    ("What happens if my card expires?", "What happens when my card expires?"),
    ("What will happen if my plan ends?", "What will happen when my plan ends?"),
])
def test_what_happens_when_is_what_happens_if(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored) and guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("What happens if I cancel my plan?", "When can I cancel my plan?"),
    ("What happens when I miss a payment?", "When is my payment due?"),
    # stop 49 review: what happened at a past time is no condition
    ("What happens if my card is declined?", "What happened when my card was declined?"),
])
def test_a_time_or_another_condition_is_refused(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored) and not guard_ok(stored, asked)
