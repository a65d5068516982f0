"""Text normalization: one canonical form for look-alike prompts, shared by the sanitizer
(its detectors) and the cache (its keys); it lives in the core so that neither plugin
imports the other.

NFKC folds compatibility forms (full-width letters, ligatures, superscripts) into their
plain forms; then control characters other than newline and tab, zero-width characters
and bidi overrides/isolates are removed; runs of spaces collapse and the ends are
stripped. Two prompts that render alike end up equal, so the cache keys on one entry and
detectors cannot be dodged with a zero-width space inside a phrase.
"""

from __future__ import annotations

import re
import unicodedata

# C0/C1 controls except \t and \n; DEL; zero-width and invisible formatting characters;
# bidi embeddings, overrides and isolates; BOM; the Unicode tag block used to smuggle
# invisible text.
_STRIP = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f"
    "\u00ad\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff"
    "\U000e0000-\U000e007f]"
)
_WIDE_SPACES = str.maketrans({"\u00a0": " ", "\u3000": " "})
_SPACES = re.compile(r" {2,}")
_CRLF = re.compile(r"\r\n?")


def _squeeze(text: str) -> str:
    return _SPACES.sub(" ", text) if "  " in text else text


def normalize(text: str) -> str:
    if text.isascii() and text.isprintable():
        return _squeeze(text).strip()  # the common case: nothing to fold or strip
    out = text if unicodedata.is_normalized("NFKC", text) else unicodedata.normalize("NFKC", text)
    if "\r" in out:
        out = _CRLF.sub("\n", out)
    out = _STRIP.sub("", out)
    if "\u00a0" in out or "\u3000" in out:
        out = out.translate(_WIDE_SPACES)
    return _squeeze(out).strip()
