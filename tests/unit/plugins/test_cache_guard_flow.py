"""Giving is the outgoing side of a flow ("Can I gift my subscription?" / "Can I receive a
subscription as a gift?"), and what is given or sent to the asker, the asker receives."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok


@pytest.mark.parametrize(("stored", "asked"), [
    ("Can I gift my subscription to someone?", "Can I receive a subscription as a gift?"),
    ("Can I give my ticket to a friend?", "Can I receive a ticket from a friend?"),
    ("How do I give store credit to a customer?",
     "How do I receive store credit from a customer?"),
])
def test_giving_is_not_receiving(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("Can you give me a refund?", "Can I receive a refund?"),
    ("Please send me the invoice", "How do I receive the invoice?"),
    ("Do you offer gift wrapping?", "Is gift wrapping available?"),
])
def test_what_the_asker_is_given_is_received(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)
    assert guard_ok(stored, asked)
