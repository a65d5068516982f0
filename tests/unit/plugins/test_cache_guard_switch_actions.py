"""The guard reads switching a thing on ("enable", "activate", "turn on") as an action
(guard_actions.py), and "on" / "off" in a checked clause as the state checked: "How do I
activate my new card?" / "How do I know if my new card is activated?" (0.83 with MiniLM)
ask to do a thing and to check it was done."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I activate my new card?", "How do I know if my new card is activated?"),
    ("How do I activate roaming?", "How do I check if roaming is on?"),
    ("How do I enable dark mode?", "How do I check if dark mode is on?"),
    ("How do I enable two-factor authentication?",
     "How do I check if two-factor authentication is enabled?"),
    ("How do I turn off auto-renew?", "How do I check if auto-renew is off?"),
    ("How do I disable notifications?", "How do I check if notifications are disabled?"),
    ("How do I turn off location sharing?", "How do I know if location sharing is off?"),
])
def test_switching_on_is_not_checking_it_is_on(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I enable notifications?", "How can I turn on notifications?"),
    ("How do I disable email notifications?", "How do I turn off email notifications?"),
    ("How do I check if roaming is on?", "How can I see whether roaming is on?"),
])
def test_the_same_switch_passes(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)
    assert guard_ok(stored, asked)
