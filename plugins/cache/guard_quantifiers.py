"""The guard's check on how much of a thing a question asks about: all of it or some.

"Delete all my saved cards" / "Delete one saved card", "Does every order ship free?" /
"Do some orders ship free?": one word apart, often with the frame reworded round it (a
plural for a singular), and an embedding scores them alike. Where both questions carry
a quantifier, they must carry the same kind: all ("all", "every", "each", "the whole")
or some ("some", "any", "one of", "a few", "several", "part of", "half"). A quantifier
on one side only is how paraphrases read ("Are there any fees?" / "Are there fees?"),
but for all of a thing against one of it (`all_against_one`: "all flights" / "this
flight"); "none" is a negation (guard._NEGATION).
"""

from __future__ import annotations

import re

_KIND = {**dict.fromkeys(("all", "every", "each", "entire", "whole", "everything",
                          "everyone", "everybody"), "all"),
         **dict.fromkeys(("some", "any", "several", "few", "certain", "one", "couple",
                          "anything", "someone", "something", "part", "partial",
                          "partially", "half"), "some")}
# "one" as a quantity ("one saved card", "one of my orders"), not "which one", "no one",
# "the one", "one another", nor an idiom's "in one place", "at one time".
_QUANTIFIER = re.compile(
    r"\b(?:all|every|each|entire|whole|everything|everyone|everybody|some|any|several|few|"
    # ("part of every plan" is inclusion, no part of a thing)
    r"certain|couple|anything|someone|something|"
    r"part(?=\s+of\b(?!\s+(?:every|all|each|any)\b))|partial(?:ly)?|half|"
    r"(?<!which )(?<!no )(?<!the )(?<!this )(?<!that )(?<!any )(?<!every )(?<!each )"
    r"(?<!than )(?<!some )(?<!in )(?<!at )one(?!\s+(?:another|more)\b)(?=\s+[a-z]))\b")

#: `_QUANTIFIER`'s words, each whole: a question holding none of them carries no
#: quantifier (guard.signature looks no further).
QUANTIFIER_WORDS = frozenset(_KIND)


def quantifiers(lowered: str) -> frozenset[str]:
    """The kinds of quantifier a question carries: "all", "some"."""
    return frozenset(_KIND[m.group(0)] for m in _QUANTIFIER.finditer(lowered))


def quantifiers_differ(a: frozenset[str], b: frozenset[str]) -> bool:
    """Both carry a quantifier, and not of the same kinds."""
    return bool(a and b and a != b)


#: The quantifiers of all a thing (`all_against_one`); "each" reads as "a" ("a fee for
#: each transfer" / "a fee for a transfer").
_ALL = frozenset(("all", "every", "whole", "entire"))
#: Words that name one thing.
_ONE = frozenset(("a", "an", "this", "that", "one", "single"))
_BETWEEN = frozenset(("of", "my", "the", "your", "our", "their", "these", "those"))


def all_against_one(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """One side asks about all of a thing and the other, with no quantifier of all,
    about one of it ("Are all flights refundable?" / "Is this flight refundable?", "How
    do I delete all Docker containers?" / "How do I delete a Docker container?"): the
    quantifier check sees a quantifier on one side only. Words are compared without a
    plural's "s"."""
    return any(_all_of(x, y) for x, y in ((a, b), (b, a)))


def _all_of(x: tuple[str, ...], y: tuple[str, ...]) -> bool:
    if _ALL.isdisjoint(x) or not _ALL.isdisjoint(y) or _ONE.isdisjoint(y):
        return False
    things: set[str] = set()
    for i, t in enumerate(x):
        if t in _ALL:
            k = i + 1
            while k < len(x) and x[k] in _BETWEEN:
                k += 1
            things.update(_bare(w) for w in x[k:k + 2])
    return any(t in _ONE and not things.isdisjoint(_bare(w) for w in y[i + 1:i + 3])
               for i, t in enumerate(y))


def _bare(word: str) -> str:
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith(
        ("ss", "us", "is")) else word
