"""Detectors: each finds spans of one kind of sensitive text.

Regexes find candidates; where a kind has a checksum (payment cards: Luhn; Chinese
resident ids: ISO 7064 mod 11-2 plus a real birth date; IBAN: mod 97) a candidate only
counts when it passes, so card-like order numbers do not trip the card detector. Each
detector returns (start, end) spans and never keeps the matched text. Secrets live in
`credentials`, injection phrases in `injection`.

Shapes covered, by family: cards in groups separated by spaces, dots, dashes, slashes
or underscores (one kind per number) or unseparated, with the CVV or expiry that
follows them, and a card split across two messages (`card_across`); phones
with +/00 prefixes, a "(0)", parentheses, dots, spaces or dashes; e-mails written plainly
or as "name at domain dot com", "name[at]domain(dot)com".
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import re
from collections.abc import Callable, Iterator

from .credentials import find_secrets
from .injection import INJECTION
from .spans import Detector, Span, regex_finder

__all__ = ["BUILTIN", "INJECTION", "Detector", "Span", "card_across", "cn_id_ok", "custom",
           "iban_ok", "luhn_ok"]

_regex = regex_finder


# Numbers (cards, ids, phones, IPv4) are found in two steps: one scan for runs of
# digit-ish characters, then the specific pattern only inside those short windows.
_NUMERIC_RUN = re.compile(r"\d[\d \-()./_]{5,48}")
_MARGIN = 4  # room for a leading "+86 " or "(" and the patterns' look-arounds
# A run stops at 49 characters and the next one starts there: each window reaches this
# far past its run, so a number that a run's end cuts (and a card's CVV after it) is
# still read whole.
_REACH = 64
_runs_of: tuple[str, list[Span]] = ("", [])


def _numeric_runs(text: str) -> list[Span]:
    """Digit runs of `text`, computed once for the detectors that run one after another
    on the same string (plugins run on the event loop's single thread)."""
    global _runs_of
    if _runs_of[0] is not text:
        _runs_of = (text, [m.span() for m in _NUMERIC_RUN.finditer(text)])
    return _runs_of[1]


def _numeric(pattern: str, check: Callable[[str], bool] | None = None,
             ) -> Callable[[str], Iterator[Span]]:
    rx = re.compile(pattern)

    def find(text: str) -> Iterator[Span]:
        end = len(text)
        for a, b in _numeric_runs(text):
            for m in rx.finditer(text, max(0, a - _MARGIN), min(end, b + _REACH)):
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


_TAIL = re.compile(r"(?<!\d)\d(?:[ .-]{0,3}\d)*$")
_HEAD = re.compile(r"\s*(\d(?:[ .-]{0,3}\d)*)")


def card_across(texts: list[str]) -> Iterator[tuple[int, Span]]:
    """Card numbers split over the end of one text and the start of the next: yields
    (text index, span) for both parts. Each part needs 4 digits or more."""
    for i in range(len(texts) - 1):
        a = texts[i].rstrip()
        off = max(0, len(a) - 64)
        tail = _TAIL.search(a, off)
        head = _HEAD.match(texts[i + 1][:64])
        if tail is None or head is None:
            continue
        left = re.sub(r"\D", "", tail.group(0))
        right = re.sub(r"\D", "", head.group(1))
        if len(left) >= 4 and len(right) >= 4 and luhn_ok(left + right):
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


def iban_ok(candidate: str) -> bool:
    s = candidate.replace(" ", "").upper()
    if not 15 <= len(s) <= 34:
        return False
    rearranged = s[4:] + s[:4]
    number = "".join(str(int(c, 36)) for c in rearranged)
    return int(number) % 97 == 1


def _ip_ok(candidate: str) -> bool:
    try:
        ipaddress.ip_address(candidate)
    except ValueError:
        return False
    return True


# "name at domain dot com", "name[at]domain(dot)com", "name (at) domain [dot] co [dot] uk".
# Spelled-out addresses are found from their "at" (every run below is bounded, so a text
# made of thousands of "a dot b at c" costs linear time): the local part just before it
# (with up to two earlier parts joined by a spelled "dot"), then domain labels after it
# ending in a spelled "dot" and a common top-level domain ("dot by dot" is not one).
_AT_TOKEN = re.compile(r"\s{0,3}(?:[\[({<]\s{0,3}at\s{0,3}[\])}>]|(?<=\s)at(?=\s)|@)\s{0,3}",
                       re.IGNORECASE)
_DOT = r"(?:\s{0,3}[\[({<]\s{0,3}dot\s{0,3}[\])}>]\s{0,3}|\s{1,3}dot\s{1,3})"
_LABEL = r"(?!(?:the|a|an|my|your|our|this|that|home|work|least|most|all)\b)[a-z0-9-]{1,63}"
_TLD = ("(?:com|net|org|edu|gov|mil|int|io|co|ai|app|dev|info|biz|me|xyz|online|site|"
        "uk|us|ca|au|nz|ie|de|fr|es|it|nl|be|ch|at|se|no|dk|fi|pl|cz|pt|gr|ru|ua|tr|il|"
        "in|cn|hk|tw|jp|kr|sg|my|id|th|vn|ph|br|mx|ar|cl|za|ng|ke|eg|ae|sa)")
_DOMAIN_AFTER = re.compile(rf"{_LABEL}(?:(?:{_DOT}|\.){_LABEL}){{0,4}}{_DOT}{_TLD}\b",
                           re.IGNORECASE)
_PART_BEFORE = re.compile(rf"[a-z0-9._%+-]{{1,64}}{_DOT}\Z", re.IGNORECASE)
_LOCAL = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._%+-")


def _spelled_emails(text: str) -> Iterator[Span]:
    last = 0
    for at in _AT_TOKEN.finditer(text):
        if at.start() < last:
            continue
        domain = _DOMAIN_AFTER.match(text, at.end())
        if domain is None:
            continue
        start = at.start()
        while start > last and at.start() - start < 64 and text[start - 1] in _LOCAL:
            start -= 1
        if start == at.start():
            continue
        for _ in range(2):  # "jane dot doe at ...": earlier parts of the local name
            part = _PART_BEFORE.search(text, max(last, start - 80), start)
            if part is None:
                break
            start = part.start()
        last = domain.end()
        yield start, last


# International numbers (+ or 00, an optional "(0)"), and North-American shapes whose area
# code and exchange start with 2-9 (so "100 200 3000" is not one).
_PHONE = (r"(?<![\w+])(?:\+|00)[1-9]\d{0,2}(?:[ .-]?\(0\))?(?:[ .-]?\(?\d{1,4}\)?)"
          r"(?:[ .-]?\d{2,4}){2,4}(?!\d)"
          r"|(?<![\d.-])\(\d{3}\)\s?\d{3}[ .-]\d{4}(?![\d-])"
          r"|(?<![\w.-])[2-9]\d{2}([ .-])[2-9]\d{2}\1\d{4}(?![\w-]|\.\d)")
_CN_MOBILE = r"(?<!\d)(?:(?:\+|00)?86[ .-]?)?1[3-9]\d[ .-]?\d{4}[ .-]?\d{4}(?!\d)"
# Unseparated, or in groups with one kind of separator throughout: 4-4-4-4(-3), 4-6-5;
# then perhaps what often follows a card number: its CVV or expiry ("4111 ... 1111 123",
# "4111...1111/12/27"), redacted with it.
# (Not a comma between groups: "2023,2024,2025,2026" is a list of years, and one such
# list in ten passes Luhn.)
_CARD_SEP = r"(?:[ ./_-]| - )"
_CARD_TAIL = r"(?:[ ./_,-]| - |, )(?:\d{3,4}|\d{2}/\d{2,4})"
_CARD = (rf"(?<![\d.,-])(?:\d{{13,19}}"
         rf"|\d{{4}}(?P<s>{_CARD_SEP})\d{{4}}(?:(?P=s)\d{{4}}){{1,2}}(?:(?P=s)\d{{1,4}}(?![\d/]))?"
         rf"|\d{{4}}(?P<t>{_CARD_SEP})\d{{6}}(?P=t)\d{{4,5}})(?:{_CARD_TAIL})?"
         r"(?![\d]|[.,-]\d)")
_TAIL_AT_END = re.compile(_CARD_TAIL + "$")


def _card_ok(candidate: str) -> bool:
    """Luhn on the number, with or without what follows it (a CVV or expiry)."""
    if luhn_ok(candidate):
        return True
    tail = _TAIL_AT_END.search(candidate)
    return tail is not None and luhn_ok(candidate[: tail.start()])
_CN_ID = r"(?<![0-9Xx])\d{17}[0-9Xx](?![0-9Xx])"
_IBAN = r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,4})?\b"
# Zero-padded to three digits too ("192.168.001.001"); two-digit padding is left to
# dates, times and versions ("01.02.03.04").
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|0\d\d|[1-9]?\d)"
_IPV4 = rf"(?<![\d.]){_OCTET}(?:\.{_OCTET}){{3}}(?![\d.])"
_IPV6 = r"(?<![\w:.])[0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{0,4}){2,7}(?![\w:])"  # checked by ipaddress


def _find_email(text: str) -> Iterator[Span]:
    yield from _email_plain(text)
    if "%40" in text:  # URL-encoded: "jane%40example.com"
        yield from _email_encoded(text)
    if "dot" in text or "DOT" in text or "Dot" in text:
        yield from _spelled_emails(text)


# An address is found from its separator, in linear time whatever the text: its domain
# matched forwards from the separator (bounded labels), then its local part, the run of
# address characters (at most 64) just before the separator. (A regex over a window
# around each separator backtracked for seconds on 64 KiB of "%40%40..." or "a@a@...".)
_DOMAIN = re.compile(r"[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63}){0,8}\.(?P<tld>[A-Za-z]{2,24})\b")
# File names that read like addresses ("logo@2x.png", "icon%402x.webp"): their "top-level
# domain" is a file type no registry delegates (.zip, .mov, .py, .md are real TLDs).
_FILE_TYPES = frozenset({"png", "jpg", "jpeg", "gif", "svg", "webp", "ico", "bmp", "tif",
                         "tiff", "avif", "heic", "css", "js", "mjs", "ts", "json", "html",
                         "htm", "txt", "csv", "xml", "yaml", "yml", "mp3", "mp4", "wav",
                         "ogg", "webm", "woff", "woff2", "ttf", "otf", "pdf", "exe", "dll",
                         "tar", "gz", "tgz"})
_HOST_TLD = re.compile(r"\.([A-Za-z]{2,24})\Z")  # a host that still ends in a TLD-like label
_ASSET_SCALE = re.compile(r"\d+(?:\.\d+)?x\.", re.IGNORECASE)  # "icon@2x.min.png"


def _emails_at(at: str, local: str) -> Callable[[str], Iterator[Span]]:
    tail = re.compile(rf"[{local}]+\Z")

    def find(text: str) -> Iterator[Span]:
        last = 0
        i = text.find(at)
        while i != -1:
            domain = _DOMAIN.match(text, i + len(at))
            end = domain.end() if domain is not None else -1
            if domain is not None and domain["tld"].lower() in _FILE_TYPES:
                # "logo@2x.png" is a file; "bob@example.com.pdf" an address and a file
                # type after it: the address ends a label earlier, if it still has a TLD.
                host = text[i + len(at):domain.start("tld") - 1]
                tld = _HOST_TLD.search(host)
                end = (-1 if tld is None or tld[1].lower() in _FILE_TYPES
                       or _ASSET_SCALE.match(host) else domain.start("tld") - 1)
            if end != -1:
                lo = max(last, i - 64)
                part = tail.search(text, lo, i)
                # Glued to a word ("x_y@..."), it is not an address's start.
                if part is not None and (part.start() == lo or not (
                        text[part.start() - 1].isalnum() or text[part.start() - 1] == "_")):
                    yield part.start(), end
                    last = end
            i = text.find(at, max(i + 1, last))

    return find


_email_plain = _emails_at("@", "A-Za-z0-9._%+-")
# URL-encoded ("jane%40example.com"): no "%" in the local part, so an encoded URL
# before it ("https%3A%2F%2F...") is not taken for one.
_email_encoded = _emails_at("%40", "A-Za-z0-9._+-")
_ip_v4 = _numeric(_IPV4)
_ip_v6 = _regex(_IPV6, check=_ip_ok, needs=(":",))


def _find_ip(text: str) -> Iterator[Span]:
    yield from _ip_v4(text)
    if text.count(":") >= 2:
        yield from _ip_v6(text)


BUILTIN: dict[str, Detector] = {
    d.name: d
    for d in [
        Detector("secret", "[SECRET]", find_secrets),
        Detector("email", "[EMAIL]", _find_email),
        Detector("iban", "[IBAN]", _regex(_IBAN, check=iban_ok)),
        Detector("cn_id", "[CN_ID]", _numeric(_CN_ID, check=cn_id_ok)),
        Detector("card", "[CARD]", _numeric(_CARD, check=_card_ok)),
        Detector("cn_mobile", "[PHONE]", _numeric(_CN_MOBILE)),
        Detector("phone", "[PHONE]", _numeric(_PHONE)),
        Detector("ip", "[IP]", _find_ip),
    ]
}

def custom(name: str, pattern: str) -> Detector:
    return Detector(name, f"[{name.upper()}]", _regex(pattern))
