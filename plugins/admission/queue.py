"""A bounded priority gate: `max_concurrent` permits and a bounded, ordered wait list.

A request takes as many permits as the sequences it puts in the engine (`n` choices of
each prompt), at most all of them. Waiters are kept sorted by (priority, arrival); freed
permits go to the first one once there are enough for it (the first waits for its
permits rather than being passed by smaller ones, so a large request is not starved).
When the list is full, a newcomer of better priority takes the place of the worst
waiter (which is shed at once); otherwise the newcomer is shed at once. A waiter that
gives up (timeout, cancellation) leaves the list, and a permit handed to it in the same
instant is passed on, so permits are never lost.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
from dataclasses import dataclass, field


class Shed(Exception):
    """No permit: the queue is full (or this waiter was displaced)."""


@dataclass(order=True)
class _Waiter:
    priority: int
    seq: int
    future: asyncio.Future[None] = field(compare=False)
    weight: int = field(default=1, compare=False)


class PriorityGate:
    def __init__(self, max_concurrent: int, max_queue: int) -> None:
        self.max_concurrent = max_concurrent
        self.max_queue = max_queue
        self.in_use = 0
        self._waiters: list[_Waiter] = []
        self._seq = itertools.count()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def weight(self, sequences: int) -> int:
        """Permits for a request of `sequences`: one each, at most all of them (so that
        any request can run, alone if need be)."""
        return max(1, min(sequences, self.max_concurrent))

    async def acquire(self, priority: int, timeout: float | None, weight: int = 1) -> None:
        """Take `weight` permits (see `weight()`), waiting at most `timeout`; Shed or
        TimeoutError otherwise."""
        if self.in_use + weight <= self.max_concurrent and not self._waiters:
            self.in_use += weight
            return
        if len(self._waiters) >= self.max_queue:
            # A waiter cancelled in this instant (its client left, its timeout fired)
            # has a done future but leaves the list only on its next step: it holds
            # no place, and it cannot be displaced.
            self._waiters = [w for w in self._waiters if not w.future.done()]
        if len(self._waiters) >= self.max_queue:
            worst = self._waiters[-1] if self._waiters else None
            if worst is None or worst.priority <= priority:
                raise Shed()
            self._waiters.pop()
            worst.future.set_exception(Shed())
        w = _Waiter(priority, next(self._seq), asyncio.get_running_loop().create_future(),
                    weight)
        bisect.insort(self._waiters, w)
        self._grant()  # it may have gone ahead of a heavy first waiter, and fit
        try:
            async with asyncio.timeout(timeout):
                await w.future
        except BaseException:
            if w in self._waiters:
                self._waiters.remove(w)
                self._grant()  # a heavy first waiter may have held lighter ones back
            elif w.future.done() and not w.future.cancelled() and w.future.exception() is None:
                self.release(weight)  # granted as we gave up: pass them on
            raise

    def release(self, weight: int = 1) -> None:
        self.in_use -= weight
        self._grant()

    def _grant(self) -> None:
        """Permits to the first waiters, in order, while there are enough for the first."""
        while self._waiters:
            w = self._waiters[0]
            if w.future.done():  # shed or given up in this instant
                self._waiters.pop(0)
                continue
            if self.in_use + w.weight > self.max_concurrent:
                return
            self._waiters.pop(0)
            self.in_use += w.weight
            w.future.set_result(None)
