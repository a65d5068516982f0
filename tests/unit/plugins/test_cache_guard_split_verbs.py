"""A German or Dutch verb split round its object, its particle last ("Wie lade ich die
App herunter?"), is the infinitive of the other side ("herunterladen"): one verb
(guard_native.joined); another particle is another verb."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok
from plugins.cache.guard_native import joined


@pytest.mark.parametrize(("stored", "asked"), [
    ("Wie kann ich die App herunterladen?", "Wie lade ich die App herunter?"),
    ("Wie kann ich mich abmelden?", "Wie melde ich mich ab?"),
    ("Wie kann ich meine Bestellung zurückgeben?", "Wie gebe ich meine Bestellung zurück?"),
    ("Wo kann ich meine Rechnung herunterladen?", "Wo lade ich meine Rechnung herunter?"),
    ("Wie kann ich die Zahlung abbrechen?", "Wie breche ich die Zahlung ab?"),
    ("Hoe kan ik me afmelden?", "Hoe meld ik me af?"),
])
def test_a_split_verb_is_its_infinitive(stored: str, asked: str) -> None:
    """They missed: "herunter" and "lade" were two words no word of the other side was
    a form of."""
    assert guard_ok(asked, stored)
    assert guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("Wie lade ich die App herunter?", "Wie lade ich die App hoch?"),
    ("Wie kann ich mich anmelden?", "Wie melde ich mich ab?"),
    ("Wie kann ich Geld einzahlen?", "Wie zahle ich Geld aus?"),
    ("Wie kann ich die Benachrichtigungen ausschalten?",
     "Wie schalte ich die Benachrichtigungen ein?"),
    ("Hoe kan ik me aanmelden?", "Hoe meld ik me af?"),
])
def test_another_particle_is_another_verb(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("text", "language", "out"), [
    ("Wie lade ich die App herunter?", "de", "Wie herunterlade ich die App?"),
    ("Melde ich mich ab?", "de", "abmelde ich mich?"),
    ("Wie kann ich mich abmelden?", "de", "Wie kann ich mich abmelden?"),
    ("Wie viel kostet der Versand nach Österreich?", "de",
     "Wie viel kostet der Versand nach Österreich?"),
    ("Wie kann ich das ab?", "de", "Wie kann ich das ab?"),  # an auxiliary: no split verb
    ("How do I log in?", "", "How do I log in?"),
])
def test_joined(text: str, language: str, out: str) -> None:
    assert joined(text, language) == out


@pytest.mark.timeout(30)  # a guard against a hang, far above the milliseconds they take
@pytest.mark.parametrize("text", [
    "Wie lade ich " + "die " * 1000 + "herunter?", "Wie " + " " * 4000 + "ab",
    "Wie lade ich die App" + " herunter" * 450 + "?" * 20,
])
def test_long_questions_stay_linear(text: str) -> None:
    joined(text, "de")
    assert not guard_ok(text, "Wie kann ich die App herunterladen?")
