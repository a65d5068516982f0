"""A candidate for issue 14, measured by bench/embedders.py and not shipped (it lowered
the tuned hit rates, see bench/results/embedders.md): the text the semantic cache would
embed, a question with its wrapping taken off.

Applied identically to a new question and to the stored one before embedding (never to
the guard's input: the guard reads the question as asked, capitals and punctuation
included). Cheap: a few regular expressions, ~35 us a question.

- lower case, contractions expanded ("can't" -> "cannot", "what's" -> "what is");
- punctuation dropped (a decimal point or an inner hyphen stays);
- greetings, thanks and politeness dropped ("hi", "please", "thanks in advance");
- a wrapper that only introduces the question dropped ("can you tell me", "I want to
  know", "I was wondering", "quick question").

`level="scaffold"` also drops the way a how-to is asked ("how do I", "how can I", "what
are the steps to", "is it possible to", "is there a way to"): measured side by side in
bench/results/embedders.md.
"""

from __future__ import annotations

import re

_CONTRACTIONS = (
    (r"\bcan't\b", "cannot"), (r"\bwon't\b", "will not"), (r"\bshan't\b", "shall not"),
    (r"\bain't\b", "is not"), (r"n't\b", " not"), (r"\b(what|where|who|how|when|why|that|"
                                                  r"there|here|it|he|she)'s\b", r"\1 is"),
    (r"'re\b", " are"), (r"'ve\b", " have"), (r"'ll\b", " will"), (r"'d\b", " would"),
    (r"\bi'm\b", "i am"), (r"\blet's\b", "let us"),
)
_CONTRACTION_RES = tuple((re.compile(p), r) for p, r in _CONTRACTIONS)
_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "`": "'"})
_PUNCT = re.compile(r"(?:(?<!\d)[.,]|[.,](?!\d)|[^\w\s.,'-]|'|(?<!\w)-|-(?!\w))+")
_SPACES = re.compile(r"\s+")

_FILLER_WORDS = (
    r"hi|hello|hey|hiya|greetings|good (?:morning|afternoon|evening)|dear (?:support|team)|"
    r"please|pls|plz|kindly|thanks(?: a lot| in advance)?|thank you(?: very much| so much)?|"
    r"cheers|ok|okay|so|um+|uh+|quick question|just (?:a )?(?:quick )?question|"
    r"i have a question|a question"
)
_FILLER = re.compile(rf"(?:^|(?<=\s))(?:{_FILLER_WORDS})(?=\s|$)")
_WRAPPERS = re.compile(
    r"^(?:(?:can|could|would|will) you (?:please )?(?:tell|show|explain to|let) me|"
    r"(?:can|could|would|will) you (?:please )?(?:help me(?: (?:with|to|understand))?|"
    r"explain|clarify)|help me(?: (?:with|to|understand))?|tell me|explain|"
    r"i (?:want|would like|wish|need|would love|am trying|am looking) to (?:know|understand|"
    r"find out|ask|learn)|i (?:am|was) wondering|i wonder|do you know|"
    r"(?:any )?idea|(?:any )?ideas|"
    r"i would like to ask|may i ask|can i ask|let me know)\s+(?:if |whether )?")
_SCAFFOLD = re.compile(
    r"^(?:how (?:do|can|could|would|should|will) (?:i|we|one|you)|how to|"
    r"what (?:are|is) the (?:steps|process|procedure|way) (?:to|for)|"
    r"what do i (?:need to |have to )?do to|"
    r"is (?:it|there a way) possible to|is there (?:a|any) way to|is it possible to|"
    r"(?:can|could|may) i|i (?:want|need|would like) to)\s+")


def canonical(text: str, level: str = "filler") -> str:
    """The text to embed for `text` (`level`: "none", "filler" or "scaffold")."""
    if level == "none":
        return text
    low = text.translate(_APOSTROPHES).lower()
    for pattern, repl in _CONTRACTION_RES:
        low = pattern.sub(repl, low)
    low = _SPACES.sub(" ", _PUNCT.sub(" ", low)).strip()
    low = _SPACES.sub(" ", _FILLER.sub(" ", low)).strip()
    for _ in range(2):  # "hi, can you tell me: could you help me with ..."
        low = _WRAPPERS.sub("", low)
    if level == "scaffold":
        low = _SCAFFOLD.sub("", low)
    return low or text.lower().strip()
