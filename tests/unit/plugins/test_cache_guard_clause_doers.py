"""Who does the thing in a clause of a condition or a time ("if I freeze my account" /
"if my bank freezes my account"): the asker on one side and a third party on the other
ask two things (guard_roles.agents)."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok
from plugins.cache.guard_roles import agents


@pytest.mark.parametrize(("stored", "asked"), [
    ("What happens if I freeze my account?", "What happens if my bank freezes my account?"),
    ("What happens if I cancel my flight?", "What happens if the airline cancels my flight?"),
    ("Do I get a refund if I cancel the order?",
     "Do I get a refund if the seller cancels the order?"),
    ("What happens when I close my account?", "What happens when the bank closes my account?"),
    ("What happens if we terminate the contract?",
     "What happens if the supplier terminates the contract?"),
    ("What happens to my data after I close my account?",
     "What happens to my data after the company closes my account?"),
    ("What happens if I cancel my flight?", "What if my flight is cancelled by the airline?"),
])
def test_the_asker_and_a_third_party_doing_it_in_a_clause_miss(stored: str,
                                                                asked: str) -> None:
    """They hit (0.82-0.95): only a question's opening auxiliary named its doer."""
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("What happens if my bank freezes my account?",
     "What happens if the bank freezes my account?"),
    ("What happens if the airline cancels my flight?",
     "What if my flight is cancelled by the airline?"),
    ("What happens if I skip a payment?", "What happens if a payment is skipped?"),
])
def test_the_same_doer_or_an_unsaid_one_hits(stored: str, asked: str) -> None:
    """A clause in the passive with no "by" names no doer."""
    assert guard_ok(asked, stored)
    assert guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("What should I do if my package doesn't arrive?",
     "What should I do if I don't receive my package?"),
    ("Can I get a refund if my order arrives damaged?",
     "Can I get a refund if I receive a damaged order?"),
    ("What should I do if my password doesn't work?",
     "What should I do if I can't log in with my password?"),
])
def test_a_things_own_event_names_no_doer(stored: str, asked: str) -> None:
    """A thing that arrives or works is no third party doing what the
    asker does on the other side: they hit before clauses were compared, and missed
    since ("my package" read as another doer than "I")."""
    assert guard_ok(asked, stored)
    assert guard_ok(stored, asked)


@pytest.mark.parametrize(("question", "kinds"), [
    ("what if my package doesn't arrive?", ()),
    ("what if my password doesn't work?", ()),
    ("can i get a refund if my order arrives damaged?", ()),
    ("what if my card expired?", ("other",)),  # (it ended: not the asker ending it)
    ("what if the seller fails to ship?", ("other",)),  # (a party failing to act)
    ("what if my payment fails?", ("other",)),
    ("what happens if my bank freezes my account?", ("other",)),
    ("can i keep my number if i switch carriers?", ("self",)),
    ("i was charged before the trial ended, why?", ("other",)),
    ("can i cancel before the renewal date?", ()),  # no verb: a preposition's object
    ("what if my account is frozen?", ("passive",)),
    ("what if my order got cancelled by the seller?", ("other",)),
    ("do i pay a fee if i get a refund?", ("self",)),  # "get a": no passive
    ("what happens if the seller does not ship?", ("other",)),
])
def test_agents(question: str, kinds: tuple[str, ...]) -> None:
    assert agents(question) == kinds


@pytest.mark.timeout(30)  # a guard against a hang, far above the milliseconds they take
@pytest.mark.parametrize("text", [
    "if the " * 700, "if my bank " * 400, "when i " * 700, "if a b is " * 400,
    "if the x was cancelled by the " * 130, "before " * 600 + "the x",
])
def test_long_runs_stay_linear(text: str) -> None:
    """Every clause reads a bounded run after its opening word (4,000 characters)."""
    agents(text)
    assert not guard_ok(text, text + " if the bank closes it")
