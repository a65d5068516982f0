"""Prompt-injection phrases, English and Chinese.

Deliberately about intent ("ignore the previous instructions"), not topics, so ordinary
questions about instructions pass.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from .spans import Detector, Span

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
# Any trigger at all: one scan, and most prompts stop there.
_ANY_TRIGGER = re.compile("|".join(re.escape(t) for ts in _INJECTION_TRIGGERS for t in ts))


# Letters of other scripts that look like Latin ones (Unicode's confusables.txt, the
# single-letter lowercase Cyrillic, Greek and Armenian ones and the small-capital, dotless
# and IPA look-alikes): "ignоre" with a Cyrillic "о" reads as "ignore". One letter for
# one, so spans found in the folded text are spans of the text. Only the injection
# phrases are read this way: a look-alike inside an address or a key is no address or key.
_LOOKALIKES = str.maketrans(dict(zip(
    # Cyrillic
    "аеорсухѕіјһԁԛԝѵӏкмнтвьү" "АВЕКМНОРСТУХЅІЈҺԀԚԜӀҮ"
    # Greek
    "αονικρτυχϲϳεγ" "ΑΒΕΖΗΙΚΜΝΟΡΤΥΧ"
    # Armenian
    "օսոհցզ"
    # Latin small capitals, dotless and IPA letters
    "ıȷɑɡɩɪʟɴʀʏᴀʙᴄᴅᴇꜰɢʜᴊᴋᴍᴏᴘꜱᴛᴜᴠᴡᴢ",
    "aeopcyxsijhdqwvlkmhtbby" "ABEKMHOPCTYXSIJHDQWIY"
    "aovikptuxcjey" "ABEZHIKMNOPTYX"
    "ounhgq"
    "ijagiilnryabcdefghjkmopstuvwz",
    strict=True)))


def _fold(text: str) -> str:
    return text if text.isascii() else text.translate(_LOOKALIKES)


def _find_injection(text: str) -> Iterator[Span]:
    text = _fold(text)
    low = text.lower()
    if _ANY_TRIGGER.search(low) is None:
        return
    for rx, triggers in zip(_INJECTION_RX, _INJECTION_TRIGGERS, strict=True):
        if any(t in low for t in triggers):
            for m in rx.finditer(text):
                yield m.span()


INJECTION = Detector("injection", "[REMOVED]", _find_injection)

