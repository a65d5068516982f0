"""A currency's code is its currency, no name ("in USD" / "in US dollars" / "in
dollars", "in EUR" / "in euros"); another currency is another question."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok


@pytest.mark.parametrize(("stored", "asked"), [
    ("Can I pay in US dollars?", "Can I pay in USD?"),
    ("Can I pay in U.S. dollars?", "Can I pay in USD?"),
    ("Can I pay in dollars?", "Can I pay in USD?"),
    ("How much is the pro plan in euros?", "How much is the pro plan in EUR?"),
    ("Can I be refunded in pounds?", "Can I be refunded in GBP?"),
])
def test_a_code_is_its_currency(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)
    assert guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("Can I pay in USD?", "Can I pay in CAD?"),
    ("Can I pay in USD?", "Can I pay in EUR?"),
    ("Can I pay in US dollars?", "Can I pay in Canadian dollars?"),
    ("Can I pay in US dollars?", "Can I pay in Australian dollars?"),
    ("How much is the pro plan in EUR?", "How much is the pro plan in GBP?"),
    ("Do you ship to the US?", "Do you ship to the UK?"),
    ("Can I pay in USD?", "Can I pay in AUD?"),
])
def test_another_currency_is_not(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)
