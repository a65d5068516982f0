"""The guard refuses a question about all of a thing for one about some of it
(guard_quantifiers.py), however the frame is reworded round them."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok
from plugins.cache.guard_quantifiers import quantifiers


@pytest.mark.parametrize(("stored", "asked"), [
    ("Delete all my saved cards", "Delete one saved card"),
    ("Does every order ship free?", "Do some orders ship free?"),
    ("Do all plans include support?", "Do any plans include support?"),
    ("Can I cancel all my orders?", "Is it possible to cancel one of my orders?"),
    ("Are all employees eligible for the bonus?", "Are some employees eligible for the bonus?"),
])
def test_all_against_some_misses(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I log out of all devices?", "How can I log out of all my devices?"),
    ("Are there any fees?", "Are there fees?"),
    ("Does every plan include support?", "Do all plans include support?"),
    ("Can I see all my invoices in one place?", "Can I see all my invoices together?"),
    # stop 49 review: "part of every plan" is included in each, no part of one
    ("Is support part of every plan?", "Does every plan include support?"),
    ("Are backups part of all plans?", "Do all plans include backups?"),
])
def test_the_same_quantity_or_one_sided_passes(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)


def test_kinds() -> None:
    assert quantifiers("delete all my cards, each one") == {"all"}
    assert quantifiers("delete one saved card") == {"some"}
    assert quantifiers("which one is it? no one knows. the one i like") == frozenset()
