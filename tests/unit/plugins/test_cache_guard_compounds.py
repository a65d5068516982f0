"""A noun compound and the same two nouns with a preposition between them are one
thing ("my flight date" / "the date of my flight", "a Python list" / "a list in
Python"); two words swapped round "to" or far apart are another question."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I change my flight date?", "How can I change the date of my flight?"),
    ("How do I reverse a list in Python?", "How can I reverse a Python list?"),
    ("How do I reset my voicemail PIN?", "How can I reset the PIN for my voicemail?"),
    ("How do I cancel my dentist appointment?", "How can I cancel my appointment at the dentist?"),
])
def test_a_compound_and_its_preposition_pass(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored) and guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I convert miles to kilometers?", "How do I convert kilometers to miles?"),
    ("Can teachers see student grades?", "Can students see teacher grades?"),
    ("Does the basic plan include premium support?",
     "Does the premium plan include basic support?"),
    ("How do I move money from savings to checking?",
     "How do I move money from checking to savings?"),
])
def test_words_swapped_otherwise_are_refused(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored) and not guard_ok(stored, asked)
