"""Cache config: scope, the exact tiers (L1 in process, L2 in Redis), the semantic layer."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from proxy.chain import PluginConfig
from proxy.config_model import ConfigModel
from proxy.redis_client import RedisUrl


class _Part(ConfigModel):
    pass


class L1Config(_Part):
    enabled: bool = Field(True, description="In-process LRU of exact answers.")
    max_bytes: int = Field(
        64 * 2**20, ge=1024, description="Memory bound of the LRU; when full, the tenant "
        "holding the most loses its least recently used entry (one tenant's flood evicts "
        "its own entries, not those of tenants holding less).")
    max_bytes_per_tenant: int | None = Field(
        None, ge=1024, description="The most one tenant's entries may take, even while "
        "the LRU has room (null: up to max_bytes, shared fairly as above).")
    ttl_s: float = Field(3600, gt=0, description="Seconds an entry is fresh.")


class L2Config(_Part):
    enabled: bool = Field(False, description="Exact answers in Redis, shared by replicas.")
    ttl_s: float = Field(86400, gt=0, description="Seconds an entry is fresh.")


class SemanticConfig(_Part):
    enabled: bool = Field(True, description="Answer paraphrases of stored questions.")
    threshold: float = Field(
        0.71, gt=0, le=1,
        description="Cosine similarity needed to hit (with the default embedding model; "
                    "tuned on tests/data/semantic_tune.yaml, see bench/results/embedders.md).")
    guard: bool = Field(True, description="Numbers, negations, names, directions and "
                                          "added instructions must agree too.")
    ttl_s: float = Field(86400, gt=0, description="Seconds an entry is fresh.")
    max_entries_per_scope: int = Field(10000, ge=1, description="Index size per partition.")
    max_partitions: int = Field(
        1024, ge=1, description="Partitions (scope, model, earlier turns, parameters) kept "
        "in memory; when full, the least recently used one of the tenant holding the most "
        "goes whole (one tenant's many seeds or parameter sets drop its own partitions, "
        "not those of tenants holding fewer).")
    max_partitions_per_tenant: int | None = Field(
        None, ge=1, description="The most partitions one tenant may hold, even while "
        "there is room (null: up to max_partitions, shared fairly as above).")
    max_bytes: int = Field(
        256 * 2**20, ge=2**20, description="Memory bound of the whole semantic index (its "
        "vectors, and the answers, questions and bookkeeping its entries keep beside "
        "them); when full, the tenant holding the most loses the oldest entry of its "
        "least recently used partition. Without it, max_partitions x "
        "max_entries_per_scope entries could take tens of GB. Answers waiting for "
        "their vectors (lazy) take at most as much again.")
    lookup_timeout_ms: float = Field(
        100, gt=0, description="A lookup's embedding wait; slower lookups are a miss.")
    head_start_ms: float = Field(
        5, ge=0, description="How long a miss waits for its semantic lookup before it "
        "starts generating alongside it: a lookup that hits later cancels the generation "
        "(its prefill is the price), one that misses has cost the request nothing more. "
        "0: always alongside; at or above lookup_timeout_ms: never.")
    lazy: bool = Field(
        True, description="With the guard on: a question that no stored question's numbers, "
        "names, negations and instructions match is not embedded to look it up (it cannot "
        "hit), and its answer's question is embedded only once a lookup could use it or "
        "the gateway is idle (until then it is an exact entry only). Off: every miss is "
        "embedded at once.")
    min_chars: int = Field(8, ge=1, description="Shorter questions are not embedded.")
    max_chars: int = Field(
        2000, ge=1, description="Longer questions are not embedded (no semantic lookup or "
        "entry): FAQ-style repeats are short, and the model reads only its first 256 "
        "tokens anyway.")


class RedisConfig(_Part):
    url: RedisUrl | None = Field(None, description="redis://host:port/db (None: no Redis).")
    timeout_s: float = Field(0.05, gt=0, description="Per-command timeout of reads (on "
                             "the request's path; at least this long and four turns "
                             "of the event loop); slower = down.")
    write_timeout_s: float = Field(
        1.0, gt=0, description="Per-command timeout of writes (storing an answer, "
        "evictions, deletes, events), which run after the answer has gone out: a busy "
        "Redis still takes them instead of the entry being lost.")
    key_prefix: str = Field("weir:cache:", min_length=1, description="Prefix of every key.")
    max_connections: int = Field(64, ge=1, description="Connection pool size.")
    max_bytes_per_tenant: int | None = Field(
        256 * 2**20, ge=1024, description="The most one tenant's entries (exact and "
        "semantic, as stored: UTF-8 bytes) may take in Redis; past it the tenant's oldest "
        "go, from Redis and every replica's memory, so one tenant's flood does not fill "
        "Redis up to its maxmemory and evict the other tenants' entries (the callers a "
        "gateway key forwards for count as that key's tenant). Size Redis's maxmemory for "
        "the tenants' bounds. An entry larger than the bound is not stored in Redis. "
        "null: no bound.")
    store_prompts: bool = Field(
        False, description="Also keep the prompt text in Redis entries (needed for a purge "
        "by content to reach them). Off: Redis holds keys, vectors, a hash for the semantic "
        "guard and the answer; the prompt stays in process memory only.")


class CacheConfig(PluginConfig):
    scope: Literal["tenant", "role", "user", "global"] = Field(
        "tenant", description="Who shares entries (from the API key's principal).")
    exact: L1Config = Field(default_factory=L1Config)
    l2: L2Config = Field(default_factory=L2Config)
    semantic: SemanticConfig = Field(default_factory=SemanticConfig)
    redis: RedisConfig = Field(default_factory=RedisConfig)
    deterministic_only: bool = Field(
        True, description="Cache only greedy (temperature below 1e-5, or top_p 0) or seeded "
        "requests.")
    store_truncated: bool = Field(False, description="Also store answers cut by max_tokens.")
    per_user_max_entries: int = Field(
        5000, ge=1, description=(
            "Entries one user may own, the oldest going first (with the semantic layer "
            "on, parts: an entry has two, an exact-only answer one)."))
    sensitive_patterns: list[str] = Field(
        default_factory=list, description="Regexes: matching requests bypass the cache.")
    stale_grace_s: float = Field(
        0, ge=0, description="Expired entries kept this long for fallbacks (x-weir-cache: stale).")
    coalesce: bool = Field(True, description="Identical concurrent misses share one generation.")

    @field_validator("sensitive_patterns")
    @classmethod
    def _compile(cls, v: list[str]) -> list[str]:
        for p in v:
            try:
                re.compile(p)
            except re.error as e:
                raise ValueError(f"not a valid regular expression {p!r}: {e}") from None
        return v

    @model_validator(mode="after")
    def _l2_needs_redis(self) -> CacheConfig:
        if self.l2.enabled and not self.redis.url:
            raise ValueError("l2.enabled needs redis.url")
        return self
