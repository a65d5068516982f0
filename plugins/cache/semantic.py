"""The semantic index: one vector matrix per partition, partitions bounded (LRU).

A partition is (scope, model, earlier turns, parameters): the lookup picks the
partition first and searches only inside it, so the tenant filter is part of the lookup
itself, not a filter applied to results. Vectors are unit-length, so the score is a dot
product. Rows of deleted entries are zeroed and reused. `on_remove(partition, id)` hears
of every entry that leaves (eviction, purge, delete, its partition dropped whole).

Embeddings score "cancel order 123" and "cancel order 456" as near-identical: the
near-miss guard (guard.py) refuses such hits. A partition counts its entries' guard
gates, so a question no entry's gate matches is a miss without a search (or an
embedding).
"""

from __future__ import annotations

import heapq
from collections import Counter, OrderedDict
from collections.abc import Callable

import numpy as np

from .entry import Entry
from .guard import ANY_GATE, DIGEST_MARK, gate, guard_digest, guard_ok

__all__ = ["DIGEST_MARK", "Partition", "SemanticIndex", "gate", "guard_digest", "guard_ok"]


class Partition:
    def __init__(self, dim: int, capacity: int,
                 on_remove: Callable[[str], None] | None = None) -> None:
        self.dim = dim
        self._on_remove = on_remove
        self.capacity = capacity
        self.vecs = np.zeros((min(capacity, 64), dim), dtype=np.float32)
        self.rows: OrderedDict[str, int] = OrderedDict()  # entry id -> row, oldest first
        self.entries: dict[str, tuple[Entry, str]] = {}  # id -> (entry, question)
        self._gates: dict[str, str] = {}  # id -> its question's guard gate
        self.gates: Counter[str] = Counter()  # gate -> entries
        self._free: list[int] = []
        self._used = 0
        self._row_ids: list[str | None] = []  # row -> entry id

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, entry_id: str, vec: np.ndarray, entry: Entry, question: str,
            question_gate: str | None = None) -> list[str]:
        """Insert; returns the ids evicted to stay within capacity. `question_gate`: the
        question's `gate`, if the caller has it."""
        evicted: list[str] = []
        if not self._used and len(vec) != self.dim:  # the model's size, known once loaded
            self.dim = len(vec)
            self.vecs = np.zeros((len(self.vecs), self.dim), dtype=np.float32)
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
        self._gates[entry_id] = g = gate(question) if question_gate is None else question_gate
        self.gates[g] += 1
        return evicted

    def may_pass(self, question_gate: str) -> bool:
        """Whether some entry's question could pass the guard with a question of this
        gate."""
        return self.gates[question_gate] > 0 or self.gates[ANY_GATE] > 0

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
        g = self._gates.pop(entry_id)
        self.gates[g] -= 1
        if not self.gates[g]:
            del self.gates[g]
        if self._on_remove is not None:
            self._on_remove(entry_id)
        return True

    def search(self, vec: np.ndarray, now: float, allow_stale: bool = False,
               ) -> tuple[str, float] | None:
        """Best usable entry id and its score, or None."""
        if not self.rows:
            return None
        scores = self.vecs[: self._used] @ vec
        best = int(np.argmax(scores))  # the usual case: the best row is live and usable
        found = self._usable(best, float(scores[best]), now, allow_stale)
        if found is not None or scores[best] <= 0:
            return found
        k = min(8, len(scores))  # else the next best few, in order
        top = np.argpartition(-scores, k - 1)[:k]
        for row in top[np.argsort(-scores[top])]:
            score = float(scores[row])
            if score <= 0:
                break
            if (found := self._usable(int(row), score, now, allow_stale)) is not None:
                return found
        return None

    def _usable(self, row: int, score: float, now: float, allow_stale: bool,
                ) -> tuple[str, float] | None:
        entry_id = self._row_ids[row]
        if entry_id is None or score <= 0:
            return None
        entry, _ = self.entries[entry_id]
        return (entry_id, score) if entry.usable(now, allow_stale) else None


class SemanticIndex:
    """Partitions by name, at most `max_partitions` of them: every distinct seed or
    parameter set makes a partition, so when that many are held one is dropped whole
    (its entries stay in Redis until their TTL, and the exact tiers are untouched): the
    least recently used one of the owner (the tenant that made it) holding the most, so
    one tenant sending many distinct seeds or parameter sets drops its own partitions,
    never those of a tenant holding fewer (with one owner: the least recently used).
    `max_partitions_per_owner` (optional) caps one owner's even while there is room."""

    def __init__(self, dim: int, capacity: int, max_partitions: int = 1024,
                 on_remove: Callable[[str, str], None] | None = None,
                 max_partitions_per_owner: int | None = None) -> None:
        self.dim = dim
        self._on_remove = on_remove
        self.capacity = capacity
        self.max_partitions = max_partitions
        self.max_partitions_per_owner = max_partitions_per_owner
        self.partitions: OrderedDict[str, Partition] = OrderedDict()  # least recent first
        self._owner_of: dict[str, str] = {}  # partition -> its owner
        self._owned: dict[str, OrderedDict[str, None]] = {}  # owner -> its, least recent first
        #: (-partitions, owner) at each change of an owner's count, the most first: an
        #: entry no longer its owner's count is skipped when met (`_largest`). (A scan of
        #: every owner's count made each new partition in a full index O(tenants).)
        self._heap: list[tuple[int, str]] = []
        self.evicted_partitions = 0

    def __len__(self) -> int:
        return sum(len(p) for p in self.partitions.values())

    def owned(self, owner: str) -> int:
        """How many partitions `owner` holds."""
        return len(self._owned.get(owner, ()))

    def get(self, name: str) -> Partition | None:
        """The partition, if any, marked as recently used."""
        p = self.partitions.get(name)
        if p is not None:
            self.partitions.move_to_end(name)
            self._owned[self._owner_of[name]].move_to_end(name)
        return p

    def find(self, name: str, vec: np.ndarray, now: float, allow_stale: bool = False,
             ) -> tuple[Entry, str, float] | None:
        """The best usable entry in partition `name`: (entry, its question, score)."""
        p = self.get(name)
        found = p.search(vec, now, allow_stale) if p is not None else None
        if p is None or found is None:
            return None
        entry, question = p.entries[found[0]]
        return entry, question, found[1]

    def partition(self, name: str, new_last: bool = True, owner: str = "") -> Partition:
        """The partition, made if new (dropping one of the owner's own when it holds its
        cap, else, when the index is full, one of the owner holding the most); a new one
        is the most recently used, or with `new_last=False` the least. `owner`: who makes
        it (an existing partition keeps the owner that made it)."""
        p = self.get(name)
        if p is None:
            cap = self.max_partitions_per_owner
            while cap is not None and self.owned(owner) >= cap:
                self._drop(next(iter(self._owned[owner])))
            while len(self.partitions) >= self.max_partitions:
                # the new one counted as the owner's already (a tie: the owner's own)
                largest, held = self._largest(), self.owned(owner)
                if held and held + 1 >= len(self._owned[largest]):
                    largest = owner
                self._drop(next(iter(self._owned[largest])))
            p = self.partitions[name] = Partition(self.dim, self.capacity,
                                                  self._hook(name))
            self._owner_of[name] = owner
            mine = self._owned.setdefault(owner, OrderedDict())
            mine[name] = None
            self._counted(owner, len(mine))
            if not new_last:
                self.partitions.move_to_end(name, last=False)
                mine.move_to_end(name, last=False)
        return p

    def _drop(self, name: str) -> None:
        """Drop partition `name` whole (the bound's eviction)."""
        old = self.partitions.pop(name)
        owner = self._owner_of.pop(name)
        mine = self._owned[owner]
        del mine[name]
        if not mine:
            del self._owned[owner]
        else:
            self._counted(owner, len(mine))
        self.evicted_partitions += 1
        if self._on_remove is not None:
            for entry_id in old.rows:
                self._on_remove(name, entry_id)

    def _counted(self, owner: str, held: int) -> None:
        """`owner` now holds `held` partitions (kept for `_largest`)."""
        heapq.heappush(self._heap, (-held, owner))
        if len(self._heap) > 2 * len(self._owned) + 64:  # (amortized: O(1) a change)
            self._heap = [(-len(m), o) for o, m in self._owned.items()]
            heapq.heapify(self._heap)

    def _largest(self) -> str:
        """The owner holding the most partitions (of equals, the least name)."""
        while True:
            held, owner = self._heap[0]
            mine = self._owned.get(owner)
            if mine is not None and len(mine) == -held:
                return owner
            heapq.heappop(self._heap)  # (a count since changed, or an owner gone)

    def _hook(self, name: str) -> Callable[[str], None] | None:
        hook = self._on_remove
        if hook is None:
            return None
        return lambda entry_id: hook(name, entry_id)

    def purge(self, match: Callable[[Entry], bool]) -> list[tuple[str, str]]:
        removed = []
        for name, p in self.partitions.items():
            for entry_id, (entry, _) in list(p.entries.items()):
                if match(entry):
                    p.remove(entry_id)
                    removed.append((name, entry_id))
        return removed
