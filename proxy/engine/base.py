"""The Engine protocol and the engine-neutral types that cross it.

Serving (`proxy.serving`) speaks OpenAI on one side and this protocol on the other; only
`proxy/engine/vllm.py` knows vLLM. Tests use a fake twin (`tests/fakes.py`) with the
same protocol, as httpx pairs its transports with a mock one.

`generate` yields *deltas*: each `EngineOutput` carries the new text and tokens of the
choices that advanced since the last one. Closing the iterator early (client gone,
deadline) must abort the generation in the engine.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(slots=True)
class SamplingOptions:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    n: int = 1
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    #: None: no logprobs; k >= 0: the chosen token's logprob plus the top k.
    logprobs: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    json_schema: dict[str, Any] | None = None
    json_object: bool = False
    #: The request param the JSON schema came from, for the engine's refusals of it.
    schema_param: str = "response_format"
    #: False when a tool parser needs the model's special tokens (`<tool_call>`) in the text.
    skip_special_tokens: bool = True
    #: The caller reads only the finished answer (not streamed): an engine may hand it
    #: over in one output instead of one per step.
    final_only: bool = False


@dataclass(slots=True)
class TopLogprob:
    token: str
    logprob: float
    bytes: list[int] | None


@dataclass(slots=True)
class TokenLogprob:
    token: str
    logprob: float
    bytes: list[int] | None
    top: list[TopLogprob]


@dataclass(slots=True)
class ChoiceDelta:
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort" when it ended


@dataclass(slots=True)
class EngineOutput:
    choices: list[ChoiceDelta]
    prompt_tokens: int
    finished: bool
    cached_tokens: int = 0
    #: Which prompt of a multi-prompt request this output belongs to (set by the merger).
    prompt_index: int = 0


@dataclass(slots=True)
class ModelInfo:
    id: str
    owned_by: str
    root: str
    created: int
    max_model_len: int | None = None


@dataclass(slots=True)
class EngineStats:
    running: int = 0
    waiting: int = 0
    kv_cache_usage: float | None = None


@dataclass(slots=True)
class ParsedToolCall:
    """One call found in a whole answer; `arguments` is JSON text."""

    name: str
    arguments: str
    id: str | None = None


@dataclass(slots=True)
class ToolCallDelta:
    """A piece of a streamed call: id and name on a call's first piece, then arguments."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str | None = None


class ToolCallParser(Protocol):
    """The model's own tool-call syntax, read out of its text (one instance per answer:
    streaming parsers keep state between `feed` calls)."""

    def extract(self, text: str) -> tuple[str | None, list[ParsedToolCall]]:
        """A whole answer -> (content left over, calls)."""

    def feed(self, delta: str, token_ids: list[int]) -> tuple[str | None, list[ToolCallDelta]]:
        """The next piece of a streamed answer -> (content delta, call deltas)."""

    def finish(self) -> list[ToolCallDelta]:
        """At the end of a stream: argument text parsed but not yet sent."""


class EngineRejected(Exception):
    """The engine refused the request as invalid (maps to a 400)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class EngineOverloaded(Exception):
    """The engine refused the request for lack of capacity (maps to a 503)."""


class EngineFailed(Exception):
    """The engine failed while serving a valid request (maps to 5xx; counts for the breaker)."""


class Engine(Protocol):
    """A token-level engine that Weir drives itself (vLLM), and its lifecycle."""

    async def start(self) -> None:
        """Load the model and warm up. Returns when the engine can serve."""

    async def close(self) -> None:
        """Stop the engine and every process it started."""

    def ready(self) -> bool: ...

    def models(self) -> list[ModelInfo]: ...

    def stats(self) -> EngineStats: ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def vocab_size(self) -> int | None:
        """Token ids are below this (None: unknown, ids are not checked)."""

    def encode(self, text: str) -> list[int]:
        """Tokenize a completion prompt (with the model's BOS handling)."""

    def render_chat(self, messages: list[dict[str, Any]], tools: list[Any] | None) -> list[int]:
        """Apply the model's chat template and tokenize (generation prompt appended)."""

    def generate(
        self,
        prompt: list[int],
        options: SamplingOptions,
        request_id: str,
        *,
        cache_salt: str | None = None,
        priority: int = 0,
    ) -> AsyncGenerator[EngineOutput, None]: ...

    async def abort(self, request_id: str) -> None: ...

    def tool_parser(self, tools: list[dict[str, Any]]) -> ToolCallParser | None:
        """A fresh parser of the model's tool-call syntax for one answer, or None when
        none is configured (`engine.tool_parser`)."""
