"""What a detector is: a name, a placeholder, and a function from text to spans.

A detector returns (start, end) spans and never keeps the matched text.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

Span = tuple[int, int]
Finder = Callable[[str], Iterator[Span]]


@dataclass(frozen=True, slots=True)
class Detector:
    name: str
    placeholder: str
    find: Finder


def regex_finder(pattern: str, flags: int = 0, check: Callable[[str], bool] | None = None,
                 needs: tuple[str, ...] = ()) -> Finder:
    """A regex detector; `needs`: literals one of which must occur (a cheap prefilter)."""
    rx = re.compile(pattern, flags)

    def find(text: str) -> Iterator[Span]:
        if needs and not any(n in text for n in needs):
            return
        for m in rx.finditer(text):
            if check is None or check(m.group(0)):
                yield m.span()

    return find
