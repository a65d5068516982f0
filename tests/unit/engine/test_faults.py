"""The fault-injecting engine wrapper (proxy/engine/faults.py) around the fake engine:
each mode's effect on `generate`, the rest passed through; and its admin switch over HTTP
(`POST /admin/faults`, role admin), as the chaos e2e test drives it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from proxy.engine.base import EngineFailed, SamplingOptions
from proxy.engine.faults import FaultyEngine
from tests.conftest import MakeClient
from tests.fakes import FakeEngine
from tests.openai_spec import validate

PROMPT = [1, 5, 9]
OPTIONS = SamplingOptions(max_tokens=3)


async def texts(engine: FaultyEngine) -> str:
    out = ""
    async for o in engine.generate(PROMPT, OPTIONS, "r1"):
        out += "".join(c.text for c in o.choices)
    return out


async def test_closing_a_generation_aborts_the_engine_request_at_once() -> None:
    """The wrapper closes the engine's generator with its own: the engine's abort runs
    then, not when the garbage collector finds the suspended generator."""
    inner = FakeEngine()
    gen = FaultyEngine(inner).generate(PROMPT, SamplingOptions(max_tokens=50), "r1")
    await anext(gen)
    assert inner.active == {"r1"}
    await gen.aclose()
    assert inner.active == set()


async def test_ok_passes_through_and_so_does_everything_else() -> None:
    inner = FakeEngine(max_model_len=77)
    engine = FaultyEngine(inner)
    await engine.start()
    assert inner.started and engine.ready() and engine.max_model_len == 77
    assert [m.id for m in engine.models()] == ["fake-model"]
    assert engine.encode("ab") == inner.encode("ab")
    assert await texts(engine) == FakeEngine.expected_text(PROMPT, 3)
    assert [c[0] for c in inner.calls] == [PROMPT]
    await engine.close()
    assert inner.closed


async def test_error_fails_at_once_without_reaching_the_engine() -> None:
    inner = FakeEngine()
    engine = FaultyEngine(inner)
    engine.mode = "error"
    with pytest.raises(EngineFailed):
        await texts(engine)
    assert inner.calls == []
    engine.mode = "ok"  # and recovers when switched back
    assert await texts(engine) == FakeEngine.expected_text(PROMPT, 3)


@pytest.mark.parametrize("mode", ["hang", "slow"])
async def test_hang_and_slow_hold_the_first_token_until_the_caller_gives_up(mode: str) -> None:
    inner = FakeEngine()
    engine = FaultyEngine(inner)
    engine.mode = mode  # type: ignore[assignment]
    engine.delay_s = 3600  # slow: longer than any test runs
    first = asyncio.create_task(anext(aiter(engine.generate(PROMPT, OPTIONS, "r1"))))
    done, _ = await asyncio.wait([first], timeout=0.1)  # bounded: it must still be waiting
    assert not done and inner.calls == []
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert inner.calls == []  # the caller gave up before the engine was asked


async def test_slow_with_a_short_delay_then_answers() -> None:
    inner = FakeEngine()
    engine = FaultyEngine(inner)
    engine.mode, engine.delay_s = "slow", 0.01
    assert await texts(engine) == FakeEngine.expected_text(PROMPT, 3)


CHAT = {"model": "fake-model", "max_tokens": 3,
        "messages": [{"role": "user", "content": "hello"}]}
AUTH = {"mode": "keys", "keys": [{"key": "sk-user", "tenant": "t"},
                                 {"key": "sk-tenant-admin", "tenant": "t", "role": "admin"},
                                 {"key": "sk-admin", "tenant": "ops", "role": "admin",
                                  "operator": True}]}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_admin_switches_the_fault_over_http(make_client: MakeClient,
                                                  fake_engine: FakeEngine) -> None:
    client = await make_client(engine=FaultyEngine(fake_engine), auth=AUTH)  # type: ignore[arg-type]

    async def fault(body: Any, key: str = "sk-admin") -> Any:
        return await client.post("/admin/faults", json=body, headers=bearer(key))

    assert (await fault({"mode": "error"}, "sk-user")).status == 403
    assert (await fault({"mode": "error"}, "sk-tenant-admin")).status == 403  # operators only
    assert (await client.post("/admin/faults", json={"mode": "error"})).status == 401
    bad = await fault({"mode": "explode"})
    assert bad.status == 400 and (await bad.json())["error"]["param"] == "mode"
    r = await fault({"mode": "error"})
    assert r.status == 200 and (await r.json())["mode"] == "error"
    failed = await client.post("/v1/chat/completions", json=CHAT, headers=bearer("sk-user"))
    assert failed.status == 502
    validate("ErrorResponse", await failed.json())
    assert fake_engine.calls == []
    assert (await fault({"mode": "ok"})).status == 200
    ok = await client.post("/v1/chat/completions", json=CHAT, headers=bearer("sk-user"))
    assert ok.status == 200 and len(fake_engine.calls) == 1


async def test_without_the_wrapper_there_is_no_fault_route(make_client: MakeClient) -> None:
    client = await make_client(auth=AUTH)
    r = await client.post("/admin/faults", json={"mode": "error"}, headers=bearer("sk-admin"))
    assert r.status == 404


def test_a_request_the_fault_holds_has_made_no_token() -> None:
    """The breaker asks whole answers how many tokens they have made: one held by the
    `hang` fault (or in the `slow` delay) has made none, as a hung engine's."""
    from proxy.engine.faults import FaultRequest

    inner = FakeEngine()
    engine = FaultyEngine(inner)  # type: ignore[arg-type]
    assert engine.generated_tokens("r") is None  # healthy: the inner engine's word
    for mode in ("hang", "slow"):
        engine.switch(FaultRequest(mode=mode))
        assert engine.generated_tokens("r") == 0
    inner.progress["r"] = 7
    assert engine.generated_tokens("r") == 7  # what the inner engine made, whatever mode
