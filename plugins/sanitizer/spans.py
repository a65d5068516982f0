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
    """A regex detector; `needs`: literals one of which must occur (a cheap prefilter).
    An empty match is no finding (a custom pattern such as `\\b` or `(?=x)` matches
    none of the text: it would block or redact every request at every boundary)."""
    rx = re.compile(pattern, flags)

    def find(text: str) -> Iterator[Span]:
        if needs and not any(n in text for n in needs):
            return
        for m in rx.finditer(text):
            if m.end() > m.start() and (check is None or check(m.group(0))):
                yield m.span()

    return find


def widened(runs: list[Span], end: int, before: int, after: int) -> list[Span]:
    """Each run widened by `before` and `after` (within a text of `end` characters),
    overlapping ones merged: the places a pattern around the runs must read, each once."""
    windows: list[Span] = []
    for a, b in runs:
        lo, hi = max(0, a - before), min(end, b + after)
        if windows and lo <= windows[-1][1]:
            windows[-1] = (windows[-1][0], max(hi, windows[-1][1]))
        else:
            windows.append((lo, hi))
    return windows


def trie(words: list[str]) -> str:
    """A regex matching any of `words`, as a trie ("gh(?:p_|o_)" rather than
    "ghp_|gho_"): one branch per first character, so scanning text costs about the
    same however many literals there are."""
    heads: dict[str, list[str]] = {}
    for w in sorted(set(words)):
        heads.setdefault(w[:1], []).append(w[1:])
    branches = []
    for head, tails in heads.items():
        if "" in tails:  # a word that ends here: its longer forms are no different
            branches.append(re.escape(head))
        else:
            branches.append(re.escape(head) + (re.escape(tails[0]) if len(tails) == 1
                                               else f"(?:{trie(tails)})"))
    return branches[0] if len(branches) == 1 else "|".join(branches)
