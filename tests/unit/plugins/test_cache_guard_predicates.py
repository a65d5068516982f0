"""The thing a question asks about the same subject, swapped with the frame reworded
round it ("When was Marie Curie born?" / "When did Marie Curie die?"): the one-slot
checks do not see a swap at the question's end, so the words that ask it are the
direction families' (guard._FAMILIES) and the action classes' (guard_actions)."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok


@pytest.mark.parametrize(("stored", "asked"), [
    ("When was Ada Lovelace born?", "When did Ada Lovelace die?"),
    ("Where was Mozart born?", "Where did Mozart die?"),
    ("What year was Napoleon born?", "What year did Napoleon die?"),
    ("How old was Einstein at his birth?", "How old was Einstein at his death?"),
])
def test_birth_and_death_miss(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("When did Mozart die?", "When did Mozart actually die?"),
    ("Where was Mozart born?", "Where was Mozart actually born?"),
])
def test_the_same_event_hits(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)

