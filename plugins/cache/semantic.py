"""The semantic index: one vector matrix per partition, partitions bounded (LRU), the
whole index bounded in bytes.

A partition is (scope, model, earlier turns, parameters): the lookup picks the
partition first and searches only inside it, so the tenant filter is part of the lookup
itself, not a filter applied to results. Vectors are unit-length, so the score is a dot
product. Rows of deleted entries are zeroed and reused. `on_remove(partition, id)` hears
of every entry that leaves (eviction, purge, delete, its partition dropped whole).

Embeddings score "cancel order 123" and "cancel order 456" as near-identical: the
near-miss guard (guard.py) refuses such hits. A partition counts its entries' guard
gates, so a question no entry's gate matches is a miss without a search (or an
embedding).

Memory: a partition's matrix starts at `MIN_ROWS` rows, doubles as it fills (up to its
capacity) and halves once three quarters of it are unused; beside it each entry keeps its
answer, its question and some bookkeeping (`entry_bytes`). The index counts both
(`SemanticIndex.bytes`) and holds at most `max_bytes`: past it, the tenant holding the
most bytes loses the oldest entry of its least recently used partition (an emptied
partition goes whole). Without that bound, 1,024 partitions (a client varying `seed` or
`temperature` makes a new one per request) of up to `capacity` entries each could hold
gigabytes.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable

import numpy as np

from proxy.tally import Tally

from .entry import Entry, text_bytes
from .guard import ANY_GATE, DIGEST_MARK, gate, guard_digest, guard_ok

__all__ = ["DIGEST_MARK", "Partition", "SemanticIndex", "entry_bytes", "gate", "guard_digest",
           "guard_ok"]

#: A partition's matrix rows at first (and at least, once shrunk): 8 rows of 384 float32
#: are 12 KiB; a partition holding one entry took 96 KiB when it started at 64.
MIN_ROWS = 8
#: An entry's bookkeeping beside its answer and question, in bytes (its Entry object, its
#: places in the partition's dicts, its gate's count): measured about 400 with 3.12.
ENTRY_OVERHEAD = 512


def entry_bytes(entry: Entry, question: str) -> int:
    """What an entry costs the index beside its vector's row: its serialized answer (as
    L1 counts it), its question and its bookkeeping."""
    return entry.size() + text_bytes(question) + ENTRY_OVERHEAD


class Partition:
    def __init__(self, dim: int, capacity: int,
                 on_remove: Callable[[str], None] | None = None,
                 on_size: Callable[[int], None] | None = None) -> None:
        self.dim = dim
        self._on_remove = on_remove
        self._on_size = on_size  # hears each change of `bytes`
        self.capacity = capacity
        self.vecs = np.zeros((min(capacity, MIN_ROWS), dim), dtype=np.float32)
        self._sizes: dict[str, int] = {}  # id -> entry_bytes
        self._meta = 0  # their sum
        #: the matrix and what the entries keep beside it
        self.bytes = self.vecs.nbytes
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
        self._sizes[entry_id] = size = entry_bytes(entry, question)
        self._meta += size
        self._sized()
        return evicted

    def _sized(self) -> None:
        now = self.vecs.nbytes + self._meta
        delta, self.bytes = now - self.bytes, now
        if delta and self._on_size is not None:
            self._on_size(delta)

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
        self._meta -= self._sizes.pop(entry_id)
        if len(self.vecs) > MIN_ROWS and len(self.rows) <= len(self.vecs) // 4:
            self._shrink()
        self._sized()
        if self._on_remove is not None:
            self._on_remove(entry_id)
        return True

    def _shrink(self) -> None:
        """Compact the live rows into a matrix half the size: a partition that held many
        entries and lost most keeps no matrix sized for them."""
        ids = list(self.rows)
        smaller = np.zeros((max(MIN_ROWS, 2 * len(ids)), self.dim), dtype=np.float32)
        for new, entry_id in enumerate(ids):
            smaller[new] = self.vecs[self.rows[entry_id]]
            self.rows[entry_id] = new
        self.vecs = smaller
        self._row_ids = list[str | None](ids)
        self._used = len(ids)
        self._free = []

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
    `max_partitions_per_owner` (optional) caps one owner's even while there is room.
    `max_bytes` bounds the whole index (`bytes`: matrices and what entries keep beside
    them): past it the owner holding the most bytes loses the oldest entry of its least
    recently used partition, the partition going whole once empty (its entries, as a
    dropped partition's, stay in Redis until their TTL)."""

    def __init__(self, dim: int, capacity: int, max_partitions: int = 1024,
                 on_remove: Callable[[str, str], None] | None = None,
                 max_partitions_per_owner: int | None = None,
                 max_bytes: int = 256 * 2**20) -> None:
        self.dim = dim
        self.max_bytes = max_bytes
        #: owner -> the bytes of its partitions (and their total, `bytes`)
        self._bytes = Tally()
        self._fitting = False
        self.evicted_for_bytes = 0  # entries removed to stay within max_bytes
        self._on_remove = on_remove
        self.capacity = capacity
        self.max_partitions = max_partitions
        self.max_partitions_per_owner = max_partitions_per_owner
        self.partitions: OrderedDict[str, Partition] = OrderedDict()  # least recent first
        self._owner_of: dict[str, str] = {}  # partition -> its owner
        self._owned: dict[str, OrderedDict[str, None]] = {}  # owner -> its, least recent first
        self._counts = Tally()  # owner -> how many partitions it holds
        self.evicted_partitions = 0

    def __len__(self) -> int:
        return sum(len(p) for p in self.partitions.values())

    @property
    def bytes(self) -> int:
        return self._bytes.total

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
                largest, held = self._counts.largest(), self.owned(owner)
                if held and held + 1 >= len(self._owned[largest]):
                    largest = owner
                self._drop(next(iter(self._owned[largest])))
            p = self.partitions[name] = Partition(self.dim, self.capacity,
                                                  self._hook(name), self._sizer(owner, name))
            self._owner_of[name] = owner
            self._grew(owner, p.bytes, fit=False)  # (its first entry's add fits)
            mine = self._owned.setdefault(owner, OrderedDict())
            mine[name] = None
            self._counts.set(owner, len(mine))
            if not new_last:
                self.partitions.move_to_end(name, last=False)
                mine.move_to_end(name, last=False)
        return p

    def _sizer(self, owner: str, name: str) -> Callable[[int], None]:
        return lambda delta: self._grew(owner, delta, growing=name)

    def _grew(self, owner: str, delta: int, fit: bool = True, growing: str = "") -> None:
        """A partition of `owner` (`growing`) grew (or shrank) by `delta` bytes: past
        `max_bytes`, the owner holding the most gives way."""
        self._bytes.add(owner, delta)
        if fit and delta > 0 and not self._fitting:
            self._fitting = True
            try:
                self._fit(growing)
            finally:
                self._fitting = False

    def _fit(self, growing: str = "") -> None:
        """Within `max_bytes`: the owner holding the most loses the oldest entry of its
        least recently used partition other than `growing` (the one just added to: one
        an answer embedded late makes comes in least recently used, and would have lost
        that answer at once), that one's oldest where it holds no other."""
        while self._bytes.total > self.max_bytes and self.partitions:
            largest = self._bytes.largest()
            mine = iter(self._owned[largest])
            name = next(mine)
            if name == growing:
                name = next(mine, name)
            p = self.partitions[name]
            if len(p) > 1:
                p.remove(next(iter(p.rows)))
                self.evicted_for_bytes += 1
            else:
                self.evicted_for_bytes += len(p)
                self._drop(name, counted=False)

    def _drop(self, name: str, counted: bool = True) -> None:
        """Drop partition `name` whole (the bounds' eviction)."""
        old = self.partitions.pop(name)
        owner = self._owner_of.pop(name)
        mine = self._owned[owner]
        del mine[name]
        if not mine:
            del self._owned[owner]
        self._counts.set(owner, len(mine))
        self._bytes.add(owner, -old.bytes)
        old._on_size = None  # it is no longer counted
        self.evicted_partitions += counted
        if self._on_remove is not None:
            for entry_id in old.rows:
                self._on_remove(name, entry_id)

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
