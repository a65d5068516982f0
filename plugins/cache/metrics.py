"""The cache's metrics, made once per plugin in its services' registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

#: The similarity histogram's bounds, with the hit threshold among them (`similarity_buckets`).
_SIMILARITY = (0.5, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.98, 1.0)


def similarity_buckets(threshold: float | None) -> tuple[float, ...]:
    """The histogram's bounds with the threshold among them: the share of lookups that
    scored under it (a miss) reads off one bucket, not between two that straddle it."""
    if threshold is None:
        return _SIMILARITY
    return tuple(sorted({*_SIMILARITY, round(threshold, 4)}))


class CacheMetrics:
    def __init__(self, registry: CollectorRegistry, threshold: float | None = None) -> None:
        self.lookups = Counter("weir_cache_lookups_total", "Cache lookups.",
                               ["layer", "result"], registry=registry)
        self.similarity = Histogram("weir_cache_semantic_similarity",
                                    "Best semantic score per lookup.", registry=registry,
                                    buckets=similarity_buckets(threshold))
        self.store_errors = Counter("weir_cache_store_errors_total",
                                    "Redis operations that failed or timed out.", ["op"],
                                    registry=registry)
        self.coalesced = Counter("weir_cache_coalesced_total",
                                 "Requests answered by another request's generation.",
                                 registry=registry)
        self.entries = Gauge("weir_cache_entries", "Entries held by this replica.",
                             ["layer"], registry=registry)
        self.overlapped = Counter(
            "weir_cache_overlapped_total", "Misses that started generating while their "
            "semantic lookup ran: the generation kept (the lookup missed), or cancelled "
            "(it hit).", ["result"], registry=registry)
        self.gated = Counter(
            "weir_cache_semantic_gated_total", "Semantic lookups that were a miss without "
            "an embedding: no stored question in the partition shares the question's "
            "numbers, names, negations and instructions, so none could pass the guard.",
            registry=registry)
        self.events = Counter(
            "weir_cache_events_total", "Cache events heard from the other replicas (an "
            "answer stored, a purge, an eviction) and applied here.", ["op"],
            registry=registry)
