""""Is it worth ...?" asks an advice (guard_modals "should"): against an obligation or
a permission it asks another thing ("Is it mandatory to have travel insurance?" / "Is it
worth having travel insurance?", 0.76 with MiniLM)."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok
from plugins.cache.guard_modals import modals


@pytest.mark.parametrize(("stored", "asked"), [
    ("Is it mandatory to have travel insurance?", "Is it worth having travel insurance?"),
    ("Is it possible to upgrade my seat?", "Is it worth upgrading my seat?"),
    ("Do I have to get a flu jab?", "Is it worth getting a flu jab?"),
])
def test_an_advice_is_not_an_obligation_or_a_permission(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


def test_worth_is_an_advice() -> None:
    assert modals("is it worth buying travel insurance?") == ("should",)
    assert modals("is it worthwhile to register my bike?") == ("should",)
    assert guard_ok("Should I buy travel insurance?", "Is it worth buying travel insurance?")
