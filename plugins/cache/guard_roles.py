"""The guard's checks on whose thing a question asks about, and which extreme.

- Owners: the possessors a question names, in order: "my" / "your" and a third party
  ("a user's account", "my boss's chats", "their screen", "whose profile"). Where either
  question names a third party, the two must name the same owners in the same order:
  "How do I delete my account?" / "How do I delete a user's account?", "Can my boss read
  my chats?" / "Can I read my boss's chats?", "from my account to my son's" / "from my
  son's account to mine". Only "my" against "your" (`guard._roles_swapped`, one slot) is
  left to the other checks: a paraphrase often adds a "my" or a "your" ("Can I keep my
  number if I switch to you?" / "Can I transfer my number to your network?").
- Doers: who a question asks does the thing, where it opens with an auxiliary and its
  subject ("How do I delete my account?" / "How does an admin delete a user account?",
  "Can I cancel the order?" / "Can the seller cancel the order?"): the asker (i, we,
  one) on one side and a third party (a noun after an article or a possessive,
  someone, they, he, she) on the other ask two things. "you" is neither: it is often
  the business asked ("Do you ship to Canada?" / "Does the store ship to Canada?").
- Degrees: the superlatives and comparatives a question asks for ("cheapest" /
  "best value", "the fastest" / "the quickest" read alike): where both ask for one,
  they must ask for the same (a one-sided "most" / "least" conflict is the direction
  families' own).
"""

from __future__ import annotations

import re

from .guard_actions import ACTION

_FIRST = frozenset(("my", "mine", "our", "ours"))
_SECOND = frozenset(("your", "yours"))
_THIRD = frozenset(("his", "her", "their", "theirs", "whose"))
# "'s" after these is "is" or "has" ("what's", "it's", "there's"), not an owner.
_NOT_OWNER = frozenset(
    "what where who how that there here it he she let when why which this one "
    "everything nothing something today tomorrow yesterday".split())
# A noun's "'s" before these is "is" or "has" ("my order's been shipped", "the app's not
# working"): not an owner.
_NOT_OWNED = frozenset(
    "been not got gone going a an the still already just never no very too so in on at "
    "here there now over done being it".split())
_OWNER = re.compile(r"\b(?:(my|mine|our|ours|your|yours|his|her|their|theirs|whose)\b|"
                    r"([a-z]+)(?:'s|s')(?![a-z])(?=\W*([a-z]*)))")


def owners(lowered: str) -> tuple[str, ...]:
    """The possessors in order: "1" (my, our), "2" (your), "3" (his, her, their), "whose",
    or a noun ("admin's" and "admins'" are "admin")."""
    text = lowered.replace("\u2019", "'")
    if "'" not in text and not any(w in text for w in ("my", "our", "your", "his", "her",
                                                       "their", "whose")):
        return ()
    out = []
    for m in _OWNER.finditer(text):
        word, noun, after = m.group(1), m.group(2), m.group(3)
        if word is not None:
            out.append("1" if word in _FIRST else "2" if word in _SECOND
                       else "whose" if word == "whose" else "3")
        elif noun not in _NOT_OWNER and after not in _NOT_OWNED:
            out.append(noun)
    return tuple(out)


# The auxiliary a question opens with (after a question word, and one more word: "How
# often do I ...") and its subject, or a "be" and its subject before what it may do
# ("Am I allowed to ...?" / "Is the landlord allowed to ...?"; not "Is a referral
# required ...?", a thing asked for); anchored, each part bounded: a text costs its length.
_SUBJECT = (r"(i|we|one|someone|somebody|anyone|anybody|they|he|she|"
            r"(?:a|an|the|my|our|your|their|his|her)\s++[a-z]+)\b")
_DOER = re.compile(
    r"^\W{0,8}+(?:(?:how|what|when|where|why|which|who|whom)\W{1,8}+(?:[a-z]+\W{1,8}+)?)?"
    r"(?:(?:do|does|did|can|could|should|would|will|may|might|must|shall)\s++" + _SUBJECT
    + r"|(?:am|is|are|was|were)\s++" + _SUBJECT
    + r"\s++(?:allowed|able|permitted|entitled|eligible)\s++to\b)")
_ASKER = frozenset(("i", "we", "one"))
#: Participles that end in no "-ed" or "-en" ("got paid", "is my card sold?").
_IRREGULAR = "paid|sent|lost|stuck|reset|set|shut|cut|hit|sold|bought|kept|left|held|told|made"
IRREGULAR_PARTICIPLES = _IRREGULAR  # (guard._bare_state)
#: A question whether a thing of one's is in a state another's act left it in ("Is my
#: data shared?", "Was my card charged?", "Is my order being shipped?"): its subject a
#: thing, then a participle. Not one saying what is asked of or allowed the asker ("Is
#: a referral required?": "Do I need a referral?").
_NOT_STATE = (r"(?!(?:required|needed|allowed|permitted|expected|supposed|included|"
              r"accepted|covered|recommended|advised|entitled|qualified|obliged|mandated)\b)")
_PARTICIPLE = r"(?P<state>[a-z]+ed|[a-z]{3,}en|" + _IRREGULAR + r"|read|seen|known|shown|done)\b"
_STATE = re.compile(
    r"^\W{0,8}+(?:(?:how|what|when|where|why|which)\W{1,8}+)?(?:(?:am|is|are|was|were)\s++"
    r"(?:a|an|the|my|our|your|their|his|her)\s++[a-z]++\s++|(?:has|have)\s++(?:a|an|the|"
    r"my|our|your|their|his|her)\s++[a-z]++\s++(?:not\s++)?been\s++)(?:(?:being|already|"
    r"still|now|not)\s++)?" + _NOT_STATE + _PARTICIPLE)
#: A check whether a thing of one's is in such a state ("How do I check if my
#: subscription is cancelled?", "Can you tell me whether my parcel was delivered?"): the
#: state asked, as `_STATE`'s (the asker checks, but does not do the act: "How do I
#: cancel my subscription?" asks another thing). Its subject a thing of one or two words.
_CHECKED_STATE = re.compile(
    r"\b(?:check|checking|see|know|tell(?:\s++me)?|find\s++out|verify|confirm)\s++"
    r"(?:if|whether)\s++(?:a|an|the|my|our|your|their|his|her)\s++[a-z]++"
    r"(?:\s++(?!(?:is|are|was|were|has|have)\b)[a-z]++)?\s++"
    r"(?:is|are|was|were|has\s++been|have\s++been)\s++(?:(?:being|already|still|now)\s++)?"
    + _NOT_STATE + _PARTICIPLE)


def doer(lowered: str) -> str:
    """"self" where the asker does the thing, "other" where a third party does, "" where
    no auxiliary and subject open the question or its subject is "you"; where the
    subject undergoes the thing ("Can my order be cancelled?"), the doer the "by" after
    it names, or "passive-" and the subject's where no "by" names one ("Can my order be
    cancelled?": "passive-other"; guard._voice_only compares the words); "state" where
    it asks whether a thing is in the state an act left it in ("Is my data shared?"), or
    where the asker (or "you") checks that ("How do I check if my data is shared?")."""
    m = _DOER.match(lowered)
    if (m is None or _kind(m.group(1) or m.group(2)) == "self") and state(lowered):
        return "state"  # (asking a thing's state, or checking it: one question)
    if m is None:
        return ""
    subject = m.group(1) or m.group(2)
    if m.group(1):
        passive = _PASSIVE.match(lowered, m.end())
        if passive is not None:
            return _kind(passive.group(1)) if passive.group(1) else "passive-" + _kind(
                subject)
    return _kind(subject)


def state(lowered: str) -> str:
    """The participle a question asks a thing of one's is in ("cancelled": "Is my
    subscription cancelled?", "How do I check if my subscription is cancelled?"), or ""."""
    m = _STATE.match(lowered)
    if m is None and ("if" in lowered or "whether" in lowered):
        m = _CHECKED_STATE.search(lowered)
    return "" if m is None else m.group("state")


def _kind(subject: str) -> str:
    return "self" if subject in _ASKER else "other"


# A "be" or a "get" and what the subject undergoes ("be cancelled", "is frozen", "got
# locked"), and who does it ("by the seller"); each part bounded.
# After a "get", only a participle ("get cancelled", "got paid"; not "get a refund").
_PASSIVE = re.compile(r"\s++(?:not\s++)?(?:(?:be|been|being|is|are|was|were|am)\s++"
                      r"(?:[a-z]+ly\s++)?[a-z'-]++|(?:get|gets|got|gotten|getting)\s++"
                      r"(?:[a-z]+ly\s++)?(?:[a-z]+(?:ed|en)|" + _IRREGULAR + r")\b)(?:\s++by\s++"
                      + _SUBJECT + r")?")
#: A clause that says who does a thing, the question's condition or its time ("What
#: happens if my bank freezes my account?", "... after I close my account?"): its
#: opening word, its subject, then an auxiliary (and "not") and the word after it.
#: "you" too: the other party where the asker is named (`agents`); and a noun of two
#: words where a verb's "-s" or "-ed" follows ("if my direct debit fails"; not "if my
#: account is ...", "if my bank freezes ...").
_CLAUSE_SUBJECT = _SUBJECT.replace("(i|", "(i|you|", 1).replace(
    r"\s++[a-z]+)", r"\s++[a-z]+(?:\s++(?!(?:is|are|was|were|be|been|has|have|had|do|does|"
    r"did|can|could|will|would|should|may|might|must|gets?|got)\b)[a-z]++"
    r"(?=\s++[a-z]+(?:s|ed)\b))?)", 1)
_CLAUSE = re.compile(r"\b(?:if|when|whenever|once|unless|after|before|until|because|"
                     r"while)\s++" + _CLAUSE_SUBJECT + r"(?=\s++(?:(do|does|did|can|could|will|"
                     r"would|should|may|might|must|has|have|had)(?:n't)?\s++(?:not\s++)?)?"
                     r"([a-z'-]++))")
_TO_BE = frozenset("be been being is are was were am get gets got gotten getting".split())
#: The asker named as such: then "you" in a clause is the other party ("Will I be
#: charged if you cancel?" / "... if I cancel?"); without it, "you" is anyone.
_ASKS = re.compile(r"\b(?:i|me|my|we|us|our)\b")
#: Subjects that do what follows them whatever the word is ("if I end", "once they
#: close"); after a noun, only a word that reads as a verb does ("if the landlord ends",
#: "before the trial ended"; not "before the renewal date").
_PRONOUNS = frozenset("i we one someone somebody anyone anybody they he she".split())


def agents(lowered: str) -> tuple[str, ...]:
    """Who does the thing in each clause of a condition or a time, in order: "self",
    "other", or "passive" where the subject undergoes it and no "by" names the doer ("if
    my account is frozen"; "if my flight is cancelled by the airline": "other")."""
    if not any(w in lowered for w in _CLAUSE_WORDS):
        return ()
    out = []
    for m in _CLAUSE.finditer(lowered):
        subject, aux, verb = m.group(1), m.group(2), m.group(3)
        if subject == "you" and not _ASKS.search(lowered):
            continue  # anyone ("What happens if you miss a payment?")
        passive = _PASSIVE.match(lowered, m.start(3) - 1) if verb in _TO_BE else None
        if passive is not None:
            out.append(_kind(passive.group(1)) if passive.group(1) else "passive")
        elif subject not in _PRONOUNS and subject != "you" and (
                _event(verb, lowered, m.end(3)) or subject.rsplit(" ", 1)[-1] in _EVENTS):
            # A thing's own event ("if my package doesn't arrive"): no doer; so where a
            # noun of two words was read through it ("if my order arrives damaged").
            continue
        elif aux or subject in _PRONOUNS or subject == "you" or _verb_like(verb):
            out.append(_kind(subject))
    return tuple(out)


#: What reaches or serves the asker of itself ("if my package doesn't arrive", "if my
#: password doesn't work"): the asker's own receiving or using on the other side ("if I
#: don't receive my package"), no third party doing it. A thing ending or failing of
#: itself ("if my card expires", "if my direct debit fails") is its doer, another than
#: the asker ending it ("if I cancel my card"): not one of these.
_EVENTS = frozenset(form for verb in ("arrive", "work", "load", "happen", "appear")
                    for form in (verb, verb + "s", verb.removesuffix("e") + "ed"))
_TO_NEXT = re.compile(r"\s++to\b")


def _event(verb: str, lowered: str, end: int) -> bool:
    return verb in _EVENTS and not _TO_NEXT.match(lowered, end)


_CLAUSE_WORDS = ("if ", "when", "once ", "unless ", "after ", "before ", "until ",
                 "because ", "while ")
#: `_CLAUSE`'s opening words, each whole: a question holding none of them has no clause
#: (guard.signature looks no further).
CLAUSE_WORDS = frozenset(("if", "when", "whenever", "once", "unless", "after", "before",
                          "until", "because", "while"))


def _verb_like(word: str) -> bool:
    """A word after a noun that reads as its verb: a third person's "-s", a past's "-ed",
    or an action (guard_actions)."""
    return (len(word) > 3 and word.endswith(("s", "ed")) and not word.endswith("ss")) or (
        word in ACTION)


def agents_differ(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """Both name who does the thing in their clauses, and not the same doers: the asker
    on one side, a third party on the other ("if I freeze my account" / "if my bank
    freezes my account"). A clause whose subject undergoes the thing names none."""
    a = tuple(x for x in a if x != "passive")
    b = tuple(x for x in b if x != "passive")
    return bool(a and b and a != b)


def owners_differ(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """A third party owns something on either side, and the owners differ."""
    return a != b and any(o not in ("1", "2") for o in a + b)


#: Parties on the two sides of one relation: a question about one asks another thing
#: than the same question about the other ("Is a tenant allowed to sublet?" / "Is a
#: landlord allowed to enter?", "Can the employee approve ...?" / "Can the manager ...?").
_PAIRS = (("tenant", "landlord"), ("employee", "employer"), ("employee", "manager"),
          ("buyer", "seller"), ("customer", "merchant"), ("patient", "doctor"),
          ("student", "teacher"), ("guest", "host"), ("passenger", "driver"),
          ("sender", "recipient"), ("borrower", "lender"), ("parent", "child"))
_PARTY = {form: party for pair in _PAIRS for party in pair
          for form in (party, party + "s")}
_PARTY["children"] = "child"


def parties(tokens: tuple[str, ...]) -> frozenset[str]:
    """The parties of a relation (`_PAIRS`) a question names, plurals as one."""
    return frozenset(_PARTY[t] for t in tokens if t in _PARTY)


def parties_differ(a: frozenset[str], b: frozenset[str]) -> bool:
    """One question names a party the other does not, and the other names its
    counterpart instead (not both: "Can a landlord evict a tenant?" names either)."""
    return any((x in a and y in b and y not in a and x not in b)
               or (y in a and x in b and x not in a and y not in b) for x, y in _PAIRS)
