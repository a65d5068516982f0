"""A bounded, tenant-fair priority gate: `max_concurrent` permits and a bounded wait list.

A request takes as many permits as the sequences it puts in the engine (`n` choices of
each prompt), at most all of them. Freed permits go to the first waiter once there are
enough for it (the first waits for its permits rather than being passed by smaller ones,
so a large request is not starved). When the list is full, a newcomer ahead of the last
waiter takes its place (which is shed at once); otherwise the newcomer is shed at once.
A waiter that gives up (timeout, cancellation) leaves the list, and a permit handed to
it in the same instant is passed on, so permits are never lost.

Order: owners (tenants) take turns first, priority orders each owner's own waiters.
Each owner's waiters, in its own order, take its turns one after another
(each a turn of as many permits as it holds), the first from the owner's next turn,
never before the turn being served; the list is sorted by (turn, priority, arrival), so
at one turn a better priority goes first. A tenant whose keys have a better role's
priority goes ahead of its own requests, not of every other tenant's: a tenant queueing
a hundred admin requests waits behind its own, and another tenant's one request goes
next. Turns given up (waiters that left or were shed) are given back. When the list is
full it is the flooding tenant's last waiter that is shed, not the newcomer.

An owner's own order is weighted, not strict: each waiter is ranked by its arrival among
the owner's waiters plus `priority_passes` places per point of its priority, so a waiter
is passed by at most (its priority - theirs) x `priority_passes` of the owner's later,
better waiters (a tenant's admin key sending steadily kept that tenant's users waiting
until their wait ran out). `priority_passes=None`: (priority, arrival), strictly;
`priority_passes=0`: priorities play no part, at one turn either (plain arrival order
within the tenants' turns).
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
from dataclasses import dataclass, field

#: `priority_passes` by default: a user (10) is passed by at most 50 of its tenant's
#: admin (0) requests that came after it.
DEFAULT_PRIORITY_PASSES = 5

class Shed(Exception):
    """No permit: the queue is full, or this waiter was displaced from it (`queued`)."""

    def __init__(self, queued: bool = False) -> None:
        super().__init__()
        self.queued = queued


@dataclass(order=True)
class _Waiter:
    turn: int
    priority: int
    seq: int
    future: asyncio.Future[None] = field(compare=False)
    weight: int = field(default=1, compare=False)
    owner: str = field(default="", compare=False)
    #: its rank among its owner's waiters (see the module's docstring)
    rank: int = field(default=0, compare=False)

    def own_order(self) -> tuple[int, int, int]:
        return self.rank, self.priority, self.seq


class PriorityGate:
    def __init__(self, max_concurrent: int, max_queue: int,
                 priority_passes: int | None = DEFAULT_PRIORITY_PASSES) -> None:
        self.max_concurrent = max_concurrent
        self.max_queue = max_queue
        self.priority_passes = priority_passes
        self.in_use = 0
        self._waiters: list[_Waiter] = []
        self._seq = itertools.count()
        #: the turn being served (the latest granted waiter's)
        self._turn = 0
        #: per owner, its next turn (after its latest granted waiter's)
        self._next: dict[str, int] = {}
        #: per owner, its waiters in its own order (priority, arrival)
        self._owned: dict[str, list[_Waiter]] = {}
        #: `_next`'s size past which it is next cleared of owners served up
        self._forget_at = 64
        #: per owner with waiters, how many have arrived since it had none
        self._arrived: dict[str, int] = {}

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
        if self.priority_passes == 0:  # (priorities off: arrival order, turns aside)
            priority = 0
        if self.in_use + weight <= self.max_concurrent and not self._waiters:
            self.in_use += weight
            return
        if not self._waiters:  # nobody waits: no owner is behind another
            self._next.clear()
        if len(self._waiters) >= self.max_queue:
            # A waiter cancelled in this instant (its client left, its timeout fired)
            # has a done future but leaves the list only on its next step: it holds
            # no place, and it cannot be displaced.
            for gone in [w for w in self._waiters if w.future.done()]:
                self._drop(gone)
        if owner not in self._owned:  # its first waiter: from the turn being served
            self._next[owner] = max(self._turn, self._next.get(owner, 0))
            self._arrived[owner] = 0
        arrival = self._arrived[owner]
        self._arrived[owner] = arrival + 1
        rank = (priority if self.priority_passes is None
                else arrival + priority * self.priority_passes)
        w = _Waiter(0, priority, next(self._seq),
                    asyncio.get_running_loop().create_future(), weight, owner, rank)
        self._add(w)
        if len(self._waiters) > self.max_queue:
            worst = self._waiters[-1]  # (the last of its owner's: its turn is its latest)
            self._drop(worst)
            if worst is w:
                raise Shed()
            worst.future.set_exception(Shed(queued=True))
        self._forget()
        self._grant()  # it may have gone ahead of a heavy first waiter, and fit
        try:
            async with asyncio.timeout(timeout):
                await w.future
        except BaseException:
            granted = (w.future.done() and not w.future.cancelled()
                       and w.future.exception() is None)
            if w in self._waiters:  # its turn untaken: given back to its owner's others
                self._drop(w)
                self._grant()  # a heavy first waiter may have held lighter ones back
            elif granted:
                self.release(weight)  # granted as we gave up: pass them on
            raise

    def release(self, weight: int = 1) -> None:
        self.in_use -= weight
        self._grant()

    def _add(self, w: _Waiter) -> None:
        own = self._owned.setdefault(w.owner, [])
        if not own or own[-1].own_order() < w.own_order():  # behind its owner's others
            w.turn = (own[-1].turn + own[-1].weight) if own else self._next[w.owner]
            own.append(w)
            bisect.insort(self._waiters, w)
            return
        bisect.insort(own, w, key=_Waiter.own_order)  # ahead of some: theirs move back
        self._waiters.append(w)
        self._number(w.owner)

    def _drop(self, w: _Waiter, granted: bool = False) -> None:
        """`w` off the list; a turn it gave up is given back to its owner's others (a
        granted one, its owner's first, took its turn: theirs stay)."""
        self._waiters.remove(w)
        own = self._owned[w.owner]
        last = own[-1] is w
        own.remove(w)
        if not own:
            del self._owned[w.owner]
            del self._arrived[w.owner]
        elif not last and not granted:
            self._number(w.owner)

    def _number(self, owner: str) -> None:
        """An owner's turns, in its own order from its next one; the list re-sorted."""
        turn = self._next[owner]
        for x in self._owned[owner]:
            x.turn = turn
            turn += x.weight
        self._waiters.sort()

    def _forget(self) -> None:
        if len(self._next) > max(self._forget_at, 2 * len(self._waiters) + 64):
            # Owners served up, forgotten; next once it has doubled: owners served one
            # after another, each a turn ahead of the one served, stay (their next turn
            # still counts), so where there were more than twice as many as waiters a
            # pass ran on every request, O(owners) where the gate is busiest.
            self._next = {o: t for o, t in self._next.items()
                          if t > self._turn or o in self._owned}
            self._forget_at = 2 * len(self._next)

    def _grant(self) -> None:
        """Permits to the first waiters, in order, while there are enough for the first."""
        while self._waiters:
            w = self._waiters[0]
            if w.future.done():  # shed or given up in this instant
                self._drop(w)
                continue
            if self.in_use + w.weight > self.max_concurrent:
                return
            self._drop(w, granted=True)
            self.in_use += w.weight
            self._turn = max(self._turn, w.turn)
            self._next[w.owner] = w.turn + w.weight
            w.future.set_result(None)
