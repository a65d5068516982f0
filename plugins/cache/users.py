"""Per-user caps: Redis keeps each user's entries when it can; this replica's own
`UserIndex` does when it cannot (no Redis, or Redis down).

Lists only what this replica still holds: the store tells it of every removal (L1
eviction, expiry, purge, vector-index eviction) through `discard`, and a user whose
list empties is forgotten. So it is bounded by the entries held, never by the number of
users seen, and never names a key L1 already dropped.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

Owner = tuple[str, str]  # (tenant, user)


def exact_member(key: str) -> str:
    return f"x:{key}"


def semantic_member(partition: str, entry_id: str) -> str:
    return f"s:{partition}:{entry_id}"


def split_members(members: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """(exact keys, (partition, entry id) pairs) named by members."""
    keys, sem = [], []
    for m in members:
        kind, _, rest = m.partition(":")
        if kind == "x":
            keys.append(rest)
        elif kind == "s":
            partition, _, entry_id = rest.rpartition(":")
            sem.append((partition, entry_id))
    return keys, sem


class UserIndex:
    def __init__(self) -> None:
        self._lists: dict[Owner, OrderedDict[str, None]] = {}
        self._owner: dict[str, Owner] = {}  # member -> its owner

    def __len__(self) -> int:
        """Members tracked, all users together."""
        return len(self._owner)

    def users(self) -> int:
        return len(self._lists)

    def members(self, owner: Owner) -> list[str]:
        """The owner's members, oldest first."""
        return list(self._lists.get(owner, ()))

    def add(self, owner: Owner, member: str) -> None:
        self.discard(member)
        self._lists.setdefault(owner, OrderedDict())[member] = None
        self._owner[member] = owner

    def discard(self, member: str) -> None:
        owner = self._owner.pop(member, None)
        if owner is None:
            return
        mine = self._lists[owner]
        mine.pop(member, None)
        if not mine:
            del self._lists[owner]

    def over(self, owner: Owner, limit: int) -> list[str]:
        """Forget and return the owner's oldest members beyond `limit`."""
        mine = self._lists.get(owner)
        evicted: list[str] = []
        while mine and len(mine) > limit:
            evicted.append(next(iter(mine)))
            self.discard(evicted[-1])
        return evicted

    def enforce(self, owner: Owner, members: list[str], cap: int,
                held: Callable[[str], bool]) -> list[str]:
        """Count `members` (one entry's exact and semantic parts) against the owner's
        `cap`, here, when Redis cannot; the members to evict. `held` says whether this
        replica still holds one."""
        for m in members:
            if held(m):  # already evicted or purged: nothing to count
                self.add(owner, m)
        return self.over(owner, cap)
