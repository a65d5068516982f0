"""Logging (structlog) and metrics (Prometheus), configured once per process.

Processor order matters: contextvars first (request id bound by the middleware), then
level and timestamp, then `_redact` which drops secrets a careless call might pass
(`authorization`, `api_key`, ...), then the renderer (JSON by default).

Library loggers (`aiohttp`, `asyncio`, and any other through the root logger) go
through `LibraryLogBridge` into the same
structured log, never as raw tracebacks: aiohttp's parser errors quote the offending
request line or header (an `Authorization` key included) in the exception's message, so
only the exception's type and errno are kept; and a burst of the same record (a
"Too many open files" accept error, once per attempt) is logged once per
`_BURST_WINDOW_S` with a count of what was left out.

Each app owns a `Metrics` with its own registry, so two apps in one test process do not
share counters.
"""

from __future__ import annotations

import logging
import re
import sys
import time
import traceback
from bisect import bisect_left
from collections.abc import MutableMapping
from typing import Any

import structlog
from aiohttp.http_exceptions import BadHttpMessage
from aiohttp.web_protocol import RequestPayloadError
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

from .settings import LoggingSettings

# Each counter and histogram series had a `_created` gauge beside it (its start time),
# as many series again for Prometheus to store and a scrape to write, which no
# dashboard or alert reads. For the whole process: the
# plugins' metrics are prometheus_client's as well.
disable_created_metrics()  # type: ignore[no-untyped-call]

_SECRET_KEYS = {"authorization", "api_key", "apikey", "api-key", "x-api-key", "x_api_key", "key",
                "password", "token", "secret"}
#: Up to the longest a request may run by default (admission's 300 s deadline, an
#: upstream's 600 s timeout): past the top bucket, a p99 reads as that bucket.
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
                    30, 60, 120, 300, 600)


def _redact(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for k in list(event):
        if k.lower() in _SECRET_KEYS:
            event[k] = "[redacted]"
    return event


_BURST_WINDOW_S = 10.0
_LIBRARY_LOGGERS = ("aiohttp", "asyncio")
#: A format string's conversion (`%s`, `%r`, `%d`, `%.2f`, `%(name)s`, ...), with the
#: preposition that introduces it: the arguments are user data, the rest is not.
_PLACEHOLDER = re.compile(
    r"\s*(from|for|at)?\s*%(?:\([^)]*\))?[#0+\-]*(?:\d+|\*)?(?:\.(?:\d+|\*))?"
    r"[diouxXeEfFgGcrsa]")


def _dropped(m: re.Match[str]) -> str:
    """A conversion left out: a space stays where a word follows (`in %.2fs.`: `in s.`)."""
    rest = m.string[m.end():m.end() + 1]
    return " " if m.group(0)[:1].isspace() and rest.isalnum() else ""


class LibraryLogBridge(logging.Handler):
    """Stdlib records of library loggers -> structlog events, scrubbed and rate-limited.

    The message kept is the format string's first line (aiohttp's "Error handling
    request from %s" and asyncio's "socket.accept() out of system resource" name no
    user data there); arguments, exception messages and tracebacks are dropped.
    """

    def __init__(self, window_s: float = _BURST_WINDOW_S) -> None:
        super().__init__(logging.WARNING)
        self.window_s = window_s
        self._last: dict[tuple[str, str], tuple[float, int]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        try:
            event = _PLACEHOLDER.sub(_dropped, str(record.msg).split("\n", 1)[0])[:200]
            key = (record.name, event)
            now = time.monotonic()
            last, suppressed = self._last.get(key, (-1e18, 0))
            if now - last < self.window_s:
                self._last[key] = (last, suppressed + 1)
                return
            self._last[key] = (now, 0)
            if len(self._last) > 1024:  # bounded, whatever the libraries log
                self._last.clear()
            fields: dict[str, Any] = {"logger": record.name}
            if suppressed:
                fields["suppressed"] = suppressed
            exc = record.exc_info[1] if record.exc_info else None
            if exc is not None:
                fields["error"] = type(exc).__name__
                if isinstance(exc, OSError) and exc.errno is not None:
                    fields["errno"] = exc.errno
            level = record.levelname.lower()
            if isinstance(exc, BadHttpMessage | RequestPayloadError) and level == "error":
                # a malformed request (or a body its coding refused, read again by
                # aiohttp after the 400) is the client's error, not ours
                level = "warning"
            getattr(structlog.get_logger("weir.lib"), level)(event, **fields)
        except Exception:  # a log handler must never raise into the caller
            self.handleError(record)


def _bridge_library_loggers() -> None:
    """aiohttp's and asyncio's loggers, and the root logger: every other library's
    warnings (the OTLP exporter's, a collector down; Redis's client; urllib3's) reach it
    unless their library handles its own (vLLM's, which its own processes share), and
    went to stderr as plain text (`logging.lastResort`), arguments and all."""
    for name in (*_LIBRARY_LOGGERS, None):
        lib = logging.getLogger(name)
        for h in list(lib.handlers):
            if isinstance(h, LibraryLogBridge):
                lib.removeHandler(h)
        lib.addHandler(LibraryLogBridge())
        if name is None:
            continue  # (the root's level is the application's to set)
        lib.propagate = False  # not also to the root's handlers (or the last resort)
        if lib.level == logging.NOTSET or lib.level < logging.WARNING:
            lib.setLevel(logging.WARNING)


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
    _bridge_library_loggers()


def error_fields(e: BaseException, frames: int = 8) -> dict[str, str]:
    """What a log line may say of an unexpected exception: its type and where it was
    raised (the innermost frames, file:line in function), never its message or the
    locals a traceback shows: those may quote a prompt, an answer or a key."""
    tb = traceback.extract_tb(e.__traceback__)[-frames:]
    return {"error": type(e).__name__,
            "at": " < ".join(f"{_short(f.filename)}:{f.lineno} in {f.name}"
                             for f in reversed(tb))}


def _short(filename: str) -> str:
    """A frame's file from its package down (`proxy/routes.py`, `vllm/...`)."""
    _, installed, inside = filename.rpartition("/site-packages/")
    if installed:
        return inside
    for mark in ("/proxy/", "/plugins/"):
        i = filename.rfind(mark)
        if i >= 0:
            return filename[i + 1:]
    return filename.rsplit("/", 1)[-1]


class OutageLog:
    """When to log a dependency's outage: that it failed at most once per `every_s` (per
    `key`, an operation), and that it is back only after such a line, once. A store
    that failed every call of a burst, or only some calls (Redis out of memory: writes
    fail, reads answer), logged hundreds of lines a minute."""

    def __init__(self, every_s: float = 10.0) -> None:
        self.every_s = every_s
        self._last: dict[str, float] = {}
        self._told = False  # a line said it was down, and none since that it is back

    def down(self, key: str = "") -> bool:
        """Whether to log this failure now."""
        now = time.monotonic()
        if now - self._last.get(key, float("-inf")) <= self.every_s:
            return False
        self._last[key] = now
        self._told = True
        return True

    def back(self) -> bool:
        """Whether to log that it is back (once per line that said it was down)."""
        told, self._told = self._told, False
        return told


def get_logger(name: str) -> Any:
    return structlog.get_logger(name)


_CHILDREN_MAX = 4096


def labelled(metric: Any, *values: str) -> Any:
    """`metric.labels(*values)`, memoised on the metric. prometheus_client validates the
    values and takes a lock on every `labels` call, a few per cent of a cache hit's CPU at
    thousands of requests a second. Past `_CHILDREN_MAX` label sets nothing more is
    memoised (the metric itself still holds every child)."""
    memo: dict[tuple[str, ...], Any] | None = metric.__dict__.get("_weir_children")
    if memo is None:
        memo = metric.__dict__["_weir_children"] = {}
    got = memo.get(values)
    if got is None:
        got = metric.labels(*values)
        if len(memo) < _CHILDREN_MAX:
            memo[values] = got
    return got


class Observations:
    """Observations of one histogram child (`labelled`), counted here and added to it in
    one go (`flush`): what `observe` costs (a bucket search in Python, two values each
    behind a lock) once per batch, not once per value (a streamed chunk's gap). The
    histogram reads the same once flushed; until then it lags by what is held, at most
    `batch` values. A histogram that keeps its buckets otherwise than prometheus_client's
    (no `_upper_bounds`, `_buckets`, `_sum`) is observed value by value."""

    __slots__ = ("_batch", "_bounds", "_child", "_counts", "_held", "_sum")

    def __init__(self, child: Any, batch: int = 256) -> None:
        self._child, self._batch = child, batch
        bounds = getattr(child, "_upper_bounds", None)
        buckets = getattr(child, "_buckets", None)
        ok = (isinstance(bounds, list) and isinstance(buckets, list)
              and len(bounds) == len(buckets) and hasattr(child, "_sum"))
        self._bounds: list[float] | None = bounds if ok else None
        self._counts = [0] * len(bounds) if ok and bounds else []
        self._sum = 0.0
        self._held = 0

    def observe(self, value: float) -> None:
        if self._bounds is None:
            self._child.observe(value)
            return
        # (the first bucket whose bound is at least the value: `observe`'s `<=`)
        self._counts[bisect_left(self._bounds, value)] += 1
        self._sum += value
        self._held += 1
        if self._held >= self._batch:
            self.flush()

    def flush(self) -> None:
        """Add what is held to the histogram."""
        if not self._held:
            return
        child, counts = self._child, self._counts
        child._sum.inc(self._sum)
        for i, n in enumerate(counts):
            if n:
                child._buckets[i].inc(n)
                counts[i] = 0
        self._sum, self._held = 0.0, 0


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("weir_requests_total", "HTTP requests answered.",
                                ["route", "model", "status"], registry=r)
        self.latency = Histogram("weir_request_duration_seconds", "End-to-end latency.",
                                 ["route", "model", "status"], buckets=_LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("weir_time_to_first_token_seconds", "Time to first token as "
                              "clients saw it: cache replays and fallbacks included.",
                              ["route", "model"], buckets=_LATENCY_BUCKETS, registry=r)
        self.tokens = Counter("weir_tokens_total", "Tokens in and out of the answers "
                              "clients got: cache hits and shared generations included "
                              "(the engine's own work is vLLM's metrics').",
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
        for reason in ("client_gone", "write_timeout", "shutdown"):
            self.aborted.labels(reason)  # (at 0 before the first, as below)
        self.connections = Gauge("weir_connections_open", "Client connections open.",
                                 registry=r)
        self.connections_closed = Counter(
            "weir_connections_closed_total", "Client connections Weir closed on its own "
            "(refused at the cap, idle evicted at the cap, request head too slow or too "
            "large, too many heads arriving at once, an answer its client stopped "
            "reading).", ["reason"], registry=r)
        for reason in ("refused", "evicted", "head_timeout", "head_too_large",
                       "heads_in_flight", "write_timeout"):  # (each at 0 before its first)
            self.connections_closed.labels(reason)

    def render(self) -> bytes:
        return generate_latest(self.registry)
