"""The guard reads "during" / "while" as a time of its own, neither before nor after
(guard._DIRECTION): "Is the deadline before or after the holiday?" / "Is the deadline
during the holiday?" (0.92 with MiniLM) ask two things."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok


@pytest.mark.parametrize(("stored", "asked"), [
    ("Is the deadline before or after the holiday?", "Is the deadline during the holiday?"),
    ("Is the office open before or after the holidays?",
     "Is the office open during the holidays?"),
    ("Can I eat before or after the surgery?", "Can I eat during the surgery?"),
    ("Can I work before or after my sick leave?", "Can I work while on sick leave?"),
])
def test_during_is_neither_before_nor_after(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


def test_the_same_time_passes() -> None:
    assert guard_ok("Can I cancel my plan during the trial?",
                    "Can I cancel my plan during the trial?")
    assert guard_ok("Is the office open during the holidays?",
                    "Is your office open during the holidays?")
