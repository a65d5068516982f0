"""The guard compares the actions asked for on one thing however the thing is worded
round its nouns (guard_actions.actions_differ): "How do I file a claim for water
damage?" / "How do I check the status of my water damage claim?" (0.85 with MiniLM) ask
to do two things with one claim; "the status of" a thing is the thing checked."""

from __future__ import annotations

import pytest

from plugins.cache.guard import _singular, guard_ok


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I file a claim for water damage?",
     "How do I check the status of my water damage claim?"),
    ("How do I submit an expense report for travel?",
     "How do I check the status of my travel expense report?"),
    ("How do I apply for a refund of the deposit?",
     "How do I check the status of my deposit refund?"),
    ("How do I check the status of my order?", "How do I cancel my order?"),
])
def test_another_action_on_the_thing_reworded_misses(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I file a claim for water damage?", "How can I submit a water damage claim?"),
    ("How do I check the status of my claim?", "How can I track my claim?"),
])
def test_the_same_action_passes(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)
    assert guard_ok(stored, asked)


def test_a_word_whose_s_is_its_own_is_no_plural() -> None:
    assert [_singular(w) for w in ("status", "bonus", "analysis", "address", "claims")] == [
        "status", "bonus", "analysis", "address", "claim"]
