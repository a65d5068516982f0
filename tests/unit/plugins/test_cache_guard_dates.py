"""A date is one whichever order its day and month come in ("December 24" / "24
December" / "the 24th of December"); another day or month is another date."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok


@pytest.mark.parametrize(("stored", "asked"), [
    ("Are you open on December 24?", "Are you open on 24 December?"),
    ("Are you open on December 24th?", "Are you open on the 24th of December?"),
    ("Is the office closed on Dec 31?", "Is the office closed on 31 Dec?"),
    ("Will my order arrive by March 3, 2027?", "Will my order arrive by 3 March 2027?"),
])
def test_a_date_in_either_order(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)
    assert guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("Are you open on December 24?", "Are you open on 25 December?"),
    ("Are you open on December 24?", "Are you open on 24 November?"),
    ("Are you open on 24 December?", "Are you open on 24 January?"),
    ("Is the office closed from 3 May to 5 June?", "Is the office closed from 5 June to 3 May?"),
])
def test_another_date_is_not(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)
