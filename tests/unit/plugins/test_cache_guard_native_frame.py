"""In another language than English, the language's small words are read as their English
ones (guard_native.english_frame: "puedo" as "can", "cómo" as "how", "mi" as "my") and a
word in another form as the other side's ("exporto" / "exportar"), so the English word
checks see the frame: "¿Cómo puedo cancelar mi suscripción?" / "¿Cómo cancelo mi
suscripción?" hits, a question word, a negation, an owner or a thing swapped misses, and
a word with a prefix that undoes it is no other form ("activo" / "desactivo")."""

from __future__ import annotations

import pytest

from plugins.cache.guard import _language, _one_stem, guard_ok


@pytest.mark.parametrize(("stored", "asked"), [
 ("¿Cómo puedo cancelar mi suscripción?", "¿Cómo cancelo mi suscripción?"),
 ("¿Cómo exporto mis contactos?", "¿Cómo puedo exportar mis contactos?"),
 ("Comment annuler ma commande ?", "Comment puis-je annuler ma commande ?"),
 ("Comment puis-je changer mon adresse e-mail ?", "Comment changer mon adresse e-mail ?"),
 ("¿Puedo cambiar mi plan a anual?", "¿Es posible cambiar mi plan a anual?"),
 ("¿Cómo puedo cambiar mi contraseña?", "¿Cómo cambio mi contraseña?"),
 ("Wie kann ich mein Passwort ändern?", "Wie ändere ich mein Passwort?"),
 ("Come posso cambiare la password?", "Come cambio la password?"),
 ("Posso cancelar minha assinatura?", "É possível cancelar minha assinatura?"),
 ("Hoe kan ik mijn wachtwoord wijzigen?", "Hoe wijzig ik mijn wachtwoord?"),
])
def test_small_words_and_a_verb_in_another_form_pass(stored: str, asked: str) -> None:
    assert guard_ok(asked, stored)
    assert guard_ok(stored, asked)


@pytest.mark.parametrize(("stored", "asked"), [
 ("¿Cómo cancelo mi suscripción?", "¿Por qué cancelo mi suscripción?"),
 ("¿Cómo puedo cancelar mi suscripción?", "¿Dónde puedo cancelar mi suscripción?"),
 ("¿Cómo puedo cancelar mi suscripción?", "¿Cuándo puedo cancelar mi suscripción?"),
 ("¿Puedo cancelar mi suscripción?", "¿Debo cancelar mi suscripción?"),
 ("¿Puedo cancelar mi suscripción?", "¿Tengo que cancelar mi suscripción?"),
 ("¿Puedo cancelar mi suscripción?", "¿No puedo cancelar mi suscripción?"),
 ("¿Cómo cancelo mi suscripción?", "¿Cómo cancelo tu suscripción?"),
 ("¿Cómo cancelo mi pedido?", "¿Cómo cancelo su pedido?"),
 ("¿Cómo exporto mis contactos?", "¿Cómo importo mis contactos?"),
 ("¿Puedo pagar con tarjeta?", "¿Puedo pagar sin tarjeta?"),
 ("¿Cómo cambio mi contraseña?", "¿Cómo cambio mi correo?"),
 ("Comment annuler ma commande ?", "Pourquoi annuler ma commande ?"),
 ("Comment puis-je annuler ma commande ?", "Où puis-je annuler ma commande ?"),
 ("Comment puis-je annuler ma commande ?", "Comment ne puis-je pas annuler ma commande ?"),
 ("Puis-je annuler ma commande ?", "Dois-je annuler ma commande ?"),
 ("Pourquoi ma commande est-elle arrivée ?", "Pourquoi ma commande n'est-elle pas arrivée ?"),
 ("Comment annuler ma commande ?", "Comment annuler votre commande ?"),
 ("Puis-je payer avec PayPal ?", "Puis-je payer sans PayPal ?"),
 ("Puis-je payer avant la livraison ?", "Puis-je payer après la livraison ?"),
 ("Wie kann ich mein Passwort ändern?", "Warum kann ich mein Passwort ändern?"),
 ("Wie kann ich mein Passwort ändern?", "Wie kann ich mein Passwort nicht ändern?"),
 ("Kann ich vor dem Check-in bezahlen?", "Kann ich nach dem Check-in bezahlen?"),
 ("Kann ich mein Abo kündigen?", "Muss ich mein Abo kündigen?"),
 ("Wie kündige ich mein Abo?", "Wie kündige ich Ihr Abo?"),
 ("Wo finde ich meine Rechnung?", "Wann finde ich meine Rechnung?"),
 ("Come posso cambiare la password?", "Perché posso cambiare la password?"),
 ("Posso pagare con carta?", "Non posso pagare con carta?"),
 ("Como posso cancelar minha assinatura?", "Por que posso cancelar minha assinatura?"),
 ("Posso cancelar minha assinatura?", "Não posso cancelar minha assinatura?"),
 ("Hoe kan ik mijn wachtwoord wijzigen?", "Waarom kan ik mijn wachtwoord wijzigen?"),
 ("Hoe kan ik mijn wachtwoord wijzigen?", "Hoe kan ik mijn wachtwoord niet wijzigen?"),
 ("¿Cómo cancelo mi suscripción?", "¿Cómo cancelo mi suscripción anual?"),
 ("¿Puedo cambiar mi plan a anual?", "¿Puedo cambiar mi plan a mensual?"),
 ("¿Puedo cambiar mi plan a anual?", "¿Es obligatorio cambiar mi plan a anual?"),
 ("Mi número fue cancelado, ¿qué hago?", "Conservé mi número, ¿qué hago?"),
 ("¿Cómo envío dinero?", "¿Cómo recibo dinero?"),
 ("Comment envoyer de l'argent ?", "Comment recevoir de l'argent ?"),
 ("¿Cómo cancelo mi suscripción?", "How do I cancel my subscription?"),
 ("¿Cómo activo mi cuenta?", "¿Cómo desactivo mi cuenta?"),
 ("Comment activer mon compte ?", "Comment désactiver mon compte ?"),
 ("¿Para qué sirve mi cuenta?", "¿Cómo sirve mi cuenta?"),
])
def test_a_question_word_a_negation_an_owner_or_a_thing_swapped_misses(
        stored: str, asked: str) -> None:
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)


@pytest.mark.parametrize(("x", "y", "same"), [
    ("exporto", "exportar", True), ("cancelo", "cancelar", True),
    ("setze", "zurucksetzen", True), ("activo", "desactivo", False),
    ("activer", "desactiver", False), ("aktiviert", "deaktiviert", False),
    ("attivato", "disattivato", False), ("activada", "reactivada", False),
    ("sperrt", "entsperrt", False),
])
def test_a_prefix_that_undoes_a_word_is_no_other_form(x: str, y: str, same: bool) -> None:
    assert _one_stem(x, y) is same


@pytest.mark.parametrize(("question", "language"), [
    ("Pourquoi payer?", "fr"), ("Annuler ma commande?", "fr"), ("Je veux annuler", "fr"),
    ("Mot de passe oublié?", "fr"), ("¿Reembolso?", "es"), ("¿Cuánto cuesta?", "es"),
    ("Mi contraseña?", "es"), ("Wie kündigen?", "de"),
    # one listed word that is an English word too, in English
    ("Was charged twice?", ""), ("Van rental prices?", ""), ("Refund possible?", ""),
])
def test_a_short_question_is_read_in_its_language(question: str, language: str) -> None:
    """One small word of another language and none of English's tell a short question's
    language, as a Spanish "¿" does: it was English below two such words."""
    assert _language(question) == language


@pytest.mark.parametrize(("stored", "asked"), [
    ("Annuler ma commande?", "Cancel my order?"),
    ("¿Reembolso?", "Refund?"),
    ("Wie kündigen?", "How to cancel?"),
])
def test_a_short_question_in_another_language_misses_english(stored: str, asked: str) -> None:
    """The model answers in the question's language (guard._language)."""
    assert not guard_ok(asked, stored)
    assert not guard_ok(stored, asked)
