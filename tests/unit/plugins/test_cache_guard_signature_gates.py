"""The guard's signature skips each pass that cannot match (its gates, at the end of
guard.py: a word every match holds, absent from the question) and counts a question's
languages only where it holds another language's small word: the signature stays the
one the passes give ungated. The reference below is `signature`, `_language`,
`_numbers` and `_tokens` as they were before the gates (stop 55), run over the labelled
sets, their upper-case and code variants, and generated texts: every word the guard's
patterns and lists name, in random order with digits, signs and punctuation; strings
drawn from each gated pattern; other languages and scripts; long, empty and code
texts."""

from __future__ import annotations

import itertools
import random
import re
from functools import cache
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plugins.cache import (
    guard,
    guard_actions,
    guard_degrees,
    guard_ends,
    guard_modals,
    guard_native,
    guard_quantifiers,
    guard_roles,
    guard_units,
)
from plugins.cache.guard import (
    _ABBREVIATED,
    _ASCII_LETTERS,
    _CHANNEL,
    _CHANNEL_HINT,
    _CHANNELS,
    _CONTRACTED,
    _CURRENCY_HINT,
    _CURRENCY_WORD,
    _DAY_MONTH,
    _DIGIT,
    _DIRECTION,
    _ENGLISH_TOO,
    _FOCUS,
    _FOCUS_ASCII,
    _FROM_TO,
    _FULL,
    _GOT_BACK,
    _HAPPENS_WHEN,
    _HAS_SCRIPT_DIGITS,
    _HAS_SPELLED,
    _INDENT,
    _INSTRUCTIONS,
    _INSTRUCTIONS_ASCII,
    _LATIN_WORD,
    _LETTERS,
    _MOVED,
    _NO_APOSTROPHE,
    _NUMBER,
    _OPERATOR,
    _ORDINAL,
    _PHRASE,
    _PHRASE_PAIRS,
    _PHRASES,
    _REASON_FRAME,
    _RECEIVING,
    _SAME_ASK,
    _SCRIPT_DIGITS,
    _SCRIPTS,
    _SHORT,
    _SHORT_NAME,
    _SIGN,
    _SIGNED_AMOUNT,
    _SPLIT_VERBS,
    _STOPWORD_LANGUAGES,
    _STOPWORDS,
    _TOKEN,
    _VERB_FIRST,
    _VERB_PHRASE,
    _WORD,
    Signature,
    _channel_key,
    _counts,
    _instructions,
    _moved,
    _names,
    _native,
    _negations,
    _number,
    _same_ask,
    _spelled,
    _symbols,
    _tense,
)
from plugins.cache.guard_degrees import degrees
from plugins.cache.guard_ends import ends
from plugins.cache.guard_modals import modals
from plugins.cache.guard_native import english_frame, joined
from plugins.cache.guard_quantifiers import quantifiers
from plugins.cache.guard_roles import agents, doer, owners, state
from plugins.cache.guard_units import CURRENCY_CODE, CURRENCY_CODES, units

DATA = Path(__file__).resolve().parents[2] / "data"


# ---------------------------------------------------------------- the reference

def _reference(text: str) -> Signature:
    language = _ref_language(text)
    if language in _SPLIT_VERBS:  # "Wie lade ich die App herunter?": one verb
        text = joined(text, language)
    lowered = text.lower()
    if "when" in lowered and "happen" in lowered:  # "What happens when I ...": if
        text = _HAPPENS_WHEN.sub(r"\1 if", text)
        lowered = text.lower()
    letters = _LETTERS.findall(lowered)
    if any(pair in _PHRASE_PAIRS for pair in itertools.pairwise(letters)):
        low = _PHRASE.sub(lambda m: _PHRASES[m.group(0)], lowered)
    else:  # (most questions: no two words in a row are a phrase's)
        low = lowered
    if "back" in low:
        low = _GOT_BACK.sub(r"restore\1", low)
    low = _RECEIVING.sub("receive", low)
    if " in" in low or " out" in low:
        low = _MOVED.sub(_moved, low)
    if text.isascii():
        instructions, focus, seen = _INSTRUCTIONS_ASCII, _FOCUS_ASCII, lowered
    else:
        instructions, focus, seen = _INSTRUCTIONS, _FOCUS, text
    words = _WORD.findall(low)
    route = _FROM_TO.search(low)
    return Signature(
        numbers=_ref_numbers(text),
        negations=_negations(text),
        names=_names(text),
        directions=tuple(d for w in words if w in _DIRECTION for d in _DIRECTION[w]),
        words=frozenset(words),
        route=(route.group(1), route.group(2)) if route else None,
        instructions=_instructions(instructions, seen),
        focus=frozenset(k for k, p in focus.items() if p.search(seen)),
        tokens=_ref_tokens(english_frame(lowered, language)),
        layout=tuple(_INDENT.findall(text)) if "\n" in text else (),
        language=language,
        native=_native(text, language),
        tense=_tense(lowered),
        symbols=_symbols(text),
        counts=_counts(text),
        owners=owners(lowered),
        doer=doer(lowered),
        degrees=degrees(lowered),
        units=units(lowered),
        quantifiers=quantifiers(lowered),
        modals=modals(lowered),
        ends=ends(low),
        agents=agents(lowered),
        state=state(lowered),
    )



def _ref_language(text: str) -> str:
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
    counts = dict.fromkeys(_STOPWORDS, 0)  # (in `_STOPWORDS`' order: `max` takes the first)
    for w in words:
        for lang in _STOPWORD_LANGUAGES.get(w, ()):
            counts[lang] += 1
    best = max(counts, key=lambda lang: counts[lang])
    if best != "en" and counts[best] >= 2 and counts[best] > counts["en"]:
        return best
    if "\u00bf" in text or "¡" in text:  # "¿", "¡": Spanish, however short
        return "es"
    # A short question with one small word of another language and none of English's
    # ("Pourquoi payer ?", "Wie kündigen?"), where that word is no English word too.
    if (best != "en" and counts[best] == 1 and not counts["en"] and len(words) <= _SHORT
            and not any(w in _STOPWORDS[best] and w in _ENGLISH_TOO for w in words)):
        return best
    return ""



def _ref_numbers(text: str) -> tuple[str, ...]:
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




def _ref_tokens(lowered: str) -> tuple[str, ...]:
    """The question's words, numbers spelled in words as their digits (`_spelled`), a
    negated contraction with its apostrophe (`_NO_APOSTROPHE`), a month's or a
    weekday's short name as its full one and a day without its ordinal, after its month
    ("Dec 25th", "25 December" as "december 25": `_ABBREVIATED`, `_DAY_MONTH`), an
    amount after a currency sign with the currency's word ("$10" as "10 dollars"), a
    small word and
    "is"/"are" as their contraction (`_FULL`), and words that ask the same thing in the
    same frame as one (`_SAME_ASK`), a phrasal verb as its one word (`_VERB_PHRASE`), a
    "get" that receives as "receive" (`_RECEIVING`), a "get ... back" as "restore"
    (`_GOT_BACK`)."""
    if _HAS_SPELLED.search(lowered):  # "two bags" reads as "2 bags"
        for start, end, n in reversed(_spelled(lowered)):
            lowered = f"{lowered[:start]}{n}{lowered[end:]}"
    if any(sign in lowered for sign in _CURRENCY_WORD):
        lowered = _SIGNED_AMOUNT.sub(lambda m: f"{m.group(2)} {_CURRENCY_WORD[m.group(1)]}",
                                     lowered)
    if _CURRENCY_HINT.search(lowered):  # "in USD", "in US dollars" as "in dollars"
        lowered = CURRENCY_CODE.sub(lambda m: CURRENCY_CODES.get(m.group(0), ""), lowered)
    lowered = _SHORT_NAME.sub(lambda m: _ABBREVIATED[m.group(1)], lowered)
    if _DIGIT.search(lowered):  # (an ordinal and a day both follow a digit)
        lowered = _DAY_MONTH.sub(r"\2 \1", _ORDINAL.sub("", lowered))
    if "nt" in lowered:
        lowered = _NO_APOSTROPHE.sub(r"\1n't", lowered)
    if "reason" in lowered or "how come" in lowered:
        lowered = _REASON_FRAME.sub("why that ", lowered)
    if " is" in lowered or " are" in lowered:
        lowered = _FULL.sub(lambda m: f"{m.group(1)} {_CONTRACTED[m.group(2)]}", lowered)
    lowered = _SAME_ASK.sub(_same_ask, lowered)
    if _CHANNEL_HINT.search(lowered):
        lowered = _CHANNEL.sub(lambda m: _CHANNELS[_channel_key(m.group(0))], lowered)
    if not _VERB_FIRST.isdisjoint(_LETTERS.findall(lowered)):
        lowered = _VERB_PHRASE.sub(lambda m: _PHRASES[m.group(0)], lowered)
    if "back" in lowered:
        lowered = _GOT_BACK.sub(r"restore\1", lowered)
    if "get" in lowered or "got" in lowered:
        lowered = _RECEIVING.sub("receive", lowered)
    return tuple(_TOKEN.findall(lowered))

# ---------------------------------------------------------------- the texts


@cache
def _labelled() -> list[str]:
    out: set[str] = set()
    for path in sorted(DATA.glob("semantic_*.yaml")):
        data = yaml.safe_load(path.read_text())
        for value in data.values():
            for group in (value.values() if isinstance(value, dict) else [value]):
                for pair in group or []:
                    if isinstance(pair, list):
                        out |= {q for q in pair if isinstance(q, str)}
    return sorted(out)


def _pattern_words() -> list[str]:
    """Every word the guard's patterns and word lists name (the gates' words among them),
    and the pieces of its patterns between their operators."""
    words: set[str] = set()
    for module in (guard, guard_actions, guard_degrees, guard_ends, guard_modals,
                   guard_native, guard_quantifiers, guard_roles, guard_units):
        for value in vars(module).values():
            items = [value]
            if isinstance(value, dict):
                items = [*value.keys(), *value.values()]
            elif isinstance(value, (frozenset, set, tuple, list)):
                items = list(value)
            for item in items:
                source = item.pattern if isinstance(item, re.Pattern) else item
                if isinstance(source, str):
                    words |= set(re.findall(r"[a-z][a-z';]*", source.lower()))
    return sorted(words)


_GLUE = [" ", " ", " ", " ", "  ", "", "_", "2", ", ", ". ", "? ", "! ", ": ", "; ", "-",
         "'", "\n  ", " (", ") ", " = ", " + ", " - ", " * ", "/", " & ", "\u2019", " \u00bf", "\t"]
_EXTRA = ["3", "12", "1,000", "2.5", "$10", "€5", "50%", "9am", "7 pm", "x[0]", "{}",
          "[]", "->", "²", "H₂O", "👍", "∀", "été", "naïve",
          "K", "\u017f", "\u0130", "café", "\u00bfqué", "não", "ningún",
          "不", "没有", "да", "שלום", "مرحبا", "USD", "U.S.",
          "Dec", "Monday", "Paris", "JSON", "I", "My", "The", "Why", "How", "What"]
_OTHER = [
    "", " ", "\n", "?", "\u00bf?", "👍👎", "def f(x):\n    return x + 1\n",
    "for i in range(10):\n\tprint(i)  # loop\nprint('done')",
    "SELECT * FROM users WHERE age > 30 AND name != 'x';",
    "Comment puis-je annuler ma commande ? Je ne trouve pas le bouton.",
    "\u00bfCómo puedo cancelar mi suscripción? No tengo ningún correo.",
    "Wie lade ich die App herunter? Ich kann sie nicht finden.",
    "Hoe meld ik me af? Ik heb geen account.",
    "Come posso cambiare la password? Non funziona.",
    "Posso cancelar minha assinatura? Não consigo.",
    "如何重置我的密码？我没有收到邮件",
    "パスワードをリセットするには？",
    "비밀번호를 재설정하려면?",
    "Как сбросить пароль? Не могу.",
    "كيف أغير كلمة المرور؟",
    "איך מאפסים סיסמה?",
    "Πώς αλλάζω κωδικό;",
    "मैं पासवर्ड कैसे बदलूं?",
    "ฉันจะเปลี่ยนรหัสผ่านได้อย่างไร",
    "Explain quantum physics to a five-year-old in one sentence, like a pirate.",
    "Write a sad poem in French about my dog. Keep it short!",
    "What is 7 + 5? And 8 times 2? Is x² ≥ 4 when x = -3?",
    "How long do I have to return an item that arrived damaged, in USD or EUR?",
    "I can't log in and I don't know why; it doesnt work and I wont pay",
    "**Important**: how do I turn on 2FA? Thanks 🙏",
    "(Paris)", "'Berlin' or Rome?", "2online: can I pay on the website?",
    "in-app_by phone? 3dec, 25th of december",
]


def _generated(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    vocab = _pattern_words()
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 14)):
            word = rng.choice(vocab) if rng.random() < 0.85 else rng.choice(_EXTRA)
            if rng.random() < 0.15:
                word = word.upper() if rng.random() < 0.5 else word.capitalize()
            parts.append(word)
            parts.append(rng.choice(_GLUE))
        out.append("".join(parts).strip() + rng.choice(["", "?", ".", "!", " ?"]))
    return out


def _texts() -> list[str]:
    base = _labelled()
    return [*base, *(q.upper() for q in base), *(q.lower() for q in base),
            *(q + " x = a[0] + b" for q in base[:300]), *_OTHER,
            " ".join(base[:60]), "word " * 2_000, "é" * 3_000]


# ---------------------------------------------------------------- the checks


def test_the_labelled_questions_and_their_variants_keep_their_signatures() -> None:
    for text in _texts():
        assert guard.signature(text) == _reference(text), text


@pytest.mark.parametrize("seed", range(4))
def test_generated_texts_keep_their_signatures(seed: int) -> None:
    for text in _generated(1_500, seed):
        assert guard.signature(text) == _reference(text), text


def test_each_word_the_patterns_name_opens_their_passes() -> None:
    """Each word the guard's patterns and lists name, alone and in a few frames, gets
    the signature the ungated passes give: a word that a pass reads but its gate left
    out shuts the pass on it (found here even where the random texts above happen to
    open the gate with another word)."""
    # (the last frames: a directive's verb and what must follow it, "end with", "keep
    # it", "use only", "be brief": the word alone reads as no directive)
    frames = ["{}", "{} to it", "in {}", "to a {}", "{} user", "x {} 9", "{} with it.",
              "{} it", "{} only", "{} brief", "{} a joke"]
    for word in _pattern_words():
        for frame in frames:
            text = frame.format(word)
            assert guard.signature(text) == _reference(text), text


#: The passes the gates skip, and what each reads (a string matching one, alone or in a
#: frame, must get the ungated signature).
_GATED = {
    **{f"focus:{k}": p for k, p in _FOCUS_ASCII.items()},
    **{f"instruction:{k}": p for k, p in _INSTRUCTIONS_ASCII.items()},
    "same ask": _SAME_ASK, "channel": _CHANNEL, "quantifier": guard_quantifiers._QUANTIFIER,
    "unit": guard_units._UNIT, "negation": guard._NEGATION_ASCII, "count": guard._COUNT_WORD_ASCII,
    "short name": _SHORT_NAME, "phrase": _PHRASE, "verb phrase": _VERB_PHRASE,
    "spelled": guard._HAS_SPELLED_ASCII,
    "meridiem": re.compile(r"\d\s?[ap]\.?m\.?"),  # (`_MERIDIEM` after its digit)
}
_FRAMES = st.sampled_from(["{}", "how do i {} it?", "Can you {} please", "{}: why?",
                           "x {} 9", "(Paris) {}", "if i {} my order, what then?"])


@pytest.mark.parametrize("name", sorted(_GATED))
@pytest.mark.parametrize("ascii_only", [True, False])
def test_what_each_gated_pass_reads_keeps_its_signature(name: str, ascii_only: bool) -> None:
    """Strings each pass matches (drawn from its own pattern), alone and in frames: a
    gate that shuts its pass on one of them changes the signature."""
    alphabet = st.characters(max_codepoint=127) if ascii_only else st.characters()
    matching = st.from_regex(_GATED[name], fullmatch=True, alphabet=alphabet)

    @settings(max_examples=100 if ascii_only else 40, derandomize=True, database=None,
              deadline=None, suppress_health_check=list(HealthCheck))
    @given(matching, _FRAMES, st.booleans())
    def check(said: str, frame: str, lowered: bool) -> None:
        text = frame.replace("{}", said)
        text = text.lower() if lowered else text
        assert guard.signature(text) == _reference(text), text

    check()


def test_every_phrase_the_passes_read_keeps_its_signature() -> None:
    """The phrases of the channel, same-ask, phrasal-verb and length passes, each whole
    (the drawn strings above may miss one of many)."""
    phrases = [*guard._CHANNELS, *guard_degrees.SAME, *_PHRASES, "what time", "do you have",
               "be quickly", "be very nicely", "in a word", "give me only", "only one ",
               "step by step", "tl;dr", "max 50", "in 3 lines", "explain like i'm five"]
    for phrase in phrases:
        for frame in ("{}", "Can I pay {} today?", "how do i {} it"):
            text = frame.format(phrase)
            assert guard.signature(text) == _reference(text), text
