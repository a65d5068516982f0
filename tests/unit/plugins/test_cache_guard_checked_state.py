"""The guard reads a check of whether a thing was done ("How do I check if I am
registered to vote?") as a check, the action in its clause as the state checked
(guard_actions.checked): it does not pass the question that asks to do the thing ("How
do I register to vote?", 0.82 with MiniLM) as if both named one action."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok
from plugins.cache.guard_actions import checked
from plugins.cache.guard_roles import state


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I register to vote?", "How do I check if I am registered to vote?"),
    ("How do I register to vote?", "How do I know if I'm registered to vote?"),
    ("How do I renew my passport?", "How do I check whether my passport was renewed?"),
    ("How do I cancel my subscription?", "How do I check if my subscription is cancelled?"),
    ("How do I verify my email address?", "How can I tell if my email address is verified?"),
    ("How do I pay my council tax?", "How do I check if my council tax has been paid?"),
    ("How do I enrol in the course?", "How do I see if I am enrolled in the course?"),
])
def test_doing_a_thing_is_not_checking_it_was_done(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I check if I am registered to vote?", "How do I know if I'm registered to vote?"),
    ("How do I check if my payment went through?",
     "How can I see whether my payment went through?"),
])
def test_two_checks_pass(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)
    assert guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("Is my subscription cancelled?", "How do I check if my subscription is cancelled?"),
    ("Is my card activated?", "How can I tell if my card is activated?"),
    ("Was my parcel delivered?", "How can I find out whether my parcel was delivered?"),
    ("Is my refund approved?", "Can you check if my refund is approved?"),
    ("Is my subscription cancelled?", "How do I check if my subscription is canceled?"),
])
def test_checking_a_state_is_asking_it(stored: str, asked: str) -> None:
    """A check whether a thing of one's is in a state asks that state
    (guard_roles.state): the asker checks, and does not do the act."""
    assert guard_ok(asked, stored)
    assert guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("How can I see if my account is locked?", "How can I lock my account?"),
    ("Is my subscription paused?", "How do I check if my subscription is cancelled?"),
    ("How do I check if my parcel was delivered?", "How do I get my parcel delivered?"),
    ("How do I check if my subscription is cancelled?", "Why was my subscription cancelled?"),
    ("Is my subscription cancelled?", "How do I cancel my subscription?"),
])
def test_a_checked_state_is_not_the_act_nor_another_state(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


def test_the_state_read() -> None:
    assert state("is my subscription cancelled?") == "cancelled"
    assert state("how do i check if my gym membership has been paused?") == "paused"
    assert state("how do i cancel my subscription?") == ""
    assert state("how do i check if i am registered to vote?") == ""


def test_the_clause_checked_keeps_its_thing() -> None:
    assert checked(("how", "do", "i", "know", "if", "i", "m", "registered", "to", "vote")) == (
        "how", "do", "i", "check", "i", "to", "vote")
    assert checked(("what", "if", "i", "cancel")) == ("what", "if", "i", "cancel")


@pytest.mark.timeout(30)  # a guard against a hang, far above the milliseconds it takes
@pytest.mark.parametrize("text", ["check if my " + "a " * 4000, "check if " * 2000,
                                  "see whether my a " + "b" * 4000 + " is x",
                                  "is there a reason " * 1000, "how come " * 2000])
def test_long_checks_stay_linear(text: str) -> None:
    state(text)
    guard_ok(text, "is my subscription cancelled?")


@pytest.mark.parametrize(("stored", "asked"), [
    ("Can you lock my account?", "Is my account locked?"),
    ("Can you lock my account?", "Can you check if my account is locked?"),
    ("Block my card", "Is my card blocked?"),
    ("Please block my card", "Please check if my card is blocked"),
    ("Can you block my card?", "Has my card been blocked?"),
    ("I want to block my card", "I want to know if my card is blocked"),
    ("I need to lock my account", "I need to check whether my account is locked"),
])
def test_the_act_asked_of_you_is_not_the_state(stored: str, asked: str) -> None:
    """A state asked or checked against the act asked of "you" or ordered, no doer
    named ("lock" and "block" are no action class: only the doers tell them apart)."""
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("Is my account locked?", "Can you check if my account is locked?"),
    ("Did you lock my account?", "Can you check if my account is locked?"),
])
def test_a_state_asked_of_you_passes(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)
    assert guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("Enable autopay", "Is autopay enabled?"),
    ("Can you enable two-factor authentication?", "Is two-factor authentication enabled?"),
    ("Can you activate roaming?", "Is roaming activated?"),
    ("Disable notifications", "Are notifications disabled?"),
])
def test_the_act_is_not_the_state_of_a_thing_of_no_owner(stored: str, asked: str) -> None:
    """"Is autopay enabled?" names no owner ("my"), so guard_roles.state reads no state
    in it (0.81-0.94 with MiniLM against the act)."""
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


def test_a_state_of_no_owner_passes_what_you_do() -> None:
    assert guard_ok("Is Apple Pay supported?", "Do you support Apple Pay?")
