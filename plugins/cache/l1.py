"""L1: the in-process exact cache, an LRU bounded in bytes, with TTL (and stale grace).

Single-threaded by design (the event loop), so no locks. Sizes are the serialized
entry's length: a fair proxy for memory and what L2 stores too. `on_remove` hears of
every key that leaves (eviction, expiry, replacement, delete, purge), so bookkeeping
kept beside L1 (the per-user cap) never outlives the entries.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator

from .entry import Entry


class L1:
    def __init__(self, max_bytes: int,
                 on_remove: Callable[[str], None] | None = None) -> None:
        self.max_bytes = max_bytes
        self._on_remove = on_remove
        self.bytes = 0
        self._items: OrderedDict[str, tuple[Entry, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def held(self, key: str) -> Entry | None:
        """The entry under `key`, expired or not, without touching its recency."""
        item = self._items.get(key)
        return None if item is None else item[0]

    def get(self, key: str, now: float, allow_stale: bool = False) -> Entry | None:
        item = self._items.get(key)
        if item is None:
            return None
        entry = item[0]
        if not entry.usable(now, allow_stale):
            if not entry.usable(now, True):
                self.delete(key)
            return None
        self._items.move_to_end(key)
        return entry

    def put(self, entry: Entry, size: int) -> None:
        if size > self.max_bytes:
            return
        self.delete(entry.key)
        self._items[entry.key] = (entry, size)
        self.bytes += size
        while self.bytes > self.max_bytes:
            gone, (_, old) = self._items.popitem(last=False)
            self.bytes -= old
            if self._on_remove is not None:
                self._on_remove(gone)

    def delete(self, key: str) -> bool:
        item = self._items.pop(key, None)
        if item is None:
            return False
        self.bytes -= item[1]
        if self._on_remove is not None:
            self._on_remove(key)
        return True

    def entries(self) -> Iterator[Entry]:
        return (e for e, _ in list(self._items.values()))

    def purge(self, match: Callable[[Entry], bool]) -> list[str]:
        """Delete the matching entries; their keys."""
        doomed = [e.key for e in self.entries() if match(e)]
        for k in doomed:
            self.delete(k)
        return doomed
