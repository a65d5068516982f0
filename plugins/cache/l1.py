"""L1: the in-process exact cache, bounded in bytes, with TTL (and stale grace).

Single-threaded by design (the event loop), so no locks. Sizes are the serialized
entry's bytes (UTF-8, `Entry.size`): a fair proxy for memory and what L2 stores too.
`on_remove` hears of every key that leaves (eviction, expiry, replacement, delete,
purge), so bookkeeping kept beside L1 (the per-user cap) never outlives the entries.

Tenants share the bound fairly: each entry has an owner (`owner(entry)`, the tenant
whose request stored it), and when L1 is full the owner holding the most bytes loses its
least recently used entry, so one tenant asking many distinct questions evicts its own
entries, never those of a tenant holding less than it. With one owner this is a plain
LRU. `max_bytes_per_owner` (optional) caps what one owner may hold even while L1 has
room.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator

from proxy.tally import Tally

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
        #: owner -> the bytes of its entries (and their total, `bytes`)
        self._bytes = Tally()
        #: key -> (entry, size, owner)
        self._items: dict[str, tuple[Entry, int, str]] = {}
        #: owner -> its keys, least recently used first
        self._owned: dict[str, OrderedDict[str, None]] = {}

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def held(self, key: str) -> Entry | None:
        """The entry under `key`, expired or not, without touching its recency."""
        item = self._items.get(key)
        return None if item is None else item[0]

    @property
    def bytes(self) -> int:
        return self._bytes.total

    def owned_bytes(self, owner: str) -> int:
        return self._bytes.get(owner)

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
        self._bytes.add(owner, size)
        while self._bytes.get(owner) > cap:
            self._evict(owner)
        while self._bytes.total > self.max_bytes:
            self._evict(self._bytes.largest())

    def _evict(self, owner: str) -> None:
        self.delete(next(iter(self._owned[owner])))

    def delete(self, key: str) -> bool:
        item = self._items.pop(key, None)
        if item is None:
            return False
        _, size, owner = item
        keys = self._owned[owner]
        del keys[key]
        if not keys:
            del self._owned[owner]
        self._bytes.add(owner, -size)
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
