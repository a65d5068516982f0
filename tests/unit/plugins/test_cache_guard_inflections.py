"""The guard's direction families hold their words in every regular form: "Why was my
payment accepted?" / "Why did my payment get rejected?" is a conflict as "accept" /
"reject" is."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok


@pytest.mark.parametrize(("stored", "asked"), [
    ("Why was my payment accepted?", "Why did my payment get rejected?"),
    ("Why was my subscription canceled?", "Why did my subscription get renewed?"),
    ("Why was my subscription cancelled?", "Why has my subscription been renewed?"),
    ("Why was my plan upgraded?", "Why did my plan get downgraded?"),
    ("Why has my limit increased?", "Why did my limit get reduced?"),
    ("Why has my credit limit been raised?", "Why was my credit limit lowered?"),
    ("Why was my order returned?", "Why did my order get purchased?"),
    ("Why were my contacts imported?", "Why did my contacts get exported?"),
    ("Why was I logged out?", "Why did I get logged in?"),
    ("Why was my request approved?", "Why did my request get denied?"),
    ("Why were prices increased?", "Why have prices decreased?"),
    ("Why were my messages deleted?", "Why have my messages been added?"),
    ("Why is my balance increasing?", "How come my balance keeps decreasing?"),
    ("Why were the notifications turned on?", "Why did the notifications get switched off?"),
    ("Who bought my tickets?", "Who has sold my tickets?"),
])
def test_inflected_opposites_miss(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("Why was my payment declined?", "Why did my payment get declined?"),
    ("Why was my subscription cancelled?", "Why did my subscription get canceled?"),
    ("Why was I logged out?", "Why did I get logged out?"),
])
def test_the_same_direction_in_another_form_passes(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)
