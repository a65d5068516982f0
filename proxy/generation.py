"""What one engine call carries besides its outputs: the mapping of engine exceptions
to OpenAI errors, and the `engine.generate` span."""

from __future__ import annotations

import time

from opentelemetry.trace import SpanKind, Status, StatusCode

from .engine.base import EngineFailed, EngineOverloaded, EngineRejected
from .errors import EngineError, InvalidRequest, Unavailable
from .tracing import tracer, tracing_enabled


def map_engine_error(e: BaseException) -> BaseException:
    """Engine exceptions as OpenAI errors; anything else unchanged."""
    if isinstance(e, EngineRejected):
        return InvalidRequest(str(e), param=e.param)
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

    def end(self, prompt_tokens: int, completion_tokens: int,
            error: BaseException | None) -> None:
        if self._span is None:
            return
        if error is not None:
            self._span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        self._span.set_attribute("gen_ai.usage.input_tokens", prompt_tokens)
        self._span.set_attribute("gen_ai.usage.output_tokens", completion_tokens)
        self._span.end()
