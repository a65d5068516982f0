"""The guard's verb synonyms (guard_actions.SAME_ACT): a one-word swap of two verbs that
say one act is no slot changed ("How do I activate roaming?" / "How do I turn on
roaming?", "turn on" read as "enable"); "make" before an appointment or a reservation
books it; "sign into", "log on" are logging in; "reboot" is restarting, "dispatch"
shipping (and "ship" / "be dispatched" one act in the passive). Verbs of one broader action class
("close" / "delete" an account) and opposites stay two questions."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I activate roaming?", "How do I turn on roaming?"),
    ("How do I activate my SIM?", "How do I switch on my SIM?"),
    ("How do I deactivate notifications?", "How do I turn off notifications?"),
    ("How do I book an appointment with a GP?", "How do I make an appointment with a GP?"),
    ("Can I make an appointment for my son?", "Can I book an appointment for my son?"),
    ("Can I reserve a table for tonight?", "Can I book a table for tonight?"),
    ("Can I purchase a gift card online?", "Can I buy a gift card online?"),
    ("How do I log into my account?", "How do I sign into my account?"),
    ("How do I log on to the portal?", "How do I sign in to the portal?"),
    ("Why can't I log in?", "Why can't I logon?"),
    ("How do I restart the router?", "How do I reboot the router?"),
    ("How do I restart my laptop?", "How do I reboot my laptop?"),
    ("When will my order ship?", "When will my order be dispatched?"),
    ("Do you ship to Canada?", "Do you dispatch to Canada?"),
    # stop 49 review: "ship"'s forms double its "p"; "dispatch" takes "es"
    ("When was my order shipped?", "When was my order dispatched?"),
    ("Is my order shipping today?", "Is my order dispatching today?"),
    ("Which warehouse ships my order?", "Which warehouse dispatches my order?"),
])
def test_a_verb_synonym_swapped_passes(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)
    assert guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("How do I deactivate notifications?", "How do I turn on notifications?"),
    ("How do I activate roaming?", "How do I deactivate roaming?"),
    ("How do I make an appointment?", "How do I make a payment?"),
    ("How do I book an appointment?", "How do I cancel an appointment?"),
    ("Can I make a payment online?", "Can I book a payment online?"),
    ("How do I sign into the portal?", "How do I sign up to the portal?"),
    ("How do I log on to the portal?", "How do I log off the portal?"),
    ("Can I buy a gift card online?", "Can I sell a gift card online?"),
    ("How do I close my account?", "How do I delete my account?"),
    ("How do I turn on location sharing?", "How do I turn on location tracking?"),
    ("How do I restart the router?", "How do I stop the router?"),
    ("When will my order ship?", "When will my order be returned?"),
    ("Can I ship an item to you?", "Can I return an item to you?"),
])
def test_other_verbs_or_things_miss(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("What is a buy order?", "What is a purchase order?"),
    ("How do I cancel a buy order?", "How do I cancel a purchase order?"),
    ("How do I create a purchase order?", "How do I create a buy order?"),
    ("Can I return the book?", "Can I return the reserve?"),
])
def test_the_verbs_as_nouns_are_two_things(stored: str, asked: str) -> None:
    """A synonym of SAME_ACT used as a noun (after a determiner: guard_actions.nouns)
    names a thing, not the act: "a buy order" (trading) is no "purchase order"
    (procurement), 0.94-0.98."""
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)
