"""A near miss reworded round its changed slot ("How do I ..." / "How can I ...", "Can I
..." / "Is it possible to ...") misses as the plain one-slot near miss does; a verb
swapped with the frame still reads as a paraphrase."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok


@pytest.mark.parametrize(("stored", "asked"), [
    ("Can I change my delivery address?", "Is it possible to change my billing address?"),
    ("How do I update my billing address?", "How can I update my shipping address?"),
    ("How do I update my credit card?", "How can I update my debit card?"),
    ("Can I get a student discount?", "Is it possible to get a senior discount?"),
    ("How do I download the mobile app?", "How can I download the desktop app?"),
    ("How do I book an economy seat?", "How can I book a business seat?"),
    ("How do I set a spending limit?", "How can I set a withdrawal limit?"),
    ("Where do I find my tracking number?", "Where can I find my order number?"),
    ("is the berlin office open on monday", "is the munich office open mondays"),
    ("How do I add a travel insurance?", "How can I add a health insurance?"),
])
def test_a_reworded_slot_change_misses(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I update my billing address?", "How can I update my billing address?"),
    ("Can I change my delivery address?", "Is it possible to change the delivery address?"),
    ("Where do I find my account number?", "Where can I see my account number?"),
    ("How do I contact customer support?", "How can I reach customer support?"),
    ("Do I need a referral to see a specialist?", "Is a referral required for a specialist?"),
    ("How do I cancel my subscription?", "How can I stop my subscription?"),
    ("Did my payment go through?", "Has my payment gone through?"),
])
def test_a_reworded_frame_or_verb_passes(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)


@pytest.mark.parametrize(("stored", "asked"), [
    ("Can I get a paper invoice?", "Where can I find my invoice?"),
    ("Can I get a printed receipt?", "Where can I find my receipt?"),
    ("Is there a family discount?", "Where can I see my discount?"),
])
def test_a_modifier_that_narrows_the_thing_misses(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I file a claim?", "How can I submit an insurance claim?"),
    ("How do I change my PIN?", "How can I set a new PIN?"),
    ("Where can I find my invoice?", "How do I get a copy of my invoice?"),
    ("Can I get a paper statement?", "Do you send printed statements?"),
])
def test_a_synonym_and_a_word_added_pass(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)


def test_a_paper_copy_narrows_too() -> None:
    assert not guard_ok("Where can I find my contract?", "Can I get a paper copy of my contract?")
    assert not guard_ok("Can I get a paper copy of my contract?", "Where can I find my contract?")
    assert guard_ok("How do I get a copy of my invoice?", "Where can I find my invoice?")
