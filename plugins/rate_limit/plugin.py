"""Rate limits per API key, user, tenant, role and model: requests and tokens per minute,
and concurrent requests.

On admission, every rule's buckets are checked and charged in one atomic step: one
request, and the tokens it may use (its prompt, estimated from its text, plus its
`max_tokens` or `default_max_tokens`), and a concurrency lease. When the answer ends the
token charge is settled against the real usage and the lease released; a failed or
aborted request gets its tokens back.

Over a limit: 429 `rate_limit_exceeded` with an integer `Retry-After` and
`retry-after-ms`. Every answer carries OpenAI's `x-ratelimit-limit-requests`,
`-remaining-requests`, `-reset-requests` and the `-tokens` variants (the tightest rule).

Store failures: `fail_open` falls back to a local in-memory limiter (per replica) with
a metric and a log line, and uses Redis again as soon as a call succeeds; `fail_closed`
answers 503.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, ClassVar

from prometheus_client import Counter

from proxy.chain import BasePlugin, Completion, Next, Reply, Services, Stream
from proxy.context import RequestContext
from proxy.errors import RateLimited, Unavailable
from proxy.protocol import ChatCompletionRequest
from proxy.telemetry import get_logger
from proxy.tools import tool_chars

from .config import Limits, RateLimitConfig
from .gcra import Bucket, BucketState, Decision, MemoryStore, RedisStore, StoreError

log = get_logger("weir.rate_limit")


def _dimension(ctx: RequestContext, per: str) -> str:
    p = ctx.principal
    return {"key": p.key_id, "user": f"{p.tenant}/{p.user}", "tenant": p.tenant,
            "role": f"{p.tenant}/{p.role}", "model": ctx.model, "global": "*"}[per]


def estimate_tokens(ctx: RequestContext) -> int:
    req = ctx.request
    if isinstance(req, ChatCompletionRequest):
        chars = sum(len(m.text()) for m in req.messages) + tool_chars(req)
    else:
        chars = sum(len(p) if isinstance(p, str) else len(p) * 4 for p in req.prompts())
    return chars // 4 + 1


def fmt_reset(ms: float) -> str:
    """OpenAI's reset format: '20ms', '1s', '6m0s'."""
    if ms < 1000:
        return f"{max(0, math.ceil(ms))}ms"
    s = math.ceil(ms / 1000)
    return f"{s // 60}m{s % 60}s" if s >= 60 else f"{s}s"


class RateLimitPlugin(BasePlugin):
    name: ClassVar[str] = "rate_limit"
    Config = RateLimitConfig

    def __init__(self, config: RateLimitConfig, services: Services,  # type: ignore[override]
                 clock: Any = None) -> None:
        super().__init__(config, services)
        self.cfg = config
        self.local = MemoryStore(clock)
        self.remote = (RedisStore(config.redis.url, config.redis.timeout_s)
                       if config.store == "redis" and config.redis.url else None)
        reg = services.metrics.registry
        self.rejected = Counter("weir_rate_limit_rejections_total", "429s.", ["per", "limit"],
                                registry=reg)
        self.store_errors = Counter("weir_rate_limit_store_errors_total",
                                    "Store calls that failed (local limiter used).",
                                    registry=reg)
        self._degraded = False
        self._last_log = 0.0

    async def close(self) -> None:
        if self.remote is not None:
            await self.remote.close()

    def health(self) -> dict[str, Any] | None:
        if self.remote is None:
            return None
        return {"store": "local-fallback" if self._degraded else "redis"}

    # -------------------------------------------------------------- store calls

    async def _call(self, op: str, *args: Any) -> Any:
        if self.remote is not None:
            try:
                result = await getattr(self.remote, op)(*args)
                if self._degraded:
                    self._degraded = False
                    log.info("rate-limit store is back")
                return result
            except StoreError as e:
                self.store_errors.inc()
                self._degraded = True
                now = time.monotonic()
                if now - self._last_log > 10:
                    self._last_log = now
                    log.warning("rate-limit store unavailable", error=str(e),
                                fallback=self.cfg.on_store_error)
                if self.cfg.on_store_error == "fail_closed":
                    if op == "admit":
                        raise Unavailable("Rate limiting is unavailable; retry shortly.",
                                          code="rate_limiter_unavailable") from None
                    return None
        return await getattr(self.local, op)(*args)

    # ------------------------------------------------------------------- request

    def _plan(self, ctx: RequestContext, reserve: int) -> tuple[
            list[Bucket], list[Bucket], list[tuple[str, int]], dict[str, str]]:
        rpm, tpm, conc = [], [], []
        per_of: dict[str, str] = {}
        for i, rule in enumerate(self.cfg.rules):
            value = _dimension(ctx, rule.per)
            lim: Limits = rule.overrides.get(value, rule)
            base = f"{self.cfg.redis.key_prefix}{i}:{rule.per}:{value}"
            if lim.rpm:
                rpm.append(Bucket(base + ":r", lim.rpm, 1))
                per_of[base + ":r"] = f"{rule.per}:rpm"
            if lim.tpm:
                tpm.append(Bucket(base + ":t", lim.tpm, reserve))
                per_of[base + ":t"] = f"{rule.per}:tpm"
            if lim.concurrent:
                conc.append((base + ":c", lim.concurrent))
        return rpm, tpm, conc, per_of

    @staticmethod
    def _headers(rpm: list[BucketState], tpm: list[BucketState]) -> dict[str, str]:
        h: dict[str, str] = {}
        for kind, states in (("requests", rpm), ("tokens", tpm)):
            if states:
                tight = min(states, key=lambda s: s.remaining)
                h[f"x-ratelimit-limit-{kind}"] = str(tight.limit)
                h[f"x-ratelimit-remaining-{kind}"] = str(max(0, tight.remaining))
                h[f"x-ratelimit-reset-{kind}"] = fmt_reset(tight.reset_ms)
        return h

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        reserve = estimate_tokens(ctx) + (ctx.request.output_limit or self.cfg.default_max_tokens)
        reserve *= max(1, ctx.request.n)
        rpm, tpm, conc, per_of = self._plan(ctx, reserve)
        lease = uuid.uuid4().hex
        conc_keys = [k for k, _ in conc]
        try:
            decision: Decision = await self._call("admit", rpm + tpm, conc, lease,
                                                  self.cfg.lease_s * 1000)
        except asyncio.CancelledError:
            # The client left while the store decided: the script may have taken the
            # lease and the tokens already. Give them back (a no-op if it had not).
            await asyncio.shield(self._settle(tpm, reserve, 0, conc_keys, lease))
            raise
        states = decision.states
        headers = self._headers(states[: len(rpm)], states[len(rpm):])
        if not decision.allowed:
            culprit = next((per_of[b.key] for s, b in zip(states, rpm + tpm, strict=True)
                            if s.remaining <= 0 and b.cost <= s.limit), "any:concurrent")
            per, limit = culprit.split(":")
            self.rejected.labels(per, limit).inc()
            retry_ms = max(decision.retry_after_ms, 1.0)
            raise RateLimited(
                "Rate limit reached for this API key; retry after the time given in "
                "Retry-After.",
                headers={**headers, "retry-after": str(max(1, math.ceil(retry_ms / 1000))),
                         "retry-after-ms": str(math.ceil(retry_ms))})
        ctx.response_headers.update(headers)
        try:
            reply = await call_next(ctx)
        except BaseException:
            # Shielded: a second cancellation must not leave the lease behind.
            await asyncio.shield(self._settle(tpm, reserve, 0, conc_keys, lease))
            raise
        if isinstance(reply, Completion):
            used = (reply.body.get("usage") or {}).get("total_tokens")
            await asyncio.shield(self._settle(tpm, reserve, used, conc_keys, lease))
            return reply
        assert isinstance(reply, Stream)
        return Stream(self._watch(reply, tpm, reserve, conc_keys, lease), reply.headers)

    async def _watch(self, reply: Stream, tpm: list[Bucket], reserve: int,
                     conc_keys: list[str], lease: str) -> AsyncIterator[dict[str, Any]]:
        used: int | None = None
        completed = False
        try:
            async for chunk in reply:
                usage = chunk.get("usage")
                if usage:
                    used = usage.get("total_tokens")
                yield chunk
            completed = True
        finally:
            # Without a usage chunk the reservation stands (the stream completed) or is
            # refunded (it did not).
            await asyncio.shield(self._settle(tpm, reserve, used if used is not None else
                                              (reserve if completed else 0), conc_keys, lease))
            await reply.aclose()

    async def _settle(self, tpm: list[Bucket], reserve: int, used: int | None,
                      conc_keys: list[str], lease: str) -> None:
        if tpm and used is not None and used != reserve:
            await self._call("adjust", [Bucket(b.key, b.limit, used - reserve) for b in tpm])
        if conc_keys:
            await self._call("release", conc_keys, lease)
