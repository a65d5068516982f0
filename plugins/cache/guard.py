"""The near-miss guard: refuse a semantic hit whose question differs in what matters.

Sentence embeddings score "cancel order 123" and "cancel order 456" as near-identical,
and "How do I reset my password? Answer like a pirate." as the plain question. The guard
compares cheap lexical signatures of the two questions and refuses the hit when:

- their numbers differ (in order): ids, amounts, dates, sizes;
- their negation counts differ (not, never, n't, "non-" ...);
- their capitalized names differ (in order): places, brands, languages, plans;
- they carry opposite directions of the same family (enable/disable, upgrade/downgrade,
  refund/charge, import/export ...), or one word is the other with a reversing prefix
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
- they are one template with one slot changed ("Does the laptop come with a charger?" /
  "Does the phone ..."): a swapped entity, even in lower case. The price: a one-word
  synonym swap ("opening hours" / "business hours") misses too.

One-sided direction words are allowed ("turn on 2FA" vs "set up 2FA"): only a conflict
within a family refuses. Tuned on tests/data/semantic_tune.yaml only.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from dataclasses import dataclass

_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_NEGATION = re.compile(
    r"\b(?:not|no|never|none|nothing|cannot|without|neither|nor|non)\b|n't\b|\bnon-|"
    r"不|没|无|别|非", re.IGNORECASE)
_NAME = re.compile(r"(?<![.!?:]\s)(?<!^)\b[A-Z][a-zA-Z]+\b")
_WORD = re.compile(r"[a-z]+(?:-[a-z]+)?")
_FROM_TO = re.compile(r"\bfrom\s+(\w+)\s+(?:to|into)\s+(\w+)", re.IGNORECASE)
_PHRASES = {"turn on": "enable", "switch on": "enable", "turn off": "disable",
            "switch off": "disable", "sign up": "register", "log out": "logout",
            "sign out": "logout", "log in": "login", "log into": "login", "sign in": "login",
            "opt in": "enable", "opt out": "disable", "check in": "checkin",
            "check out": "checkout"}
# One pass for every phrase (longest first); no replacement makes another phrase.
_PHRASE = re.compile(r"\b(?:" + "|".join(
    re.escape(p) for p in sorted(_PHRASES, key=len, reverse=True)) + r")\b")
_FAMILIES = (
    ("amount", ("increase", "raise", "higher", "more", "up", "extend"),
     ("decrease", "reduce", "lower", "less", "down", "shorten")),
    ("member", ("add", "create", "invite", "insert", "include"),
     ("remove", "delete", "kick", "exclude")),
    ("switch", ("enable", "activate", "allow", "show", "start"),
     ("disable", "deactivate", "block", "forbid", "hide", "stop")),
    ("plan", ("upgrade",), ("downgrade",)),
    ("term", ("renew", "resume", "continue"), ("cancel", "terminate", "pause", "end")),
    ("trade", ("buy", "purchase", "order"), ("sell", "return")),
    ("lock", ("lock", "freeze", "suspend"), ("unlock", "unfreeze", "reactivate")),
    ("session", ("login", "register", "subscribe", "join", "checkin"),
     ("logout", "unsubscribe", "leave", "checkout")),
    ("time", ("before", "earlier", "early"), ("after", "later", "late")),
    ("bound", ("maximum", "max", "most"), ("minimum", "min", "least")),
    ("flow", ("import", "upload", "receive", "deposit", "incoming"),
     ("export", "download", "send", "withdraw", "outgoing")),
    ("money", ("refund", "credit", "reimburse", "refunded"),
     ("charge", "debit", "bill", "charged", "billed")),
    ("visibility", ("public", "visible"), ("private", "hidden")),
    ("follow", ("follow", "mute"), ("unfollow", "unmute")),
    ("accept", ("accept", "approve", "confirm"), ("reject", "decline", "deny")),
)
_DIRECTION = {w: (fam, sign) for fam, plus, minus in _FAMILIES
              for sign, words in (("+", plus), ("-", minus)) for w in words}
_REVERSING = ("un", "de", "dis", "non", "non-")

_LANGUAGES = ("english|french|spanish|german|italian|portuguese|japanese|chinese|mandarin|"
              "korean|russian|arabic|hindi|dutch|polish|turkish|swedish|norwegian|danish|"
              "finnish|greek|hebrew|latin|ukrainian|czech|hungarian|romanian|vietnamese|"
              "thai|indonesian|malay|bengali|urdu|persian|swahili|emoji")
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
    "reason": re.compile(r"\b(?:why|what caused|reason)\b", re.IGNORECASE),
}
# The same patterns without IGNORECASE, for ASCII text lowered first (faster; on
# ASCII the two agree, while IGNORECASE also lets the dotless i, the dotted capital I
# and the long s match "i" and "s").
_INSTRUCTIONS_ASCII = {k: re.compile(p.pattern) for k, p in _INSTRUCTIONS.items()}
_FOCUS_ASCII = {k: re.compile(p.pattern) for k, p in _FOCUS.items()}
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
    "made simply".split())
_ASKING = frozenset("how what when where why which who can could do does is are".split())
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


def signature(text: str) -> Signature:
    lowered = text.lower()
    low = _PHRASE.sub(lambda m: _PHRASES[m.group(0)], lowered)
    if text.isascii():
        instructions, focus, seen = _INSTRUCTIONS_ASCII, _FOCUS_ASCII, lowered
    else:
        instructions, focus, seen = _INSTRUCTIONS, _FOCUS, text
    words = _WORD.findall(low)
    route = _FROM_TO.search(low)
    return Signature(
        numbers=tuple(n.replace(",", "") for n in _NUMBER.findall(text)),
        negations=len(_NEGATION.findall(text)),
        names=tuple(m.group(0).lower().rstrip("s")
                    for m in _NAME.finditer(text.strip())),
        directions=tuple(_DIRECTION[w] for w in words if w in _DIRECTION),
        words=frozenset(words),
        route=(route.group(1), route.group(2)) if route else None,
        instructions=_instructions(instructions, seen),
        focus=frozenset(k for k, p in focus.items() if p.search(seen)),
        tokens=tuple(_TOKEN.findall(lowered)),
        layout=tuple(_INDENT.findall(text)) if "\n" in text else (),
    )


def _instructions(patterns: dict[str, re.Pattern[str]], seen: str) -> frozenset[str]:
    """Each instruction's kind, and for the kinds in `_PHRASED` what it says, in a
    canonical form ("length:1 sentence", "audience:5 year old", "language:french")."""
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
    """Opposite signs within a family both sides mention."""
    for fam in {f for f, _ in a} & {f for f, _ in b}:
        if [s for f, s in a if f == fam] != [s for f, s in b if f == fam]:
            return True
    return False


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


def _one_slot_changed(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """The same words but one span of 1-2 content words replaced by another."""
    ops = [op for op in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes()
           if op[0] != "equal"]
    if len(ops) != 1 or ops[0][0] != "replace":
        return False
    _, i1, i2, j1, j2 = ops[0]
    if i2 - i1 > 2 or j2 - j1 > 2 or len(a) - (i2 - i1) < 2:
        return False
    return not (set(a[i1:i2]) <= _SCAFFOLD and set(b[j1:j2]) <= _SCAFFOLD)


def _one_span_added(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """One side is the other with one span of words added that says something ("Tell me a
    joke" / "Please tell me a joke about cats", "a recipe" / "a vegan recipe"); edits of
    words that say nothing (`_FILLER`: "please", "can you", greetings, thanks) aside."""
    if min(len(a), len(b)) < 2:
        return False
    if (len(a), a) > (len(b), b):  # one order, whichever side asks: the same answer
        a, b = b, a
    ops = [op for op in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes()
           if op[0] != "equal" and not set(a[op[1]:op[2]] + b[op[3]:op[4]]) <= _FILLER]
    if len(ops) != 1 or ops[0][0] == "replace":
        return False
    _, i1, i2, j1, j2 = ops[0]
    if not any(t not in _FILLER for t in a[:i1]):  # at the start, a frame round a bare
        return not set(a[i1:i2] + b[j1:j2]) & _ASKING  # query ("How do I check ..." / "...")
    return True


#: Marks a stored guard digest (an entry read from Redis without its question text).
DIGEST_MARK = "\x00guard:"
#: The gate of a stored question whose gate is not known (a digest from before gates):
#: questions of any gate may pass the guard with it (the digest decides).
ANY_GATE = "*"


def _strict(sig: Signature) -> tuple[object, ...]:
    return (sig.numbers, sig.negations, sig.names, tuple(sorted(sig.instructions)),
            sig.route, sig.directions, tuple(sorted(sig.focus)), *_layout(sig))


def _layout(sig: Signature) -> tuple[object, ...]:
    """The layout, where there is one (prose has none: its digests and gates are as
    they were before layout counted)."""
    return (sig.layout,) if sig.layout else ()


def _strict_hash(sig: Signature) -> str:
    return hashlib.sha256(repr(_strict(sig)).encode()).hexdigest()


def _gate(sig: Signature) -> str:
    return hashlib.sha256(repr((
        sig.numbers, sig.negations, sig.names, tuple(sorted(sig.instructions)),
        "time" in sig.focus, "cost" in sig.focus, *_layout(sig))).encode()).hexdigest()[:16]


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
    return (a.numbers == b.numbers and a.negations == b.negations and a.names == b.names
            and a.instructions == b.instructions and a.layout == b.layout
            and not (a.route and b.route and a.route != b.route)
            and not _conflict(a.directions, b.directions)
            and not _reversed(a.words, b.words)
            and not _focus_differs(a.focus, b.focus)
            and not _one_slot_changed(a.tokens, b.tokens)
            and not _one_span_added(a.tokens, b.tokens))
