"""Spans inside a request cost nothing when no tracer provider is configured."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from proxy import tracing
from proxy.settings import TracingSettings


def test_unconfigured_spans_are_not_made_and_keep_the_request_context(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing, "_configured", False)
    parent = NonRecordingSpan(SpanContext(trace_id=0x1234, span_id=0x5678, is_remote=True,
                                          trace_flags=TraceFlags(1)))
    with trace.use_span(parent):
        with tracing.span("plugin cache") as s:
            assert not s.is_recording()
            # The request's context is still current: it is what goes upstream.
            assert trace.get_current_span() is parent
            headers: dict[str, str] = {}
            tracing.inject(headers)
            assert headers["traceparent"].split("-")[1] == f"{0x1234:032x}"
        with pytest.raises(ValueError), tracing.span("plugin breaker"):
            raise ValueError("propagates unchanged")


class _Stuck:
    """An OTLP exporter whose collector accepts and never answers: `export` waits."""

    def __init__(self) -> None:
        self.exporting = threading.Event()
        self.release = threading.Event()

    def export(self, spans: Any) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        self.exporting.set()
        self.release.wait(30)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def test_the_shutdown_waits_for_a_stuck_collector_no_longer_than_its_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK's exit hook (`shutdown_on_exit`) waited for the exporter without a bound of
    Weir's: a collector that never answered held each shutdown for the exporter's timeout
    (10 s), Weir's whole teardown budget. The provider is made without it, and
    `shutdown_tracing` gives up on a stuck export after its bound."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    made: list[Any] = []
    monkeypatch.setattr(tracing, "_configured", False)
    monkeypatch.setattr(tracing, "_provider", None)
    monkeypatch.setattr(tracing.trace, "set_tracer_provider", made.append)
    monkeypatch.setattr(tracing, "_otlp", lambda settings: _Stuck())
    tracing.configure_tracing(TracingSettings(exporter="otlp"))
    provider = made[0]
    assert provider._atexit_handler is None  # (no unbounded wait at the interpreter's exit)

    stuck = _Stuck()
    mine = TracerProvider()
    mine.add_span_processor(BatchSpanProcessor(stuck))
    mine.get_tracer("t").start_span("s").end()
    monkeypatch.setattr(tracing, "_provider", mine)
    try:
        assert tracing.shutdown_tracing(0.2) is False  # (its export, still under way)
        assert stuck.exporting.wait(30)
    finally:
        stuck.release.set()
    for processor in (mine, provider):
        assert tracing._shut_down(processor, 30) is True  # (not stuck: it finishes)


@pytest.mark.parametrize("scheme", ["", "http://"])
def test_a_grpc_endpoint_without_https_reaches_a_plaintext_collector(scheme: str) -> None:
    """The documented gRPC endpoint (`otel-collector:4317`, no scheme) had the exporter
    open TLS to it: a collector's ordinary plaintext OTLP port refused every handshake,
    and no span was ever exported (only a warning that said so, retried for good). A
    gRPC endpoint is plaintext unless it says `https://`."""
    from concurrent import futures

    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as pb
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as pb_grpc
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    got: list[str] = []

    class Collector(pb_grpc.TraceServiceServicer):  # type: ignore[misc]
        def Export(self, request: Any, context: Any) -> Any:  # (gRPC names it)
            got.extend(s.name for rs in request.resource_spans for ss in rs.scope_spans
                       for s in ss.spans)
            return pb.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(1))
    pb_grpc.add_TraceServiceServicer_to_server(Collector(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        exporter = tracing._otlp(TracingSettings(exporter="otlp", protocol="grpc",
                                                 endpoint=f"{scheme}127.0.0.1:{port}"))
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        with provider.get_tracer("t").start_as_current_span("exported"):
            pass
        provider.shutdown()
    finally:
        server.stop(0)
    assert got == ["exported"]


def test_an_https_grpc_endpoint_keeps_tls() -> None:
    exporter = tracing._otlp(TracingSettings(exporter="otlp", protocol="grpc",
                                             endpoint="https://collector.example:4317"))
    assert exporter._insecure is False  # (the SDK's own record of it)
    exporter.shutdown()


@pytest.mark.parametrize("env", [{"OTEL_EXPORTER_OTLP_INSECURE": "false"},
                                 {"OTEL_EXPORTER_OTLP_TRACES_INSECURE": "false"},
                                 {"OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": "/etc/ca.pem"}])
def test_a_grpc_endpoint_keeps_the_tls_its_environment_asks_for(
        env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Plaintext for an endpoint with no scheme was forced on the SDK, which then read
    none of what the OpenTelemetry variables say of TLS: `OTEL_EXPORTER_OTLP_INSECURE=
    false` (or a CA certificate to trust) sent the spans in the clear to a collector
    that takes TLS only, none exported. Where they are set, they decide."""
    import grpc
    import opentelemetry.exporter.otlp.proto.grpc.exporter as mixin
    import opentelemetry.exporter.otlp.proto.grpc.trace_exporter as spans

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for module in (mixin, spans):  # (no certificate file to read here)
        monkeypatch.setattr(module, "_get_credentials",
                            lambda *a, **k: grpc.ssl_channel_credentials())
    exporter = tracing._otlp(TracingSettings(exporter="otlp", protocol="grpc",
                                             endpoint="collector.example:4317"))
    assert exporter._insecure is False
    exporter.shutdown()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")  # (and the other way)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_INSECURE", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", raising=False)
    exporter = tracing._otlp(TracingSettings(exporter="otlp", protocol="grpc",
                                             endpoint="collector.example:4317"))
    assert exporter._insecure is True
    exporter.shutdown()
