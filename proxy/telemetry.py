"""Logging (structlog) and metrics (Prometheus), configured once per process.

Processor order matters: contextvars first (request id bound by the middleware), then
level and timestamp, then `_redact` which drops secrets a careless call might pass
(`authorization`, `api_key`, ...), then the renderer (JSON by default).

Each app owns a `Metrics` with its own registry, so two apps in one test process do not
share counters.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from .settings import LoggingSettings

_SECRET_KEYS = {"authorization", "api_key", "apikey", "key", "password", "token", "secret"}
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
                    30, 60, 120)


def _redact(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for k in list(event):
        if k.lower() in _SECRET_KEYS:
            event[k] = "[redacted]"
    return event


def configure_logging(settings: LoggingSettings, stream: Any = None) -> None:
    level = getattr(logging, settings.level.upper())
    renderer: Any = (
        structlog.dev.ConsoleRenderer(colors=False)
        if settings.format == "console"
        else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _redact,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=stream or sys.stderr),
        cache_logger_on_first_use=False,
    )
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def get_logger(name: str) -> Any:
    return structlog.get_logger(name)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("weir_requests_total", "HTTP requests answered.",
                                ["route", "model", "status"], registry=r)
        self.latency = Histogram("weir_request_duration_seconds", "End-to-end latency.",
                                 ["route", "model"], buckets=_LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("weir_time_to_first_token_seconds", "Time to first token.",
                              ["route", "model"], buckets=_LATENCY_BUCKETS, registry=r)
        self.tokens = Counter("weir_tokens_total", "Tokens processed.",
                              ["model", "kind"], registry=r)
        self.in_flight = Gauge("weir_requests_in_flight", "Requests being served.", registry=r)
        self.engine_running = Gauge("weir_engine_requests_running",
                                    "Requests unfinished in the engine.", registry=r)
        self.engine_waiting = Gauge("weir_engine_requests_waiting",
                                    "Requests waiting in the engine's scheduler.", registry=r)
        self.kv_cache = Gauge("weir_engine_kv_cache_usage_ratio",
                              "Share of the engine's KV cache in use.", registry=r)
        self.gpu_memory = Gauge("weir_gpu_memory_used_bytes", "GPU memory in use.", ["gpu"],
                                registry=r)
        self.itl = Histogram("weir_inter_token_latency_seconds",
                             "Time between streamed chunks.", ["route", "model"],
                             buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1),
                             registry=r)
        self.aborted = Counter("weir_requests_aborted_total",
                               "Requests aborted before they ended.", ["reason"], registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
