"""The chain's last step, chosen in one place.

A Terminal serves a request the plugins passed on (`__call__`) and tells the app what it
needs to know of whatever serves: lifecycle, readiness, models, load, and any HTTP routes
of its own. Two kinds: `LocalServing` over an in-process Engine (vLLM, optionally
behind the fault injector) and `Upstream` (any OpenAI-compatible server).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from .chain import Reply
from .context import RequestContext
from .engine.base import Engine, EngineStats, ModelInfo
from .protocol import ChatCompletionRequest, CompletionRequest

if TYPE_CHECKING:
    from .settings import Settings

Route = tuple[str, str, Callable[[Any], Awaitable[Any]]]


class Terminal(Protocol):
    async def __call__(self, ctx: RequestContext) -> Reply: ...

    async def start(self) -> None:
        """Load the model (or reach the upstream) and warm up."""

    async def close(self) -> None:
        """Stop, and end every process it started."""

    def ready(self) -> bool: ...

    def failed(self) -> bool:
        """Whether what serves stopped for good once started (`Engine.failed`): the
        process must restart (`/health/live` says so)."""

    def models(self) -> list[ModelInfo]: ...

    def has_model(self, model: str) -> bool:
        """Whether a request for `model` can be served (checked before the chain runs)."""

    def stats(self) -> EngineStats: ...

    def routes(self) -> list[Route]:
        """HTTP routes of its own (method, path, handler), e.g. fault injection."""

    def sampling_defaults(self) -> Mapping[str, Any]:
        """The served model's own sampling defaults, for what a request leaves unset
        (`Engine.sampling_defaults`); none for an upstream (it applies its own)."""

    def read_tokens(self, token_ids: list[int]) -> str | None:
        """The text of a prompt given as token ids, as the model reads it, for plugins
        that read prompts (the sanitizer); None where it cannot be told (an upstream
        holds its tokenizer; the engine is not ready; an id outside the vocabulary)."""

    def answer_digest_for(self, model: str) -> str | None:
        """What answers for `model` depend on besides the request (`Engine.answer_digest`:
        the chat template, tool parser, structured-output options, model, ...; an
        upstream's: what its model list says serves that model), for cache keys; None
        where none can be told. Each model's own: one that comes, goes or changes
        moves no other model's."""

    async def prepare(self, ctx: RequestContext) -> None:
        """Whatever of the request's work can be done before admission gives it an
        engine permit (the in-process engine's long prompt, rendered and tokenized in
        its one preparing thread), kept on `ctx.prepared` for its call; an error the
        request would meet there is raised here. Nothing for an upstream."""

    def prepares_ahead(self, ctx: RequestContext) -> bool:
        """Whether `prepare` has work to do for `ctx` (the in-process engine's long
        prompt); where it has none it returns at once, and admission neither calls it
        nor times it (a deadline scope, a loop timer set and cancelled, per request).
        False for an upstream."""

    async def count_prompt(self, request: ChatCompletionRequest | CompletionRequest,
                           ) -> int | None:
        """The tokens of the request's prompt as the model reads it (its
        `usage.prompt_tokens` on a miss), for a cached answer to another prompt (a
        paraphrase's) to report the asker's; None where it cannot be told here (an
        upstream holds its tokenizer; the engine is not ready; the template refuses)."""


def make_terminal(settings: Settings, engine: Engine | None = None) -> Terminal:
    """`engine` given (tests, benchmarks): serve it. Otherwise as `settings.engine` says."""
    from .serving import LocalServing

    if engine is not None:
        return LocalServing(engine)
    cfg = settings.engine
    if cfg.kind == "upstream":
        from .upstream import Upstream

        return Upstream(cfg)
    from .engine.vllm import VllmEngine  # imported here: vllm is heavy and optional

    real: Engine = VllmEngine(cfg)
    if cfg.faults:
        from .engine.faults import FaultyEngine

        real = FaultyEngine(real)
    return LocalServing(real)
