"""The guard refuses a question that asks why against one that asks how the asker does
the same thing (guard._reason_and_steps): "Why do I need to verify my identity?" / "How
do I verify my identity?" (0.84 with MiniLM) ask for a reason and for steps."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok


@pytest.mark.parametrize(("stored", "asked"), [
    ("Why do I need to verify my identity?", "How do I verify my identity?"),
    ("Why do I have to reset my password?", "How do I reset my password?"),
    ("Why should I update the app?", "How do I update the app?"),
    ("Why do I need a visa for Japan?", "How do I get a visa for Japan?"),
    ("Why do I have to pay a deposit?", "How do I pay a deposit?"),
    ("Why do I need to log in again?", "How can I log in again?"),
    # "how come" asks why
    ("How come I was charged a late fee?", "How do I avoid being charged a late fee?"),
    ("How come I need to verify my identity?", "How do I verify my identity?"),
])
def test_a_reason_is_not_the_steps(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("Why can't I log in to my account?", "I can't log in to my account, what should I do?"),
    ("Why is my internet so slow?", "What can I do about slow internet speeds?"),
    ("How do I verify my identity?", "How can I verify my identity?"),
    ("How come my order is late?", "Why is my order late?"),
])
def test_a_reason_against_no_steps_passes(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)
    assert guard_ok(stored, asked)


@pytest.mark.timeout(30)  # a guard against a hang, far above the milliseconds they take
@pytest.mark.parametrize("text", ["how " * 1000, "how" + " " * 4000 + "do", "how do " * 600])
def test_long_questions_stay_linear(text: str) -> None:
    assert not guard_ok("why " + text, "how do i " + text)


@pytest.mark.parametrize(("stored", "asked"), [
    ("How can my order be cancelled?", "How come my order was cancelled?"),
    ("How can my card be blocked?", "How come my card was blocked?"),
    ("How can my subscription be paused?", "How come my subscription is paused?"),
    ("How can my order get cancelled?", "How come my order got cancelled?"),
    ("How can my order be cancelled?", "Why was my order cancelled?"),
])
def test_a_reason_is_not_the_steps_of_a_passive(stored: str, asked: str) -> None:
    """How a thing of one's may be put in a state, its doer unsaid, asks the steps as
    "How can I ..." does (0.82-0.91 with MiniLM against the reason)."""
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("How can my order be cancelled?", "How do I cancel my order?"),
    ("How can my order be cancelled?", "Can my order be cancelled?"),
])
def test_the_steps_of_a_passive_pass_the_steps(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)
    assert guard_ok(stored, asked)


@pytest.mark.timeout(30)
def test_the_passive_steps_stay_linear() -> None:
    assert not guard_ok("how can my " + "a " * 3000 + "be", "why " + "a " * 3000)
