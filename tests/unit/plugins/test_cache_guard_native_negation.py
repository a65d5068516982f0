"""A negation in another language than English is one ("ne ... pas", "nicht", "não"):
those are the language's small words, which the comparison of the words that say
something leaves out, so only the negation count can see them."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok


@pytest.mark.parametrize(("stored", "asked"), [
    ("Comment puis-je annuler ma commande ?", "Comment ne puis-je pas annuler ma commande ?"),
    ("Pourquoi ma commande est-elle arrivée ?",
     "Pourquoi ma commande n'est-elle pas arrivée ?"),
    ("Pourquoi ai-je reçu un e-mail ?", "Pourquoi n'ai-je jamais reçu un e-mail ?"),
    ("Warum wurde meine Bestellung geliefert?", "Warum wurde meine Bestellung nicht geliefert?"),
    ("Warum habe ich eine Rechnung bekommen?", "Warum habe ich keine Rechnung bekommen?"),
    ("Por que meu pedido chegou?", "Por que meu pedido não chegou?"),
    ("Waarom is mijn bestelling geleverd?", "Waarom is mijn bestelling niet geleverd?"),
    ("Waarom heb ik een factuur gekregen?", "Waarom heb ik geen factuur gekregen?"),
    ("¿Por qué recibí un correo?", "¿Por qué nunca recibí un correo?"),
])
def test_a_negation_added_misses(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("Pourquoi ma commande n'est pas arrivée ?", "Pourquoi ma commande n'est pas arrivée ?"),
    ("Why wasn't my order delivered?", "Why was my order not delivered?"),
])
def test_the_same_negation_passes(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)
    assert guard_ok(stored, asked)
