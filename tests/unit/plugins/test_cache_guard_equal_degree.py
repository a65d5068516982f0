"""The guard reads an equal degree ("as fast as") as a comparison of its own
(guard_degrees.py): "Is the basic plan as fast as the premium plan?" / "Is the basic
plan faster than the premium plan?" (0.96 with MiniLM) ask two things."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok
from plugins.cache.guard_degrees import degrees


@pytest.mark.parametrize(("stored", "asked"), [
    ("Is the basic plan as fast as the premium plan?",
     "Is the basic plan faster than the premium plan?"),
    ("Is the train as cheap as the bus?", "Is the train cheaper than the bus?"),
    ("Is the new model as good as the old one?", "Is the new model better than the old one?"),
    ("Is the iPad as powerful as a laptop?", "Is the iPad more powerful than a laptop?"),
    ("Is oat milk as healthy as cow's milk?", "Is oat milk healthier than cow's milk?"),
])
def test_an_equal_degree_is_not_a_comparison(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


def test_an_idiom_is_no_degree() -> None:
    assert degrees("can i get a refund as soon as possible?") == frozenset()
    assert degrees("do you sell phones as well as tablets?") == frozenset()
    assert degrees("is it as fast as the bus?") == {"as fast as"}
    assert degrees("is it as quick as the bus?") == {"as fast as"}


@pytest.mark.timeout(30)  # a guard against a hang, far above the milliseconds they take
@pytest.mark.parametrize("text", ["as " * 1400, "as" + " " * 4000 + "fast as",
                                  "as fast " * 500])
def test_long_questions_stay_linear(text: str) -> None:
    degrees(text)
    assert not guard_ok(text + " faster than the bus", text + " as fast as the bus")
