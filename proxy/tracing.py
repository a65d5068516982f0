"""OpenTelemetry tracing: set up once per process, used through the global API.

Spans: `HTTP POST /v1/chat/completions` (server; the W3C `traceparent` of the request is
its parent) -> `plugin <name>` for each chain step -> `engine.generate` (a `first_token`
event, token counts; a client span, the local engine's or an upstream's call) and
`redis <op>` for every Redis call. The trace context goes on to an upstream engine in
`traceparent`, its parent the `engine.generate` span. Spans carry no prompt text, no API key and no
header values; without an exporter configured, the spans inside a request are not
made at all. A span's status is an error for a failure only, as the server span's is for
a 5xx: a refusal of the client's request (a 4xx) is named in `weir.refused`, the
client gone in `weir.cancelled`.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import context, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .errors import WeirError
from .settings import TracingSettings

_propagator = TraceContextTextMapPropagator()
_configured = False
_provider: Any = None  # (the SDK's TracerProvider, once configured)


def tracing_enabled() -> bool:
    """Whether a tracer provider was installed (spans inside requests are made)."""
    return _configured


def tracer() -> trace.Tracer:
    return trace.get_tracer("weir")


def configure_tracing(settings: TracingSettings, exporter: Any = None) -> None:
    """Install the SDK's tracer provider (once per process). `exporter` overrides the
    settings (tests pass an in-memory exporter)."""
    global _configured, _provider
    if _configured or (settings.exporter == "none" and exporter is None):
        return
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SimpleSpanProcessor,
    )
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    # (not shut down at the interpreter's exit: `shutdown_tracing` bounds that wait)
    provider = TracerProvider(
        resource=Resource.create({"service.name": settings.service_name}),
        sampler=ParentBased(TraceIdRatioBased(settings.sample_ratio)),
        shutdown_on_exit=False)
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    elif settings.exporter == "console":
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    else:
        provider.add_span_processor(BatchSpanProcessor(_otlp(settings)))
    trace.set_tracer_provider(provider)
    _provider = provider
    _configured = True


def shutdown_tracing(timeout_s: float = 3.0) -> bool:
    """Export the spans still queued, waiting at most `timeout_s`: whether it finished.
    The SDK's own exit hook waited for its exporter without a bound of ours: a collector
    that accepts connections and never answers held every shutdown for the exporter's
    whole timeout (10 s, Weir's teardown budget), to end in "shutdown overran"."""
    return _shut_down(_provider, timeout_s)


def _shut_down(provider: Any, timeout_s: float) -> bool:
    if provider is None:
        return True
    # (its processors' threads are daemons: one still waiting does not hold the exit)
    worker = threading.Thread(target=provider.shutdown, name="weir-tracing-shutdown",
                              daemon=True)
    worker.start()
    worker.join(timeout_s)
    return not worker.is_alive()


#: What the OpenTelemetry SDK reads to choose TLS for a gRPC exporter (`insecure`, a
#: CA certificate): an operator who set one chose, and the SDK decides by it.
_GRPC_TLS_ENV = ("OTEL_EXPORTER_OTLP_TRACES_INSECURE", "OTEL_EXPORTER_OTLP_INSECURE",
                 "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", "OTEL_EXPORTER_OTLP_CERTIFICATE")


def _grpc_insecure(endpoint: str | None) -> bool | None:
    """Plaintext unless the endpoint says `https://`: the SDK opened TLS to an endpoint
    with no scheme (`otel-collector:4317`, as documented), which a collector's plaintext
    OTLP port refuses, and no span was ever exported. Where the environment says
    (`OTEL_EXPORTER_OTLP_INSECURE=false`, a certificate), None: the SDK's choice by it
    (an `https://` endpoint is TLS whatever it says)."""
    if any(os.environ.get(name) for name in _GRPC_TLS_ENV):
        return None
    return not (endpoint or "").lower().startswith("https://")


def _otlp(settings: TracingSettings) -> Any:
    if settings.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=settings.endpoint,
                                insecure=_grpc_insecure(settings.endpoint))
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    return HttpExporter(endpoint=settings.endpoint)


def extract(headers: Mapping[str, str]) -> context.Context:
    return _propagator.extract(carrier=dict(headers))


def inject(headers: MutableMapping[str, str], ctx: context.Context | None = None) -> None:
    """Write `ctx`'s span context (by default the current one) into outgoing headers
    (`traceparent`)."""
    _propagator.inject(carrier=headers, context=ctx)


@contextmanager
def span(name: str, kind: SpanKind = SpanKind.INTERNAL, **attributes: Any) -> Iterator[Span]:
    if not _configured:
        # No tracer provider: nothing would record these spans, and the request's own
        # context (set by the server span) is what goes upstream. The API's no-op path
        # still costs two context managers and a contextvar swap per span, a share of
        # the event loop worth saving at thousands of spans a second.
        yield trace.INVALID_SPAN
        return
    with tracer().start_as_current_span(name, kind=kind, attributes=attributes or None,
                                        record_exception=False,
                                        set_status_on_exception=False) as s:
        try:
            yield s
        except BaseException as e:
            ended_by(s, e)
            raise


def ended_by(s: Span, e: BaseException) -> None:
    """What an exception through a span makes of it, as the server span counts its
    status: a failure is an error; a refusal of the client's request (a 4xx: a limit, a
    bad request, a block) is named in `weir.refused`, and a cancellation (the client
    gone) is `weir.cancelled`, neither an error."""
    if isinstance(e, asyncio.CancelledError | GeneratorExit):
        s.set_attribute("weir.cancelled", True)
    elif isinstance(e, WeirError) and e.status < 500:
        s.set_attribute("weir.refused", type(e).__name__)
    else:
        if isinstance(e, WeirError) and e.code:  # (why: a shed's `overloaded`)
            s.set_attribute("error.type", e.code[:64])
        s.set_status(Status(StatusCode.ERROR, type(e).__name__))
