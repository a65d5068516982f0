"""Cross-tenant admin: a tenant's admin acts on its own tenant only; operator keys are
global. A purge's counts are counts within the caller's scope (no oracle on another
tenant's prompts), stats are per tenant, fault injection is operator-only. Real Redis."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from bench.redis_server import RedisServer
from proxy.app_state import STATE
from proxy.engine.faults import FaultyEngine
from tests.conftest import MakeClient, make_settings
from tests.fakes import FakeEngine
from tests.waiting import eventually

KEYS = [{"key": "k-a-user", "tenant": "a"}, {"key": "k-b-user", "tenant": "b"},
        {"key": "k-a-admin", "tenant": "a", "role": "admin"},
        {"key": "k-b-admin", "tenant": "b", "role": "admin"},
        {"key": "k-operator", "tenant": "ops", "role": "user", "operator": True}]


def h(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
async def client(make_client: MakeClient, redis_server: RedisServer) -> Any:
    cache = {"semantic": {"enabled": False}, "store_truncated": True, "scope": "tenant",
             "l2": {"enabled": True},
             "redis": {"url": redis_server.url, "key_prefix": f"weir:adm:{uuid.uuid4().hex}:"}}
    settings = make_settings(auth={"mode": "keys", "keys": KEYS}, engine={"faults": True},
                             plugins=[{"name": "cache", "config": cache}])
    return await make_client(settings, engine=FaultyEngine(FakeEngine()))  # type: ignore[arg-type]


async def ask(client: Any, key: str, content: str, **headers: str) -> str:
    r = await client.post("/v1/chat/completions", headers={**h(key), **headers}, json={
        "model": "fake-model", "temperature": 0, "max_tokens": 4,
        "messages": [{"role": "user", "content": content}]})
    assert r.status == 200, await r.text()
    cache = next(p for p in client.app[STATE].plugins if p.name == "cache")
    await cache.store.drain()  # the Redis write runs after the answer
    return str(r.headers["x-weir-cache"])


async def purge(client: Any, key: str, **f: str) -> Any:
    return await client.post("/admin/cache/purge", json=f, headers=h(key))


async def test_tenant_admin_cannot_purge_or_probe_another_tenant(client: Any) -> None:
    await ask(client, "k-b-user", "tell me about project NIGHTJAR")
    await ask(client, "k-a-user", "what is the holiday policy")
    # A's admin probes for B's word: nothing of A's matches, and B's entry is untouched.
    r = await purge(client, "k-a-admin", contains="nightjar")
    assert r.status == 200
    assert (await r.json())["purged"] == {"l1": 0, "semantic_index": 0,
                                          "redis": {"exact": 0, "semantic": 0}}
    assert await ask(client, "k-b-user", "tell me about project NIGHTJAR") == "exact"
    # Naming the other tenant is refused outright.
    r = await purge(client, "k-a-admin", tenant="b", contains="nightjar")
    assert r.status == 403 and (await r.json())["error"]["param"] == "tenant"
    # Its own tenant's entries it may purge.
    r = await purge(client, "k-a-admin", contains="holiday")
    assert (await r.json())["purged"]["redis"] == {"exact": 1, "semantic": 0}
    assert await ask(client, "k-a-user", "what is the holiday policy",
                     **{"Cache-Control": "no-store"}) == "miss"
    # Users are not admins at all.
    assert (await purge(client, "k-b-user", contains="x")).status == 403


async def test_operator_purges_across_tenants(client: Any) -> None:
    await ask(client, "k-a-user", "shared word PELICAN one")
    await ask(client, "k-b-user", "shared word PELICAN two")
    r = await purge(client, "k-operator", contains="pelican")
    assert (await r.json())["purged"]["l1"] == 2
    r = await purge(client, "k-operator", tenant="b", contains="anything")
    assert r.status == 200


async def test_stats_are_per_tenant_for_tenant_admins(client: Any) -> None:
    await ask(client, "k-a-user", "alpha question one")
    await ask(client, "k-b-user", "beta question one")
    await ask(client, "k-b-user", "beta question two")
    a = await (await client.get("/admin/cache/stats", headers=h("k-a-admin"))).json()
    b = await (await client.get("/admin/cache/stats", headers=h("k-b-admin"))).json()
    ops = await (await client.get("/admin/cache/stats", headers=h("k-operator"))).json()
    assert (a["l1"]["entries"], a["redis"]["exact"]) == (1, 1)
    assert (b["l1"]["entries"], b["redis"]["exact"]) == (2, 2)
    assert "in_flight" not in a and a["scope"] == "tenant a"
    assert (ops["l1"]["entries"], ops["redis"]["exact"], ops["scope"]) == (3, 3, "global")
    r = await client.get("/admin/cache/stats", headers=h("k-a-user"))
    assert r.status == 403
    # HEAD, as every other GET route answers it (it was a 405)
    assert (await client.head("/admin/cache/stats", headers=h("k-a-admin"))).status == 200
    assert (await client.head("/admin/cache/stats", headers=h("k-a-user"))).status == 403


async def test_fault_injection_is_operator_only(client: Any) -> None:
    engine = client.app[STATE].terminal.engine
    for key, status in (("k-a-admin", 403), ("k-a-user", 403), ("nope", 401)):
        r = await client.post("/admin/faults", json={"mode": "error"}, headers=h(key))
        assert r.status == status
        assert engine.mode == "ok"
    r = await client.post("/admin/faults", json={"mode": "error"}, headers=h("k-operator"))
    assert r.status == 200 and engine.mode == "error"


async def test_a_tenant_runs_one_purge_or_stats_at_a_time(client: Any,
                                                          monkeypatch: Any) -> None:
    """Each reads every entry of the Redis all tenants share: one tenant's admin looping
    on them concurrently is refused (429), not queued; another tenant is not held up."""
    import asyncio

    from tests.waiting import eventually

    store = next(p for p in client.app[STATE].plugins if p.name == "cache").store
    gate = asyncio.Event()
    real = store.purge
    under_way: list[dict[str, Any]] = []

    async def slow(f: dict[str, Any]) -> Any:
        under_way.append(f)
        if f.get("tenant") == "a":
            await gate.wait()
        return await real(f)

    monkeypatch.setattr(store, "purge", slow)
    first = asyncio.create_task(client.post("/admin/cache/purge", json={"contains": "x"},
                                            headers=h("k-a-admin")))
    try:
        await eventually(lambda: bool(under_way))
        again = await client.get("/admin/cache/stats", headers=h("k-a-admin"))
        body = await again.json()
        assert again.status == 429 and body["error"]["code"] == "admin_busy"
        assert again.headers["retry-after"] == "1"  # (and the finer one, as every 429's)
        assert again.headers["retry-after-ms"] == "1000"
        other = await client.post("/admin/cache/purge", json={"contains": "x"},
                                  headers=h("k-b-admin"))
        assert other.status == 200
    finally:
        gate.set()
    assert (await first).status == 200
    assert (await client.get("/admin/cache/stats", headers=h("k-a-admin"))).status == 200


def test_a_tenant_named_operator_does_not_hold_the_operators_slot() -> None:
    from plugins.cache.admin import OneAtATime
    from proxy.auth import Principal

    one = OneAtATime()
    with one.held(Principal("operator", "admin", "u")):
        with one.held(Principal("ops", "user", "o", operator=True)):
            pass  # (it was refused: both were "operator")


async def test_a_tenant_admins_uploads_do_not_hold_the_body_budget_for_the_others(
        make_client: MakeClient) -> None:
    """A purge's body counted in the body budget as nobody's: one tenant admin's stalled
    purge uploads held it for every tenant's admin, whose purges were refused a 503 as
    if theirs held an even share. They count as their tenant's."""
    client = await make_client(make_settings(
        auth={"mode": "keys", "keys": KEYS},
        server={"max_body_bytes": 65536, "max_body_bytes_in_flight": 131072},
        plugins=[{"name": "cache", "config": {"semantic": {"enabled": False}}}]))
    st = client.app[STATE]
    go = {"a": asyncio.Event(), "b": asyncio.Event()}

    def stalled(pad: int, who: str) -> AsyncIterator[bytes]:
        body = b"{" + b" " * pad + b'"contains": "x"}'

        async def upload() -> AsyncIterator[bytes]:
            yield body[:-10]
            await go[who].wait()
            yield body[-10:]
        return upload()

    def post(who: str, pad: int) -> Any:
        return client.post("/admin/cache/purge", data=stalled(pad, who), headers={
            **h(f"k-{who}-admin"), "Content-Type": "application/json"})

    mine = [asyncio.ensure_future(post("a", 60_000)) for _ in range(2)]
    await eventually(lambda: sum(st.bodies.held.values()) >= 120_000)
    theirs = asyncio.ensure_future(post("b", 20_000))  # b's admin holds none: it is read
    await eventually(lambda: sum(st.bodies.held.values()) >= 140_000 or theirs.done())
    go["b"].set()
    assert (await theirs).status == 200, await (await theirs).text()
    go["a"].set()
    assert [(await m).status for m in mine] == [200, 200]
