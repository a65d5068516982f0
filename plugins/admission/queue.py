"""A bounded priority gate: `max_concurrent` permits and a bounded, ordered wait list.

A request takes as many permits as the sequences it puts in the engine (`n` choices of
each prompt), at most all of them. Waiters are kept sorted by (priority, turn, arrival);
freed permits go to the first one once there are enough for it (the first waits for its
permits rather than being passed by smaller ones, so a large request is not starved).
When the list is full, a newcomer ahead of the last waiter takes its place (which is
shed at once); otherwise the newcomer is shed at once. A waiter that gives up (timeout,
cancellation) leaves the list, and a permit handed to it in the same instant is passed
on, so permits are never lost.

Turns share a priority fairly between owners (tenants): each owner's waiters take turns
one after another (a waiter's turn is its owner's previous one's at its priority plus
that one's permits, never before the turn being served there: turns are counted per
priority; turns given up, by waiters that left
or were shed, are given back), so a tenant that queues a hundred
requests waits behind its own, and another tenant's one request goes next, not after
them; and when the list is full, it is the flooding tenant's last waiter that is shed,
not the newcomer. With one owner the order is arrival's, as before.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
from dataclasses import dataclass, field


class Shed(Exception):
    """No permit: the queue is full, or this waiter was displaced from it (`queued`)."""

    def __init__(self, queued: bool = False) -> None:
        super().__init__()
        self.queued = queued


@dataclass(order=True)
class _Waiter:
    priority: int
    turn: int
    seq: int
    future: asyncio.Future[None] = field(compare=False)
    weight: int = field(default=1, compare=False)
    owner: str = field(default="", compare=False)


class PriorityGate:
    def __init__(self, max_concurrent: int, max_queue: int) -> None:
        self.max_concurrent = max_concurrent
        self.max_queue = max_queue
        self.in_use = 0
        self._waiters: list[_Waiter] = []
        self._seq = itertools.count()
        #: per priority, the turn being served (the latest granted waiter's there); per
        #: (priority, owner), that owner's next there. (One count for all priorities let
        #: a grant at a better priority, its owner's turn after its own backlog at a
        #: worse one, move the turn served there past that backlog: another tenant's
        #: newcomer there waited behind all of it.)
        self._turn: dict[int, int] = {}
        self._next: dict[tuple[int, str], int] = {}
        #: `_next`'s size past which it is next cleared of owners served up
        self._forget_at = 64

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def weight(self, sequences: int) -> int:
        """Permits for a request of `sequences`: one each, at most all of them (so that
        any request can run, alone if need be)."""
        return max(1, min(sequences, self.max_concurrent))

    async def acquire(self, priority: int, timeout: float | None, weight: int = 1,
                      owner: str = "") -> None:
        """Take `weight` permits (see `weight()`), waiting at most `timeout`; Shed or
        TimeoutError otherwise. `owner`: whose turns it takes (its tenant)."""
        if self.in_use + weight <= self.max_concurrent and not self._waiters:
            self.in_use += weight
            return
        if not self._waiters:  # nobody waits: no owner is behind another
            self._next.clear()
        mine = (priority, owner)
        turn = max(self._turn.get(priority, 0), self._next.get(mine, 0))
        if len(self._waiters) >= self.max_queue:
            # A waiter cancelled in this instant (its client left, its timeout fired)
            # has a done future but leaves the list only on its next step: it holds
            # no place, and it cannot be displaced.
            self._waiters = [w for w in self._waiters if not w.future.done()]
        if len(self._waiters) >= self.max_queue:
            worst = self._waiters[-1] if self._waiters else None
            if worst is None or (worst.priority, worst.turn) <= (priority, turn):
                raise Shed()
            self._waiters.pop()
            worst.future.set_exception(Shed(queued=True))
        w = _Waiter(priority, turn, next(self._seq),
                    asyncio.get_running_loop().create_future(), weight, owner)
        self._next[mine] = turn + weight
        if len(self._next) > max(self._forget_at, 2 * len(self._waiters) + 64):
            # Owners served up, forgotten; next once it has doubled: owners served one
            # after another, each a turn ahead of the one served, stay (their next turn
            # still counts), so where there were more than twice as many as waiters a
            # pass ran on every request, O(owners) where the gate is busiest.
            self._next = {o: t for o, t in self._next.items()
                          if t > self._turn.get(o[0], 0)}
            self._forget_at = 2 * len(self._next)
        bisect.insort(self._waiters, w)
        self._grant()  # it may have gone ahead of a heavy first waiter, and fit
        try:
            async with asyncio.timeout(timeout):
                await w.future
        except BaseException:
            granted = (w.future.done() and not w.future.cancelled()
                       and w.future.exception() is None)
            if w in self._waiters:
                self._waiters.remove(w)
                self._grant()  # a heavy first waiter may have held lighter ones back
            elif granted:
                self.release(weight)  # granted as we gave up: pass them on
            if not granted:  # its turn untaken: its owner's next is after those waiting
                self._next[mine] = max((x.turn + x.weight for x in self._waiters
                                        if x.owner == owner and x.priority == priority),
                                       default=0)
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
            self._turn[w.priority] = max(self._turn.get(w.priority, 0), w.turn)
            w.future.set_result(None)
