"""The cache store: where entries live, with no say in which requests may use them.

L1 (in process) and Redis (L2, shared) for exact answers, the semantic index (this
replica's vectors, mirrored in Redis), the per-user caps, the replica events that keep
other replicas' memory in step, and purges. The plugin decides, coalesces and
captures; the admin API reads and purges through `stats` and `purge`.

Public API: `get` (exact, stale allowed on request), `question_gate`, `may_serve` and
`lookup` (semantic), `put`, `promote`, `purge(filter)`, `purge_local(match)`, `stats(match)`,
`purged_since`, `drain`, `wake`. A put lands in L1 at once; Redis, the vector index and
the user's cap are written in the background, so a miss pays nothing for them.

Lazy vectors (`semantic.lazy`, with the guard on): a question whose guard gate (guard.py)
no stored question shares cannot hit, so its lookup embeds nothing (`may_serve`), and the
answer it generates waits unembedded ("pending") until a lookup could use it (a question
of the same gate: that lookup embeds it along with its own question) or until the
gateway is idle (`idle`, `wake`: the plugin says when no request is in flight), then
goes to the index and Redis like any other. Under load, questions that carry an order
number, a name or an instruction nobody else asks thus cost no embedding at all; the
exact entry goes to L1 and Redis at once either way.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np
import orjson

from proxy.auth import account
from proxy.embedding import Embedder
from proxy.tally import Tally
from proxy.tasks import background, cancel_and_wait
from proxy.telemetry import get_logger, labelled

from .config import CacheConfig
from .entry import Entry, Match, matcher, text_bytes
from .l1 import L1
from .metrics import CacheMetrics
from .redis_store import RedisStore
from .semantic import DIGEST_MARK, SemanticIndex, entry_bytes, gate, guard_ok
from .users import UserIndex, exact_member, semantic_member, split_members

log = get_logger("weir.cache")
#: (partition, question): where a question's vector goes and what the guard compares.
SemanticKey = tuple[str, str]
#: A semantic lookup under way: (the question's vector, the entry answering it).
Lookup = asyncio.Future[tuple[np.ndarray | None, Entry | None]]
#: A question's vector, or the lookup that computes it.
Vec = np.ndarray | Lookup
#: Answers waiting for their question's vector, at most (past it, the oldest of the
#: tenant with the most waiting is dropped: it stays an exact entry only; one tenant's
#: burst of answers under load does not push out another's).
MAX_PENDING = 10_000
#: Pending questions embedded per forward pass while idle (a pass is a few ms per text:
#: a request arriving meanwhile waits at most one pass).
IDLE_BATCH = 4
#: Members named per purge or drop event (a message stays well under Redis's pub/sub
#: output buffer limit, and under the store's per-call timeout, whatever a purge matched).
PUBLISH_CHUNK = 2000
#: Purges remembered for the answers generated across them (`purged_since`); past it,
#: the oldest one's time holds for everything (as if it reached every entry).
MAX_PURGES_KEPT = 256
#: Pending questions of its gate a lookup embeds with its own, at most (the newest).
LOOKUP_BATCH = 16
#: Purge filters whose names Redis did not take, kept for the next purge to retry (one
#: Redis scan each when it does), at most: past it the oldest is dropped (its purge was
#: answered 503: retried by its caller, it scans again).
OWED_MAX = 16


#: The events replicas send each other (`weir_cache_events_total`'s `op`).
_EVENT_OPS = frozenset({"add", "purge", "drop", "resync"})


@dataclass(slots=True, eq=False)
class _Pending:
    """A stored answer whose question is not embedded yet."""

    partition: str
    gate: str
    entry: Entry
    question: str
    vec: asyncio.Future[np.ndarray | None]
    size: int = 0  # `entry_bytes`: what it holds
    embedding: bool = False  # a pass has it


def _uncounted(layer: str, result: str) -> None:
    """A lookup `weir_cache_lookups_total` does not count (see `CacheStore.get`)."""


class CacheStore:
    def __init__(self, cfg: CacheConfig, metrics: CacheMetrics,
                 embedder: Embedder | None) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.embedder = embedder
        self._semantic = embedder is not None and cfg.semantic.enabled
        self.replica = uuid.uuid4().hex[:12]
        self.users = UserIndex()
        self.l1 = (L1(cfg.exact.max_bytes, lambda key: self.users.discard(exact_member(key)),
                      _owner, cfg.exact.max_bytes_per_tenant)
                   if cfg.exact.enabled else None)
        self.index = SemanticIndex(
            embedder.dim if embedder is not None else 384,
            cfg.semantic.max_entries_per_scope, cfg.semantic.max_partitions,
            lambda part, eid: self.users.discard(semantic_member(part, eid)),
            cfg.semantic.max_partitions_per_tenant, cfg.semantic.max_bytes)
        self.redis = (RedisStore(cfg.redis, metrics.store_errors, self.replica,
                                 shared_keys=cfg.scope == "global")
                      if cfg.redis.url else None)
        self._background: set[asyncio.Task[Any]] = set()
        #: Recent purges, oldest first: (when, whom it reached). An answer generated
        #: across one that would have matched it is not stored; another tenant's purge
        #: does not stop this one's answers. Past the bound, the oldest one's time is
        #: the floor before which every answer counts as purged.
        self._purges: deque[tuple[float, Match]] = deque()
        self._purge_floor = 0.0
        #: Names a purge matched that Redis (or the event to the others) did not take,
        #: by that purge's filter: the next purge tries them again (this replica no
        #: longer holds their prompts), each under its own filter, as its own purge: the
        #: other replicas drop only what that filter's owner fields own, and another
        #: tenant's purge counts none of them.
        self._owed: dict[str, tuple[dict[str, Any], list[str], list[tuple[str, str]]]] = {}
        #: Held by a purge's Redis part: one purge at a time retries what is owed (a
        #: purge finding its own names taken by another's retry answered 200 before
        #: that retry ended, and had it failed, owed them to no caller waiting).
        self._purging = asyncio.Lock()
        self.lazy = embedder is not None and cfg.semantic.lazy and cfg.semantic.guard
        #: Whether the gateway is idle (no request in flight): set by the plugin.
        self.idle: Callable[[], bool] = lambda: True
        self._pending: OrderedDict[tuple[str, str], _Pending] = OrderedDict()  # oldest first
        #: the same keys by owner (`_owner`), oldest first: whose the bound drops
        self._pending_of: dict[str, OrderedDict[tuple[str, str], None]] = {}
        self._pending_counts = Tally()  # owner -> how many of its answers wait
        #: what they hold (`entry_bytes`), by owner, and in all: at most
        #: `semantic.max_bytes` (10,000 long answers were hundreds of MB beside the
        #: index's own bound)
        self._pending_bytes = Tally()
        self._gated: dict[tuple[str, str], dict[str, _Pending]] = {}  # (partition, gate)
        self._flushing = 0
        #: Answers stored with no vector at hand (`lazy` off) whose question is being
        #: embedded, by owner: past MAX_PENDING, a tenant holding an even share or more
        #: keeps its next ones exact only (under load each waited, answer and question
        #: held, for an embedding queued behind all the others, without bound).
        self._unembedded: dict[str, int] = {}
        self._unembedded_total = 0
        self._wake = asyncio.Event()
        self._embedder_task: asyncio.Task[None] | None = None

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        if self.redis is not None:
            await self.redis.start(self._on_event)
            if self.embedder is not None:
                await self._load_semantic()

    async def close(self) -> None:
        await cancel_and_wait(self._embedder_task, *self._background)
        for p in list(self._pending.values()):
            self._settle(p, None)
        if self.redis is not None:
            await self.redis.close()

    async def drain(self) -> None:
        """Wait for the background writes started so far (and those they start),
        pending vectors included (embedded now, idle or not)."""
        self._flushing += 1
        if self._pending:
            self._start_embedder()
        self._wake.set()
        try:
            while self._background:
                await asyncio.gather(*list(self._background))
        finally:
            self._flushing -= 1

    def _spawn(self, work: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -------------------------------------------------------------------- lookups

    async def get(self, key: str, scope: str, allow_stale: bool = False,
                  max_age: float | None = None) -> Entry | None:
        """The exact entry under `key` if `scope` owns it: L1, then Redis (a fresh L2 hit
        fills L1, unless a purge reaching it ran while it was read: the purge's event
        may have come before Redis's answer, and L1 would keep what the purge removed).
        `max_age`: the oldest answer, in seconds, the client takes (an older one is a
        miss). `allow_stale` (the breaker's stale fallback, a second read for a request
        whose lookup was counted) goes uncounted in `weir_cache_lookups_total`:
        `weir_fallbacks_total` counts what it served."""
        now = time.time()
        count = _uncounted if allow_stale else self._count
        if self.l1 is not None:
            entry = self._l1_get(key, scope, now, allow_stale)
            if entry is not None and entry.young(now, max_age):
                count("l1", "hit")
                return entry
            count("l1", "miss")
        if self.redis is not None and self.cfg.l2.enabled:
            entry = await self.redis.get_exact(key)
            # (its own key's: an entry copied under another key, by hand or a tool
            # that moved keys, answered that key's question with its own answer)
            if entry is not None and entry.key == key and entry.scope == scope and entry.usable(
                    now, allow_stale) and entry.young(now, max_age):
                count("l2", "hit")
                if self.l1 is not None and entry.fresh(now) and not self.purged_since(
                        now, entry):
                    self.l1.put(entry, entry.size())
                return entry
            count("l2", "miss")
        return None

    def _count(self, layer: str, result: str) -> None:
        labelled(self.metrics.lookups, layer, result).inc()

    def just_stored(self, key: str, scope: str, max_age: float | None = None,
                    ) -> Entry | None:
        """The exact entry under `key` in L1, uncounted: for a request that looked it up
        moments ago and may have been overtaken by an identical one's generation."""
        now = time.time()
        entry = self._l1_get(key, scope, now)
        return entry if entry is not None and entry.young(now, max_age) else None

    def _l1_get(self, key: str, scope: str, now: float, allow_stale: bool = False,
                ) -> Entry | None:
        entry = self.l1.get(key, now, allow_stale) if self.l1 is not None else None
        return entry if entry is not None and entry.scope == scope else None

    def question_gate(self, sem: SemanticKey) -> str | None:
        """The question's guard gate when lookups are gated (lazy), else None: computed
        once per request, for `may_serve` and `lookup`."""
        return gate(sem[1]) if self.lazy else None

    def may_serve(self, partition: str, question_gate: str | None) -> bool:
        """Whether some entry (indexed or pending) in the partition could pass the
        near-miss guard with a question of this gate: if none can, a lookup is a miss
        without embedding."""
        if question_gate is None:
            return True
        p = self.index.partitions.get(partition)
        return ((p is not None and p.may_pass(question_gate))
                or (partition, question_gate) in self._gated)

    async def lookup(self, sem: SemanticKey, scope: str, allow_stale: bool = False,
                     question_gate: str | None = None, max_age: float | None = None,
                     ) -> tuple[np.ndarray | None, Entry | None]:
        """(the question's vector, the entry answering it): embed within the lookup
        deadline (with the pending questions of its gate, which join the index), search
        the partition, then the threshold, scope and near-miss guard. The vector comes
        back for `put` to reuse; None if the model failed or was slow. `question_gate`:
        the question's, if the caller has it (`question_gate`). `max_age`: as for `get`."""
        assert self.embedder is not None
        partition, question = sem
        lookups = self.metrics.lookups
        deadline = asyncio.get_running_loop().time() + self.cfg.semantic.lookup_timeout_ms / 1000
        if question_gate is None:
            question_gate = self.question_gate(sem)
        waiting = self._embed_gate(partition, question_gate) if question_gate else []
        try:
            async with asyncio.timeout_at(deadline):
                vec = (await self.embedder.embed([question]))[0][0]
        except TimeoutError:  # a busy or loading model: a miss, not a wait
            labelled(lookups, "semantic", "timeout").inc()
            return None, None
        except Exception as e:  # the model failing must not fail the request
            log.warning("embedding failed; semantic lookup skipped", error=type(e).__name__)
            return None, None
        entry, score = self._search(sem, scope, vec, allow_stale)
        if entry is None and waiting and not all(f.done() for f in waiting):
            # The pending questions of its gate may answer it: what is left of the
            # deadline for them (they go on without us), then search again.
            await asyncio.wait(waiting, timeout=max(
                0.0, deadline - asyncio.get_running_loop().time()))
            entry, again = self._search(sem, scope, vec, allow_stale)
            score = again if again is not None else score
        if score is not None:  # once a lookup: the best match it ended with
            self.metrics.similarity.observe(score)
        if entry is not None and not entry.young(time.time(), max_age):
            entry = None  # an answer older than the client takes
        labelled(lookups, "semantic", "miss" if entry is None else "hit").inc()
        return vec, entry

    def _search(self, sem: SemanticKey, scope: str, vec: np.ndarray, allow_stale: bool,
                ) -> tuple[Entry | None, float | None]:
        """The entry in the partition answering the question (the best match, if it
        passes the threshold, the scope and the near-miss guard), and the best match's
        similarity (None: the partition is empty)."""
        partition, question = sem
        found = self.index.find(partition, vec, time.time(), allow_stale)
        if found is None:
            return None, None
        entry, stored_q, score = found
        ok = score >= self.cfg.semantic.threshold and entry.scope == scope and (
            not self.cfg.semantic.guard or guard_ok(question, stored_q))
        log.debug("semantic lookup", score=round(score, 4), hit=ok)
        return (entry if ok else None), score

    # ----------------------------------------------------------- pending vectors

    def wake(self) -> None:
        """The gateway may have become idle: embed pending questions if it has."""
        if self._pending:
            self._wake.set()

    def _defer(self, partition: str, entry: Entry, question: str, question_gate: str | None,
               ) -> asyncio.Future[np.ndarray | None]:
        """Keep `entry` pending; its vector (None: dropped, purged or failed) comes later."""
        key = (partition, entry.key)
        size = entry_bytes(entry, question)
        if self.purged_since(entry.created, entry) or size > self.cfg.semantic.max_bytes:
            # a purge reached it since its put, or it could never join the index
            fut: asyncio.Future[np.ndarray | None] = asyncio.get_running_loop().create_future()
            fut.set_result(None)
            return fut
        if (old := self._pending.get(key)) is not None:
            self._settle(old, None)  # the same question answered again: the newer waits
        owner = _owner(entry)
        while len(self._pending) >= MAX_PENDING:
            # the new one counted as its owner's already (a tie: the owner's own)
            largest, held = self._pending_counts.largest(), self._pending_counts.get(owner)
            if held and held + 1 >= len(self._pending_of[largest]):
                largest = owner
            self._settle(self._pending[next(iter(self._pending_of[largest]))], None)
        while self._pending_bytes.total + size > self.cfg.semantic.max_bytes:
            # in bytes alike (the new one counted as its owner's: if that makes its owner
            # the one holding the most and it holds nothing else, it is the one to go)
            biggest, held = self._pending_bytes.largest(), self._pending_bytes.get(owner)
            if held + size >= self._pending_bytes.get(biggest):
                biggest = owner
            if biggest not in self._pending_of:
                fut = asyncio.get_running_loop().create_future()
                fut.set_result(None)
                return fut
            self._settle(self._pending[next(iter(self._pending_of[biggest]))], None)
        p = _Pending(partition, gate(question) if question_gate is None else question_gate,
                     entry, question,
                     asyncio.get_running_loop().create_future(), size)
        self._pending[key] = p
        mine = self._pending_of.setdefault(owner, OrderedDict())
        mine[key] = None
        self._pending_counts.set(owner, len(mine))
        self._pending_bytes.add(owner, size)
        self._gated.setdefault((partition, p.gate), {})[entry.key] = p
        labelled(self.metrics.entries, "pending").set(len(self._pending))
        self._start_embedder()
        self._wake.set()
        return p.vec

    def _settle(self, p: _Pending, vec: np.ndarray | None) -> None:
        """Give a pending entry its vector (it joins the index, unless a purge ran since
        it was made) or None; it is pending no more."""
        if self._pending.get((p.partition, p.entry.key)) is p:
            del self._pending[(p.partition, p.entry.key)]
            owner = _owner(p.entry)
            mine = self._pending_of[owner]
            del mine[(p.partition, p.entry.key)]
            if not mine:
                del self._pending_of[owner]
            self._pending_counts.set(owner, len(mine))
            self._pending_bytes.add(owner, -p.size)
            group = self._gated[(p.partition, p.gate)]
            del group[p.entry.key]
            if not group:
                del self._gated[(p.partition, p.gate)]
            labelled(self.metrics.entries, "pending").set(len(self._pending))
        if p.vec.done():
            return
        if vec is not None:
            # A partition it makes comes in as the least recently used: a burst of
            # one-off questions embedded at once (idle) pushes out at most one partition
            # in use, then each other.
            self._index_add(p.partition, p.entry.key, vec, p.entry, p.question, new_last=False,
                            question_gate=p.gate)
        else:  # it counted against its owner's cap while it waited
            self.users.discard(semantic_member(p.partition, p.entry.key))
        p.vec.set_result(vec)

    def _embed_gate(self, partition: str, question_gate: str,
                    ) -> list[asyncio.Future[np.ndarray | None]]:
        """Embed the newest pending questions of a gate (in the background: a lookup
        waits for them within its deadline, never beyond, and never cancels them); the
        vectors they will have."""
        group = self._gated.get((partition, question_gate))
        if not group:
            return []
        batch = list(group.values())[-LOOKUP_BATCH:]
        start = [p for p in batch if not p.embedding]
        if start:
            self._spawn(self._embed_pending(start))
        return [p.vec for p in batch]

    async def _embed_pending(self, batch: list[_Pending]) -> None:
        """Embed pending questions and settle them; one that fails (or is cut short) is
        settled without a vector."""
        for p in batch:
            p.embedding = True
        vecs = None
        try:
            if self.embedder is not None:
                vecs, _ = await self.embedder.embed([p.question for p in batch])
        except Exception:
            vecs = None
        finally:
            for i, p in enumerate(batch):
                self._settle(p, None if vecs is None else vecs[i])

    async def _embed_when_idle(self) -> None:
        """Embed pending questions, a few per pass, while the gateway is idle (or
        `drain` asks for everything); sleep on `wake` otherwise."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending and (self._flushing or self.idle()):
                oldest = list(itertools.islice(self._pending.values(), IDLE_BATCH * 2))
                batch = [p for p in oldest if not p.embedding][:IDLE_BATCH]
                if not batch:  # lookups are embedding these: they settle on their own
                    await asyncio.wait([p.vec for p in oldest],
                                       return_when=asyncio.FIRST_COMPLETED)
                    continue
                try:
                    await self._embed_pending(batch)
                except Exception as e:  # never leave a pending answer (or a drain) hanging
                    log.error("pending vectors failed", error=type(e).__name__)
                    for p in batch:
                        self._settle(p, None)

    def _start_embedder(self) -> None:
        if self._embedder_task is None or self._embedder_task.done():
            self._embedder_task = background(self._embed_when_idle())

    # -------------------------------------------------------------------- storing

    def purged_since(self, started: float, entry: Entry) -> bool:
        """Whether a purge that reaches `entry` ran after `started`: an answer generated
        across it may hold what was purged, so it is not stored."""
        return started < self._purge_floor or any(
            started < at and reaches(entry) for at, reaches in reversed(self._purges))

    def _purged(self, f: dict[str, Any] | None, match: Match) -> None:
        """Remember a purge now: what filter `f` reaches (`match` when there is none). An
        entry without its prompt (read from Redis) counts as reached by a content filter
        its owner fields accept: its prompt cannot say otherwise."""
        reaches = match
        if f is not None and f.get("contains"):
            owner = matcher({k: v for k, v in f.items() if k != "contains"})

            def reaches(e: Entry) -> bool:
                return owner(e) and (not e.prompt or match(e))
        self._purges.append((time.time(), reaches))
        while len(self._purges) > MAX_PURGES_KEPT:
            self._purge_floor = self._purges.popleft()[0]

    def promote(self, key: str, entry: Entry, prompt: str,
                asker: tuple[str, str, str]) -> None:
        """Keep a paraphrase as an exact alias in L1: its next ask skips the embedding.
        The alias keeps the original's owner, times and text, so purges by user, tenant
        or content remove it with the original, and its key (a purge another replica
        names the original by reaches it: `_named`); and its asker (tenant, role, user)
        with the paraphrase, so a purge of the asker, or of the paraphrase's words,
        removes it too."""
        if self.l1 is None:
            return
        alias = replace(entry, key=key, source=entry.source or entry.key,
                        asker=(*asker, prompt))
        # (to_json leaves the asker out: its words count toward L1's bytes too)
        self.l1.put(alias, alias.size() + sum(map(text_bytes, (prompt, *asker))))

    def put(self, entry: Entry, sem: SemanticKey | None = None,
            vec: Vec | None = None, question_gate: str | None = None) -> None:
        """Store: L1 now; Redis, the vector index (`sem`, embedding the question unless
        `vec` gives its vector, or the lookup that computes it) and the owner's cap in
        the background. `question_gate`: the question's (`question_gate`), if the caller
        has it."""
        if self.l1 is not None:
            self.l1.put(entry, entry.size())
            labelled(self.metrics.entries, "l1").set(len(self.l1))
        self._spawn(self._persist(entry, sem, vec, question_gate))

    def _timed(self, entry: Entry, layer: Literal["l2", "semantic"]) -> Entry:
        """`entry` as a layer keeps it: fresh for that layer's `ttl_s` from when it was
        made (`exact.ttl_s` is L1's, which `put` is given), then stale for the grace."""
        expires = entry.created + (self.cfg.l2 if layer == "l2" else self.cfg.semantic).ttl_s
        return replace(entry, expires=expires,
                       stale_until=expires + self.cfg.stale_grace_s)

    async def _persist(self, entry: Entry, sem: SemanticKey | None, vec: Vec | None,
                       question_gate: str | None) -> None:
        members = [exact_member(entry.key)]
        if sem is None or self.embedder is None:
            await self._write(entry, None, members)
            return
        partition, question = sem
        if isinstance(vec, asyncio.Future):  # ends within the lookup's deadline
            await asyncio.wait((vec,))
            vec = None if vec.cancelled() or vec.exception() else vec.result()[0]
        member = semantic_member(partition, entry.key)
        if vec is None and self.lazy:
            # No vector at hand: the exact entry now, the semantic one once embedded. Both
            # count against the owner's cap now, so it holds while the vector waits (a
            # semantic member evicted meanwhile drops the pending entry: `_drop`).
            later = self._defer(partition, self._timed(entry, "semantic"), question,
                                question_gate)
            await self._write(entry, None, [*members, member])
            if (vec := await later) is not None and self._held(member):
                await self._write(entry, (partition, vec, question), [], exact=False)
            elif vec is None and self.redis is not None and not self._held(member):
                # Dropped while pending (a purge, the pending bound, the same question
                # answered again holds it anew): its reserved place on the owner's list
                # is freed, as this replica's count was.
                await self.redis.release(entry.tenant, entry.user, [member])
            return
        if vec is None:
            owner = _owner(entry)
            waiting, mine = self._unembedded_total, self._unembedded.get(owner, 0)
            if waiting >= MAX_PENDING and (mine * len(self._unembedded) >= waiting
                                           or waiting >= 2 * MAX_PENDING):
                # Embeddings are behind: an answer of a tenant holding at least an even
                # share of those waiting stays an exact entry (one of a tenant holding
                # less still waits, up to twice the bound).
                await self._write(entry, None, members)
                return
            self._unembedded[owner] = mine + 1
            self._unembedded_total += 1
            try:
                vec = await self._vector(question, vec)
            finally:
                self._unembedded_total -= 1
                if self._unembedded[owner] == 1:
                    del self._unembedded[owner]
                else:
                    self._unembedded[owner] -= 1
        semantic = None
        if vec is not None:
            self._index_add(partition, entry.key, vec, self._timed(entry, "semantic"),
                            question, question_gate=question_gate)
            members.append(member)
            semantic = (partition, vec, question)
        await self._write(entry, semantic, members)

    async def _write(self, entry: Entry, semantic: tuple[str, np.ndarray, str] | None,
                     members: list[str], exact: bool = True) -> None:
        """Redis (the exact entry when `exact` and L2 is on, the semantic one) and the
        owner's cap, counting `members` (an entry's parts: its exact one, and its
        semantic one if it has or will have one)."""
        # The cap counts parts, the same for every put: an entry holds two where the
        # semantic layer is on (one where it is not, or where it has no vector), so an
        # answer kept exact only (a tool turn, a completion) does not scale it down.
        cap = self.cfg.per_user_max_entries * (2 if self._semantic else 1)
        if self.redis is not None:
            # One round trip, once the vector is known: Redis keeps the owner's list and
            # deletes and announces what the cap evicts; this replica forgets it here.
            # (Sending the exact entry ahead while the question is embedded again was
            # measured: under load the second round trip cost more than it saved.)
            grace = self.cfg.stale_grace_s
            l2_ttl, semantic_ttl = self.cfg.l2.ttl_s, self.cfg.semantic.ttl_s
            evicted = await self.redis.persist(
                self._timed(entry, "l2"), exact and self.cfg.l2.enabled, l2_ttl + grace,
                semantic, self._timed(entry, "semantic"), semantic_ttl + grace, members,
                cap, max(l2_ttl, semantic_ttl) + grace, _owner(entry))
            if evicted is not None:
                await self._drop(evicted, local_only=True)
                return
        if not members:
            return
        # No Redis, or it is down: this replica keeps the list.
        evicted = self.users.enforce((entry.tenant, entry.user), members, cap, self._held)
        if evicted:
            await self._drop(evicted)
            if self.redis is not None:
                await self.redis.publish({"op": "drop", "members": evicted})

    async def _vector(self, question: str, vec: np.ndarray | None) -> np.ndarray | None:
        """The question's vector: given, or embedded now; None if it cannot be had."""
        if vec is None:
            try:
                vec = (await self.embedder.embed([question]))[0][0] if self.embedder else None
            except Exception:
                vec = None
        return vec if isinstance(vec, np.ndarray) else None

    def _index_add(self, partition: str, entry_id: str, vec: np.ndarray, entry: Entry,
                   question: str, new_last: bool = True,
                   question_gate: str | None = None) -> None:
        evicted = self.index.partition(partition, new_last, _owner(entry)).add(
            entry_id, vec, entry, question, question_gate)
        if evicted and self.redis is not None:
            self._spawn(self.redis.delete_semantic([(partition, e) for e in evicted]))
        labelled(self.metrics.entries, "semantic").set(len(self.index))

    def _held(self, member: str) -> bool:
        return self._holding(member) is not None

    def _holding(self, member: str) -> Entry | None:
        """The entry this replica holds under `member` (L1, the index, or pending)."""
        keys, sem = split_members([member])
        if keys:
            return self.l1.held(keys[0]) if self.l1 is not None else None
        if not sem:
            return None
        if (pending := self._pending.get(sem[0])) is not None:
            return pending.entry
        part = self.index.partitions.get(sem[0][0])
        held = part.entries.get(sem[0][1]) if part is not None else None
        return held[0] if held is not None else None

    async def _drop(self, members: list[str], local_only: bool = False) -> None:
        keys, sem = split_members(members)
        for key in keys:
            if self.l1 is not None:
                self.l1.delete(key)
        for partition, entry_id in sem:
            if (p := self._pending.get((partition, entry_id))) is not None:
                self._settle(p, None)
            part = self.index.partitions.get(partition)
            if part is not None:
                part.remove(entry_id)
        if not local_only:
            await self._drop_remote(keys, sem)

    # ------------------------------------------------------------ replica events

    def _servable(self, question: str) -> bool:
        """Whether a semantic entry read from Redis may serve paraphrases here, so joins
        the index: only with its question (`store_prompts`), unless the near-miss guard
        is off. Without it the guard has a digest of the question's features alone, and
        its word-level rules (a swapped word, an added qualifier, a new order) cannot
        run: across replicas "open on Saturday" answered "close on Saturday". Held, such
        entries would only take the index's room (evicting servable ones) and make
        lookups embed for nothing. They still serve exact repeats (L2)."""
        return not (self.cfg.semantic.guard and question.startswith(DIGEST_MARK))

    async def _on_event(self, event: dict[str, Any]) -> None:
        op = event.get("op")
        try:
            await self._apply(event, op)
        finally:
            labelled(self.metrics.events, op if op in _EVENT_OPS else "other").inc()

    async def _apply(self, event: dict[str, Any], op: Any) -> None:
        if op == "add" and self.redis is not None and self.embedder is not None:
            got = await self.redis.get_semantic(event["p"], event["id"])
            if got is not None:
                vec, entry, question = got
                if (len(vec) == self.index.dim and self._servable(question)
                        and not self.purged_since(entry.created, entry)):
                    self._index_add(event["p"], event["id"], vec, entry, question)
        elif op == "purge":
            f = event.get("filter") or {}
            keys, sem = self._purge_memory(matcher(f), drop_remote=True, f=f)
            # What the purging replica matched by content, by name: copies this replica
            # read from Redis may hold no prompt for the filter to match.
            await self._drop(self._named(list(event.get("members") or []), f),
                             local_only=True)
            if (keys or sem) and "contains" in f:
                # And what this one matched (it held their prompts), for the others.
                await self._publish({"op": "drop", "filter": f}, _members(keys, sem))
        elif op == "drop":
            members = list(event.get("members") or [])
            if "filter" in event:  # named by a purge: only what its filter's scope allows
                members = self._named(members, event["filter"])
            await self._drop(members, local_only=True)
        elif op == "resync":
            # The listener lost Redis a while: the purges sent meanwhile are read back
            # from what Redis kept of them and applied as they would have been (this
            # replica holds the prompts a purge by content matches), or, where Redis
            # cannot say, this replica keeps nothing it cannot check.
            missed = (await self.redis.events_since(float(event.get("since") or 0.0))
                      if self.redis is not None else None)
            if missed is None:
                self._forget_local()
            for e in missed or ():
                await self._on_event(e)
            if self.embedder is not None and self.redis is not None:
                await self._load_semantic()

    def _forget_local(self) -> None:
        """Purges may have been missed and cannot be read back: L1, the vector index and
        pending vectors are emptied (L2 answers again, and the vectors are loaded back
        from Redis), and no answer generated across the gap is stored."""
        self._purge_floor = max(self._purge_floor, time.time())
        if self.l1 is not None:
            self.l1.purge(_everything)
            labelled(self.metrics.entries, "l1").set(len(self.l1))
        self.index.purge(_everything)
        for p in list(self._pending.values()):
            self._settle(p, None)
        labelled(self.metrics.entries, "semantic").set(len(self.index))
        log.info("cache events were missed while redis was away: this replica's memory "
                 "was emptied")

    async def _load_semantic(self) -> None:
        assert self.redis is not None
        now = time.time()
        loaded = 0

        def keep(entry: Entry, q: str) -> bool:
            return entry.usable(now, True) and self._servable(q)

        for partition, entry_id, vec, entry, q in await self.redis.load_semantic(
                self.cfg.semantic.max_entries_per_scope * 1000, self.cfg.semantic.max_bytes,
                keep):
            if len(vec) == self.index.dim and not self.purged_since(now, entry):
                # (as `get` reads L2; `keep` took only the usable and servable)
                self._index_add(partition, entry_id, vec, entry, q)
                loaded += 1
        if loaded:
            log.info("semantic entries loaded from redis", count=loaded)

    # ------------------------------------------------------------- purge, stats

    async def purge(self, f: dict[str, Any]) -> dict[str, Any]:
        """Remove what filter `f` matches everywhere: this replica's memory, Redis, and
        (through an event) every other replica's memory. Counts per layer; Redis's is
        None when Redis or the event failed (the names matched here are kept, and the
        next purge tries them again), absent without Redis."""
        match = matcher(f)
        keys, sem = self._purge_memory(match, f=f)
        counts: dict[str, Any] = {"l1": len(keys), "semantic_index": len(sem)}
        if self.redis is not None:
            async with self._purging:
                # Names owed by earlier purges Redis did not take: each retried under
                # its own filter (never this one's: its owner fields would not own them
                # on the other replicas, and its counts would hold them); this filter's
                # own go with it.
                this = _filter_id(f)
                for other in [o for o in self._owed if o != this]:
                    owed = self._owed.pop(other)
                    await self._purge_redis(owed[0], matcher(owed[0]), owed[1], owed[2], True)
                mine = self._owed.pop(this, None)
                if mine is not None:
                    keys, sem = [*mine[1], *keys], [*mine[2], *sem]
                got = await self._purge_redis(f, match, keys, sem,
                                              "contains" in f or mine is not None)
            counts["redis"] = None if got is None else {"exact": got[0], "semantic": got[1]}
        return counts

    async def _purge_redis(self, f: dict[str, Any], match: Match, keys: list[str],
                           sem: list[tuple[str, str]], name: bool) -> tuple[int, int] | None:
        """Purge filter `f` from Redis and, through an event, from the other replicas'
        memory, with the names this replica matched (`name`: told to the others too).
        Redis, and the other replicas' copies read from it, may hold no prompts: what
        this replica matched by content is named, so the purge reaches those copies too
        (a filter by owner alone matches them everywhere as it is). Redis's counts; None
        when Redis or the event failed, and the names are then owed under `f` (at most
        `OWED_MAX` filters: past it the oldest is dropped, its purge answered 503)."""
        assert self.redis is not None
        got = await self.redis.purge(match, keys, sem, matcher(
            {k: v for k, v in f.items() if k != "contains"}))
        told = await self._publish({"op": "purge", "filter": f},
                                   _members(keys, sem) if name else [])
        if got is not None and told:
            return got
        self._owed[_filter_id(f)] = (f, keys, sem)
        while len(self._owed) > OWED_MAX:
            del self._owed[next(iter(self._owed))]
        return None

    async def _publish(self, event: dict[str, Any], members: list[str]) -> bool:
        """`event` with `members`, in messages of a bounded size; whether Redis took them
        all."""
        assert self.redis is not None
        ok = True
        for i in range(0, max(len(members), 1), PUBLISH_CHUNK):
            ok = await self.redis.publish({**event, "members": members[i:i + PUBLISH_CHUNK]}
                                          ) and ok
        return ok

    def _named(self, members: list[str], f: dict[str, Any]) -> list[str]:
        """The members another replica's purge named that this replica holds for an entry
        the filter's owner fields accept (tenant, role, user, key): a shared key (scope
        `global`) can name another tenant's entry here."""
        owned = matcher({k: v for k, v in f.items() if k != "contains"})
        named = [m for m in members if (held := self._holding(m)) is not None and owned(held)]
        if self.l1 is not None and members:
            # Paraphrases kept here as aliases of a named entry go with it: they may hold
            # none of its text for the filter to match (it was read from Redis).
            keys, sem = split_members(members)
            sources = {*keys, *(entry_id for _, entry_id in sem)}  # an entry id is its key
            named += [exact_member(e.key) for e in self.l1.entries()
                      if e.source in sources and owned(e)]
        return named

    def purge_local(self, match: Match) -> tuple[int, int]:
        """Purge this replica's memory only; (L1 entries, semantic entries) removed."""
        keys, sem = self._purge_memory(match)
        return len(keys), len(sem)

    def _purge_memory(self, match: Match, drop_remote: bool = False,
                      f: dict[str, Any] | None = None,
                      ) -> tuple[list[str], list[tuple[str, str]]]:
        """A replica told of a purge (`drop_remote`) also deletes the Redis copies of what
        it matched: it holds their prompts, Redis may not. `f`: the purge's filter."""
        self._purged(f, match)
        keys = self.l1.purge(match) if self.l1 is not None else []
        sem = self.index.purge(match)
        for p in [p for p in self._pending.values() if match(p.entry)]:
            self._settle(p, None)  # its question text leaves memory now, not when idle
        if self.l1 is not None:
            labelled(self.metrics.entries, "l1").set(len(self.l1))
        labelled(self.metrics.entries, "semantic").set(len(self.index))
        if drop_remote and self.redis is not None and (keys or sem):
            self._spawn(self._drop_remote(keys, sem))
        return keys, sem

    async def _drop_remote(self, keys: list[str], sem: list[tuple[str, str]]) -> None:
        if self.redis is None:
            return
        await self.redis.delete_exact(keys)
        await self.redis.delete_semantic(sem)

    async def stats(self, match: Match | None = None) -> dict[str, Any]:
        """Entry counts per layer: all of them, or those `match` accepts (no byte count
        then: a share of L1's bytes would tell a tenant about the others')."""
        body: dict[str, Any] = {"replica": self.replica}
        if match is None:
            body |= {"l1": {"entries": len(self.l1) if self.l1 else 0,
                            "bytes": self.l1.bytes if self.l1 else 0},
                     "semantic_index": {"entries": len(self.index),
                                        "partitions": len(self.index.partitions)}}
        else:
            mine = sum(map(match, self.l1.entries())) if self.l1 else 0
            parts = [sum(map(match, (e for e, _ in p.entries.values())))
                     for p in self.index.partitions.values()]
            body |= {"l1": {"entries": mine},
                     "semantic_index": {"entries": sum(parts),
                                        "partitions": sum(n > 0 for n in parts)}}
        if self.redis is not None:
            body["redis"] = await self.redis.count(match)
        return body


def _owner(entry: Entry) -> str:
    """Whose share of L1 and of the semantic partitions an entry takes: the account
    (`proxy.auth.account`) of the tenant that asked (a paraphrase's alias: its asker's;
    every caller a gateway key forwards for counts as that key's tenant, or a gateway
    naming many callers would outnumber every tenant)."""
    return account(entry.asker[0] if entry.asker is not None else entry.tenant)


def _filter_id(f: dict[str, Any]) -> str:
    """A purge filter as one string (its fields in order): a key of `CacheStore._owed`."""
    return orjson.dumps(f, option=orjson.OPT_SORT_KEYS).decode()


def _members(keys: list[str], sem: list[tuple[str, str]]) -> list[str]:
    """The names (`users.py`'s members) of exact keys and semantic entries."""
    return [*map(exact_member, keys), *(semantic_member(p, e) for p, e in sem)]


def _everything(entry: Entry) -> bool:
    return True
