"""What one engine call carries besides its outputs: the mapping of engine exceptions
to OpenAI errors, and the `engine.generate` span."""

from __future__ import annotations

import time
from collections.abc import MutableMapping

from opentelemetry import trace
from opentelemetry.trace import SpanKind

from .engine.base import EngineFailed, EngineOverloaded, EngineRejected
from .errors import EngineError, InvalidRequest, Unavailable
from .tracing import ended_by, inject, tracer, tracing_enabled


def map_engine_error(e: BaseException) -> BaseException:
    """Engine exceptions as OpenAI errors; anything else unchanged."""
    if isinstance(e, EngineRejected):  # (a value the engine cannot take: as Weir's own
        return InvalidRequest(str(e), param=e.param, code="invalid_value")  # checks say)
    if isinstance(e, EngineOverloaded):
        return Unavailable("The engine is overloaded; retry shortly.", code="overloaded")
    if isinstance(e, EngineFailed):
        return EngineError("The engine failed while generating this answer.")
    return e


ENGINE_ERRORS = (EngineRejected, EngineOverloaded, EngineFailed)


class EngineSpan:
    """The `engine.generate` span (first-token event, token counts), or nothing at all
    when no tracer provider is installed. Started, not made current: it lives across the
    renderer's yields, where making it current would leak it into the consumer."""

    __slots__ = ("_span", "_started")

    def __init__(self, model: str) -> None:
        self._span = (tracer().start_span("engine.generate", kind=SpanKind.CLIENT,
                                          attributes={"gen_ai.request.model": model})
                      if tracing_enabled() else None)
        self._started = time.perf_counter()

    def first_token(self) -> None:
        if self._span is not None:
            self._span.add_event("first_token", {
                "weir.ttft_ms": round((time.perf_counter() - self._started) * 1e3, 2)})

    @property
    def recording(self) -> bool:
        """Whether there is a span (a tracer provider is installed) not yet ended."""
        return self._span is not None

    def inject(self, headers: MutableMapping[str, str]) -> None:
        """This span's context into an upstream call's headers (its `traceparent`): the
        upstream's server span is this client span's child. Without a span, the current
        context's (the caller's, as the server took it)."""
        inject(headers, trace.set_span_in_context(self._span) if self._span is not None
               else None)

    def end(self, prompt_tokens: int | None, completion_tokens: int | None,
            error: BaseException | None) -> None:
        """Once; a later call does nothing. A count that is None is not known (an
        upstream that sent no usage): the span says none, not 0."""
        span, self._span = self._span, None
        if span is None:
            return
        if error is not None:
            ended_by(span, error)
        if prompt_tokens is not None:
            span.set_attribute("gen_ai.usage.input_tokens", prompt_tokens)
        if completion_tokens is not None:
            span.set_attribute("gen_ai.usage.output_tokens", completion_tokens)
        span.end()
