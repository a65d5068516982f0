"""Rate-limit config: rules per dimension, the store, and what to do when it fails."""

from __future__ import annotations

import hashlib
import re
from typing import Literal

from pydantic import Field, model_validator

from proxy.chain import PluginConfig
from proxy.config_model import ConfigModel
from proxy.redis_client import RedisUrl

#: A key as a per-key rule's overrides name it (`Principal.key_id`).
_FINGERPRINT = re.compile(r"[0-9a-f]{12}")

Per = Literal["key", "user", "tenant", "role", "model", "global"]


class Limits(ConfigModel):
    rpm: int | None = Field(None, ge=1, description="Requests per minute.")
    tpm: int | None = Field(None, ge=1, description="Tokens per minute (prompt + completion).")
    concurrent: int | None = Field(None, ge=1, description="Requests in flight at once.")


class Rule(Limits):
    per: Per = Field("key", description="What the limit is counted per.")
    overrides: dict[str, Limits] = Field(
        default_factory=dict,
        description="Limits for particular values: a tenant (`acme`), a model, a key's "
                    "fingerprint (the first 12 hex digits of its SHA-256); "
                    "users and roles within their tenant (`acme/alice`, `acme/analyst`). "
                    "Each names only what changes: the rule's other limits still hold "
                    "(`null` lifts one).")

    def limits_for(self) -> dict[str, Limits]:
        """Each override merged over the rule's own limits: what it sets replaces them
        (a `null` it sets lifts one), the rest stay."""
        return {value: self._merged(o) for value, o in self.overrides.items()}

    def _merged(self, override: Limits) -> Limits:
        own = {k: getattr(self, k) for k in Limits.model_fields}
        named = override.model_dump(include=override.model_fields_set)
        return Limits.model_construct(**{**own, **named})  # (both validated already)

    @model_validator(mode="after")
    def _some_limit(self) -> Rule:
        if self.rpm is None and self.tpm is None and self.concurrent is None:
            raise ValueError("a rule needs rpm, tpm or concurrent")
        return self

    @model_validator(mode="after")
    def _overrides_can_match(self) -> Rule:
        """An override that can never match is an error, not a limit that silently never
        applies: users and roles are counted within their tenant."""
        if self.per in ("user", "role"):
            bad = [k for k in self.overrides if k.count("/") != 1 or k.startswith("/")
                   or k.endswith("/")]
            if bad:
                raise ValueError(f"overrides of a per-{self.per} rule are keyed "
                                 f"`tenant/{self.per}` (e.g. `acme/{bad[0].strip('/')}`), "
                                 f"not `{bad[0]}`")
        if self.per == "key":
            # (a key is known by its fingerprint only: `anonymous` is every caller's
            # where auth is open)
            unnamed = [i for i, k in enumerate(self.overrides)
                   if k != "anonymous" and not _FINGERPRINT.fullmatch(k)]
            if unnamed:
                # (never the name itself: it may be the key, and this line is logged)
                name = list(self.overrides)[unnamed[0]]
                digest = hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()
                hint = (f"write it lowercase, `{name.lower()}`"
                        if _FINGERPRINT.fullmatch(name.lower()) else
                        f"were it the key itself, its fingerprint is `{digest[:12]}`")
                raise ValueError(f"overrides of a per-key rule are keyed by the key's "
                                 f"fingerprint, the first 12 hex digits (lowercase) of its "
                                 f"SHA-256 (`printf %s KEY | sha256sum | cut -c1-12`): the "
                                 f"name of override {unnamed[0] + 1} (of {len(self.overrides)}) "
                                 f"is none ({hint})")
        if self.per == "global" and self.overrides:
            raise ValueError("a global rule has one value: give its limits, not overrides")
        empty = [k for k, o in self.overrides.items() if not o.model_fields_set]
        if empty:  # (it meant "no limits"; an override now changes only what it names)
            raise ValueError(f"the override for `{empty[0]}` names no limit: set rpm, tpm "
                             "or concurrent (`null` lifts one)")
        return self


class RedisLimits(ConfigModel):
    url: RedisUrl | None = Field(None, description="redis://host:port/db")
    timeout_s: float = Field(0.05, gt=0, description="Per-call timeout of Redis's answer "
                             "(at least this long and four turns of the event loop); "
                             "slower = down.")
    key_prefix: str = Field("weir:rl:", min_length=1, description="Prefix of every key.")


class RateLimitConfig(PluginConfig):
    store: Literal["memory", "redis"] = Field("memory", description="Where counters live.")
    redis: RedisLimits = Field(default_factory=RedisLimits)
    on_store_error: Literal["fail_open", "fail_closed"] = Field(
        "fail_open", description="fail_open: a local limiter stands in; fail_closed: 503.")
    rules: list[Rule] = Field(
        default_factory=lambda: [Rule(per="key", rpm=600, tpm=1_000_000, concurrent=64)],
        min_length=1, description="Every rule applies to every request (at least one: "
        "without rules, leave the plugin out).")
    default_max_tokens: int = Field(
        256, ge=1, description="Completion tokens reserved when a request sets no maximum.")
    lease_s: float = Field(
        30, ge=1, le=86_400, description="A concurrency slot's lease: renewed every "
        "lease_s/3 while its request runs, so a slot every release missed (a crash) frees "
        "itself this soon (at most a day: Redis refused the expiry of a lease of 1e14 s "
        "or more, and every admission fell back to the local limiter).")

    @model_validator(mode="after")
    def _redis_url(self) -> RateLimitConfig:
        if self.store == "redis" and not self.redis.url:
            raise ValueError("store `redis` needs redis.url")
        return self
