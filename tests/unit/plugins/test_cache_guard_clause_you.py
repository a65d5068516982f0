"""In a clause of a condition or a time, "you" is the other party where the question
names the asker ("Will I be charged if you cancel?" / "... if I cancel?", 0.98 with
MiniLM): guard_roles.agents; without the asker named, "you" is anyone ("What happens if
you miss a payment?" / "... if I miss a payment?")."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok
from plugins.cache.guard_roles import agents


@pytest.mark.parametrize(("stored", "asked"), [
    ("Will I be charged if I cancel?", "Will I be charged if you cancel?"),
    ("Do I get a refund if I cancel the flight?", "Do I get a refund if you cancel the flight?"),
    ("What happens to my booking if I cancel?", "What happens to my booking if you cancel?"),
    ("Will my data be deleted if I close my account?",
     "Will my data be deleted if you close my account?"),
    ("Can I get compensation if you delay my delivery?",
     "Can I get compensation if I delay my delivery?"),
])
def test_the_asker_and_the_other_party_in_a_clause_miss(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


def test_a_generic_you_passes() -> None:
    assert guard_ok("What happens if I miss a payment?", "What happens if you miss a payment?")


@pytest.mark.parametrize(("question", "kinds"), [
    ("will i be charged if you cancel?", ("other",)),
    ("what happens if you miss a payment?", ()),
    ("what if you cancel my order and i pay?", ("other",)),
])
def test_agents(question: str, kinds: tuple[str, ...]) -> None:
    assert agents(question) == kinds


@pytest.mark.timeout(30)  # a guard against a hang, far above the milliseconds they take
@pytest.mark.parametrize("text", ["if you " * 600, "my if you can " * 300,
                                  "when you " * 500 + "i"])
def test_long_runs_stay_linear(text: str) -> None:
    """Every clause reads a bounded run after its opening word (4,000 characters)."""
    agents(text)
    assert not guard_ok("will i pay " + text, "will i pay " + text + " if the bank closes it")
