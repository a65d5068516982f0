"""Background responses (`background: true`): runs detached from their request.

A run is a task of its own, tracked for the drain as a request is (a shutdown waits for
it, then cuts it: its record then says `failed`, not `in_progress` until it expires),
and at most `responses.background.max_runs` run at once in a process (one more is a
503 for a tenant running an even share of them or more; another tenant's still starts,
up to twice as many). Its record is stored `queued` as its id goes out, `in_progress` with its first
output, and its end after; what the chain decided (a 429, the sanitizer's refusal) is
its `failed` record. A client leaving does not touch it: only a cancel does.

Its events are kept in memory, at most `max_event_bytes` a run (the oldest go first),
for its creator's stream and for `GET /v1/responses/{id}?stream=true&starting_after=N`
on this replica, and the last `keep_finished` ended runs' too. Another replica holds no
events of it (a 400 there while it runs; once it has ended, its record told as events:
`replay`).

A `queued`/`in_progress` record carries a lease its run renews every `poll_s`: one
whose lease lapsed (its replica died, or paused) is read, and stored, as `failed`. A
lease is set and judged by the store's clock (`RecordStore.now`: Redis's, shared by
every replica), never a replica's own: replicas' clocks apart by most of a lease read
a healthy run as lapsed. A cancel sent to another replica (records in Redis) leaves a
flag beside the record that the run's replica reads every `poll_s`, and tells it at
once (Redis pub/sub, which keeps nothing: the flag is for a replica that did not hear
it), which tells the cancel's replica once it has stored the run's end; if the record
has not ended within two polls (that replica paused), the cancel stores it `cancelled`
itself.

Each of a run's writes is fenced (`record_store.fenced`): stored only over its own
record. A record settled without its run (those two) or deleted is not overwritten by
the run's later writes (a lease renewal, its end), and the run stops at its next.
"""

from __future__ import annotations

import asyncio
import copy
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ..app_state import AppState
from ..auth import account
from ..chain import Completion, Reply, Stream
from ..errors import InvalidRequest, RecordTooLarge, ServerError, Unavailable, WeirError
from ..ids import new_hex
from ..record_store import Record, RecordStore, RedisStore, fence_of, fenced
from ..settings import BackgroundSettings
from ..streaming import dumps
from ..tasks import RECANCEL_MAX_S, RECANCEL_S, background, cancel_and_wait, detach
from ..telemetry import error_fields, get_logger
from .events import OnDone, Rendering

log = get_logger("weir.responses")

#: Active statuses: the record's run has not ended.
RUNNING = ("queued", "in_progress")
#: What a record whose run's replica stopped renewing its lease says it ended with.
LAPSED = {"code": "server_error",
          "message": "The server running this background response stopped before it "
                     "ended; create it again."}
SHUT_DOWN = {"code": "server_error",
             "message": "The server shut down before this background response ended; "
                        "create it again."}
Key = tuple[str, str]


def leased(record: Record, lease_s: float, fence: str, now: float) -> Record:
    """`record` with a lease of `lease_s` from `now` (the store's clock, `RecordStore.now`;
    its run renews it), fenced by its run's `fence`."""
    return fenced(record, fence, lease_until=now + lease_s)


def leasing(record: Record) -> bool:
    """Whether `record` is `queued`/`in_progress` under a lease (whose reading needs the
    store's clock)."""
    run = record.get("run")
    return (record["response"].get("status") in RUNNING and isinstance(run, dict)
            and isinstance(run.get("lease_until"), int | float))


def lapsed(record: Record, now: float) -> dict[str, Any] | None:
    """The response a `queued`/`in_progress` record whose lease lapsed by `now` (the
    store's clock: its replica died or paused before the run ended) ended as: `failed`;
    None for any other."""
    if leasing(record) and record["run"]["lease_until"] < now:
        return {**record["response"], "status": "failed", "error": dict(LAPSED)}
    return None


def as_read(record: Record, now: float) -> Record:
    """The record as a read at `now` (the store's clock) should show it: one whose lease
    lapsed, `failed`."""
    response = lapsed(record, now)
    return record if response is None else {**record, "response": response}


async def settle(store: RecordStore, tenant: str, rid: str, record: Record,
                 response: dict[str, Any]) -> Record | None:
    """`record`, whose run has not stored its end, ended as `response` (cancelled from
    a replica that does not run it, or failed past its lease), stored fenced by its
    run's fence: its run's later writes are not stored over it. Where the record held is
    no longer that run's (it stored its end meanwhile, or it was deleted), that record
    (None: none). A record stored before runs fenced their writes (a replica of an
    earlier version, which writes unfenced) has no fence: stored over as such writes
    were (it stayed `queued`/`in_progress`, a cancel answered so)."""
    ended = {**{k: v for k, v in record.items() if k != "run"}, "response": response}
    if await store.replace(tenant, rid, ended, fence=fence_of(record)):  # (None: unfenced)
        return ended
    return await store.get(tenant, rid)


class Run:
    """One background response: its events so far (bounded), followed by its streams."""

    def __init__(self, tenant: str, rid: str, max_bytes: int) -> None:
        self.key: Key = (tenant, rid)
        self.tenant, self.rid = tenant, rid
        #: What its writes are fenced by (`record_store.fenced`).
        self.fence = new_hex()
        #: Its events held, with their sizes: those from `_head` on (the ones before
        #: it were dropped, and go once they are half of the list).
        self._events: list[tuple[dict[str, Any], int]] = []
        self._head = 0
        self._bytes, self._max_bytes = 0, max_bytes
        self._next = 0  # the sequence number the next event will have
        self._wake = asyncio.Event()
        self.ended = False
        self.started = False
        self.cancelled = False  # by a client (else a cancellation is the shutdown's)
        self.shutdown = False  # the server closes: not to start
        self.task: asyncio.Future[None] | None = None
        #: Done once it is started (`task` set) or given back (`Runner.drop`).
        self.placed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        #: The record last put while it runs (`queued`, `in_progress`): what a lease
        #: renewal puts again; None once its end is being stored.
        self.record: Record | None = None
        self.renewing: asyncio.Future[Any] | None = None

    def add(self, event: dict[str, Any]) -> None:
        size = len(dumps(event))
        self._events.append((event, size))
        self._bytes += size
        self._next = event["sequence_number"] + 1
        while self._bytes > self._max_bytes and len(self._events) - self._head > 1:
            self._bytes -= self._events[self._head][1]
            self._head += 1
        if self._head > len(self._events) // 2:
            del self._events[:self._head]
            self._head = 0
        self._signal()

    def end(self) -> None:
        self.ended = True
        self._signal()

    def _signal(self) -> None:
        self._wake.set()
        self._wake = asyncio.Event()

    @property
    def held_from(self) -> int:
        """The sequence number of the oldest event still held (numbers run on, one by
        one, from it to the newest)."""
        return self._next - (len(self._events) - self._head)

    def check(self, after: int) -> None:
        """A 400 where events numbered past `after` are no longer held, or where `after`
        numbers no event it sent (past its last: a stream of nothing, 200, that ended
        at once or waited to the run's end)."""
        if after >= self._next:
            raise InvalidRequest(
                f"This response has no event numbered {after}: its last so far is "
                f"{self._next - 1}.", param="starting_after", code="invalid_value")
        if (first := self.held_from) > after + 1:
            raise InvalidRequest(
                f"The events of this response before sequence number {first} are no "
                f"longer held; resume from `starting_after={first - 1}` or later.",
                param="starting_after", code="invalid_value")

    async def follow(self, after: int) -> AsyncIterator[dict[str, Any]]:
        """Its events numbered past `after` (-1: all), as they come, until it ends."""
        want = after + 1
        while True:
            wake = self._wake
            self.check(want - 1)
            while want < self._next:  # (a yield may let events in, or drop some)
                self.check(want - 1)
                event = self._events[self._head + want - self.held_from][0]
                want += 1
                yield event
            if self.ended:
                return
            await wake.wait()


Work = Callable[[Run], Awaitable[None]]


class Runner:
    """This process's background runs: started, bounded, cancelled, kept a while."""

    def __init__(self, st: AppState, cfg: BackgroundSettings, store: RecordStore,
                 flags: RecordStore | None) -> None:
        self.st, self.cfg, self.store, self.flags = st, cfg, store, flags
        self.runs: dict[Key, Run] = {}
        self._ended: OrderedDict[Key, Run] = OrderedDict()
        self._watch: asyncio.Task[None] | None = None
        self._closing = False
        #: What other replicas tell (`RedisStore.told`), heard while records are shared.
        self._listener: asyncio.Task[None] | None = None
        #: place -> the cancels here waiting for the end of a run elsewhere (`ending`).
        self._ending: dict[str, set[asyncio.Future[None]]] = {}

    def listen(self) -> None:
        """Hear cancels sent to other replicas, and the ends of the runs cancelled from
        here, as they are told (where records are shared: a Redis store)."""
        if isinstance(self.flags, RedisStore) and self._listener is None:
            self._listener = asyncio.ensure_future(self._listening(self.flags))

    async def _listening(self, news: RedisStore) -> None:
        async def heard(what: str, place: str) -> None:
            try:
                if what == "cancel":
                    for run in list(self.runs.values()):
                        if (not run.cancelled and not run.ended and run.task is not None
                                and news.place(run.tenant, run.rid) == place):
                            log.info("background response cancelled", response_id=run.rid)
                            detach(self._cancel(run))
                elif what == "ended":
                    for waiter in self._ending.get(place, ()):
                        if not waiter.done():
                            waiter.set_result(None)
            except Exception as e:  # a bug: logged, the listener goes on
                log.error("background news not handled", **error_fields(e))

        await news.hear(heard)

    @contextmanager
    def ending(self, tenant: str, rid: str) -> Iterator[asyncio.Future[None]]:
        """Done once the replica running `rid` tells it has stored its run's end (a
        cancel's, `_main`); never where records are not shared, or it is not heard."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if not isinstance(self.flags, RedisStore):
            yield waiter
            return
        place = self.flags.place(tenant, rid)
        self._ending.setdefault(place, set()).add(waiter)
        try:
            yield waiter
        finally:
            waiters = self._ending[place]
            waiters.discard(waiter)
            if not waiters:
                del self._ending[place]

    def open(self, tenant: str, rid: str) -> Run:
        """A place for a new run (given back with `drop` if it never starts), or a 503
        when `max_runs` run already and its tenant (account) runs an even share of them
        or more; another tenant's still starts, up to twice `max_runs` (one tenant
        starting `max_runs` runs refused every other tenant's for as long as they ran)."""
        total = len(self.runs)
        if total >= self.cfg.max_runs:
            held = Counter(account(t) for t, _ in self.runs)
            if held[account(tenant)] * len(held) >= total or total >= 2 * self.cfg.max_runs:
                raise self._full()
        run = self.runs[(tenant, rid)] = Run(tenant, rid, self.cfg.max_event_bytes)
        run.shutdown = self._closing
        return run

    def _full(self) -> Unavailable:
        return Unavailable(
            f"This server runs {self.cfg.max_runs} background responses already; "
            "retry shortly.", code="background_capacity", retry_after=1)

    def drop(self, run: Run) -> None:
        self.runs.pop(run.key, None)
        if not run.placed.done():
            run.placed.set_result(None)

    def start(self, run: Run, work: Work) -> None:
        run.task = detach(self._main(run, work))
        if not run.placed.done():
            run.placed.set_result(None)
        if not self._closing and (self._watch is None or self._watch.done()):
            self._watch = background(self._watching())  # (no request's: it outlives them)

    async def _main(self, run: Run, work: Work) -> None:
        run.started = True
        try:
            with self.st.track(None):  # the drain waits for it; its end cuts it
                await work(run)
        except asyncio.CancelledError:
            pass  # (its work stored how it ended)
        except Exception as e:  # a bug: its work stores failures itself
            log.error("background response failed", response_id=run.rid, **error_fields(e))
        finally:
            run.end()
            self.runs.pop(run.key, None)
            self._ended[run.key] = run
            while len(self._ended) > self.cfg.keep_finished:
                self._ended.popitem(last=False)
            if self.flags is not None and run.cancelled:  # (its flag, if a cancel's)
                await self.unflag(run.tenant, run.rid)
                if isinstance(self.flags, RedisStore):  # (a cancel elsewhere waits for it)
                    try:
                        await self.flags.tell("ended", run.tenant, run.rid)
                    except Unavailable:  # (that cancel reads the record within its time)
                        log.warning("cancelled response's end not told", response_id=run.rid)

    def find(self, tenant: str, rid: str) -> Run | None:
        """The run of `rid` on this replica, running or ended a short while ago."""
        return self.runs.get((tenant, rid)) or self._ended.get((tenant, rid))

    async def cancel(self, tenant: str, rid: str) -> bool:
        """Cancel the run of `rid` if it runs here (False: it does not); returns once it
        has ended, its record stored."""
        run = self.runs.get((tenant, rid))
        if run is None or run.task is None:
            return False
        await self._cancel(run)
        return True

    @staticmethod
    async def _cancel(run: Run) -> None:
        run.cancelled = True
        assert run.task is not None
        if run.started:
            await cancel_and_wait(run.task)
        else:  # (a task cancelled before its first step runs none of it: it sees
            await asyncio.wait((run.task,))  # `cancelled` as it starts)

    def settled_elsewhere(self, run: Run) -> None:
        """`run`'s record is no longer its own (settled without it, or deleted: a fenced
        write found so): it stops, its end not stored (a cancel's end)."""
        if not run.cancelled:
            log.info("background response settled elsewhere; its run stops",
                     response_id=run.rid)
            run.cancelled = True
            if run.task is not None and run.task is not asyncio.current_task():
                detach(self._cancel(run))

    async def flag_cancel(self, tenant: str, rid: str) -> bool:
        """Ask the replica running `rid` to cancel it (a flag beside its record, read
        every `poll_s`, and told at once); False where records are not shared (no other
        replica)."""
        if self.flags is None:
            return False
        await self.flags.put(tenant, rid, {"cancel": True})
        if isinstance(self.flags, RedisStore):
            try:
                await self.flags.tell("cancel", tenant, rid)
            except Unavailable:  # (the flag is read at its next poll)
                log.warning("cancel not told", response_id=rid)
        return True

    async def unflag(self, tenant: str, rid: str) -> None:
        """Drop the flag of a cancel answered (the run ended, or was settled without
        it): one left after its run's replica dropped it (the run ended as it was
        flagged, two cancels at once) stayed a day for a run that was no more."""
        if self.flags is None:
            return
        try:
            await self.flags.delete(tenant, rid)
        except Exception:  # (it expires)
            log.warning("cancel flag not dropped", response_id=rid)

    async def renewed(self, run: Run) -> None:
        """Wait for a lease renewal under way (the end's record goes after it)."""
        if run.renewing is not None:
            await asyncio.wait((run.renewing,))

    async def _watching(self) -> None:
        """Every `poll_s`: the flags of cancels sent to other replicas, and the leases."""
        renew_every = self.cfg.lease_s / 3
        while self.runs:
            await asyncio.sleep(self.cfg.poll_s)
            now: float | None = None  # (the store's clock, read once a poll if needed)
            watched = [run for run in list(self.runs.values())
                       if not run.cancelled and not run.ended]
            for i, run in enumerate(watched):
                if run.cancelled or run.ended:
                    continue
                try:
                    if self.flags is not None and await self.flags.get(run.tenant, run.rid):
                        log.info("background response cancelled", response_id=run.rid)
                        detach(self._cancel(run))
                        continue
                    if run.record is None or run.ended:
                        continue
                    if now is None:
                        now = await self.store.now()
                    lease = run.record.get("run") or {}
                    if lease.get("lease_until", 0) - now < self.cfg.lease_s - renew_every:
                        held = run.record
                        run.record = leased(held, self.cfg.lease_s, run.fence, now)
                        renewal = run.record
                        run.renewing = detach(self.store.replace(
                            run.tenant, run.rid, copy.copy(run.record), fence=run.fence))
                        await asyncio.wait((run.renewing,))
                        if (failed := run.renewing.exception()) is not None:
                            # Not renewed: tried again at the next poll (its lease
                            # renewed in memory alone, the next try came a third of the
                            # lease later, and two failed let the stored one lapse).
                            if run.record is renewal:  # (unless its run put another)
                                run.record = held
                            raise failed  # (logged below, as the watch's others)
                        if not run.renewing.result():
                            self.settled_elsewhere(run)
                except Unavailable as e:
                    # The store is down: every other run's call would fail alike (one
                    # line a poll, not one a run through an outage); till the next poll.
                    log.warning("background response not watched", response_id=run.rid,
                                reason=e.code, skipped=len(watched) - i - 1)
                    break
                except RecordTooLarge as e:
                    log.warning("background response not watched", response_id=run.rid,
                                reason=e.code)
                except Exception as e:  # a bug: logged, the other runs still watched
                    log.error("background response not watched", response_id=run.rid,
                              **error_fields(e))

    async def close(self, grace: float) -> None:
        """Cancel what still runs (a shutdown: their records say `failed`) and wait, at
        most `grace` seconds, for their records to be stored (with no time to wait, 0,
        cancelled all the same: they ran on through the rest of the shutdown). A run is
        cancelled again until it has ended (a cancellation can be lost, as `proxy.tasks`
        says, or taken by a step that shields itself): cancelled once, one that ran on
        was left, its record `in_progress` until its lease lapsed. (A run ends once its
        end is stored: `respond` holds its final save through a cancellation.) A run opened
        but not started (its create still storing its `queued` record) is waited for
        to start (or be given back), then cut as the others: it was left, started after
        the close, and its record stayed `queued` until its lease lapsed."""
        self._closing = True  # (a run opened from now on is not to start either)
        runs = list(self.runs.values())
        for run in runs:
            run.shutdown = True  # (one not started yet starts, sees it, and ends)
        loop = asyncio.get_running_loop()
        until, wait = loop.time() + grace, RECANCEL_S
        opening = [run.placed for run in runs if not run.placed.done()]
        if opening:
            await asyncio.wait(opening, timeout=grace)
        pending = {run.task: run for run in runs if run.task is not None}
        cut = False
        while pending and (left := until - loop.time()) > 0:
            cut = True
            for task, run in pending.items():
                if run.started:  # (a task cancelled before its first step runs none
                    task.cancel()  # of it: it would store nothing)
            done, _ = await asyncio.wait(pending, timeout=min(wait, left))
            for task in done:
                del pending[task]
            wait = min(wait * 2, RECANCEL_MAX_S)
        if not cut:  # no time left to wait (the shutdown's deadline is near): cut, once
            for task, run in pending.items():
                if run.started:
                    task.cancel()
        for run in [*pending.values(), *(r for r in runs if r.task is None
                                          and r.key in self.runs)]:
            log.warning("background response not stored as ended at shutdown",
                        response_id=run.rid)
        await cancel_and_wait(self._watch, self._listener)


async def respond(run: Run, runner: Runner, rendering: Rendering,
                  chained: Callable[[], Awaitable[Reply]], save: OnDone,
                  on_start: OnDone) -> None:
    """A background run's work: the chain's answer (`chained`: the chain called, the
    request as the sanitizer passed it set in `rendering`) rendered as events into
    `run`, the response stored as it starts (`on_start`) and as it ends (`save`). Cut
    by a cancel, it is stored `cancelled`; by the shutdown, `failed`."""

    async def end(response: dict[str, Any]) -> None:
        if response["status"] == "cancelled" and not run.cancelled:
            response["status"], response["error"] = "failed", dict(SHUT_DOWN)
            for event in rendering.failed_as(response):  # (its streams end as it does)
                run.add(event)
        elif response["status"] == "cancelled":
            for event in rendering.cancelled_as(response):
                run.add(event)
        run.record = None  # (no lease renewal after this)
        await runner.renewed(run)
        await save(response)

    try:
        if run.cancelled or run.shutdown:  # (before it started)
            raise asyncio.CancelledError
        try:
            reply = await chained()
            stream = _as_stream(reply) if isinstance(reply, Completion) else reply
            async for event in rendering.events(stream, end, on_start):
                run.add(event)
        except Exception as exc:
            if rendering.finished or rendering.saving is not None:
                raise  # (its end is stored, or being stored)
            # Before any output: what the chain refused (a 429, the sanitizer's 400) is
            # its failed record; a bug is logged, and a generic failure (not `queued`
            # until its lease lapsed, then said to be a server gone).
            err = exc if isinstance(exc, WeirError) else ServerError()
            if err is not exc:
                log.error("background response failed", response_id=run.rid,
                          **error_fields(exc))
            for event in await rendering.fail(err, end):
                run.add(event)
    except asyncio.CancelledError:
        if not rendering.finished:
            # Held through a cancellation (a shutdown's second): the run ends once its
            # end is stored, which its store's own timeout bounds (a run that ended
            # before left the shutdown closing the store under its last write).
            saving = rendering.saving or detach(end(rendering.cut()))
            while not saving.done():
                try:
                    await asyncio.shield(saving)
                except asyncio.CancelledError:
                    continue
            # An end of its own decided before the cut (a failure, a whole answer: its
            # record stored, its terminal event not yet out): its streams end with it.
            for event in rendering.owed():
                run.add(event)
        raise


def _as_stream(reply: Completion) -> Stream:
    """A whole chat answer (the chain answered a stream whole) as its one chunk."""
    body = reply.body
    choices = [{"index": c.get("index", 0), "finish_reason": c.get("finish_reason"),
                "delta": c.get("message") or {}} for c in body.get("choices") or []]

    async def chunks() -> AsyncIterator[dict[str, Any]]:
        yield {**body, "object": "chat.completion.chunk", "choices": choices}

    return Stream(chunks(), reply.headers, whole=True)
