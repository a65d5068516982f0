"""`proxy.tally.Tally`: what owners hold, and which holds the most, as every bound
shared fairly between tenants reads it."""

from __future__ import annotations

import random

import pytest

from proxy.tally import Tally


def test_the_largest_is_the_owner_holding_the_most_of_equals_the_least_name() -> None:
    t = Tally()
    t.add("b", 5)
    t.add("a", 5)
    assert t.largest() == "a" and t.total == 10
    t.add("a", -1)
    assert t.largest() == "b"
    t.set("b", 0)
    assert "b" not in t and t.largest() == "a" and t.total == 4 and len(t) == 1
    t.add("a", -4)
    with pytest.raises(LookupError):
        t.largest()
    assert t.total == 0 and len(t) == 0


def test_it_agrees_with_a_plain_count_through_random_changes() -> None:
    rng = random.Random(7)
    t, plain = Tally(), dict[str, int]()
    for _ in range(5000):
        owner = f"o{rng.randrange(30)}"
        delta = rng.randrange(-plain.get(owner, 0), 50)
        t.add(owner, delta)
        plain[owner] = plain.get(owner, 0) + delta
        if not plain[owner]:
            del plain[owner]
        assert t.total == sum(plain.values()) and dict(t.items()) == plain
        if plain:
            most = max(plain.values())
            assert t.largest() == min(o for o, n in plain.items() if n == most)
    assert len(t._heap) <= 2 * len(t) + 65  # rebuilt, not grown without bound
