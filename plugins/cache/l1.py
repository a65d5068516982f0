"""L1: the in-process exact cache, bounded in bytes, with TTL (and stale grace).

Single-threaded by design (the event loop), so no locks. Sizes are the serialized
entry's length: a fair proxy for memory and what L2 stores too. `on_remove` hears of
every key that leaves (eviction, expiry, replacement, delete, purge), so bookkeeping
kept beside L1 (the per-user cap) never outlives the entries.

Tenants share the bound fairly: each entry has an owner (`owner(entry)`, the tenant
whose request stored it), and when L1 is full the owner holding the most bytes loses its
least recently used entry, so one tenant asking many distinct questions evicts its own
entries, never those of a tenant holding less than it. With one owner this is a plain
LRU. `max_bytes_per_owner` (optional) caps what one owner may hold even while L1 has
room.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable, Iterator

from .entry import Entry


def _nobody(entry: Entry) -> str:
    return ""


class L1:
    def __init__(self, max_bytes: int,
                 on_remove: Callable[[str], None] | None = None,
                 owner: Callable[[Entry], str] = _nobody,
                 max_bytes_per_owner: int | None = None) -> None:
        self.max_bytes = max_bytes
        self.max_bytes_per_owner = max_bytes_per_owner
        self._on_remove = on_remove
        self._owner = owner
        self.bytes = 0
        #: key -> (entry, size, owner)
        self._items: dict[str, tuple[Entry, int, str]] = {}
        #: owner -> its keys, least recently used first
        self._owned: dict[str, OrderedDict[str, None]] = {}
        self._owner_bytes: dict[str, int] = {}
        #: (-bytes, owner) at each change of an owner's bytes, the largest first: an
        #: entry no longer its owner's count is skipped when met (`_largest`). (A scan of
        #: every owner's count made each put into a full L1 O(tenants).)
        self._heap: list[tuple[int, str]] = []

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def held(self, key: str) -> Entry | None:
        """The entry under `key`, expired or not, without touching its recency."""
        item = self._items.get(key)
        return None if item is None else item[0]

    def owned_bytes(self, owner: str) -> int:
        return self._owner_bytes.get(owner, 0)

    def get(self, key: str, now: float, allow_stale: bool = False) -> Entry | None:
        item = self._items.get(key)
        if item is None:
            return None
        entry = item[0]
        if not entry.usable(now, allow_stale):
            if not entry.usable(now, True):
                self.delete(key)
            return None
        self._owned[item[2]].move_to_end(key)
        return entry

    def put(self, entry: Entry, size: int) -> None:
        cap = min(self.max_bytes, self.max_bytes_per_owner or self.max_bytes)
        if size > cap:
            return
        self.delete(entry.key)
        owner = self._owner(entry)
        self._items[entry.key] = (entry, size, owner)
        self._owned.setdefault(owner, OrderedDict())[entry.key] = None
        held = self._owner_bytes[owner] = self._owner_bytes.get(owner, 0) + size
        self._counted(owner, held)
        self.bytes += size
        while self._owner_bytes[owner] > cap:
            self._evict(owner)
        while self.bytes > self.max_bytes:
            self._evict(self._largest())

    def _counted(self, owner: str, held: int) -> None:
        """`owner` now holds `held` bytes (kept for `_largest`)."""
        heapq.heappush(self._heap, (-held, owner))
        if len(self._heap) > 2 * len(self._owner_bytes) + 64:  # (amortized: O(1) a change)
            self._heap = [(-b, o) for o, b in self._owner_bytes.items()]
            heapq.heapify(self._heap)

    def _largest(self) -> str:
        """The owner holding the most bytes (of equals, the least name)."""
        while True:
            held, owner = self._heap[0]
            if self._owner_bytes.get(owner) == -held:
                return owner
            heapq.heappop(self._heap)  # (a count since changed, or an owner gone)

    def _evict(self, owner: str) -> None:
        self.delete(next(iter(self._owned[owner])))

    def delete(self, key: str) -> bool:
        item = self._items.pop(key, None)
        if item is None:
            return False
        _, size, owner = item
        self.bytes -= size
        keys = self._owned[owner]
        del keys[key]
        self._owner_bytes[owner] -= size
        if not keys:
            del self._owned[owner], self._owner_bytes[owner]
        else:
            self._counted(owner, self._owner_bytes[owner])
        if self._on_remove is not None:
            self._on_remove(key)
        return True

    def entries(self) -> Iterator[Entry]:
        return (e for e, _, _ in list(self._items.values()))

    def purge(self, match: Callable[[Entry], bool]) -> list[str]:
        """Delete the matching entries; their keys."""
        doomed = [e.key for e in self.entries() if match(e)]
        for k in doomed:
            self.delete(k)
        return doomed
