"""Labelled counters whose label values are known up front export each series at 0 from
the start: `rate()` and `increase()` over a series that appears only at its first event
read nothing, not 0, so a dashboard panel or an alert on it stays empty until it fires."""

from __future__ import annotations

from plugins.admission.config import AdmissionConfig
from plugins.admission.plugin import AdmissionPlugin
from plugins.breaker.config import BreakerConfig
from plugins.breaker.plugin import BreakerPlugin
from proxy.chain import Services
from proxy.settings import Settings
from proxy.telemetry import Metrics
from tests.fakes import FakeEngine


def test_known_label_values_are_exported_at_zero_before_any_event() -> None:
    metrics = Metrics()
    services = Services(terminal=FakeEngine(), settings=Settings(), metrics=metrics)
    AdmissionPlugin(AdmissionConfig(), services)
    BreakerPlugin(BreakerConfig.model_validate(
        {"fallback": [{"kind": "static", "content": "busy"}]}), services)
    read = metrics.registry.get_sample_value
    for reason in ("full", "wait"):
        assert read("weir_admission_shed_total", {"reason": reason}) == 0
    for old, new in (("closed", "open"), ("open", "half_open"), ("half_open", "closed"),
                     ("half_open", "open")):
        assert read("weir_breaker_transitions_total",
                    {"from_state": old, "to_state": new}) == 0
    for reason in ("open", "engine", "shed"):
        assert read("weir_fallbacks_total", {"kind": "static", "reason": reason}) == 0
    for reason in ("refused", "evicted", "head_timeout", "head_too_large", "heads_in_flight",
                   "write_timeout"):
        assert read("weir_connections_closed_total", {"reason": reason}) == 0
    # (they appeared at their first abort: the first shutdown's cut was never counted)
    for reason in ("client_gone", "write_timeout", "shutdown"):
        assert read("weir_requests_aborted_total", {"reason": reason}) == 0


def test_the_similarity_histogram_has_the_hit_threshold_as_a_bucket() -> None:
    """Its buckets 0.7 and 0.8 straddled the default threshold, 0.71: the share of
    lookups scored under it (misses) could not be read off the histogram."""
    from plugins.cache.config import CacheConfig
    from plugins.cache.plugin import CachePlugin

    for threshold in (0.71, 0.83):
        metrics = Metrics()
        services = Services(terminal=FakeEngine(), settings=Settings(), metrics=metrics)
        CachePlugin(CacheConfig.model_validate({"semantic": {"threshold": threshold}}),
                    services)
        assert metrics.registry.get_sample_value(
            "weir_cache_semantic_similarity_bucket", {"le": str(threshold)}) == 0
