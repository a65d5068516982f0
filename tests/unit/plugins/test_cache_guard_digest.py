"""The semantic guard on a hash: entries read back from Redis carry a digest of the
guard's features instead of their question; on those features it refuses whatever the
text guard refuses, and it still serves the same question."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from plugins.cache.guard import signature
from plugins.cache.semantic import DIGEST_MARK, guard_digest, guard_ok

WORDS = ["cancel", "renew", "order", "my", "not", "Alice", "Bob", "please", "increase",
         "decrease", "the", "limit", "12", "13", "4.5", "don't", "plan", "upgrade"]
question = st.lists(st.sampled_from(WORDS), min_size=1, max_size=8).map(" ".join)


@settings(max_examples=300, deadline=None)
@given(question, question)
def test_digest_refuses_what_the_features_refuse(asked: str, stored: str) -> None:
    a, b = signature(asked), signature(stored)
    features_differ = (a.numbers != b.numbers or a.negations != b.negations
                       or a.names != b.names or a.directions != b.directions)
    if features_differ:
        assert not guard_ok(asked, guard_digest(stored))
    assert guard_ok(stored, guard_digest(stored))


def test_digest_holds_no_text() -> None:
    digest = guard_digest("cancel order 12345 for Alice")
    assert digest.startswith(DIGEST_MARK)
    assert "12345" not in digest and "alice" not in digest.lower()
