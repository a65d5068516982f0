"""The plugin chain: contract, registry, ordering rules and composition.

A plugin is an async callable `(ctx, call_next) -> Reply`. The YAML list under
`plugins:` is execution order, outermost first; each entry's `config` is validated by
the plugin's own schema (`Config`, pydantic, `extra="forbid"`). A plugin may
short-circuit (return a Reply without calling `call_next`), change `ctx.request`
before calling on, or wrap the Reply it gets back. A `Stream` is wrapped by an async
generator whose `finally` runs on completion, error and cancellation alike.

Ordering is checked at load: plugins declare a `placement` (`first`: before every
other plugin, like the sanitizer; `last`: next to the engine, like admission and the
breaker) and may name plugins that must run `after` them. A bad order is refused with
the YAML path of the offending entry.
"""

from __future__ import annotations

import asyncio
import importlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Any,
    ClassVar,
    Generic,
    Literal,
    Protocol,
    TypeVar,
    runtime_checkable,
)

from pydantic import BaseModel, ConfigDict, ValidationError

from .context import RequestContext, loop_time
from .errors import DeadlineExceeded
from .settings import ConfigError, PluginSpec, errors_from_validation
from .telemetry import get_logger
from .tracing import span, tracing_enabled

if TYPE_CHECKING:
    from aiohttp import web

    from .embedding import Embedder
    from .engine.base import Backend
    from .settings import Settings
    from .telemetry import Metrics

_log = get_logger("weir.chain")


@dataclass(slots=True)
class Completion:
    """A whole answer: the OpenAI response object, JSON-ready."""

    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


Outcome = Literal["completed", "failed", "cancelled"]
#: Called once when a stream ends: (the stream, how it ended). May be async.
EndHook = Callable[["Stream", Outcome], Awaitable[None] | None]


class Stream:
    """A streamed answer: OpenAI chunk objects (dicts), and what is known about them.

    One pass per chunk: plugins do not wrap the chunk iterator. A plugin that cares how a
    stream ends registers `on_end(hook)`; the one consumer (the SSE writer, or whoever
    iterates it) calls `end(outcome)` exactly once on every path: completed, failed
    (`error` says why: a deadline, an engine fault) or cancelled (client gone, shutdown).
    `end` closes the iterator (which aborts the engine request) and then runs the hooks in
    the order they were registered: innermost plugin first (admission frees its slot
    before the breaker records, the cache stores and the rate limiter settles).

    The producer fills in what consumers would otherwise re-parse from the chunks:
    `usage` (prompt and completion tokens, once known) and `answer` (the choices' text and
    finish reasons, for the cache to store; None where the producer does not assemble
    them, e.g. an upstream relay). `first` is the first chunk when the producer awaited it
    before returning (`prime()`): errors before any output then surface from the chain
    call itself, with a real HTTP status, where the breaker can still fall back.
    """

    __slots__ = ("_ended", "_hooks", "_it", "answer", "deadline", "error", "first", "headers",
                 "primed_at", "usage")

    def __init__(
        self,
        chunks: AsyncIterator[dict[str, Any]] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self._it = chunks
        self.headers: dict[str, str] = headers if headers is not None else {}
        self.usage: dict[str, Any] | None = None
        self.answer: list[dict[str, Any]] | None = None
        self.error: BaseException | None = None
        self.first: dict[str, Any] | None = None
        #: time.monotonic() when the first chunk was in hand (prime()); None: not primed.
        self.primed_at: float | None = None
        #: time.monotonic() by which the stream must end (one per request; the consumer
        #: enforces it, ending the stream with DeadlineExceeded). None: no deadline.
        self.deadline: float | None = None
        self._hooks: list[EndHook] = []
        self._ended = False

    def attach(self, chunks: AsyncIterator[dict[str, Any]]) -> Stream:
        """Set the chunk source (for producers that hand the Stream to their generator)."""
        self._it = chunks
        return self

    async def prime(self) -> Stream:
        """Await the first chunk now. An error before it propagates (the stream ends
        `failed`); an empty stream is fine."""
        assert self._it is not None and self.first is None
        try:
            self.first = await self._it.__anext__()
        except StopAsyncIteration:
            pass
        except BaseException as e:
            await self.end("cancelled" if isinstance(e, asyncio.CancelledError) else "failed",
                           e)
            raise
        self.primed_at = time.monotonic()
        return self

    def rest(self) -> AsyncIterator[dict[str, Any]]:
        """The chunks after `first`: the consumer's hot path (no extra frame)."""
        assert self._it is not None
        return self._it

    @property
    def ended(self) -> bool:
        return self._ended

    def on_end(self, hook: EndHook) -> None:
        if self._ended:
            raise RuntimeError("the stream has already ended")
        self._hooks.append(hook)

    async def end(self, outcome: Outcome, error: BaseException | None = None) -> None:
        """Close the chunk source and run the end hooks; only the first call counts.
        Hooks run even if closing fails, and one hook failing does not stop the rest."""
        if self._ended:
            return
        self._ended = True
        if error is not None and self.error is None:
            self.error = error
        close = getattr(self._it, "aclose", None)
        if close is not None:
            try:
                await close()
            except Exception:
                _log.exception("closing a stream failed")
        for hook in self._hooks:
            try:
                result = hook(self, outcome)
                if result is not None:
                    await result
            except Exception:
                _log.exception("a stream end hook failed", hook=getattr(
                    hook, "__qualname__", repr(hook)))

    # Consumers other than the SSE writer (tests, translations into other APIs) iterate
    # the stream; the iteration ends it.
    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[dict[str, Any]]:
        outcome: Outcome = "cancelled"
        error: BaseException | None = None
        try:
            if self.first is not None:
                first, self.first = self.first, None
                yield first
            while self._it is not None:
                # A scope per chunk here (a timeout cannot span a generator's yields);
                # the SSE writer, the hot path, has one for the whole stream.
                scope = asyncio.timeout_at(loop_time(self.deadline))
                try:
                    async with scope:
                        chunk = await self._it.__anext__()
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    if scope.expired():
                        raise DeadlineExceeded(
                            "The request did not finish within its deadline.") from None
                    raise
                yield chunk
            outcome = "completed"
        except GeneratorExit:
            raise
        except asyncio.CancelledError:
            raise
        except BaseException as e:
            outcome, error = "failed", e
            raise
        finally:
            await asyncio.shield(self.end(outcome, error))

    async def aclose(self) -> None:
        """End the stream as cancelled (the consumer gave up on it)."""
        await self.end("cancelled")


Reply = Completion | Stream

#: Set on replies a fallback produced (breaker); the cache never stores those.
FALLBACK_HEADER = "x-weir-fallback"
Next = Callable[[RequestContext], Awaitable[Reply]]


@runtime_checkable
class Plugin(Protocol):
    name: ClassVar[str]

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply: ...


class PluginConfig(BaseModel):
    """Base for plugin configs: unknown keys are errors, every field has a default."""

    model_config = ConfigDict(extra="forbid")


@dataclass(slots=True)
class Services:
    """What a plugin may use besides its config, handed over at construction."""

    engine: Backend
    settings: Settings
    metrics: Metrics
    embedder: Embedder | None = None
    #: Every plugin of the chain, in order (filled once the chain is built).
    plugins: list[BasePlugin[Any]] = field(default_factory=list)

    def plugin(self, name: str) -> BasePlugin[Any] | None:
        return next((p for p in self.plugins if p.name == name), None)


ConfigT = TypeVar("ConfigT", bound=PluginConfig)


class BasePlugin(Generic[ConfigT]):
    """Convenience base: config schema, placement, lifespan hooks (all optional).

    Generic over its config: `class CachePlugin(BasePlugin[CacheConfig])` has
    `self.config: CacheConfig`, and `Config` names the same class for validation."""

    name: ClassVar[str]
    Config: ClassVar[type[PluginConfig]] = PluginConfig
    placement: ClassVar[Literal["first", "any", "last"]] = "any"
    #: Names of plugins that, when present, must come later in the chain.
    before: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: ConfigT, services: Services) -> None:
        self.config: ConfigT = config
        self.services = services

    async def start(self) -> None:
        """Open resources (Redis pools, background tasks). Called once at app start."""

    async def close(self) -> None:
        """Release them. Called once at shutdown, in reverse chain order."""

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        return await call_next(ctx)

    def health(self) -> dict[str, Any] | None:
        """Details for /health/ready (e.g. breaker state); None: nothing to show."""
        return None

    def routes(self) -> list[tuple[str, str, Callable[[web.Request], Awaitable[Any]]]]:
        """Extra HTTP routes (method, path, handler), e.g. an admin API."""
        return []


# ---------------------------------------------------------------------------- registry

#: Built-in plugins, imported on first use so a missing optional dependency of one
#: plugin does not stop the others from loading.
BUILTIN: dict[str, str] = {
    "sanitizer": "plugins.sanitizer.plugin:SanitizerPlugin",
    "cache": "plugins.cache.plugin:CachePlugin",
    "rate_limit": "plugins.rate_limit.plugin:RateLimitPlugin",
    "admission": "plugins.admission.plugin:AdmissionPlugin",
    "breaker": "plugins.breaker.plugin:BreakerPlugin",
}
_registered: dict[str, type[BasePlugin[Any]]] = {}


def register(cls: type[BasePlugin[Any]]) -> type[BasePlugin[Any]]:
    """Register a plugin class under `cls.name` (usable as a decorator)."""
    _registered[cls.name] = cls
    return cls


def unregister(name: str) -> None:
    _registered.pop(name, None)


def plugin_class(name: str) -> type[BasePlugin[Any]]:
    if name in _registered:
        return _registered[name]
    target = BUILTIN.get(name)
    if target is None:
        known = sorted({*BUILTIN, *_registered})
        raise KeyError(f"unknown plugin `{name}` (known: {', '.join(known)})")
    module, _, attr = target.partition(":")
    try:
        cls: type[BasePlugin[Any]] = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise KeyError(f"plugin `{name}` is not available in this build ({e})") from None
    return cls


# ------------------------------------------------------------------------ validation


def validate_plugins(
    specs: list[PluginSpec],
) -> list[tuple[type[BasePlugin[Any]], PluginConfig, int]]:
    """Resolve, validate and order-check the YAML plugin list; raise ConfigError."""
    errors: list[tuple[str, str]] = []
    resolved: list[tuple[type[BasePlugin[Any]], PluginConfig, int]] = []
    seen: dict[str, int] = {}
    for i, spec in enumerate(specs):
        path = f"plugins[{i}]"
        if not spec.enabled:
            continue
        try:
            cls = plugin_class(spec.name)
        except KeyError as e:
            errors.append((f"{path}.name", str(e.args[0])))
            continue
        if spec.name in seen:
            errors.append((f"{path}.name", f"plugin `{spec.name}` is listed twice "
                                           f"(first at plugins[{seen[spec.name]}])"))
            continue
        seen[spec.name] = i
        try:
            config = cls.Config.model_validate(spec.config)
        except ValidationError as e:
            errors.extend(errors_from_validation(e, prefix=f"{path}.config"))
            continue
        resolved.append((cls, config, i))
    errors.extend(_order_errors(resolved))
    if errors:
        raise ConfigError(errors)
    return resolved


def _order_errors(
    resolved: list[tuple[type[BasePlugin[Any]], PluginConfig, int]],
) -> list[tuple[str, str]]:
    errors = []
    names = [cls.name for cls, _, _ in resolved]
    for pos, (cls, _, i) in enumerate(resolved):
        earlier = resolved[:pos]
        if cls.placement == "first" and any(c.placement != "first" for c, _, _ in earlier):
            errors.append((f"plugins[{i}]", f"`{cls.name}` must come before every other plugin"))
        if cls.placement != "last" and any(c.placement == "last" for c, _, _ in earlier):
            last = next(c.name for c, _, _ in earlier if c.placement == "last")
            errors.append((f"plugins[{i}]", f"`{cls.name}` must come before `{last}`, which "
                                            "has to sit next to the engine"))
        for other in cls.before:
            if other in names[:pos]:
                errors.append((f"plugins[{i}]", f"`{cls.name}` must come before `{other}`"))
    return errors


def build_plugins(specs: list[PluginSpec], services: Services) -> list[BasePlugin[Any]]:
    plugins = [cls(config, services) for cls, config, _ in validate_plugins(specs)]
    services.plugins[:] = plugins
    return plugins


def compose(plugins: list[Plugin], terminal: Next) -> Next:
    """One callable running `plugins` outermost first, then `terminal`."""
    handler = terminal
    for plugin in reversed(plugins):
        handler = _link(plugin, handler)
    return handler


def _link(plugin: Plugin, call_next: Next) -> Next:
    name = f"plugin {plugin.name}"

    async def step(ctx: RequestContext) -> Reply:
        if not tracing_enabled():  # no span to make: one frame less per plugin
            return await plugin(ctx, call_next)
        with span(name):
            return await plugin(ctx, call_next)

    step.__qualname__ = f"chain.{plugin.name}"
    return step
