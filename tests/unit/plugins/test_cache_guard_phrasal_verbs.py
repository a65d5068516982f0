"""A phrasal verb ("turn on", "logged out") is its one word in every check, the one-slot
check's words included: "How do I turn on two-factor authentication?" / "How do I
enable two-factor authentication?" asks one thing."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I enable two-factor authentication?",
     "How do I turn on two-factor authentication?"),
    ("How do I disable email notifications?", "How do I turn off email notifications?"),
    ("How do I disable dark mode?", "How can I switch off dark mode?"),
    ("Why was I logged out?", "Why was I signed out?"),
    ("How do I register for the newsletter?", "How do I sign up for the newsletter?"),
])
def test_a_phrasal_verb_is_its_word(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)
    assert guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I enable two-factor authentication?",
     "How do I turn off two-factor authentication?"),
    ("How do I turn on email notifications?", "How do I turn on push notifications?"),
    ("How do I turn on dark mode?", "How do I disable dark mode?"),
    ("How do I log in to the app?", "How do I log out of the app?"),
    ("How do I sign up for the newsletter?", "How do I sign out of the newsletter?"),
    ("Can you give me a refund?", "Can you give a refund?"),
])
def test_its_opposite_or_another_thing_is_not(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I archive a chat?", "How do I bring back an archived chat?"),
    ("How do I delete a photo?", "Can I bring back a deleted photo?"),
    ("Why was my old plan removed?", "Why was my old plan brought back?"),
])
def test_bringing_back_is_restoring(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


def test_bringing_back_passes_as_restoring() -> None:
    assert guard_ok("How can I bring back a deleted file?", "How do I restore a deleted file?")


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I erase a photo?", "How do I get back an erased photo?"),
    ("How do I wipe my phone?", "How do I restore my wiped phone?"),
    ("How do I cancel an order?", "How do I reinstate a cancelled order?"),
    ("How do I terminate my contract?", "How do I restore a terminated contract?"),
])
def test_getting_back_what_was_ended_is_restoring(stored: str, asked: str) -> None:
    """Getting a thing back restores it, and restoring an ended thing is the other side
    of ending it: "erase" and "wipe" remove, "restore" and "reinstate" bring back what a
    cancel ended."""
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


def test_getting_back_hits_restoring() -> None:
    assert guard_ok("How do I get back an erased photo?",
                    "How do I restore an erased photo?")


@pytest.mark.parametrize(("stored", "asked"), [
    ("I wiped my phone, how do I get my photos back?",
     "I wiped my phone, how do I delete my photos?"),
    ("How do I get my deleted messages back?", "How do I delete my messages?"),
    ("How do I bring my archived chats back?", "How do I archive my chats?"),
    ("I cancelled my plan, can I get it back?", "I cancelled my plan, can I end it?"),
])
def test_getting_a_thing_back_is_restoring_it(stored: str, asked: str) -> None:
    """"get" or "bring" with the thing between it and "back" restores it, as "get back"
    does ("get my photos back" / "delete my photos" hit)."""
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I get my photos back?", "How do I get back my photos?"),
    ("How do I get my photos back?", "How can I restore my photos?"),
    ("How do I get my money back?", "How can I get my money back?"),
    ("How do I get someone to call me back?", "How can I get someone to call me back?"),
])
def test_getting_a_thing_back_said_either_way_hits(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)
    assert guard_ok(stored, asked)
