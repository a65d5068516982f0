"""A noun compound and the same two nouns with a preposition between them are one
thing ("my flight date" / "the date of my flight", "a Python list" / "a list in
Python"), as a thing's "'s" and its "of" are ("the app's language" / "the language of
the app"); two words swapped round "to" or far apart are another question, and a
person's "'s" against the person doing the thing another."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I change my flight date?", "How can I change the date of my flight?"),
    ("How do I reverse a list in Python?", "How can I reverse a Python list?"),
    ("How do I reset my voicemail PIN?", "How can I reset the PIN for my voicemail?"),
    ("How do I cancel my dentist appointment?", "How can I cancel my appointment at the dentist?"),
    ("How do I view the logs of a Docker container?", "How can I see a Docker container's logs?"),
    ("How do I change the language of the app?", "How can I change the app's language?"),
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
    ("Can my manager see my payslip?", "Can I see my manager's payslip?"),
    ("Can the admin read the user's messages?", "Can the user read the admin's messages?"),
    # stop 49 review: "the number of X" is a count, "the X number" an identifier; "a
    # glass of wine" is wine, "a wine glass" a glass
    ("How do I find the order number?", "How do I find the number of orders?"),
    ("Can I see my ticket number?", "Can I see the number of my tickets?"),
    ("How much is a wine glass?", "How much is a glass of wine?"),
    ("Can I bring a water bottle?", "Can I bring a bottle of water?"),
])
def test_words_swapped_otherwise_are_refused(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored) and not guard_ok(stored, asked)
