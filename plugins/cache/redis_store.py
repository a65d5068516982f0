"""Redis for the cache: L2 exact entries, semantic entries, per-user caps, and events.

Layout (prefix P, default `weir:cache:`):
  P x:<key>          exact entry (JSON), expiring after TTL + stale grace
  P s:<partition>    hash: entry id -> {"v": base64 float32 vector, "g": guard digest,
                     "e": entry}
  P se:<partition>   sorted set: the hash's entry ids by the time each is past use (its
                     stale grace's end), so that a write deletes the expired ones without
                     reading an entry
  P u:<user hash>    sorted set of the user's entries (score: time stored), for the cap
  P t:<tenant hash>  with `max_bytes_per_tenant`: sorted set of the tenant's (account's)
                     entries (score: time stored), and P tb:<tenant hash> their sizes
  P o:<member>       with scope `global`: who stored the entry last ("<tenant hash> <user
                     hash>"), kept twice the sets' life
  P events           pub/sub channel: semantic adds, purges and cap evictions, so every
                     replica's L1 and vector index follow within a second

A stored answer is one round trip: `persist` runs one Lua script that writes the exact
entry, the semantic entry (and announces it), and counts both against the user's cap and
the bytes written against the tenant's bound (deleting and announcing what either
evicts, the tenant's oldest first: one tenant's flood never fills Redis for the others).
Ages (the sets' scores) are Redis's clock, not each replica's. A tenant's count drops
its entries that are gone on their own (expired) as it goes, a few at each write (its
oldest, and a few more in turn through the whole count; a purge takes what it deletes
off); what it holds never exceeds the bound.
An entry another tenant has stored again since, under a key they share (scope
`global`), is that tenant's now: popped, it stays; and the first tenant's count and its
user's list let go of it as it is stored again (its bytes and its place are the other's),
or, where that was past its marker's life, as they would of an entry gone on its own.
Whose an entry is, is read from its small `o:` marker, never from the entry itself.

Every read runs under `timeout_s`, every write (off the request's path) under
`write_timeout_s`: a slow Redis counts as a down Redis. Failures
never reach the client: the call returns None, a metric and a (rate-limited) log line
record it, and the next call tries again, so the cache uses Redis again once it returns.
While a failure has it marked down (what /health/ready shows), the event listener pings
it every `PING_EVERY_S`, so it is marked up again once it answers, traffic or none.
A command cancelled by the timeout makes redis-py drop that connection (redis >= 4.5.4),
so a connection is never left out of step with its replies.

No prompt text is stored unless `store_prompts` is on: entries go out without `prompt`,
semantic entries with a hash of the near-miss guard's tokens instead of the question
(`"q"` is added only with the opt-in). Keys, the user index and the events are hashes
already. The answer is stored: it is what a hit serves. So a purge by content matches
Redis entries on their answer only, unless prompts are stored; this replica's L1 and
vector index keep the prompts of the entries they hold and match them as before.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import numpy as np
from opentelemetry.trace import SpanKind
from prometheus_client import Counter
from redis.exceptions import OutOfMemoryError, RedisError, ResponseError

from proxy.auth import account
from proxy.redis_client import LOST, OWN_LUA, blocking_client, listen
from proxy.tasks import abandon_after, cancel_and_wait, lost_cancellation
from proxy.telemetry import OutageLog, error_fields, get_logger
from proxy.tracing import span

from .config import RedisConfig
from .entry import BadEntry, Entry
from .semantic import guard_digest
from .users import exact_member, semantic_member

log = get_logger("weir.cache.redis")


def _matches(match: Callable[[Entry], bool], entry: Entry | None) -> bool:
    return entry is not None and match(entry)


async def _or_none(call: Awaitable[Any]) -> Any:
    """A read of one key in a scan; None where the key holds another type (WRONGTYPE):
    one stray key must not stop a scan over the rest."""
    try:
        return await call
    except ResponseError:
        return None
T = TypeVar("T")
EventHandler = Callable[[dict[str, Any]], Awaitable[None]]

# KEYS: exact entry, semantic hash, the owner's sorted set, the tenant's sorted set and
# the tenant's sizes (a hash: member -> bytes, '#' -> their total, '@' -> the rank the
# next write looks from for entries gone on their own), the semantic hash's expiry times.
# ARGV: exact JSON ("": none), its PX; semantic field ("": none), its value, the hash's
# PX, the events channel, the add event; the cap, the sets' PX, whether tenants share
# keys ('1': scope `global`; ages are Redis's `TIME`, one clock for every replica); the key
# prefix, this replica; the tenant's bound in bytes (0: none), the exact and semantic
# members, the tenant (account); when the semantic entry is past use (its stale grace's
# end, seconds since the epoch); the members. The members popped past the caps are
# deleted here too (their keys cannot be named in KEYS before the pop: a standalone
# Redis, as the rest of the cache assumes) and announced in one drop event.
_PERSIST = OWN_LUA + """
-- (entries' ages on Redis's clock: a replica whose clock ran ahead stored entries that
-- looked newer than every other replica's, and the caps evicted those first)
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1e6
local prefix, tcap = ARGV[11], tonumber(ARGV[13])
local shared = ARGV[10] == '1'  -- (scope `global`: every tenant's keys are one)
local evicted = {}
local function drop(m)
  evicted[#evicted + 1] = m
  local kind, rest = string.sub(m, 1, 2), string.sub(m, 3)
  if kind == 'x:' then
    redis.call('DEL', prefix .. 'x:' .. rest)
  elseif kind == 's:' then
    local part, id = string.match(rest, '^(.*):([^:]*)$')
    if part then
      redis.call('HDEL', prefix .. 's:' .. part, id)
      redis.pcall('ZREM', prefix .. 'se:' .. part, id)
    end
  end
  if shared then redis.call('DEL', prefix .. 'o:' .. m) end
end
-- With keys every tenant shares (`shared`), a small key beside each
-- entry, P o:<member>, names who stored it last: "<tenant hash> <user hash>" (the
-- suffixes of its tenant's count and its user's list). Whose an entry is, is read there,
-- never by reading (and decoding) the entry itself.
local mine_t = string.sub(KEYS[4], #prefix + 3)
local mine = mine_t .. ' ' .. string.sub(KEYS[3], #prefix + 3)
local function marker(m)
  if not shared then return nil end
  local v = redis.pcall('GET', prefix .. 'o:' .. m)
  if type(v) == 'string' then return v end
  return nil
end
-- An entry the previous version stored has no marker (for a day, its entries' life):
-- whose it is is read from the entry, as that version read it (its tenant, the account
-- before any '~'): this tenant's, its user unknown ('<tenant hash> ?': any of its
-- users', as that version took it), left in a marker (read once); or another tenant's
-- ('- -', to this tenant only: a marker says whose an entry is to every tenant, and
-- that tenant's hash cannot be made here; marked so, its own tenant took it for
-- another's too, and never deleted it past its caps. Not marked: each list holding it
-- reads it once, as it pops it or takes it off its count).
local function owner(m)
  local v = marker(m)
  if v ~= nil or not shared then return v end
  local kind, rest, raw = string.sub(m, 1, 2), string.sub(m, 3), nil
  if kind == 'x:' then
    raw = redis.pcall('GET', prefix .. 'x:' .. rest)
  elseif kind == 's:' then
    local part, id = string.match(rest, '^(.*):([^:]*)$')
    local h = part and redis.pcall('HGET', prefix .. 's:' .. part, id)
    if type(h) == 'string' then
      local ok, d = pcall(cjson.decode, h)
      if ok and type(d) == 'table' then raw = d.e end
    end
  end
  if type(raw) ~= 'string' then return nil end
  local ok, e = pcall(cjson.decode, raw)
  if not (ok and type(e) == 'table' and type(e.tenant) == 'string') then return nil end
  if string.match(e.tenant, '^[^~]*') ~= ARGV[16] then return '- -' end
  v = mine_t .. ' ?'
  redis.call('SET', prefix .. 'o:' .. m, v, 'PX', 2 * tonumber(ARGV[9]))
  return v
end
-- Whether the entry under member `m` is now another tenant's (stored again by another
-- once this tenant's copy was gone): popped from this tenant's count or its user's
-- list, it is not theirs to delete.
local function theirs(m)
  local o = owner(m)
  return o ~= nil and string.match(o, '^%S*') ~= mine_t
end
-- Whether it is now another user's (of this tenant or another).
local function others(m)
  local o = owner(m)
  return o ~= nil and o ~= mine and o ~= mine_t .. ' ?'
end
local function untally(m)
  local size = tonumber(redis.call('HGET', KEYS[5], m))
  if size then
    redis.call('HDEL', KEYS[5], m)
    redis.call('HINCRBY', KEYS[5], '#', -size)
  end
  redis.call('ZREM', KEYS[4], m)
end
-- Whether the entry under member `m` is still held (not expired, not deleted).
local function held(m)
  local kind, rest = string.sub(m, 1, 2), string.sub(m, 3)
  if kind == 'x:' then return redis.call('EXISTS', prefix .. 'x:' .. rest) == 1 end
  local part, id = string.match(rest, '^(.*):([^:]*)$')
  return kind == 's:' and part ~= nil
    and redis.pcall('HEXISTS', prefix .. 's:' .. part, id) == 1
end
local function tally(m, size)
  own(KEYS[4], 'zset')
  own(KEYS[5], 'hash')
  local old = tonumber(redis.call('HGET', KEYS[5], m)) or 0
  redis.call('HSET', KEYS[5], m, size)
  redis.call('HINCRBY', KEYS[5], '#', size - old)
  redis.call('ZADD', KEYS[4], now, m)
end
-- (scope `global`) The entry under member `m` is this user's now: its marker says so,
-- and the user and tenant who stored it before (their copy gone, or stored again
-- without reading it) let go of it at once: left on their list and count it cost them
-- a place under the user's cap and its bytes under the tenant's bound until popped. The
-- marker outlives the entry (twice the sets' life), so that the next owner finds it.
local function claim(m)
  local o = prefix .. 'o:' .. m
  local was = marker(m)
  if was ~= nil and was ~= mine then
    local t, u = string.match(was, '^(%S*) (%S*)$')
    if u and prefix .. 'u:' .. u ~= KEYS[3] then
      redis.pcall('ZREM', prefix .. 'u:' .. u, m)
    end
    if t and t ~= mine_t then
      local sizes = prefix .. 'tb:' .. t
      local size = redis.pcall('HGET', sizes, m)
      if type(size) == 'string' and tonumber(size) then
        redis.call('HDEL', sizes, m)
        redis.call('HINCRBY', sizes, '#', -tonumber(size))
      end
      redis.pcall('ZREM', prefix .. 't:' .. t, m)
    end
  end
  redis.call('SET', o, mine, 'PX', 2 * tonumber(ARGV[9]))
end
-- (an entry larger than the tenant's whole bound is not stored, as L1 keeps none)
if ARGV[1] ~= '' and (tcap == 0 or #ARGV[1] <= tcap) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  if tcap > 0 then tally(ARGV[14], #ARGV[1]) end
  if shared then claim(ARGV[14]) end
end
if ARGV[3] ~= '' and (tcap == 0 or #ARGV[4] <= tcap) then
  own(KEYS[2], 'hash')
  redis.call('HSET', KEYS[2], ARGV[3], ARGV[4])
  redis.call('PEXPIRE', KEYS[2], ARGV[5])
  if tcap > 0 then tally(ARGV[15], #ARGV[4]) end
  if shared then claim(ARGV[15]) end
  -- Its entries past use go (every write keeps the hash alive, so an entry whose
  -- owner's list expired stayed in it for good): up to 16 a write, found by their times
  -- in P se:<partition>, never by reading an entry (this write's own is never one).
  own(KEYS[6], 'zset')
  redis.call('ZADD', KEYS[6], ARGV[17], ARGV[3])
  redis.call('PEXPIRE', KEYS[6], ARGV[5])
  local past = redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', '(' .. now, 'LIMIT', 0, 16)
  for _, id in ipairs(past) do
    if id ~= ARGV[3] then
      redis.call('HDEL', KEYS[2], id)
      redis.call('ZREM', KEYS[6], id)
    end
  end
  -- Entries stored before the times were kept (an earlier version's) are not in the
  -- set: while the hash holds more than the set, two at random are read once, and go
  -- if past use, else join the set with their time (unreadable ones with none: +inf).
  if redis.call('HLEN', KEYS[2]) > redis.call('ZCARD', KEYS[6]) then
    local some = redis.pcall('HRANDFIELD', KEYS[2], 2, 'WITHVALUES')
    if type(some) == 'table' and not some.err then
      for j = 1, #some - 1, 2 do
        if redis.call('ZSCORE', KEYS[6], some[j]) == false then
          local ok, d = pcall(cjson.decode, some[j + 1])
          local e = ok and type(d) == 'table' and type(d.e) == 'string' and d.e
          if e then ok, e = pcall(cjson.decode, e) end
          local til = '+inf'
          if ok and type(e) == 'table' and type(e.expires) == 'number'
              and type(e.stale_until) == 'number' then
            til = math.max(e.expires, e.stale_until)
          end
          if til ~= '+inf' and til < now then
            redis.call('HDEL', KEYS[2], some[j])
          else
            redis.call('ZADD', KEYS[6], til, some[j])
          end
        end
      end
    end
  end
  redis.call('PUBLISH', ARGV[6], ARGV[7])
end
if #ARGV >= 18 then
  own(KEYS[3], 'zset')
  for i = 18, #ARGV do redis.call('ZADD', KEYS[3], now + (i - 18) * 1e-4, ARGV[i]) end
  redis.call('PEXPIRE', KEYS[3], ARGV[9])
  local over = redis.call('ZCARD', KEYS[3]) - tonumber(ARGV[8])
  if over > 0 then
    local popped = redis.call('ZPOPMIN', KEYS[3], over)
    for j = 1, #popped, 2 do
      -- (one another user of this tenant stored again stays in the tenant's count)
      if not others(popped[j]) then
        drop(popped[j])
        if tcap > 0 then untally(popped[j]) end
      elseif tcap > 0 and theirs(popped[j]) then
        untally(popped[j])
      end
    end
  end
end
if tcap > 0 and redis.call('EXISTS', KEYS[4]) == 1 then
  -- Its entries gone on their own (expired: an L2 TTL shorter than the semantic
  -- layer's) leave the count first (they held it until popped, and their live semantic
  -- twins, as old, were evicted for bytes no longer held). A few a write: its oldest 8,
  -- and 8 more from where the last write stopped ('@' in its sizes), in turn through
  -- the whole count (with the oldest 8 alone, once those were live semantic entries the
  -- expired exact entries behind them were never looked at again).
  local at = math.max(8, tonumber(redis.call('HGET', KEYS[5], '@')) or 8)
  if at >= redis.call('ZCARD', KEYS[4]) then at = 8 end
  local looked = redis.call('ZRANGE', KEYS[4], 0, 7)
  for _, m in ipairs(redis.call('ZRANGE', KEYS[4], at, at + 7)) do
    looked[#looked + 1] = m
  end
  local gone = 0
  for _, m in ipairs(looked) do
    -- (with shared keys: one another tenant stored again once this tenant's copy was
    -- gone, its marker left before it was found, is not held by this tenant either)
    if not held(m) or theirs(m) then
      untally(m)
      gone = gone + 1
    end
  end
  redis.call('HSET', KEYS[5], '@', at + 8 - gone)
  -- The tenant's oldest entries go while its entries take more than its bound (one
  -- tenant filling Redis evicted every other tenant's entries at its maxmemory).
  local total = tonumber(redis.call('HGET', KEYS[5], '#')) or 0
  while total > tcap do
    local popped = redis.call('ZPOPMIN', KEYS[4])
    if #popped == 0 then break end
    total = total - (tonumber(redis.call('HGET', KEYS[5], popped[1])) or 0)
    redis.call('HDEL', KEYS[5], popped[1])
    if not theirs(popped[1]) then drop(popped[1]) end
  end
  if redis.call('EXISTS', KEYS[4]) == 1 then
    redis.call('HSET', KEYS[5], '#', total)
    redis.call('PEXPIRE', KEYS[4], ARGV[9])
    redis.call('PEXPIRE', KEYS[5], ARGV[9])
  else
    redis.call('DEL', KEYS[5])
  end
end
if #evicted > 0 then
  redis.call('PUBLISH', ARGV[6], cjson.encode({op = 'drop', members = evicted,
                                               ['from'] = ARGV[12]}))
end
return evicted
"""

# A purged entry out of Redis and out of its tenant's count (left in it, its bytes held
# the bound until they aged out, evicting the tenant's older live entries meanwhile).
# KEYS: the exact entry or the semantic hash, the tenant's sorted set and sizes, the
# semantic hash's expiry times. ARGV: the hash's field ("": an exact entry), the member.
# How many were deleted (0 or 1).
_FORGET = """
local n
if ARGV[1] == '' then n = redis.call('DEL', KEYS[1])
else
  n = redis.call('HDEL', KEYS[1], ARGV[1])
  redis.pcall('ZREM', KEYS[4], ARGV[1])
end
if redis.call('TYPE', KEYS[3])['ok'] == 'hash' then
  local size = tonumber(redis.call('HGET', KEYS[3], ARGV[2]))
  if size then
    redis.call('HDEL', KEYS[3], ARGV[2])
    redis.call('HINCRBY', KEYS[3], '#', -size)
  end
end
if redis.call('TYPE', KEYS[2])['ok'] == 'zset' then redis.call('ZREM', KEYS[2], ARGV[2]) end
return n
"""


class RedisStore:
    def __init__(self, cfg: RedisConfig, errors: Counter, replica: str,
                 shared_keys: bool = False) -> None:
        """`shared_keys`: every tenant's requests have one key (scope `global`), so a
        key one tenant stored may be stored again by another once it expired."""
        assert cfg.url
        self.cfg = cfg
        self.shared_keys = shared_keys
        self.p = cfg.key_prefix
        self.replica = replica
        self._errors = errors
        self._outage = OutageLog()
        self.client = blocking_client(cfg.url, max(cfg.timeout_s, cfg.write_timeout_s),
                                      cfg.max_connections,
                                      health_check_interval=5)
        self._listener: asyncio.Task[None] | None = None
        self._persist = self.client.register_script(_PERSIST)
        self._forget_script = self.client.register_script(_FORGET)
        self.healthy = True
        #: Redis refused the last write at its `maxmemory` (noeviction): reads answer,
        #: stores are skipped until a write lands. Not down: replicas cannot fix it.
        self.full = False
        self._full_log = OutageLog()

    async def start(self, on_event: EventHandler) -> None:
        self._listener = asyncio.create_task(self._listen(on_event))

    async def close(self) -> None:
        await cancel_and_wait(self._listener)
        await self.client.aclose()

    async def _call(self, op: str, fn: Callable[[], Awaitable[T]],
                    write: bool = False) -> T | None:
        try:
            with lost_cancellation(), span(f"redis {op}", kind=SpanKind.CLIENT,
                                           **{"db.system": "redis"}):
                result = await abandon_after(fn(), self.cfg.write_timeout_s if write
                                      else self.cfg.timeout_s)
        except OutOfMemoryError:
            self._refused(op)
            return None
        except (RedisError, OSError, TimeoutError) as e:
            if isinstance(e, ResponseError) and str(e).startswith("WRONGTYPE"):
                # A stray key of another type under the cache's name (a hand edit):
                # what it holds cannot be read, a miss; Redis answered, it is not down.
                self._unreadable(op, BadEntry("key of another type"))
                return None
            self._failed(op, e)
            return None
        if not self.healthy:
            self.healthy = True
            if self._outage.back():
                log.info("redis is back", op=op)
        if op == "persist":  # (a delete or a PUBLISH runs at `maxmemory` too: no sign)
            self._room(op)
        return result

    def _room(self, op: str) -> None:
        """A write that takes memory landed: Redis is not full (any longer)."""
        if self.full:
            self.full = False
            if self._full_log.back():
                log.info("redis takes writes again", op=op)

    def _refused(self, op: str) -> None:
        """A write Redis refused at its `maxmemory` (policy noeviction). It answers, so
        it is not down (a read that fails says so): the cache serves from it and skips
        its stores, counted as `op="full"`, and says so in /health/ready ("full"). It
        used to count as down: every read marked it up again, and each replica's
        health and log flapped between the two for a condition none of them can fix."""
        self.full = True
        self._errors.labels("full").inc()
        if self._full_log.down():
            log.warning("redis is full (maxmemory): serving from it, storing nothing",
                        op=op)

    def _failed(self, op: str, e: BaseException) -> None:
        self.healthy = False
        self._errors.labels(op).inc()
        if self._outage.down(op):
            log.warning("redis unavailable; serving without it", op=op, error=type(e).__name__)

    # -------------------------------------------------------------------- exact

    async def get_exact(self, key: str) -> Entry | None:
        """The entry under `key`; None for none, or for one that cannot be read (a miss:
        the answer generated again overwrites it)."""
        raw = await self._call("get", lambda: self.client.get(self.p + "x:" + key))
        return self._read(raw, "exact") if raw else None

    def _read(self, raw: str | bytes, kind: str) -> Entry | None:
        try:
            return Entry.from_json(raw)
        except BadEntry as e:
            self._unreadable(kind, e)
            return None

    def _unreadable(self, kind: str, e: BadEntry) -> None:
        """A stored entry this version cannot read: skipped (garbage, or another
        version's shape), counted and logged (what field, never its value)."""
        log.warning("unreadable cache entry in redis skipped", kind=kind, field=e.field[:40])

    # ----------------------------------------------------------------- semantic

    def _pack(self, vec: np.ndarray, entry: str, question: str) -> str:
        """A semantic entry: its vector, the guard's digest, the entry's JSON (with the
        prompt only when prompts may be stored, and then the question too)."""
        d = {"v": base64.b64encode(vec.astype("<f4").tobytes()).decode(),
             "g": guard_digest(question), "e": entry}
        if self.cfg.store_prompts:
            d["q"] = question
        return json.dumps(d, separators=(",", ":"))

    @staticmethod
    def _unpack(raw: str | bytes) -> tuple[np.ndarray, Entry, str]:
        """(vector, entry, the question or, when it was not stored, its guard digest);
        BadEntry where any of it cannot be read."""
        try:
            d = json.loads(raw)
            question = d.get("q") or d["g"]
            vec = np.frombuffer(base64.b64decode(d["v"], validate=True),
                                dtype="<f4").astype(np.float32)
            if not isinstance(question, str) or not isinstance(d["e"], str | bytes) or (
                    not len(vec) or not np.isfinite(vec).all()
                    or float(np.dot(vec, vec)) > 1.0 + 1e-3):
                # (a NaN, or a vector longer than an embedding's unit length, would win
                # every search in its partition)
                raise TypeError
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
            raise BadEntry("semantic entry") from None
        return vec, Entry.from_json(d["e"]), question

    def _unpacked(self, raw: str | bytes) -> tuple[np.ndarray, Entry, str] | None:
        try:
            return self._unpack(raw)
        except BadEntry as e:
            self._unreadable("semantic", e)
            return None

    async def get_semantic(self, partition: str, entry_id: str,
                           ) -> tuple[np.ndarray, Entry, str] | None:
        raw = await self._call("hget", lambda: self.client.hget(self.p + "s:" + partition,
                                                                entry_id))
        return self._unpacked(raw) if raw else None

    async def delete_semantic(self, items: list[tuple[str, str]]) -> None:
        if not items:
            return

        async def run() -> Any:
            async with self.client.pipeline(transaction=True) as pipe:  # (with its time)
                for partition, entry_id in items:
                    pipe.hdel(self.p + "s:" + partition, entry_id)
                    pipe.zrem(self.p + "se:" + partition, entry_id)
                return await pipe.execute()

        await self._call("hdel", run, write=True)

    async def load_semantic(self, limit: int, max_bytes: int | None = None,
                            keep: Callable[[Entry, str], bool] | None = None,
                            ) -> list[tuple[str, str, np.ndarray, Entry, str]]:
        """Every stored semantic entry (up to `limit`, and up to about `max_bytes` of them
        as stored: the index could hold no more, and all of Redis's read at once could
        take gigabytes), for a replica that starts or resyncs. `keep`: whether an entry
        with its question (or digest) is wanted; those it refuses are not held (nor
        counted: Redis keeps expired entries while their partition is written to)."""
        out: list[tuple[str, str, np.ndarray, Entry, str]] = []
        held = 0
        try:
            async with asyncio.timeout(max(5.0, self.cfg.timeout_s * 100)):
                async for name in self.client.scan_iter(match=self.p + "s:*", count=500):
                    partition = _s(name)[len(self.p) + 2:]
                    for entry_id, raw in (await _or_none(self.client.hgetall(name)) or {}
                                          ).items():
                        if (got := self._unpacked(raw)) is None:
                            continue
                        vec, entry, q = got
                        if keep is not None and not keep(entry, q):
                            continue
                        out.append((partition, _s(entry_id), vec, entry, q))
                        held += len(raw)
                        if len(out) >= limit or (max_bytes is not None and held >= max_bytes):
                            return out
        except (RedisError, OSError, TimeoutError) as e:
            self._failed("load", e)
        return out

    # --------------------------------------------------------------- user caps

    def user_key(self, tenant: str, user: str) -> str:
        return self.p + "u:" + hashlib.sha256(f"{tenant}\x00{user}".encode()).hexdigest()[:32]

    def tenant_keys(self, owner: str) -> tuple[str, str]:
        """The tenant's (account's) entries, oldest first, and their sizes in bytes."""
        h = hashlib.sha256(owner.encode()).hexdigest()[:32]
        return self.p + "t:" + h, self.p + "tb:" + h

    # ------------------------------------------------------------------- store

    async def persist(self, entry: Entry, exact: bool, exact_ttl_s: float,
                      semantic: tuple[str, np.ndarray, str] | None, semantic_entry: Entry,
                      semantic_ttl_s: float, members: list[str], cap: int,
                      user_ttl_s: float, owner: str | None = None) -> list[str] | None:
        """Store an answer in one round trip: the exact entry (when `exact`: L2 is on),
        the semantic one (`(partition, vector, question)`, its entry as that layer keeps
        it: `semantic_entry`) with its add event, and `members` counted against the
        user's cap; with `max_bytes_per_tenant`, the bytes written counted against the
        bound of `owner` (the tenant's account; by default the entry's tenant's). The
        members evicted past either (already deleted from Redis and announced to the
        other replicas), or None when Redis could not be reached."""
        data = entry.to_json(with_prompt=self.cfg.store_prompts) if exact else ""
        field = value = event = ""
        if semantic is not None:
            partition, vec, question = semantic
            field, value = entry.key, self._pack(
                vec, semantic_entry.to_json(with_prompt=self.cfg.store_prompts), question)
            event = self._event({"op": "add", "p": partition, "id": entry.key})
        partition = semantic[0] if semantic is not None else ""
        owner = account(entry.tenant) if owner is None else owner
        keys = [self.p + "x:" + entry.key, self.p + "s:" + partition,
                self.user_key(entry.tenant, entry.user), *self.tenant_keys(owner),
                self.p + "se:" + partition]
        args: list[str | int] = [
            data, _px(exact_ttl_s), field, value, _px(semantic_ttl_s),
            self.p + "events", event, cap, _px(user_ttl_s), "1" if self.shared_keys else "",
            self.p,
            self.replica, self.cfg.max_bytes_per_tenant or 0, exact_member(entry.key),
            semantic_member(partition, entry.key), owner,
            repr(max(semantic_entry.expires, semantic_entry.stale_until)), *members]
        popped = await self._call("persist", lambda: self._persist(keys=keys, args=args),
                                 write=True)
        return None if popped is None else [_s(m) for m in popped]

    async def release(self, tenant: str, user: str, members: list[str]) -> None:
        """Take `members` off the owner's list: parts counted against the cap ahead of
        time and then never stored (a pending answer dropped before its vector came)."""
        if members:
            await self._call("zrem", lambda: self.client.zrem(self.user_key(tenant, user),
                                                              *members), write=True)

    async def delete_exact(self, keys: list[str]) -> None:
        if keys:
            await self._call("del", lambda: self.client.delete(*[self.p + "x:" + k
                                                                 for k in keys]), write=True)

    # ------------------------------------------------------------------- purge

    async def purge(self, match: Callable[[Entry], bool], keys: list[str] | None = None,
                    semantic_ids: list[tuple[str, str]] | None = None,
                    owned: Callable[[Entry], bool] | None = None,
                    ) -> tuple[int, int] | None:
        """Delete matching exact and semantic entries, and the ones named (a replica's
        own matches: it knows their prompts, Redis may not) whose copy here `owned`
        accepts (the filter's owner fields: with scope `global`, the copy a replica
        matched may be one tenant's where Redis holds another's, stored again since under
        the key they share); (exact, semantic) counts. An entry that cannot be read
        cannot be shown not to match: it goes too (not counted), and a key of another
        type is passed over."""
        exact = semantic = 0
        named = {self.p + "x:" + k for k in keys or []}
        named_sem = {(self.p + "s:" + part, eid) for part, eid in semantic_ids or []}
        try:
            async with asyncio.timeout(max(30.0, self.cfg.timeout_s * 200)):
                async for name in self.client.scan_iter(match=self.p + "x:*", count=500):
                    raw = await _or_none(self.client.get(name))
                    if not raw:
                        continue
                    key = name.decode() if isinstance(name, bytes) else name
                    entry = self._read(raw, "exact")
                    if entry is None:
                        await self.client.delete(name)
                    elif (key in named and (owned is None or owned(entry))) or match(entry):
                        exact += await self._forget(key, "", entry)
                async for name in self.client.scan_iter(match=self.p + "s:*", count=500):
                    hname = name.decode() if isinstance(name, bytes) else name
                    for entry_id, raw in (await _or_none(self.client.hgetall(name)) or {}
                                          ).items():
                        eid = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
                        got = self._unpacked(raw)
                        if got is None:
                            await self._unset(hname, eid)
                        elif (((hname, eid) in named_sem
                               and (owned is None or owned(got[1]))) or match(got[1])):
                            semantic += await self._forget(hname, eid, got[1])
        except (RedisError, OSError, TimeoutError) as e:
            self._failed("purge", e)
            return None
        return exact, semantic

    async def _forget(self, name: str, field: str, entry: Entry) -> int:
        """Delete a purged entry (exact: key `name`; semantic: `field` of hash `name`),
        and with `max_bytes_per_tenant` take it off its tenant's count too."""
        rest = name[len(self.p) + 2:]  # past the prefix and `x:` / `s:`
        if not self.cfg.max_bytes_per_tenant:
            if not field:
                return int(await self.client.delete(name))
            return await self._unset(name, field)
        member = semantic_member(rest, field) if field else exact_member(rest)
        return int(await self._forget_script(
            keys=[name, *self.tenant_keys(account(entry.tenant)),
                  self.p + "se:" + rest], args=[field, member]))

    async def _unset(self, name: str, field: str) -> int:
        """Delete semantic entry `field` of hash `name` and its time (P se:), in one
        transaction: apart, a write of the same entry between them left its time without
        it, or it without its time. How many were deleted (0 or 1)."""
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hdel(name, field)
            pipe.zrem(self.p + "se:" + name[len(self.p) + 2:], field)
            # (a time key of another type fails its own command only)
            deleted = (await pipe.execute(raise_on_error=False))[0]
        if isinstance(deleted, Exception):
            raise deleted
        return int(deleted)

    async def count(self, match: Callable[[Entry], bool] | None = None,
                    ) -> dict[str, int] | None:
        """Exact and semantic entries in Redis (those `match` accepts, if given)."""
        async def run() -> dict[str, int]:
            exact = semantic = 0
            async for name in self.client.scan_iter(match=self.p + "x:*", count=1000):
                if match is None:
                    exact += 1
                else:
                    raw = await _or_none(self.client.get(name))
                    exact += bool(raw and _matches(match, self._read(raw, "exact")))
            async for name in self.client.scan_iter(match=self.p + "s:*", count=1000):
                if match is None:
                    semantic += await _or_none(self.client.hlen(name)) or 0
                else:
                    held = await _or_none(self.client.hgetall(name)) or {}
                    semantic += sum(got is not None and match(got[1])
                                    for got in map(self._unpacked, held.values()))
            return {"exact": exact, "semantic": semantic}

        try:
            async with asyncio.timeout(10):
                return await run()
        except (RedisError, OSError, TimeoutError, ValueError) as e:
            self._failed("count", e)
            return None

    # ------------------------------------------------------------------ events

    def _event(self, event: dict[str, Any]) -> str:
        return json.dumps({**event, "from": self.replica}, separators=(",", ":"))

    async def publish(self, event: dict[str, Any]) -> bool:
        """Whether Redis took the event (to pass on to every replica). A purge's events
        are also kept a while (`EVENT_LOG_S`) for a replica whose listener was away:
        pub/sub keeps nothing (`events_since`)."""
        data = self._event(event)
        if event.get("op") not in _LOGGED:
            return await self._call("publish",
                                    lambda: self.client.publish(self.p + "events", data),
                                    write=True) is not None

        async def publish_and_log() -> Any:
            now = time.time()
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.publish(self.p + "events", data)
                pipe.zadd(self.p + "eventlog", {data: now})
                pipe.zremrangebyscore(self.p + "eventlog", "-inf", now - EVENT_LOG_S)
                pipe.pexpire(self.p + "eventlog", _px(EVENT_LOG_S))
                done = await pipe.execute(raise_on_error=False)
            # The event went out (PUBLISH is allowed at `maxmemory`): a log that Redis
            # refused for lack of room loses only the replay for a listener that was
            # away. It failed the purge (a 503 for a purge that had deleted and told
            # everything), on every retry, where a purge is how room is made.
            if isinstance(done[0], Exception):
                raise done[0]
            if isinstance(done[1], OutOfMemoryError):
                self._refused("eventlog")
            elif not isinstance(done[1], Exception):
                self._room("eventlog")
            elif isinstance(done[1], ResponseError) and str(done[1]).startswith("WRONGTYPE"):
                # A stray key of another type where the log goes (a hand edit): replaced,
                # as the persist script replaces one; it failed every purge (a 503).
                async with self.client.pipeline(transaction=True) as pipe:
                    pipe.delete(self.p + "eventlog")
                    pipe.zadd(self.p + "eventlog", {data: now})
                    pipe.pexpire(self.p + "eventlog", _px(EVENT_LOG_S))
                    await pipe.execute()
            elif isinstance(done[1], Exception):
                raise done[1]
            return done

        return await self._call("publish", publish_and_log, write=True) is not None

    async def events_since(self, since: float) -> list[dict[str, Any]] | None:
        """The purge events other replicas published since `since` (their clocks), oldest
        first; None when Redis cannot say."""
        raw = await self._call("eventlog", lambda: self.client.zrangebyscore(
            self.p + "eventlog", since, "+inf"))
        if raw is None:
            return None
        events = []
        for data in raw:
            try:
                event = json.loads(data) if isinstance(data, str | bytes) else None
            except ValueError:
                continue
            if (isinstance(event, dict) and event.get("op") in _LOGGED
                    and event.get("from") != self.replica):
                events.append(event)
        return events

    async def _handle(self, data: Any, on_event: EventHandler) -> None:
        """One event: one that cannot be read, or whose handling fails, is logged and
        skipped; the listener goes on (it had died on one, and purges then stopped
        reaching this replica while Redis and /health/ready looked fine)."""
        try:
            event = json.loads(data)
            if not isinstance(event, dict) or not isinstance(event.get("op"), str):
                raise BadEntry("event")
            if event.get("from") != self.replica:
                await on_event(event)
        except asyncio.CancelledError:
            raise
        except (RedisError, OSError, TimeoutError):
            raise  # the connection's: the listener reconnects
        except Exception as e:
            log.warning("cache event skipped", error=type(e).__name__)

    async def _listen(self, on_event: EventHandler) -> None:
        lost: float | None = None  # when the listener lost Redis
        checked = float("-inf")

        async def subscribed() -> None:
            nonlocal lost, checked
            checked = float("-inf")
            if lost is not None:  # events sent while we were away are gone:
                since, lost = lost - EVENT_SKEW_S, None  # read what Redis kept
                await on_event({"op": "resync", "since": since})

        async def between() -> None:
            nonlocal checked
            if not self.healthy and time.monotonic() - checked >= PING_EVERY_S:
                # Marked down by a failed call: only a call that succeeds marks it up,
                # so with no traffic /health/ready said "down" for good after Redis
                # was back (a timeout leaves this connection up).
                checked = time.monotonic()
                await self._call("ping", self.client.ping)

        def failed(e: Exception) -> None:
            nonlocal lost
            if isinstance(e, LOST):
                self._failed("subscribe", e)
            else:  # a bug: logged, and heard again (it had ended the listener for good)
                log.error("cache event listener failed", **error_fields(e))
            lost = time.time() if lost is None else lost

        await listen(self.client, self.p + "events", wait_s=PING_EVERY_S,
                     on_message=lambda data: self._handle(data, on_event),
                     on_error=failed, on_subscribed=subscribed, between=between)


#: How often the listener asks Redis whether it is back, while marked down (only then).
PING_EVERY_S = 1.0
#: The events kept for a replica whose listener was away (`events_since`): a purge's.
_LOGGED = frozenset({"purge", "drop"})
#: How long they are kept (a listener reconnects within seconds; Redis down, nobody
#: purges: a purge without Redis is a 503), and how far before the listener lost Redis
#: a replica reads them back (other replicas' clocks may be behind).
EVENT_LOG_S = 600.0
EVENT_SKEW_S = 60.0


def _px(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def _s(v: str | bytes) -> str:
    return v.decode() if isinstance(v, bytes) else v
