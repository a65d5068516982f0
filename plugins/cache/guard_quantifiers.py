"""The guard's check on how much of a thing a question asks about: all of it or some.

"Delete all my saved cards" / "Delete one saved card", "Does every order ship free?" /
"Do some orders ship free?": one word apart, often with the frame reworded round it (a
plural for a singular), and an embedding scores them alike. Where both questions carry
a quantifier, they must carry the same kind: all ("all", "every", "each", "the whole")
or some ("some", "any", "one of", "a few", "several"). A quantifier on one side only is
how paraphrases read ("Are there any fees?" / "Are there fees?"); "none" is a negation
(guard._NEGATION).
"""

from __future__ import annotations

import re

_KIND = {**dict.fromkeys(("all", "every", "each", "entire", "whole", "everything",
                          "everyone", "everybody"), "all"),
         **dict.fromkeys(("some", "any", "several", "few", "certain", "one", "couple",
                          "anything", "someone", "something"), "some")}
# "one" as a quantity ("one saved card", "one of my orders"), not "which one", "no one",
# "the one", "one another", nor an idiom's "in one place", "at one time".
_QUANTIFIER = re.compile(
    r"\b(?:all|every|each|entire|whole|everything|everyone|everybody|some|any|several|few|"
    r"certain|couple|anything|someone|something|"
    r"(?<!which )(?<!no )(?<!the )(?<!this )(?<!that )(?<!any )(?<!every )(?<!each )"
    r"(?<!than )(?<!some )(?<!in )(?<!at )one(?!\s+(?:another|more)\b)(?=\s+[a-z]))\b")


def quantifiers(lowered: str) -> frozenset[str]:
    """The kinds of quantifier a question carries: "all", "some"."""
    return frozenset(_KIND[m.group(0)] for m in _QUANTIFIER.finditer(lowered))


def quantifiers_differ(a: frozenset[str], b: frozenset[str]) -> bool:
    """Both carry a quantifier, and not of the same kinds."""
    return bool(a and b and a != b)
