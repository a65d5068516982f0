"""The small words of the languages the guard detects, read as their English ones.

The guard's word checks (one slot swapped, a span added, filler aside) read English:
"can", "i", "my", "the" are filler there and "how" / "why" a swap. In a question
written in French, Spanish, German, Italian, Portuguese or Dutch their own small words
were words that say something, so "¿Cómo puedo cancelar mi suscripción?" / "¿Cómo
cancelo mi suscripción?" (the "puedo" added) or "Comment puis-je changer mon adresse ?"
/ "Comment changer mon adresse ?" missed. `english_frame` reads those small words as
their English ones (question words, "can" and "possible", pronouns, possessives,
articles, prepositions, "is", a negation as "not"), so the English checks see the same
frame: a question word swapped for another still misses ("¿Cómo ...?" / "¿Por qué
...?"), and so does a negation added. Words of obligation ("debo", "muss", "dois") are
not mapped: they say something (guard._native_differs sees them), as does "nach",
"voor" (after, before: also "to", "for"). A word that says something keeps its
language, its accents dropped: guard._native_differs compares those by their stems.
"""

from __future__ import annotations

import re
import unicodedata

_SMALL: dict[str, dict[str, str]] = {
    "fr": {
        **dict.fromkeys("comment".split(), "how"), "pourquoi": "why", "où": "where",
        "quand": "when", **dict.fromkeys("quel quelle quels quelles".split(), "which"),
        **dict.fromkeys("que qu quoi".split(), "what"), "qui": "who",
        **dict.fromkeys("je j".split(), "i"), "nous": "we",
        **dict.fromkeys("vous tu".split(), "you"),
        **dict.fromkeys("mon ma mes".split(), "my"),
        **dict.fromkeys("votre vos ton ta tes".split(), "your"),
        **dict.fromkeys("le la les l".split(), "the"),
        **dict.fromkeys("un une des du".split(), "a"), **dict.fromkeys("de d".split(), "of"),
        **dict.fromkeys("à au aux".split(), "to"), "pour": "for",
        **dict.fromkeys("dans en".split(), "in"), "sur": "on", "avec": "with", "et": "and",
        "ou": "or", **dict.fromkeys("puis peux peut pouvons pouvez".split(), "can"),
        "possible": "possible", "est": "is", "sont": "are",
        **dict.fromkeys("il elle ce c cette ça".split(), "it"), "faire": "do",
        **dict.fromkeys("ne n pas".split(), "not")},
    "es": {
        "cómo": "how", "dónde": "where", "cuándo": "when",
        **dict.fromkeys("cuál cuáles".split(), "which"), "qué": "what",
        **dict.fromkeys("quién quiénes".split(), "who"), "yo": "i",
        **dict.fromkeys("mi mis".split(), "my"),
        **dict.fromkeys("tu tus su sus".split(), "your"),
        **dict.fromkeys("el la los las lo".split(), "the"),
        **dict.fromkeys("un una unos unas".split(), "a"),
        **dict.fromkeys("de del".split(), "of"), **dict.fromkeys("a al".split(), "to"),
        **dict.fromkeys("para por".split(), "for"), "en": "in", "con": "with", "y": "and",
        "o": "or", **dict.fromkeys("puedo puede puedes podemos pueden".split(), "can"),
        "posible": "possible", **dict.fromkeys("es está".split(), "is"),
        **dict.fromkeys("son están".split(), "are"), "hay": "there", "hacer": "do",
        **dict.fromkeys("me se te".split(), "it"), "no": "not"},
    "de": {
        "wie": "how", **dict.fromkeys("warum wieso weshalb".split(), "why"), "wo": "where",
        "wann": "when", **dict.fromkeys("welche welcher welches welchen".split(), "which"),
        "was": "what", "wer": "who", "ich": "i", "wir": "we",
        **dict.fromkeys("sie du".split(), "you"),
        **dict.fromkeys("mein meine meinen meinem meiner meines".split(), "my"),
        **dict.fromkeys("dein deine ihr ihre ihren ihrem".split(), "your"),
        **dict.fromkeys("der die das den dem des".split(), "the"),
        **dict.fromkeys("ein eine einen einem einer".split(), "a"), "von": "of",
        "zu": "to", "für": "for", **dict.fromkeys("in im".split(), "in"), "auf": "on",
        "mit": "with", "und": "and", "oder": "or",
        **dict.fromkeys("kann kannst können".split(), "can"), "möglich": "possible",
        "ist": "is", "sind": "are", **dict.fromkeys("es mich sich".split(), "it"),
        "bitte": "please", **dict.fromkeys("nicht kein keine keinen".split(), "not")},
    "it": {
        "come": "how", "perché": "why", "dove": "where", "quando": "when",
        **dict.fromkeys("quale quali".split(), "which"),
        **dict.fromkeys("cosa che".split(), "what"), "chi": "who", "io": "i",
        **dict.fromkeys("mio mia miei mie".split(), "my"),
        **dict.fromkeys("il lo la i gli le l".split(), "the"),
        **dict.fromkeys("un uno una".split(), "a"),
        **dict.fromkeys("di del della dei delle".split(), "of"),
        **dict.fromkeys("a al alla".split(), "to"), "per": "for",
        **dict.fromkeys("in nel nella".split(), "in"), "con": "with", "e": "and", "o": "or",
        **dict.fromkeys("posso può possiamo".split(), "can"), "possibile": "possible",
        "è": "is", "sono": "are", "fare": "do", "non": "not"},
    "pt": {
        "como": "how", "onde": "where", "quando": "when",
        **dict.fromkeys("qual quais".split(), "which"), "que": "what", "quem": "who",
        "eu": "i", **dict.fromkeys("meu minha meus minhas".split(), "my"),
        "você": "you", **dict.fromkeys("o a os as".split(), "the"),
        **dict.fromkeys("um uma".split(), "a"),
        **dict.fromkeys("de da do dos das".split(), "of"), "para": "for",
        **dict.fromkeys("em no na".split(), "in"), "com": "with", "e": "and", "ou": "or",
        **dict.fromkeys("posso pode podemos".split(), "can"), "possível": "possible",
        "é": "is", "são": "are", "fazer": "do", "não": "not"},
    "nl": {
        "hoe": "how", "waarom": "why", "waar": "where", "wanneer": "when", "welke": "which",
        "wat": "what", "wie": "who", "ik": "i", "mijn": "my",
        **dict.fromkeys("je jij u".split(), "you"), **dict.fromkeys("het de".split(), "the"),
        "een": "a", "van": "of", "met": "with", "en": "and", "of": "or",
        **dict.fromkeys("kan kun kunnen".split(), "can"), "mogelijk": "possible",
        "is": "is", "zijn": "are", "niet": "not"},
}
#: Two words that ask one thing, read first ("¿Por qué ...?" is "why", not "for what").
#: "Is it possible to" is a "can" ("¿Es posible cambiar ...?" / "¿Puedo cambiar ...?").
_PAIRS = {"es": {"por qué": "why", "para qué": "why", "es posible": "can"},
          "pt": {"por que": "why", "porque": "why", "o que": "what", "é possível": "can"},
          "it": {"è possibile": "can"}, "de": {"ist es möglich": "can"},
          "nl": {"is het mogelijk": "can"}, "fr": {"est-il possible de": "can"}}
_WORD = re.compile(r"[^\W\d_]+")


def small_words(language: str) -> frozenset[str]:
    """The language's small words without their accents (none say something)."""
    return _PLAIN_SMALL.get(language, frozenset())


def english_frame(lowered: str, language: str) -> str:
    """The question with its language's small words as their English ones, a hyphen
    between words a space ("puis-je"), the other words without their accents."""
    small = _SMALL.get(language)
    if small is None:
        return lowered
    for pair, to in _PAIRS.get(language, {}).items():
        if pair in lowered:
            lowered = re.sub(rf"\b{pair}\b", to, lowered)
    lowered = re.sub(r"(?<=\w)-(?=\w)", " ", lowered)
    return plain(_WORD.sub(lambda m: small.get(m.group(0), m.group(0)), lowered))


def plain(text: str) -> str:
    """The text without its accents ("número" as "numero")."""
    return "".join(c for c in unicodedata.normalize("NFD", text)
                   if not unicodedata.combining(c))


_PLAIN_SMALL = {lang: frozenset(map(plain, words)) for lang, words in _SMALL.items()}


#: The particles a German or a Dutch verb leaves at the end when it is split ("Wie lade
#: ich die App herunter?": "herunterladen"; "Hoe meld ik me af?": "afmelden").
_PARTICLES = {
    "de": frozenset("ab an auf aus bei ein fest her herunter hin hinunter hoch los mit nach "
                    "vor weg zu zurück zusammen um durch vorbei weiter heraus hinaus herein "
                    "hinein rein raus runter rauf".split()),
    "nl": frozenset("af aan op uit in mee terug door weg neer over toe bij na om vast los "
                    "binnen buiten".split()),
}
#: The question words before a split verb ("Wie lade ...", "Hoe meld ...").
_ASKS = {"de": frozenset("wie wo wann warum wieso weshalb was wer woher wohin".split()),
         "nl": frozenset("hoe waar wanneer waarom wat wie".split())}
#: Verbs that take an infinitive, not a particle, at the end ("Wie kann ich ... ab?" is
#: no German).
_AUXILIARY = frozenset("kann kannst können muss musst müssen soll sollte darf dürfen will "
                       "wollen möchte möchten ist sind bin hat habe haben wird werden kan "
                       "kun kunnen moet moeten wil zal mag heb heeft ben".split())
_PARTICLE_END = re.compile(r"\s+([^\W\d_]+)(\W*)$")


def joined(text: str, language: str) -> str:
    """A German or Dutch question with its verb split round its object as one word, its
    particle before the verb ("Wie lade ich die App herunter?" as "Wie herunterlade ich
    die App?"): the word the other side's infinitive ("herunterladen") is a form of, so
    guard._native_differs reads them as one verb. The verb is the question's first word,
    or its second after a question word; one line of text only."""
    particles = _PARTICLES.get(language)
    if particles is None or "\n" in text:
        return text
    end = _PARTICLE_END.search(text, max(0, len(text) - 40))
    if end is None or end.group(1).lower() not in particles:
        return text
    words = text[:end.start()].split(" ")
    verb = 1 if len(words) > 1 and words[0].lower().lstrip("¿¡") in _ASKS[language] else 0
    if len(words) < verb + 2 or not words[verb].isalpha() or (
            words[verb].lower() in _AUXILIARY):
        return text
    words[verb] = end.group(1) + words[verb].lower()
    return " ".join(words) + end.group(2)
