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


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I give my points to a friend?", "How do I get points from a friend?"),
    ("How do I pay a freelancer?", "How do I get paid as a freelancer?"),
    ("How do I refer a friend?", "How do I get referred?"),
    ("How do I forward an email?", "How do I receive a forwarded email?"),
    ("Can I send a gift card to my sister?", "Can I get a gift card from my sister?"),
])
def test_getting_is_receiving(stored: str, asked: str) -> None:
    """"get X from", a giving done to the asker ("get paid", "get referred") and
    receiving what another forwarded are the inward side of what the other gives."""
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("Do you accept Apple Pay?", "Can I pay using Apple Pay?"),
    ("Can I get points from a friend?", "Can I receive points from a friend?"),
])
def test_one_direction_said_again_hits(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)
    assert guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I transfer my domain out?", "How do I transfer a domain in?"),
    ("Can I port my number out?", "Can I port a number in?"),
    ("How do I hand over my lease?", "How do I take over a lease?"),
    ("Who handed over the account?", "Who took over the account?"),
])
def test_in_and_out_over_a_move_are_the_flow(stored: str, asked: str) -> None:
    """"in" / "out" closing a clause after a verb that moves a thing, and handing a
    thing over / taking it over, are the two sides of the flow, the rest reworded
    round them (the one-slot check saw only "in" / "out" alone)."""
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I take over a lease?", "How can I take over the lease?"),
    ("How do I transfer my domain out?", "How can I transfer my domain out?"),
])
def test_the_same_side_of_a_move_hits(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)


@pytest.mark.parametrize(("stored", "asked"), [
    ("Can I transfer in credits from another university?",
     "Can I transfer out credits to another university?"),
    ("How do I port out my number?", "How do I port in my number?"),
    ("Can I transfer out my points?", "Can I transfer my points in?"),
    ("When can I move out?", "When can I move in my things?"),
])
def test_in_and_out_right_after_a_move_are_the_flow(stored: str, asked: str) -> None:
    """"out" said right after a verb that moves a thing, before the thing, and "in" so
    before a possessive or a thing and its "from", are the flow's sides as at the end of
    the clause ("transfer in credits" / "transfer out credits" hit)."""
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I port out my number?", "How can I port my number out?"),
    ("Can I transfer in credits from another college?",
     "Can I transfer credits in from another college?"),
    ("Can I move in the morning?", "Could I move in the morning?"),
    ("Can I transfer in bulk?", "Could I transfer in bulk?"),
])
def test_in_and_out_right_after_a_move_said_either_way_hits(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)
    assert guard_ok(stored, asked)
