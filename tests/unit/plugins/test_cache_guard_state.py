"""A question whether a thing of one's is in the state an act leaves it in ("Is my data
shared?") is not the asker doing the act ("Do I share my data?", 0.86 with MiniLM): the
guard passed them as one (guard_roles.doer read no doer on the first). A third party's
act that leaves it so is the same question ("Does the app encrypt my data?")."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok
from plugins.cache.guard_roles import doer


@pytest.mark.parametrize(("stored", "asked"), [
    ("Is my data shared?", "Do I share my data?"),
    ("Is my data sold?", "Do I sell my data?"),
    ("Is my location tracked?", "Can I track my location?"),
    ("Is my order cancelled?", "Can I cancel my order?"),
    ("Is my account verified?", "How do I verify my account?"),
    ("Is my password stored?", "Do I store my password?"),
    ("Was my card charged?", "How do I charge my card?"),
    ("Is my order being shipped?", "Can I ship my order?"),
])
def test_a_state_and_the_askers_act_miss(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("Is my data shared with third parties?", "Do you share my data with third parties?"),
    ("Is my data encrypted?", "Does the app encrypt my data?"),
    ("Is my card charged when I order?", "When is my card charged?"),
    # what is asked of the asker is no state an act left: "need" is "required"
    ("Do I need a referral to see a specialist?", "Is a referral required for a specialist?"),
    ("Can my order be cancelled?", "Can I cancel my order?"),
])
def test_a_state_and_another_partys_act_hit(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)
    assert guard_ok(stored, asked)


@pytest.mark.parametrize(("question", "kind"), [
    ("is my data shared?", "state"),
    ("why is my account locked?", "state"),
    ("is my order being shipped?", "state"),
    ("is a referral required?", ""),
    ("is the store open?", ""),
    ("am i charged twice?", ""),
    ("do i share my data?", "self"),
])
def test_doer(question: str, kind: str) -> None:
    assert doer(question) == kind


@pytest.mark.parametrize(("stored", "asked"), [
    ("Is my order cancelled?", "Can my order be cancelled?"),
    ("Is my data shared with third parties?", "Can my data be shared with third parties?"),
    ("Was my card charged?", "Can my card be charged?"),
    ("Is my account suspended?", "Could my account be suspended?"),
    ("How do I check if my order is cancelled?", "Can my order be cancelled?"),
])
def test_a_state_is_not_whether_it_may_be(stored: str, asked: str) -> None:
    """Whether a thing is in a state, and whether it can be put in it (0.80-0.90 with
    MiniLM)."""
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


def test_a_state_and_a_passive_without_a_modal_pass() -> None:
    assert guard_ok("Did my order get cancelled?", "Is my order cancelled?")


@pytest.mark.timeout(30)  # a guard against a hang, far above the microseconds it takes
@pytest.mark.parametrize("text", ["is my " + "a" * 4000, "is my a " + "b" * 4000 + "x",
                                  "is " + "my " * 2000, "is my a being " + "e" * 4000])
def test_long_runs_stay_linear(text: str) -> None:
    doer(text)
