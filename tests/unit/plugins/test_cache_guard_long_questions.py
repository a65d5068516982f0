"""The guard's word diff stays bounded on long questions: difflib's matcher costs a text
of repeated words about the cube of its length, on the request's path."""

from __future__ import annotations

import pytest

from plugins.cache.guard import _edited, guard_ok


@pytest.mark.timeout(30)  # a guard against a hang, far above the milliseconds it takes
@pytest.mark.parametrize(("stored", "asked"), [
    ("is i " * 1000, "am i " * 1000),
    ("i " * 2000, "i x " * 1000),
    ("a b c " * 700, "c b a " * 700),
])
def test_repeated_words_do_not_hold_the_lookup(stored: str, asked: str) -> None:
    """"is i" 800 times against "am i" 800 times took 28 s."""
    assert not guard_ok(asked, stored)


def test_a_long_question_passes_only_as_itself() -> None:
    words = tuple(f"w{i}" for i in range(60))
    assert not _edited(words, words)
    assert _edited(words, (*words[:30], "please", *words[30:]))


def _words(n: int, end: str) -> list[str]:
    letters = "bcdfghjklmnpqrstvwxz"
    return [letters[i % 20] + letters[i // 20 % 20] + letters[i // 400 % 20] + "ab" + end
            for i in range(n)]


@pytest.mark.timeout(30)  # a guard against a hang, far above the milliseconds it takes
def test_words_of_another_language_in_other_forms_are_compared_in_bounded_time() -> None:
    """Each word only one side has was compared with every word of the other: 450
    Spanish words each in another form took 1.2 s, 5,000 of them a minute."""
    stored = "¿Cómo puedo " + " ".join(w + " de la" for w in _words(5000, "ar")) + "?"
    asked = "¿Cómo puedo " + " ".join(w + " de la" for w in _words(5000, "o")[::-1]) + "?"
    assert not guard_ok(asked, stored)
