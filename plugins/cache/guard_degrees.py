"""The guard's check on which extreme or comparison a question asks for.

"Which plan is the cheapest?" and "Which plan offers the best value?" ask for different
plans, and an embedding scores them as one question; so do "the fastest courier" / "the
most reliable courier" and "Is it cheaper than ..." / "Is it faster than ...". Where
both questions ask for a superlative or a comparison, they must ask for the same one
(synonyms read alike: "cheapest", "least expensive", "most affordable"). A one-sided
"most" / "least" conflict is the direction families' own (guard._FAMILIES).
"""

from __future__ import annotations

import re

_DEGREE = re.compile(
    r"\b(?:(?:most|least)\s+[a-z]+(?:-[a-z]+)?|(?:more|less)\s+[a-z]+\s+than|[a-z]+er\s+than|"
    r"[a-z]{2,}est|best|worst|"
    # an equal degree ("Is the basic plan as fast as the premium plan?" / "... faster
    # than ..."), not an idiom ("as soon as", "as well as", "as long as")
    r"as\s++(?!(?:soon|well|long|far|much|many|follows|such|usual|is|a|an|the)\b)"
    r"[a-z]++\s++as)\b")
# Words ending in "est" that are no superlative.
_NOT_DEGREE = frozenset(
    "interest request test guest rest suggest honest forest contest protest invest digest "
    "harvest manifest modest west nest chest quest arrest pest vest priest conquest attest "
    "detest midwest earnest behest bequest unrest crest zest jest lest pretest retest "
    "inquest southwest northwest everest budapest bucharest".split()) | frozenset(
    ("other than", "rather than"))
SAME = {
    **dict.fromkeys(("cheapest", "least expensive", "lowest-priced", "most affordable",
                     "least costly"), "cheapest"),
    **dict.fromkeys(("priciest", "most expensive", "costliest", "most costly",
                     "highest-priced"), "priciest"),
    **dict.fromkeys(("fastest", "quickest", "speediest"), "fastest"),
    **dict.fromkeys(("newest", "latest", "most recent"), "newest"),
    **dict.fromkeys(("largest", "biggest"), "largest"),
    **dict.fromkeys(("smallest", "tiniest"), "smallest"),
    **dict.fromkeys(("nearest", "closest"), "nearest"),
    **dict.fromkeys(("cheaper than", "less expensive than", "more affordable than",
                     "less costly than"), "cheaper than"),
    **dict.fromkeys(("pricier than", "more expensive than", "costlier than",
                     "more costly than"), "pricier than"),
    **dict.fromkeys(("faster than", "quicker than"), "faster than"),
    **dict.fromkeys(("as fast as", "as quick as"), "as fast as"),
    **dict.fromkeys(("as cheap as", "as affordable as"), "as cheap as"),
    **dict.fromkeys(("bigger than", "larger than"), "larger than"),
}


def degrees(lowered: str) -> frozenset[str]:
    """The superlatives and comparisons asked for, synonyms as one."""
    if "est" not in lowered and "than" not in lowered and "most" not in lowered and (
            "least" not in lowered) and "as " not in lowered:
        return frozenset()
    out = set()
    for m in _DEGREE.finditer(lowered):
        d = re.sub(r"\s+", " ", m.group(0))
        if d not in _NOT_DEGREE:
            out.add(SAME.get(d, d))
    return frozenset(out)


def degrees_differ(a: frozenset[str], b: frozenset[str]) -> bool:
    """Both ask for an extreme or a comparison, and not the same."""
    return bool(a and b and a != b)
