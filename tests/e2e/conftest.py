from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.e2e.server import CLIENTS, WeirProcess, async_sdk, e2e_config, sdk

KEY_A = "sk-test-tenant-a"
KEY_B = "sk-test-tenant-b"
MODEL = "weir-demo"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/e2e/" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def weir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WeirProcess]:
    """One real `weir serve` with the real vLLM engine for the whole session."""
    proc = WeirProcess(tmp_path_factory.mktemp("weir"), e2e_config()).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def client(weir: WeirProcess) -> openai.OpenAI:
    return sdk(weir.url, KEY_A)  # type: ignore[no-any-return]


@pytest.fixture
def aclient(weir: WeirProcess) -> openai.AsyncOpenAI:
    return async_sdk(weir.url, KEY_A)  # type: ignore[no-any-return]


@pytest.fixture(scope="session", autouse=True)
def _close_sdk_clients() -> Iterator[None]:
    yield
    import asyncio

    for client in CLIENTS:
        closed = client.close()
        if asyncio.iscoroutine(closed):
            asyncio.run(closed)
    CLIENTS.clear()

