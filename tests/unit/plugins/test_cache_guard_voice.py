"""A thing's act and the same act in the passive, its doer unsaid, are one question
("Will my order ship today?" / "Will my order be shipped today?"), as a state asked in
the present and in the perfect are ("Is my account frozen?" / "Has my account been
frozen?"). A person's act and the person undergoing it are two ("Will I pay the fee?"
/ "Will I be paid the fee?")."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok


@pytest.mark.parametrize(("stored", "asked"), [
    ("Will my order ship today?", "Will my order be shipped today?"),
    ("When does my subscription renew?", "When does my subscription get renewed?"),
    ("Is my account frozen?", "Has my account been frozen?"),
    ("Are my files deleted?", "Have my files been deleted?"),
    ("Will my payment post today?", "Will my payment be posted today?"),
    ("When will my app update?", "When will my app be updated?"),
    # stop 49 review: under a condition the present is what happens each time, as the
    # future is
    ("Is my account locked if I enter the wrong PIN three times?",
     "Will my account be locked if I enter the wrong PIN three times?"),
    ("Is my data deleted when I close my account?",
     "Will my data be deleted when I close my account?"),
    ("Is my card charged when I place an order?",
     "Will my card be charged when I place an order?"),
    ("Is my subscription renewed automatically?",
     "Will my subscription be renewed automatically?"),
    ("Is my order shipped the same day?", "Will my order be shipped the same day?"),
])
def test_one_act_said_two_ways_passes(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored) and guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("Will I pay the fee?", "Will I be paid the fee?"),
    ("Can I transfer to another team?", "Can I be transferred to another team?"),
    ("When do you charge?", "When do you get charged?"),
    ("Is my account frozen?", "Will my account be frozen?"),
    # stop 49 review: a person named by a noun, not a pronoun, acts or undergoes the act
    ("When will the seller pay?", "When will the seller be paid?"),
    ("Will my employer be notified?", "Will my employer notify?"),
    ("Will the client call?", "Will the client be called?"),
    ("Does the customer get charged?", "Does the customer charge?"),
    ("Can the driver be stopped?", "Can the driver stop?"),
    # stop 49 review: the present of a practice against the perfect of an event
    ("Is my data sold?", "Has my data been sold?"),
    ("Are my payments reported to credit bureaus?",
     "Have my payments been reported to credit bureaus?"),
    ("Is my phone tracked?", "Has my phone been tracked?"),
    ("Is my call recorded?", "Has my call been recorded?"),
])
def test_the_roles_or_the_time_changed_are_refused(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored) and not guard_ok(stored, asked)
