"""The guard's check on what a question asks to do with a thing: the action verb.

"How do I return a damaged item?" / "How can I exchange a damaged item?", "How do I reset
my password?" / "Change my password", "How do I open a savings account?" / "What's the
way to close a savings account?", "Where do I send my resignation letter?" / "How do I
write a resignation letter?": the same thing, another action, the frame reworded round
it (so the one-slot check does not see it), and an embedding scores them alike. Where
the two questions' words that say something are the same once their actions are left
out, and each names actions, the actions must share a class (synonyms: "cancel" /
"terminate", "book" / "schedule", "find" / "see" / "check"). An action on one side only
("How do I get my payslip?" / "Where can I see my payslip?") or one not listed is left
to the other checks; opposites of one family are guard._FAMILIES'. An action both
questions name is context, not what they ask ("My laptop is slow after the update, how
do I fix it?" / "..., how do I roll it back?"): only the action classes one side names
and the other does not are compared.
"""

from __future__ import annotations

_CLASSES = (
    ("cancel", "terminate", "end", "stop", "void"),
    ("close", "delete", "remove", "erase", "deactivate"),
    ("open", "create", "set", "setup"),
    ("pause", "suspend", "freeze", "hold"),
    ("renew", "extend", "resume", "reactivate"),
    ("change", "update", "edit", "modify", "amend", "alter", "switch", "reschedule"),
    ("reset", "recover", "restore", "retrieve"),
    ("restart", "reboot"),
    ("book", "schedule", "reserve", "arrange"),
    ("return",),
    ("exchange", "swap", "replace"),
    ("download", "export"),
    ("print",),
    ("find", "see", "view", "locate", "check", "access", "track", "look"),
    ("send", "submit", "file", "post"),
    ("write", "draft", "compose"),
    ("read",),
    ("pay", "settle"),
    ("transfer", "move"),
    ("share",),
    ("install",),
    ("apply", "enroll", "enrol", "register", "sign", "join"),
    ("contact", "reach", "call", "talk", "speak"),
    ("verify", "confirm"),
    ("approve", "authorize", "authorise", "accept"),
    ("reject", "decline", "deny", "refuse"),
    ("earn", "collect", "gain"),
    ("dispute",),
    ("fix", "repair", "troubleshoot", "solve", "resolve", "debug"),
    ("undo", "revert", "rollback", "roll"),
)
_IRREGULAR = {"sent": "send", "paid": "pay", "saw": "see", "seen": "see", "found": "find",
              "wrote": "write", "written": "write", "spoke": "speak", "spoken": "speak",
              "held": "hold", "froze": "freeze", "frozen": "freeze", "moved": "move"}


def _forms(verb: str) -> set[str]:
    stem = verb[:-1] if verb.endswith("e") else verb
    out = {verb, verb + "s", verb + "es", stem + "ed", stem + "ing", verb + verb[-1] + "ed",
           verb + verb[-1] + "ing"}
    if verb.endswith("y"):
        out |= {verb[:-1] + "ied", verb[:-1] + "ies"}
    return out


ACTION = {form: cls[0] for cls in _CLASSES for verb in cls for form in _forms(verb)}
ACTION.update({w: ACTION[v] for w, v in _IRREGULAR.items()})
# Nouns that only frame what is asked ("What's the way to close ...", "the steps to ..."):
# no part of the thing acted on.
_FRAME = frozenset("s re way ways process steps step procedure".split())
# A verb's particle after it ("roll back"; "up", "out" are filler already).
_PARTICLES = frozenset(("back", "down", "off", "over"))


def actions_differ(a: list[str], b: list[str]) -> bool:
    """`a`, `b`: the words that say something, in order. The same words once the actions
    and the frame are left out, and each side naming an action class the other does
    not."""
    ka = {ACTION[w] for w in a if w in ACTION}
    kb = {ACTION[w] for w in b if w in ACTION}
    if not ka - kb or not kb - ka:  # an action both name is context ("after the update")
        return False
    rest_a = _without_actions(a)
    rest_b = _without_actions(b)
    return bool(rest_a) and rest_a == rest_b


def _without_actions(words: list[str]) -> list[str]:
    """The words without their actions, an action's particle ("roll back", "pay back":
    part of the verb) and the frame."""
    return [w for i, w in enumerate(words) if w not in ACTION and w not in _FRAME
            and not (w in _PARTICLES and i > 0 and words[i - 1] in ACTION)]
