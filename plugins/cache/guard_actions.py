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

import re
from collections import Counter

_CLASSES = (
    ("cancel", "terminate", "end", "stop", "void"),
    ("close", "delete", "remove", "erase", "deactivate", "disable"),
    ("open", "create", "set", "setup", "add"),
    # putting money on a card or an account ("top up", "add money": `merged`)
    ("topup", "top-up", "load", "reload", "recharge", "fund"),
    # a code, a card's value or points taken into an account or an order ("Where do I
    # enter a gift card?"; "use" is filler, compared by `guard._narrowed` only: "How do
    # I redeem my points?" / "How can I use my reward points?")
    ("redeem", "enter", "input", "use"),
    ("pause", "suspend", "freeze", "hold"),
    ("renew", "extend", "resume", "reactivate"),
    ("change", "update", "edit", "modify", "amend", "alter", "switch", "reschedule"),
    ("reset", "recover", "restore", "retrieve"),
    ("restart", "reboot"),
    # asking for a thing owed, and buying one ("How do I claim on my travel insurance?" /
    # "How do I buy travel insurance?"); as nouns ("my refund request", "a purchase") they
    # are things (`nouns`)
    ("request", "claim"),
    ("buy", "purchase"),
    # switching a thing on ("turn on" reads as "enable": guard._PHRASES); its opposite is
    # guard._FAMILIES' ("How do I activate my new card?" / "How do I know if my new card
    # is activated?"); switching it off ("disable", "turn off") is closing it, above
    ("enable", "activate"),
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
    ("transfer", "move", "port"),
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
    # a branch's history joined to another's two ways ("How do I rebase my branch onto
    # main?" / "How do I merge my branch into main?": other histories, other answers)
    ("rebase",),
    ("merge",),
)
_IRREGULAR = {"sent": "send", "paid": "pay", "saw": "see", "seen": "see", "found": "find",
              "wrote": "write", "written": "write", "spoke": "speak", "spoken": "speak",
              "held": "hold", "froze": "freeze", "frozen": "freeze", "moved": "move"}


def _suffixed(verb: str) -> list[tuple[str, str]]:
    """`verb`'s regular forms, each with the ending it reads as ("activated": "ed"), so
    two verbs' forms compare form by form ("enabled" / "activated", not "enable" /
    "activated"). A short verb ending consonant, vowel, consonant doubles its last
    letter ("shipped"); one ending in "ch", "sh", "s", "x" takes "es" ("dispatches")."""
    stem = verb[:-1] if verb.endswith("e") else verb
    if re.fullmatch(r"[^aeiou]*[aeiou][bdgmnpt]", verb):
        stem = verb + verb[-1]
    s = "es" if verb.endswith(("ch", "sh", "s", "x")) else "s"
    return [(verb, ""), (verb + s, "s"), (stem + "ed", "ed"), (stem + "ing", "ing")]


def _forms(verb: str) -> set[str]:
    stem = verb[:-1] if verb.endswith("e") else verb
    out = {verb, verb + "s", verb + "es", stem + "ed", stem + "ing", verb + verb[-1] + "ed",
           verb + verb[-1] + "ing"}
    if verb.endswith("y"):
        out |= {verb[:-1] + "ied", verb[:-1] + "ies"}
    return out


ACTION = {form: cls[0] for cls in _CLASSES for verb in cls for form in _forms(verb)}
ACTION.update({w: ACTION[v] for w, v in _IRREGULAR.items()})

#: Verbs that say one act, whatever the thing: a one-word swap of them is a synonym,
#: not a slot changed (guard._slot: "How do I activate roaming?" / "How do I turn on
#: roaming?", "turn on" read as "enable"). Kept small on purpose: the classes above
#: are broader ("close" / "delete" an account, "find" / "track" an order are two
#: questions to the one-slot check).
_SYNONYMS = (
    ("enable", "activate"),
    ("disable", "deactivate"),
    ("book", "reserve"),
    ("buy", "purchase"),
    ("restart", "reboot"),
    ("ship", "dispatch"),
    # ("log in", "sign in", "log on" are "login": guard._PHRASES)
    ("login", "logon", "signin"),
    ("logout", "logoff", "signout"),
)
SAME_ACT = {form: cls[0] + suffix for cls in _SYNONYMS for verb in cls
            for form, suffix in _suffixed(verb)}
# Nouns that only frame what is asked ("What's the way to close ...", "the steps to ..."):
# no part of the thing acted on.
# (nor "the status of" a thing: checking it is checking the thing, "check the status of
# my claim" / "file a claim"; nor "a copy of" it: "request a copy of my certificate" /
# "check my certificate request")
_FRAME = frozenset("s re way ways process steps step procedure status copy copies".split())
# A verb's particle after it ("roll back"; "up", "out" are filler already).
_PARTICLES = frozenset(("back", "down", "off", "over"))
#: Where an action puts its thing ("rebase onto main", "merge into main"): the verb's,
#: as its particle is; left out where the actions are compared.
_PLACING = frozenset(("into", "onto"))


#: A verb and its money as one action ("add money to my gift card", "put funds on my
#: card", "top up my card": "topup"): the money is the action's, not the thing acted on.
_FUNDING_VERBS = frozenset(("add", "adds", "added", "adding", "put", "puts", "putting",
                            "load", "loads", "loaded", "loading"))
_MONEY = frozenset(("money", "funds", "fund", "cash", "credit"))


def merged(tokens: tuple[str, ...]) -> tuple[str, ...]:
    """`tokens` with a verb that puts money on a thing read as one action ("top up",
    "add money", "load cash": "topup"; `_FUNDING_VERBS`, `_MONEY`)."""
    if "up" not in tokens and _MONEY.isdisjoint(tokens):
        return tokens
    out: list[str] = []
    for t in tokens:
        if out and ((out[-1] == "top" and t == "up")
                    or (out[-1] in _FUNDING_VERBS and t in _MONEY)):
            out[-1] = "topup"
        else:
            out.append(t)
    return tuple(out)


#: Words that ask whether a thing is so when an "if" / "whether" follows them ("check
#: if I am registered", "know whether my claim was approved"), and the small words of the
#: clause checked ("am", "was", "been"): `checked`.
_CHECKING = frozenset(w for v in ("check", "see", "know", "tell", "find", "verify",
                                  "confirm") for w in (v, v + "s", v + "ing"))
_WHETHER = frozenset(("if", "whether"))
_STATE = frozenset("am m is s are re was were been be being has have ve had already "
                   "got gotten on off".split())


def checked(tokens: tuple[str, ...]) -> tuple[str, ...]:
    """`tokens` with a check of whether a thing was done read as "check" and the thing
    checked: the clause's actions and its small words left out ("How do I check if I am
    registered to vote?" as "how do i check to vote"), so they are the state asked
    about, not an action the other side shares ("How do I register to vote?"). (A check
    of a thing's state is that state asked ("Is my subscription cancelled?" / "How do I
    check if my subscription is cancelled?"): guard_roles.doer and guard_roles.state.)"""
    if _WHETHER.isdisjoint(tokens):
        return tokens
    for i in range(1, len(tokens)):
        if tokens[i] in _WHETHER and tokens[i - 1] in _CHECKING:
            rest = [t for t in tokens[i + 1:] if t not in _STATE and t not in ACTION]
            return (*tokens[:i - 1], "check", *rest)
    return tokens


_DETERMINERS = frozenset("a an the my your our his her their its this that".split())
#: A noun's mark: an action's word used as a noun (`nouns`).
NOUN = "n-"


def nouns(tokens: tuple[str, ...]) -> tuple[str, ...]:
    """`tokens` with an action's word that is a noun marked (`NOUN`): after a determiner,
    or after one and up to two words that are no actions ("my refund request", "the
    disputed charge", "my SIM card order", "my booking"); "How do I order ..." and "to
    claim" are verbs."""
    if _DETERMINERS.isdisjoint(tokens):
        return tokens
    out = list(tokens)
    for i, t in enumerate(tokens):
        if t not in ACTION:
            continue
        for j in range(i - 1, max(-1, i - 4), -1):
            if tokens[j] in _DETERMINERS:
                out[i] = NOUN + t
                break
            if tokens[j] in ACTION or not tokens[j].isalpha() or tokens[j] in _NOT_NOUN:
                break
    return tuple(out)


#: Words a noun phrase does not run back over ("to", the asker: "I want to claim",
#: "can I order").
_NOT_NOUN = frozenset("to i we you he she they it do does did can could will would should "
                      "must may how what when where why who which".split())


def _named(word: str) -> str:
    """A noun-marked action's word, as its action class ("n-request": "request")."""
    return ACTION.get(word[len(NOUN):], "") if word.startswith(NOUN) else ""


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
    # a thing named by the other side's action ("my refund request" / "request a
    # refund") is that action's
    rest_a = [w for w in rest_a if _named(w) not in kb]
    rest_b = [w for w in rest_b if _named(w) not in ka]
    if "topup" in ka | kb:  # the money is the action's ("add credit" / "check my credit")
        rest_a = [w for w in rest_a if w not in _MONEY]
        rest_b = [w for w in rest_b if w not in _MONEY]
    # (in any order: the thing reworded round its nouns is the same thing, "a claim for
    # water damage" / "my water damage claim")
    if not rest_a or not rest_b:
        return False
    if sorted(rest_a) == sorted(rest_b):
        return True
    return _acts_on_more(a, b, rest_a, rest_b, kb - ka) or _acts_on_more(
        b, a, rest_b, rest_a, ka - kb)


#: Words that qualify no thing ("set a new PIN" / "change my PIN"; guard._UNNARROWING).
_UNQUALIFYING = frozenset(("new", "current", "existing"))


def _acts_on_more(a: list[str], b: list[str], rest_a: list[str], rest_b: list[str],
                  only_b: set[str]) -> bool:
    """`b` says all `a` says and more, and what it adds is the thing its own action acts
    on, right after the verb ("How do I activate my new SIM?" / "How do I port my
    number to a new SIM?": the number is ported, the SIM only where it goes). Not an
    added word elsewhere ("reschedule my appointment" / "move my appointment to another
    day": the same thing moved)."""
    extra = Counter(w for w in rest_b if w not in _UNQUALIFYING)
    extra.subtract(w for w in rest_a if w not in _UNQUALIFYING)
    if any(n < 0 for n in extra.values()) or not +extra:
        return False
    for i, w in enumerate(b[:-1]):
        if w in ACTION and ACTION[w] in only_b:
            after = b[i + 1]
            return after not in ACTION and extra[after] > 0 and after not in rest_a
    return False


def _without_actions(words: list[str]) -> list[str]:
    """The words without their actions, an action's particle ("roll back", "pay back":
    part of the verb) or its "into" / "onto" (`_PLACING`) and the frame."""
    return [w for i, w in enumerate(words) if w not in ACTION and w not in _FRAME
            and w not in _PLACING and not (w in _PARTICLES and i > 0 and words[i - 1] in ACTION)]
