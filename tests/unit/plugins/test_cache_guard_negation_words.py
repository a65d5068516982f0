"""Negations written without "not": "unable", "impossible", "fail(ed) to" count as "not"
does ("Why can I log in?" / "How come I'm unable to log in?")."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok


@pytest.mark.parametrize(("stored", "asked"), [
    ("Why can I log in?", "How come I'm unable to log in?"),
    ("I can access my account", "I'm unable to access my account"),
    ("My payment went through", "My payment failed to go through"),
    ("Is it possible to change my address?", "Is it impossible to change my address?"),
    ("The app syncs my contacts", "The app fails to sync my contacts"),
    ("Why does the update install?", "Why is the update failing to install?"),
])
def test_a_negation_in_other_words_misses(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("Why can't I log in?", "Why am I unable to log in?"),
    ("How come my payment never goes through?", "Why does my payment fail to go through?"),
    ("I cannot access my account", "I'm unable to access my account"),
])
def test_one_negation_in_other_words_passes(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)


@pytest.mark.parametrize(("stored", "asked", "same"), [
    ("The page won't load", "the page wont load", True),
    ("Why can't I log in?", "why cant i log in", True),
    ("I didn't get paid this month", "i didnt get paid this month", True),
    ("Why does the app load?", "why doesnt the app load", False),
    ("My refund was processed", "My refund wasnt processed", False),
    ("Can I change my flight?", "Cant I change my flight?", False),
])
def test_a_contraction_without_its_apostrophe_is_a_negation(
        stored: str, asked: str, same: bool) -> None:
    assert guard_ok(asked, stored) is same
    assert guard_ok(stored, asked) is same
