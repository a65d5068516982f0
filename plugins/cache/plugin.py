"""The cache: exact (L1 in process, L2 in Redis) and semantic answers, scoped by principal.

Per request: decide (bypass when sensitive, non-deterministic, asking for logprobs, or
`Cache-Control: no-cache/no-store`) -> exact lookup (L1, then L2, whose hit fills L1) ->
semantic lookup (embed the last user message, search the request's own partition, then
the similarity threshold and the near-miss guard) -> on a miss, one generation per key
(concurrent identical misses wait for the leader) -> capture the answer if it ended
normally and store it (L1 at once; Redis, the vector index and the user's cap in the
background, so a miss pays nothing for them).

Responses carry `x-weir-cache: exact | semantic | miss | bypass | stale` and `Age` on a
hit. Similarity scores go to metrics and debug logs only: exposing them would let a
client probe what other entries say.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
from aiohttp import web
from prometheus_client import Counter, Gauge, Histogram

from proxy.chain import (
    FALLBACK_HEADER,
    BasePlugin,
    Completion,
    Next,
    Outcome,
    Reply,
    Services,
    Stream,
)
from proxy.context import RequestContext
from proxy.protocol import ChatCompletionRequest
from proxy.telemetry import get_logger

from . import admin
from .config import CacheConfig
from .entry import Entry, capture_body, replay_body, replay_stream
from .keys import exact_key, prompt_text, scope_id, semantic_parts
from .l1 import L1
from .redis_store import RedisStore
from .semantic import SemanticIndex, guard_ok

log = get_logger("weir.cache")
HEADER = "x-weir-cache"
#: A leader's settle value when its client went away: a waiter takes the lead.
ABANDONED = object()


class CachePlugin(BasePlugin[CacheConfig]):
    name: ClassVar[str] = "cache"
    Config = CacheConfig

    def __init__(self, config: CacheConfig, services: Services) -> None:
        super().__init__(config, services)
        self.cfg = config
        self.replica = uuid.uuid4().hex[:12]
        reg = services.metrics.registry
        self.lookups = Counter("weir_cache_lookups_total", "Cache lookups.",
                               ["layer", "result"], registry=reg)
        self.similarity = Histogram("weir_cache_semantic_similarity",
                                    "Best semantic score per lookup.", registry=reg,
                                    buckets=(0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98, 1.0))
        self.store_errors = Counter("weir_cache_store_errors_total",
                                    "Redis operations that failed or timed out.", ["op"],
                                    registry=reg)
        self.coalesced = Counter("weir_cache_coalesced_total",
                                 "Requests answered by another request's generation.",
                                 registry=reg)
        self.entries_gauge = Gauge("weir_cache_entries", "Entries held by this replica.",
                                   ["layer"], registry=reg)
        self.l1 = L1(config.exact.max_bytes) if config.exact.enabled else None
        self.embedder = services.embedder if config.semantic.enabled else None
        if config.semantic.enabled and self.embedder is None:
            log.warning("semantic cache needs `embeddings.enabled: true`; exact only")
        dim = self.embedder.dim if self.embedder is not None else 384
        self.index = SemanticIndex(dim, config.semantic.max_entries_per_scope,
                                   config.semantic.max_partitions)
        self.redis = (RedisStore(config.redis, self.store_errors, self.replica)
                      if config.redis.url else None)
        self._sensitive = [re.compile(p) for p in config.sensitive_patterns]
        self._inflight: dict[str, asyncio.Future[Entry | object | None]] = {}
        self._users: dict[tuple[str, str], OrderedDict[str, None]] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._purged_at = 0.0
        self._purged_keys: tuple[list[str], list[tuple[str, str]]] = ([], [])

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        if self.redis is not None:
            await self.redis.start(self._on_event)
            if self.embedder is not None:
                await self._load_semantic()

    async def close(self) -> None:
        for t in list(self._background):
            t.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        if self.redis is not None:
            await self.redis.close()

    def routes(self) -> list[tuple[str, str, Callable[[web.Request], Any]]]:
        return admin.routes(self)

    def health(self) -> dict[str, Any] | None:
        return {"redis": None if self.redis is None else
                ("up" if self.redis.healthy else "down")}

    # ------------------------------------------------------------------ decision

    def _decide(self, ctx: RequestContext) -> tuple[bool, bool]:
        """(may read, may write)."""
        req = ctx.request
        if ctx.sensitive:
            return False, False
        if self.cfg.deterministic_only and not (req.temperature == 0 or req.seed is not None):
            return False, False
        if (isinstance(req, ChatCompletionRequest) and req.logprobs) or (
                not isinstance(req, ChatCompletionRequest) and req.logprobs is not None):
            return False, False  # cached answers carry no logprobs
        if self._sensitive:
            text = prompt_text(ctx)
            if any(p.search(text) for p in self._sensitive):
                return False, False
        directives = {d.strip().lower() for d in ctx.headers.get("cache-control", "").split(",")}
        read = "no-cache" not in directives  # no-cache: skip the read; no-store: the write
        write = "no-store" not in directives and "injection" not in ctx.flags
        return read, write

    # -------------------------------------------------------------------- request

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        read, write = self._decide(ctx)
        if not read and not write:
            self.lookups.labels("all", "bypass").inc()
            ctx.response_headers[HEADER] = "bypass"
            return await call_next(ctx)
        key = exact_key(ctx, self.cfg.scope)
        scope = scope_id(ctx.principal, self.cfg.scope)
        sem = semantic_parts(ctx, self.cfg.scope) if self.embedder is not None else None
        if sem is not None and not (self.cfg.semantic.min_chars <= len(sem[1])
                                    <= self.cfg.semantic.max_chars):
            sem = None  # never embedded: no lookup, no entry
        vec: np.ndarray | None = None
        if read:
            entry = await self._exact(key, scope)
            if entry is not None:
                return self._hit(ctx, entry, "exact")
            if sem is not None:
                vec, entry = await self._semantic(sem[0], sem[1], scope)
                if entry is not None:
                    if write:
                        self._promote(ctx, key, entry)
                    return self._hit(ctx, entry, "semantic")
        else:
            ctx.response_headers[HEADER] = "bypass"
        ctx.response_headers.setdefault(HEADER, "miss")
        if not write:
            return await call_next(ctx)
        while self.cfg.coalesce and (leader := self._inflight.get(key)) is not None:
            led: Entry | object | None = await asyncio.shield(leader)
            if isinstance(led, Entry):
                self.coalesced.inc()
                return self._reply(ctx, led)
            if led is None:
                return await call_next(ctx)  # the leader failed: generate for ourselves
            # ABANDONED: the leader's client went away; the first waiter to get here
            # takes the lead, the others wait on it.
        return await self._lead(ctx, call_next, key, scope, sem, vec)

    async def _lead(self, ctx: RequestContext, call_next: Next, key: str, scope: str,
                    sem: tuple[str, str] | None, vec: np.ndarray | None) -> Reply:
        fut: asyncio.Future[Entry | object | None] = asyncio.get_running_loop().create_future()
        if self.cfg.coalesce:
            self._inflight[key] = fut

        def settle(entry: Entry | object | None) -> None:
            if not fut.done():
                fut.set_result(entry)
            if self._inflight.get(key) is fut:
                del self._inflight[key]

        started = time.time()
        try:
            reply = await call_next(ctx)
        except asyncio.CancelledError:
            settle(ABANDONED)
            raise
        except BaseException:
            settle(None)
            raise
        if FALLBACK_HEADER in reply.headers:
            settle(None)
            return reply
        if isinstance(reply, Completion):
            entry = self._make_entry(ctx, key, scope, capture_body(reply.body, ctx.route),
                                     started)
            settle(entry)
            if entry is not None:
                self._store(entry, sem, vec)
            return reply

        def ended(stream: Stream, outcome: Outcome) -> None:
            if outcome != "completed":
                # Nothing stored. A client gone hands the lead to a waiter; a failure
                # lets each waiter generate for itself.
                settle(ABANDONED if outcome == "cancelled" else None)
                return
            captured = None
            if stream.answer is not None:
                u = stream.usage or {}
                captured = (stream.answer, {"prompt_tokens": int(u.get("prompt_tokens", 0)),
                                            "completion_tokens": int(
                                                u.get("completion_tokens", 0))})
            entry = self._make_entry(ctx, key, scope, captured, started)
            settle(entry)
            if entry is not None:
                self._store(entry, sem, vec)

        reply.on_end(ended)
        return reply

    # -------------------------------------------------------------------- lookups

    async def _exact(self, key: str, scope: str, allow_stale: bool = False) -> Entry | None:
        now = time.time()
        if self.l1 is not None:
            entry = self.l1.get(key, now, allow_stale)
            if entry is not None and entry.scope == scope:
                self.lookups.labels("l1", "hit").inc()
                return entry
            self.lookups.labels("l1", "miss").inc()
        if self.redis is not None and self.cfg.l2.enabled:
            entry = await self.redis.get_exact(key)
            if entry is not None and entry.scope == scope and entry.usable(now, allow_stale):
                self.lookups.labels("l2", "hit").inc()
                if self.l1 is not None and entry.fresh(now):
                    self.l1.put(entry, len(entry.to_json()))
                return entry
            self.lookups.labels("l2", "miss").inc()
        return None

    async def _semantic(self, partition: str, question: str, scope: str,
                        allow_stale: bool = False) -> tuple[np.ndarray | None, Entry | None]:
        assert self.embedder is not None
        try:
            async with asyncio.timeout(self.cfg.semantic.lookup_timeout_ms / 1000):
                vecs, _ = await self.embedder.embed([question])
        except TimeoutError:  # a busy or loading model: a miss, not a wait
            self.lookups.labels("semantic", "timeout").inc()
            return None, None
        except Exception as e:  # the model failing must not fail the request
            log.warning("embedding failed; semantic lookup skipped", error=type(e).__name__)
            return None, None
        vec = vecs[0]
        part = self.index.get(partition)
        found = part.search(vec, time.time(), allow_stale) if part is not None else None
        if found is None:
            self.lookups.labels("semantic", "miss").inc()
            return vec, None
        entry_id, score = found
        self.similarity.observe(score)
        assert part is not None
        entry, stored_q = part.entries[entry_id]
        ok = score >= self.cfg.semantic.threshold and entry.scope == scope and (
            not self.cfg.semantic.guard or guard_ok(question, stored_q))
        log.debug("semantic lookup", score=round(score, 4), hit=ok)
        self.lookups.labels("semantic", "hit" if ok else "miss").inc()
        return vec, entry if ok else None

    def _promote(self, ctx: RequestContext, key: str, entry: Entry) -> None:
        """Keep the paraphrase as an exact alias in L1: its next ask skips the embedding.
        The alias keeps the original's owner, times and text (plus the paraphrase), so
        purges by user, tenant or content remove it with the original."""
        if self.l1 is None:
            return
        alias = Entry(key=key, route=entry.route, model=entry.model, choices=entry.choices,
                      usage=entry.usage, scope=entry.scope, tenant=entry.tenant,
                      role=entry.role, user=entry.user,
                      prompt=entry.prompt + "\n" + prompt_text(ctx), created=entry.created,
                      expires=entry.expires, stale_until=entry.stale_until)
        self.l1.put(alias, len(alias.to_json()))

    def _hit(self, ctx: RequestContext, entry: Entry, layer: str) -> Reply:
        ctx.response_headers[HEADER] = layer
        ctx.response_headers["Age"] = str(entry.age(time.time()))
        ctx.prompt_tokens = entry.usage["prompt_tokens"]
        return self._reply(ctx, entry)

    @staticmethod
    def _reply(ctx: RequestContext, entry: Entry) -> Reply:
        if ctx.request.stream:
            stream = Stream(replay_stream(entry, ctx.request))
            u = entry.usage
            stream.usage = {**u, "total_tokens": u["prompt_tokens"] + u["completion_tokens"]}
            return stream
        return Completion(replay_body(entry, ctx.request))

    async def stale(self, ctx: RequestContext) -> Reply | None:
        """An expired entry still inside its grace window, for the breaker's fallback."""
        if self.cfg.stale_grace_s <= 0 or not self._decide(ctx)[0]:
            return None  # never stored (sensitive, sampled ...) or no-cache: no lookup
        key = exact_key(ctx, self.cfg.scope)
        entry = await self._exact(key, scope_id(ctx.principal, self.cfg.scope), allow_stale=True)
        if entry is None:
            return None
        reply = self._hit(ctx, entry, "stale")
        reply.headers[HEADER] = "stale"
        return reply

    # -------------------------------------------------------------------- storing

    def _make_entry(self, ctx: RequestContext, key: str, scope: str,
                    captured: tuple[list[dict[str, Any]], dict[str, int]] | None,
                    started: float) -> Entry | None:
        if captured is None:
            return None
        choices, usage = captured
        allowed = {"stop", "tool_calls", "length"} if self.cfg.store_truncated else {
            "stop", "tool_calls"}
        if any(c["finish_reason"] not in allowed or not (c["text"].strip() or c.get("tool_calls"))
               for c in choices):
            return None
        if started < self._purged_at:
            return None  # generated across a purge: it may hold what was purged
        ttl = self.cfg.exact.ttl_s
        now = time.time()
        p = ctx.principal
        return Entry(key=key, route=ctx.route, model=ctx.model, choices=choices, usage=usage,
                     scope=scope, tenant=p.tenant, role=p.role, user=p.user,
                     prompt=prompt_text(ctx), created=now, expires=now + ttl,
                     stale_until=now + ttl + self.cfg.stale_grace_s)

    def _store(self, entry: Entry, sem: tuple[str, str] | None, vec: np.ndarray | None) -> None:
        data = entry.to_json()
        if self.l1 is not None:
            self.l1.put(entry, len(data))
            self.entries_gauge.labels("l1").set(len(self.l1))
        task = asyncio.create_task(self._persist(entry, data, sem, vec))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _persist(self, entry: Entry, data: str, sem: tuple[str, str] | None,
                       vec: np.ndarray | None) -> None:
        members = [f"x:{entry.key}"]
        if self.redis is not None and self.cfg.l2.enabled:
            await self.redis.put_exact(entry, data, self.cfg.exact.ttl_s + self.cfg.stale_grace_s)
        if sem is not None and self.embedder is not None:
            partition, question = sem
            if vec is None:
                try:
                    vec = (await self.embedder.embed([question]))[0][0]
                except Exception:
                    vec = None
            if vec is not None:
                self._index_add(partition, entry.key, vec, entry, question)
                members.append(f"s:{partition}:{entry.key}")
                if self.redis is not None:
                    if await self.redis.put_semantic(partition, entry.key, vec, entry, question,
                                                     self.cfg.semantic.ttl_s):
                        await self.redis.publish({"op": "add", "p": partition, "id": entry.key})
        await self._enforce_user_cap(entry, members)

    def _index_add(self, partition: str, entry_id: str, vec: np.ndarray, entry: Entry,
                   question: str) -> None:
        evicted = self.index.partition(partition).add(entry_id, vec, entry, question)
        if evicted and self.redis is not None:
            t = asyncio.create_task(self.redis.delete_semantic([(partition, e) for e in evicted]))
            self._background.add(t)
            t.add_done_callback(self._background.discard)
        self.entries_gauge.labels("semantic").set(len(self.index))

    async def _enforce_user_cap(self, entry: Entry, members: list[str]) -> None:
        cap = self.cfg.per_user_max_entries
        evicted: list[str] | None = None
        if self.redis is not None:
            evicted = []
            for m in members:
                got = await self.redis.track_user(entry.tenant, entry.user, m, cap * len(members),
                                                  self.cfg.exact.ttl_s + self.cfg.semantic.ttl_s)
                if got is None:
                    evicted = None
                    break
                evicted += got
        if evicted is None:  # no Redis, or Redis down: this replica's own count
            mine = self._users.setdefault((entry.tenant, entry.user), OrderedDict())
            for m in members:
                mine[m] = None
            evicted = []
            while len(mine) > cap * len(members):
                evicted.append(mine.popitem(last=False)[0])
        if evicted:
            await self._drop(evicted)
            if self.redis is not None:
                await self.redis.publish({"op": "drop", "members": evicted})

    async def _drop(self, members: list[str], local_only: bool = False) -> None:
        keys, sem = [], []
        for m in members:
            kind, _, rest = m.partition(":")
            if kind == "x":
                keys.append(rest)
                if self.l1 is not None:
                    self.l1.delete(rest)
            elif kind == "s":
                partition, _, entry_id = rest.rpartition(":")
                sem.append((partition, entry_id))
                part = self.index.partitions.get(partition)
                if part is not None:
                    part.remove(entry_id)
        if self.redis is not None and not local_only:
            await self.redis.delete_exact(keys)
            await self.redis.delete_semantic(sem)

    # ------------------------------------------------------------ replica events

    async def _on_event(self, event: dict[str, Any]) -> None:
        op = event.get("op")
        if op == "add" and self.redis is not None and self.embedder is not None:
            got = await self.redis.get_semantic(event["p"], event["id"])
            if got is not None:
                vec, entry, question = got
                if entry.created >= self._purged_at:
                    self._index_add(event["p"], event["id"], vec, entry, question)
        elif op == "purge":
            self.purge_local(admin.matcher(event.get("filter") or {}), drop_remote=True)
        elif op == "drop":
            await self._drop(list(event.get("members") or []), local_only=True)
        elif op == "resync" and self.embedder is not None:
            await self._load_semantic()

    async def _load_semantic(self) -> None:
        assert self.redis is not None
        now = time.time()
        loaded = 0
        for partition, entry_id, vec, entry, q in await self.redis.load_semantic(
                self.cfg.semantic.max_entries_per_scope * 1000):
            if entry.usable(now, True) and len(vec) == self.index.dim:
                self._index_add(partition, entry_id, vec, entry, q)
                loaded += 1
        if loaded:
            log.info("semantic entries loaded from redis", count=loaded)

    # --------------------------------------------------------------------- purges

    def purge_local(self, match: Callable[[Entry], bool],
                    drop_remote: bool = False) -> tuple[int, int]:
        """Purge this replica's memory; (L1 entries, semantic entries) removed. A replica
        holds its entries' prompts and Redis does not (unless `store_prompts`), so a purge
        by content reaches the Redis copies through the replicas that hold the originals:
        the admin route deletes them with its own Redis purge (`last_purged`), a replica
        told of a purge with `drop_remote`."""
        self._purged_at = time.time()
        keys = self.l1.purge(match) if self.l1 is not None else []
        sem = self.index.purge(match)
        if self.l1 is not None:
            self.entries_gauge.labels("l1").set(len(self.l1))
        self.entries_gauge.labels("semantic").set(len(self.index))
        self._purged_keys = (keys, sem)
        if drop_remote and self.redis is not None and (keys or sem):
            t = asyncio.create_task(self._drop_remote(keys, sem))
            self._background.add(t)
            t.add_done_callback(self._background.discard)
        return len(keys), len(sem)

    async def _drop_remote(self, keys: list[str], sem: list[tuple[str, str]]) -> None:
        assert self.redis is not None
        await self.redis.delete_exact(keys)
        await self.redis.delete_semantic(sem)

    def last_purged(self) -> tuple[list[str], list[tuple[str, str]]]:
        """The exact keys and semantic ids the last `purge_local` removed."""
        return self._purged_keys
