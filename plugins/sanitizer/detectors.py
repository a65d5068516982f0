"""Detectors: each finds spans of one kind of sensitive text.

Regexes find candidates; where a kind has a checksum (payment cards: Luhn; Chinese
resident ids: ISO 7064 mod 11-2 plus a real birth date; IBAN: mod 97) a candidate only
counts when it passes, so card-like order numbers do not trip the card detector. Each
detector returns (start, end) spans and never keeps the matched text.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

Span = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Detector:
    name: str
    placeholder: str
    find: Callable[[str], Iterator[Span]]


def _regex(pattern: str, flags: int = 0, check: Callable[[str], bool] | None = None,
           needs: tuple[str, ...] = ()) -> Callable[[str], Iterator[Span]]:
    """A regex detector; `needs`: literals one of which must occur (a cheap prefilter)."""
    rx = re.compile(pattern, flags)

    def find(text: str) -> Iterator[Span]:
        if needs and not any(n in text for n in needs):
            return
        for m in rx.finditer(text):
            if check is None or check(m.group(0)):
                yield m.span()

    return find


# Numbers (cards, ids, phones, IPv4) are found in two steps: one scan for runs of
# digit-ish characters, then the specific pattern only inside those short windows.
_NUMERIC_RUN = re.compile(r"\d[\d \-().]{5,48}")
_MARGIN = 4  # room for a leading "+86 " or "(" and the patterns' look-arounds
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
            for m in rx.finditer(text, max(0, a - _MARGIN), min(end, b + _MARGIN)):
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


_EMAIL = r"(?<![\w.+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,24}\b"
# International numbers with a leading +, and the common North-American shapes.
_PHONE = (r"(?<![\w+])\+\d{1,3}(?:[ .-]?\(?\d{1,4}\)?)(?:[ .-]?\d{2,4}){2,4}(?!\d)"
          r"|(?<!\d)\(\d{3}\)[ .-]?\d{3}[ .-]\d{4}(?!\d)"
          r"|(?<![\d-])\d{3}-\d{3}-\d{4}(?![\d-])")
_CN_MOBILE = r"(?<!\d)(?:(?:\+|00)?86[ -]?)?1[3-9]\d[ -]?\d{4}[ -]?\d{4}(?!\d)"
_CARD = r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d-])"
_CN_ID = r"(?<![0-9Xx])\d{17}[0-9Xx](?![0-9Xx])"
_IBAN = r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,4})?\b"
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_IPV4 = rf"(?<![\d.]){_OCTET}(?:\.{_OCTET}){{3}}(?![\d.])"
_IPV6 = r"(?<![\w:.])[0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{0,4}){2,7}(?![\w:])"  # checked by ipaddress
_SECRET = "|".join([
    r"\bsk-(?:proj-|live-|test-|ant-)?[A-Za-z0-9_-]{20,}",  # OpenAI-style keys
    r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA)[0-9A-Z]{16}\b",  # AWS access key ids
    r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",  # JWTs
    r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----[\s\S]*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----",
])

def _around_at(pattern: str) -> Callable[[str], Iterator[Span]]:
    """E-mail: match only in a window around each '@' (addresses are short)."""
    rx = re.compile(pattern)

    def find(text: str) -> Iterator[Span]:
        last = 0
        i = text.find("@")
        while i != -1:
            for m in rx.finditer(text, max(last, i - 64), min(len(text), i + 256)):
                yield m.span()
                last = m.end()
            i = text.find("@", max(i + 1, last))

    return find


_ip_v4 = _numeric(_IPV4)
_ip_v6 = _regex(_IPV6, check=_ip_ok, needs=(":",))


def _find_ip(text: str) -> Iterator[Span]:
    yield from _ip_v4(text)
    if text.count(":") >= 2:
        yield from _ip_v6(text)


BUILTIN: dict[str, Detector] = {
    d.name: d
    for d in [
        Detector("secret", "[SECRET]", _regex(
            _SECRET, needs=("sk-", "AKIA", "ASIA", "AGPA", "AIDA", "AROA", "eyJ",
                            "PRIVATE KEY"))),
        Detector("email", "[EMAIL]", _around_at(_EMAIL)),
        Detector("iban", "[IBAN]", _regex(_IBAN, check=iban_ok)),
        Detector("cn_id", "[CN_ID]", _numeric(_CN_ID, check=cn_id_ok)),
        Detector("card", "[CARD]", _numeric(_CARD, check=luhn_ok)),
        Detector("cn_mobile", "[PHONE]", _numeric(_CN_MOBILE)),
        Detector("phone", "[PHONE]", _numeric(_PHONE)),
        Detector("ip", "[IP]", _find_ip),
    ]
}

# Prompt-injection phrases, English and Chinese. Deliberately about intent ("ignore the
# previous instructions"), not topics, so ordinary questions about instructions pass.
_INJECTION = [
    r"\b(?:ignore|disregard|forget|override|bypass)\b[^.\n]{0,40}?\b(?:all\s+|any\s+)?"
    r"(?:previous|prior|above|earlier|preceding|original|system|your)\b[^.\n]{0,20}?"
    r"\b(?:instructions?|prompts?|rules|directions|guidelines|messages?)\b",
    r"\b(?:reveal|show|print|repeat|output|leak|tell me)\b[^.\n]{0,30}?\b(?:your|the)\s+"
    r"(?:system|hidden|initial|original)\s+(?:prompt|instructions?|message)",
    r"\byou\s+are\s+now\s+(?:in\s+)?(?:DAN|developer\s+mode|jailbroken|unrestricted)\b",
    r"\b(?:new|updated)\s+system\s+(?:prompt|instructions?)\s*:",
    r"(?m:^\s*(?:#+\s*)?system\s*(?:prompt|override)?\s*:\s*you\s+(?:are|must|will)\b)",
    r"(?:忽略|无视|忘记|忘掉|不要理会|跳过)[^。\n]{0,10}?(?:之前|以上|上面|前面|先前|原来|所有)"
    r"[^。\n]{0,6}?(?:的)?(?:所有)?(?:指令|指示|说明|规则|提示|要求|设定)",
    r"(?:显示|输出|告诉我|泄露|打印|重复)[^。\n]{0,8}?(?:你的)?(?:系统提示|系统指令|初始指令|隐藏指令)",
    r"你现在(?:是|处于)[^。\n]{0,6}?(?:开发者模式|越狱模式|DAN)",
]

# Each phrase family runs only when one of its trigger words occurs (lower-cased text).
_INJECTION_TRIGGERS: list[tuple[str, ...]] = [
    ("ignore", "disregard", "forget", "override", "bypass"),
    ("reveal", "show", "print", "repeat", "output", "leak", "tell me"),
    ("you are now",),
    ("system",),
    ("system",),
    ("忽略", "无视", "忘记", "忘掉", "不要理会", "跳过"),
    ("显示", "输出", "告诉我", "泄露", "打印", "重复"),
    ("你现在",),
]
_INJECTION_RX = [re.compile(p, re.IGNORECASE) for p in _INJECTION]


def _find_injection(text: str) -> Iterator[Span]:
    low = text.lower()
    for rx, triggers in zip(_INJECTION_RX, _INJECTION_TRIGGERS, strict=True):
        if any(t in low for t in triggers):
            for m in rx.finditer(text):
                yield m.span()


INJECTION = Detector("injection", "[REMOVED]", _find_injection)


def custom(name: str, pattern: str) -> Detector:
    return Detector(name, f"[{name.upper()}]", _regex(pattern))
