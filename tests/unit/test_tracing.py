"""Spans inside a request cost nothing when no tracer provider is configured."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from proxy import tracing


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
