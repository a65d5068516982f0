"""A place or a party where a move goes on one side and where it comes from on the other
asks another thing (guard_ends.py), whatever verbs move it."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok
from plugins.cache.guard_ends import ends, ends_differ


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I deposit money into my PayPal account?",
     "How do I get money from my PayPal account?"),
    ("How do I collect payment from a customer?", "How do I make a payment to a customer?"),
    ("How do I add money to my PayPal balance?",
     "How do I take money out of my PayPal balance?"),
    ("How do I send an invoice to a client?", "How do I request an invoice from a client?"),
    ("How do I get a refund from the seller?", "How do I issue a refund to the seller?"),
    ("How do I put money on my gift card?", "How do I take money off my gift card?"),
    ("How do I put money in my account?", "How do I take money out of my account?"),
    ("Can I accept payments from my customers?", "Can I make payments to my customers?"),
    ("How do I transfer my balance to another card?",
     "How do I transfer a balance from another card?"),
    ("Do you ship to the UK?", "Do you ship from the UK?"),
    ("How do I switch from the basic plan to the pro plan?",
     "How do I switch from the pro plan to the basic plan?"),
])
def test_the_source_of_a_move_is_not_its_target(stored: str, asked: str) -> None:
    """The first three hit (0.85-0.87): the verbs are no opposites the direction
    families know (deposit / get, collect / make, add / take)."""
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I deposit money into my PayPal account?",
     "How can I put money into my PayPal account?"),
    ("How do I withdraw money from my PayPal account?",
     "How do I take money out of my PayPal account?"),
    ("How do I transfer money from my savings account to my checking account?",
     "How can I move money from my savings account into my checking account?"),
    ("How do I move photos to my SD card?", "How can I move my photos onto the SD card?"),
])
def test_the_same_ends_pass(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)
    assert guard_ok(stored, asked)


@pytest.mark.parametrize(("a", "b"), [
    ("can i delete photos on my phone?", "can i delete photos from my phone?"),
    ("are the files in my folder synced?", "are the files from my folder synced?"),
    ("why was i charged due to the bank?", "why was i charged from the bank?"),
    ("is the store next to the station?", "is the store far from the station?"),
])
def test_a_place_or_no_move_is_no_end(a: str, b: str) -> None:
    """"on" / "in" say a place as often as a target: they oppose only "off" / "out of";
    "due to", "next to" move nothing."""
    assert not ends_differ(ends(a), ends(b))


def test_ends_read_the_noun_phrase_after_a_determiner() -> None:
    assert ends("transfer credits from my account to my son's account") == (
        ("account", "from"), ("son's", "to"), ("account", "to"))
    assert ends("how do i get money from my paypal account if i am abroad?") == (
        ("paypal", "from"), ("account", "from"))
    assert ends("i want to pay next to the door") == ()


@pytest.mark.timeout(30)  # a guard against a hang, far above the milliseconds they take
@pytest.mark.parametrize("text", [
    "to the " * 600, "from my " * 500, "out of the " * 400, "off of a b c " * 300,
    "to " * 1400 + "the" + " x" * 1000, "due to the " * 400,
])
def test_long_runs_stay_linear(text: str) -> None:
    """Every match reads a bounded run after its preposition (4,000 characters)."""
    ends(text)
    assert not guard_ok(text, text + " into my account")
