"""A clause's subject may be a noun of two words ("if my direct debit fails"): the thing
failing on its own against the asker cancelling it ("What happens if I cancel my direct
debit?", 0.78 with MiniLM) are two doers (guard_roles.agents)."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok
from plugins.cache.guard_roles import agents


@pytest.mark.parametrize(("stored", "asked"), [
    ("What happens if my direct debit fails?", "What happens if I cancel my direct debit?"),
    ("What happens if my credit card expires?", "What happens if I cancel my credit card?"),
    ("Will I be charged if my free trial expires?",
     "Will I be charged if I cancel my free trial?"),
])
def test_a_thing_on_its_own_and_the_asker_miss(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("question", "kinds"), [
    ("what happens if my direct debit fails?", ("other",)),
    ("what if my account is frozen?", ("passive",)),
    ("what happens if my bank freezes my account?", ("other",)),
    ("i was charged before the trial ended, why?", ("other",)),
    ("can i cancel before the renewal date?", ()),
])
def test_agents(question: str, kinds: tuple[str, ...]) -> None:
    assert agents(question) == kinds


@pytest.mark.timeout(30)  # a guard against a hang, far above the milliseconds they take
@pytest.mark.parametrize("text", [
    "if my a " + "b" * 4000, "if my " + "a " * 2000, "if my direct " + "x" * 4000 + "s",
    "if the a b " * 400, "if my " + "a" * 4000 + " " + "b" * 4000 + "ed",
    "if my a " + "bs " * 1300,
])
def test_long_runs_stay_linear(text: str) -> None:
    """Every clause reads a bounded run after its opening word (4,000 characters)."""
    agents(text)
    assert not guard_ok(text, text + " if i cancel it")
