"""The plugin chain: contract, registry, ordering rules and composition.

A plugin is an async callable `(ctx, call_next) -> Reply`. The YAML list under
`plugins:` is execution order, outermost first; each entry's `config` is validated by
the plugin's own schema (`Config`, pydantic, `extra="forbid"`). A plugin may
short-circuit (return a Reply without calling `call_next`), change `ctx.request`
before calling on, or act on the Reply it gets back: a `Stream` is not wrapped, a plugin
registers `on_end` hooks on it, which run once however it ends (proxy/reply.py).

Ordering is checked at load: plugins declare a `placement` (`first`: before every
other plugin, like the sanitizer; `last`: next to the engine, like admission and the
breaker) and may name plugins that must run `after` them. A bad order is refused with
the YAML path of the offending entry.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Executor
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

from pydantic import ValidationError

from .config_model import ConfigModel
from .context import TIMEOUT_HEADER, RequestContext, Screen, Within, asked_limit

# Replies are defined in proxy.reply; plugins import them from here with the contract.
from .reply import Completion, EndHook, Outcome, Reply, Stream
from .settings import ConfigError, PluginSpec, UpstreamEngineSettings, errors_from_validation
from .tracing import span, tracing_enabled

__all__ = ["FALLBACK_HEADER", "BasePlugin", "Completion", "EndHook", "Next", "Outcome",
           "Plugin", "PluginConfig", "Reply", "Services", "Stream", "build_plugins",
           "compose", "kept_fallback", "register", "told_fallback", "unregister",
           "validate_plugins"]

if TYPE_CHECKING:
    from aiohttp import web

    from .embedding import Embedder
    from .settings import Settings
    from .telemetry import Metrics
    from .terminal import Terminal

#: Set on replies a fallback produced (breaker); the cache never stores those.
FALLBACK_HEADER = "x-weir-fallback"
#: The fallbacks whose kind a stored answer's record keeps (`fallback`).
_FALLBACK_KINDS = ("stale", "upstream", "static")


def kept_fallback(record: dict[str, Any], headers: Mapping[str, str]) -> dict[str, Any]:
    """`record` (a stored answer's, each record of it: `in_progress` as it runs, then
    its end) keeping the fallback that made the answer, as its `headers` (the chain's,
    `RequestContext.response_headers`) say: what `told_fallback` tells."""
    if (fallback := headers.get(FALLBACK_HEADER)) is not None:
        record["fallback"] = fallback
    return record


def told_fallback(record: dict[str, Any]) -> dict[str, str] | None:
    """The header every answer that carries a stored record's answer goes out with (a
    retrieve, whole or streamed again, a cancel's, a metadata update's): the fallback
    that made it, as its create said; None: the model's own."""
    fallback = record.get("fallback")
    return {FALLBACK_HEADER: fallback} if fallback in _FALLBACK_KINDS else None
Next = Callable[[RequestContext], Awaitable[Reply]]


@runtime_checkable
class Plugin(Protocol):
    name: ClassVar[str]

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply: ...


class PluginConfig(ConfigModel):
    """Base for plugin configs: unknown keys are errors, every field has a default."""


@dataclass(slots=True)
class Services:
    """What a plugin may use besides its config, handed over at construction."""

    terminal: Terminal
    settings: Settings
    metrics: Metrics
    embedder: Embedder | None = None
    #: Every plugin of the chain, in order (filled once the chain is built).
    plugins: list[BasePlugin[Any]] = field(default_factory=list)

    def plugin(self, name: str) -> BasePlugin[Any] | None:
        return next((p for p in self.plugins if p.name == name), None)

    def gateway_secret(self) -> str | None:
        """The secret this gateway keys the digests it sends upstream with
        (`auth.keyed_digest`): the upstream engine's `on_behalf_of_secret`, else the
        first a plugin's upstream has (the breaker's fallbacks); None: none is set. Read
        from the config, so every replica sharing it keys alike."""
        secret: str | None = getattr(self.settings.engine, "on_behalf_of_secret", None)
        return secret or next((s for p in self.plugins if (s := p.secret()) is not None),
                              None)


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
    #: The routes whose chain this plugin joins (`embeddings`: traffic plugins only).
    serves: ClassVar[frozenset[str]] = frozenset({"chat", "completion"})

    def __init__(self, config: ConfigT, services: Services) -> None:
        self.config: ConfigT = config
        self.services = services

    async def start(self) -> None:
        """Open resources (Redis pools, background tasks). Called once at app start."""

    async def close(self) -> None:
        """Release them. Called once at shutdown, in reverse chain order."""

    async def __call__(self, ctx: RequestContext, call_next: Next) -> Reply:
        return await call_next(ctx)

    def enter(self, ctx: RequestContext) -> None:
        """What the whole chain should know of a request from its start, set before any
        plugin runs, in chain order (admission: the request's deadline, which a plugin
        ahead of it that waits, e.g. the cache's coalescing, must honour too). It may run
        twice on one request (`enter_ahead`: a background response's create, then its
        run): applied again it must change nothing (take no permit, count nothing)."""

    def health(self) -> dict[str, Any] | None:
        """Details for /health/ready (e.g. breaker state); None: nothing to show."""
        return None

    def screen_aside(self) -> Screen | None:
        """A screen for texts a route keeps that no chain request carries (a stored chat
        completion's metadata set by an update): the sanitizer's redact detectors, as
        `RequestContext.screen_aside` in a request; None: nothing to screen."""
        return None

    def screen_thread(self, ctx: RequestContext) -> Executor | None:
        """Where a route runs its screens (`screen_aside`, `RequestContext.screen`) of
        `ctx`'s request: the thread this plugin reads a long one in (the sanitizer's,
        `OFF_LOOP_CHARS` or more), so that what a route keeps of it is not read on the
        event loop; None: on the loop."""
        return None

    def refuse_ahead(self, ctx: RequestContext) -> None:
        """Raises what this plugin refuses `ctx`'s request for from the request alone,
        before the chain runs (a background response's create answers it at once, not
        in a record that ends `failed`; nor is its record screened first, by
        `screen_aside`): the sanitizer's limits (its detectors never read a body of
        megabytes). Nothing by default."""

    def secret(self) -> str | None:
        """The secret this plugin's own upstreams name callers with (its
        `on_behalf_of_secret`), which `Services.gateway_secret` may key with; None."""
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
    placed: list[tuple[type[BasePlugin[Any]], int]] = []  # (in the order, bad config or not)
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
        placed.append((cls, i))
        try:
            config = cls.Config.model_validate(spec.config)
        except ValidationError as e:
            errors.extend(errors_from_validation(e, prefix=f"{path}.config"))
            continue
        resolved.append((cls, config, i))
    errors.extend(_order_errors(placed))
    if errors:
        raise ConfigError(errors)
    return resolved


def _order_errors(placed: list[tuple[type[BasePlugin[Any]], int]]) -> list[tuple[str, str]]:
    """One line for each plugin out of place: the one rule it breaks first (a plugin
    that must come first, after another, is told that only, not also each plugin it
    must come before)."""
    errors = []
    names = [cls.name for cls, _ in placed]
    for pos, (cls, i) in enumerate(placed):
        earlier = [c for c, _ in placed[:pos]]
        if cls.placement == "first" and any(c.placement != "first" for c in earlier):
            errors.append((f"plugins[{i}]", f"`{cls.name}` must come before every other plugin"))
            continue
        must = [f"`{o}`" for o in cls.before if o in names[:pos]]
        if cls.placement != "last" and any(c.placement == "last" for c in earlier):
            last = next(c.name for c in earlier if c.placement == "last")
            must = [f"`{last}`, which has to sit next to the engine"] + [
                m for m in must if m != f"`{last}`"]
        if must:
            errors.append((f"plugins[{i}]", f"`{cls.name}` must come before " + (
                ", and before ".join(must))))
    return errors


def deadline_warnings(settings: Settings) -> list[tuple[str, str]]:
    """The breaker's thresholds no engine call can reach: a call is cut at the request's
    deadline (`server.request_timeout_s`, admission's `deadline_s`, the shorter), and a
    call cut there counts for nothing unless it ran past the threshold (a caller's own
    short deadline must not open the circuit for all). With `slow_call_s` (or
    `half_open_max_wait_s`) at or past that deadline, a hung engine never opens the
    breaker (nor fails a trial): every call it holds is cut first; so with an upstream
    fallback's `timeout_s` there, for its own breaker, and with an upstream engine's
    `whole_call_s` and `timeout_s` both there (its whole answers) or its `read_timeout_s`
    (a stream that stalls once begun), or that not below its `timeout_s`. Warned of by
    `check-config` and at `serve`'s start (the config stays valid)."""
    configs = {cls.name: (config, i) for cls, config, i in validate_plugins(settings.plugins)}
    if "breaker" not in configs:
        return []
    limits = [settings.server.request_timeout_s]
    if "admission" in configs:
        limits.append(getattr(configs["admission"][0], "deadline_s", None))
    known = [x for x in limits if x is not None]
    if not known:
        return []
    deadline = min(known)
    breaker, i = configs["breaker"]
    return [*_threshold_warnings(breaker, i, deadline),
            *(_upstream_engine_warnings(settings.engine, breaker, i, deadline)
              if isinstance(settings.engine, UpstreamEngineSettings) else []),
            *_fallback_warnings(breaker, i, deadline)]


def _threshold_warnings(breaker: Any, i: int, deadline: float) -> list[tuple[str, str]]:
    """`deadline_warnings` of the breaker's own thresholds (plugin `i`)."""
    warned = []
    for field_name, what in (("slow_call_s", "a hung engine never opens the breaker"),
                             ("half_open_max_wait_s", "a hung trial never fails")):
        value = getattr(breaker, field_name, None)
        if value is not None and value >= deadline:
            warned.append((f"plugins[{i}].config.{field_name}", (
                f"{value:g} s is not below the requests' deadline ({deadline:g} s: "
                "server.request_timeout_s, admission's deadline_s): every call is cut "
                f"before it, so {what}; set it lower")))
    return warned


def _upstream_engine_warnings(engine: UpstreamEngineSettings, breaker: Any, i: int,
                              deadline: float) -> list[tuple[str, str]]:
    """`deadline_warnings` of an upstream engine's timeouts."""
    # An upstream engine tells no first token of a whole answer: a hung one is slow only
    # past `whole_call_s` (a trial failed then), or fails at its own `timeout_s` (a 504);
    # with both at or past the deadline (or `whole_call_s` null), every such call is cut
    # first and counts for nothing.
    warned = []
    whole = getattr(breaker, "whole_call_s", None)
    if (whole is None or whole >= deadline) and engine.timeout_s >= deadline:
        where = (f"plugins[{i}].config.whole_call_s" if whole is not None
                 else "engine.timeout_s")
        said = (f"whole_call_s {whole:g} s" if whole is not None
                else "whole_call_s null")
        warned.append((where, (
            f"{said} and the upstream's engine.timeout_s {engine.timeout_s:g} s are not "
            f"below the requests' deadline ({deadline:g} s: server.request_timeout_s, "
            "admission's deadline_s): every whole (non-streamed) answer is cut before "
            "either, so a hung upstream never opens the breaker (nor fails a trial) and "
            "each request waits on it to its deadline; set one lower")))
    # A stream that stalls once begun fails at `read_timeout_s` (a 504 it counts);
    # cut first at the deadline, or at the engine's `timeout_s` (a stream whose
    # time ran out is a long answer, the caller's: `UpstreamDeadline`), it counts
    # for nothing.
    if engine.read_timeout_s >= min(deadline, engine.timeout_s):
        before = (f"the requests' deadline ({deadline:g} s: server.request_timeout_s, "
                  "admission's deadline_s)" if deadline <= engine.timeout_s else
                  f"the upstream's engine.timeout_s ({engine.timeout_s:g} s, where a "
                  "stream is cut as a long answer, which the breaker does not count)")
        warned.append(("engine.read_timeout_s", (
            f"{engine.read_timeout_s:g} s is not below {before}: every stream the "
            "upstream stalls once begun is cut before it, so a stalling upstream "
            "never opens the breaker; set it lower")))
    return warned


def _fallback_warnings(breaker: Any, i: int, deadline: float) -> list[tuple[str, str]]:
    """`deadline_warnings` of the breaker's upstream fallbacks' `timeout_s`."""
    # An upstream fallback's own breaker counts only its failures (no slow calls): a
    # hung one fails at its `timeout_s`, and a call cut at the request's deadline
    # first counts for nothing, so with `timeout_s` at or past that deadline it never
    # opens, and every request waits out its deadline on it.
    warned = []
    for j, f in enumerate(getattr(breaker, "fallback", None) or []):
        timeout = getattr(f, "timeout_s", None)
        if getattr(f, "kind", None) == "upstream" and timeout is not None \
                and timeout >= deadline:
            warned.append((f"plugins[{i}].config.fallback[{j}].timeout_s", (
                f"{timeout:g} s is not below the requests' deadline ({deadline:g} s: "
                "server.request_timeout_s, admission's deadline_s): every call is cut "
                "before it, so a hung fallback never opens its own breaker (each request "
                "waits on it to its deadline); set it lower")))
    return warned


def build_plugins(specs: list[PluginSpec], services: Services) -> list[BasePlugin[Any]]:
    plugins = [cls(config, services) for cls, config, _ in validate_plugins(specs)]
    services.plugins[:] = plugins
    return plugins


def compose(plugins: Sequence[Plugin], terminal: Next, *,
            deadline_s: float | None = None) -> Next:
    """One callable running `plugins` outermost first, then `terminal`; the plugins'
    `enter` hooks (those that have one) run first, before any of them. `deadline_s`
    (the server's `request_timeout_s`): every request's deadline, set before the hooks
    (admission's own may only shorten it) and enforced around `terminal`, so a request
    has one, and is cut at it, with no plugin that sets or enforces one."""
    admission = any(p.name == "admission" for p in plugins)  # (it enforces deadlines)
    # (without admission, `x-weir-timeout-ms` may set one where the server has none)
    handler = terminal if admission else _within_deadline(terminal)
    for plugin in reversed(plugins):
        handler = _link(plugin, handler)
    entering = _entering(plugins, deadline_s)
    if not entering:
        return handler
    chain = handler

    async def run(ctx: RequestContext) -> Reply:
        for hook in entering:
            hook(ctx)
        return await chain(ctx)

    return run


def _entering(plugins: Sequence[Plugin],
              deadline_s: float | None) -> list[Callable[[RequestContext], None]]:
    """The chain's `enter` hooks, in the order it runs them (see `compose`)."""
    admission = any(p.name == "admission" for p in plugins)  # (it reads the header)
    entering = [f for p in plugins if (f := getattr(p, "enter", None)) is not None
                and getattr(f, "__func__", None) is not BasePlugin.enter]
    if deadline_s is not None or not admission:
        entering.insert(0, _server_deadline(deadline_s, header=not admission))
    return entering


def enter_ahead(plugins: Sequence[Plugin], ctx: RequestContext, *,
                deadline_s: float | None) -> None:
    """Runs the `enter` hooks of the chain `compose(plugins, ..., deadline_s=...)` on
    `ctx` now, then each plugin's `refuse_ahead`: what it refuses from the request alone
    (a bad `x-weir-timeout-ms`, a prompt past the sanitizer's limits: a 400) is refused
    before a background run is queued, not later, in its record. Each hook, run again by
    the chain, changes nothing more (a deadline only shortens)."""
    for hook in _entering(plugins, deadline_s):
        hook(ctx)
    for plugin in plugins:
        if (refuse := getattr(plugin, "refuse_ahead", None)) is not None:
            refuse(ctx)


def _server_deadline(limit: float | None, *,
                     header: bool) -> Callable[[RequestContext], None]:
    """Sets the request's deadline: `limit` (None: none), shortened (or set) by
    `x-weir-timeout-ms` where `header` (no admission plugin, which otherwise reads it)."""

    def enter(ctx: RequestContext) -> None:
        asked = asked_limit(ctx.headers.get(TIMEOUT_HEADER), limit) if header else limit
        if asked is None:
            return
        deadline = ctx.started + asked
        ctx.deadline = deadline if ctx.deadline is None else min(ctx.deadline, deadline)

    return enter


def _within_deadline(terminal: Next) -> Next:
    """`terminal` cut at the request's deadline (504 `timeout`), a stream's rest too
    (where admission is in the chain it does so itself: this step is left out)."""

    async def step(ctx: RequestContext) -> Reply:
        async with Within(ctx.deadline):
            reply = await terminal(ctx)
        if isinstance(reply, Stream) and ctx.deadline is not None:
            reply.deadline = (ctx.deadline if reply.deadline is None
                              else min(reply.deadline, ctx.deadline))
        return reply

    return step


def _link(plugin: Plugin, call_next: Next) -> Next:
    name = f"plugin {plugin.name}"

    async def step(ctx: RequestContext) -> Reply:
        if not tracing_enabled():  # no span to make: one frame less per plugin
            return await plugin(ctx, call_next)
        with span(name):
            return await plugin(ctx, call_next)

    step.__qualname__ = f"chain.{plugin.name}"
    return step
