"""GCRA over a one-minute period, with token-weighted costs, in two stores.

State per bucket: the theoretical arrival time (TAT). With limit L per period P, each
unit of cost moves the TAT by T = P / L; a request is allowed when the new TAT is at
most P ahead of now (so a full bucket admits L at once, then one every T). Remaining =
floor((P - (TAT - now)) / T); reset = TAT - now. A refund moves the TAT back (never
before now); a charge beyond the reservation moves it on without a check.

Concurrency: a sorted set of leases (score: expiry), renewed while their request runs,
so a slot never released (a crash) frees itself within `lease_s`.

Times are float milliseconds of a clock that may read 1e6 (monotonic, a fresh machine)
to 1e12 (Redis TIME), so `tat + cost * T - now` can miss an exact P by its last bits:
every comparison and floor allows `_eps(now)` (0.01 ms, or 256 units in the last place
of `now` where that is more: the rounding of hundreds of additions at once), or a full
bucket would refuse its last unit (or report one less remaining) depending on what the
clock read. At Redis TIME's 1.7e12 ms that is 0.1 ms in a 60 s period.

`MemoryStore` and `RedisStore` implement the same decisions: the Redis script is the
same algorithm in Lua, atomic across every bucket of a request, with time from Redis
`TIME` (not the replica's clock) and expiring keys.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Collection
from typing import NamedTuple, Protocol

from opentelemetry.trace import SpanKind
from redis.exceptions import OutOfMemoryError, RedisError

from proxy.redis_client import blocking_client
from proxy.tasks import abandon_after, lost_cancellation
from proxy.tracing import span

PERIOD_MS = 60_000.0
EPS_MS = 0.01
EPS_ULPS = 2.0**-44  # 256 units in the last place, relative to the clock's reading


def _eps(now: float) -> float:
    return max(EPS_MS, abs(now) * EPS_ULPS)


def _units(room_ms: float, eps: float, t: float, most: int) -> int:
    """Whole units in `room_ms` of the period, within [0, most] (the limit, less what
    this request just took): at a limit so high that one unit is shorter than `eps`
    (200M tokens a minute: 0.0003 ms), the allowance would otherwise count tens of units
    past the limit."""
    return min(most, max(0, math.floor((room_ms + eps) / t)))


# (Named tuples, not frozen dataclasses: a few are made per request, and a frozen
# dataclass's `__init__` sets each field through `object.__setattr__`, 2-3x the cost.)


class Bucket(NamedTuple):
    key: str
    limit: int
    cost: float


class BucketState(NamedTuple):
    limit: int
    remaining: int
    reset_ms: float


class Decision(NamedTuple):
    allowed: bool
    retry_after_ms: float
    states: list[BucketState]
    #: the concurrency limits (their places in `conc`) that were full: a refusal names
    #: its rule by them
    full: tuple[int, ...] = ()
    #: Redis's lease sets' epoch, where it decided on a concurrency limit (0: none): a
    #: new one means Redis lost its data since (a restart, FLUSHALL), the leases of the
    #: requests still running with it (`RateLimitPlugin._rewrite_leases`)
    epoch: int = 0


class StoreError(Exception):
    """A store call failed (or timed out: a Redis call cut by its timeout may still run
    there later, which the orphan release's bar covers)."""


class StoreFull(StoreError):
    """Redis refused a write at its `maxmemory` (policy noeviction): it answers, but
    records nothing (a refused script wrote nothing: its first write is the one refused,
    and once one lands the rest do, even a write that frees nothing, as a ZREM: Redis
    7.0 stops a script only before it wrote)."""


class Store(Protocol):
    """What the plugin needs of a store; MemoryStore and RedisStore decide alike."""

    async def admit(self, buckets: list[Bucket], conc: list[tuple[str, int]], lease: str,
                    lease_ms: float) -> Decision: ...

    async def adjust(self, buckets: list[Bucket]) -> list[BucketState]:
        """Charge (cost > 0) or refund (< 0) each bucket; each one's state after that."""

    async def release(self, conc: list[str], lease: str) -> None: ...

    async def renew(self, leases: dict[str, list[str]], lease_ms: float,
                    restore: Collection[str] = ()) -> set[str]:
        """Push the expiry of running leases (lease -> its keys) `lease_ms` ahead, where
        the store still holds them: a lease released meanwhile (its request ended as the
        renewal was on its way) stays released. Those in `restore` (their copy may have
        lapsed while their request ran) are written back unless a barred release ended
        them. The leases it held no longer, on some key (and did not write back)."""


class MemoryStore:
    #: Buckets and lease sets held before the first sweep of those past their expiry.
    SWEEP_FROM = 4096

    def __init__(self, clock: object = None) -> None:
        self._tat: dict[str, tuple[float, float]] = {}  # key -> (tat, expires)
        self._leases: dict[str, dict[str, float]] = {}
        self._clock = clock or (lambda: time.monotonic() * 1000)
        self._sweep_at = self.SWEEP_FROM

    def _swept(self, now: float) -> None:
        """Drop the buckets past their expiry (full again: as good as none) and the lease
        sets that hold no running lease, once they have doubled since the last sweep (a
        walk amortised over as many requests). Without it every key ever seen stayed: a
        gateway's callers (`on_behalf_of`), each a tenant and a user of its own, added
        ~800 bytes each for good (200,000 callers: 164 MB), as the local fallback does
        over a Redis outage."""
        if len(self._tat) + len(self._leases) < self._sweep_at:
            return
        self._tat = {k: v for k, v in self._tat.items() if v[1] > now}
        for key, leases in list(self._leases.items()):
            live = {k: exp for k, exp in leases.items() if exp > now}
            if live:
                self._leases[key] = live
            else:
                del self._leases[key]
        self._sweep_at = max(self.SWEEP_FROM, 2 * (len(self._tat) + len(self._leases)))

    def _now(self) -> float:
        return self._clock()  # type: ignore[operator, no-any-return]

    def _get(self, key: str, now: float) -> float:
        tat, expires = self._tat.get(key, (now, 0.0))
        return max(tat if expires > now else now, now)

    async def admit(self, buckets: list[Bucket], conc: list[tuple[str, int]], lease: str,
                    lease_ms: float) -> Decision:
        now = self._now()
        eps = _eps(now)
        allowed, retry, states, tats, new = True, 0.0, [], [], []
        for b in buckets:
            t = PERIOD_MS / b.limit
            tat = self._get(b.key, now)
            tats.append(tat)
            nt = tat + min(b.cost, b.limit) * t
            diff = nt - now
            if diff > PERIOD_MS + eps:
                allowed = False
                retry = max(retry, diff - PERIOD_MS)
            states.append(BucketState(b.limit, _units(
                PERIOD_MS - diff, eps, t, math.floor(b.limit - min(b.cost, b.limit))), diff))
            new.append(nt)
        full = []
        for j, (key, limit) in enumerate(conc):
            leases = self._leases.setdefault(key, {})
            if len(leases) >= limit:
                # Expired leases (their release lost) are swept only when they could
                # refuse: a sweep on every request walked every running lease, and below
                # the limit they change nothing (nor can they pile up past it).
                for k in [k for k, exp in leases.items() if exp <= now]:
                    del leases[k]
            if len(leases) >= limit:
                allowed = False
                retry = max(retry, 1000.0)
                full.append(j)
        if not allowed:
            self._swept(now)
            # Each bucket as it stands (a refused request takes nothing): only a refusal
            # reports them, so they are worked out only for one.
            untaken = [BucketState(b.limit, _units(PERIOD_MS - (tat - now), eps,
                                                   PERIOD_MS / b.limit, b.limit), tat - now)
                       for b, tat in zip(buckets, tats, strict=True)]
            return Decision(False, retry, untaken, tuple(full))
        for b, nt in zip(buckets, new, strict=True):
            self._tat[b.key] = (nt, nt + 1000)
        for key, _ in conc:
            self._leases[key][lease] = now + lease_ms
        self._swept(now)
        return Decision(True, retry, states)

    async def adjust(self, buckets: list[Bucket]) -> list[BucketState]:
        """Cost > 0 charges, < 0 refunds (settling a token reservation)."""
        now = self._now()
        eps = _eps(now)
        states = []
        for b in buckets:
            t = PERIOD_MS / b.limit
            nt = max(now, self._get(b.key, now) + b.cost * t)
            self._tat[b.key] = (nt, nt + 1000)
            states.append(BucketState(b.limit, _units(PERIOD_MS - (nt - now), eps, t,
                                                      b.limit), nt - now))
        self._swept(now)
        return states

    async def release(self, conc: list[str], lease: str) -> None:
        for key in conc:
            held = self._leases.get(key)
            if held is not None:
                held.pop(lease, None)
                if not held:
                    del self._leases[key]

    def hold(self, conc: list[str], lease: str, lease_ms: float) -> None:
        """Count a lease another store granted (its request still runs) until it is
        released here or lapses (`renew` keeps it)."""
        until = self._now() + lease_ms
        for key in conc:
            self._leases.setdefault(key, {})[lease] = until

    async def renew(self, leases: dict[str, list[str]], lease_ms: float,
                    restore: Collection[str] = ()) -> set[str]:
        """(Nothing here lapses while its request runs but by a renewal missed for
        `lease_s`, which `restore` does not undo: it takes the store's word.)"""
        until = self._now() + lease_ms
        gone = set()
        for lease, keys in leases.items():
            for key in keys:
                held = self._leases.get(key)
                if held is not None and lease in held:
                    held[lease] = until
                else:
                    gone.add(lease)
        return gone

    def in_flight(self) -> int:
        now = self._now()
        return sum(1 for leases in self._leases.values() for exp in leases.values()
                   if exp > now)


# What a script reads back (the Lua of every script that reads a bucket or a lease set).
# Only what these scripts wrote is read as state: anything else under a key (garbage, a
# key of another type, a time no clock reads, one without the expiry every write sets:
# another program's, or a poisoned Redis) is an empty bucket or no leases, and the write
# that follows replaces it. Read as it was, it failed every admission of that bucket
# (503 `rate_limiter_unavailable` with fail_closed) or refused each with a 1 ms
# Retry-After, for good: such a key never expires.
_READ = """
local function tat_of(key, now)
  local raw = redis.pcall('GET', key)
  local tat = type(raw) == 'string' and tonumber(raw) or nil
  if tat == nil or tat ~= tat or tat < now or tat > now + redis.call('PTTL', key) then
    return now
  end
  return tat
end
local function leases_of(key)
  local kind = redis.call('TYPE', key)['ok']
  if kind ~= 'zset' and kind ~= 'none' then redis.call('DEL', key) end
  return key
end
"""

# The lease sets' epoch (`Decision.epoch`): a new one (Redis TIME in microseconds, 16
# digits) where Redis holds none, or anything but up to 16 digits. At most 17 bytes of it
# are read: one read whole (GET) made each admission copy whatever was stored there (50
# MB: 0.3 s per admission, every replica's, for good), and `inf` or `1e300` stood as an
# epoch that Redis returned as -2^63.
_EPOCH_OF = """
local function epoch_of(key, t)
  local raw = redis.pcall('GETRANGE', key, 0, 16)
  local epoch = type(raw) == 'string' and #raw <= 16 and string.match(raw, '^%d+$')
    and tonumber(raw) or nil
  if epoch == nil or epoch < 1 then
    epoch = tonumber(t[1]) * 1000000 + tonumber(t[2])
    redis.call('SET', key, string.format('%d', epoch))
  end
  return epoch
end
"""

_ADMIT = _READ + _EPOCH_OF + """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local eps = math.max($EPS_MS, now * $EPS_ULPS)
local nb, nc = tonumber(ARGV[1]), tonumber(ARGV[2])
local lease, lease_ms, period = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local allowed, retry = 1, 0
local out, untaken, new, full = {}, {}, {}, {}
-- the lease sets' epoch: a new one where Redis holds none (it lost its data: every
-- running lease with it; or it is the first), so that each replica writes its own back
local epoch = 0
if nc > 0 then epoch = epoch_of(KEYS[nb + nc + 1], t) end
for i = 1, nb do
  local limit = tonumber(ARGV[5 + (i - 1) * 2 + 1])
  local cost = math.min(tonumber(ARGV[5 + (i - 1) * 2 + 2]), limit)
  local T = period / limit
  local tat = tat_of(KEYS[i], now)
  local nt = tat + cost * T
  local diff = nt - now
  -- as the bucket stands: what a refused request reports (it takes nothing)
  untaken[#untaken + 1] = limit
  untaken[#untaken + 1] = math.min(limit, math.max(0, math.floor((period - (tat - now) + eps) / T)))
  untaken[#untaken + 1] = math.ceil(tat - now)
  if diff > period + eps then
    allowed = 0
    retry = math.max(retry, diff - period)
  end
  out[#out + 1] = limit
  out[#out + 1] = math.min(math.floor(limit - cost),
                           math.max(0, math.floor((period - diff + eps) / T)))
  out[#out + 1] = math.ceil(diff)
  new[i] = nt
end
for j = 1, nc do
  local key = leases_of(KEYS[nb + j])
  local limit = tonumber(ARGV[5 + nb * 2 + j])
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  -- released as an orphan before this ran (its caller gave up on it): take nothing
  local barred = tonumber(redis.call('ZSCORE', leases_of(key .. ':gone'), lease))
  if barred ~= nil and barred > now then
    allowed = 0
  end
  if redis.call('ZCARD', key) >= limit then
    allowed = 0
    retry = math.max(retry, 1000)
    full[#full + 1] = j - 1
  end
end
if allowed == 1 then
  for i = 1, nb do
    redis.call('SET', KEYS[i], string.format('%.3f', new[i]), 'PX', math.ceil(new[i] - now) + 1000)
  end
  for j = 1, nc do
    local key = KEYS[nb + j]
    redis.call('ZADD', key, now + lease_ms, lease)
    redis.call('PEXPIRE', key, math.ceil(lease_ms))
  end
end
if allowed == 0 then out = untaken end
-- allowed, retry, the epoch, the full concurrency limits (a count, then their places),
-- the states
local res = {allowed, math.ceil(retry), epoch, #full}
for _, j in ipairs(full) do res[#res + 1] = j end
for _, v in ipairs(out) do res[#res + 1] = v end
return res
""".replace("$EPS_MS", repr(EPS_MS)).replace("$EPS_ULPS", repr(EPS_ULPS))

_ADJUST = _READ + """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local eps = math.max($EPS_MS, now * $EPS_ULPS)
local period = tonumber(ARGV[1])
local out = {}
for i = 1, #KEYS do
  local limit = tonumber(ARGV[1 + (i - 1) * 2 + 1])
  local cost = tonumber(ARGV[1 + (i - 1) * 2 + 2])
  local T = period / limit
  local tat = tat_of(KEYS[i], now)
  local nt = math.max(now, tat + cost * T)
  redis.call('SET', KEYS[i], string.format('%.3f', nt), 'PX', math.ceil(nt - now) + 1000)
  -- the bucket as it stands now (a refused request's headers show its refund)
  out[#out + 1] = limit
  out[#out + 1] = math.min(limit, math.max(0, math.floor((period - (nt - now) + eps) / T)))
  out[#out + 1] = math.ceil(nt - now)
end
return out
""".replace("$EPS_MS", repr(EPS_MS)).replace("$EPS_ULPS", repr(EPS_ULPS))


# Renewal: a lease still held is renewed; one held no longer is left so (released as the
# renewal was on its way, on another connection: written back, it held its slot for no
# request until it lapsed), but for one to restore (ARGV: lease, then 1), which may have
# lapsed while its request ran (Redis down, or full): written back unless a barred
# release (`<key>:gone`) ended it. The places (from 0) of the leases not held, not
# written back.
_RENEW = _READ + """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local lease_ms = tonumber(ARGV[1])
local gone = {}
for i = 1, #KEYS do
  local key = leases_of(KEYS[i])
  local lease, restore = ARGV[2 * i], ARGV[2 * i + 1] == '1'
  local keep = redis.call('ZSCORE', key, lease) ~= false
  if not keep and restore then
    local barred = tonumber(redis.call('ZSCORE', leases_of(key .. ':gone'), lease))
    keep = barred == nil or barred <= now
  end
  if keep then
    redis.call('ZADD', key, now + lease_ms, lease)
    redis.call('PEXPIRE', key, math.ceil(lease_ms))
  else
    gone[#gone + 1] = i - 1
  end
end
return gone
"""


# A barred release (`RedisStore.release_barred`): the lease is removed and barred for
# `lease_ms` in `<key>:gone`, so an admission still on its way (an orphan's: sent, then
# cut by its timeout; a busy Redis may run it after this release) takes nothing when it
# lands, nor does a renewal that restores it.
_RELEASE_BARRED = _READ + """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local lease, lease_ms = ARGV[1], tonumber(ARGV[2])
for i = 1, #KEYS do
  redis.call('ZREM', leases_of(KEYS[i]), lease)
  local gone = leases_of(KEYS[i] .. ':gone')
  redis.call('ZREMRANGEBYSCORE', gone, '-inf', now)
  redis.call('ZADD', gone, now + lease_ms, lease)
  redis.call('PEXPIRE', gone, math.ceil(lease_ms))
end
return 1
"""


# The lease sets' epoch (`Decision.epoch`), made anew where Redis holds none.
_EPOCH = _EPOCH_OF + """
return epoch_of(KEYS[1], redis.call('TIME'))
"""

_COUNT = _READ + """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local out = {}
for i = 1, #KEYS do
  local key = leases_of(KEYS[i])
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  out[i] = redis.call('ZCARD', key)
end
return out
"""


class RedisStore:
    def __init__(self, url: str, timeout_s: float, key_prefix: str = "weir:rl:") -> None:
        self.timeout_s = timeout_s
        #: where the lease sets' epoch is kept (`Decision.epoch`)
        self.epoch_key = f"{key_prefix}epoch"
        self.client = blocking_client(url, timeout_s, max_connections=64)
        self._admit = self.client.register_script(_ADMIT)
        self._adjust = self.client.register_script(_ADJUST)
        self._renew = self.client.register_script(_RENEW)
        self._release_barred = self.client.register_script(_RELEASE_BARRED)
        self._count = self.client.register_script(_COUNT)
        self._epoch = self.client.register_script(_EPOCH)

    async def close(self) -> None:
        await self.client.aclose()

    async def _run(self, coro: object, timeout_s: float | None = None) -> object:
        try:
            with lost_cancellation(), span("redis ratelimit", kind=SpanKind.CLIENT,
                                           **{"db.system": "redis"}):
                return await abandon_after(coro,  # type: ignore[arg-type]
                                           timeout_s or self.timeout_s)
        except OutOfMemoryError as e:
            raise StoreFull(type(e).__name__) from None
        except (RedisError, OSError, TimeoutError) as e:
            raise StoreError(type(e).__name__) from None

    async def admit(self, buckets: list[Bucket], conc: list[tuple[str, int]], lease: str,
                    lease_ms: float) -> Decision:
        args: list[str | int | float] = [len(buckets), len(conc), lease, lease_ms, PERIOD_MS]
        for b in buckets:
            args += [b.limit, b.cost]
        args += [limit for _, limit in conc]
        keys = [b.key for b in buckets] + [k for k, _ in conc]
        if conc:
            keys.append(self.epoch_key)
        res = await self._run(self._admit(keys=keys, args=args))
        vals = [float(v) for v in res]  # type: ignore[attr-defined]
        first = 4 + int(vals[3])
        states = [BucketState(int(vals[i]), int(vals[i + 1]), vals[i + 2])
                  for i in range(first, len(vals), 3)]
        return Decision(vals[0] == 1, vals[1], states,
                        tuple(int(v) for v in vals[4:first]), int(vals[2]))

    async def epoch(self) -> int:
        """The lease sets' epoch (a new one where Redis lost it)."""
        res = await self._run(self._epoch(keys=[self.epoch_key], args=[]))
        return int(str(res))

    async def count(self, conc: list[str]) -> list[int]:
        """The running leases each lease set holds (those past their expiry dropped)."""
        res = await self._run(self._count(keys=conc, args=[]))
        return [int(v) for v in res]  # type: ignore[attr-defined]

    async def adjust(self, buckets: list[Bucket]) -> list[BucketState]:
        if not buckets:
            return []
        args: list[str | int | float] = [PERIOD_MS]
        for b in buckets:
            args += [b.limit, b.cost]
        res = await self._run(self._adjust(keys=[b.key for b in buckets], args=args))
        vals = [float(v) for v in res]  # type: ignore[attr-defined]
        return [BucketState(int(vals[i]), int(vals[i + 1]), vals[i + 2])
                for i in range(0, len(vals), 3)]

    async def release(self, conc: list[str], lease: str) -> None:
        if not conc:
            return

        async def run() -> None:
            async with self.client.pipeline(transaction=False) as pipe:
                for key in conc:
                    pipe.zrem(key, lease)
                await pipe.execute()

        await self._run(run())

    async def release_barred(self, conc: list[str], lease: str, lease_ms: float) -> None:
        """`release` of a lease whose admission may not have run yet (an orphan), or that
        a renewal may restore: it is barred for `lease_ms`, so that admission takes
        nothing when it lands, nor that renewal."""
        if conc:
            await self._run(self._release_barred(keys=conc, args=[lease, lease_ms]))

    async def ping(self) -> None:
        await self._run(self.client.ping())

    async def warm(self, connections: int, timeout_s: float) -> None:
        """Open `connections` connections and load the scripts, within `timeout_s`: a
        cold store made each request of the first burst open its connection and load
        its script (NOSCRIPT, then a load) within the per-call timeout."""
        async def work() -> None:
            await asyncio.gather(*(self.client.ping() for _ in range(connections)))
            for script in (self._admit, self._adjust, self._renew, self._release_barred,
                           self._count, self._epoch):
                await self.client.script_load(script.script)

        await self._run(work(), timeout_s)

    async def write_probe(self, key: str) -> None:
        """A write Redis refuses while it is full (StoreFull), as every script here."""
        await self._run(self.client.set(key, "1", px=1000))

    async def renew(self, leases: dict[str, list[str]], lease_ms: float,
                    restore: Collection[str] = ()) -> set[str]:
        keys: list[str] = []
        owners: list[str] = []
        args: list[str | float] = [lease_ms]
        for lease, conc in leases.items():
            for key in conc:
                keys.append(key)
                owners.append(lease)
                args += [lease, 1 if lease in restore else 0]
        if not keys:
            return set()
        gone = await self._run(self._renew(keys=keys, args=args))
        return {owners[int(i)] for i in gone}  # type: ignore[attr-defined]
