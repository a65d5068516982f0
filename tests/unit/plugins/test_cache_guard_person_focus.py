"""The guard refuses a question that asks who against one that asks where, when or why
(guard._FOCUS "person"): another kind of fact, the frame reworded round it ("Who can sign
the form?" / "Where can I sign the form?", 0.81 with MiniLM)."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok


@pytest.mark.parametrize(("stored", "asked"), [
    ("Who can sign the form?", "Where can I sign the form?"),
    ("Who can collect my parcel?", "Where can I collect my parcel?"),
    ("Who can cancel the booking?", "When can I cancel the booking?"),
    ("Who can see my medical records?", "Where can I see my medical records?"),
    ("Who can pick up my prescription?", "Where can I pick up my prescription?"),
    ("Whom do I ask about my grades?", "Why do I ask about my grades?"),
])
def test_who_against_where_when_or_why_misses(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("Who do I contact about a payroll error?",
     "Who should I talk to about a mistake in my pay?"),
    ("How do I see who viewed my profile?", "How can I see who viewed my profile?"),
])
def test_who_on_both_sides_passes(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)
