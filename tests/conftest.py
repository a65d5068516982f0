from __future__ import annotations

import io
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import settings as hypothesis_settings

from proxy.app import create_app
from proxy.settings import LoggingSettings, Settings
from proxy.telemetry import configure_logging
from tests.fakes import FakeEngine

MakeClient = Callable[..., Awaitable[TestClient[Any, web.Application]]]

# Property tests draw the same examples on every run: a CI run never fails on an example
# no earlier run saw (a new counter-example is found by running with a fresh seed locally).
hypothesis_settings.register_profile("weir", derandomize=True)
hypothesis_settings.load_profile("weir")


def make_settings(**overrides: Any) -> Settings:
    data: dict[str, Any] = {"auth": {"mode": "open"}, "logging": {"access_log": False},
                            "embeddings": {"enabled": False}}
    data.update(overrides)
    data["plugins"] = [lookup_first(p) for p in data.get("plugins") or []]
    return Settings.model_validate(data)


def lookup_first(plugin: dict[str, Any], **semantic: float) -> dict[str, Any]:
    """The fake engine answers at once, where a real one takes tens of milliseconds to
    its first token: a miss would win its race against a lookup slowed by a busy machine
    and a paraphrase would be served as a miss, at random. So, unless a test says
    otherwise, a miss waits for its semantic lookup (the race has its own unit tests),
    and the lookup waits for its embedding: the model runs in a thread of lowered
    priority (`embeddings.nice`), which a busy machine starves past the 100 ms the
    lookup gives it by default (the slow lookup's miss has its own unit tests too)."""
    if plugin.get("name") != "cache":
        return plugin
    cfg = dict(plugin.get("config") or {})
    cfg["semantic"] = {"head_start_ms": 10_000, "lookup_timeout_ms": 10_000, **semantic,
                       **(cfg.get("semantic") or {})}
    return {**plugin, "config": cfg}


@pytest.fixture
def fake_engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def make_client(aiohttp_client: Any, fake_engine: FakeEngine) -> MakeClient:
    """Build an app over the fake engine and return a test client for it."""

    async def make(settings: Settings | None = None, engine: FakeEngine | None = None,
                   **overrides: Any) -> TestClient[Any, web.Application]:
        settings = settings or make_settings(**overrides)
        if settings.engine.kind == "upstream" and engine is None:
            app = create_app(settings)  # the real upstream engine, over real HTTP
        else:
            app = create_app(settings, engine=engine or fake_engine)
        # Served as `weir serve` serves it: a body's coding is decoded by `proxy.body`.
        # (aiohttp_client's `server_kwargs` never reach the server: they are dropped.)
        server = TestServer(app)
        await server.start_server(auto_decompress=False)
        return await aiohttp_client(server)

    return make


@pytest.fixture
def logs() -> Iterator[io.StringIO]:
    """What the app logs during the test (debug level, JSON lines)."""
    buf = io.StringIO()
    configure_logging(LoggingSettings(level="debug"), stream=buf)
    yield buf
    configure_logging(LoggingSettings())


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """One real redis-server for the session (tests use their own key prefixes)."""
    from bench.redis_server import RedisServer

    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()
