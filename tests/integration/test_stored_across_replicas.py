"""Stored responses and chat completions in the Redis two replicas share, with two
tenants: what one replica stores, updates or deletes, the other sees the same; nothing
of one tenant is found, listed, changed or deleted by the other (a 404, as for an id
that never was)."""

from __future__ import annotations

import uuid
from typing import Any

from bench.redis_server import RedisServer
from tests.conftest import MakeClient, make_settings
from tests.fakes import FakeEngine

KEYS = [{"key": "k-acme", "tenant": "acme", "user": "alice"},
        {"key": "k-globex", "tenant": "globex", "role": "admin", "user": "eve"}]
ACME, GLOBEX = ({"Authorization": "Bearer k-acme"}, {"Authorization": "Bearer k-globex"})


async def two_replicas(make_client: MakeClient, url: str) -> list[Any]:
    prefix = f"weir:test:{uuid.uuid4().hex[:8]}:"
    cache = {"redis": {"url": url, "key_prefix": prefix, "store_prompts": True},
             "l2": {"enabled": True}, "semantic": {"enabled": False}}
    return [await make_client(make_settings(auth={"mode": "keys", "keys": KEYS},
                                            plugins=[{"name": "cache", "config": cache}]),
                              engine=FakeEngine()) for _ in range(2)]


async def test_a_stored_response_is_the_same_on_either_replica(
        make_client: MakeClient, redis_server: RedisServer) -> None:
    a, b = await two_replicas(make_client, redis_server.url)
    r = await a.post("/v1/responses", headers=ACME,
                     json={"model": "fake-model", "input": "the acme secret plan",
                           "max_output_tokens": 16})
    assert r.status == 200, await r.text()
    resp = await r.json()
    rid = resp["id"]
    for c in (a, b):
        got = await c.get(f"/v1/responses/{rid}", headers=ACME)
        assert got.status == 200 and (await got.json())["output"] == resp["output"]
        items = await c.get(f"/v1/responses/{rid}/input_items", headers=ACME)
        assert items.status == 200
        assert "the acme secret plan" in await items.text()
        # the other tenant: not found, on either replica, whatever it tries
        for method, path in (("GET", f"/v1/responses/{rid}"),
                             ("GET", f"/v1/responses/{rid}/input_items"),
                             ("DELETE", f"/v1/responses/{rid}")):
            other = await c.request(method, path, headers=GLOBEX)
            assert other.status == 404, (method, path, await other.text())
            assert "acme secret" not in await other.text()
        cont = await c.post("/v1/responses", headers=GLOBEX, json={
            "model": "fake-model", "input": "and then?", "previous_response_id": rid})
        assert cont.status in (400, 404), await cont.text()
        assert "acme secret" not in await cont.text()
    # a continuation on b of what a stored
    cont = await b.post("/v1/responses", headers=ACME, json={
        "model": "fake-model", "input": "and then?", "previous_response_id": rid})
    assert cont.status == 200, await cont.text()
    # deleted on b: gone on a
    assert (await b.delete(f"/v1/responses/{rid}", headers=ACME)).status == 200
    assert (await a.get(f"/v1/responses/{rid}", headers=ACME)).status == 404
    assert (await a.delete(f"/v1/responses/{rid}", headers=ACME)).status == 404


async def test_stored_chat_completions_agree_across_replicas_and_stay_in_their_tenant(
        make_client: MakeClient, redis_server: RedisServer) -> None:
    a, b = await two_replicas(make_client, redis_server.url)
    r = await a.post("/v1/chat/completions", headers=ACME, json={
        "model": "fake-model", "store": True, "metadata": {"team": "red"},
        "messages": [{"role": "user", "content": "the acme secret plan"}]})
    assert r.status == 200, await r.text()
    cid = (await r.json())["id"]
    await b.post("/v1/chat/completions", headers=GLOBEX, json={
        "model": "fake-model", "store": True, "metadata": {"team": "red"},
        "messages": [{"role": "user", "content": "globex's own"}]})
    for c in (a, b):
        listed = await (await c.get("/v1/chat/completions", headers=ACME,
                                    params={"metadata[team]": "red"})).json()
        assert [x["id"] for x in listed["data"]] == [cid]
        theirs = await (await c.get("/v1/chat/completions", headers=GLOBEX,
                                    params={"metadata[team]": "red"})).json()
        assert cid not in [x["id"] for x in theirs["data"]] and len(theirs["data"]) == 1
        assert "acme secret" not in str(theirs)
        got = await c.get(f"/v1/chat/completions/{cid}/messages", headers=ACME)
        assert got.status == 200 and "the acme secret plan" in await got.text()
        for method, path, body in (
                ("GET", f"/v1/chat/completions/{cid}", None),
                ("GET", f"/v1/chat/completions/{cid}/messages", None),
                ("POST", f"/v1/chat/completions/{cid}", {"metadata": {"team": "blue"}}),
                ("DELETE", f"/v1/chat/completions/{cid}", None)):
            other = await c.request(method, path, headers=GLOBEX, json=body)
            assert other.status == 404, (method, path, await other.text())
    # updated on b: seen on a; deleted on a: gone on b
    upd = await b.post(f"/v1/chat/completions/{cid}", headers=ACME,
                       json={"metadata": {"team": "blue"}})
    assert upd.status == 200, await upd.text()
    got = await (await a.get(f"/v1/chat/completions/{cid}", headers=ACME)).json()
    assert got["metadata"] == {"team": "blue"}
    listed = await (await a.get("/v1/chat/completions", headers=ACME,
                                params={"metadata[team]": "red"})).json()
    assert listed["data"] == []
    assert (await a.delete(f"/v1/chat/completions/{cid}", headers=ACME)).status == 200
    assert (await b.get(f"/v1/chat/completions/{cid}", headers=ACME)).status == 404
    listed = await (await b.get("/v1/chat/completions", headers=ACME)).json()
    assert listed["data"] == []
