"""create_app(settings) -> web.Application, and its lifecycle.

Resources open and close in `cleanup_ctx` (torn down in reverse): first the engine,
whose start runs in the background so the server listens (and `/health/live` answers)
while the model loads; then the plugins, started in chain order and closed in reverse.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from aiohttp import web

from . import embeddings_api
from .app_state import STATE, AppState
from .auth import Authenticator, KeyConfigError
from .chain import Services, build_plugins, compose, deadline_warnings
from .connections import guard_middleware
from .cors import CORS, Cors
from .embedding import LocalEmbedder
from .engine.base import Engine
from .loop import freeze_startup_heap, one_blas_thread
from .middleware import (
    ROUTE_OPTS,
    errors_middleware,
    http_version_middleware,
    make_access_log,
    make_tracing,
    request_id_header,
    request_id_middleware,
)
from .routes import add_routes
from .settings import Settings
from .tasks import cancel_and_wait
from .telemetry import Metrics, error_fields, get_logger
from .terminal import make_terminal

log = get_logger("weir.app")


def create_app(
    settings: Settings,
    *,
    engine: Engine | None = None,
    on_fatal: Callable[[BaseException], None] | None = None,
    freeze_heap: bool = False,
) -> web.Application:
    """`freeze_heap`: once the engine is up, hide the startup heap from the garbage
    collector (proxy/loop.py); for a process that serves one app (`weir serve`)."""
    one_blas_thread()  # the semantic search must not wait on a core the engine holds
    metrics = Metrics()
    terminal = make_terminal(settings, engine)
    try:
        auth = Authenticator(settings.auth)
    except KeyConfigError as e:
        raise e.config_error() from None
    embedder = (LocalEmbedder(settings.embeddings, metrics.registry)
                if settings.embeddings.enabled else None)
    plugins = build_plugins(settings.plugins, Services(terminal, settings, metrics, embedder))
    deadline_s = settings.server.request_timeout_s
    chain = compose(plugins, terminal, deadline_s=deadline_s)
    embed_chain = (compose([p for p in plugins if "embeddings" in p.serves],
                           embeddings_api.terminal(embedder), deadline_s=deadline_s)
                   if embedder is not None else None)
    cors = Cors(settings.server.cors) if settings.server.cors.enabled else None
    app = web.Application(
        middlewares=[
            guard_middleware,
            request_id_middleware,
            make_access_log(metrics, settings.logging.access_log),
            http_version_middleware,
            make_tracing(settings.tracing.trust_incoming),
            errors_middleware,
            *([cors.middleware()] if cors is not None else []),  # (off: not installed)
        ],
        client_max_size=settings.server.max_body_bytes,
    )
    app.on_response_prepare.append(request_id_header)
    if cors is not None:
        app.on_response_prepare.append(cors.on_response_prepare)
        app[CORS] = cors
    app[STATE] = AppState(settings=settings, terminal=terminal, auth=auth, metrics=metrics,
                          plugins=plugins, chain=chain, embed_chain=embed_chain,
                          embedder=embedder)
    app.cleanup_ctx.append(_engine_lifespan(on_fatal, freeze_heap))
    app.cleanup_ctx.append(_embedder_lifespan(on_fatal))
    app.cleanup_ctx.append(_plugins_lifespan)
    add_routes(app)
    extra = [*terminal.routes(), *(r for plugin in plugins for r in plugin.routes())]
    for method, path, handler in extra:
        if method == "GET":  # HEAD too, as every other GET route answers it
            app.router.add_get(path, handler, **ROUTE_OPTS)
        else:
            app.router.add_route(method, path, handler, **ROUTE_OPTS)
    return app


def _engine_lifespan(
    on_fatal: Callable[[BaseException], None] | None, freeze_heap: bool,
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def lifespan(app: web.Application) -> AsyncIterator[None]:
        st = app[STATE]
        if st.auth.open:
            log.warning("auth.mode is `open`: every caller is the anonymous principal; "
                        "use API keys in production")
        for where, message in deadline_warnings(st.settings):
            log.warning("breaker threshold past the requests' deadline", setting=where,
                        detail=message)

        async def start() -> None:
            try:
                await st.terminal.start()
                frozen = freeze_startup_heap() if freeze_heap else 0
                log.info("engine ready" if st.terminal.ready() else "engine started",
                         models=[m.id for m in st.terminal.models()],
                         gc_frozen_objects=frozen)
            except asyncio.CancelledError:
                raise
            except BaseException as e:
                st.engine_error = e
                # (its type and place: its message may quote a secret, an upstream's
                # URL with its credentials, a private path)
                log.error("engine failed to start", **error_fields(e))
                if on_fatal is not None:
                    on_fatal(e)
            finally:
                st.engine_settled.set()

        task = asyncio.create_task(start())
        yield
        await cancel_and_wait(task)
        await st.terminal.close()

    return lifespan


def _embedder_lifespan(
    on_fatal: Callable[[BaseException], None] | None,
) -> Callable[[web.Application], AsyncIterator[None]]:
    """The embedding model loads in its worker thread. A model that cannot load is a
    configuration error, fatal as an engine that cannot start is (`weir serve` exits
    saying why); without `on_fatal` its calls answer 503."""

    async def lifespan(app: web.Application) -> AsyncIterator[None]:
        embedder = app[STATE].embedder
        watch = None
        if embedder is not None:
            await embedder.start()

            async def loaded() -> None:
                try:
                    await embedder.ready()
                except Exception as e:
                    if on_fatal is not None:
                        on_fatal(e)

            watch = asyncio.create_task(loaded())
        try:
            yield
        finally:
            await cancel_and_wait(watch)
            if embedder is not None:
                await embedder.close()

    return lifespan


async def _plugins_lifespan(app: web.Application) -> AsyncIterator[None]:
    plugins = app[STATE].plugins
    started = []
    try:
        for p in plugins:
            await p.start()
            started.append(p)
        yield
    finally:
        for p in reversed(started):
            try:
                await p.close()
            except Exception as e:
                log.error("plugin close failed", plugin=p.name, **error_fields(e))
