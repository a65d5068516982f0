"""In another language than English the guard's word lists (directions, actions, filler)
see nothing, so a word that says something on one side must be the other side's too, in
any of its forms ("Mi número fue cancelado" / "Conservé mi número" misses)."""

from __future__ import annotations

import pytest

from plugins.cache.guard import guard_ok


@pytest.mark.parametrize(("stored", "asked"), [
    ("Mi número fue cancelado, ¿qué hago?", "Conservé mi número, ¿qué hago?"),
    ("Mon numéro a été annulé, que faire ?", "J'ai gardé mon numéro, que faire ?"),
    ("Meine Nummer wurde gekündigt, was kann ich tun?",
     "Ich habe meine Nummer behalten, was kann ich tun?"),
    ("Kann ich vor dem Check-in bezahlen?", "Kann ich nach dem Check-in bezahlen?"),
    ("¿Puedo viajar con mi perro?", "¿Puedo viajar sin mi perro?"),
])
def test_a_word_on_one_side_only_misses(stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
    ("Wie kann ich mein Abo kündigen?", "Wie kündige ich mein Abo?"),
    ("Wie kann ich mein Passwort zurücksetzen?", "Wie setze ich mein Passwort zurück?"),
    ("Wo finde ich meine Rechnung?", "Wo kann ich meine Rechnung finden?"),
    ("¿Cómo puedo cancelar mi envío?", "¿Cómo cancelo mi envio?"),
])
def test_the_same_words_in_other_forms_pass(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)
    assert guard_ok(stored, asked)
