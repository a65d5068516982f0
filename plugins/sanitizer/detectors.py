"""Detectors: each finds spans of one kind of sensitive text.

Regexes find candidates; where a kind has a checksum (payment cards: Luhn; Chinese
resident ids: ISO 7064 mod 11-2 plus a real birth date; IBAN: mod 97) a candidate only
counts when it passes, so card-like order numbers do not trip the card detector. Each
detector returns (start, end) spans and never keeps the matched text. Secrets live in
`credentials`, injection phrases in `injection`.

Shapes covered, by family: cards in groups separated by spaces, dots, dashes, slashes
or underscores (one kind per number), spaces and dashes mixed, or unseparated, each
starting with an issuer's digits and of a length that issuer's cards have (so an IMEI's
15 digits are none), not named as another Luhn-checked number just before it ("IMEISV:",
"SIN:"), with the CVV or expiry that
follows them, and a card split across two messages or two lines, blank lines between
them or not (`card_across`); US Social Security numbers (3-2-4 with dashes, or spaced
or bare where the text names one: "SSN: ...", a JSON or YAML key '"ssn": "..."', a
Markdown table's cell "| SSN | ... |"); UK National Insurance numbers (in pairs, or bare
where the text names one); phones with +/00 prefixes, a "(0)", parentheses,
dots, spaces or dashes, a NANP number with a leading 1, an extension, and after a phone
word ("call me at", "Tel:", "携帯") ten bare digits or a national number ("07700
900123"); e-mails in any script, written plainly, as "name at domain dot com",
"name[at]domain(dot)com", "name [at] domain.com" or "name @ domain . com", labels
joined by an ideographic full stop too; IBANs in either case, grouped by spaces or
dashes; dotted quads that are not a version number ("version 1.2.3.4").
"""

from __future__ import annotations

import bisect
import datetime as dt
import functools
import ipaddress
import re
import threading
from collections.abc import Callable, Iterator

from .credentials import (
    blanks_as_spaces,
    escapes_read,
    find_secrets,
    forget_escapes,
    may_escape,
    secrets_quiet,
    unescaped,
)
from .injection import INJECTION as _INJECTION
from .injection import injection_quiet
from .spans import Detector, Finder, Span, regex_finder, widened

__all__ = ["BUILTIN", "GATED", "INJECTION", "Detector", "Span", "card_across", "cn_id_ok",
           "custom", "iban_ok", "luhn_ok", "quiet",
           "quiet_ones"]

_regex = regex_finder


# Numbers (cards, ids, phones, IPv4) are found in two steps: one scan for runs of
# digit-ish characters, then the specific pattern only inside those short windows.
_NUMERIC_RUN = re.compile(r"\d[\d \-\u2010-\u2013()./_]{5,48}")
_MARGIN = 4  # room for a leading "+86 " or "(" and the patterns' look-arounds
# A run stops at 49 characters and the next one starts there: each window reaches this
# far past its run, so a number that a run's end cuts (and a card's CVV after it) is
# still read whole.
_REACH = 64


class _Memos(threading.local):
    """The last text's digit runs (`runs_of`), and of the last other text read between
    (`other_runs`: a window of the text decoded around its escapes, `with_escapes`, whose
    reading must not make the next detector scan the whole text again). One pair per
    thread: a long prompt is read in the sanitizer's thread while the loop reads short
    ones, and each one's `forget` (or its texts) dropped the other's memo mid-scan (64 KB
    of HTML read in the thread cost 5 times its CPU time)."""
    runs_of: tuple[str, list[Span], list[Span]] = ("", [], [])
    other_runs: tuple[str, list[Span], list[Span]] = ("", [], [])


_memos = _Memos()


def _numeric_runs(text: str) -> list[Span]:
    """Digit runs of `text`, computed once for the detectors that run one after another
    on the same string (one memo per thread: `_Memos`)."""
    return _scanned(text)[1]


def _windows(text: str) -> list[Span]:
    """Where the numeric patterns look: each run with its margin and reach, overlapping
    windows merged (each place is read once: on number-dense text, separate windows
    read each number several times, and reported it as often)."""
    return _scanned(text)[2]


def _scanned(text: str) -> tuple[str, list[Span], list[Span]]:
    memos = _memos
    first, other = memos.runs_of, memos.other_runs
    if first[0] is text:
        return first
    if other[0] is text:
        return other
    runs = [m.span() for m in _NUMERIC_RUN.finditer(text)]
    scan = (text, runs, widened(runs, len(text), _MARGIN, _REACH))
    if not first[0]:
        memos.runs_of = scan  # (the first text since `forget`: the one every detector reads)
    else:
        memos.other_runs = scan
    return scan


def forget() -> None:
    """Drop the last text's digit runs and its reading with escapes decoded: the
    detectors' memos must not keep a prompt alive (or readable in a heap dump) once its
    scan is over (this thread's: `_Memos`)."""
    _memos.runs_of = _memos.other_runs = ("", [], [])
    forget_escapes()


#: Another reading of a text: what a detector reads instead, and where a span found in
#: it sits in the text (None: nowhere).
Reading = tuple[str, Callable[[int, int], Span | None]]


def _also_reading(find: Finder, readings: Callable[[str], Iterator[Reading]]) -> Finder:
    """`find`, and over each other reading of its text (`readings`, asked once `find`
    has read the text as written), each span placed back in the text; one found in two
    readings ("%40" found as written too) is yielded once."""
    def both(text: str) -> Iterator[Span]:
        seen: set[Span] = set()
        for span in find(text):
            seen.add(span)
            yield span
        for view, place in readings(text):
            for a, b in find(view):
                placed = place(a, b)
                if placed is not None and placed not in seen:
                    seen.add(placed)
                    yield placed

    return both


def _unescaped(text: str) -> Iterator[Reading]:
    """`text` with its escapes decoded, around the escapes only (`escapes_read`)."""
    if may_escape(text) and (pieces := escapes_read(text)) is not None:
        for view, at in pieces:  # (an escaped blank letter a space, as `fold` reads it)
            yield blanks_as_spaces(view), functools.partial(_through, at)


def _through(at: list[int], a: int, b: int) -> Span:
    """A span of a reading placed by where each of its characters starts (`at`)."""
    return at[a], at[b]


def with_escapes(find: Finder) -> Finder:
    """`find`, and over its text with the escapes decoded where it holds any, each span
    placed back over the escapes it was read from."""
    return _also_reading(find, _unescaped)


# A word spelled out one character at a time ("s k - p r o j - ...", "i g n o r e  a l l
# p r e v i o u s": normalizing squeezed the double spaces between its words): a reader
# reads the characters joined, a pattern reads single letters. A run of `_SPACED_LEAST`
# one-character words or more is read again joined (each start tries at most the
# run's length: linear, whatever the text).
_SPACED_LEAST = 12
_SPACED_RUN = re.compile(rf"(?<!\S)\S(?: \S){{{_SPACED_LEAST - 1},}}(?!\S)")


# Whether a text may hold such a run, asked of its UTF-8 bytes (C speed: the pattern's
# scan cost 4 KB of prose 60 us, for each of two detectors): a continuation byte dropped
# (each character one byte), a blank as " ", any other byte as "a"; a run of twelve
# one-character words is twelve "a"s a space apart there.
_SPACED_BYTES = bytes(0x20 if chr(b) in " \t\n\r\x0b\x0c" else 0x61 for b in range(256))
_CONTINUATION = bytes(range(0x80, 0xC0))
_SPACED_NEEDLE = b" ".join([b"a"] * _SPACED_LEAST)


def may_be_spaced(text: str) -> bool:
    """Whether `text` may hold a run of one-character words that `with_spaced` reads (a
    strict superset of where `_SPACED_RUN` matches)."""
    return _SPACED_NEEDLE in text.encode("utf-8", "surrogatepass").translate(
        _SPACED_BYTES, _CONTINUATION)


def _joined(text: str) -> Iterator[Reading]:
    """Each run of one-character words of `text` (`_SPACED_RUN`) read joined, one
    character for two ("x ")."""
    if not may_be_spaced(text):
        return
    for m in _SPACED_RUN.finditer(text):
        yield m.group()[::2], functools.partial(_spread, m.start())


def _spread(at: int, a: int, b: int) -> Span | None:
    """A span of a run read joined, placed back over the run (at `at`) it was read from:
    from its first character to its last (an empty one nowhere)."""
    return (at + 2 * a, at + 2 * (b - 1) + 1) if b > a else None


def with_spaced(find: Finder) -> Finder:
    """`find`, and over each run of one-character words of its text read joined
    (`_SPACED_RUN`), each span placed back over the characters it was read from."""
    return _also_reading(find, _joined)


def _numeric(pattern: str, check: Callable[[str], bool] | None = None,
             ) -> Callable[[str], Iterator[Span]]:
    rx = re.compile(pattern)

    def find(text: str) -> Iterator[Span]:
        for lo, hi in _windows(text):
            for m in rx.finditer(text, lo, hi):
                if check is None or check(m.group(0)):
                    yield m.span()

    return find


def luhn_ok(candidate: str) -> bool:
    digits = [int(c) for c in candidate if c.isdigit()]
    if not 13 <= len(digits) <= 19 or len(set(digits)) == 1:
        return False
    total = 0
    for i, d in enumerate(reversed(digits)):
        if i % 2:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


# A card's first digits, as the networks assign them: 2221-2720 (Mastercard's 2-series:
# no card starts 19xx or 20xx, so runs of years are none), 30 and 34-39 (Diners, Amex,
# JCB; no card starts 31-33), 4-6 (Visa, Mastercard, Maestro, Discover, UnionPay), 81
# and 82 (RuPay, UnionPay).
_ANY_ISSUER = re.compile(r"222[1-9]|22[3-9]\d|2[3-6]\d\d|27[01]\d|2720|3[04-9]|[4-6]|8[12]")
# The lengths each issuer's cards have, the commonest first digits aside (16 to 19:
# every issuer but Amex): 15 digits are Amex (34, 37) or Maestro, 14 Diners (30, 36, 38,
# 39) or Maestro, 13 Visa or Maestro. An IMEI (15 digits, its last a Luhn check, its
# first two a reporting body's: 35, 49, 86, ...) is no card: "IMEI 490154203237518".
_MAESTRO = r"50(?:18|20|38)|5893|6304|6759|676[1-3]"
_SHORT_CARD = {
    15: re.compile(rf"3[47]|{_MAESTRO}"),
    14: re.compile(rf"3[0689]|{_MAESTRO}"),
    13: re.compile(rf"4|{_MAESTRO}"),
}
# 16 to 19 digits: JCB's 35 is 3528-3589 only (an IMEISV starts 35 too).
_LONG_CARD = re.compile(r"(?!35(?:[0-1]|2[0-7]|9))")


def issuer_length_ok(number: str) -> bool:
    """`number` (digits only) starts as a card of its length does."""
    if not _ANY_ISSUER.match(number):
        return False
    if len(number) >= 16:
        return _LONG_CARD.match(number) is not None
    short = _SHORT_CARD.get(len(number))
    return short is not None and short.match(number) is not None


_TAIL = re.compile(r"(?<!\d)\d(?:[ .-]{0,3}\d)*$")
_HEAD = re.compile(r"\s*(\d(?:[ .-]{0,3}\d)*)")


def card_across(texts: list[str]) -> Iterator[tuple[int, Span]]:
    """Card numbers split over the end of one text and the start of the next (two
    messages, two lines): yields (text index, span) for both parts. Each part needs 4
    digits or more, and the whole a card's length and an issuer's first digits: tables
    and logs put numbers at the ends of lines, and one pair in ten passes Luhn."""
    for i in range(len(texts) - 1):
        a = texts[i].rstrip().rstrip(".-_/ ")  # "4111-1111-" then "1111-1111"
        off = max(0, len(a) - 64)
        tail = _TAIL.search(a, off)
        head = _HEAD.match(texts[i + 1][:64])
        if tail is None or head is None:
            continue
        left = re.sub(r"\D", "", tail.group(0))
        right = re.sub(r"\D", "", head.group(1))
        number = left + right
        if (len(left) >= 4 and len(right) >= 4 and 14 <= len(number) <= 19
                and issuer_length_ok(number) and luhn_ok(number)):
            yield i, tail.span()
            yield i + 1, head.span(1)


_CN_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_CN_CHECK = "10X98765432"


def cn_id_ok(candidate: str) -> bool:
    s = candidate.upper()
    if len(s) != 18 or not s[:17].isdigit():
        return False
    try:
        born = dt.date(int(s[6:10]), int(s[10:12]), int(s[12:14]))
    except ValueError:
        return False
    if not dt.date(1900, 1, 1) <= born <= dt.date.today():
        return False
    total = sum(int(c) * w for c, w in zip(s[:17], _CN_WEIGHTS, strict=True))
    return _CN_CHECK[total % 11] == s[17]


# Countries that issue IBANs (SWIFT's registry): a candidate written in lower case must
# start with one of them, so that ordinary words with digits are not read as one.
_IBAN_COUNTRIES = frozenset("""
AD AE AL AT AZ BA BE BG BH BI BR BY CH CR CY CZ DE DJ DK DO EE EG ES FI FK FO FR GB GE GI
GL GR GT HN HR HU IE IL IQ IS IT JO KW KZ LB LC LI LT LU LV LY MC MD ME MK MN MR MT MU NI
NL NO OM PK PL PS PT QA RO RS RU SA SC SD SE SI SK SM SO ST SV TL TN TR UA VA VG XK YE
""".split())


# The letters outside ASCII that `_IBAN`'s case-insensitive groups match and `upper`
# keeps: a capital I with a dot and the Kelvin sign, read as the letters they are.
_IBAN_FOLDED = str.maketrans({"\u0130": "I", "\u212a": "K"})


def iban_ok(candidate: str) -> bool:
    s = candidate.replace(" ", "").replace("-", "")
    if s != s.upper() and s[:2].upper() not in _IBAN_COUNTRIES:
        return False
    s = s.upper().translate(_IBAN_FOLDED)
    if not all(c.isdecimal() or "A" <= c <= "Z" for c in s):
        return False  # (each one a base-36 digit: no other letter reaches `int`)
    if not 15 <= len(s) <= 34:
        return False
    rearranged = s[4:] + s[:4]
    number = "".join(str(int(c, 36)) for c in rearranged)
    return int(number) % 97 == 1


def _ip_ok(candidate: str) -> bool:
    """An IPv6 address that could name a host: three groups or more (`s[::-1]`, `a[1::2]`
    and `dead::beef` are code), and not one that names no one (loopback, unspecified,
    link-local, multicast)."""
    if sum(1 for g in candidate.split(":") if g) < 3:
        return False
    try:
        ip = ipaddress.ip_address(candidate)
    except ValueError:
        return False
    return _names_a_host(ip)


def _names_a_host(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    return not (ip.is_loopback or ip.is_unspecified or ip.is_link_local or ip.is_multicast)


# Netmasks (255.255.255.0) and the broadcast address are no one's address either.
_MASKS = frozenset(str(ipaddress.IPv4Network(f"0.0.0.0/{n}").netmask) for n in range(8, 33))


# "name at domain dot com", "name[at]domain(dot)com", "name (at) domain [dot] co [dot] uk".
# Spanish and Italian spell them "arroba" and "punto" ("juan arroba ejemplo punto es"):
# "punto" marks a dot only after an "at", before a top-level domain, as "dot" does.
# Spelled-out addresses are found from their "at" (every run below is bounded, so a text
# made of thousands of "a dot b at c" costs linear time): the local part just before it
# (with up to two earlier parts joined by a spelled "dot"), then domain labels after it
# ending in a spelled "dot" and a common top-level domain ("dot by dot" is not one).
_AT_TOKEN = re.compile(
    r"\s{0,3}(?:[\[({<]\s{0,3}(?:at|arroba|@)\s{0,3}[\])}>]|(?<=\s)(?:at|arroba)(?=\s)|@)"
    r"\s{0,3}",
    re.IGNORECASE)
_DOT = (r"(?:\s{0,3}[\[({<]\s{0,3}(?:dot|punto|\.)\s{0,3}[\])}>]\s{0,3}"
        r"|\s{1,3}(?:dot|punto)\s{1,3})")
_LABEL = r"(?!(?:the|a|an|my|your|our|this|that|home|work|least|most|all)\b)[a-z0-9-]{1,63}"
_TLD = ("(?:com|net|org|edu|gov|mil|int|io|co|ai|app|dev|info|biz|me|xyz|online|site|"
        "uk|us|ca|au|nz|ie|de|fr|es|it|nl|be|ch|at|se|no|dk|fi|pl|cz|pt|gr|ru|ua|tr|il|"
        "in|cn|hk|tw|jp|kr|sg|my|id|th|vn|ph|br|mx|ar|cl|za|ng|ke|eg|ae|sa|travel|tech|"
        "shop|store|cloud|email|live|blog|news|agency|studio|design|space|today|world|"
        "solutions|consulting|company|network|systems|digital|media|group|team|tv|fm|ly)")
_DOMAIN_AFTER = re.compile(rf"{_LABEL}(?:(?:{_DOT}|\.){_LABEL}){{0,4}}{_DOT}{_TLD}\b",
                           re.IGNORECASE)
# After an "@" or a bracketed "[at]", the dots may be written plainly too, spaced out or
# not ("jane @ example . com", "jane[at]example.com"); after a bare " at " only a spelled
# "dot" marks an address ("look at example.com" is not one).
_DOMAIN_LOOSE = re.compile(
    rf"{_LABEL}(?:(?:{_DOT}|\s{{0,3}}\.\s{{0,3}}){_LABEL}){{0,4}}"
    rf"(?:{_DOT}|\s{{0,3}}\.\s{{0,3}}){_TLD}\b", re.IGNORECASE)
_PART_BEFORE = re.compile(rf"[\w.%+-]{{1,64}}{_DOT}\Z", re.IGNORECASE)
# Where the loose forms can start: an "@" with a space beside it, or a bracketed "at".
_LOOSE_AT = re.compile(r"\s@|@\s|[\[({<]\s{0,3}(?:at|arroba|@)\s{0,3}[\])}>]", re.IGNORECASE)
# Words that come before " at X dot com" in talk about a company, not a mailbox ("I worked
# at Amazon dot com", "we met at startup dot io").
_NOT_A_MAILBOX = frozenset("""
worked work works working job jobs was were is are be been am me us him her them it
met meet meeting live lived living stay stayed look looked looking here there anyone
someone everyone people employee employees engineer engineers intern internship
career careers shop shopped buy bought order ordered sell sold available found find
site sites hosted host located based online page pages app website
""".split())
# Words before a bare "arroba" that name no mailbox: "arroba" is a unit of weight and the
# "@" sign's name, and "punto es" ("the point is") everyday Spanish ("una arroba exacta
# punto es ...", "el signo arroba sirve punto de partida").
_NOT_A_MAILBOX_ES = frozenset("""
un una unos unas el la los las lo media medio cada por de del al en con sin y o e es son
era fue esa ese esta este otra otro otras otros su sus mi mis tu tus signo símbolo simbolo
usa uso usar pon poner escribe escribir
""".split())


# A bare "punto" before a top-level domain that is a Spanish or Italian word as often
# ("de", "in", "me", "no", "se"), and a word after it on the line: the phrase goes on,
# no address ends there ("Juan at casa punto de vista", "punto in comune", "punto me
# dijo"). Where a comma, a full stop, a bracket or the line's end follows, or "dot" or a
# bracketed "(punto)" was written, the address is one as before.
_PUNTO_WORD = re.compile(r"\spunto\s{1,3}(?:de|in|me|no|se)\Z", re.IGNORECASE)
# (A capitalized word after it starts the next sentence, its full stop left out: "hans at
# firma punto de Gracias" ends the address; a word in capitals alone, "PUNTO DE VISTA",
# is shouted, and goes on.)
_WORD_GOES_ON = re.compile(r"[ \t]+([^\W\d_]\w*)")
_PUNTO_REACH = 12  # (" punto", three blanks, a two-letter domain)


def _punto_phrase(text: str, start: int, end: int) -> bool:
    """Whether the domain spelled from `start` to `end` ends in a bare "punto" and a
    word of the phrase it goes on with (`_PUNTO_WORD`): a word follows on its line."""
    word = _WORD_GOES_ON.match(text, end)
    if word is None or (word[1][0].isupper() and not word[1].isupper()):
        return False
    return _PUNTO_WORD.search(text, max(start, end - _PUNTO_REACH), end) is not None


def _loose_at(text: str) -> bool:
    """Whether a loose form may start here: an "@" with a space beside it, or a
    bracketed "at" or "@" (found by searching for the separators, not with a regex over
    the whole text)."""
    i = text.find("@")
    while i != -1:
        if (i and (text[i - 1].isspace() or text[i - 1] in "[({<")) or (
                i + 1 < len(text) and text[i + 1].isspace()):
            return True
        i = text.find("@", i + 1)
    if "[" in text or "(" in text or "{" in text or "<" in text:
        return _LOOSE_AT.search(text) is not None
    return False


def _local_char(c: str) -> bool:
    return c.isalnum() or c in "._%+-"


def _local_start(text: str, start: int, floor: int) -> int:
    """The local part reaches on over an apostrophe or "!" between its letters
    ("o'brien@...", "jane!doe@..."): none of it stays outside the redaction."""
    while (start - 2 >= floor and text[start - 1] in "'!" and text[start - 2].isalnum()):
        start -= 2
        while start > floor and _local_char(text[start - 1]):
            start -= 1
    return start


def _spelled_emails(text: str) -> Iterator[Span]:
    last = 0
    for at in _AT_TOKEN.finditer(text):
        if at.start() < last:
            continue
        word = at.group(0).strip().lower()
        bare = word in ("at", "arroba")
        domain = (_DOMAIN_AFTER if bare else _DOMAIN_LOOSE).match(text, at.end())
        if domain is None or _punto_phrase(text, at.end(), domain.end()):
            continue
        start = at.start()
        while start > last and at.start() - start < 64 and _local_char(text[start - 1]):
            start -= 1
        local = text[start:at.start()].lower()
        if start == at.start() or (bare and (local in _NOT_A_MAILBOX or (
                word == "arroba" and local in _NOT_A_MAILBOX_ES))):
            continue
        for _ in range(2):  # "jane dot doe at ...": earlier parts of the local name
            part = _PART_BEFORE.search(text, max(last, start - 80), start)
            if part is None:
                break
            start = part.start()
        last = domain.end()
        yield start, last


# A phone word glued to the "+" or "00" of the number it names ("tel+4915112345678",
# "phone+442079460958", "Mob00447700900123"): a label, as "tel:" is. Any other word
# glued to a "+" is a sum or a name ("n+100000000", "C++"), not a number to call.
# A short label is one only as a word of its own: "graph+4420...", "hotel+49..." and
# "recall+44..." end in one and are sums; the long ones end compounds ("smartphone+44").
_GLUED_PHONE_WORD = "".join(f"|(?<=(?<![^\\W\\d_])(?i:{w}))" for w in (
    "tel", "mob", "cell", "fax", "tlf", "telp", "fone", "ph", "sms", "call")) + "".join(
    f"|(?<=(?i:{w}))" for w in ("phone", "mobile", "whatsapp", "handy", "telefax"))
# International numbers (+ or 00, an optional "(0)"), and North-American shapes whose area
# code and exchange start with 2-9 (so "100 200 3000" is not one).
# (A hex word that starts with "00" and digits, "00984641abcdef...", is none:
# `_in_hex_word`.) The "+" or "00" and the digit after it are looked for first
# (`(?=(?:\+|00)[1-9])`, the same matches): the sixteen look-behinds before it, tried at
# every place of every window, cost 64 KB of logs 85 ms, where the look-ahead leaves 13;
# asked for "00" alone, 64 KB of "0000..." still cost 68 ms (every place one), 8 with
# its digit.
_PHONE = (rf"(?=(?:\+|00)[1-9])(?:(?<![\w+]){_GLUED_PHONE_WORD})(?:\+|00)[1-9]\d{{0,2}}"
          r"(?:[ .\-\u2013]?\(0\))?(?:[ .\-\u2013]?\(?\d{1,4}\)?)"
          r"(?:[ .\-\u2013]?\d{2,4}){2,4}(?!\d)"
          r"|(?<![\d.-])\(\d{3}\)[ .\-\u2013]?\d{3}[ .\-\u2013]?\d{4}(?![\d-])"
          r"|(?<![\w.+-])(?:1[ .\-\u2013]?)?[2-9]\d{2}(?P<ps>[ .\-\u2013])[2-9]\d{2}(?P=ps)\d{4}"
          r"(?=\s?(?:x|ext\.?)\s?\d|(?![\w-]|\.\d))")  # (its extension: _EXTENSION)
# A number written without its country code ("07700 900123", "030 12345678",
# "0151/23456789", "090-1234-5678", "(02) 9876 5432", "(11) 91234-5678", India's "98765
# 43210"), or ten digits unseparated ("4155550132"), only where the text says it is a
# number to call or a contact ("Mob:", "Kontakt:", "contact"): bare, they are as often
# order numbers, dates or counters.
_PHONE_SAID = re.compile(
    r"\b(?:phone|tel|telephone|call|calling|mobile|cell|cellphone|text\s+me|sms|whatsapp|"
    r"fax|reach\s+me|ring\s+me|dial|telefon|teléfono|telefono|téléphone|tél|handy|móvil|"
    r"celular|portable|contact[oe]?|kontakt|mob|tlf|telp|fone|"
    # "call" in other languages ("appelez-moi au 06 ...", "llámame al ...")
    r"appel(?:ez|er|le)|llam(?:ar|a|ame)|llámame|chiama(?:mi|re)?|anrufen|ruf|ligue|"
    r"(?:my|our|his|her|their|contact)\s+number|電話|电话|携帯|手机|전화)"
    r"\b\.?(?:[\s-]+(?:me|us|him|her|them|at|on|is|number|no\.?|#|nummer|número|numéro|"
    r"moi|le|au|al|mich|an|unter|mi)){0,3}"
    r"[\s\"'`|]{0,3}[:=]?[\s\"'`|]{0,3}(?P<n>(?:\+?1[ .\-\u2013]?)?[2-9]\d{2}[2-9]\d{6}"
    r"|\(?0\d{1,4}\)?(?:[ ./\-\u2013]?\d{2,5}){1,4}|\(\d{2}\)\s?\d{4,5}[ .\-\u2013]?\d{4}"
    r"|[6-9]\d{4}[ \-]\d{5})"
    r"(?![\w-]|\.\d)",
    re.IGNORECASE)
_PHONE_WORDS = ("phone", "tel", "call", "mob", "cell", "text", "sms", "whatsapp", "fax",
                "reach", "ring", "dial", "tél", "handy", "móvil", "celular", "portable",
                "number", "contact", "kontakt", "tlf", "telp", "fone", "appel", "llam", "llám",
                "chiama", "anruf", "ruf", "ligue",
                "電話", "电话", "携帯", "手机", "전화")
# (not digits inside a hex word, "0x7ffd13812345678f": `_in_hex_word`)
_CN_MOBILE = r"(?<!\d)(?:(?:\+|00)?86[ .-]?)?1[3-9]\d[ .-]?\d{4}[ .-]?\d{4}(?!\d)"
# Unseparated, or in groups with one kind of separator throughout: 4-4-4-4(-3), 4-6-5;
# or spaces and dashes mixed, as typed by hand ("4111 1111-1111 1111", "3714 496353-98431":
# tried first, as the one-kind form stops at the first change of separator, too short);
# then perhaps what often follows a card number: its CVV or expiry ("4111 ... 1111 123",
# "4111...1111/12/27"), redacted with it.
# A "." just before is a decimal's, a version's or a name's ("3.4111...", "img.4379....png"),
# unless it ends an abbreviation that names a number ("no.4111...", "Nr.4111...":
# `_CARD_LABEL_DOT`).
# (Not a comma between groups: "2023,2024,2025,2026" is a list of years, and one such
# list in ten passes Luhn.)
# A run of decimal digits inside a longer hex word (a hash, an address, `xxd -p`'s
# lines: 16 hex digits in a row are all decimal one time in 2,000) is none
# ("0x7ffd4546252854754769": `_in_hex_word`); one glued to a label is ("card4111...").
# The abbreviations that name a number before their dot ("no.", "Nr.", "Kartennr.",
# "nº.", "Num.", "Ref.", "Acct."): a dot after any other word is a file's, a path's or
# a dotted name's ("backup.4485...tar.gz", "img.4379....png"), and an id there is none.
# (Each a lookbehind of its own width; "nr" ends a German compound too.)
_CARD_LABEL_DOT = "".join(f"|(?<=(?<![^\\W\\d_]){w}\\.)" for w in (
    "(?i:no)", "(?i:n\u00ba)", "(?i:nro)", "(?i:num)", "(?i:ref)", "(?i:acct)")) + (
    "|(?<=(?i:nr)\\.)")
_CARD_SEP = r"[./_]"  # (spaces and dashes: `_CARD_MIX`, which takes them one kind or mixed)
_CARD_MIX = r"(?: ?- ?| )"
_CARD_TAIL = r"(?:[ ./_,-]| - |, )(?:\d{3,4}|\d{2}/\d{2,4})"
# (Every branch starts with four digits, looked for first: `(?=\d{4})`, the same matches,
# spares each place of a window the seven look-behinds before them.)
_CARD = (rf"(?=\d{{4}})(?<![\d,-])(?:(?<!\.){_CARD_LABEL_DOT})(?:\d{{13,19}}"
         rf"|\d{{4}}{_CARD_MIX}\d{{4}}(?:{_CARD_MIX}\d{{4}}){{1,2}}(?:{_CARD_MIX}\d{{1,4}}(?![\d/]))?"
         rf"|\d{{4}}{_CARD_MIX}\d{{6}}{_CARD_MIX}\d{{4,5}}"
         rf"|\d{{4}}(?P<s>{_CARD_SEP})\d{{4}}(?:(?P=s)\d{{4}}){{1,2}}(?:(?P=s)\d{{1,4}}(?![\d/]))?"
         rf"|\d{{4}}(?P<t>{_CARD_SEP})\d{{6}}(?P=t)\d{{4,5}})(?:{_CARD_TAIL})?"
         r"(?![\d]|[.,-]\d)")
_TAIL_AT_END = re.compile(_CARD_TAIL + "$")


def _card_ok(candidate: str) -> bool:
    """Luhn on the number, with or without what follows it (a CVV or expiry), and an
    issuer's first digits (`_ANY_ISSUER`): lists of
    numbers ("1000 2000 3000 4000", "8080 8443 9090 3000") pass Luhn one time in ten."""
    if luhn_ok(candidate) and issuer_length_ok(re.sub(r"\D", "", candidate)):
        return True
    tail = _TAIL_AT_END.search(candidate)
    if tail is None:
        return False
    number = candidate[: tail.start()]
    return luhn_ok(number) and issuer_length_ok(re.sub(r"\D", "", number))


# What names a card's security code or expiry a few words after it ("... 1111 exp 12/27
# cvv 123"): redacted with the number.
_CARD_EXTRA = re.compile(
    r"[\s,;]{1,3}(?:(?:exp(?:iry|ires|iration)?(?:\s+date)?|valid\s+(?:thru|through|until)|"
    r"cvv2?|cvc2?|csc|cid|security\s+code)\.?\s{0,2}[:#=]?\s{0,2}"
    r"(?:\d{3,4}|\d{1,2}\s?/\s?\d{2,4})(?!\d))", re.IGNORECASE)
_CN_ID = r"(?<![0-9Xx])\d{17}[0-9Xx](?![0-9Xx])"
# Grouped by spaces or dashes, in either case ("de89 3704 ...", "DE89-3704-...").
_IBAN = r"(?i:\b[A-Z]{2}\d{2}(?:[ -]?[A-Z0-9]{4}){2,7}(?:[ -]?[A-Z0-9]{1,4})?\b)"
# Zero-padded to three digits too ("192.168.001.001"); two-digit padding is left to
# dates, times and versions ("01.02.03.04").
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|0\d\d|[1-9]?\d)"
_IPV4 = rf"(?<![\d.]){_OCTET}(?:\.{_OCTET}){{3}}(?!\d|\.\d)"  # (at a sentence's end too)
_IPV6 = r"(?<![\w:.])[0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{0,4}){2,7}(?![\w:])"  # checked by ipaddress


def _find_email(text: str) -> Iterator[Span]:
    yield from _email_plain(text)  # (URL-encoded, "jane%40example.com": `with_escapes`)
    if _may_spell_email(text):
        yield from _spelled_emails(text)


def _may_spell_email(text: str) -> bool:
    # (in any case, as `_DOT` and `_AT_TOKEN` read them: "dOt"; one `lower` and three
    # searches cost a third of nine searches for the cases one by one)
    low = text.lower()
    return "dot" in low or "punto" in low or "arroba" in low or _loose_at(text)


# An address is found from its separator, in linear time whatever the text: its domain
# matched forwards from the separator (bounded labels), then its local part, the run of
# address characters (at most 64) just before the separator. (A regex over a window
# around each separator backtracked for seconds on 64 KiB of "%40%40..." or "a@a@...".)
# Labels and top-level domains in any script ("jöhn@exämple.de", "用户@例子.中国"), or
# in their ASCII form ("xn--..."). An ideographic full stop separates labels as a dot
# does (IDNA reads "例子。中国" so; NFKC folds the full-width dot, not this one), but
# it also ends a CJK sentence: after it, only a common top-level domain (either case,
# CJK text right after it or not) or a CJK one that registries delegate (not running
# into a word, but for a thank-you) ends an address ("x@qq.com。谢谢" ends at ".com",
# "用户@例子。中国谢谢" at "中国"; "感谢@张三。我们...", "通知@王五。中国队赢了" and
# "感谢@张三。OK" are mentions).
_DOMAIN = re.compile(
    r"[\w-]{1,63}(?:[.\u3002][\w-]{1,63}){0,8}"
    r"(?:\.(?P<tld>[^\W\d_]{2,24}|xn--[a-z0-9-]{1,59})\b"
    rf"|\u3002(?P<itld>(?:(?i:{_TLD})|xn--[a-z0-9-]{{1,59}})(?![A-Za-z0-9])"
    r"|(?:中国|中國|公司|网络|網絡|香港|台湾|台灣|新加坡|한국)(?![^\W_](?<!谢))))")
# File names that read like addresses ("logo@2x.png", "icon%402x.webp"): their "top-level
# domain" is a file type no registry delegates (.zip, .mov, .py, .md are real TLDs).
_FILE_TYPES = frozenset({"png", "jpg", "jpeg", "gif", "svg", "webp", "ico", "bmp", "tif",
                         "tiff", "avif", "heic", "css", "js", "mjs", "ts", "json", "html",
                         "htm", "txt", "csv", "xml", "yaml", "yml", "mp3", "mp4", "wav",
                         "ogg", "webm", "woff", "woff2", "ttf", "otf", "pdf", "exe", "dll",
                         "tar", "gz", "tgz"})
_HOST_TLD = re.compile(r"\.([^\W\d_]{2,24})\Z")  # a host that still ends in a TLD-like label
# Hosts, not mailboxes: names no registry delegates ("pi@raspberrypi.local",
# "postgres@db.internal"), and an scp or git remote ("git@github.com:user/repo.git").
_PRIVATE_TLDS = frozenset({"local", "internal", "lan", "localdomain", "localhost", "home",
                           "corp", "intranet", "test", "invalid", "example"})
_REMOTE_PATH = re.compile(r":(?:~|[\w.-]*/)")  # (a port or "addr:password" is no path)
_ASSET_SCALE = re.compile(r"\d+(?:\.\d+)?x\.", re.IGNORECASE)  # "icon@2x.min.png"


def _emails_at(at: str, local: str) -> Callable[[str], Iterator[Span]]:
    tail = re.compile(rf"[{local}]+\Z")

    def find(text: str) -> Iterator[Span]:
        last = 0
        i = text.find(at)
        while i != -1:
            domain = _DOMAIN.match(text, i + len(at))
            end = domain.end() if domain is not None else -1
            top = "" if domain is None else (domain["tld"] or domain["itld"]).lower()
            if domain is not None and domain["tld"] and top in _FILE_TYPES:
                # "logo@2x.png" is a file; "bob@example.com.pdf" an address and a file
                # type after it: the address ends a label earlier, if it still has a TLD.
                host = text[i + len(at):domain.start("tld") - 1]
                tld = _HOST_TLD.search(host)
                end = (-1 if tld is None or tld[1].lower() in _FILE_TYPES
                       or _ASSET_SCALE.match(host) else domain.start("tld") - 1)
            if end != -1 and (domain is not None and (
                    top in _PRIVATE_TLDS
                    or _REMOTE_PATH.match(text, end) is not None)):
                end = -1
            if end != -1:
                lo = max(last, i - 64)
                part = tail.search(text, lo, i)  # the local part: the run just before
                if part is not None:
                    start = part.start()
                    # Longer than an address's 64 characters: the rest of the run goes
                    # with it, so none of it is left beside the placeholder.
                    while start == lo and start > last and _local_char(text[start - 1]):
                        start -= 1
                        lo = start
                    yield _local_start(text, start, last), end
                    last = end
            i = text.find(at, max(i + 1, last))

    return find


_email_plain = _emails_at("@", r"\w.%+-")  # local parts in any script ("jöhn@...")
_ip_v4 = _numeric(_IPV4)
_ip_v6 = _regex(_IPV6, check=_ip_ok, needs=(":",))


# A dotted quad that is a version or a section number, not an address: after "version",
# "v", "build", "release", "firmware", "kernel", "section" ... ("version 1.2.3.4",
# '__version__ = "1.2.3.4"', "v10.0.0.1"), after a package or product name ("torch==",
# "numpy-", "Chrome/"), or with a pre-release tag after it ("1.2.3.4-beta").
_VERSION_BEFORE = re.compile(
    r"(?:(?:version|(?<![A-Za-z])(?:ver|release|build|v))\.?_{0,2}[\s:=\"'(-]{0,4}"
    r"|(?<![A-Za-z])(?:firmware|fw|kernel|cuda|cudnn|section|clause|chapter|paragraph|"
    r"figure|fig|appendix|step|rule|oid|python|java|ruby|php|perl|gcc|clang|go|rust|"
    r"dotnet|windows|ios|android|macos|chrome|firefox)\.?[\s:=\"'(]{1,4}"
    r"|\bv|==|(?-i:\b[A-Z][A-Za-z]+/)|§\s?"  # (a product token: "Chrome/120.0.0.0")
    r"|(?<=[\w\]])\s?(?:==|[<>~!]=)\s?)\Z",  # a requirement: "numpy>=1.2.3.4", "torch == "
    re.IGNORECASE)
_TAG_AFTER = re.compile(r"-(?:alpha|beta|rc|snapshot|dev|pre|preview|final|stable|ga|"
                        r"release|nightly)\b", re.IGNORECASE)


# A package's file or release name: a name joined to a version by "-" or "_", where
# what is around it says package: a distribution's file after it ("-py3-none-any.whl",
# "-cp311-...", ".tar.gz") or an installer before it ("pip install numpy-1.26.0.1"). A
# name joined to an address otherwise is a host's ("web-3.120.45.67", "srv01-8.8.8.8").
_PACKAGE_BEFORE = re.compile(
    r"(?<![\w.-])[A-Za-z][A-Za-z0-9]+(?:[.-][A-Za-z][A-Za-z0-9]*)*[-_]\Z")
_PACKAGE_FILE_AFTER = re.compile(
    r"(?:[-_.](?:py\d|cp\d|pp\d|whl\b|tar\b|tgz\b|zip\b|egg\b|src\b|dist\b|"
    r"sdist\b|any\b|none\b|manylinux|macosx|win_?(?:amd64|32)|linux_))", re.IGNORECASE)
_INSTALLER_BEFORE = re.compile(
    r"\b(?:pip3?|pipx|uv(?:\s+pip)?|conda|mamba|poetry|pdm|easy_install)\s+"
    r"(?:install|add|download)\b(?:\s+-{1,2}[\w=-]+)*\s+\S*\Z", re.IGNORECASE)


def _package_version(text: str, a: int, b: int) -> bool:
    """The quad at `a`..`b` is a package's version ("numpy-1.26.0.1-py3-none-any.whl",
    "pip install numpy-1.26.0.1")."""
    if _PACKAGE_BEFORE.search(text, max(0, a - 64), a) is None:
        return False
    return (_PACKAGE_FILE_AFTER.match(text, b) is not None
            or _INSTALLER_BEFORE.search(text, max(0, a - 120), a) is not None)


def _quad_names_a_host(quad: str) -> bool:
    """`_names_a_host` of a dotted quad (`_IPV4`'s, "192.168.001.001" too), read from its
    octets, not parsed by `ipaddress` (a log's 2,000 addresses: 6 ms of 17): not loopback
    (127/8), unspecified (0.0.0.0), link-local (169.254/16) or multicast (224/4)."""
    a, b, c, d = map(int, quad.split("."))
    return not (a == 127 or a == b == c == d == 0 or (a == 169 and b == 254)
                or 224 <= a <= 239)


# (but a comparison's operator after a word that names an address says no version: a
# filter's or a rule's "ip >= 10.0.0.1", "src_ip != 10.1.2.3", "host == 10.0.0.1",
# "clientIp <= ...")
_ADDRESS_COMPARED = re.compile(
    r"(?:^|[^A-Za-z0-9-])(?:[A-Za-z0-9]+[_.])*(?:(?i:ip|ipv4|ip_?addr(?:ess)?|addr|address"
    r"|host|hostname|server|gateway|gw|src|dst|source|dest|destination|peer|remote|client"
    r"|nameserver|dns|router|proxy|target|origin|subnet|net|network|cidr|inet)"
    r"|[a-z0-9]+(?:Ip|IP|Addr|Address|Host))\s?(?:==|[<>~!]=)\s?\Z")


def _version_before(text: str, a: int) -> bool:
    """Whether what comes just before `a` says a version (`_VERSION_BEFORE`), read as
    written and with its escapes decoded ("torch%3D%3D2.1.0.1", "pkg&#61;&#61;1.2.3.4":
    the text's windows decoded read it so, but the text as written found the quad);
    not a comparison with a word naming an address (`_ADDRESS_COMPARED`)."""
    view = text[max(0, a - 64):a]
    if may_escape(view):
        decoded = unescaped(view)
        if decoded is not None and _said_version(decoded[0]):
            return True
    return _said_version(view)


def _said_version(head: str) -> bool:
    """Whether `head`'s end says that a version follows it."""
    return (_VERSION_BEFORE.search(head, max(0, len(head) - 16)) is not None
            and _ADDRESS_COMPARED.search(head) is None)


def _find_ip(text: str) -> Iterator[Span]:
    for a, b in _ip_v4(text):
        candidate = text[a:b]
        if (not _version_before(text, a) and _TAG_AFTER.match(text, b) is None
                and not _package_version(text, a, b)
                and candidate not in _MASKS
                and _quad_names_a_host(candidate)):
            yield a, b
    if text.count(":") >= 2:
        yield from _ip_v6(text)


def _digits(text: str) -> int:
    return sum(c.isdigit() for c in text)


def _phone_ok(candidate: str) -> bool:
    """Eight digits at least ("+1000000 users", "+37.7749", a latitude, are no number to
    call), not one digit repeated ("000-000-0000"), not a date ("01.02.2024 1030")."""
    digits = [c for c in candidate if c.isdigit()]
    return (len(digits) >= 8 and len(set(digits)) > 1
            and _DATE.search(candidate) is None)


_DATE = re.compile(r"\b\d{1,2}[./]\d{1,2}[./](?:19|20)\d{2}\b|\b(?:19|20)\d{2}[./-]\d{1,2}[./-]"
                   r"\d{1,2}\b")


_phone = _numeric(_PHONE, check=_phone_ok)


_EXTENSION = re.compile(r",?\s?(?:x|ext\.?|extension)\s?\d{1,5}\b", re.IGNORECASE)


_SAID_REACH = 48  # how far before its number a phone word is looked for


def _find_phone(text: str) -> Iterator[Span]:
    for a, b in _phone(text):
        if _in_hex_word(text, a, b) or _in_hex_row(text, a, b):
            continue  # (bytes: "00984641abcdef...", "0012 3457" among a row's groups)
        ext = _EXTENSION.match(text, b)  # "... 0958 ext. 204": redacted with it
        yield a, ext.end() if ext is not None else b
    for m in _said(text, _PHONE_WORDS, _PHONE_SAID, lambda a, b: b + _REACH):
        if 9 <= _digits(m["n"]) <= 13 and _phone_ok(m["n"]):
            yield m.span("n")


def _said(text: str, words: tuple[str, ...], pattern: re.Pattern[str],
          end_of: Callable[[int, int], int]) -> Iterator[re.Match[str]]:
    """A number said to be one: `pattern` read from just before each run of digits that
    one of `words` comes before, up to `end_of(run)` (read only there, not over the
    whole text)."""
    runs = _numeric_runs(text)
    if not runs:
        return
    low = text.lower()
    if len(low) == len(text):  # (each character lower-cased as one: places are the text's)
        said = _said_places(low, words)
    else:  # (a letter lower-cased as two: "\u0130")
        said = None
    last = 0
    for a, b in runs:
        lo = max(last, a - _SAID_REACH)
        if (any(w in text[lo:a].lower() for w in words) if said is None
                else _said_between(said, lo, a)):
            yield from pattern.finditer(text, lo, min(len(text), end_of(a, b)))
        last = a


def _said_places(low: str, words: tuple[str, ...]) -> list[tuple[int, int]]:
    """Where each of `words` is in `low` (start, end), by start: found once per text,
    not lower-cased and searched again before each of its runs of digits (a log's 2,000
    runs, 36 words each: 60 ms on 64 KB)."""
    places: list[tuple[int, int]] = []
    for w in words:
        i = low.find(w)
        while i >= 0:
            places.append((i, i + len(w)))
            i = low.find(w, i + 1)
    places.sort()
    return places


def _said_between(places: list[tuple[int, int]], lo: int, hi: int) -> bool:
    """Whether one of `places` lies within `lo:hi` (a word there)."""
    k = bisect.bisect_left(places, (lo, -1))
    while k < len(places) and places[k][0] < hi:
        if places[k][1] <= hi:
            return True
        k += 1
    return False


_card = _numeric(_CARD, check=_card_ok)
# A digit at a line's end and another at the next one's start: a card may be split there.
_DIGITS_ACROSS_LINE = re.compile(r"\d[ \t.\-_/]*\r?\n\s*\d")


# A label that names a number as something else that passes Luhn, just before it: a
# handset's IMEI or IMEISV (16 digits, may start as a JCB card does), a SIM's ICCID, a
# device's serial number (any length: ICCIDs have 19 or 20 digits)...
_DEVICE_LABEL = (r"imei(?:sv)?|meid|iccid|esn|serial|s/n")
# ... or a person's number: a Canadian SIN (9 digits), a South African identity number
# (13, may start as Visa's). Those have 13 digits at most, so such a label before more
# (a Diners card's 14, an Amex's 15, 16 and more) names no such number ("Customer ID
# number: 4111 1111 1111 1111" is a card, written where an id was asked for).
_ID_LABEL = r"sin|social\s+insurance|nas|(?:sa|national)\s+id|id(?:entity)?\s+(?:number|no\.?)"
_LABEL_TAIL = r"(?:\s*\(?[12]\)?)?(?:\s+(?:number|no\.?|#|is|was)){0,2}\s{0,2}[:#=]?\s{0,2}$"
_NOT_CARD_LABEL = re.compile(rf"\b(?:{_DEVICE_LABEL}|{_ID_LABEL}){_LABEL_TAIL}", re.IGNORECASE)
_NOT_LONG_CARD_LABEL = re.compile(rf"\b(?:{_DEVICE_LABEL}){_LABEL_TAIL}", re.IGNORECASE)
_ID_DIGITS = 13  # the longest number a person's id label names


_CARD_WORD = re.compile(r"card|visa|master|amex|\b(?:cc|pan)\b", re.IGNORECASE)


def _labelled_other(text: str, a: int, digits: int) -> bool:
    """Whether a label just before `a` names the number of `digits` digits as something
    else (and no card word is there: "card id number: 4111 ..." stays a card)."""
    lo = max(0, a - 40)
    label = _NOT_LONG_CARD_LABEL if digits > _ID_DIGITS else _NOT_CARD_LABEL
    return (label.search(text, lo, a) is not None
            and _CARD_WORD.search(text, lo, a) is None)


# A hex dump's row: its offset ("00000010:", od's "0000020") then groups of hex digits
# (`xxd`'s of four, `hexdump`'s and `od`'s of two); groups that happen to be decimal are
# bytes, not a card grouped by spaces.
_HEX_ROW_BEFORE = re.compile(r"[0-9A-Fa-f]{6,16}:?(?: {1,2}[0-9A-Fa-f]{2,4})* {1,2}\Z")
_HEX_GROUP_AFTER = re.compile(r" {1,2}[0-9A-Fa-f]{2,4}(?![0-9A-Za-z])")
# (a row of six groups or more from its line's start: `od`'s offset has no ":", and a
# number read from the offset on is the row's, "001000 26 ab ...")
_HEX_ROW = re.compile(r"[0-9A-Fa-f]{6,16}:?(?: {1,2}[0-9A-Fa-f]{2,4}){6,}(?![0-9A-Za-z])")
_ROW_REACH = 160  # how far back a row's offset is looked for


def _in_hex_row(text: str, a: int, b: int) -> bool:
    """Whether the number at `a`..`b` is groups of a hex dump's row: after the row's
    offset, with another group before it or after it, or inside a row of six groups or
    more."""
    nl = text.rfind("\n", max(0, a - _ROW_REACH), a)
    if nl == -1 and a > _ROW_REACH:
        return False
    line = nl + 1
    row = _HEX_ROW.match(text, line)
    if row is not None and a < row.end():
        return True
    before = _HEX_ROW_BEFORE.match(text, line, a)
    return before is not None and (text[line:a].strip().count(" ") > 0
                                   or _HEX_GROUP_AFTER.match(text, b) is not None)


# A hex word (a hash, a memory address, `xxd -p`'s lines) holds runs of decimal digits
# that are bytes, no card or phone number: the letters and digits glued to the run are
# all hex, and hold a digit too (a hex word mixes them) or follow "0x"
# ("0x7ffd4546252854754769", "ab45...69cd", "00984641abcdef01..."). A word with any other
# letter is a label glued to a number ("card4111...", "mobile138...", "ID4111...",
# "4111...exp1229"), and so are hex letters alone ("cc4111...", "cafe4111...": a word is
# as likely as a hash whose letters all stand on one side of its only run of digits).
_HEX_CHARS = frozenset("0123456789abcdefABCDEF")
_WORD_CHARS_ASCII = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_HEX_REACH = 64  # how far a hex word is read either side of the run (a long one: its part)


def _in_hex_word(text: str, a: int, b: int) -> bool:
    """Whether the number at `a`..`b` is a run of digits inside a hex word."""
    lo, floor = a, max(0, a - _HEX_REACH)
    while lo > floor and text[lo - 1] in _WORD_CHARS_ASCII:
        lo -= 1
    hi, ceil = b, min(len(text), b + _HEX_REACH)
    while hi < ceil and text[hi] in _WORD_CHARS_ASCII:
        hi += 1
    before, after = text[lo:a], text[b:hi]
    prefixed = before[:2] in ("0x", "0X")
    glued = (before[2:] if prefixed else before) + after
    return ((prefixed or bool(glued)) and _HEX_CHARS.issuperset(glued)
            and (prefixed or any(c.isdigit() for c in glued)))


_cn_mobile = _numeric(_CN_MOBILE)


def _find_cn_mobile(text: str) -> Iterator[Span]:
    for a, b in _cn_mobile(text):
        if not _in_hex_word(text, a, b) and not _in_hex_row(text, a, b):
            yield a, b


def _find_card(text: str) -> Iterator[Span]:
    for a, b in _card(text):
        if _labelled_other(text, a, sum(c.isdigit() for c in text[a:b])):
            continue
        if _in_hex_word(text, a, b) or (" " in text[a:b] and _in_hex_row(text, a, b)):
            continue
        for _ in range(2):  # its expiry and its code, in either order
            extra = _CARD_EXTRA.match(text, b)
            if extra is None:
                break
            b = extra.end()
        yield a, b
    if "\n" in text and _DIGITS_ACROSS_LINE.search(text) is not None:
        # blank lines between the parts are skipped ("4111 1111\n\n1111 1111")
        lines, starts = [], []
        at = 0
        for line in text.split("\n"):
            if line.strip():
                lines.append(line)
                starts.append(at)
            at += len(line) + 1
        parts = list(card_across(lines))
        for (i, (a, b)), (j, (c, d)) in zip(parts[::2], parts[1::2], strict=True):
            if _in_hex_word(lines[i], a, b) or _in_hex_word(lines[j], c, d):
                continue  # (a hex word wrapped: `xxd -p`'s lines)
            yield starts[i] + a, starts[i] + b
            yield starts[j] + c, starts[j] + d


# US Social Security numbers: 3-2-4 digits joined by one kind of dash, in the ranges the
# SSA assigns (no area 000, 666 or 9xx, no group 00, no serial 0000); spaced or bare only
# where the text names one ("SSN: 123 45 6789", "social security number 123456789"):
# without that, they are any order, row or phone number.
_SSN = (r"(?<![\w\-\u2010-\u2013])(?!000|666|9\d\d)\d{3}([\-\u2010-\u2013])(?!00)"
        r"\d{2}\1(?!0000)\d{4}(?![\w\-\u2010-\u2013])")
_SSN_SAID = re.compile(
    r"(?:\b(?:ssn|social\s+security(?:\s+(?:number|no\.?))?|tax\s*payer\s+id|tin)\b\.?"
    r"|\bss#)(?:\s+(?:is|was|number|no\.?|#)){0,2}[\s:=#,(\-\u2010-\u2013\"'`|]{0,6}"
    r"(?P<n>(?!000|666|9\d\d)\d{3}(?P<s>[ \-\u2010-\u2013]?)(?!00)\d{2}(?P=s)(?!0000)\d{4})"
    r"(?![\w\-\u2010-\u2013])", re.IGNORECASE)
_SSN_WORDS = ("ssn", "ss#", "social", "tax", "tin")


_ssn = _numeric(_SSN)


def _find_ssn(text: str) -> Iterator[Span]:
    yield from _ssn(text)
    for m in _said(text, _SSN_WORDS, _SSN_SAID, lambda a, b: a + 12):
        yield m.span("n")


# UK National Insurance numbers: two letters HMRC allocates (neither D, F, I, Q, U nor V,
# no O second; not BG, GB, KN, NK, NT, TN or ZZ), six digits, a suffix A-D. Spaced in
# pairs ("AB 12 34 56 C") they are found anywhere; bare ("AB123456C", a part number's
# shape too) only where the text names one ("NI number", "NINO", "national insurance").
_NINO_PREFIX = r"(?!BG|GB|KN|NK|NT|TN|ZZ)[A-CEGHJ-PR-TW-Z][A-CEGHJ-NPR-TW-Z]"
_NINO = rf"(?<![\w-]){_NINO_PREFIX} \d{{2}} \d{{2}} \d{{2}} ?[A-D](?![\w-])"
_NINO_SAID = re.compile(
    r"(?i:\b(?:nino|ni(?:\s+(?:number|no\.?)|\s*#)|national\s+insurance(?:\s+(?:number|no\.?))?)"
    r"(?:\s+(?:is|was|number|no\.?|#)){0,2}[\s:=#,(\-\"'`|]{0,6})"
    rf"(?P<n>{_NINO_PREFIX}(?P<s>[ -]?)\d{{2}}(?P=s)\d{{2}}(?P=s)\d{{2}}(?P=s)[A-D])(?![\w-])",
    re.IGNORECASE)
_NINO_WORDS = ("nino", "ni ", "ni#", "national insurance")
_nino = _numeric(_NINO)
_NINO_PAIRS = re.compile(r"\d\d \d\d \d\d")  # (most runs of digits hold none)


def _find_nino(text: str) -> Iterator[Span]:
    if any(_NINO_PAIRS.search(text, a, b) for a, b in _numeric_runs(text)):
        yield from _nino(text)
    low = text.lower()
    if any(w in low for w in _NINO_WORDS):
        for m in _said(text, _NINO_WORDS, _NINO_SAID, lambda a, b: b + 4):
            yield m.span("n")


_IBAN_RX = re.compile(_IBAN)
_WORD_CHAR = re.compile(r"\w")
_LAST_GROUP = re.compile(r"[ -][A-Za-z0-9]+\Z")


def _find_iban(text: str) -> Iterator[Span]:
    """IBANs by their checksum; a word after one, which the case-insensitive groups take
    for its last group ("BE68 5390 0754 7034 from ..."), is given back. Read only around
    a run of digits (every country's account number holds one), reaching back to the
    country code ("GB82 WEST 1234 5698 7654 32")."""
    for lo, hi in widened(_numeric_runs(text), len(text), 40, 40):
        for a, b in _ibans_in(text, lo, hi):
            if " " not in text[a:b] or not _in_hex_row(text, a, b):
                yield a, b  # (not a hex dump's groups: "ee24 2b4e 7d26 f346 5ab2 6ea9")


def _ibans_in(text: str, lo: int, hi: int) -> Iterator[Span]:
    for m in _IBAN_RX.finditer(text, lo, hi):
        a, b = m.span()
        if (a > 0 and _WORD_CHAR.match(text, a - 1)) or _WORD_CHAR.match(text, b):
            continue  # (a word the window cuts: its edge read as a word's, "\b")
        for _ in range(4):  # the match, then up to three words given back
            if iban_ok(text[a:b]):
                yield a, b
                break
            last = _LAST_GROUP.search(text, a, b)
            if last is None:
                break
            b = last.start()


BUILTIN: dict[str, Detector] = {
    d.name: d
    for d in [
        # (escapes read by it: `_disguised`)
        Detector("secret", "[SECRET]", with_spaced(find_secrets)),
        *(Detector(name, placeholder, with_escapes(find)) for name, placeholder, find in [
            ("email", "[EMAIL]", _find_email),
            ("iban", "[IBAN]", _find_iban),
            ("cn_id", "[CN_ID]", _numeric(_CN_ID, check=cn_id_ok)),
            ("card", "[CARD]", _find_card),
            ("cn_mobile", "[PHONE]", _find_cn_mobile),
            ("phone", "[PHONE]", _find_phone),
            ("ip", "[IP]", _find_ip),
            ("ssn", "[SSN]", _find_ssn),
            ("uk_nino", "[NINO]", _find_nino)]),
    ]
}
INJECTION = Detector(_INJECTION.name, _INJECTION.placeholder,
                     with_spaced(with_escapes(_INJECTION.find)))


def custom(name: str, pattern: str) -> Detector:
    return Detector(name, f"[{name.upper()}]", _regex(pattern))


# The detectors `quiet` answers for: every built-in one and the injection phrases (not a
# custom pattern, which runs whatever `quiet` says).
GATED: frozenset[Detector] = frozenset([*BUILTIN.values(), INJECTION])


def quiet(text: str) -> bool:
    """True only where no detector of `GATED` can find anything in `text` (`quiet_ones`
    answers for every one of them)."""
    return quiet_ones(text) == GATED


# The gated detectors by the clause of `quiet_ones` that answers for them, and what it
# answers for by which clauses held (numbers, email, secret, injection).
_NUMBERS = frozenset(BUILTIN[n] for n in ("cn_id", "cn_mobile", "card", "phone", "ip",
                                          "ssn", "uk_nino", "iban"))
_NONE: frozenset[Detector] = frozenset()
_QUIET: dict[tuple[bool, bool, bool, bool], frozenset[Detector]] = {
    (n, e, s, i): GATED if n and e and s and i else frozenset(
        [*(_NUMBERS if n else ()), *([BUILTIN["email"]] if e else ()),
         *([BUILTIN["secret"]] if s else ()), *([INJECTION] if i else ())])
    for n in (False, True) for e in (False, True) for s in (False, True)
    for i in (False, True)}


def quiet_ones(text: str) -> frozenset[Detector]:
    """The detectors of `GATED` that can find nothing in `text`: one pass over what each
    of them starts from, so that an ordinary prompt skips the detectors it gives nothing
    to read ("Tell me about store 12" names an injection trigger, "tell me", and runs
    that detector alone). Each clause a strict superset of its detectors' triggers,
    checked against each of them on the sanitizer tests' texts and on fuzz
    (tests/unit/plugins/test_sanitizer_quiet.py); a change to a detector's first steps
    changes this with it. None for a text with an escape (its decoded reading runs);
    the secret and injection detectors for an ASCII text only (their look-alike and
    accent readings run on any other). Leaves the digit-run memo set: call it where
    `forget` follows, as the detectors are."""
    if may_escape(text):
        return _NONE
    # cn_id, cn_mobile, card, phone, ssn, uk_nino, iban and IPv4 read only around a run
    # of digits (`_windows`, `_numeric_runs`: any script's digits); a card split over
    # lines needs digits at both ends of a line break; an IPv6 address needs two colons.
    numbers = not (_numeric_runs(text) or text.count(":") >= 2 or (
        "\n" in text and _DIGITS_ACROSS_LINE.search(text) is not None))
    email = "@" not in text and not _may_spell_email(text)  # (`_find_email`)
    if not text.isascii():
        return _QUIET[numbers, email, False, False]
    # (a run of one-character words is read joined by the secret and injection
    # detectors: `with_spaced`)
    spaced = may_be_spaced(text)
    return _QUIET[numbers, email, not spaced and secrets_quiet(text, text.lower()),
                  not spaced and injection_quiet(text)]
