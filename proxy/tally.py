"""Amounts owners hold (bytes, entries, partitions), and which owner holds the most:
what every bound shared fairly between tenants reads (the one holding the most gives
way), so a flooding tenant evicts its own, never a smaller tenant's."""

from __future__ import annotations

import heapq
from collections.abc import ItemsView


class Tally:
    """owner -> amount (an owner at 0 is dropped), their total, and `largest()` in
    O(log owners) amortized: a max-heap of (-amount, owner) pushed at each change, an
    entry no longer its owner's amount skipped when met, the heap rebuilt once it holds
    twice the owners. (A sum and a max over every owner made each put O(tenants).)"""

    __slots__ = ("_heap", "_held", "total")

    def __init__(self) -> None:
        self._held: dict[str, int] = {}
        self._heap: list[tuple[int, str]] = []
        self.total = 0

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, owner: object) -> bool:
        return owner in self._held

    def get(self, owner: str) -> int:
        return self._held.get(owner, 0)

    def items(self) -> ItemsView[str, int]:
        return self._held.items()

    def add(self, owner: str, delta: int) -> int:
        """`owner` holds `delta` more; what it holds now."""
        held = self._held.get(owner, 0) + delta
        self.total += delta
        if not held:
            self._held.pop(owner, None)
            return 0
        self._held[owner] = held
        heapq.heappush(self._heap, (-held, owner))
        if len(self._heap) > 2 * len(self._held) + 64:  # (amortized: O(1) a change)
            self._heap = [(-n, o) for o, n in self._held.items()]
            heapq.heapify(self._heap)
        return held

    def set(self, owner: str, amount: int) -> None:
        self.add(owner, amount - self._held.get(owner, 0))

    def largest(self) -> str:
        """The owner holding the most (of equals, the least name); LookupError if none
        holds any."""
        while self._heap:
            held, owner = self._heap[0]
            if self._held.get(owner) == -held:
                return owner
            heapq.heappop(self._heap)  # (an amount since changed, or an owner gone)
        raise LookupError("no owner holds any")

    def clear(self) -> None:
        self._held.clear()
        self._heap.clear()
        self.total = 0
