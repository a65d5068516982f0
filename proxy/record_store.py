"""Where stored responses and stored chat completions live: in memory, or in the cache
plugin's Redis when it has one (one store per kind, `responses` or `chat`).

A response's record is `{"response": <Response>, "conversation": [chat messages]}` (and
`"cut"`: the calls cut in the responses before it, where there were some, and `"held"`:
the ids of those responses' items, which a follow-up may not send again; and `"said"`:
the `code` and `param` a failed response's `error` event said, which its replay says); a
chat completion's, `proxy.stored_chat`'s. Every key holds the caller's tenant, so another
tenant's id is simply not found (a 404, never a 403 that would confirm the id exists).
Records expire after `responses.ttl_s`. A record put with a summary can be listed:
`scan` reads a tenant's summaries in order (their `at`, nanoseconds since the epoch),
a window at a time from a cursor, and `get_many` the records of a page of them. A
listed record deleted or gone keeps its place a while after it would have expired: a
page cursor naming it still says where the next page starts (a client that deletes
what it lists, page by page, pages on).

In Redis each tenant's records of a kind take at most `responses.max_bytes_per_tenant`
(their JSON, summaries included): a put past it drops that tenant's oldest records, as
if deleted (never another tenant's), so one tenant cannot fill the Redis every tenant's
cache shares; a record larger than all of it is refused (`RecordTooLarge`, a 413). The
callers a gateway's key forwards for (`on_behalf_of`: each a tenant of its own, whose
records no one else reads) count with that key's tenant (`auth.account`): a gateway
cannot open a bound for each name it makes up.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, Protocol, TypeVar

from redis.exceptions import RedisError

from .auth import account
from .errors import RecordTooLarge, Unavailable
from .redis_client import LOST, OWN_LUA, blocking_client, listen
from .settings import DEFAULT_MAX_BYTES_PER_TENANT, ResponsesSettings
from .streaming import dumps  # (a lone surrogate kept as its escape)
from .tally import Tally
from .tasks import abandon_after, lost_cancellation
from .telemetry import OutageLog, error_fields, get_logger

log = get_logger("weir.responses")

Record = dict[str, Any]
T = TypeVar("T")
#: What a listing reads of a record (its `id` and what it is filtered and sorted by).
Summary = dict[str, Any]


class RecordStore(Protocol):
    #: The most one tenant's records may take (bytes), so the largest record it can keep;
    #: None: no such bound (in memory, where `max_in_memory` counts records).
    max_bytes: int | None
    #: The longest one call may take before it gives up (0: in memory, never waits).
    timeout_s: float

    async def get(self, tenant: str, record_id: str) -> Record | None: ...

    async def get_many(self, tenant: str, ids: list[str]) -> list[Record | None]: ...

    async def put(self, tenant: str, record_id: str, record: Record,
                  summary: Summary | None = None, fresh: bool = False) -> None:
        """`fresh`: only where no record is held under the id (one that may land after
        the record that replaces it: a stream's `in_progress` record, its write timed out
        but still on its way, must not overwrite the final one)."""
        ...

    async def replace(self, tenant: str, record_id: str, record: Record,
                      summary: Summary | None = None, fence: str | None = None) -> bool:
        """Put `record` only where one is held (False: none is), keeping its expiry.
        `fence`: only where the record held is one its writer fenced so (its `run`'s
        `fence`, see `fenced`): a write of a background run whose record was settled
        without it (cancelled from another replica, read `failed` past its lease) or
        replaced is not stored."""
        ...

    async def delete(self, tenant: str, record_id: str, fence: str | None = None) -> bool:
        """`fence`: only where the record held is one its writer fenced so (as
        `replace`): a run that could not store its end drops its own record, not one
        settled without it (cancelled from another replica)."""
        ...

    async def forget(self, tenant: str, record_id: str) -> None: ...

    async def scan(self, tenant: str, after: str | None, desc: bool, count: int,
                   ) -> tuple[list[Summary], str | None]:
        """The next `count` places of the tenant's listing after `after` (an id; None: its
        start), oldest first or newest first (`desc`): the summaries of the records still
        listed there, and the cursor to go on from (None: the listing ended). `after`
        that has no place (never listed, or gone long enough): `KeyError`."""
        ...

    async def now(self) -> float:
        """The store's clock (seconds since the epoch), which a background run's lease
        is set and judged by: one clock for every replica sharing the store (Redis's
        `TIME`), not each replica's own (a reader's clock ahead of the writer's by most
        of a lease read a healthy run as lapsed)."""
        ...

    async def close(self) -> None: ...


class MemoryStore:
    """Bounded and expiring. When full, the tenant holding the most records loses its
    oldest: a tenant can push out its own records, never a smaller tenant's (cheap
    requests, cache hits say, must not wipe another tenant's conversations). Each
    tenant's records take at most `max_bytes` (their JSON): past it, its own oldest go
    (as in Redis), so a few large conversations cannot fill the process's memory. Both
    count a configured tenant's callers behind a gateway key with it (`auth.account`):
    a gateway naming many callers is one tenant here. All tenants' records together take
    at most `max_total_bytes` (their JSON): past it the tenant holding the most loses its
    oldest (with ten tenants each at its own bound, the process held ten times it)."""

    def __init__(self, ttl_s: float, max_items: int, kind: str = "responses",
                 max_bytes: int | None = None, max_total_bytes: int | None = None) -> None:
        self.ttl_s = ttl_s
        self.timeout_s = 0.0
        self.max_items = max_items
        self.kind = kind
        self.max_bytes = max_bytes
        self.max_total_bytes = max_total_bytes if max_bytes is not None else None
        self._records = Tally()  # account -> how many records it holds (and in all)
        #: tenant -> id -> (expires, record, summary, size), oldest first
        self._items: dict[str, OrderedDict[
            str, tuple[float, Record, Summary | None, int]]] = {}
        #: account -> (tenant, id) of its tenants' records, oldest first
        self._aged: dict[str, OrderedDict[tuple[str, str], None]] = {}
        self._bytes = Tally()  # account -> the sizes of its records (and their sum)
        #: tenant -> id -> (kept until, summary) of listed records gone, oldest first
        self._gone: dict[str, OrderedDict[str, tuple[float, Summary]]] = {}
        self._gone_count = 0
        #: tenant -> its places sorted by (at, id), and each id's index; dropped at each
        #: change (a listing's windows read one sort, not one each)
        self._places: dict[str, tuple[list[tuple[Any, str, Summary | None]], dict[str, int]]] = {}

    def __len__(self) -> int:
        return self._records.total

    def _size(self, record: Record, summary: Summary | None) -> int:
        """A record's size (its JSON, and its summary's), where a bound counts it; past
        the whole bound, it is refused."""
        if self.max_bytes is None:
            return 0
        size = len(dumps(record)) + (
            len(dumps(summary)) if summary is not None else 0)
        if size > self.max_bytes:
            raise too_large(self.kind, size, self.max_bytes)
        return size

    def _held(self, tenant: str, record_id: str,
              ) -> tuple[float, Record, Summary | None, int] | None:
        records = self._items.get(tenant)
        hit = records.get(record_id) if records is not None else None
        if hit is not None and hit[0] <= time.monotonic():
            self._pop(tenant, record_id)
            return None
        return hit

    async def get(self, tenant: str, record_id: str) -> Record | None:
        hit = self._held(tenant, record_id)
        return None if hit is None else hit[1]

    async def get_many(self, tenant: str, ids: list[str]) -> list[Record | None]:
        return [await self.get(tenant, i) for i in ids]

    async def put(self, tenant: str, record_id: str, record: Record,
                  summary: Summary | None = None, fresh: bool = False) -> None:
        size = self._size(record, summary)
        if fresh and self._held(tenant, record_id) is not None:
            return
        self._pop(tenant, record_id, mark=False)
        self._unmark(tenant, record_id)
        self._items.setdefault(tenant, OrderedDict())[record_id] = (
            time.monotonic() + self.ttl_s, record, summary, size)
        self._aged.setdefault(account(tenant), OrderedDict())[tenant, record_id] = None
        self._records.add(account(tenant), 1)
        self._places.pop(tenant, None)
        self._fit(tenant, size)
        self._fit_total((tenant, record_id))
        while self._records.total > self.max_items:  # (the account holding the most)
            self._pop(*next(iter(self._aged[self._records.largest()])))

    async def replace(self, tenant: str, record_id: str, record: Record,
                      summary: Summary | None = None, fence: str | None = None) -> bool:
        hit = self._held(tenant, record_id)
        if hit is None or (fence is not None and fence_of(hit[1]) != fence):
            return False
        size = self._size(record, summary)
        self._items[tenant][record_id] = (hit[0], record, summary, size)
        self._places.pop(tenant, None)
        self._fit(tenant, size - hit[3], keep=record_id)
        self._fit_total((tenant, record_id))
        return True

    def _fit_total(self, keep: tuple[str, str]) -> None:
        """While all records take more than `max_total_bytes`, the account holding the
        most loses its oldest, never `keep` (the record just stored)."""
        if self.max_total_bytes is None:
            return
        while self._bytes.total > self.max_total_bytes:
            largest = self._bytes.largest()
            oldest = next((place for place in self._aged[largest] if place != keep), None)
            if oldest is None:
                return
            self._pop(*oldest)

    def _fit(self, tenant: str, grown: int, keep: str | None = None) -> None:
        """Count `grown` bytes more for the tenant's account, then drop its oldest
        records, never `keep` (the tenant's one just updated, which may be the oldest)
        nor the newest (each fits alone), while it holds more than its bound."""
        if self.max_bytes is None:
            return
        owner = account(tenant)
        self._bytes.add(owner, grown)
        aged = self._aged[owner]
        while self._bytes.get(owner) > self.max_bytes and len(aged) > 1:
            oldest = next((place for place in aged if place != (tenant, keep)), None)
            if oldest is None:
                return
            self._pop(*oldest)

    async def delete(self, tenant: str, record_id: str, fence: str | None = None) -> bool:
        hit = self._held(tenant, record_id)
        if hit is None or (fence is not None and fence_of(hit[1]) != fence):
            return False
        return self._pop(tenant, record_id)

    async def forget(self, tenant: str, record_id: str) -> None:
        """(A record gone from memory has left the listing already, keeping its place.)"""

    async def now(self) -> float:
        """(This process's records: its own clock.)"""
        return time.time()

    async def scan(self, tenant: str, after: str | None, desc: bool, count: int,
                   ) -> tuple[list[Summary], str | None]:
        now = time.monotonic()
        held = self._items.get(tenant)
        while held and (oldest := next(iter(held.items())))[1][0] <= now:
            self._pop(tenant, oldest[0])  # (puts come in expiry order: oldest first)
            held = self._items.get(tenant)
        gone = self._gone.get(tenant)
        for rid in [rid for rid, (until, _) in (gone or {}).items() if until <= now]:
            self._unmark(tenant, rid)
        if tenant not in self._places:
            places = sorted(
                [*((summary.get("at", 0), rid, summary)
                   for rid, (_, _, summary, _) in (self._items.get(tenant) or {}).items()
                   if summary is not None),
                 *((summary.get("at", 0), rid, None)
                   for rid, (_, summary) in (self._gone.get(tenant) or {}).items())],
                key=lambda p: (p[0], p[1]))
            self._places[tenant] = places, {p[1]: i for i, p in enumerate(places)}
        places, index = self._places[tenant]
        n = len(places)
        start = 0
        if after is not None:
            if after not in index:
                raise KeyError(after)
            start = index[after] + 1 if not desc else n - index[after]
        # (desc: places read from the end; `start` counts from there)
        chosen = [places[i if not desc else n - 1 - i]
                  for i in range(start, min(start + count, n))]
        more = start + count < n
        return ([summary for _, _, summary in chosen if summary is not None],
                chosen[-1][1] if more else None)

    def _pop(self, tenant: str, record_id: str, mark: bool = True) -> bool:
        records = self._items.get(tenant)
        hit = records.pop(record_id, None) if records is not None else None
        if records is None or hit is None:
            return False
        self._places.pop(tenant, None)
        owner = account(tenant)
        self._records.add(owner, -1)
        aged = self._aged[owner]
        del aged[tenant, record_id]
        self._bytes.add(owner, -hit[3])
        if not records:
            del self._items[tenant]
        if not aged:
            del self._aged[owner]
            self._bytes.set(owner, 0)
        if mark and hit[2] is not None:  # listed: its place stays a while (a cursor)
            self._unmark(tenant, record_id)
            self._gone.setdefault(tenant, OrderedDict())[record_id] = (
                max(hit[0], time.monotonic()) + _GRACE_S, hit[2])
            self._gone_count += 1
            while self._gone_count > self.max_items:
                largest = max(self._gone, key=lambda t: len(self._gone[t]))
                self._unmark(largest, next(iter(self._gone[largest])))
        return True

    def _unmark(self, tenant: str, record_id: str) -> None:
        gone = self._gone.get(tenant)
        if gone is not None and gone.pop(record_id, None) is not None:
            self._gone_count -= 1
            self._places.pop(tenant, None)
            if not gone:
                del self._gone[tenant]

    async def close(self) -> None:
        self._items.clear()
        self._aged.clear()
        self._bytes.clear()
        self._gone.clear()
        self._places.clear()
        self._records.clear()
        self._gone_count = 0


# Every script first replaces a stray key of another type (a hand edit, another program)
# at the keys it writes of the caller's tenant: it failed each of that tenant's stores,
# listings, updates and deletes with WRONGTYPE (a 503) until someone removed it. Keys of
# another tenant (of the account, in its bound) are only read, never replaced: what is not
# of the expected type there is as if absent.
_OWN_LUA = OWN_LUA + """
local function counted(n) if type(n) == 'number' then return n end return 0 end
"""
#: How long past its expiry a listing keeps a summary (replicas' clocks differ; its
#: record, gone or not, decides what a page shows).
_GRACE_S = 60.0
#: At most this many expired summaries leave the listing at each put (bounded work).
_PRUNE = 256
# A tenant's bound (`responses.max_bytes_per_tenant`; a tenant's callers behind a gateway
# key count with it, `auth.account`), kept by the scripts that write: the sizes of its
# records in a hash (`bound`, its field '' their total) and their expiries (µs, Redis's
# clock: they go as their keys do; a later put's always later, so the oldest is the first
# put) in a sorted set (`aged`), each record named by its place, `SCOPE:ID` (the records'
# key without the store's prefix; SCOPE, 32 hex digits, names its tenant's listing too).
# Each write first takes the expired out of both (a bounded number: the rest are the
# oldest, the first dropped); if the two disagree (one evicted by Redis's `maxmemory`,
# say) they are rebuilt from the records held. Dropping a record past the bound deletes it
# as DELETE does: its summary leaves the listing, its place stays (a cursor). (Its keys
# are built in the script, from ARGV: one Redis, not a cluster.)
_QUOTA_LUA = _OWN_LUA + """
local function num(x) return string.format('%.0f', x) end
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function listing_of(base, place)
  return base .. 'listing:' .. string.sub(place, 1, 32), string.sub(place, 34)
end
local function repair(quota, aging, base, now)
  local places, sizes = {}, {}
  for _, place in ipairs(redis.call('ZRANGE', aging, 0, -1)) do places[place] = true end
  local h = redis.call('HGETALL', quota)
  for i = 1, #h, 2 do
    if h[i] ~= '' then places[h[i]] = true; sizes[h[i]] = tonumber(h[i + 1]) end
  end
  redis.call('DEL', quota, aging)
  local used, longest = 0, 0
  for place in pairs(places) do
    local ttl = redis.call('PTTL', base .. place)
    if ttl > 0 then
      local listing, id = listing_of(base, place)
      local size = sizes[place] or (counted(redis.pcall('STRLEN', base .. place))
                                    + counted(redis.pcall('HSTRLEN', listing, id)))
      redis.call('HSET', quota, place, num(size))
      redis.call('ZADD', aging, num(now + ttl * 1000), place)
      used = used + size
      if ttl > longest then longest = ttl end
    end
  end
  redis.call('HSET', quota, '', num(used))
  if longest > 0 then  -- (rebuilt keys expire with the last record they count)
    redis.call('PEXPIRE', quota, longest)
    redis.call('PEXPIRE', aging, longest)
  end
end
local function settle(quota, aging, base, now)
  local n = redis.call('HLEN', quota)
  local m = redis.call('ZCARD', aging)
  local total = redis.call('HGET', quota, '')  -- (a total no HINCRBY takes: rebuilt)
  if (n == 0 and m > 0) or (n > 0 and n ~= m + 1)
     or (n > 0 and not (total and string.match(total, '^%-?%d+$'))) then
    repair(quota, aging, base, now)
    return
  end
  local gone = redis.call('ZRANGEBYSCORE', aging, '-inf', num(now), 'LIMIT', 0, 256)
  if #gone > 0 then
    local freed = 0
    for _, size in ipairs(redis.call('HMGET', quota, unpack(gone))) do
      freed = freed + (tonumber(size) or 0)
    end
    redis.call('HDEL', quota, unpack(gone))
    redis.call('ZREM', aging, unpack(gone))
    redis.call('HINCRBY', quota, '', num(-freed))
  end
end
local function evict(quota, aging, base, max, keep)
  local used = tonumber(redis.call('HGET', quota, '') or '0')
  local dropped = 0
  while used > max do
    local oldest = redis.call('ZRANGE', aging, 0, 63)
    local any = false
    for _, place in ipairs(oldest) do
      if place ~= keep then
        any = true
        used = used - (tonumber(redis.call('HGET', quota, place)) or 0)
        local listing, id = listing_of(base, place)
        redis.call('DEL', base .. place)
        redis.pcall('HDEL', listing, id)
        redis.call('HDEL', quota, place)
        redis.call('ZREM', aging, place)
        dropped = dropped + 1
        if used <= max then break end
      end
    end
    if not any then break end
  end
  redis.call('HSET', quota, '', num(used))
  return dropped
end
"""
# A record put: KEYS record, bound, aged, listing, order, expiry; ARGV id, JSON, size,
# bound, ttl (ms), the store's key prefix, summary ('': not listed), its order, its
# expiry, the listing's prune time, how many it prunes, the record's place, fresh ('1':
# only if no record is held there). Returns how many of the account's records it dropped.
_PUT_SCRIPT = _QUOTA_LUA + """
if ARGV[13] == '1' and redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
own(KEYS[2], 'hash'); own(KEYS[3], 'zset')
if ARGV[7] ~= '' then own(KEYS[4], 'hash'); own(KEYS[5], 'zset'); own(KEYS[6], 'zset') end
local now = now_us()
settle(KEYS[2], KEYS[3], ARGV[6], now)
local old = redis.call('HGET', KEYS[2], ARGV[12])
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[5])
redis.call('HSET', KEYS[2], ARGV[12], ARGV[3])
redis.call('HINCRBY', KEYS[2], '', num(tonumber(ARGV[3]) - (tonumber(old) or 0)))
local expires = now + tonumber(ARGV[5]) * 1000
local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
if last[2] and tonumber(last[2]) >= expires then expires = tonumber(last[2]) + 1 end
redis.call('ZADD', KEYS[3], num(expires), ARGV[12])
if ARGV[7] ~= '' then
  redis.call('HSET', KEYS[4], ARGV[1], ARGV[7])
  redis.call('ZADD', KEYS[5], ARGV[8], ARGV[1])
  redis.call('ZADD', KEYS[6], ARGV[9], ARGV[1])
  for i = 4, 6 do redis.call('PEXPIRE', KEYS[i], ARGV[5]) end
  -- expired places out of the listing: summaries, order and expiry index
  local gone = redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', ARGV[10], 'LIMIT', 0, ARGV[11])
  if #gone > 0 then
    redis.call('HDEL', KEYS[4], unpack(gone))
    redis.call('ZREM', KEYS[5], unpack(gone))
    redis.call('ZREM', KEYS[6], unpack(gone))
  end
end
local dropped = evict(KEYS[2], KEYS[3], ARGV[6], tonumber(ARGV[4]), ARGV[12])
redis.call('PEXPIRE', KEYS[2], ARGV[5])
redis.call('PEXPIRE', KEYS[3], ARGV[5])
return dropped
"""
# A record deleted (ARGV[2] = '1'), or found gone: its summary leaves the listing, its
# place in the order stays (a cursor), and its size the account's total. Returns whether
# a record was deleted. KEYS record, listing, bound, aged; ARGV id, deleted?, place,
# fence (as `_REPLACE_SCRIPT`'s: a record held that does not end with it is kept).
_RETIRE_SCRIPT = _OWN_LUA + """
own(KEYS[2], 'hash'); own(KEYS[3], 'hash'); own(KEYS[4], 'zset')
local deleted = 0
local held = redis.call('TYPE', KEYS[1])['ok'] == 'string'  -- (a stray is no record)
if ARGV[2] == '1' then
  if held and ARGV[4] ~= '' and string.sub(redis.call('GET', KEYS[1]), -#ARGV[4]) ~= ARGV[4]
  then
    return 0  -- (not its writer's record: settled without it)
  end
  redis.call('DEL', KEYS[1])
  if held then deleted = 1 end
elseif held then
  return 0
end
redis.call('HDEL', KEYS[2], ARGV[1])
local size = redis.call('HGET', KEYS[3], ARGV[3])
if size then
  redis.call('HDEL', KEYS[3], ARGV[3])
  redis.call('ZREM', KEYS[4], ARGV[3])
  redis.call('HINCRBY', KEYS[3], '', string.format('%.0f', -tonumber(size)))
end
return deleted
"""
# The next ARGV[3] places of the order after ARGV[1] (an id; '': from the start), newest
# first if ARGV[2] = '1': {ids, their summaries (nil: not listed), the last one's score};
# nil if ARGV[1] has no place. ARGV[4]: the score ARGV[1] had ('': none known), to go on
# from if its place was pruned meanwhile.
_SCAN_SCRIPT = _OWN_LUA + """
own(KEYS[1], 'zset'); own(KEYS[2], 'hash')
local start = 0
local desc = ARGV[2] == '1'
if ARGV[1] ~= '' then
  local rank
  if desc then rank = redis.call('ZREVRANK', KEYS[1], ARGV[1])
  else rank = redis.call('ZRANK', KEYS[1], ARGV[1]) end
  if rank then
    start = rank + 1
  elseif ARGV[4] ~= '' then
    -- the places before its score, and those of its score before its id
    local tied = redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[4], ARGV[4])
    if desc then start = redis.call('ZCOUNT', KEYS[1], '(' .. ARGV[4], '+inf')
    else start = redis.call('ZCOUNT', KEYS[1], '-inf', '(' .. ARGV[4]) end
    for _, id in ipairs(tied) do
      if (desc and id > ARGV[1]) or (not desc and id < ARGV[1]) then start = start + 1 end
    end
  else
    return false
  end
end
local stop = start + tonumber(ARGV[3]) - 1
local ids
if desc then ids = redis.call('ZREVRANGE', KEYS[1], start, stop)
else ids = redis.call('ZRANGE', KEYS[1], start, stop) end
if #ids == 0 then return {} end
return {ids, redis.call('HMGET', KEYS[2], unpack(ids)),
        redis.call('ZSCORE', KEYS[1], ids[#ids])}
"""
# A record put again only if it is held, with its expiry kept (and its age: a replace
# does not make a record newer). KEYS record, listing, bound, aged; ARGV JSON, id,
# summary ('': the listed one kept), size, bound, the store's key prefix, place, fence
# ('': none; else what the record held must end with, `"fence":"..."}}`: its `run`, the
# last field, with the fence its last, as `fenced` writes it; found without decoding the
# record. Anywhere else it may be a caller's text: a `metadata` key is a JSON key, not
# escaped, and a fence is no secret, `proxy.ids`.)
_REPLACE_SCRIPT = _QUOTA_LUA + """
if redis.call('TYPE', KEYS[1])['ok'] ~= 'string' then  -- (none held: a stray is no record)
  return 0
end
if ARGV[8] ~= '' and string.sub(redis.call('GET', KEYS[1]), -#ARGV[8]) ~= ARGV[8] then
  return 0
end
own(KEYS[2], 'hash'); own(KEYS[3], 'hash'); own(KEYS[4], 'zset')
local now = now_us()
settle(KEYS[3], KEYS[4], ARGV[6], now)
redis.call('SET', KEYS[1], ARGV[1], 'KEEPTTL')
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
end
local old = redis.call('HGET', KEYS[3], ARGV[7])
local ttl = redis.call('PTTL', KEYS[1])
if not old then  -- held but not counted (stored before the bound was): counted now
  redis.call('ZADD', KEYS[4], num(now + ttl * 1000), ARGV[7])
end
redis.call('HSET', KEYS[3], ARGV[7], ARGV[4])
redis.call('HINCRBY', KEYS[3], '', num(tonumber(ARGV[4]) - (tonumber(old) or 0)))
for i = 3, 4 do  -- (after the writes: a key made by them has no expiry to keep)
  if redis.call('PTTL', KEYS[i]) < ttl then redis.call('PEXPIRE', KEYS[i], ttl) end
end
evict(KEYS[3], KEYS[4], ARGV[6], tonumber(ARGV[5]), ARGV[7])
return 1
"""


#: How long a listener (`RedisStore.told`) waits for a message at a time.
_LISTEN_S = 1.0
#: Joins a place's id and score in the cursor `RedisStore.scan` gives to go on from.
_SCORED = "\x00"


class RedisStore:
    """One key per record, `SET ... PX ttl`. A record put with a summary (a stored chat
    completion: its id, order, model and metadata) also has it in the tenant's listing,
    a hash read to list and filter without loading the records, its place in a sorted
    set by `at` (a page reads a window of it from its cursor's rank: a listing costs its
    page, not the tenant's whole history), and its expiry in another: each put takes
    expired places out of the listing (a bounded number), so a tenant that stores and
    never lists does not grow it. Each tenant's records take at most `max_bytes` (see
    `_QUOTA_LUA`): one script a put, its only round trip. A Redis that fails, or does not
    answer within `timeout_s` (each call), is a 503; a record that is not a JSON object
    is not found."""

    def __init__(self, url: str, ttl_s: float, key_prefix: str,
                 timeout_s: float = 1.0, kind: str = "responses",
                 max_bytes: int = DEFAULT_MAX_BYTES_PER_TENANT) -> None:
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self.kind = kind
        self.max_bytes: int | None = max_bytes
        self._bound = max_bytes
        self._prefix = f"{key_prefix}{kind}:"  # under the cache's own prefix
        self._redis = blocking_client(url, timeout_s)
        self._put = self._redis.register_script(_PUT_SCRIPT)
        self._retire = self._redis.register_script(_RETIRE_SCRIPT)
        self._replace = self._redis.register_script(_REPLACE_SCRIPT)
        self._scan = self._redis.register_script(_SCAN_SCRIPT)

    @staticmethod
    def _scope(tenant: str) -> str:
        return hashlib.sha256(tenant.encode()).hexdigest()[:32]

    def _key(self, tenant: str, record_id: str) -> str:
        return self._prefix + self._place(tenant, record_id)

    def _listing(self, tenant: str) -> tuple[str, str, str]:
        """(the summaries' hash, their order, their expiry): a scope is hex, so no
        record's key."""
        scope = self._scope(tenant)
        return (f"{self._prefix}listing:{scope}", f"{self._prefix}order:{scope}",
                f"{self._prefix}expiry:{scope}")

    def _quota(self, tenant: str) -> tuple[str, str]:
        """(the sizes of the records of the tenant's account, and their total; their
        expiries): see `_QUOTA_LUA`."""
        scope = self._scope(account(tenant))
        return f"{self._prefix}bound:{scope}", f"{self._prefix}aged:{scope}"

    def _place(self, tenant: str, record_id: str) -> str:
        """A record's name in its account's bound: its key without the store's prefix."""
        return f"{self._scope(tenant)}:{record_id}"

    def _sized(self, record: Record, summary: Summary | None) -> tuple[bytes, bytes, int]:
        """The record's JSON, its summary's (b"": none) and what they count toward the
        bound; `RecordTooLarge` past all of it."""
        data = dumps(record)
        listed = b"" if summary is None else dumps(summary)
        size = len(data) + len(listed)
        if size > self._bound:
            raise too_large(self.kind, size, self._bound)
        return data, listed, size

    async def _io(self, work: Awaitable[T]) -> T:
        """One call to Redis, bounded: a frozen Redis (paused, swapping) held a request
        for the pool's socket timeout, seconds, where a cache lookup gives up in
        milliseconds. A write abandoned may still land (a record stored, or deleted):
        as one whose answer was lost on the way back."""
        try:
            with lost_cancellation():
                return await abandon_after(work, self.timeout_s)
        except (RedisError, OSError, TimeoutError) as e:
            raise _down(e, self.kind) from None

    async def get(self, tenant: str, record_id: str) -> Record | None:
        return (await self.get_many(tenant, [record_id]))[0]

    async def get_many(self, tenant: str, ids: list[str]) -> list[Record | None]:
        if not ids:
            return []
        raws = await self._io(self._redis.mget([self._key(tenant, i) for i in ids]))
        return [_record(raw) for raw in raws]

    @property
    def _ttl_ms(self) -> int:
        return max(1, int(self.ttl_s * 1000))

    async def put(self, tenant: str, record_id: str, record: Record,
                  summary: Summary | None = None, fresh: bool = False) -> None:
        data, listed, size = self._sized(record, summary)
        at = (summary or {}).get("at")
        at = int(at if isinstance(at, int | float) else time.time_ns())
        now = time.time()
        dropped = await self._io(self._put(
            keys=[self._key(tenant, record_id), *self._quota(tenant),
                  *self._listing(tenant)],
            args=[record_id, data, size, self._bound, self._ttl_ms, self._prefix, listed,
                  at // 1000,  # µs: exact in a double
                  now + self.ttl_s, now - _GRACE_S, _PRUNE,
                  self._place(tenant, record_id), "1" if fresh else ""]))
        if dropped:
            log.debug("record store: an account at its bound lost its oldest records",
                      kind=self.kind, dropped=dropped)

    async def replace(self, tenant: str, record_id: str, record: Record,
                      summary: Summary | None = None, fence: str | None = None) -> bool:
        data, listed, size = self._sized(record, summary)
        return bool(await self._io(self._replace(
            keys=[self._key(tenant, record_id), self._listing(tenant)[0],
                  *self._quota(tenant)],
            args=[data, record_id, listed, size, self._bound, self._prefix,
                  self._place(tenant, record_id),
                  _fence_suffix(fence)])))

    async def delete(self, tenant: str, record_id: str, fence: str | None = None) -> bool:
        return await self._retire_one(tenant, record_id, delete=True, fence=fence)

    async def forget(self, tenant: str, record_id: str) -> None:
        """`record_id`'s summary marked gone, if its record is gone."""
        await self._retire_one(tenant, record_id, delete=False)

    async def now(self) -> float:
        """Redis's clock (`TIME`): the one every replica sharing it reads."""
        seconds, micros = await self._io(self._redis.time())
        return float(seconds) + float(micros) / 1e6

    def place(self, tenant: str, record_id: str) -> str:
        """What names a record in what `tell` sends (its tenant hashed, not named)."""
        return self._place(tenant, record_id)

    async def tell(self, what: str, tenant: str, record_id: str) -> None:
        """Tell every replica listening (`told`) `what` of a record (pub/sub: a replica
        not listening then never hears it; what must reach it is stored beside)."""
        await self._io(self._redis.publish(f"{self._prefix}news",
                                           f"{what} {self._place(tenant, record_id)}"))

    async def hear(self, on_told: Callable[[str, str], Awaitable[None]]) -> NoReturn:
        """`on_told(what, place)` for what replicas `tell`, until cancelled; a lost
        connection is opened again (what was told meanwhile is not heard)."""
        async def heard(data: Any) -> None:
            what, _, place = (data.decode(errors="replace") if isinstance(data, bytes)
                              else str(data)).partition(" ")
            await on_told(what, place)

        def failed(e: Exception) -> None:
            if isinstance(e, LOST):
                _down(e, self.kind)
            else:  # a bug: logged, and heard again (it had ended the listener for good)
                log.error("record store listener failed", **error_fields(e))

        await listen(self._redis, f"{self._prefix}news", wait_s=_LISTEN_S,
                     on_message=heard, on_error=failed)

    async def _retire_one(self, tenant: str, record_id: str, *, delete: bool,
                          fence: str | None = None) -> bool:
        return bool(await self._io(self._retire(
            keys=[self._key(tenant, record_id), self._listing(tenant)[0],
                  *self._quota(tenant)],
            args=[record_id, "1" if delete else "0", self._place(tenant, record_id),
                  _fence_suffix(fence)])))

    async def scan(self, tenant: str, after: str | None, desc: bool, count: int,
                   ) -> tuple[list[Summary], str | None]:
        listing, order, _ = self._listing(tenant)
        place, _, score = (after or "").partition(_SCORED)  # (a cursor this scan gave)
        if not score.isascii() or not score.isdigit():  # (scores are whole microseconds)
            place, score = after or "", ""
        if after is not None and not place:
            raise KeyError(after)
        found = await self._io(self._scan(keys=[order, listing],
                                          args=[place, "1" if desc else "0", count, score]))
        if found is None:
            raise KeyError(after)
        if not found:
            return [], None
        ids, raws, last_score = (*found, None)[:3]
        last = ids[-1].decode() if isinstance(ids[-1], bytes) else ids[-1]
        if isinstance(last_score, bytes):
            last_score = last_score.decode()
        return ([s for s in map(_record, raws) if s is not None],
                f"{last}{_SCORED}{last_score}" if len(ids) == count else None)

    async def close(self) -> None:
        await self._redis.aclose()


def _fence_suffix(fence: str | None) -> bytes:
    """What a record its writer fenced with `fence` ends with, as JSON (`fenced`); b""
    for no fence."""
    return b"" if fence is None else dumps({"fence": fence})[1:-1] + b"}}"


def fenced(record: Record, fence: str, **run: Any) -> Record:
    """`record` with its writer's `fence` (`ids.new_hex`: unique, not secret) in its
    `run` beside `run`'s fields: a `replace` with that fence stores only over it. Its
    `run` is its last field and the fence the last of `run` (what Redis's `replace`
    looks for: its JSON ends so)."""
    return {**{k: v for k, v in record.items() if k != "run"},
            "run": {**run, "fence": fence}}


def fence_of(record: Record) -> str | None:
    run = record.get("run")
    fence = run.get("fence") if isinstance(run, dict) else None
    return fence if isinstance(fence, str) else None


def _record(raw: Any) -> Record | None:
    """A stored JSON object, or None (missing, or not one: written by something else)."""
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        log.warning("stored record is not a JSON object; ignored")
        return None
    return value


_WHAT = {"responses": "response", "chat": "chat completion"}


def too_large(kind: str, size: int, bound: int) -> RecordTooLarge:
    """A record of `size` bytes (at least) that its tenant's `bound` cannot hold."""
    what = _WHAT.get(kind, kind)
    hint = (" Send it with `store: false`, or start a new conversation (without "
            "`previous_response_id`)." if kind == "responses" else "")
    return RecordTooLarge(
        f"The {what} is too large to store: {size} bytes, more than all of a tenant's "
        f"stored {what}s may take ({bound} bytes, `responses.max_bytes_per_tenant`).{hint}",
        param="store")


#: Each kind of store's failures, logged once a while (an outage of seconds under load
#: was thousands of lines, each request logging two or three).
_OUTAGES = OutageLog()


def _down(e: BaseException, kind: str) -> Unavailable:
    what = _WHAT.get(kind, kind)
    if _OUTAGES.down(kind):
        # The type alone: a protocol error's text holds the bytes Redis sent back, which
        # may be a stored record's (a prompt) once the connection is out of step.
        log.warning("record store unavailable", kind=kind, error=type(e).__name__)
    return Unavailable(f"The {what} store is unavailable; retry shortly.",
                       code="store_unavailable")


def cache_redis(plugins: Any) -> Any:
    """The cache plugin's `redis` config, or None (no cache, or no Redis)."""
    cache = next((p for p in plugins if p.name == "cache"), None)
    return getattr(getattr(cache, "config", None), "redis", None)


def make_store(cfg: ResponsesSettings, cache_redis: Any,
               kind: str = "responses") -> RecordStore:
    """In the cache's Redis (`cache_redis`: the cache plugin's `redis` config, or None),
    under its key prefix (two deployments sharing a Redis with their own prefixes share
    no stored response), or in memory."""
    url = getattr(cache_redis, "url", None)
    if cfg.redis and url:
        # (the cache's write timeout: a record read is not a lookup that may miss, it is
        # the answer, so it gets what a busy Redis needs, not the lookup's milliseconds)
        timeout_s = max(cache_redis.timeout_s, cache_redis.write_timeout_s)
        return RedisStore(url, cfg.ttl_s, cache_redis.key_prefix, timeout_s, kind=kind,
                          max_bytes=cfg.max_bytes_per_tenant)
    return MemoryStore(cfg.ttl_s, cfg.max_in_memory, kind, cfg.max_bytes_per_tenant,
                       cfg.max_bytes_in_memory)
