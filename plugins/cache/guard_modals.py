"""The guard's check on what a yes/no question asks of the asker: may I, must I, should I.

"Can I opt out of the survey?" / "Do I have to opt out of the survey?", "Am I allowed to
park here?" / "Am I required to park here?", "Is it possible to ..." / "Is it mandatory
to ...": the same thing asked as a permission, an obligation or an advice, the modal
often a phrase of several words (the one-slot check sees one word swapped for one:
"Can I" / "Should I"), and an embedding scores them alike. Where both questions open a
clause with a modal, it must be of the same kind: "can" (can, could, may, allowed,
permitted, possible, able), "must" (must, have to, need to, required, mandatory,
necessary; "Would I need ...?", and "I need to ...?" said as a statement) or "should"
(should, ought to, advisable, recommended, worth: "Is it mandatory to have travel
insurance?" / "Is it worth having travel insurance?"). "Can you ...?" asks a favour,
and a modal after "how" or "where" asks for a way or a place ("How can I pay?" / "How do
I pay?"): neither counts.
"""

from __future__ import annotations

import re

_WHO = r"(?:i|we|one|you|he|she|they|my\s+\w+|the\s+\w+)"
_CAN_WHO = r"(?:i|we|one|he|she|they|my\s+\w+|the\s+\w+)"  # "can you" asks a favour
_KINDS = (
    ("must", rf"must\s+{_WHO}|(?:do|does|did|would|will)\s+{_WHO}\s+(?:really\s+)?"
             rf"(?:have\s+to|has\s+to|need|needs)\b|(?:i|we)\s+(?:really\s+)?(?:must\b|"
             rf"(?:need|have)\s+to\b)|(?:have|has)\s+{_WHO}\s+(?:got\s+)?to|(?:am|are|is)\s+(?:i|we|you|"
             rf"one|it|there)\s+(?:\w+\s+)?(?:required|obliged|obligated|supposed|"
             rf"mandatory|compulsory|obligatory|necessary|a\s+requirement)\b"),
    ("can", rf"(?:can|could|may|might)\s+{_CAN_WHO}\b|(?:am|are|is)\s+(?:i|we|one|it)\s+"
            r"(?:\w+\s+)?(?:allowed|permitted|able|possible|ok|okay|fine|legal)\b"),
    ("should", rf"(?:should|shall|ought)\s+{_WHO}\b|(?:is|would)\s+it\s+(?:be\s+)?"
               r"(?:\w+\s+)?(?:advisable|recommended|better|wise|a\s+good\s+idea|worth|"
               r"worthwhile)\b|"
               r"(?:do|would)\s+you\s+(?:recommend|advise|suggest)\b"),
)
# A modal that opens the question or a clause of it, after a question word other than
# "how" and "where" (a way, a place) or a word that only leads in. Each run from a
# clause's start is bounded and never backtracks (possessive: no lead-in word opens a
# modal), so a text of punctuation or lead-ins costs its length, not its square.
_MODAL = re.compile(
    r"(?:^|[,.;:!?])\W{0,8}+(?:(?:so|and|but|also|then|hi|hello|hey|please|ok|okay|what|"
    r"when|which|who|whom|why)\W{1,8}+){0,4}+(?:"
    + "|".join(f"(?P<{k}>{p})" for k, p in _KINDS) + ")")


def modals(lowered: str) -> tuple[str, ...]:
    """The kinds of the modals that open the question's clauses, in order."""
    return tuple(m.lastgroup or "" for m in _MODAL.finditer(lowered))


def modals_differ(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """Both open a clause with a modal, and not of the same kinds in the same order."""
    return bool(a and b and a != b)
