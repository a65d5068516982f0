"""A word typed with a slip or shortened is the same word to the one-slot check ("How do
I tranfer money?", "my online banking pwd"); a real word for another is not. A polite
wrapper ("I was wondering how ...", "Please show me how ...") adds nothing."""

from __future__ import annotations

import pytest

from plugins.cache.guard import _misspelt, guard_ok


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I transfer money to another bank?", "How do I tranfer money to another bank?"),
    ("How do I reset my online banking password?", "how do i reset my online banking pwd"),
    ("What is my account balance?", "What is my acct balance?"),
    ("Why didn't I receive my refund?", "Why didn't I recieve my refund?"),
])
def test_a_slip_or_a_short_form_passes(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored) and guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I unlock my card?", "How do I unblock my card?"),
    ("Can I return my car?", "Can I return my card?"),
    ("When is the lunch?", "When is the launch?"),
    ("Can I add a bat to my order?", "Can I add a basket to my order?"),
])
def test_another_word_is_no_slip(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored) and not guard_ok(stored, asked)


def test_misspelt() -> None:
    assert _misspelt("acount", "account") and _misspelt("mgr", "manager")
    assert not _misspelt("casual", "causal") and not _misspelt("deposit", "deposits")


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I book a meeting room?", "I was wondering how I can book a meeting room"),
    ("How do I set up a savings goal?", "Please show me how to set up a savings goal"),
    ("How do I export my contacts?", "Just curious, how can I export my contacts?"),
])
def test_a_polite_wrapper_passes(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored) and guard_ok(stored, asked)


def test_show_is_still_a_direction_and_a_slot() -> None:
    assert not guard_ok("How do I show my profile to others?", "How do I hide my profile?")
    assert not guard_ok("Can you show me the invoice?", "Can you send me the invoice?")
