"""Admission: bounds what the engine holds and sheds load at once when it cannot wait.

A request takes a permit before it reaches the engine and gives it back when its answer
ends (a stream: when the last chunk is sent or the client goes away). Without a free
permit it waits in a bounded queue where tenants take turns and each tenant's own
requests go by their role's priority (see `queue.py`); a full queue means an immediate
503 `overloaded` with Retry-After, not a timeout later. A waiter that outlives
`max_queue_wait_s` gets 503 `queue_timeout`.

A long prompt that the in-process engine prepares (renders and tokenizes) in its one
preparing thread is prepared before it takes its place in the queue (`Terminal.prepare`),
unless the queue is full: waiting for that thread behind other long prompts, it held a
permit the engine could have given a short request.

Embeddings run on the embedding model, beside the engine: they take permits of a gate of
their own (as many, with as long a queue), so a burst of them never holds the engine's
permits while it stands idle, nor the other way round.

Deadlines: `deadline_s` by default, shortened by the `x-weir-timeout-ms` header. A
request past its deadline is cut (its generation aborted) and answered 504 `timeout`,
in-band if bytes were already sent.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar, Literal

from prometheus_client import Counter, Gauge, Histogram

from proxy.auth import account
from proxy.chain import BasePlugin, Next, Reply, Services, Stream
from proxy.context import RequestContext, Within, asked_limit
from proxy.errors import DeadlineExceeded, Unavailable
from proxy.telemetry import OutageLog, get_logger

from .config import AdmissionConfig
from .queue import PriorityGate, Shed

log = get_logger("weir.admission")


class AdmissionPlugin(BasePlugin[AdmissionConfig]):
    name: ClassVar[str] = "admission"
    serves: ClassVar[frozenset[str]] = frozenset({"chat", "completion", "embeddings"})
    Config = AdmissionConfig
    placement: ClassVar[Literal["first", "any", "last"]] = "last"

    def __init__(self, config: AdmissionConfig, services: Services) -> None:
        super().__init__(config, services)
        self.cfg = config
        self.gate = PriorityGate(config.max_concurrent, config.max_queue,
                                 config.priority_passes)
        self.embed_gate = PriorityGate(config.max_concurrent, config.max_queue,
                                       config.priority_passes)
        reg = services.metrics.registry
        self.depth = Gauge("weir_admission_queue_depth", "Requests waiting.", registry=reg)
        self.in_engine = Gauge("weir_admission_in_engine",
                               "Permits held: sequences in the engine (n per prompt).",
                               registry=reg)
        # Both read at each scrape, as they stand then: set at each of a request's
        # transitions (queued, admitted or shed, released), they cost four updates per
        # request and lagged a step behind a waiter granted by another's release.
        self.depth.set_function(self._waiting)
        self.in_engine.set_function(lambda: self.gate.in_use)
        self.wait = Histogram("weir_admission_queue_wait_seconds",
                              "Time queued for a permit, whatever ended the wait.",
                              registry=reg, buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5,
                                                     5, 10, 30))
        self.shed = Counter("weir_admission_shed_total", "Requests shed.", ["reason"],
                            registry=reg)
        for reason in ("full", "wait"):  # (a series at 0 before the first: rate() reads 0)
            self.shed.labels(reason)
        self.timeouts = Counter("weir_admission_deadline_exceeded_total",
                                "Requests cut at their deadline.", registry=reg)
        self._sheds = OutageLog(every_s=5.0)
        self._ahead = 0  # requests preparing before they queue (`Terminal.prepare`)

    def health(self) -> dict[str, Any]:
        return {"in_engine": self.gate.in_use, "waiting": self.gate.waiting,
                "embeddings": {"in_use": self.embed_gate.in_use,
                               "waiting": self.embed_gate.waiting}}

    def _waiting(self) -> int:
        return self.gate.waiting + self.embed_gate.waiting

    def enter(self, ctx: RequestContext) -> None:
        self._deadline(ctx)  # known from the chain's start: a plugin ahead may wait
        ctx.deadline_cut = self.timeouts.inc  # (one that waits, cut there, counts too)

    def _deadline(self, ctx: RequestContext) -> None:
        """`deadline_s`, shortened by the header; applied again it changes nothing."""
        name = self.cfg.deadline_header
        limit = asked_limit(ctx.headers.get(name), self.cfg.deadline_s, name)
        if limit is not None:
            deadline = ctx.started + limit
            ctx.deadline = deadline if ctx.deadline is None else min(ctx.deadline, deadline)

    def _overloaded(self, reason: str, message: str) -> Unavailable:
        self.shed.labels(reason).inc()
        if self._sheds.down():  # one line per burst, not one per shed request
            log.warning("shedding load", reason=reason, in_engine=self.gate.in_use,
                        waiting=self.gate.waiting)
        return Unavailable(message, code="overloaded" if reason == "full" else "queue_timeout",
                           retry_after=self.cfg.retry_after_s)

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        if ctx.deadline_cut is None:  # (no `enter` ran: a chain built without hooks)
            self._deadline(ctx)
        # Embeddings run beside the engine, in one batch per request: one permit of their
        # own gate. (A greedy request's `n` choices are one sequence in the engine.)
        embeds = ctx.route == "embeddings"
        if (not embeds and self.gate.waiting + self._ahead < self.gate.max_queue
                and self.services.terminal.prepares_ahead(ctx)):
            # A long prompt prepared first (in the engine's one preparing thread): waiting
            # there behind others, it held a permit the engine could have given a short
            # request. Within the request's deadline, as its call is. Not where the wait
            # list is full: a newcomer is likely shed at once, its preparing wasted on
            # the thread others wait for (one that is not is prepared by its call). Those
            # preparing count against the list's bound: else a burst of long prompts all
            # waited for the thread, none shed. A short prompt has nothing to prepare
            # ahead: no call, no deadline scope (a loop timer) for it.
            scope = Within(ctx.deadline)
            self._ahead += 1
            try:
                async with scope:
                    await self.services.terminal.prepare(ctx)
            finally:
                self._ahead -= 1
                if scope.expired():
                    self.timeouts.inc()
        priority = self.cfg.priorities.get(ctx.principal.role, self.cfg.default_priority)
        remaining = ctx.remaining()
        wait = self.cfg.max_queue_wait_s if remaining is None else min(
            self.cfg.max_queue_wait_s, max(remaining, 0.0))
        gate = self.embed_gate if embeds else self.gate
        weight = 1 if embeds else gate.weight(ctx.request.engine_sequences)
        start = time.monotonic()
        ctx.waiting()  # (queued for a slot: what the plugins ahead decided is known)
        # Every wait is observed, whatever ended it (a permit, the wait's bound, the
        # request's deadline, its client leaving, a better request taking its place):
        # only those granted were, so the waits that ran out never showed.
        waited, admitted = True, False
        try:
            await gate.acquire(priority, wait, weight, account(ctx.principal.tenant))
            admitted = True
        except Shed as e:
            waited = e.queued  # (shed at once: it never waited)
            raise self._overloaded("full", "The server is overloaded; retry shortly.") from None
        except TimeoutError:
            # The request's own deadline bounded the wait: its deadline passed (asked by
            # the wait's length, not the clock after it: a timer may fire a clock tick
            # early, and a request cut by its own deadline is no shed load).
            if remaining is not None and remaining <= self.cfg.max_queue_wait_s:
                self.timeouts.inc()
                raise DeadlineExceeded("The request did not start before its deadline.") from None
            raise self._overloaded("wait", "No engine slot became free in time.") from None
        finally:
            if waited:
                self.wait.observe(time.monotonic() - start)
            if not admitted:  # (what was prepared ahead is held no longer: a breaker's
                ctx.prepared = None  # fallback may answer it at length, holding `ctx`)
        # One deadline scope, around the call only: a stream's first chunk arrives inside
        # it (the terminal primes streams); the rest of a stream runs under its consumer's
        # single deadline scope (Stream.deadline).
        scope = Within(ctx.deadline)
        try:
            async with scope:
                reply = await call_next(ctx)
        except BaseException:
            self._release(gate, weight)
            if scope.expired():  # (not a DeadlineExceeded of the terminal's: an upstream's
                self.timeouts.inc()  # only-if-cached miss, or its own time limit)
            raise
        if not isinstance(reply, Stream):
            self._release(gate, weight)
            return reply
        if ctx.deadline is not None:
            reply.deadline = (ctx.deadline if reply.deadline is None
                              else min(reply.deadline, ctx.deadline))
        reply.on_end(lambda stream, outcome: self._stream_ended(stream, weight))
        return reply

    def _release(self, gate: PriorityGate, weight: int) -> None:
        gate.release(weight)

    def _stream_ended(self, stream: Stream, weight: int) -> None:
        self._release(self.gate, weight)  # (embeddings never stream)
        if type(stream.error) is DeadlineExceeded:  # (the request's own: not a subclass's,
            self.timeouts.inc()  # an upstream's time limit or only-if-cached miss)

