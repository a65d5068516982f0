"""Text normalization: one canonical form for look-alike prompts, shared by the sanitizer
(its detectors) and the cache (its keys); it lives in the core so that neither plugin
imports the other.

NFKC folds compatibility forms (full-width letters, ligatures) into their plain forms,
superscripts and subscripts aside ("2³" is not "23": detectors alone read them plain),
and a double low line (detectors read it as "_");
then control characters other than newline and tab and every
default-ignorable character that renders as nothing (zero-width, variation selectors,
bidi controls) are removed, and blanks that render as a space (Hangul fillers) become
one (`fold`, what the engine reads when it reads normalized text: the layout stays, so
code keeps its indentation); then, for cache keys and detectors, runs of spaces collapse
and the ends are stripped (`normalize`; a line's indentation stays: in code it is
meaning). Two prompts that render alike end up equal, so
the cache keys on one entry and detectors cannot be dodged with a zero-width space inside
a phrase.
"""

from __future__ import annotations

import re
import unicodedata

# C0/C1 controls except \t and \n; DEL; every format character (category Cf) and every
# Unicode default-ignorable code point (DerivedCoreProperties.txt) that renders as
# nothing: soft hyphen, combining grapheme joiner, Mongolian and other variation
# selectors, zero-width characters, bidi embeddings, overrides and isolates, BOM, the
# tag block used to smuggle invisible text. "ig\ufe0fnore" must read as "ignore".
_STRIP = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f"
    "\u00ad\u034f\u061c\u17b4\u17b5\u180b-\u180f\u200b-\u200f"
    "\u202a-\u202e\u2060-\u206f\ufe00-\ufe0f\ufeff\ufff0-\ufffb"
    # the rest of the format characters (category Cf): Arabic number and end-of-ayah
    # signs, annotation anchors, Kaithi and Egyptian format controls
    "\u0600-\u0605\u06dd\u070f\u0890\u0891\u08e2"
    "\U000110bd\U000110cd\U00013430-\U0001343f"
    "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e0fff]"
)
# What renders as a blank the width of a letter reads as a space: no-break and ideographic
# spaces, the Hangul fillers (NFKC turns U+3164 and U+FFA0 into U+1160) and the braille
# blank. "ignore\u3164all" is "ignore all" to its reader.
_WIDE_SPACES = str.maketrans({c: " " for c in "\u00a0\u3000\u115f\u1160\u3164\uffa0\u2800"})
_HAS_WIDE = re.compile("[\u00a0\u3000\u115f\u1160\u3164\uffa0\u2800]")
_SPACES = re.compile(r"(?<=\S) {2,}")  # (not a line's indentation: code's is meaning)
_CRLF = re.compile(r"\r\n?")


def _squeeze(text: str) -> str:
    return _SPACES.sub(" ", text) if "  " in text else text


# Superscripts and subscripts: NFKC reads "2³" as "23" and "m²" as "m2", which is not
# what the text says; `fold` keeps them (detectors still read them as digits and letters:
# `_AS`).
_SCRIPTS = "\u00b2\u00b3\u00b9" + "".join(map(chr, range(0x2070, 0x20a0)))
# A double low line ("\u2017") too: NFKC makes it a space and a combining double low
# line, which no reader sees ("ghp\u2017..." reached the detectors as "ghp \u0333...");
# it stays as written and detectors read it as "_" (`_AS`).
_KEPT = _SCRIPTS + "\u2017"
_SCRIPTED = re.compile(f"([{_KEPT}]+)")


def _nfkc(text: str) -> str:
    if unicodedata.is_normalized("NFKC", text):
        return text
    if not _SCRIPTED.search(text):
        return unicodedata.normalize("NFKC", text)
    return "".join(part if i % 2 else unicodedata.normalize("NFKC", part)
                   for i, part in enumerate(_SCRIPTED.split(text)))


def fold(text: str) -> str:
    """What renders alike, made alike, with the text's layout kept (indentation, blank
    lines, a part's trailing space): what the engine reads of a normalized text.
    Superscripts and subscripts stay as written ("2³" is not "23")."""
    if text.isascii() and text.isprintable():
        return text  # the common case: nothing to fold or strip
    out = _nfkc(text)
    if "\r" in out:
        out = _CRLF.sub("\n", out)
    out = _STRIP.sub("", out)
    if _HAS_WIDE.search(out):
        out = out.translate(_WIDE_SPACES)
    return out


def normalize(text: str) -> str:
    """`fold`, then runs of spaces as one and the ends stripped: the canonical form that
    cache keys and detectors read."""
    return canonical(fold(text))


# What the canonical form reads as the same, one character for another: a tab as a space
# (numbers and phrases split by tabs), a line or paragraph separator as a newline, any
# script's decimal digits as ASCII ones ("٤١١١" is 4111 to a reader, and a card), any
# dash or minus sign as a hyphen (a card grouped by en dashes, as a word processor
# writes it, is a card grouped by dashes), and a superscript or subscript as its plain
# form. Also the minus signs and hyphens Unicode files elsewhere than dashes ("\u02d7",
# "\u2043", "\u2796") and a low line's look-alike ("\u02cd"): each is the ASCII mark
# to a reader ("sk\u02d7proj-..." and "ghp\u02cd..." are keys), and a double low line
# (kept through NFKC: `_KEPT`).
_MARKS_AS = {"\u02d7": "-", "\u2043": "-", "\u2796": "-", "\u02cd": "_", "\u2017": "_"}


def _read_as() -> dict[str, str]:
    """Every non-ASCII dash (Pd) and decimal digit (Nd), as read: one scan of the code
    points (one per category cost import time)."""
    table: dict[str, str] = {}
    for c in map(chr, range(0x80, 0x110000)):
        kind = unicodedata.category(c)
        if kind == "Pd":
            table[c] = "-"
        elif kind == "Nd":
            table[c] = str(unicodedata.decimal(c))
    return table


_AS = str.maketrans({"\t": " ", "\u2028": "\n", "\u2029": "\n", "\u2212": "-",
                     **_MARKS_AS, **_read_as(), **{  # superscripts and subscripts (`fold`)
    c: unicodedata.normalize("NFKC", c) for c in _SCRIPTS
    if len(unicodedata.normalize("NFKC", c)) == 1}})
# Combining marks NFKC leaves on an ASCII letter or digit (no precomposed form): a
# strikethrough or an enclosing circle over "alice@..." or "4111 ..." that hides it
# from a pattern, not from a reader.
_MARKS = re.compile("(?<=[A-Za-z0-9])[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff"
                    "\u20d0-\u20ff\ufe20-\ufe2f]+")


# A run of characters outside ASCII: `_AS` reads no ASCII character but a tab as another,
# so only these runs go through its table (`str.translate` looks each character up in
# it: 64 KB of prose with a few words of Chinese cost 6 ms, its runs alone 0.3 ms).
_NON_ASCII = re.compile(r"[^\x00-\x7f]+")


def _translated(m: re.Match[str]) -> str:
    return m.group().translate(_AS)


def _as_read(folded: str) -> str:
    """`folded` one character for another as a reader reads it (`_AS`)."""
    if not folded.isascii():
        folded = _NON_ASCII.sub(_translated, folded)
    return folded.replace("\t", " ") if "\t" in folded else folded


def read_as(text: str) -> str:
    """`text` folded and read one character for another as detectors read it (`_AS`),
    its layout kept (no run of spaces squeezed, no end stripped): a character a
    detector decoded from an escape ("\\uff53", "%D0%BA"), read as the text's own are."""
    return _as_read(fold(text))


def canonical(folded: str) -> str:
    """A folded text's canonical form (`normalize` of the text it was folded from)."""
    return _squeeze(folded).strip()


def scanned(folded: str) -> str:
    """What detectors read of a folded text: its canonical form, read as a reader reads
    it (a tab as a space, any script's digits as digits, any dash as a hyphen, no marks
    laid over ASCII letters and digits): what hides a number or an address from a
    pattern, not from a reader or the model."""
    text = _as_read(folded)
    if not text.isascii():
        text = _MARKS.sub("", text)
    return canonical(text)


def scanned_places(folded: str) -> list[int]:
    """Where each character of `scanned(folded)` sits in `folded`, and its end last: a
    span a detector found, placed in the folded text."""
    read = _as_read(folded)  # (one character for one: the places are folded's)
    keep = list(range(len(read)))
    if not read.isascii():
        marks = {i for m in _MARKS.finditer(read) for i in range(m.start(), m.end())}
        keep = [i for i in keep if i not in marks]
    text = "".join(read[i] for i in keep)
    dropped: set[int] = set()
    if "  " in text:
        for m in _SPACES.finditer(text):  # a run keeps its first space
            dropped.update(range(m.start() + 1, m.end()))
    start, end = 0, len(text)
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    places = [keep[j] for j in range(start, end) if j not in dropped]
    return [*places, places[-1] + 1 if places else 0]
