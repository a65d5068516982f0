"""A question in the passive, its doer unsaid, and the same question in the active ask
one thing ("Can my order be cancelled?" / "Can I cancel my order?"); a "by" that names
another doer, or another thing, still misses (guard._doers_differ, guard._voice_only)."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok
from plugins.cache.guard_roles import doer


@pytest.mark.parametrize(("stored", "asked"), [
    ("Can my order be cancelled?", "Can I cancel my order?"),
    ("Can my subscription be paused?", "Can I pause my subscription?"),
    ("Can the meeting be rescheduled?", "Can I reschedule the meeting?"),
    ("Can my password be reset?", "Can I reset my password?"),
    ("Can my account be frozen?", "Can I freeze my account?"),
])
def test_a_passive_and_its_active_hit(stored: str, asked: str) -> None:
    """They missed: the subject of "Can my order be ...?" read as a third party doing
    the thing, and "password be reset" / "reset my password" as two words swapped."""
    assert guard_ok(asked, stored)
    assert guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("Can my order be cancelled by the seller?", "Can I cancel my order?"),
    ("Can my subscription be paused by my employer?", "Can I pause my subscription?"),
    ("Can my subscription be paused?", "Can I pause my membership?"),
    ("Can my order be cancelled?", "Can I cancel my booking?"),
    ("Why did my order get cancelled?", "Can I change my delivery date?"),
])
def test_another_doer_or_another_thing_misses(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("Can my phone be tracked?", "Can I track my phone?"),
    ("Can my messages be read?", "Can I read my messages?"),
    ("Can my account be hacked?", "Can I hack my account?"),
    ("Can my calls be recorded?", "Can I record my calls?"),
    ("Can my emails be monitored?", "Can I monitor my emails?"),
    ("Can my files be accessed?", "Can I access my files?"),
    ("Can my data be shared?", "Can I share my data?"),
    ("Can my data be sold?", "Can I sell my data?"),
])
def test_a_passive_of_what_others_do_to_ones_things_misses(stored: str, asked: str) -> None:
    """A passive whose doer is unsaid asks whether someone can do it to the asker's thing
    where the thing is watched, read, taken or attacked ("Can my phone be tracked?": a
    privacy question; "Can I track my phone?": finding it): not the asker's own act.
    Only an action the asker takes on their own thing (cancel, pause, reset, change ...)
    reads the same in both voices."""
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("question", "kind"), [
    ("can my order be cancelled?", "passive-other"),
    ("can my order be cancelled by the seller?", "other"),
    ("can i be refunded by the seller?", "other"),
    ("can i get a refund?", "self"),  # "get a": no passive
    ("why did my order get cancelled?", "passive-other"),
])
def test_doer_reads_the_passive(question: str, kind: str) -> None:
    assert doer(question) == kind


@pytest.mark.timeout(30)  # a guard against a hang, far above the milliseconds they take
@pytest.mark.parametrize("text", [
    "can my x be " + "very " * 800, "can my x get " + "y " * 2000,
    "can my x be done by " * 200, "can the x be" + " by" * 1300,
])
def test_long_runs_stay_linear(text: str) -> None:
    doer(text)
    assert not guard_ok(text, "can i do x?")
