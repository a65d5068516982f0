"""The guard refuses a question that asks to do another thing with the same thing
(guard_actions.py), however the frame is reworded round the verb."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I return a damaged item?", "How can I exchange a damaged item?"),
    ("How do I reset my password?", "Change my password"),
    ("How do I open a savings account?", "What's the way to close a savings account?"),
    ("Where do I send my resignation letter?", "How do I write a resignation letter?"),
    ("How do I download my payslip?", "Where can I see my payslip?"),
    ("How do I book a flight?", "How can I cancel a flight?"),
    ("Can I pause my subscription?", "What's the way to renew my subscription?"),
    ("How do I print my W-2?", "Where can I download my W-2?"),
])
def test_another_action_on_the_same_thing_misses(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I book a blood test?", "How can I schedule a blood test?"),
    ("How do I cancel my subscription?", "I want to stop my subscription"),
    ("How do I delete my account?", "I want to close my account permanently"),
    ("How do I file a claim?", "How can I submit a claim?"),
    ("Where can I see my payslip?", "Where do I find my payslip?"),
    ("How do I contact customer support?", "How can I reach customer support?"),
    ("Can I switch to the annual plan?", "Can I change to the yearly plan?"),
    ("How do I get my payslip?", "Where can I see my payslip?"),  # one side only
])
def test_synonyms_or_one_sided_actions_pass(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)


@pytest.mark.parametrize(("stored", "asked"), [
    ("After the update, how do I download my invoice?",
     "After the update, what's the way to print my invoice?"),
    ("I changed my plan last week, how do I cancel my order?",
     "I changed my plan last week, what's the way to return my order?"),
    ("I booked a flight, how do I send the receipt?",
     "I booked a flight, where can I find the receipt?"),
])
def test_an_action_both_name_does_not_hide_a_swapped_one(stored: str, asked: str) -> None:
    """A context clause's action ("after the update", "I booked") is shared: the action
    the question asks for is still compared."""
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("After the update, how do I download my invoice?",
     "After the update, how can I download my invoice?"),
    ("I booked a flight, how do I find the receipt?",
     "I booked a flight, where can I see the receipt?"),
])
def test_an_action_both_name_with_synonyms_passes(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)


@pytest.mark.parametrize(("stored", "asked"), [
    ("The app crashes since the last release, how do I fix it?",
     "The app crashes since the last release, how can I roll it back?"),
    ("How do I repair a corrupted database?", "What's the way to revert a corrupted database?"),
    ("How do I troubleshoot the failed deployment?", "How can I undo the failed deployment?"),
])
def test_repairing_is_not_undoing(stored: str, asked: str) -> None:
    """Fixing a thing and undoing it are other actions ("roll back": its particle is the
    verb's)."""
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I fix a corrupted database?", "How can I repair a corrupted database?"),
    ("How do I revert the deployment?", "How can I roll back the deployment?"),
])
def test_repair_and_undo_synonyms_pass(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)


@pytest.mark.parametrize(("stored", "asked"), [
    ("Who approves my vacation request?", "How do I submit a vacation request?"),
    ("Who approves my expense report?", "How do I file an expense report?"),
    ("Can a manager reject my timesheet?", "Can a manager edit my timesheet?"),
])
def test_approving_or_rejecting_is_an_action(stored: str, asked: str) -> None:
    """Approving and rejecting a thing are actions on it, as submitting it is: another
    action on the same request is another question."""
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I rebase my branch onto main?", "How do I merge my branch into main?"),
    ("Should I rebase my feature branch?", "Should I merge my feature branch?"),
    ("How do I undo a rebase?", "How do I undo a merge?"),
])
def test_rebasing_is_not_merging(stored: str, asked: str) -> None:
    """A branch rebased onto another and one merged into it are other histories; the
    "onto" / "into" is the verb's, not the thing's."""
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


def test_a_rebase_reworded_passes() -> None:
    assert guard_ok("How can I rebase my branch onto main?", "How do I rebase my branch onto main?")


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I activate my new SIM?", "How do I port my number to a new SIM?"),
    ("How do I download my statement?", "How do I print my tax statement?"),
])
def test_another_action_on_another_thing_misses(stored: str, asked: str) -> None:
    """The longer side adds the thing its own action acts on, right after the verb: the
    number is ported, the SIM only where it goes."""
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I change my PIN?", "How can I set a new PIN?"),
    ("Can I reschedule my appointment?", "Can I move my appointment to another day?"),
])
def test_an_added_word_that_is_not_the_thing_acted_on_passes(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)
    assert guard_ok(stored, asked)
