"""The semantic index: one vector matrix per partition, and the near-miss guard.

A partition is (scope, model, earlier turns, parameters): the lookup picks the
partition first and searches only inside it, so the tenant filter is part of the lookup
itself, not a filter applied to results. Vectors are unit-length, so the score is a dot
product. Rows of deleted entries are zeroed and reused.

Embeddings score "cancel order 123" and "cancel order 456" as near-identical. The guard
(on by default) refuses a hit whose numbers, negations, capitalized names or contrast
words (increase/decrease, add/remove, enable/disable ...) differ from the question's, in
order, so changed ids, amounts, negations, opposites and swapped entities miss while
paraphrases still hit.
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from .entry import Entry

_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_NEGATION = re.compile(
    r"\b(?:not|no|never|none|nothing|cannot|can't|won't|don't|doesn't|didn't|isn't|aren't|"
    r"wasn't|weren't|without|neither|nor)\b|n't\b|不|没|无|别|非", re.IGNORECASE)
_NAME = re.compile(r"(?<![.!?]\s)(?<!^)\b[A-Z][a-zA-Z]+\b")
_WORD = re.compile(r"[a-z]+(?:-[a-z]+)?")
# Words that flip a request's meaning while barely moving its embedding. Synonyms share
# a polarity tag, so "enable" and "turn on" still agree.
_PHRASES = {"turn on": "enable", "switch on": "enable", "turn off": "disable",
            "switch off": "disable", "sign up": "register", "log out": "logout",
            "sign out": "logout", "log in": "login", "sign in": "login"}
_CONTRAST = {
    **dict.fromkeys(("increase", "raise", "higher", "more", "up"), "+amount"),
    **dict.fromkeys(("decrease", "reduce", "lower", "less", "down"), "-amount"),
    **dict.fromkeys(("add", "create", "invite", "insert"), "+member"),
    **dict.fromkeys(("remove", "delete", "kick"), "-member"),
    **dict.fromkeys(("enable", "activate", "allow"), "+switch"),
    **dict.fromkeys(("disable", "deactivate", "block", "forbid"), "-switch"),
    **dict.fromkeys(("upgrade",), "+plan"), **dict.fromkeys(("downgrade",), "-plan"),
    **dict.fromkeys(("renew", "extend", "resume"), "+term"),
    **dict.fromkeys(("cancel", "terminate", "pause", "end"), "-term"),
    **dict.fromkeys(("buy", "purchase"), "+trade"), **dict.fromkeys(("sell",), "-trade"),
    **dict.fromkeys(("lock",), "+lock"), **dict.fromkeys(("unlock",), "-lock"),
    **dict.fromkeys(("login", "register"), "+session"),
    **dict.fromkeys(("logout", "unsubscribe"), "-session"),
    **dict.fromkeys(("before", "earlier"), "+time"), **dict.fromkeys(("after", "later"), "-time"),
    **dict.fromkeys(("maximum", "max", "most"), "+bound"),
    **dict.fromkeys(("minimum", "min", "least"), "-bound"),
}


def guard_tokens(text: str) -> tuple[tuple[str, ...], int, tuple[str, ...], tuple[str, ...]]:
    """(numbers, negation count, capitalized names, contrast tags), each in order."""
    numbers = tuple(n.replace(",", "") for n in _NUMBER.findall(text))
    negations = len(_NEGATION.findall(text))
    names = tuple(m.group(0).lower() for m in _NAME.finditer(text.strip()))
    low = text.lower()
    for phrase, word in _PHRASES.items():
        if phrase in low:
            low = low.replace(phrase, word)
    contrast = tuple(_CONTRAST[w] for w in _WORD.findall(low) if w in _CONTRAST)
    return numbers, negations, names, contrast


#: Marks a stored guard digest (an entry read from Redis without its question text).
DIGEST_MARK = "\x00guard:"


def guard_digest(text: str) -> str:
    """A hash of the guard's tokens: enough to compare, and no prompt text in it."""
    tokens = repr(guard_tokens(text)).encode()
    return DIGEST_MARK + hashlib.sha256(tokens).hexdigest()


def guard_ok(question: str, stored: str) -> bool:
    """`stored`: the stored question, or its `guard_digest`."""
    if stored.startswith(DIGEST_MARK):
        return guard_digest(question) == stored
    return guard_tokens(question) == guard_tokens(stored)


class Partition:
    def __init__(self, dim: int, capacity: int) -> None:
        self.dim = dim
        self.capacity = capacity
        self.vecs = np.zeros((min(capacity, 64), dim), dtype=np.float32)
        self.rows: OrderedDict[str, int] = OrderedDict()  # entry id -> row, oldest first
        self.entries: dict[str, tuple[Entry, str]] = {}  # id -> (entry, question)
        self._free: list[int] = []
        self._used = 0
        self._row_ids: list[str | None] = []  # row -> entry id

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, entry_id: str, vec: np.ndarray, entry: Entry, question: str,
            ) -> list[str]:
        """Insert; returns the ids evicted to stay within capacity."""
        evicted: list[str] = []
        if entry_id in self.rows:
            self.remove(entry_id)
        while len(self.rows) >= self.capacity:
            oldest = next(iter(self.rows))
            self.remove(oldest)
            evicted.append(oldest)
        row = self._free.pop() if self._free else self._grow()
        self.vecs[row] = vec
        self.rows[entry_id] = row
        self._row_ids[row] = entry_id
        self.entries[entry_id] = (entry, question)
        return evicted

    def _grow(self) -> int:
        if self._used == len(self.vecs):
            bigger = np.zeros((min(self.capacity, len(self.vecs) * 2), self.dim),
                              dtype=np.float32)
            bigger[: len(self.vecs)] = self.vecs
            self.vecs = bigger
        self._used += 1
        self._row_ids.append(None)
        return self._used - 1

    def remove(self, entry_id: str) -> bool:
        row = self.rows.pop(entry_id, None)
        if row is None:
            return False
        self.vecs[row] = 0.0
        self._row_ids[row] = None
        self._free.append(row)
        self.entries.pop(entry_id, None)
        return True

    def search(self, vec: np.ndarray, now: float, allow_stale: bool = False,
               ) -> tuple[str, float] | None:
        """Best usable entry id and its score, or None."""
        if not self.rows:
            return None
        scores = self.vecs[: self._used] @ vec
        k = min(8, len(scores))
        top = np.argpartition(-scores, k - 1)[:k]
        for row in top[np.argsort(-scores[top])]:
            score = float(scores[row])
            if score <= 0:
                break
            entry_id = self._row_ids[int(row)]
            if entry_id is None:
                continue
            entry, _ = self.entries[entry_id]
            if entry.usable(now, allow_stale):
                return entry_id, score
        return None


class SemanticIndex:
    def __init__(self, dim: int, capacity: int) -> None:
        self.dim = dim
        self.capacity = capacity
        self.partitions: dict[str, Partition] = {}

    def __len__(self) -> int:
        return sum(len(p) for p in self.partitions.values())

    def partition(self, name: str) -> Partition:
        p = self.partitions.get(name)
        if p is None:
            p = self.partitions[name] = Partition(self.dim, self.capacity)
        return p

    def purge(self, match: Callable[[Entry], bool]) -> list[tuple[str, str]]:
        removed = []
        for name, p in self.partitions.items():
            for entry_id, (entry, _) in list(p.entries.items()):
                if match(entry):
                    p.remove(entry_id)
                    removed.append((name, entry_id))
        return removed
