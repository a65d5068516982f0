"""A bounded priority gate: `max_concurrent` permits and a bounded, ordered wait list.

Waiters are kept sorted by (priority, arrival); a freed permit goes to the first one.
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

    async def acquire(self, priority: int, timeout: float | None) -> None:
        """Take a permit, waiting at most `timeout`; Shed or TimeoutError otherwise."""
        if self.in_use < self.max_concurrent and not self._waiters:
            self.in_use += 1
            return
        if len(self._waiters) >= self.max_queue:
            worst = self._waiters[-1] if self._waiters else None
            if worst is None or worst.priority <= priority:
                raise Shed()
            self._waiters.pop()
            worst.future.set_exception(Shed())
        w = _Waiter(priority, next(self._seq), asyncio.get_running_loop().create_future())
        bisect.insort(self._waiters, w)
        try:
            async with asyncio.timeout(timeout):
                await w.future
        except BaseException:
            if w in self._waiters:
                self._waiters.remove(w)
            elif w.future.done() and not w.future.cancelled() and w.future.exception() is None:
                self.release()  # granted as we gave up: pass it on
            raise

    def release(self) -> None:
        while self._waiters:
            w = self._waiters.pop(0)
            if not w.future.done():
                w.future.set_result(None)  # the permit moves to the waiter
                return
        self.in_use -= 1
