"""The guard's check on which end of a move a place or a party is: where a thing goes,
or where it comes from.

"How do I deposit money into my PayPal account?" / "How do I get money from my PayPal
account?", "How do I collect payment from a customer?" / "How do I make a payment to a
customer?", "add money to my balance" / "take money out of my balance": the same place
or party, the target of the move on one side ("to", "into", "onto") and its source on
the other ("from", "out of", "off"), each verb one a direction family does not oppose
(deposit / get, collect / make), and an embedding scores them alike (0.85-0.87). Where a
word of a noun phrase after one of these (after a determiner: "my", "a", "the",
"another") is the target on one side and the source on the other, and neither side
holds it as both ("from my savings account to my checking account"), the two ask two
things. "in" and "on" say a place more often than a target ("the photos on my phone",
"the transactions in my account"): they oppose "out of" and "off" only ("put money in
my account" / "take money out of my account", "on my card" / "off my card").
"""

from __future__ import annotations

import re

# A preposition that says an end of a move, a determiner, then (not consumed, so the
# next preposition is read too: "from my account to my son's") up to three words; each
# part bounded, no part backtracking into another: a text costs its length.
_END = re.compile(
    r"\b(into|onto|to|from|out\s++of|off(?:\s++of)?|in|on)\s++"
    r"(?:a|an|the|my|our|your|their|his|her|its|this|that|these|those|another|other|"
    r"some|any|each|every)\s++"
    r"(?=([a-z0-9'-]++)(?:\s++([a-z0-9'-]++))?(?:\s++([a-z0-9'-]++))?)")
_ROLE = {"into": "to", "onto": "to", "to": "to", "from": "from", "in": "in", "on": "on"}
#: Each role and the roles it opposes.
_OPPOSED = frozenset({("to", "from"), ("to", "out"), ("to", "off"), ("in", "out"),
                      ("on", "off")})
#: Words before "to" / "from" where they say no move ("due to the", "next to my", "apart
#: from the", "up to the", "similar to my").
_NO_MOVE = frozenset("due according next close closer similar compared thanks prior "
                     "relative up apart aside different far back".split())
_LAST_WORD = re.compile(r"([a-z]+)\W*$")
#: Words that end the noun phrase (what follows it) or say nothing of the place.
_PHRASE_END = frozenset(
    "a an the my our your their his her its this that these those another other some any "
    "each every to into onto from of off out in on at by for with and or but if when "
    "while so as is are was were be been am do does did can could will would should "
    "must may might how what why where who whom which whose i you we they he she it me "
    "us them please now today again instead first still already yet too also then "
    "there here".split())


def ends(lowered: str) -> tuple[tuple[str, str], ...]:
    """(word, role) for each word of a noun phrase a move goes to or comes from, role
    "to", "from", "out", "off", "in" or "on"."""
    out = []
    for m in _END.finditer(lowered):
        prep = m.group(1)
        role = _ROLE.get(prep) or ("out" if prep.startswith("out") else "off")
        if role in ("to", "from"):
            before = _LAST_WORD.search(lowered, max(0, m.start() - 16), m.start())
            if before is not None and before.group(1) in _NO_MOVE:
                continue
        for word in m.group(2, 3, 4):
            if word is None or word in _PHRASE_END:
                break
            out.append((word, role))
    return tuple(out)


def ends_differ(a: tuple[tuple[str, str], ...], b: tuple[tuple[str, str], ...]) -> bool:
    """A word is the target of a move on one side and its source on the other (or "in"
    / "out of", "on" / "off"), neither side holding it in the other's role too."""
    if not a or not b:
        return False
    ra: dict[str, set[str]] = {}
    rb: dict[str, set[str]] = {}
    for roles, pairs in ((ra, a), (rb, b)):
        for word, role in pairs:
            roles.setdefault(word, set()).add(role)
    for word in ra.keys() & rb.keys():
        x, y = ra[word], rb[word]
        if any(((p, q) in _OPPOSED or (q, p) in _OPPOSED) and p not in y and q not in x
               for p in x for q in y):
            return True
    return False
