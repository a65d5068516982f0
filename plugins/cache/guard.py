"""The near-miss guard: refuse a semantic hit whose question differs in what matters.

Sentence embeddings score "cancel order 123" and "cancel order 456" as near-identical,
and "How do I reset my password? Answer like a pirate." as the plain question. The guard
compares cheap lexical signatures of the two questions and refuses the hit when:

- their numbers differ (in order), or the operators between them ("7 + 5" / "7 - 5"),
  or both count in words and count differently ("one extra user" / "two extra users");
- their negation counts differ (not, never, n't, "non-" ...);
- their capitalized names differ (in order): places, brands, languages, plans;
- they carry opposite directions of the same family (enable/disable, upgrade/downgrade,
  refund/charge, import/export, boiling/freezing, largest/smallest, first/last,
  born/died, damaged/fine, missing/found, archive/restore ...; a word may hold several
  families: "kept" keeps a term, against "cancelled"), or one word is the other with a
  reversing prefix
  (lock/unlock, follow/unfollow, activate/deactivate), or "from X to Y" swaps;
- their answer-shaping instructions differ, in kind or in what they say: a language ("in
  French" / "in German"), a format (JSON / YAML, a table, a poem), a length (one word,
  "in one sentence" / a plain "summarize"), a persona ("like a pirate" / "like a
  cowboy"), plain words ("in simple terms"), an audience or a tone after a verb that
  asks for an answer ("explain ... to a five-year-old", "write a sad story"), or a
  clause that directs the answer ("Answer ...", "Keep it ...");
- one adds words to the other and changes nothing else ("Tell me a joke" / "Tell me a
  joke about cats", "Give me a vegan recipe"), "please", greetings and thanks aside:
  an added qualifier narrows the question;
- they ask for a different kind of fact: a time or a cost on one side only ("How do I
  return an item?" / "How long do I have to return an item?"), or different places or
  reasons;
- their lines are indented differently: in code, indentation is meaning (a statement
  in a loop's body or after it), and an embedding does not see it;
- they hold the same words in another order ("convert miles to kilometers" /
  "kilometers to miles"; the price: "password reset" / "reset password" misses);
- they are written in different languages (the model answers in the question's own);
- they hold other symbols, in order: emoji and signs the embedding model reads as one
  unknown token ("👍" / "👎", "∀" / "∃"), and operators and brackets in code and
  formulas ("x = a + b" / "x = a - b", "age > 30" / "age < 30", "{}" / "[]");
- one asks whether a thing is so and the other why it is ("Can my order be cancelled?"
  / "Why was my order cancelled?"; "Is there a reason my card was declined?", "What's
  the reason ...", "How come ..." ask why);
- a small word that asks another thing is swapped for another of its kind: a question
  word ("How do bees ..." / "Why ..."), a modal ("Should I ..." / "Can I ..."), "and" /
  "or", "my" / "your"; or the persons swap roles ("Do I owe you money?" / "Do you owe me money?");
- the asker does the thing in a clause on one side and a third party on the other ("What
  happens if I freeze my account?" / "... if my bank freezes my account?"): guard_roles;
- a third party owns something on one side, or the owners differ ("delete my account"
  / "delete a user's account", "Can my boss read my chats?" / "Can I read my boss's
  chats?"): guard_roles.py;
- they ask to do another thing with the same thing ("return" / "exchange a damaged
  item", "reset" / "change my password"): guard_actions.py;
- they ask for different extremes or comparisons ("the cheapest plan" / "the plan with
  the best value", "cheaper than" / "faster than"): guard_degrees.py;
- they name other units ("the monthly plan" / "the yearly plan", "5 GB" / "5 MB", "in
  euros" / "in dollars"): guard_units.py;
- a place or a party is where a move goes on one side and where it comes from on the
  other ("deposit money into my account" / "get money from my account", "collect
  payment from a customer" / "make a payment to a customer"): guard_ends.py;
- they ask about all of a thing and some of it ("all my saved cards" / "one saved
  card"): guard_quantifiers.py;
- they ask a permission, an obligation or an advice, each of the others ("Can I opt
  out?" / "Do I have to opt out?", "Am I allowed to ..." / "Am I required to ..."):
  guard_modals.py;
- they ask about different times: a day ("yesterday" / "today" / "tomorrow"), "next" /
  "last" / "first", or the tense a question opens with, past against future ("Was the
  bank closed on Friday?" / "Will the bank be closed ..."; a present is either: "Why
  was I charged twice?" / "There is a double charge on my card", and "Will the bank be
  closed on Friday?" / "Is the bank closed on Friday?" are one question);
- they are one template with one slot changed ("Does the laptop come with a charger?" /
  "Does the phone ..."): a swapped entity, even in lower case. The price: a one-word
  synonym swap ("opening hours" / "business hours") misses too, but for a few verbs
  that say one act (guard_actions.SAME_ACT: "activate" / "turn on", "book" /
  "reserve", and "make" / "book" an appointment).

One-sided direction words are allowed ("turn on 2FA" vs "set up 2FA"): only a conflict
within a family refuses. Tuned on tests/data/semantic_tune.yaml only.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import re
import unicodedata
from dataclasses import dataclass

from .guard_actions import (
    ACTION,
    NOUN,
    SAME_ACT,
    actions_differ,
    checked,
    merged,
    nouns,
)
from .guard_degrees import SAME as DEGREE_SYNONYMS
from .guard_degrees import degrees, degrees_differ
from .guard_ends import ends, ends_differ
from .guard_modals import modals, modals_differ
from .guard_native import english_frame, joined, plain, small_words
from .guard_quantifiers import (
    QUANTIFIER_WORDS,
    all_against_one,
    quantifiers,
    quantifiers_differ,
)
from .guard_roles import (
    CLAUSE_WORDS,
    IRREGULAR_PARTICIPLES,
    agents,
    agents_differ,
    doer,
    owners,
    owners_differ,
    parties,
    parties_differ,
    state,
)
from .guard_units import (
    CURRENCY_CODE,
    CURRENCY_CODES,
    UNIT_WORDS,
    relative_differs,
    units,
    units_differ,
)

# A number, with its sign where one is written on it ("-7"; not the operator of "7-5")
_NUMBER = re.compile(r"(?:(?<![\w)])[-\u2212](?=\d))?\d+(?:[.,]\d+)*")
#: Operators and brackets outside numbers' arithmetic (code, formulas, comparisons):
#: "x = a + b" / "x = a - b", "age > 30" / "age < 30", "a == b" / "a != b", "{}" / "[]".
#: A minus only where it is one (blanks round it, or before an operand: "-sin(x)",
#: "e^-x"), not a hyphen ("e-mail"); a lone "&", "|", "/", "%", "~", "!" are prose.
_CODE_SYMBOLS = re.compile(
    r"===|!==|==|!=|<=|>=|<<|>>|\*\*|&&|\|\||->|=>|:=|[+*/%-]=|[=<>^*+]|\[\]|\{\}|"
    r"(?<=\w)\[|"  # an index, "a[0]" (not a bracketed word, "error [403]")
    # a minus between operands (a letter, a digit, a bracket, a call: "a - b", "x-1",
    # "sin(x) - cos(x)"; not "policy - how", "e-mail", "Wi-Fi"), or before one ("-sin")
    r"(?<![A-Za-z][A-Za-z])(?<=[A-Za-z0-9)\]])\s*-\s*(?=[A-Za-z0-9(](?![A-Za-z])|[A-Za-z]+\()|"
    r"(?:(?<=\s)|(?<=^)|(?<=[(=^,]))-(?=[A-Za-z(])")
# Markdown emphasis is not an operator ("the **refund** policy"; "x**2" is one). A span
# of at most 256 characters: each opening looked for its close to the end of the line, so
# a line of openings that never close ("**in **in ...", or U+00D7 signs, read as *)
# cost its length squared.
_EMPHASIS = re.compile(r"(?<![\w*])(\*{1,2})(?=\S)(.{1,256}?)(?<=\S)\1(?![\w*])")
# Signs written two ways read alike; signs that decorate (™, °) and emoji after the
# question's last mark ("... my password? 🙏") say nothing.
_SAME_SIGN = str.maketrans({"\u2265": ">=", "\u2264": "<=", "\u2260": "!=", "\u00d7": "*",
                            "\u2212": "-", "\u2192": "->", "\u21d2": "=>"})
_PLAIN_SIGNS = frozenset("\u2122\u00ae\u00a9\u00b0")
_SIGN_OFF = re.compile(r"([?.!])[^\w?.!]*$")
_THOUSANDS = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?")
# An operator between two numbers ("7 + 5" / "7 - 5", "8 times 2"), as one sign.
# After a number or a bracket; a sign also after a word, blanks round it ("3x - 7 = 0");
# before a number, signed or not ("5 * -3").
_SYMBOLS = r"[-+*/\u00d7\u00f7\u2212^%=<>\u2264\u2265\u2260]|[<>!]="
_OPERATOR = re.compile(
    rf"(?:(?<=[\d)])\s*({_SYMBOLS}|x|plus|minus|times|multiplied by|divided by|over|mod|"
    rf"modulo|to the power of)|(?<=\w)\s+({_SYMBOLS}))\s*(?=[-\u2212]?\d)", re.IGNORECASE)
_SIGN = {"plus": "+", "minus": "-", "\u2212": "-", "times": "*", "multiplied by": "*",
         "x": "*", "\u00d7": "*", "divided by": "/", "over": "/", "\u00f7": "/", "mod": "%",
         "modulo": "%", "to the power of": "^", "\u2264": "<=", "\u2265": ">=",
         "\u2260": "!="}
# Superscript and subscript digits (the text keeps them: proxy.text.fold) as an exponent
# and an index: "2³" is 2^3, neither 23 nor 2²; "H₂O" has an index 2.
_SCRIPT_DIGITS = str.maketrans({
    **{c: f"^{d}" for d, c in enumerate(
        "\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079")},
    **{chr(0x2080 + d): f"_{d}" for d in range(10)}})
_HAS_SCRIPT_DIGITS = re.compile("[\u2070\u00b9\u00b2\u00b3\u2074-\u2079\u2080-\u2089]")
#: The words a negated contraction typed without its apostrophe starts with ("wont",
#: "doesnt", "cant"; `_NO_APOSTROPHE`).
_NT_STEMS = r"do|does|did|is|are|was|were|has|have|had|ca|wo|should|would|could|must|need|ai"
_NEGATION = re.compile(
    r"\b(?:not|no|never|none|nothing|cannot|without|neither|nor|non|unable|impossible)\b|"
    r"\bfail(?:s|ed|ing)?\s+to\b|n't\b|\bnon-|"
    rf"\b(?:{_NT_STEMS})nt\b|"
    # the negations of the languages `_language` detects, their small words there
    # (`_STOPWORDS`: "pas", "nicht", "não"), which `_native` does not compare: French "ne"
    # or "n'" (its "pas" often the only one dropped), "jamais", "aucun"; "nicht", "kein",
    # "nie"; "não", "nunca", "nenhum"; "niet", "geen", "nooit"; "nada", "ningún"
    r"\b(?:ne|jamais|aucune?|nicht|kein(?:e[mnrs]?)?|nie|niemals|não|nunca|nenhuma?|niet|"
    r"geen|nooit|nada|ning[uú]n[oa]?|nessun[oa]?)\b|\bn'(?=\w)|"
    r"不|没|无|别|非", re.IGNORECASE)
#: `_NEGATION` without IGNORECASE, for ASCII text lowered first (the two agree there;
#: about twice as fast).
_NEGATION_ASCII = re.compile(_NEGATION.pattern)


def _negations(text: str) -> int:
    if text.isascii():
        return len(_NEGATION_ASCII.findall(text.lower()))
    return len(_NEGATION.findall(text))


#: A month's or a weekday's short name as its full one ("Dec 25" / "December 25th";
#: not "Mar", "Sat", "Sun", "Wed": other words too), in the names and in the words.
_ABBREVIATED = {
    "jan": "january", "feb": "february", "apr": "april", "jun": "june", "jul": "july",
    "aug": "august", "sep": "september", "sept": "september", "oct": "october",
    "nov": "november", "dec": "december", "mon": "monday", "tue": "tuesday",
    "tues": "tuesday", "thu": "thursday", "thur": "thursday", "thurs": "thursday",
    "fri": "friday"}
_SHORT_NAME = re.compile(r"\b(" + "|".join(_ABBREVIATED) + r")\b\.?")
#: A day before its month ("24 December", "the 24th of December"), read in the month's
#: order ("December 24"): one date, not two numbers swapped.
_DAY_MONTH = re.compile(r"\b(\d{1,2})\s+(?:of\s+)?(january|february|march|april|may|june|"
                        r"july|august|september|october|november|december)\b")
# A currency sign before an amount, as its word after it ("$10" / "10 dollars").
_CURRENCY_HINT = re.compile(r"usd|eur|gbp|jpy|inr|u\.?s\.? dollar")
_SIGNED_AMOUNT = re.compile(r"([$\u20ac\u00a3\u00a5\u20b9])\s?(\d+(?:[.,]\d+)*)")
_CURRENCY_WORD = {"$": "dollars", "\u20ac": "euros", "\u00a3": "pounds", "\u00a5": "yen",
                  "\u20b9": "rupees"}
# A day's ordinal after its number ("the 25th" / "the 25"; the number is the same).
_ORDINAL = re.compile(r"(?<=\d)(?:st|nd|rd|th)\b")
_NAME = re.compile(r"\b(?:" + "|".join(sorted(
    (k for k in _ABBREVIATED if len(k) <= 5 and k not in ("june", "july")),
    key=len, reverse=True)) + r")\b\.?")
_NAME = re.compile(r"(?<![.!?:]\s)(?<![¿¡])(?<!^)\b[A-Z][a-zA-Z]+\b")
_WORD = re.compile(r"[a-z]+(?:-[a-z]+)?")
_FROM_TO = re.compile(r"\bfrom\s+(\w+)\s+(?:to|into)\s+(\w+)", re.IGNORECASE)
_PERIODS = ("night", "morning", "evening", "week", "weekend", "month", "year", "season",
            "quarter", "summer", "winter", "spring", "autumn", "fall", "time", "monday",
            "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_PHRASE_VERBS = frozenset(("turn", "switch", "sign", "log", "opt", "check", "bring", "get",
                           "hand", "take"))
_PHRASES = {"turn on": "enable", "switch on": "enable", "turn off": "disable",
            "switch off": "disable", "sign up": "register", "log out": "logout",
            "sign out": "logout", "log in": "login", "log into": "login", "sign in": "login",
            "sign into": "login", "log on": "login", "log onto": "login", "log off": "logout",
            "opt in": "enable", "opt out": "disable", "check in": "checkin",
            "check out": "checkout",
            # bringing or getting a thing back restores it ("How do I archive a chat?" /
            # "How do I bring back an archived chat?", "erase" / "get back an erased")
            "bring back": "restore", "brought back": "restore", "get back": "restore",
            "got back": "restore", "gotten back": "restore",
            # handing a thing over gives it, taking it over receives it ("hand over" /
            # "take over a lease")
            "hand over": "give", "take over": "receive", "took over": "receive",
            "taken over": "receive",
            # a time of day or a period, this one, the last or the next: one word each
            **{f"{when} {unit}": f"{when}-{unit}" for when in ("last", "next", "this")
               for unit in _PERIODS},
            # what is given or sent to the asker, the asker receives ("Can you give me a
            # refund?" / "Can I receive a refund?"); "gift" after its subject gives
            **{f"{verb} {whom}": "receive" for verb in (
                "give", "gives", "gave", "given", "giving", "send", "sends", "sent",
                "sending") for whom in ("me", "us")},
            **{f"{who} gift": f"{who} give" for who in ("i", "we", "you", "to")}}


def _inflections(verb: str) -> set[str]:
    """A word's inflected forms, regular ones only, a few spellings too many (no English
    word is "lockked"): "cancel" -> "cancels", "canceled", "cancelled", "canceling", ...;
    "deny" -> "denied"; "approve" -> "approved"."""
    stem = verb[:-1] if verb.endswith("e") else verb
    out = {verb + "s", verb + "es", stem + "ed", stem + "ing", verb + verb[-1] + "ed",
           verb + verb[-1] + "ing"}
    if verb.endswith("y"):
        out |= {verb[:-1] + "ied", verb[:-1] + "ies"}
    return out - {verb}


# A phrase's verb in its other forms ("logged out", "turning on", "signs in").
_PHRASES.update({f"{form} {rest}": to for phrase, to in list(_PHRASES.items())
                 if phrase.split()[0] in _PHRASE_VERBS
                 for form in _inflections(phrase.split()[0])
                 for rest in [phrase.split(" ", 1)[1]]})
# One pass for every phrase (longest first); no replacement makes another phrase.
_PHRASE = re.compile(r"\b(?:" + "|".join(
    re.escape(p) for p in sorted(_PHRASES, key=len, reverse=True)) + r")\b")
#: Each phrase's two words: a phrase's match is two words in a row of the question's
#: runs of letters.
_PHRASE_PAIRS = frozenset(tuple(p.split(" ")) for p in _PHRASES)
assert all(len(pair) == 2 and all(map(str.isalpha, pair)) for pair in _PHRASE_PAIRS)
#: The phrasal verbs among them ("turn on", "logged out"), read as their one word in the
#: words the one-slot check compares too (`_tokens`): "How do I turn on two-factor
#: authentication?" / "How do I enable ...?" is one question. (Not "give me": who asks is
#: part of those words, "Can you give me ...?" / "Can I receive ...?".)
_VERB_PHRASE = re.compile(r"\b(?:" + "|".join(
    re.escape(p) for p in sorted(_PHRASES, key=len, reverse=True)
    if p.split()[0] in _PHRASE_VERBS
    or any(p.split()[0] in _inflections(v) for v in _PHRASE_VERBS)) + r")\b")
_FAMILIES = (
    ("amount", ("increase", "raise", "higher", "more", "up", "extend"),
     ("decrease", "reduce", "lower", "less", "down", "shorten")),
    ("member", ("add", "create", "invite", "insert", "include"),
     ("remove", "delete", "kick", "exclude")),
    # putting a thing away and bringing it back ("How do I archive a project?" / "How do
    # I restore an archived project?")
    ("removal", ("restore", "recover", "retrieve", "undelete", "unarchive", "reinstate"),
     ("archive", "delete", "remove", "trash", "discard", "erase", "wipe")),
    ("switch", ("enable", "activate", "allow", "show", "start"),
     ("disable", "deactivate", "block", "forbid", "hide", "stop")),
    ("plan", ("upgrade",), ("downgrade",)),
    # (keeping a thing is the opposite of ending it: "cancelled" / "kept my number")
    # (and bringing back what was ended: "cancel an order" / "reinstate a cancelled
    # order")
    ("term", ("renew", "resume", "continue", "keep", "retain", "restore", "reinstate",
              "reactivate"),
     ("cancel", "terminate", "pause", "end", "stop")),
    ("trade", ("buy", "purchase", "order"), ("sell", "return")),
    ("lock", ("lock", "freeze", "suspend"), ("unlock", "unfreeze", "reactivate")),
    ("session", ("login", "register", "subscribe", "join", "checkin"),
     ("logout", "unsubscribe", "leave", "checkout")),
    ("time", ("before", "earlier", "early"), ("after", "later", "late")),
    ("bound", ("maximum", "max", "most"), ("minimum", "min", "least")),
    ("flow", ("import", "upload", "receive", "deposit", "incoming"),
     # (giving is sending: "Can I gift my subscription?" / "Can I receive one?"; paying,
     # referring and forwarding give too: "pay a freelancer" / "get paid")
     ("export", "download", "send", "withdraw", "outgoing", "give", "pay", "refer",
      "forward")),
    ("money", ("refund", "credit", "reimburse", "refunded"),
     ("charge", "debit", "bill", "charged", "billed")),
    # (hiding a thing is making it private: "hide my profile" / "make my profile
    # visible")
    ("visibility", ("public", "visible", "unhide", "reveal"),
     ("private", "hidden", "hide", "invisible")),
    ("follow", ("follow", "mute"), ("unfollow", "unmute")),
    ("accept", ("accept", "approve", "confirm"), ("reject", "decline", "deny")),
    ("heat", ("hot", "hottest", "warm", "warmest", "boiling", "melting", "heat", "heating"),
     ("cold", "coldest", "cool", "coolest", "freezing", "frozen", "cooling")),
    ("size", ("large", "larger", "largest", "big", "bigger", "biggest", "long", "longer",
              "longest", "tall", "taller", "tallest"),
     ("small", "smaller", "smallest", "little", "tiny", "short", "shorter", "shortest")),
    ("speed", ("fast", "faster", "fastest"), ("slow", "slower", "slowest")),
    ("rank", ("best", "better", "good"), ("worst", "worse", "bad")),
    ("order", ("first", "earliest", "oldest"), ("last", "latest", "newest")),
    ("day", ("tomorrow", "upcoming"), ("yesterday", "ago")),
    ("loan", ("lend", "lends", "lent", "lending"), ("borrow", "borrows", "borrowed",
                                                     "borrowing")),
    # giving a thing and getting it ("How much notice do I need to give?" / "How much
    # notice will I get?"); "give me" and a "get" from someone are "receive" already
    # (`_PHRASES`, `_RECEIVING`), a "get ... back" "restore" (`_GOT_BACK`)
    ("giving", ("give", "gives", "gave", "given", "giving"),
     ("get", "gets", "got", "gotten", "getting")),
    ("git", ("push", "pushes", "pushed", "pushing"), ("pull", "pulls", "pulled", "pulling")),
    ("access", ("grant", "grants", "granted"), ("revoke", "revokes", "revoked")),
    ("life", ("born", "birth"), ("die", "died", "death", "dead")),
    # a thing's state, often in a context clause ("the box was damaged, can I return
    # it?"); not "working": "stopped working" is broken
    ("condition", ("fine", "intact", "undamaged"),
     ("damaged", "broken", "faulty", "defective", "cracked")),
    ("presence", ("found", "recovered"), ("missing", "stolen", "misplaced")),
    ("outcome", ("win", "won", "pass", "passed", "succeed", "success"),
     ("lose", "lost", "fail", "failed", "failure")),
)
#: Each word's directions: (family, sign) in every family that holds it (a word may
#: oppose words of two families: "stop" switches off and ends a term).
_DIRECTION: dict[str, tuple[tuple[str, str], ...]] = {}
for _fam, _plus, _minus in _FAMILIES:
    for _sign, _words in (("+", _plus), ("-", _minus)):
        for _w in _words:
            _DIRECTION[_w] = (*_DIRECTION.get(_w, ()), (_fam, _sign))
# Signs of their own: "today" is neither side of the day's family, "next" neither the
# first nor the last.
# Their inflected forms ("declined", "upgraded", "cancelled", "increasing", "denied"),
# where no listed word has that spelling; and a few irregular ones.
_DIRECTION.update({form: d for w, d in list(_DIRECTION.items())
                   for form in sorted(_inflections(w)) if form not in _DIRECTION})
_DIRECTION.update({"bought": (("trade", "+"),), "sold": (("trade", "-"),),
                   "sent": (("flow", "-"),), "gave": (("flow", "-"),),
                   "given": (("flow", "-"),), "paid": (("flow", "-"),),
                   "kept": (("term", "+"), ("presence", "+"))})
_DIRECTION.update({"today": (("day", "0"),), "tonight": (("day", "0"),),
                   # within a time, neither before nor after it ("Is the deadline
                   # during the holiday?" / "... before or after the holiday?")
                   "during": (("time", "0"),), "while": (("time", "0"),),
                   "next": (("order", "next"),),
                   **{f"{when}-{unit}": (("day", sign),) for when, sign in (
                       ("last", "-"), ("this", "0"), ("next", "+")) for unit in _PERIODS}})
#: "get" where the asker receives: a thing got from someone ("get points from a friend"),
#: or a giving done to the asker ("get paid", "get referred"): "receive", the inward side
#: of the flow ("give my points to a friend" / "get points from a friend" misses). At
#: most four words before the "from"; no part of it backtracks into another.
_GET = r"\b(?:get|gets|got|gotten|getting)"
_RECEIVING = re.compile(
    _GET + r"\s++(?:paid|sent|given|gifted|referred|forwarded)\b|"
    + _GET + r"(?=(?:\s++[a-z'-]++){1,4}?\s++from\b)")
#: "get" or "bring" with what it gets back between it and its "back" ("get my photos
#: back"): restoring it, as "get back" is (`_PHRASES`); not "get someone to call back".
#: At most three words between; no part of it backtracks into another.
_GOT_BACK = re.compile(r"\b(?:get|gets|got|gotten|getting|bring|brings|brought|bringing)"
                       r"((?:\s++(?!to\b)[a-z'-]++){1,3}?)\s++back\b")
#: "in" / "out" closing a clause after a verb that moves a thing, up to three words on:
#: the thing comes in or goes out ("transfer my domain out" / "transfer a domain in").
#: Or said right after that verb, before what moves: "out" ("transfer out credits",
#: "port out my number"), "in" before a possessive or before a thing and its "from"
#: ("port in my number", "transfer in credits from ..."; not "move in the morning").
_MOVED = re.compile(r"\b(?:transfer|move|moving|port)[a-z]*+(?:"
                    r"(?:\s++[a-z'-]++){0,3}?\s++(in|out)(?=\s*+(?:[?.!,;]|$))|"
                    r"\s++(out\b|in(?=\s++(?:(?:my|your|our|their|his|her)\b|"
                    r"[a-z'-]++\s++from\b))))")
_MOVED_WAY = {"in": "incoming", "out": "outgoing"}


def _moved(m: re.Match[str]) -> str:
    """`_MOVED`'s match with its "in" / "out" as the side of the flow it says."""
    way = m.lastindex or 1
    return (m.group(0)[:m.start(way) - m.start(0)] + _MOVED_WAY[m.group(way)]
            + m.group(0)[m.end(way) - m.start(0):])


#: The tense a question opens with: its first word, or the one after a question word
#: (and one more: "How much did ..."), when it is a past or a future auxiliary.
_TENSE = re.compile(
    r"^\W*(?:(?:what|when|where|who|whom|whose|why|how|which)\W+(?:[a-z]+\W+)?)?"
    r"(did|was|were|had|will|shall|won['\u2019]?t|(?:is|are|am)\W+[a-z]+\W+going\W+to)"
    r"(?:n['\u2019]?t)?\b")
_PAST = frozenset({"did", "was", "were", "had"})
_REVERSING = ("un", "de", "dis", "non", "non-")

_LANGUAGES = ("english|french|spanish|german|italian|portuguese|japanese|chinese|mandarin|"
              "korean|russian|arabic|hindi|dutch|polish|turkish|swedish|norwegian|danish|"
              "finnish|greek|hebrew|latin|ukrainian|czech|hungarian|romanian|vietnamese|"
              "thai|indonesian|malay|bengali|urdu|persian|swahili|emoji")
#: Words that mark a question's own language (English is the default: ""), each list
#: without the words it shares with English (a tie between two others goes to the first
#: listed); and the scripts that mark one by themselves.
_STOPWORDS = {lang: frozenset(words.split()) for lang, words in {
    "en": "the is are what how why where do does i you my with for to of in and can it "
          "this that which who when a an should would could will there",
    "fr": "le la les de des est une du et pour que qui quelle quel quels comment pourquoi "
          "où je vous nous avec dans sur au aux cette ce mon ma mes votre pas ne suis sont "
          "faire puis peux peut",
    "es": "el la los las de es una del y para qué que cómo como dónde cuál mi con está son "
          "por puedo hacer mis tu su yo hay",
    "de": "der die das ist ein eine und wie was warum wo ich mit für nicht kann mein meine "
          "sie wir auf zu den dem von bitte",
    "it": "il lo la di gli è una per che come perché dove quale mio mia con sono posso fare "
          "della del non cosa",
    "pt": "o os de é um uma para que como onde qual meu minha com não posso fazer da do em "
          "são você",
    "nl": "het een en hoe wat waarom waar ik je met voor niet mijn kan van zijn",
}.items()}
_LATIN_WORD = re.compile(r"[^\W\d_]+")
#: A question of at most this many words may be told by one small word (`_language`),
#: unless that word is an English word too.
_SHORT = 6
_ENGLISH_TOO = frozenset(
    "comment con son hay die was den per come dove fare non hoe met van en".split())
_SCRIPTS = tuple((lang, re.compile(chars)) for lang, chars in (
    ("ja", "[\u3040-\u30ff]"), ("zh", "[\u4e00-\u9fff]"), ("ko", "[\uac00-\ud7af]"),
    ("ru", "[\u0400-\u04ff]"), ("ar", "[\u0600-\u06ff]"), ("he", "[\u0590-\u05ff]"),
    ("el", "[\u0370-\u03ff]"), ("hi", "[\u0900-\u097f]"), ("th", "[\u0e00-\u0e7f]")))
_ASCII_LETTERS = re.compile(r"[A-Za-z]")
_INSTRUCTIONS = {
    "language": re.compile(rf"\b(?:in|into|to)\s+(?:{_LANGUAGES})\b|^\s*(?:{_LANGUAGES})\s*:",
                           re.IGNORECASE),
    "format": re.compile(
        r"\b(?:json|yaml|xml|csv|markdown|html|table|bullet\w*|numbered|poem|haiku|limerick|"
        r"song|rap|sonnet|essay|tweet|code (?:sample|snippet|example)|all caps|uppercase|"
        r"lowercase|as a list|in a list)\b", re.IGNORECASE),
    "length": re.compile(
        r"\b(?:(?:one|two|three|four|five|\d+)\s+(?:words?|sentences?|lines?|paragraphs?|"
        r"bullets?|points?)|in a (?:word|sentence|line)|brief(?:ly)?|concise(?:ly)?|short|"
        r"succinct(?:ly)?|detailed|in detail|step by step|summar(?:y|ize|ise)|tl;?dr|"
        r"no more than|at most|max(?:imum)?\s+\d+|yes or no|true or false|only (?:a|one) )",
        re.IGNORECASE),
    "persona": re.compile(
        r"\b(?:(?:like (?:a|an|i'm|i am|you're)|in the (?:style|voice) of|talk like|speak like|"
        r"act as|acting as|pretend(?: to be| you are| you're)?|you are an?)(?:\s+(?:a|an|the))?"
        r"\s+[\w'-]+|as if|role-?play|eli5)", re.IGNORECASE),
    # (audience and tone count only after a verb that asks for an answer: "explain ... to
    # a child", "write a sad story"; "classes for beginners" or "dark mode" ask a fact)
    "audience": re.compile(
        r"\b(?:for|to)\s+(?:a\s+|an\s+|the\s+|my\s+|your\s+|someone\s+who\s+is\s+(?:a\s+|an\s+)?)?"
        r"(?:[\w-]+\s+){0,2}?(?:beginners?|novices?|newbies?|dummies|kids?|child(?:ren)?|"
        r"toddlers?|teen(?:ager)?s?|(?:\d+|one|two|three|four|five|six|seven|eight|nine|ten|"
        r"eleven|twelve)[- ]years?[- ]olds?|experts?|specialists?|professionals?|physicists?|"
        r"scientists?|mathematicians?|students?|graduates?|developers?|programmers?|"
        r"engineers?|managers?|executives?|ceos?|doctors?|lawyers?|teachers?|parents?|"
        r"seniors?|marketers?|investors?|layperson|lay people|laymen|layman|non-?experts?|"
        r"grandma|grandmother|grandpa|grandparents?)\b", re.IGNORECASE),
    "tone": re.compile(
        r"\b(?:sad|happy|funny|humou?rous|hilarious|scary|spooky|creepy|romantic|dark|serious|"
        r"formal|informal|casual|polite|rude|friendly|angry|sarcastic|witty|cheerful|"
        r"motivational|inspirational|inspiring|persuasive|dramatic|silly|whimsical|playful|"
        r"heartwarming|bittersweet|emotional|upbeat|gloomy|optimistic|pessimistic|"
        r"enthusiastic)\b", re.IGNORECASE),
    "plain": re.compile(
        r"\bin (?:simple|simpler|plain|basic|easy|layman'?s'?|technical|non-?technical) "
        r"(?:terms|english|words|language)\b|\blike i'?m\s+\w+", re.IGNORECASE),
    "directive": re.compile(
        r"(?:^|[.!?:;]\s*|\band\s+)(?:please\s+|just\s+|only\s+|now\s+)*(?:answer|respond|reply|"
        r"write|format|translate|rewrite|summari[sz]e|keep (?:it|your|the)|be (?:very |extremely |"
        r"really )?\w+ly\b|be (?:brief|concise|short|detailed|funny|formal|casual)|"
        r"use (?:only|no|a|an|simple|plain|emojis?)|include an? |give (?:me )?(?:only|just)|"
        r"say (?:it|only|yes|no)|start with|end with|do not explain|don't explain|no explanation)",
        re.IGNORECASE),
}


_FOCUS = {
    "time": re.compile(r"\b(?:how long|how many (?:days|hours|weeks|minutes|months|years)|"
                       r"how soon|how fast|how quickly|when|what time|what date|deadline|"
                       r"hours|delivery times?)\b", re.IGNORECASE),
    "cost": re.compile(r"\b(?:how much|costs?|prices?|fees?|free|pay for)\b", re.IGNORECASE),
    "place": re.compile(r"\b(?:where|which country|what country)\b", re.IGNORECASE),
    # ("how come" asks why: "How come I was charged a late fee?" / "How do I avoid
    # being charged a late fee?" are a reason and the steps)
    "reason": re.compile(r"\b(?:why|what caused|reason|how come)\b", re.IGNORECASE),
    # a person: against a place, a time or a reason, another fact ("Who can sign the
    # form?" / "Where can I sign the form?"; "who" against "how" is often how a
    # paraphrase reads: "Who do I contact ...?" / "How do I contact ...?")
    "person": re.compile(r"\b(?:who|whom|whose)\b", re.IGNORECASE),
}
# The same patterns without IGNORECASE, for ASCII text lowered first (faster; on
# ASCII the two agree, while IGNORECASE also lets the dotless i, the dotted capital I
# and the long s match "i" and "s").
_INSTRUCTIONS_ASCII = {k: re.compile(p.pattern) for k, p in _INSTRUCTIONS.items()}
_FOCUS_ASCII = {k: re.compile(p.pattern) for k, p in _FOCUS.items()}
#: Every kind's pattern in one (each set's, with its flags): where it finds nothing, no
#: kind's does (`_instructions`).
_ANY_INSTRUCTION = re.compile(
    "|".join(f"(?:{p.pattern})" for p in _INSTRUCTIONS.values()), re.IGNORECASE)
_ANY_INSTRUCTION_ASCII = re.compile(_ANY_INSTRUCTION.pattern)
_ONE_SIDED_FOCUS = frozenset({"time", "cost"})  # "where"/"why" often just rephrase "how"
_TOKEN = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
_INDENT = re.compile(r"\n([ \t]+)(?=\S)")
_SCAFFOLD = frozenset(
    "a an the i my me you your we our do does did can could is are was were be how what "
    "when where why which who to for of in on at with and or it this that there please "
    "should would will".split())
#: Words that add nothing to a question ("Is there a free trial available?"): a question
#: that adds only these to another still asks the same.
_FILLER = _SCAFFOLD | frozenset(
    "available currently still actually exactly really just also anymore today now here "
    "again ever possible any some so even already yet out up get have has hi hello hey "
    "thanks thank thx pls plz help tell know need want quick question right kindly "
    "like would love got gets getting use using details detail info information placed "
    "made simply wondering wonder curious show "
    # a conjunction, like "and" (`_SCAFFOLD`): joining two clauses it asks nothing, so
    # "X and my phone is lost" / "X but I have my phone" is the one dropped state
    "but".split())
#: Small words that ask different things (each its kind's class): a question word for
#: another ("How do bees make honey?" / "Why ..."), a modal for another ("Should I stop
#: taking it?" / "Can I ..."), "and" for "or".
_SWAPS = {"how": "how", "why": "why", "where": "where", "when": "what", "who": "who",
          "what": "what", "which": "what", "can": "can", "could": "can", "would": "can",
          "will": "can", "should": "should", "must": "must", "and": "and", "or": "or",
          # whose ("Can you delete my data?" / "... your data?"; "our" is either's)
          "my": "my", "mine": "my", "your": "your", "yours": "your"}
_ASKING = frozenset("how what when where why which who can could do does is are".split())
#: A noun added after one it only restates ("the capital city of France", "my email
#: address", "your phone number"): no span that says something more.
_RESTATED = frozenset({("capital", "city"), ("email", "address"), ("e-mail", "address"),
                       ("phone", "number"), ("mobile", "number"), ("telephone", "number"),
                       ("zip", "code"), ("postal", "code")})
#: Instruction kinds compared by what they say, not only by their presence.
_PHRASED = frozenset({"language", "format", "length", "persona", "audience", "tone",
                      "plain"})
#: Kinds that count only after a verb asking for an answer, in the same sentence.
_AFTER_VERB = frozenset({"audience", "tone"})
_ANSWER_VERB = re.compile(
    r"\b(?:explain|describe|write|tell|answer|summari[sz]e|teach|define|simplify|break|"
    r"rewrite|reply|respond|compose|create|make|give|generate|draft|craft|suggest|present|"
    r"pitch|introduce|outline|walk)\b", re.IGNORECASE)
_SENTENCE_END = re.compile(r"[.!?]")
_SAME = {"short": "brief", "concise": "brief", "succinct": "brief", "child": "kid",
         "children": "kid", "simpler": "simple"}  # (plurals: "kids" reads as "kid")
_UNITS = frozenset({"word", "words", "sentence", "sentences", "line", "lines", "paragraph",
                    "paragraphs"})
_NUMBER_WORDS = {w: str(i) for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve".split())}
_LEAD = frozenset("in into to for a an the only as".split())


@dataclass(frozen=True, slots=True)
class Signature:
    numbers: tuple[str, ...]
    negations: int
    names: tuple[str, ...]
    directions: tuple[tuple[str, str], ...]  # (family, sign) in order
    words: frozenset[str]
    route: tuple[str, str] | None  # "from X to Y"
    instructions: frozenset[str]
    focus: frozenset[str]
    tokens: tuple[str, ...]
    layout: tuple[str, ...] = ()  # each indented line's indentation, in order
    language: str = ""  # the question's own language, where not English (`_language`)
    tense: str = ""  # "past" or "future" where the question opens with one (`_TENSE`)
    symbols: tuple[str, ...] = ()  # emoji, signs and operators in order (`_symbols`)
    counts: tuple[str, ...] = ()  # counts in words, in order (`_counts`)
    owners: tuple[str, ...] = ()  # possessors in order (guard_roles.owners)
    doer: str = ""  # who the question asks does the thing (guard_roles.doer)
    degrees: frozenset[str] = frozenset()  # extremes asked for (guard_degrees.degrees)
    units: tuple[str, ...] = ()  # periods, sizes, measures, currencies (guard_units.units)
    quantifiers: frozenset[str] = frozenset()  # "all", "some" (guard_quantifiers)
    modals: tuple[str, ...] = ()  # "can", "must", "should" opening a clause (guard_modals)
    native: frozenset[str] = frozenset()  # words that say something, not English (`_native`)
    ends: tuple[tuple[str, str], ...] = ()  # where a move goes or comes from (guard_ends)
    agents: tuple[str, ...] = ()  # who does the thing in each "if" / "when" clause
    state: str = ""  # the participle a thing is asked or checked to be in (guard_roles.state)


def signature(text: str) -> Signature:
    language = _language(text)
    if language in _SPLIT_VERBS:  # "Wie lade ich die App herunter?": one verb
        text = joined(text, language)
    lowered = text.lower()
    if "when" in lowered and "happen" in lowered:  # "What happens when I ...": if
        text = _HAPPENS_WHEN.sub(r"\1 if", text)
        lowered = text.lower()
    letters = _LETTERS.findall(lowered)
    # The question's runs of letters, once: a pass whose every match holds one of its
    # words (the gates at the end of this module) is skipped where the question holds
    # none of them (most passes, for most questions).
    runs = frozenset(letters)
    if (not _PHRASE_FIRST.isdisjoint(runs) and not _PHRASE_SECOND.isdisjoint(runs)
            and any(pair in _PHRASE_PAIRS for pair in itertools.pairwise(letters))):
        low = _PHRASE.sub(lambda m: _PHRASES[m.group(0)], lowered)
    else:  # (most questions: no two words in a row are a phrase's)
        low = lowered
    if "back" in low:
        low = _GOT_BACK.sub(r"restore\1", low)
    if "get" in low or "got" in low:  # (each of `_RECEIVING`'s matches holds one)
        low = _RECEIVING.sub("receive", low)
    if " in" in low or " out" in low:
        low = _MOVED.sub(_moved, low)
    if text.isascii():  # (lowered, without IGNORECASE: the same matches, faster)
        numbers = _numbers(text) if _DIGIT.search(lowered) or _HAS_SPELLED_ASCII.search(
            lowered) else ()
        negations = (len(_NEGATION_ASCII.findall(lowered))
                     if "'" in lowered or not _NEGATION_WORDS.isdisjoint(runs) else 0)
        instructions = (_instructions(_INSTRUCTIONS_ASCII, lowered)
                        if _may_instruct(runs, lowered) else frozenset())
        focus = frozenset(k for k, p in _FOCUS_ASCII.items()
                          if not _FOCUS_WORDS[k].isdisjoint(runs) and p.search(lowered))
        counts = (tuple(_count(m.group(1)) for m in _COUNT_WORD_ASCII.finditer(lowered))
                  if not _COUNT_WORDS.isdisjoint(runs) else ())
    else:
        numbers, negations = _numbers(text), _negations(text)
        instructions = _instructions(_INSTRUCTIONS, text)
        focus = frozenset(k for k, p in _FOCUS.items() if p.search(text))
        counts = _counts(text)
    words = _WORD.findall(low)
    route = _FROM_TO.search(low) if "from" in low else None
    return Signature(
        numbers=numbers,
        negations=negations,
        names=_names(text) if _CAPITAL.search(text, 1) else (),
        directions=tuple(d for w in words if w in _DIRECTION for d in _DIRECTION[w]),
        words=frozenset(words),
        route=(route.group(1), route.group(2)) if route else None,
        instructions=instructions,
        focus=focus,
        tokens=_tokens(frame := english_frame(lowered, language),
                       runs if frame is lowered else None),
        layout=tuple(_INDENT.findall(text)) if "\n" in text else (),
        language=language,
        native=_native(text, language),
        tense=_tense(lowered),
        symbols=_symbols(text),
        counts=counts,
        owners=owners(lowered),
        doer=doer(lowered),
        degrees=degrees(lowered),
        units=(units(lowered) if not UNIT_WORDS.isdisjoint(runs)
               or _UNIT_SIGN_OR_DIGIT.search(lowered) else ()),
        quantifiers=(quantifiers(lowered) if not QUANTIFIER_WORDS.isdisjoint(runs)
                     else frozenset()),
        modals=modals(lowered),
        ends=ends(low),
        agents=agents(lowered) if not CLAUSE_WORDS.isdisjoint(runs) else (),
        state=state(lowered),
    )


#: "What happens when ...?" asks what follows a condition, as "What happens if ...?"
#: does: its "when" is no time asked (`signature`). Not a past "happened when": a time.
_HAPPENS_WHEN = re.compile(r"\b(happens?)\s+when\b", re.IGNORECASE)
#: Languages whose verbs split round their object, a particle last (guard_native.joined).
_SPLIT_VERBS = frozenset(("de", "nl"))


def _names(text: str) -> tuple[str, ...]:
    """The capitalized names in order, a month's or a weekday's short name as its full
    one; a currency's code ("USD", "EUR", "US dollars") is none: guard_units compares
    currencies ("in USD" / "in US dollars" / "in dollars")."""
    text = text.strip().lstrip("¿¡")  # (Spanish opens a question with "¿")
    if "US" in text or "U.S" in text:
        text = _US_CURRENCY.sub("usd", text)
    return tuple(_ABBREVIATED.get(name, name).rstrip("s") for name in (
        m.group(0).lower() for m in _NAME.finditer(text)) if name not in CURRENCY_CODES)


_US_CURRENCY = re.compile(r"\bU\.?S\.?\s+(?=[Dd]ollars?\b)")


# A small word and "is" or "are" read as their contraction ("Where is the nearest
# store?" / "Where's ...": "where s"), the contraction's own tokens as before (a
# noun's possessive is no contraction: "the app's language").
_FULL = re.compile(r"\b(what|where|who|how|when|why|it|that|there|here|he|she|you|we|they)"
                   r"\s+(is|are)\b")
_CONTRACTED = {"is": "s", "are": "re"}
#: A frame that asks why round a clause ("Is there a reason my card was declined?",
#: "What's the reason my card was declined?", "How come my card was declined?"), read as
#: "why that": its question word, and the clause's subject as a clause's
#: (`_clause_subject_swapped`). Only before a subject: "Is there a reason to upgrade?"
#: asks an advice.
_REASON_FRAME = re.compile(
    r"^\W{0,8}+(?:is\s++there\s++(?:a|any)\s++(?:good\s++|particular\s++|specific\s++)?"
    r"reason|what(?:\s++is|\s*+['\u2019]s)\s++the\s++reason|how\s++come)\s++"
    r"(?:why\s++|that\s++)?(?=(?:my|the|your|our|their|his|her|a|an|i|you|we|it|this|that|"
    r"they|he|she)\b)")
#: A negated contraction typed without its apostrophe ("wont", "doesnt", "cant"): the
#: contraction ("won't"), a negation (`_NEGATION`) as its spelling with one is.
_NO_APOSTROPHE = re.compile(rf"\b({_NT_STEMS})nt\b")
# Words that ask the same thing in the frame of a question, read as one: "Do you offer
# gift wrapping?" / "Do you have (provide) ...", "When does it open?" / "What time does
# it open?", and the extremes guard_degrees reads alike ("the cheapest plan" / "the
# most affordable plan").
_SAME_ASK = re.compile(r"\b(?:(?:at\s+)?what\s+time|(?:do|does)\s+you\s+(?:have|provide)|"
                       + "|".join(sorted(map(re.escape, DEGREE_SYNONYMS), key=len,
                                         reverse=True)) + r")\b")


def _same_ask(m: re.Match[str]) -> str:
    said = m.group(0)
    if said.endswith("time"):
        return "when"
    if said.startswith("do"):
        return "do you offer"
    return DEGREE_SYNONYMS[re.sub(r"\s+", " ", said)]


_DIGIT = re.compile(r"\d")
_LETTERS = re.compile(r"[a-z]+")
#: The first words of `_VERB_PHRASE`'s phrases: a question holding none has none of them.
_VERB_FIRST = frozenset(m.split()[0] for m in _PHRASES if _VERB_PHRASE.fullmatch(m))


def _tokens(lowered: str, runs: frozenset[str] | None = None) -> tuple[str, ...]:
    """The question's words, numbers spelled in words as their digits (`_spelled`), a
    negated contraction with its apostrophe (`_NO_APOSTROPHE`), a month's or a
    weekday's short name as its full one and a day without its ordinal, after its month
    ("Dec 25th", "25 December" as "december 25": `_ABBREVIATED`, `_DAY_MONTH`), an
    amount after a currency sign with the currency's word ("$10" as "10 dollars"), a
    small word and
    "is"/"are" as their contraction (`_FULL`), and words that ask the same thing in the
    same frame as one (`_SAME_ASK`), a phrasal verb as its one word (`_VERB_PHRASE`), a
    "get" that receives as "receive" (`_RECEIVING`), a "get ... back" as "restore"
    (`_GOT_BACK`). `runs`: the text's runs of letters (`_LETTERS`), if the caller has
    them: each pass a word of it opens (`_SAME_ASK_WORDS`, ...) is skipped where none is
    there."""
    given = lowered
    if _HAS_SPELLED.search(lowered):  # "two bags" reads as "2 bags"
        for start, end, n in reversed(_spelled(lowered)):
            lowered = f"{lowered[:start]}{n}{lowered[end:]}"
    if any(sign in lowered for sign in _CURRENCY_WORD):
        lowered = _SIGNED_AMOUNT.sub(lambda m: f"{m.group(2)} {_CURRENCY_WORD[m.group(1)]}",
                                     lowered)
    if _CURRENCY_HINT.search(lowered):  # "in USD", "in US dollars" as "in dollars"
        lowered = CURRENCY_CODE.sub(lambda m: CURRENCY_CODES.get(m.group(0), ""), lowered)
    if runs is None or lowered != given:
        runs = frozenset(_LETTERS.findall(lowered))
    if not _ABBREVIATED_WORDS.isdisjoint(runs):
        lowered, runs = _rerun(lowered, _SHORT_NAME.sub(
            lambda m: _ABBREVIATED[m.group(1)], lowered), runs)
    if _DIGIT.search(lowered):  # (an ordinal and a day both follow a digit)
        lowered, runs = _rerun(lowered, _DAY_MONTH.sub(r"\2 \1", _ORDINAL.sub("", lowered)),
                               runs)
    if "nt" in lowered:
        lowered, runs = _rerun(lowered, _NO_APOSTROPHE.sub(r"\1n't", lowered), runs)
    if "reason" in lowered or "how come" in lowered:
        lowered, runs = _rerun(lowered, _REASON_FRAME.sub("why that ", lowered), runs)
    if " is" in lowered or " are" in lowered:
        lowered, runs = _rerun(lowered, _FULL.sub(
            lambda m: f"{m.group(1)} {_CONTRACTED[m.group(2)]}", lowered), runs)
    if not _SAME_ASK_WORDS.isdisjoint(runs):
        lowered, runs = _rerun(lowered, _SAME_ASK.sub(_same_ask, lowered), runs)
    if not _CHANNEL_WORDS.isdisjoint(runs) and _CHANNEL_HINT.search(lowered):
        lowered, runs = _rerun(lowered, _CHANNEL.sub(
            lambda m: _CHANNELS[_channel_key(m.group(0))], lowered), runs)
    if not _VERB_FIRST.isdisjoint(runs):
        lowered = _VERB_PHRASE.sub(lambda m: _PHRASES[m.group(0)], lowered)
    if "back" in lowered:
        lowered = _GOT_BACK.sub(r"restore\1", lowered)
    if "get" in lowered or "got" in lowered:
        lowered = _RECEIVING.sub("receive", lowered)
    return tuple(_TOKEN.findall(lowered))


#: Where or how a thing is done, each way it is said as one token ("by phone", "over
#: the phone": "by-phone"; "at the counter", "in store", "in person": "in-person"): two
#: questions that name other channels ask other things ("Can I pay by card at the
#: counter?" / "Can I pay by card online?", `channels_differ`).
_CHANNEL_WAYS = {
    "online": ("online", "on the website", "on your website", "on the web", "via the website",
               "through the website", "on the site", "on your site"),
    "in-app": ("in the app", "in your app", "through the app", "via the app", "on the app",
               "in-app"),
    "by-phone": ("by phone", "over the phone", "on the phone", "by telephone",
                 "by calling"),
    "in-person": ("in person", "in-person", "in store", "in-store", "in a store",
                  "at a store", "at the store", "in a shop", "at a shop", "at the shop",
                  "at the counter", "at a counter", "at the desk", "at a branch",
                  "at the branch", "in a branch", "in branch", "at the post office",
                  "face to face"),
    "by-post": ("by post", "by mail", "in the mail", "through the post", "by letter"),
    "by-email": ("by email", "by e-mail", "via email", "over email", "through email"),
}
_CHANNELS = {" ".join(way.split()): name for name, ways in _CHANNEL_WAYS.items()
             for way in ways}
_CHANNEL = re.compile(r"\b(?:" + "|".join(
    re.escape(w).replace(r"\ ", r"\s+") for w in sorted(_CHANNELS, key=len, reverse=True))
    + r")\b")
#: The words every channel's way holds one of (a cheap first look: most questions name
#: none).
_CHANNEL_HINT = re.compile(r"\b(?:online|web|site|app|phone|telephone|calling|person|store|"
                           r"shop|counter|desk|branch|post|mail|letter|face|email|e-mail)\b")
_CHANNEL_NAMES = frozenset(_CHANNEL_WAYS)
#: The words `_CHANNEL_HINT` looks for, each whole ("e-mail": "mail"): where the text
#: holds none, it is not searched.
_CHANNEL_WORDS = frozenset("online web site app phone telephone calling person store shop "
                           "counter desk branch post mail letter face email".split())


def _channel_key(said: str) -> str:
    return " ".join(said.split())


def channels_differ(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """Both questions name a channel (`_CHANNEL_WAYS`, in their tokens), and not the
    same ones."""
    ca, cb = _CHANNEL_NAMES.intersection(a), _CHANNEL_NAMES.intersection(b)
    return bool(ca and cb and ca != cb)


def _symbols(text: str) -> tuple[str, ...]:
    """The symbols a question holds, in order: emoji and other signs (what the embedding
    model reads as one unknown token: "What does the 👍 emoji mean?" / "... 👎 ...",
    "∀" / "∃", "→" / "←"; currency signs aside, read with their numbers), and operators
    and brackets outside numbers' arithmetic (`_CODE_SYMBOLS`; `_numbers` reads those)."""
    if text.isascii() and _SYMBOL_CHARS.isdisjoint(text):
        return ()  # (most questions: each operator and bracket holds one of these)
    if not text.isascii():
        text = _SIGN_OFF.sub(r"\1", text.translate(_SAME_SIGN))
    if "*" in text:
        text = _EMPHASIS.sub(r"\2", text)
    arithmetic = len(_NUMBER.findall(text)) >= 2  # (then `_numbers` holds its operators)
    out = [m.group(0).strip() for m in _CODE_SYMBOLS.finditer(
        _OPERATOR.sub(" ", text) if arithmetic else text)]
    if not text.isascii():
        out += [c for c in text if ord(c) > 127 and c not in _PLAIN_SIGNS
                and unicodedata.category(c) in _SIGNS]
    return tuple(out)


_SIGNS = frozenset({"So", "Sm", "Sk"})
#: The characters every match of `_CODE_SYMBOLS` holds one of.
_SYMBOL_CHARS = frozenset("=!<>*&|-:+/%^[]{}")
_PERSON = {**dict.fromkeys(("i", "me", "my", "mine", "we", "us", "our", "ours"), "1"),
           **dict.fromkeys(("you", "your", "yours"), "2")}
_SWAPPED = {"1": "2", "2": "1"}


def _roles_swapped(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """One question is the other with its persons' roles swapped ("Do I owe you money?"
    / "Do you owe me money?"): the same words, each person the other one."""
    pa = [_PERSON.get(t, t) for t in a]
    pb = [_PERSON.get(t, t) for t in b]
    return pa != pb and "1" in pa and "2" in pa and [_SWAPPED.get(t, t) for t in pa] == pb


def _tense(lowered: str) -> str:
    m = _TENSE.match(lowered)
    return "" if m is None else "past" if m.group(1) in _PAST else "future"


def _language(text: str) -> str:
    """The language the question is written in, where it is not English: a script's
    ("zh", "ru", ...: most of its letters), or the language whose own small words it uses
    most, at least two of them and more than English's ("fr", "es", ...), or one in a
    short question with none of English's, or a Spanish "¿" or "¡". "" for
    English and for what it cannot tell: a question in French is not answered by the
    English answer of the same question (the model answers in the question's language)."""
    if not text.isascii():
        latin = len(_ASCII_LETTERS.findall(text))
        for lang, chars in _SCRIPTS:
            if len(chars.findall(text)) > latin:
                return lang
    words = _LATIN_WORD.findall(text.lower())
    if _FOREIGN_STOPWORDS.isdisjoint(words):  # (most questions: no other language's word)
        return "es" if "\u00bf" in text or "\u00a1" in text else ""
    counts = dict.fromkeys(_STOPWORDS, 0)  # (in `_STOPWORDS`' order: `max` takes the first)
    for w in words:
        for lang in _STOPWORD_LANGUAGES.get(w, ()):
            counts[lang] += 1
    best = max(counts, key=counts.__getitem__)
    if best != "en" and counts[best] >= 2 and counts[best] > counts["en"]:
        return best
    if "\u00bf" in text or "\u00a1" in text:  # "¿", "¡": Spanish, however short
        return "es"
    # A short question with one small word of another language and none of English's
    # ("Pourquoi payer ?", "Wie kündigen?"), where that word is no English word too.
    if (best != "en" and counts[best] == 1 and not counts["en"] and len(words) <= _SHORT
            and not any(w in _STOPWORDS[best] and w in _ENGLISH_TOO for w in words)):
        return best
    return ""


def _native(text: str, language: str) -> frozenset[str]:
    """The words that say something in a question written in another language than
    English (not its language's small words, `_STOPWORDS`), without their accents: the
    guard's lists (directions, actions, filler) read English only."""
    if language not in _PLAIN_STOPWORDS:
        return frozenset()
    small = _PLAIN_STOPWORDS[language] | small_words(language)
    return frozenset(w for w in _LATIN_WORD.findall(plain(text.lower()))
                     if len(w) > 1 and w not in small)


#: Each small word's languages (`_STOPWORDS` read the other way): a question's words
#: counted per language in one pass, not one pass a language.
_STOPWORD_LANGUAGES: dict[str, tuple[str, ...]] = {
    w: tuple(lang for lang, stop in _STOPWORDS.items() if w in stop)
    for w in frozenset().union(*_STOPWORDS.values())}
#: The small words of a language other than English: a question holding none of them
#: has English's counted alone (`_language`: English, or a "¿").
_FOREIGN_STOPWORDS = frozenset(w for w, langs in _STOPWORD_LANGUAGES.items()
                               if any(lang != "en" for lang in langs))
_PLAIN_STOPWORDS = {lang: frozenset(map(plain, words)) for lang, words in _STOPWORDS.items()
                    if lang != "en"}


def _native_differs(a: frozenset[str], b: frozenset[str]) -> bool:
    """In another language than English, a word that says something on one side that no
    word on the other shares a stem with ("Mi número fue cancelado, ¿qué hago?" /
    "Conservé mi número, ¿qué hago?", "Kann ich vor dem Check-in bezahlen?" / "... nach
    ..."): the guard's word lists do not see a direction, an action or a swapped thing
    there, so every such word must be the other side's too, in another form ("cancelo" /
    "cancelar", "kündige" / "kündigen", "setze ... zurück" / "zurücksetzen")."""
    only_a, only_b = a - b, b - a
    if len(only_a) * len(only_b) > _MAX_STEM_PAIRS:
        return True  # reworded throughout: no word can vouch for the others (bounded)
    return any(not any(_one_stem(x, y) for y in other)
               for one, other in ((only_a, b), (only_b, a)) for x in one)


def _stems_as_one(a: tuple[str, ...], b: tuple[str, ...], only_a: frozenset[str],
                  only_b: frozenset[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """`b`'s words in another form of a word only `a` has, as `a`'s ("¿Cómo exporto mis
    contactos?" / "¿Cómo puedo exportar mis contactos?"): the word checks then see the
    frame (guard_native) and not a word swapped."""
    if not only_a or not only_b or len(only_a) * len(only_b) > _MAX_STEM_PAIRS:
        return a, b
    same = {y: x for y in only_b for x in sorted(only_a, reverse=True) if _one_stem(x, y)}
    if not same:
        return a, b
    out: list[str] = []
    for t in b:  # a verb split in two is one word ("setze ... zurück": "zurücksetzen")
        if t not in same or same[t] not in out:
            out.append(same.get(t, t))
    return a, tuple(out)


#: The most pairs of words, one only each side has, `_stems_as_one` compares (a long
#: question reworded throughout is no other form of the other anyway).
_MAX_STEM_PAIRS = 64


#: Prefixes that undo or redo a word ("desactivar", "désactiver", "deaktivieren",
#: "disattivare", "reactivar", "entsperren", "unblock"): no other form of it.
_UNDOING = ("des", "de", "dis", "re", "ent", "un", "in", "im", "non", "anti")


def _one_stem(x: str, y: str) -> bool:
    """One word in another form: a common start all but the shorter's last letter long
    (four letters at least), or one inside the other (five letters at least) after no
    prefix that undoes it (`_UNDOING`: "activo" / "desactivo" are two words)."""
    short, long = sorted((x, y), key=len)
    if len(short) >= 5 and short in long and not long.startswith(_UNDOING, 0, long.find(
            short) + 1):
        return True
    common = next((i for i, (p, q) in enumerate(zip(short, long, strict=False)) if p != q),
                  len(short))
    return common >= max(4, len(short) - 1)


#: Counts in words, read as numbers where they count something: "one" only before a
#: word it counts (not "which one is", "one of", "no one", "one another").
_COUNTS = {"one": "1", "single": "1", "two": "2", "dual": "2", "both": "2", "twice": "2",
           "double": "2", "pair of": "2", "three": "3", "triple": "3", "four": "4",
           "five": "5", "six": "6", "seven": "7", "eight": "8", "nine": "9", "ten": "10",
           "eleven": "11", "twelve": "12", "dozen": "12"}
#: A count and a half ("one and a half times", "time and a half"), and a half alone.
_HALVES = {"time": "1", **{w: str(i) for i, w in enumerate(
    "one two three four five six seven eight nine ten eleven twelve".split(), 1)}}
_COUNT_WORD = re.compile(
    r"(?<![\w-])(" + "|".join(
        ["(?:" + "|".join(_HALVES) + r")\s+and\s+a\s+half", "half",
         "(?<!which )(?<!no )(?<!any )(?<!every )(?<!this )(?<!that )(?<!the )"
         "(?<!each )(?<!some )(?<!than )one(?=\\s+(?!of\\b|another\\b|is\\b|are\\b|was\\b|or\\b|"
         "and\\b|more\\b)[a-z])"]
        + [w for w in _COUNTS if w != "one"]) + r")(?![\w-])", re.IGNORECASE)


_COUNT_WORD_ASCII = re.compile(_COUNT_WORD.pattern)


def _counts(text: str) -> tuple[str, ...]:
    """Counts in words, in order ("one extra user" / "two extra users", "a single
    monitor" / "dual monitors"): compared only where both questions hold some (an idiom,
    "in one place", "a one year plan", has its paraphrase without one)."""
    pattern = _COUNT_WORD
    if text.isascii():  # (lowered, without IGNORECASE: the same matches, faster)
        text, pattern = text.lower(), _COUNT_WORD_ASCII
    return tuple(_count(m.group(1).lower()) for m in pattern.finditer(text))


def _count(said: str) -> str:
    """A count in words as a number ("twice": "2", "one and a half": "1.5", "half": "0.5")."""
    if said == "half":
        return "0.5"
    if said.endswith("half"):
        return _HALVES[said.split()[0]] + ".5"
    return _COUNTS.get(said, said)


def _number(n: str) -> str:
    """A number as its value reads: "1,000" is 1000, "1,5" is 1.5 (not 15), a minus sign
    (U+2212) as "-"."""
    n = n.replace("\u2212", "-")
    digits = n.lstrip("-")
    if "," in digits:
        digits = digits.replace(",", "") if _THOUSANDS.fullmatch(digits) else digits.replace(
            ",", ".")
    return ("-" if n.startswith("-") else "") + digits


#: Numbers spelled in words, read as their digits where they count or measure a thing:
#: "two bags" and "2 bags", "twenty dollars" and "$20", "three pm" and "3 pm", "a
#: hundred minutes" and "100 minutes": before a plural or a unit within two words, or
#: last. Not "one" ("in one place", "a one time payment"), nor a word that names a kind
#: ("two factor authentication"), nor "N times" (`_counts` reads those, and "twice",
#: "double", "both": compared only where both questions hold some).
_UNITS_SPELLED = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen".split())}
_TENS_SPELLED = {w: 10 * i for i, w in enumerate(
    "twenty thirty forty fifty sixty seventy eighty ninety".split(), 2)}
_SCALES_SPELLED = {"hundred": 100, "thousand": 1000, "million": 1000000}
_SPELLED_WORD = "|".join([*_UNITS_SPELLED, *_TENS_SPELLED, *_SCALES_SPELLED])
# At most 16 words after the first (a number spelled longer is none anyone asks): each
# start ran on through every word after it, so a question of them each followed by a
# hyphen ("two- two- ...": none ends one) cost its length squared.
_SPELLED = re.compile(rf"(?<![\w-])(?:{_SPELLED_WORD})(?:[\s-]+(?:and[\s-]+)?"
                      rf"(?:{_SPELLED_WORD})){{0,16}}(?![\w-])", re.IGNORECASE)
# (a cheap first look for one: most questions spell none)
_HAS_SPELLED = re.compile(r"\b(?:t(?:wo|hree|en|we(?:lve|nt)|hirt|hous)|f(?:our|ive|ift|ort)|"
                          r"s(?:ix|even)|e(?:ight|leven)|nine|hundred|million|zero)",
                          re.IGNORECASE)
# What a spelled number counts or measures: a plural or a unit in the next two words
# (one of them a `_TOKEN`-like word), or nothing (the question's end).
_COUNTED = re.compile(r"\s*(?:[^\w\s]*\s*$|(?:[\w'-]+\s+)?(?:[a-z'-]{2,}[^s\W]s|"
                      r"[ap]\.?m\b|percent|per\s+cent)\b)", re.IGNORECASE)


def _spelled(text: str) -> list[tuple[int, int, str]]:
    """The numbers spelled in words that count or measure a thing, with where each
    starts and ends (`_SPELLED`)."""
    out = []
    for m in _SPELLED.finditer(text):
        words = re.findall(r"[a-z]+", m.group(0).lower())
        rest = text[m.end():]
        if words == ["one"] or not _COUNTED.match(rest) or re.match(
                r"\s+times?\b", rest, re.IGNORECASE):
            continue
        total = current = 0
        for w in words:
            if w in _SCALES_SPELLED:
                if _SCALES_SPELLED[w] == 100:
                    current = max(current, 1) * 100
                else:
                    total += max(current, 1) * _SCALES_SPELLED[w]
                    current = 0
            elif w != "and":
                current += _UNITS_SPELLED.get(w, 0) + _TENS_SPELLED.get(w, 0)
        out.append((m.start(), m.end(), str(total + current)))
    return out


def _numbers(text: str) -> tuple[str, ...]:
    """The numbers in order (with a sign written on one; spelled ones as their digits:
    `_SPELLED`), and after them the operators between two of them, if any ("7 + 5" and
    "7 plus 5" have the same numbers and operator; "7 - 5" does not)."""
    if not text.isascii() and _HAS_SCRIPT_DIGITS.search(text):
        text = text.translate(_SCRIPT_DIGITS)
    if _HAS_SPELLED.search(text):
        numbers = tuple(n for _, n in sorted(
            [(m.start(), _number(m.group(0))) for m in _NUMBER.finditer(text)]
            + [(start, n) for start, _, n in _spelled(text)]))
    else:
        numbers = tuple(_number(n) for n in _NUMBER.findall(text))
    if len(numbers) < 2:
        return numbers
    ops = [(m.group(1) or m.group(2)).lower() for m in _OPERATOR.finditer(text)]
    return numbers + tuple(_SIGN.get(op, op) for op in ops)


def _instructions(patterns: dict[str, re.Pattern[str]], seen: str) -> frozenset[str]:
    """Each instruction's kind, and for the kinds in `_PHRASED` what it says, in a
    canonical form ("length:1 sentence", "audience:5 year old", "language:french")."""
    if not (_ANY_INSTRUCTION_ASCII if patterns is _INSTRUCTIONS_ASCII
            else _ANY_INSTRUCTION).search(seen):
        return frozenset()  # (most questions: one pass, not one a kind)
    out = set()
    for kind, p in patterns.items():
        if kind not in _PHRASED:
            if p.search(seen):
                out.add(kind)
            continue
        for m in p.finditer(seen):
            if kind in _AFTER_VERB and not _ANSWER_VERB.search(
                    _SENTENCE_END.split(seen[:m.start()])[-1]):
                continue
            out.add(f"{kind}:{_canonical_phrase(m.group(0))}")
    return frozenset(out)


def _canonical_phrase(phrase: str) -> str:
    """An instruction's words, lowered, with number words as digits ("a" before a unit
    as 1), plurals and "-ly" dropped, a few synonyms as one, and leading prepositions and
    articles left out: "in a sentence" and "in one sentence", "briefly", "short" and
    "concise", "summarise" and "summary", "for kids" and "for children" read alike."""
    words = [_NUMBER_WORDS.get(w, w) for w in re.findall(r"[a-z0-9']+", phrase.lower())]
    words = ["1" if w in ("a", "an") and i + 1 < len(words) and words[i + 1] in _UNITS
             else _SAME.get(w, w) for i, w in enumerate(words)]
    while len(words) > 1 and words[0] in _LEAD:
        words.pop(0)
    out = []
    for w in words:
        if w.startswith("summar"):
            w = "summar"
        elif len(w) > 5 and w.endswith("ly"):
            w = w[:-2]
        elif len(w) > 3 and w.endswith("s") and not w.endswith("ss"):
            w = w[:-1]
        out.append(w)
    return " ".join(out)


def _conflict(a: tuple[tuple[str, str], ...], b: tuple[tuple[str, str], ...]) -> bool:
    """Opposite signs within a family both sides mention, in order; a sign said again
    in a row is one ("Can I pay using Apple Pay?" / "Do you accept Apple Pay?")."""
    for fam in {f for f, _ in a} & {f for f, _ in b}:
        if _signs(a, fam) != _signs(b, fam):
            return True
    return False


def _signs(directions: tuple[tuple[str, str], ...], fam: str) -> list[str]:
    signs = [s for f, s in directions if f == fam]
    return [s for i, s in enumerate(signs) if i == 0 or signs[i - 1] != s]


def _reversed(a: frozenset[str], b: frozenset[str]) -> bool:
    """A word on one side is the other side's word with a reversing prefix."""
    for x, y in ((a - b, b), (b - a, a)):
        for w in x:
            for p in _REVERSING:
                if w.startswith(p) and len(w) - len(p) >= 3 and w[len(p):] in y:
                    return True
    return False


def _focus_differs(a: frozenset[str], b: frozenset[str]) -> bool:
    return bool((a ^ b) & _ONE_SIDED_FOCUS) or bool(a and b and a != b)


#: A question that asks how the asker does a thing ("How do I verify my identity?",
#: "how can we ..."), or how a thing of one's may be put in a state, its doer unsaid
#: ("How can my order be cancelled?"): the steps (`_reason_and_steps`). ("How could my
#: card be blocked?" may ask why: only "can" and "may" there.)
_HOW_TO = re.compile(r"\bhow\s++(?:(?:do|can|could|should|would|shall)\s++(?:i|we)\b|"
                     r"(?:can|may)\s++(?:my|our)\s++(?:[a-z'-]++\s++){1,3}?(?:be|get)\s++"
                     r"[a-z]+(?:ed|en)\b)")


#: Words that name when a thing is so (`_state_or_future`): a day, a part of one, a
#: season, a holiday.
_WHEN = frozenset((*_PERIODS, "today", "tonight", "tomorrow", "yesterday", "now", "holiday",
                   "holidays", "christmas", "easter", "weekends", "january", "february",
                   "march", "april", "may", "june", "july", "august", "september",
                   "october", "november", "december"))


def _state_or_future(a: Signature, b: Signature) -> bool:
    """One asks whether a thing is in a state now, the other whether it will be put in
    it ("Is my account frozen?" / "Will my account be frozen?", "Has my refund been
    processed?" / "Will my refund be processed?"): a state and an act still to come. Not
    where both name when ("Is the bank closed on Friday?" / "Will the bank be closed on
    Friday?": one question, the present standing for the day named), nor where both
    set a condition or a habit ("Is my account locked if I enter the wrong PIN?" / "Will
    my account be locked if ...?", "Is my subscription renewed automatically?" / "Will
    ... be renewed automatically?": the present is what happens each time)."""
    if {a.tense, b.tense} != {"", "future"}:
        return False
    now = a if a.tense == "" else b
    if not now.state:
        return False
    return not all(x.numbers or not _WHEN.isdisjoint(x.tokens) for x in (a, b)) and not all(
        not _CONDITION.isdisjoint(x.tokens) for x in (a, b))


#: Words that set a condition or say what happens each time (`_state_or_future`).
_CONDITION = frozenset(("if", "when", "whenever", "once", "unless", "after",
                        "automatically", "always", "usually", "normally", "immediately",
                        "instantly", "same", "every", "each"))


def _owned_by_of(x: Signature, other: tuple[str, ...]) -> tuple[str, ...]:
    """`x`'s owners but a noun's whose "N's Y" the other side says as "Y of N" ("a Docker
    container's logs" / "the logs of a Docker container", "the app's language" / "the
    language of the app"): one thing said two ways, not a third party's."""
    t = x.tokens
    kept = []
    for owner in x.owners:
        said = False
        for k in range(len(t) - 2):
            if t[k] == owner and t[k + 1] == "s":
                owned = t[k + 2]
                said = any(other[m] == owned and other[m + 1] == "of"
                           and owner in other[m + 2:m + 5] for m in range(len(other) - 2))
                break
        if not said:
            kept.append(owner)
    return tuple(kept)


def _reason_and_steps(a: Signature, b: Signature, qa: str, qb: str) -> bool:
    """One side asks why (a reason), the other how the asker does the thing (the steps):
    "Why do I need to verify my identity?" / "How do I verify my identity?" (0.84 with
    MiniLM); the frame round the question word ("need to", "have to") hides the swap
    from the one-slot check. (A "why" against a "what can I do" or a statement is how
    paraphrases read: "Why is my internet so slow?" / "What can I do about slow internet
    speeds?")"""
    return any("reason" in x.focus and "reason" not in y.focus and _HOW_TO.search(qy)
               is not None and _HOW_TO.search(qx) is None
               for x, y, qx, qy in ((a, b, qa, qb), (b, a, qb, qa)))


#: The words a yes/no question opens with ("Can my order be cancelled?", "Is my data
#: encrypted?", "Did the payment go through?").
_YES_NO = frozenset("can could may might must shall should will would do does did am is "
                    "are was were has have had".split())


def _whether_and_why(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """One side asks whether a thing is so, can be or was (it opens with an auxiliary),
    the other why it is ("Can my order be cancelled?" / "Why was my order cancelled?",
    "Should I update the app?" / "Why should I update the app?"): the question word is
    all the two differ in, often with the tense and the frame round it, and an
    embedding scores them alike (0.79-0.89). (A "why" against a statement or a "what"
    is how paraphrases read: "Why can't I log in?" / "My login isn't working".)"""
    for x, y in ((a, b), (b, a)):
        if "why" in x and "why" not in y and y and y[0] in _YES_NO:
            return True
    return False


Op = tuple[str, int, int, int, int]


def _edited(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """Whether one question is the other with a small edit that changes what it asks
    (one diff of the two, in one order whichever side asks: the same answer):
    - one slot changed: one span of 1-2 words replaced, not all scaffold ("the laptop" /
      "the phone");
    - one span added that says something ("Tell me a joke" / "Please tell me a joke
      about cats", "a recipe" / "a vegan recipe"), edits of words that say nothing
      (`_FILLER`: "please", "can you", greetings, thanks) aside.
    - a modifier that narrows the thing, the frame reworded round it (`_narrowed`).
    Both at once are not refused: a synonym and an added word is how most paraphrases
    read ("verify my email" / "confirm my email address")."""
    if a == b:
        return False
    if max(len(a), len(b)) > _MAX_DIFFED:
        return True  # too long to diff in bounded time: refused, as an edit would be
    a, b = _perfect_as_state(a), _perfect_as_state(b)
    if (len(a), a) > (len(b), b):
        a, b = b, a
    ops: list[Op] = [op for op in difflib.SequenceMatcher(
        a=a, b=b, autojunk=False).get_opcodes() if op[0] != "equal"]
    if len(ops) == 1 and _slot(a, b, ops[0], _SCAFFOLD):
        return True
    if (len(ops) > 1 and _content_slot(a, b)) or (ops and _narrowed(a, b)):
        return True
    said = [op for op in ops if not set(a[op[1]:op[2]] + b[op[3]:op[4]]) <= _FILLER
            and not _restated(b, op)]
    if len(said) == 1 and said[0][0] != "replace":
        return _span_added(a, b, said[0])
    return False


_DETERMINERS = frozenset("a an the my your our his her their this that".split())
#: The most words a side of `_edited` diffs: difflib's matcher costs a text of repeated
#: words about the cube of its length ("is i" 400 times against "am i" 400 times: 3.5 s
#: on the request's path), 48 words at most a few milliseconds. A longer question is
#: refused unless its words are the other side's (the labelled sets' longest has 33).
_MAX_DIFFED = 48


def _content_slot(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """One modifier changed among the words that say something, the frame reworded
    round it ("How do I update my billing address?" / "How can I update my shipping
    address?", "Can I change my delivery address?" / "Is it possible to change my
    billing address?", "Can I get a student discount?" / "Is it possible to get a senior
    discount?"): the one-slot check on the question without its filler (a noun in
    either number), where the slot opens a noun phrase (after a determiner: "my", "the",
    "a") and sits right before the word it qualifies, on both sides. (A verb swapped
    with the frame is how paraphrases read: "Do I need a referral to see a
    specialist?" / "Is a referral required for a specialist?", "How do I contact
    support?" / "How can I reach support?", "Did my payment go through?" / "Has my
    payment gone through?".)"""
    if (len(a), a) > (len(b), b):
        a, b = b, a
    ia = [i for i, t in enumerate(a) if t not in _FILLER]
    ib = [i for i, t in enumerate(b) if t not in _FILLER]
    ca = tuple(_singular(a[i]) for i in ia)
    cb = tuple(_singular(b[i]) for i in ib)
    ops = [op for op in difflib.SequenceMatcher(a=ca, b=cb, autojunk=False).get_opcodes()
           if op[0] != "equal"]
    if len(ops) != 1:
        return False
    kind, i1, i2, j1, j2 = ops[0]
    if kind != "replace" or i2 - i1 > 2 or j2 - j1 > 2 or i2 == len(ca) or j2 == len(cb):
        return False
    return (ia[i1] > 0 and ib[j1] > 0 and a[ia[i1] - 1] in _DETERMINERS
            and b[ib[j1] - 1] in _DETERMINERS  # it opens a noun phrase
            and ia[i2] == ia[i2 - 1] + 1 and ib[j2] == ib[j2 - 1] + 1)  # before its head


def _narrowed(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """One side narrows the thing asked about with a modifier, the frame and the verb
    that fetches it reworded round it ("Can I get a paper invoice?" / "Where can I find
    my invoice?", "Can I get a printed receipt?" / "Where can I find my receipt?"): the
    words that say something, their actions left out (guard_actions; not a participle,
    which qualifies: "printed statements"), are the other side's with 1-2 words added
    right after a determiner and right before the word they qualify. Not where both
    name an action of one class: a synonym and an added word is how paraphrases read
    ("How do I file a claim?" / "How can I submit an insurance claim?"); nor "new",
    "current": they narrow nothing ("change my PIN" / "set a new PIN")."""
    if {ACTION[t] for t in a if t in ACTION} & {ACTION[t] for t in b if t in ACTION}:
        return False
    a, b = _without_copy(a), _without_copy(b)
    if (len(a), a) > (len(b), b):
        a, b = b, a
    ia = [i for i, t in enumerate(a) if _says(t)]
    ib = [i for i, t in enumerate(b) if _says(t)]
    ca = [_singular(a[i]) for i in ia]
    cb = [_singular(b[i]) for i in ib]
    ops = [op for op in difflib.SequenceMatcher(a=ca, b=cb, autojunk=False).get_opcodes()
           if op[0] != "equal"]
    if len(ops) != 1 or not ca:
        return False
    kind, i1, i2, j1, j2 = ops[0]
    if kind == "delete":
        a, b, ia, ib, ca, cb, j1, j2 = b, a, ib, ia, cb, ca, i1, i2
    elif kind != "insert":
        return False
    if j2 - j1 > 2 or j2 == len(cb):
        return False
    first, head = ib[j1], ib[j2]
    return (first > 0 and b[first - 1] in _DETERMINERS
            and ib[j2 - 1] + 1 == head  # right before the word it qualifies
            and all(ib[k] + 1 == ib[k + 1] for k in range(j1, j2 - 1)))


def _without_copy(tokens: tuple[str, ...]) -> tuple[str, ...]:
    """The tokens without "copy of my" before a thing ("a paper copy of my contract" reads
    as "a paper contract", "a copy of my invoice" as "a invoice"): a copy asks for the
    thing."""
    out = list(tokens)
    for i in range(len(out) - 3, -1, -1):
        if out[i] in _COPY and out[i + 1] == "of" and out[i + 2] in _DETERMINERS:
            del out[i:i + 3]
    return tuple(out)


_COPY = frozenset(("copy", "copies"))


def _says(token: str) -> bool:
    """A word that says something about the thing asked for: no filler, no action verb
    (a participle qualifies: "printed")."""
    return token not in _FILLER and token not in _UNNARROWING and not (
        token in ACTION and not token.endswith("ed"))


_UNNARROWING = frozenset(("new", "current", "existing"))


def _one_slot_changed(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """The same words but one span of 1-2 words replaced (bench/embedders.py's feature)."""
    ops = [op for op in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes()
           if op[0] != "equal"]
    return len(ops) == 1 and _slot(a, b, ops[0], _SCAFFOLD)


def _slot(a: tuple[str, ...], b: tuple[str, ...], op: Op, empty: frozenset[str]) -> bool:
    """`op` replaces 1-2 words by 1-2 others, not all of them `empty` (unless one small
    word of a kind that says something becomes another of its kind: `_SWAPS`), at least
    two words kept."""
    kind, i1, i2, j1, j2 = op
    if kind == "replace" and _bare_pair(a, b, i1, j1):
        return True  # "refund policy?" / "refund status?"
    if kind != "replace" or i2 - i1 > 2 or j2 - j1 > 2 or len(a) - (i2 - i1) < 2:
        return False
    if i2 - i1 == j2 - j1 == 1 and _SWAPS.get(a[i1], a[i1]) != _SWAPS.get(b[j1], b[j1]) and (
            a[i1] in _SWAPS and b[j1] in _SWAPS):
        return True  # "How do bees ..." / "Why do bees ...", "Should I ..." / "Can I ..."
    if i2 - i1 == j2 - j1 == 1 and (_subject_swapped(a, b, i1, j1)
                                     or _clause_subject_swapped(a, b, i1, j1)):
        return True  # "Can I see my orders?" / "Can you see my orders?"
    if i2 - i1 == j2 - j1 == 1 and _misspelt(a[i1], b[j1]):
        return False  # "How do I tranfer money?", "my online banking pwd"
    if i2 - i1 == j2 - j1 == 1 and (_same_act(a, b, i1, j1) or _booked(a, b, i1, j1)):
        return False  # "How do I activate roaming?" / "How do I turn on roaming?"
    if i1 > 0 and j1 > 0 and a[i1 - 1] not in _PERSONS and b[j1 - 1] not in _PERSONS and (
            _passive_of(a[i1:i2], b[j1:j2]) or _passive_of(b[j1:j2], a[i1:i2])):
        return False  # "Will my order ship today?" / "Will my order be shipped today?"
    return not (set(a[i1:i2]) <= empty and set(b[j1:j2]) <= empty)


#: Subjects whose active and passive swap the roles ("Will I pay?" / "Will I be paid?"):
#: a thing's do not ("Will my order ship?" / "... be shipped?").
_PERSONS = frozenset("i we you they he she someone".split())
#: The "be" or "get" of a passive (`_passive_of`).
_PASSIVE_AUX = frozenset("be been being get gets got".split())


#: Verbs whose subject undergoes the act in the active too, as a thing does ("my order
#: ships", "my subscription renews", "my payment posts"): their active and passive are
#: one question (`_passive_of`). Not a verb a person does ("Will the seller pay?" /
#: "Will the seller be paid?", "Will the client call?" / "... be called?"): its subject
#: may be a person named by a noun, and the roles swap.
_UNDERGONE = ("ship", "dispatch", "deliver", "renew", "update", "upgrade", "sync",
              "install", "download", "upload", "load", "reload", "refresh", "restart",
              "reboot", "reset", "close", "open", "lock", "unlock", "process", "post",
              "clear", "settle", "complete", "save", "activate", "print")


def _passive_of(verb: tuple[str, ...], passive: tuple[str, ...]) -> bool:
    """`passive` is `verb` said in the passive, its doer unsaid: "ship" / "be shipped"
    ("Will my order ship today?" / "Will my order be shipped today?"), or a verb of one
    act with it (guard_actions.SAME_ACT: "ship" / "be dispatched"); `verb` one a thing
    undergoes (`_UNDERGONE`)."""
    return (len(verb) == 1 and len(passive) == 2 and passive[0] in _PASSIVE_AUX
            and passive[1] != verb[0] and (_verb_forms(verb[0], passive[1]) or (
                verb[0] in SAME_ACT and SAME_ACT.get(passive[1]) == SAME_ACT[verb[0]] + "ed"))
            and any(_verb_forms(verb[0], v) for v in _UNDERGONE))


#: A question in the perfect passive opens "has" / "have" (`_perfect_as_state`).
_PERFECT = {"has": "is", "have": "are"}


#: Participles that leave a thing in a lasting state (`_perfect_as_state`): "Has my
#: account been frozen?" asks what "Is my account frozen?" does. Not a practice's ("Is my
#: data sold?" asks whether it is done at all, "Has my data been sold?" whether it was;
#: "shared", "tracked", "recorded", "reported", "charged").
_RESULTS = frozenset((
    "frozen", "locked", "unlocked", "blocked", "unblocked", "closed", "opened",
    "cancelled", "canceled", "suspended", "verified", "approved", "activated",
    "deactivated", "enabled", "disabled", "received", "processed", "delivered", "shipped",
    "dispatched", "confirmed", "paid", "refunded", "completed", "submitted", "accepted",
    "rejected", "declined", "deleted", "removed", "updated", "upgraded", "renewed",
    "restored", "issued", "sent", "posted", "cleared", "settled", "resolved", "fixed",
    "booked", "reserved", "signed", "installed", "published", "filed", "registered",
    "banned", "terminated", "expired", "reset"))


def _perfect_as_state(tokens: tuple[str, ...]) -> tuple[str, ...]:
    """A yes/no question in the perfect passive as the state it asks ("Has my account been
    frozen?": "Is my account frozen?"): one question (the edit check's view only), for a
    participle of a lasting state (`_RESULTS`)."""
    if tokens[:1] and tokens[0] in _PERFECT and "been" in tokens:
        k = tokens.index("been")
        if k + 1 < len(tokens) and tokens[k + 1] in _RESULTS:
            return (_PERFECT[tokens[0]], *tokens[1:k], *tokens[k + 1:])
    return tokens


def _same_act(a: tuple[str, ...], b: tuple[str, ...], i: int, j: int) -> bool:
    """Two verbs of one act (`SAME_ACT`), both said as verbs: as nouns, after a
    determiner (`nouns`), they name two things ("a buy order" / "a purchase order")."""
    return (SAME_ACT.get(a[i], a[i]) == SAME_ACT.get(b[j], b[j])
            and not nouns(a)[i].startswith(NOUN) and not nouns(b)[j].startswith(NOUN))


#: Making an appointment or a reservation is booking one (`_booked`).
_BOOKED = {"make": "book", "makes": "books", "made": "booked", "making": "booking"}
_BOOKINGS = frozenset(("appointment", "appointments", "reservation", "reservations"))


def _booked(a: tuple[str, ...], b: tuple[str, ...], i: int, j: int) -> bool:
    """"make" swapped for "book" before an appointment or a reservation, its article
    between ("How do I make an appointment with a GP?" / "How do I book an appointment
    with a GP?"): one act. Read in the slot check only, so "make an appointment" /
    "make a payment" is still one slot changed."""
    x, y = sorted((a[i], b[j]))  # ("book...", "mak...")
    return (_BOOKED.get(y) == x and not set(a[i + 1:i + 3]).isdisjoint(_BOOKINGS)
            and not set(b[j + 1:j + 3]).isdisjoint(_BOOKINGS))


def _bare_pair(a: tuple[str, ...], b: tuple[str, ...], i: int, j: int) -> bool:
    """Two bare words each, one of them kept and the other swapped ("refund policy?" /
    "refund status?", "shipping cost?" / "shipping time?"): a short query is all slot,
    so the one word it swaps is what it asks (the slot check's two kept words would
    never see it). Not a filler word, a typo or a plural ("pwd reset" / "password
    reset", "refund policy" / "refund policies")."""
    return (len(a) == len(b) == 2 and not set(a + b) & _FILLER
            and _singular(a[i]) != _singular(b[j]) and not _misspelt(a[i], b[j]))


_VOWELS = frozenset("aeiouy")


def _known(word: str) -> bool:
    """A word one of the guard's lists holds (a direction, an action, a filler word)."""
    return word in _DIRECTION or word in ACTION or word in _FILLER or word in _SWAPS


def _misspelt(x: str, y: str) -> bool:
    """One word is the other typed with a slip or shortened: a letter inside it left out
    or two inside it swapped, in a word of seven letters or more, the slip no word the
    guard knows ("tranfer", "acount", "recieve"; not a last letter: "refund" /
    "refunds"; nor a word with a reversing prefix: "unlock" / "unblock"; "lunch" /
    "launch" are too short to tell), or
    its first letter and consonants kept, its last among them ("pwd" for "password",
    "acct", "mgr", "pmt"; not a prefix: "car" / "card", nor a word with a vowel after
    its first letter: "bat" / "basket")."""
    short, long = sorted((x, y), key=len)
    if not short.isalpha() or not long.isalpha() or short[0] != long[0] or long.startswith(
            _REVERSING):
        return False
    if len(long) >= 7 and short[-1] == long[-1] and not (
            _known(short) and _known(long)):
        if len(short) == len(long) - 1 and any(
                long[:i] + long[i + 1:] == short for i in range(1, len(long) - 1)):
            return True
        if len(short) == len(long) and any(
                short[i] == long[i + 1] and short[i + 1] == long[i]
                and short[:i] + short[i + 2:] == long[:i] + long[i + 2:]
                for i in range(1, len(long) - 2)):
            return True
    if 3 <= len(short) <= 4 and len(long) >= 6 and short[-1] == long[-1] and not (
            long.startswith(short)) and not set(short[1:]) & _VOWELS:
        rest = iter(long)
        return all(c in rest for c in short)
    return False


#: Auxiliaries that open a yes/no question: the pronoun after one is who acts.
_AUXILIARIES = frozenset(
    "can could may might must shall should will would do does did am are".split())
_SUBJECTS = frozenset(("i", "we", "you"))


def _subject_swapped(a: tuple[str, ...], b: tuple[str, ...], i: int, j: int) -> bool:
    """The subject of a yes/no question is another person: "Can I see my orders?" (may
    I) / "Can you see my orders?" (does the support see them), "Do I need a passport?"
    / "Do you need ...". After a bare "how" "you" is often anyone's ("How do I reset
    my password?" / "How do you reset ..."): not refused there, nor after another
    question word unless the side with "you" names the asker too."""
    x, y = a[i], b[j]
    if not (x in _SUBJECTS and y in _SUBJECTS and _PERSON[x] != _PERSON[y] and i >= 1
            and a[i - 1] in _AUXILIARIES):
        return False
    if all(t in _FILLER for t in a[:i - 1]) and not set(a[:i - 1]) & _ASKING:
        return True
    if not (all(t in _FILLER for t in a[:i - 1]) or (  # "How long do you ...?"
            i >= 3 and a[i - 3] in _ASKING and all(t in _FILLER for t in a[:i - 3]))):
        return False
    # After a question word, "you" is the other party where its side names the asker
    # too and the question word is not a bare "how" ("Why do you need my ID?" / "Why do I
    # need my ID?", "How long do you keep my documents?"; "How do you reset my
    # password?" is anyone's how-to).
    you = a if x == "you" else b
    return a[i - 2:i - 1] != ("how",) and bool(_FIRST_PERSON.intersection(you))


#: The asker named in a question: then "you" is the other party, not anyone.
_FIRST_PERSON = frozenset(("i", "me", "my", "mine", "we", "us", "our", "ours"))
#: Words after which a pronoun opens no clause of its own (an auxiliary's subject,
#: `_subject_swapped`'s; or the "you" of a question word's frame: "How do you ...").
_NOT_CLAUSE = _AUXILIARIES | _ASKING | frozenset(("is", "are", "was", "were", "if"))


def _clause_subject_swapped(a: tuple[str, ...], b: tuple[str, ...], i: int, j: int) -> bool:
    """The subject of a clause after a noun is another person, where the side with "you"
    names the asker too, so "you" is the other party ("Is there a reason you need my
    ID?" / "Is there a reason I need my ID?", "the way you store my data" / "the way I
    store my data"). Not after an auxiliary or a question word ("How do you reset my
    password?": anyone's "you"), nor after "if" (guard_roles.agents compares those)."""
    x, y = a[i], b[j]
    if not (x in _SUBJECTS and y in _SUBJECTS and _PERSON[x] != _PERSON[y]) or i < 1:
        return False
    you = a if x == "you" else b if y == "you" else ()
    return a[i - 1] not in _NOT_CLAUSE and bool(_FIRST_PERSON.intersection(you))


def _restated(b: tuple[str, ...], op: Op) -> bool:
    """`op` adds to the longer `b` one noun that restates the word before it."""
    kind, _, _, j1, j2 = op
    return kind == "insert" and j2 - j1 == 1 and j1 > 0 and (b[j1 - 1], b[j1]) in _RESTATED


def _span_added(a: tuple[str, ...], b: tuple[str, ...], op: Op) -> bool:
    """`op` adds (or drops) a span; at the start, only when the span is not a frame
    round a bare query ("How do I check ..." / "...")."""
    _, i1, i2, j1, j2 = op
    if len(a) < 2:
        return False
    if not any(t not in _FILLER for t in a[:i1]):
        return not set(a[i1:i2] + b[j1:j2]) & _ASKING
    return True


def _reordered(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """The same words that say something, in another order: "convert miles to
    kilometers" / "convert kilometers to miles", "Does the basic plan include the
    premium support?" with the two swapped, and nouns that swap their number with their
    place ("Can teachers see student grades?" / "Can students see teacher grades?").
    (The price: "cats and dogs" / "dogs and cats", "reset password" / "password reset"
    miss.)"""
    ca = [_singular(t) for t in a if t not in _FILLER]
    cb = [_singular(t) for t in b if t not in _FILLER]
    return ca != cb and len(ca) == len(cb) and sorted(ca) == sorted(cb) and not (
        _moved_verb(a, ca, cb) or _moved_verb(b, cb, ca)
        or _compound(a, b, ca, cb) or _compound(b, a, cb, ca))


#: The prepositions that say a noun compound's relation ("the date of my flight": "my
#: flight date"), and what may stand between them and the noun (`_compound`). Not "to",
#: "from", "into": a route ("miles to kilometers").
_OF = frozenset(("of", "for", "in", "at", "on"))
_OF_BETWEEN = _OF | _DETERMINERS
#: Nouns whose "N of X" counts or holds X, where "X N" names an N ("the number of
#: orders" / "the order number", "a glass of wine" / "a wine glass"): not a compound's
#: prepositional form (`_compound`).
_MEASURES = frozenset(("number", "numbers", "glass", "glasses", "cup", "cups", "bottle",
                       "bottles", "box", "boxes", "bag", "bags", "jar", "jars", "pack",
                       "packs", "packet", "packets", "pair", "pairs", "lot", "lots",
                       "bunch", "piece", "pieces", "couple"))


def _compound(a: tuple[str, ...], b: tuple[str, ...], ca: list[str], cb: list[str]) -> bool:
    """`a` says a noun compound ("my flight date", "a Python list", "my dentist
    appointment") that `b` says with a preposition ("the date of my flight", "a list in
    Python", "my appointment at the dentist"): the words that say something are the same
    but for two in a row swapped, right next to each other in `a`, with only a
    preposition of `_OF` and determiners between them in `b`."""
    swapped = [i for i in range(len(ca)) if ca[i] != cb[i]]
    if len(swapped) != 2 or swapped[1] != swapped[0] + 1:
        return False
    i = swapped[0]
    if not (ca[i] == cb[i + 1] and ca[i + 1] == cb[i]):
        return False
    ia = [k for k, t in enumerate(a) if t not in _FILLER]
    ib = [k for k, t in enumerate(b) if t not in _FILLER]
    if ia[i + 1] != ia[i] + 1:
        return False
    between = b[ib[i] + 1:ib[i + 1]]
    if "of" in between and b[ib[i]] in _MEASURES:
        return False  # "the number of orders" / "the order number"
    return bool(between) and not _OF.isdisjoint(between) and set(between) <= _OF_BETWEEN


_TO_BE = frozenset("be been being is are was were get gets got gotten".split())


def _doers_differ(a: str, b: str, ta: tuple[str, ...], tb: tuple[str, ...],
                  asked: str = "") -> bool:
    """The asker does the thing on one side and a third party on the other
    (guard_roles.doer), unless one side says it in the passive, its doer unsaid, and is
    the other in other words (`_voice_only`: "Can my order be cancelled?" / "Can I
    cancel my order?"). A question whether a thing is in the state an act left it in
    ("Is my data shared?", "Is my order cancelled?") is not the asker's doing of the act
    ("Do I share my data?", "Can I cancel my order?"): those differ; a third party's
    doing of it ("Does the app share my data?") does not. Nor is it whether the thing may
    be put in that state ("Can my order be cancelled?": a passive after a modal,
    `_POSSIBLE`), a possibility, not the thing's state. Nor is it the act asked of
    "you" or ordered (`_asks_act`: "Can you lock my account?", "Block my card"; "Do you
    share my data?" asks what a third party does, as above)."""
    if {a, b} == {"state", "self"}:
        return True
    if {a, b} == {"state", ""} and asked and _asks_act(tb if a == "state" else ta, asked):
        return True  # "Is my card blocked?" / "Block my card"
    if a == b == "" and any((p := _bare_state(x)) and _asks_act(y, p)
                            for x, y in ((ta, tb), (tb, ta))):
        return True  # "Is autopay enabled?" / "Enable autopay"
    if "state" in (a, b) and any(kind.startswith("passive-") and t[:1] and t[0] in _POSSIBLE
                                 for kind, t in ((a, ta), (b, tb))):
        return True  # "Is my order cancelled?" / "Can my order be cancelled?"
    kinds = {a.removeprefix("passive-"), b.removeprefix("passive-")}
    if kinds != {"self", "other"}:
        return False
    passives = [t for kind, t in ((a, ta), (b, tb)) if kind.startswith("passive-")]
    return not (passives and all(_own_acts(t) for t in passives) and _voice_only(ta, tb))


#: A yes/no question whether a thing of no owner is in a state (`_bare_state`).
_BARE_STATE = re.compile(r"(?:[a-z]+ed|[a-z]{3,}en|" + IRREGULAR_PARTICIPLES + r")")
_NOT_BARE_STATE = frozenset(("required", "needed", "allowed", "permitted", "included",
                             "accepted", "covered", "supported", "expected", "supposed"))


def _bare_state(tokens: tuple[str, ...]) -> str:
    """The participle a short question asks a thing of no owner to be in ("Is autopay
    enabled?": "enabled"; guard_roles.state reads only "my" thing's), or "". Not what is
    asked of or allowed the asker ("Is a deposit required?")."""
    if not 3 <= len(tokens) <= 5 or tokens[0] not in ("is", "are", "was", "were"):
        return ""
    last = tokens[-1]
    return last if _BARE_STATE.fullmatch(last) and last not in _NOT_BARE_STATE else ""


#: Subjects that make "is X <participle>" no question about a thing's state.
_NOT_THING = frozenset("i you we they he she it there here what which who".split())
#: Who does an act in its own frame ("how do I enable", "how to enable").
_OWN_ACT = frozenset(("i", "we", "to"))


def _state_and_own_act(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """One asks whether a thing is in a state, its subject one or two words and no
    owner's ("Is SSO enabled for my organisation?", "Are backups encrypted?"), the other
    how the asker does the act that leaves it so ("How do I enable SSO for my
    organisation?", "How to encrypt backups"): a state and a how-to. (A thing of one's,
    "Is my card blocked?", is guard_roles.state's, `_doers_differ`; a short question
    against the act ordered, `_bare_state`'s.)"""
    return any((p := _state_of_thing(x)) and _does_act(y, p) for x, y in ((a, b), (b, a)))


def _state_of_thing(tokens: tuple[str, ...]) -> str:
    if len(tokens) < 3 or tokens[0] not in ("is", "are", "was", "were") or (
            tokens[1] in _NOT_THING or tokens[1] in _DETERMINERS):
        return ""
    for k in (2, 3):
        if k < len(tokens) and _BARE_STATE.fullmatch(tokens[k]):
            return tokens[k] if tokens[k] not in _NOT_BARE_STATE else ""
    return ""


def _does_act(tokens: tuple[str, ...], asked: str) -> bool:
    return any(tokens[k] in _OWN_ACT and tokens[k + 1] != asked
               and _verb_forms(asked, tokens[k + 1]) for k in range(len(tokens) - 1))


#: Words before a participle that qualifies a thing ("my stashed changes").
_QUALIFIED = frozenset(("a", "an", "the", "my", "your", "our", "their", "this", "that"))


def _act_and_its_result(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """One side asks about an act ("How do I stash my changes?") and the other about
    another act on what that act left, its participle qualifying the thing ("How do I
    apply my stashed changes?", "How do I change a booked flight?"): the verb on one
    side only, its participle on the other only. Past `_MAX_DIFFED` words the edit
    check refuses the pair: nothing is tried here (each participle against each word)."""
    if max(len(a), len(b)) > _MAX_DIFFED:
        return False
    return any(_result_of(x, y) for x, y in ((a, b), (b, a)))


def _result_of(x: tuple[str, ...], y: tuple[str, ...]) -> bool:
    xs, ys = set(x), set(y)
    verbs = xs - ys
    for k in range(1, len(y) - 1):
        p = y[k]
        if y[k - 1] in _QUALIFIED and p not in xs and _BARE_STATE.fullmatch(p) and any(
                v != p and _verb_forms(p, v) for v in verbs):
            return True
    return False


#: A request of "you" (`_asks_act`): "Can you lock my account?".
_REQUESTS = frozenset(("can", "could", "would", "will"))


def _asks_act(tokens: tuple[str, ...], asked: str) -> bool:
    """`tokens` ask "you" to do, order or want the act whose participle `asked` is (its
    verb in another form): "Can you lock my account?", "Please block my card", "I want
    to block my card" against "Is my account locked?" (the act is no action class, so
    no other check tells them)."""
    t = tokens[1:] if tokens[:1] == ("please",) else tokens
    if len(t) > 2 and t[0] in _REQUESTS and t[1] == "you":
        t = t[2:]
    if t and t[0] != asked and _verb_forms(asked, t[0]):
        return True
    # ("I want to block my card", "I need to lock my account": the act wanted)
    return any(t[k] == "to" and t[k + 1] != asked and _verb_forms(asked, t[k + 1])
               for k in range(len(t) - 1))


#: Modals that open a passive asking whether a thing may be put in a state, not whether
#: it is in it (`_doers_differ`).
_POSSIBLE = frozenset(("can", "could", "may", "might", "must", "should"))
#: Action classes (guard_actions) of what others do to one's things: a passive of them,
#: its doer unsaid, asks whether someone can ("Can my phone be tracked?", "Can my
#: messages be read?", "Can my data be shared?"), not the asker's own act.
_OTHERS_DO = frozenset(("find", "read", "share"))


def _same_state(a: str, b: str) -> bool:
    """Two participles of one state ("cancelled" / "canceled", "cancelled" /
    "terminated": one action class, guard_actions; "shipped" / "dispatched": one act,
    SAME_ACT); "paused" / "cancelled" are two."""
    return (a == b or _verb_forms(a, b) or ACTION.get(a, a) == ACTION.get(b, b)
            or (a in SAME_ACT and SAME_ACT.get(b) == SAME_ACT[a]))


def _own_acts(tokens: tuple[str, ...]) -> bool:
    """The passive's verbs (each word after a "be" or a "get") are all actions the asker
    takes on their own thing ("cancelled", "paused", "reset", "frozen"): an action of
    guard_actions, and not one of `_OTHERS_DO`. A verb not listed ("hacked", "recorded",
    "monitored", "sold") may be anyone's: the voices then ask two things."""
    verbs = [t for i, t in enumerate(tokens[1:], 1) if tokens[i - 1] in _TO_BE
             and t not in _FILLER]
    return bool(verbs) and all(
        (cls := ACTION.get(v, ACTION.get(_PARTICIPLES.get(v, v)))) is not None
        and cls not in _OTHERS_DO for v in verbs)


def _voice_only(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """One side is the other in the passive, its doer unsaid: the same words that say
    something, the participle as a form of the other's verb ("Can my order be
    cancelled?" / "Can I cancel my order?", "if my account is frozen" / "if I freeze my
    account"); not another thing ("Can my subscription be paused?" / "Can I pause my
    membership?": the one-slot check does not see a slot moved by the voice)."""
    ca, cb = _content(a), _content(b)
    if len(ca) != len(cb):
        return False
    rest = list(cb)
    for x in ca:
        y = next((y for y in rest if y == x or _verb_forms(x, y)), None)
        if y is None:
            return False
        rest.remove(y)
    return True


def _verb_forms(x: str, y: str) -> bool:
    """Two forms of one verb: a regular inflection ("cancel" / "cancelled", "pause" /
    "paused", "skip" / "skipped") or an irregular participle ("frozen", "paid")."""
    x, y = _PARTICIPLES.get(x, x), _PARTICIPLES.get(y, y)
    return x == y or y in _inflections(x) or x in _inflections(y)


_PARTICIPLES = {"frozen": "freeze", "paid": "pay", "sent": "send", "sold": "sell",
                "bought": "buy", "kept": "keep", "held": "hold", "made": "make",
                "told": "tell", "lost": "lose", "given": "give", "taken": "take",
                "written": "write", "stolen": "steal", "chosen": "choose", "shown": "show",
                "seen": "see", "found": "find", "left": "leave"}


def _moved_verb(a: tuple[str, ...], ca: list[str], cb: list[str]) -> bool:
    """`a` says in the passive what the other side says in the active: the only word
    moved is the verb, after a "be" or a "get" in `a` ("Can my password be reset?" /
    "Can I reset my password?")."""
    moved = [_singular(a[i]) for i in range(1, len(a))
             if a[i - 1] in _TO_BE and a[i] not in _FILLER]
    return len(moved) == 1 and moved[0] in cb and [t for t in ca if t != moved[0]] == [
        t for t in cb if t != moved[0]]


def _content(tokens: tuple[str, ...]) -> list[str]:
    """The words that say something, a noun in either number."""
    return [_singular(t) for t in tokens if t not in _FILLER]


def _singular(word: str) -> str:
    """A plural noun without its "s"; not a word whose "s" is its own ("status",
    "bonus", "analysis", "address")."""
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith(
        ("ss", "us", "is")) else word


#: Marks a stored guard digest (an entry read from Redis without its question text).
DIGEST_MARK = "\x00guard:"
#: The gate of a stored question whose gate is not known (a digest from before gates):
#: questions of any gate may pass the guard with it (the digest decides).
ANY_GATE = "*"


def _strict(sig: Signature) -> tuple[object, ...]:
    return (sig.numbers, sig.negations, sig.names, tuple(sorted(sig.instructions)),
            sig.route, sig.directions, tuple(sorted(sig.focus)), *_added(sig),
            *((("tense", sig.tense),) if sig.tense else ()))


def _added(sig: Signature) -> tuple[object, ...]:
    """The features added after digests and gates were first kept: the layout, where
    there is one, and the language, where not English (English prose has neither: its
    digests and gates are as they were before these counted)."""
    return ((sig.layout,) if sig.layout else ()) + (
        (("language", sig.language),) if sig.language else ()) + (
        (("symbols", sig.symbols),) if sig.symbols else ())


def _strict_hash(sig: Signature) -> str:
    return hashlib.sha256(repr(_strict(sig)).encode()).hexdigest()


def _gate(sig: Signature) -> str:
    return hashlib.sha256(repr((
        sig.numbers, sig.negations, sig.names, tuple(sorted(sig.instructions)),
        "time" in sig.focus, "cost" in sig.focus, *_added(sig))).encode()).hexdigest()[:16]


def gate(text: str) -> str:
    """What two questions must share for the guard to let one answer the other: their
    numbers, negation count, names, added instructions, and whether they ask for a time
    or a cost (every check the guard makes by equality). A question whose gate no stored
    question has cannot hit, so it need not be embedded (store.py). `text`: a question or
    its `guard_digest`."""
    if text.startswith(DIGEST_MARK):
        head, sep, _ = text[len(DIGEST_MARK):].partition(":")
        return head if sep else ANY_GATE
    return _gate(signature(text))


def guard_digest(text: str) -> str:
    """A hash of the guard's features (numbers, negations, names, added instructions, a
    from/to route, directions, the kind of fact asked), after the question's `gate`: what
    Redis keeps instead of the question, so no prompt text leaves the process unless the
    operator opts in."""
    sig = signature(text)
    return f"{DIGEST_MARK}{_gate(sig)}:{_strict_hash(sig)}"


def guard_ok(question: str, stored: str) -> bool:
    """`stored`: the stored question, or its `guard_digest`. On a digest the features
    must be equal (stricter on them than the text guard); the word-level checks (one
    slot swapped, a reversing prefix) need the text, so an entry loaded from Redis without
    it is guarded by its features and the similarity threshold alone."""
    if stored.startswith(DIGEST_MARK):
        if gate(stored) == ANY_GATE:  # stored before digests had gates: no gate in it
            return stored == DIGEST_MARK + _strict_hash(signature(question))
        return guard_digest(question) == stored
    a, b = signature(question), signature(stored)
    ta, tb = a.tokens, b.tokens
    # One word in two forms as one ("exporto" / "exportar"), but for the order of the
    # words: a verb moved in its other form is the language's ("Wo finde ich ...?" /
    # "Wo kann ich ... finden?").
    if a.native and b.native:
        ta, tb = _stems_as_one(ta, tb, a.native - b.native, b.native - a.native)
    return (a.numbers == b.numbers and a.negations == b.negations and a.names == b.names
            and a.instructions == b.instructions and a.layout == b.layout
            and a.language == b.language
            and not _native_differs(a.native, b.native)
            and {a.tense, b.tense} != {"past", "future"}
            and not _state_or_future(a, b)
            and a.symbols == b.symbols
            and not (a.counts and b.counts and a.counts != b.counts)
            and not _roles_swapped(ta, tb)
            and not (owners_differ(a.owners, b.owners) and owners_differ(
                _owned_by_of(a, b.tokens), _owned_by_of(b, a.tokens)))
            and not _doers_differ(a.doer, b.doer, ta, tb, a.state or b.state)
            and not (a.state and b.state and not _same_state(a.state, b.state))
            and not _state_and_own_act(ta, tb)
            and not _act_and_its_result(ta, tb)
            and not agents_differ(a.agents, b.agents)
            and not parties_differ(parties(ta), parties(tb))
            and not degrees_differ(a.degrees, b.degrees)
            and not units_differ(a.units, b.units)
            and not channels_differ(a.tokens, b.tokens)
            and not (a.numbers and relative_differs(a.units, b.units))
            and not quantifiers_differ(a.quantifiers, b.quantifiers)
            and not all_against_one(a.tokens, b.tokens)
            and not modals_differ(a.modals, b.modals)
            and not (a.route and b.route and a.route != b.route)
            and not ends_differ(a.ends, b.ends)
            and not _conflict(a.directions, b.directions)
            and not _reversed(a.words, b.words)
            and not _focus_differs(a.focus, b.focus)
            and not _reason_and_steps(a, b, question.lower(), stored.lower())
            and not _whether_and_why(ta, tb)
            and not _edited(ta, tb)
            and not actions_differ(_content(nouns(checked(merged(ta)))),
                                   _content(nouns(checked(merged(tb)))))
            and not _reordered(a.tokens, b.tokens))



# The gates of `signature`'s passes: each set holds a word (a run of letters, `_LETTERS`)
# that every match of its pass holds, whole: each such word in the pattern stands
# between word boundaries, or between blanks and a boundary, so the run of letters round
# it is that word. A question holding none of them (most questions, for most passes) is
# not searched; tests/unit/plugins/test_cache_guard_signature_gates.py checks that the
# signature stays the one the ungated passes give.
#: `_PHRASE_PAIRS`' first words and their second words.
_PHRASE_FIRST = frozenset(first for first, _ in _PHRASE_PAIRS)
_PHRASE_SECOND = frozenset(second for _, second in _PHRASE_PAIRS)
_HAS_SPELLED_ASCII = re.compile(_HAS_SPELLED.pattern)
#: A capital after the text's first character: a name (`_NAME`: an ASCII capital, not the
#: first) needs one.
_CAPITAL = re.compile("[A-Z]")
#: The short names `_SHORT_NAME` reads, and a word of each of `_SAME_ASK`'s phrases.
_ABBREVIATED_WORDS = frozenset(_ABBREVIATED)
_SAME_ASK_WORDS = frozenset(("time", "have", "provide", *(
    max(re.findall("[a-z]+", said), key=len) for said in DEGREE_SYNONYMS)))


def _rerun(before: str, after: str, runs: frozenset[str]) -> tuple[str, frozenset[str]]:
    """The text after a pass, and its runs of letters (read again where it changed)."""
    return after, runs if after == before else frozenset(_LETTERS.findall(after))


#: What names a unit but its words (guard_units.UNIT_WORDS): a sign, or a digit before a
#: time of day's half ("9am").
_UNIT_SIGN_OR_DIGIT = re.compile(r"[$\u20ac\u00a3\u00a5\u20b9%\d]")
#: `_NEGATION`'s words on ASCII text ("n't" and "n'" hold an apostrophe: looked for
#: apart).
_NEGATION_WORDS = frozenset(
    "not no never none nothing cannot without neither nor non unable impossible fail fails "
    "failed failing ne jamais aucun aucune nicht kein keine keinem keinen keiner keines nie "
    "niemals nunca nenhum nenhuma niet geen nooit nada ningun ninguno ninguna nessun "
    "nessuno nessuna".split()) | frozenset(f"{stem}nt" for stem in _NT_STEMS.split("|"))
#: Each focus's words (`_FOCUS`).
_FOCUS_WORDS = {
    "time": frozenset(("how", "when", "what", "deadline", "hours", "delivery")),
    "cost": frozenset(("how", "cost", "costs", "price", "prices", "fee", "fees", "free",
                       "pay")),
    "place": frozenset(("where", "which", "what")),
    "reason": frozenset(("why", "what", "reason", "how")),
    "person": frozenset(("who", "whom", "whose")),
}
assert _FOCUS_WORDS.keys() == _FOCUS.keys()
#: `_COUNT_WORD`'s first words ("pair of", "one and a half", "time and a half": "half").
_COUNT_WORDS = frozenset(("half", "one", *(said.split()[0] for said in _COUNTS)))
#: The words of `_INSTRUCTIONS` that stand whole; and the pieces that need not
#: (`_INSTRUCTION_PARTS`: "briefly", "answering", "bulleted", "in a sentence").
_INSTRUCTION_WORDS = frozenset((
    # language (a name between blanks, or opening the question before its colon)
    *_LANGUAGES.split("|"),
    # format
    *"json yaml xml csv markdown html table numbered poem haiku limerick song rap sonnet "
     "essay tweet code caps uppercase lowercase list".split(),
    # persona
    "like", "style", "voice", "act", "acting", "pretend",
    # audience (the noun after "for" / "to", in each of its forms)
    *"beginner beginners novice novices newbie newbies dummies kid kids child children "
     "toddler toddlers teen teens teenager teenagers year years expert experts specialist "
     "specialists professional professionals physicist physicists scientist scientists "
     "mathematician mathematicians student students graduate graduates developer "
     "developers programmer programmers engineer engineers manager managers executive "
     "executives ceo ceos doctor doctors lawyer lawyers teacher teachers parent parents "
     "senior seniors marketer marketers investor investors layperson lay laymen layman "
     "non nonexpert nonexperts grandma grandmother grandpa grandparent grandparents".split(),
    # tone
    *"sad happy funny humorous humourous hilarious scary spooky creepy romantic dark "
     "serious formal informal casual polite rude friendly angry sarcastic witty cheerful "
     "motivational inspirational inspiring persuasive dramatic silly whimsical playful "
     "heartwarming bittersweet emotional upbeat gloomy optimistic pessimistic "
     "enthusiastic".split(),
    # plain ("in simple terms", "like I'm five")
    "terms", "english", "words", "language",
    # directive (a verb that a blank follows)
    *"keep be use include say start end".split()))
_INSTRUCTION_PARTS = (
    # length (a count's unit, "in a word", "max 50", ...)
    "word", "sentence", "line", "paragraph", "point", "bullet", "brief", "concise", "short",
    "succinct", "detail", "step by step", "summar", "tldr", "tl;dr", "no more than",
    "at most", "max", "yes or no", "true or false", "only a ", "only one ",
    # persona
    "you are a", "as if", "role", "eli5",
    # directive
    "answer", "respond", "reply", "write", "format", "translate", "explain", "explanation",
    "give only", "give just", "give me only", "give me just")


def _may_instruct(runs: frozenset[str], lowered: str) -> bool:
    """Whether an ASCII question, lowered, may hold an instruction (`_INSTRUCTIONS`): a
    word of one, or a piece of one."""
    return not _INSTRUCTION_WORDS.isdisjoint(runs) or any(
        part in lowered for part in _INSTRUCTION_PARTS)
