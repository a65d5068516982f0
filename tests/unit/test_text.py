"""Text normalization (proxy/text.py): one canonical form for look-alike prompts, shared
by the sanitizer's detectors and the cache's keys."""

from __future__ import annotations

import pytest

from proxy.text import normalize


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("ｈｅｌｌｏ　ｗｏｒｌｄ", "hello world"),  # full-width letters and space
        ("pass\u200bword", "password"),  # zero-width space
        ("abc\u202edcba", "abcdcba"),  # bidi override
        ("a\x00b\x07c\td\ne", "abc\td\ne"),  # controls go, tab and newline stay
        ("  many    spaces  ", "many spaces"),
        ("ﬁle", "file"),  # ligature
        ("line\r\nbreak", "line\nbreak"),
    ],
)
def test_normalize(raw: str, expected: str) -> None:
    assert normalize(raw) == expected


def test_printable_ascii_keeps_its_case_and_punctuation() -> None:
    assert normalize(" How do I reset my password?  ") == "How do I reset my password?"
