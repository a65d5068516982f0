"""Stored chat completions (`store: true`) over the fake engine: kept as they went out
(whole or streamed), listed, filtered, paged, updated and deleted per tenant, shapes
against the official spec."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from bench.redis_server import RedisServer
from proxy.record_store import MemoryStore
from proxy.stored_chat import STORE
from tests.conftest import MakeClient, make_settings
from tests.fakes import FakeEngine
from tests.openai_spec import validate
from tests.sse import parse_sse

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8, "store": True}
TOOL = {"type": "function", "function": {
    "name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def keyed(*tenants: str) -> Any:
    return make_settings(auth={"mode": "keys", "keys": [
        {"key": f"sk-{t}", "tenant": t} for t in tenants]})


def auth(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer sk-{tenant}"}


async def test_a_stored_completion_is_retrieved_as_it_went_out(make_client: MakeClient) -> None:
    client = await make_client()
    body = await (await client.post("/v1/chat/completions", json={
        **CHAT, "metadata": {"team": "a"}})).json()
    got = await client.get(f"/v1/chat/completions/{body['id']}")
    assert got.status == 200
    stored = await got.json()
    validate("CreateChatCompletionResponse", stored)
    assert stored == {**body, "metadata": {"team": "a"}}


async def test_store_absent_or_false_keeps_nothing(make_client: MakeClient) -> None:
    client = await make_client()
    for store in ({}, {"store": False}):
        body = await (await client.post("/v1/chat/completions", json={
            **{k: v for k, v in CHAT.items() if k != "store"}, **store})).json()
        assert (await client.get(f"/v1/chat/completions/{body['id']}")).status == 404
    listed = await (await client.get("/v1/chat/completions")).json()
    assert listed == {"object": "list", "data": [], "has_more": False,
                      "first_id": "", "last_id": ""}


async def test_a_streamed_completion_is_stored_whole(make_client: MakeClient) -> None:
    client = await make_client()
    whole = await (await client.post("/v1/chat/completions", json={
        **CHAT, "store": False, "logprobs": True, "top_logprobs": 2})).json()
    r = await client.post("/v1/chat/completions", json={
        **CHAT, "stream": True, "logprobs": True, "top_logprobs": 2,
        "stream_options": {"include_usage": True}})
    chunks, done = parse_sse(await r.text())
    assert done
    stored = await (await client.get(f"/v1/chat/completions/{chunks[0]['id']}")).json()
    validate("CreateChatCompletionResponse", stored)
    assert stored["id"] == chunks[0]["id"] and stored["object"] == "chat.completion"
    assert stored["choices"] == whole["choices"]  # text, finish reason and logprobs
    assert stored["usage"] == whole["usage"]


async def test_a_streamed_completion_is_found_once_its_client_read_done(
        make_client: MakeClient) -> None:
    """The OpenAI SDK stops reading at `data: [DONE]`: the completion is stored by then,
    so retrieving it next finds it (it was a 404 most times: stored after `[DONE]`)."""
    client = await make_client()
    for _ in range(5):
        r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        first = None
        async with asyncio.timeout(10):
            while (line := await r.content.readline()) != b"data: [DONE]\n":
                if first is None and line.startswith(b"data: "):
                    first = json.loads(line[6:])
        got = await client.get(f"/v1/chat/completions/{first['id']}")
        assert got.status == 200
        r.close()


async def test_streamed_tool_calls_are_stored_assembled(make_client: MakeClient,
                                                        fake_engine: FakeEngine) -> None:
    client = await make_client()
    req = {**CHAT, "max_tokens": 64, "tools": [TOOL], "tool_choice": "required"}
    whole = await (await client.post("/v1/chat/completions", json={**req, "store": False})).json()
    r = await client.post("/v1/chat/completions", json={**req, "stream": True})
    chunks, _ = parse_sse(await r.text())
    stored = await (await client.get(f"/v1/chat/completions/{chunks[0]['id']}")).json()
    validate("CreateChatCompletionResponse", stored)
    got, want = stored["choices"][0], whole["choices"][0]
    assert got["finish_reason"] == want["finish_reason"] == "tool_calls"
    assert [c["function"] for c in got["message"]["tool_calls"]] == [
        c["function"] for c in want["message"]["tool_calls"]]
    assert all(c["id"] and c["type"] == "function" for c in got["message"]["tool_calls"])


async def test_a_stream_cut_short_is_not_stored(make_client: MakeClient,
                                                fake_engine: FakeEngine) -> None:
    fake_engine.fail_after = 3
    client = await make_client()
    r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    chunks, _ = parse_sse(await r.text())
    cid = next(c["id"] for c in chunks if "id" in c)
    assert (await client.get(f"/v1/chat/completions/{cid}")).status == 404


async def test_list_filters_pages_and_orders(make_client: MakeClient) -> None:
    client = await make_client()
    ids = []
    for i in range(5):
        body = await (await client.post("/v1/chat/completions", json={
            **CHAT, "metadata": {"n": str(i), "even": str(i % 2 == 0)}})).json()
        ids.append(body["id"])
    listed = await (await client.get("/v1/chat/completions")).json()
    validate("ChatCompletionList", listed)
    assert [c["id"] for c in listed["data"]] == ids  # oldest first by default
    page = await (await client.get("/v1/chat/completions",
                                   params={"limit": "2", "order": "desc"})).json()
    assert [c["id"] for c in page["data"]] == ids[:2:-1][:2] and page["has_more"]
    after = await (await client.get("/v1/chat/completions", params={
        "limit": "2", "order": "desc", "after": page["last_id"]})).json()
    assert [c["id"] for c in after["data"]] == [ids[2], ids[1]] and after["has_more"]
    even = await (await client.get("/v1/chat/completions",
                                   params={"metadata[even]": "True"})).json()
    assert [c["id"] for c in even["data"]] == ids[::2]
    both = await (await client.get("/v1/chat/completions", params={
        "metadata[even]": "True", "metadata[n]": "2"})).json()
    assert [c["id"] for c in both["data"]] == [ids[2]]
    other_model = await (await client.get("/v1/chat/completions",
                                          params={"model": "another"})).json()
    assert other_model["data"] == []
    for bad in ({"limit": "0"}, {"limit": "x"}, {"limit": " 5"}, {"limit": "+5"},
                {"limit": "\uff15"}, {"limit": str(10**30)}, {"limit": "1" * 5000},
                {"order": "up"},
                # (empty: no integer, no order; not read as not given)
                {"limit": ""}, {"order": ""},
                {"after": "nope"},
                # (a filter given twice: the first was read, the second dropped)
                {"model": ["fake-model", "another"]}, {"metadata[n]": ["2", "3"]}):
        r = await client.get("/v1/chat/completions", params=[
            (k, v) for k, vs in bad.items() for v in ([vs] if isinstance(vs, str) else vs)])
        assert r.status == 400
        err = await r.json()
        validate("ErrorResponse", err)
        assert err["error"]["param"] == next(iter(bad))


async def test_messages_are_listed_with_their_parts(make_client: MakeClient) -> None:
    client = await make_client()
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hello "},
                                             {"type": "text", "text": "there"}]}]
    body = await (await client.post("/v1/chat/completions",
                                    json={**CHAT, "messages": messages})).json()
    r = await client.get(f"/v1/chat/completions/{body['id']}/messages")
    listed = await r.json()
    # The spec's schema allows only `assistant` here, its own example lists a `user`
    # message as OpenAI's API does: the roles are the request's, the rest is checked.
    validate("ChatCompletionMessageList", {**listed, "data": [
        {**m, "role": "assistant"} for m in listed["data"]]})
    assert [(m["id"], m["role"], m["content"]) for m in listed["data"]] == [
        (f"{body['id']}-0", "system", "Be brief."), (f"{body['id']}-1", "user", "Hello there")]
    assert listed["data"][0]["content_parts"] is None
    assert listed["data"][1]["content_parts"] == messages[1]["content"]
    second = await (await client.get(f"/v1/chat/completions/{body['id']}/messages",
                                     params={"limit": "1", "order": "desc"})).json()
    assert [m["role"] for m in second["data"]] == ["user"] and second["has_more"]


async def test_update_replaces_metadata_and_checks_it(make_client: MakeClient) -> None:
    client = await make_client()
    body = await (await client.post("/v1/chat/completions",
                                    json={**CHAT, "metadata": {"a": "1"}})).json()
    url = f"/v1/chat/completions/{body['id']}"
    r = await client.post(url, json={"metadata": {"b": "2"}})
    assert r.status == 200 and (await r.json())["metadata"] == {"b": "2"}
    assert (await (await client.get(url)).json())["metadata"] == {"b": "2"}
    for bad, param in (({}, "metadata"), ({"metadata": {"k": 1}}, "metadata"),
                       ({"metadata": {}, "model": "x"}, "model")):
        r = await client.post(url, json=bad)
        assert r.status == 400, bad
        err = await r.json()
        validate("ErrorResponse", err)
        assert err["error"]["param"] == param
    assert (await client.post(url, json={"metadata": None})).status == 200
    assert (await (await client.get(url)).json())["metadata"] == {}


async def test_stored_completions_are_the_tenants_own(make_client: MakeClient) -> None:
    client = await make_client(keyed("a", "b"))
    body = await (await client.post("/v1/chat/completions", json=CHAT,
                                    headers=auth("a"))).json()
    url = f"/v1/chat/completions/{body['id']}"
    for method, path in (("GET", url), ("GET", url + "/messages"), ("DELETE", url)):
        r = await client.request(method, path, headers=auth("b"))
        assert r.status == 404
        validate("ErrorResponse", await r.json())
    r = await client.post(url, json={"metadata": {}}, headers=auth("b"))
    assert r.status == 404
    assert (await (await client.get("/v1/chat/completions", headers=auth("b"))).json())[
        "data"] == []
    assert (await client.get(url)).status == 401  # no key at all
    deleted = await client.delete(url, headers=auth("a"))
    assert await deleted.json() == {"object": "chat.completion.deleted", "id": body["id"],
                                    "deleted": True}
    validate("ChatCompletionDeleted", await deleted.json())
    assert (await client.get(url, headers=auth("a"))).status == 404
    assert (await client.delete(url, headers=auth("a"))).status == 404


async def test_a_cache_hit_is_stored_under_its_own_id(make_client: MakeClient) -> None:
    client = await make_client(make_settings(plugins=[{"name": "cache", "config": {
        "store_truncated": True}}]))  # (the fake engine runs every answer to max_tokens)
    req = {**CHAT, "temperature": 0}
    first = await client.post("/v1/chat/completions", json=req)
    again = await client.post("/v1/chat/completions", json=req)
    assert again.headers["x-weir-cache"] == "exact"
    ids = [(await first.json())["id"], (await again.json())["id"]]
    listed = await (await client.get("/v1/chat/completions")).json()
    assert [c["id"] for c in listed["data"]] == ids and ids[0] != ids[1]


async def test_stored_in_the_caches_redis_and_shared_by_replicas(
        make_client: MakeClient, redis_server: RedisServer) -> None:
    settings = make_settings(plugins=[{"name": "cache", "config": {
        "redis": {"url": redis_server.url, "key_prefix": "chat-east:"}, "l2": {"enabled": True}}}])
    other = make_settings(plugins=[{"name": "cache", "config": {
        "redis": {"url": redis_server.url, "key_prefix": "chat-west:"}, "l2": {"enabled": True}}}])
    one, two = await make_client(settings), await make_client(settings)
    elsewhere = await make_client(other)  # another deployment sharing the Redis
    body = await (await one.post("/v1/chat/completions", json=CHAT)).json()
    got = await two.get(f"/v1/chat/completions/{body['id']}")
    assert got.status == 200 and (await got.json())["choices"] == body["choices"]
    listed = await (await two.get("/v1/chat/completions")).json()
    assert [c["id"] for c in listed["data"]] == [body["id"]]
    assert (await elsewhere.get(f"/v1/chat/completions/{body['id']}")).status == 404
    assert (await (await elsewhere.get("/v1/chat/completions")).json())["data"] == []
    assert (await two.delete(f"/v1/chat/completions/{body['id']}")).status == 200
    assert (await one.get(f"/v1/chat/completions/{body['id']}")).status == 404
    assert (await (await one.get("/v1/chat/completions")).json())["data"] == []


async def test_what_is_not_a_stored_completion_under_its_key_is_not_found(
        make_client: MakeClient, redis_server: RedisServer) -> None:
    """A key in the store's place holding something else (not JSON, not an object, an
    object of another shape) is not found, and the list goes on without it."""
    import redis.asyncio as aioredis

    settings = make_settings(plugins=[{"name": "cache", "config": {
        "redis": {"url": redis_server.url, "key_prefix": "chat-odd:"}, "l2": {"enabled": True}}}])
    client = await make_client(settings)
    ids = [(await (await client.post("/v1/chat/completions", json=CHAT)).json())["id"]
           for _ in range(4)]
    r = aioredis.Redis.from_url(redis_server.url)
    try:
        for cid, junk in zip(ids[:3], (b"[1, 2]", b'{"x": 1}', b"not json"), strict=True):
            (key,) = [k async for k in r.scan_iter(match=f"chat-odd:chat:*:{cid}")]
            await r.set(key, junk)
        # and the responses store keeps no index (nothing lists stored responses)
        await client.post("/v1/responses", json={"model": "fake-model", "input": "hi",
                                                 "max_output_tokens": 16})
        assert [k async for k in r.scan_iter(match="chat-odd:responses:*")] != []
        assert [k async for k in r.scan_iter(match="chat-odd:responses:listing:*")] == []
        assert [k async for k in r.scan_iter(match="chat-odd:chat:listing:*")] != []
    finally:
        await r.aclose()
    for cid in ids[:3]:
        for path in (f"/v1/chat/completions/{cid}", f"/v1/chat/completions/{cid}/messages"):
            got = await client.get(path)
            assert got.status == 404, path
            validate("ErrorResponse", await got.json())
    listed = await (await client.get("/v1/chat/completions")).json()
    assert [c["id"] for c in listed["data"]] == ids[3:]
    again = await (await client.get("/v1/chat/completions", params={"limit": "1"})).json()
    assert [c["id"] for c in again["data"]] == ids[3:]  # (the unreadable left the listing)
    assert (again["first_id"], again["last_id"], again["has_more"]) == (ids[3], ids[3], False)


async def test_the_redis_listing_is_pruned_as_records_expire(redis_server: RedisServer,
                                                             monkeypatch: Any) -> None:
    """A tenant that stores and never lists does not grow its listing: each put takes the
    summaries whose records expired out of it; a summary leaves a listing only when its
    record is gone (not one put again meanwhile)."""
    from proxy import record_store
    from proxy.record_store import RedisStore

    store = RedisStore(redis_server.url, 3600, "prune:", kind="chat")

    async def listed(after: str | None = None) -> list[str]:
        window, more = await store.scan("t", after, False, 10)
        assert more is None
        return [x["id"] for x in window]

    try:
        await store.put("t", "a", {"x": 1}, summary={"id": "a", "at": 1})
        await store.forget("t", "a")  # its record is there: kept
        assert await listed() == ["a"]
        monkeypatch.setattr(record_store, "_GRACE_S", -7200.0)  # as if two hours on
        await store.put("t", "b", {"x": 2}, summary={"id": "b", "at": 2})
        assert await listed() == []  # both expired by then, both pruned
        with pytest.raises(KeyError):  # places and all
            await listed("a")
        monkeypatch.setattr(record_store, "_GRACE_S", 60.0)
        await store.put("t", "c", {"x": 3}, summary={"id": "c", "at": 3})
        assert await listed() == ["c"]
        assert await store.delete("t", "c") and not await store.delete("t", "c")
        assert await listed() == [] and await listed("c") == []  # its place: a cursor
    finally:
        await store.close()


def test_a_chunk_the_assembly_cannot_read_stops_storing_not_the_stream() -> None:
    from proxy.context import RequestContext
    from proxy.protocol import ChatCompletionRequest
    from proxy.reply import Stream
    from proxy.stored_chat import keep_when_completed

    ctx = RequestContext(route="chat", request=ChatCompletionRequest.model_validate(CHAT),
                         principal=None, request_id="r")  # type: ignore[arg-type]
    stream = Stream()
    keep = keep_when_completed(None, ctx, stream)  # type: ignore[arg-type]
    keep({"choices": [{"delta": {"content": "x"}}]})  # no id, no index: logged, not raised
    keep({"id": "c", "created": 1, "model": "m", "choices": []})


def test_a_stream_stored_without_its_usage_is_stored_with_none() -> None:
    """A stream whose usage is not known (an upstream that sent none) was stored with
    `usage: null`, which OpenAI's chat completion has no room for (its usage is absent or
    counts): retrieved, it failed the schema, where a whole answer so is stored without
    one. It is stored without `usage`."""
    from proxy.rendering import ChatAssembly

    chunks = ChatAssembly()
    chunks.add({"id": "c", "created": 1, "model": "m", "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": "hi"},
                             "finish_reason": "stop", "logprobs": None}]})
    completion = chunks.completion(None)
    assert completion is not None and "usage" not in completion
    validate("CreateChatCompletionResponse", completion)
    usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    assert chunks.completion(usage) == {**completion, "usage": usage}


async def test_an_answer_without_an_id_is_not_stored_and_still_answered() -> None:
    """(an upstream engine's body the store cannot name: logged, not a 500)"""
    from proxy.context import RequestContext
    from proxy.protocol import ChatCompletionRequest
    from proxy.stored_chat import save

    ctx = RequestContext(route="chat", request=ChatCompletionRequest.model_validate(CHAT),
                         principal=None, request_id="r")  # type: ignore[arg-type]
    await save(None, ctx, {"object": "chat.completion", "choices": []})  # type: ignore[arg-type]


def _redis_settings(redis_server: RedisServer, prefix: str) -> Any:
    return make_settings(plugins=[{"name": "cache", "config": {
        "redis": {"url": redis_server.url, "key_prefix": prefix}, "l2": {"enabled": True}}}])


@pytest.fixture(params=["memory", "redis"])
def store_settings(request: pytest.FixtureRequest) -> Any:
    if request.param == "memory":
        return make_settings()
    server: RedisServer = request.getfixturevalue("redis_server")
    return _redis_settings(server, f"chat-{time.monotonic_ns()}:")


async def test_deleting_what_is_listed_page_by_page_pages_on(make_client: MakeClient,
                                                             store_settings: Any) -> None:
    """The SDK's auto-paging with a delete of each item: the next page's cursor names a
    completion deleted meanwhile, and paging goes on from where it stood."""
    client = await make_client(store_settings)
    ids = [(await (await client.post("/v1/chat/completions", json=CHAT)).json())["id"]
           for _ in range(5)]
    for order, want in (("asc", ids), ("desc", ids[::-1])):
        seen: list[str] = []
        query = {"limit": "2", "order": order}
        for _ in range(5):  # (bounded)
            got = await client.get("/v1/chat/completions", params=query)
            assert got.status == 200, await got.text()
            listed = await got.json()
            validate("ChatCompletionList", listed)
            seen += [c["id"] for c in listed["data"]]
            if order == "asc":  # delete as it goes (the second pass finds them again)
                for c in listed["data"]:
                    assert (await client.delete(f"/v1/chat/completions/{c['id']}")).status == 200
            if not listed["has_more"]:
                break
            query = {**query, "after": listed["last_id"]}
        assert seen == (want if order == "asc" else [])
        if order == "asc":  # all deleted: a listing is empty, a deleted cursor still reads
            listed = await (await client.get("/v1/chat/completions",
                                             params={"after": ids[1]})).json()
            assert listed["data"] == [] and not listed["has_more"]
    for never in ("chatcmpl-never", "", "chatcmpl-never\x00nan", f"{ids[0]}\x005",
                  "\x005"):
        bad = await client.get("/v1/chat/completions", params={"after": never})
        assert bad.status == 400 and (await bad.json())["error"]["param"] == "after"


async def test_has_more_counts_only_records_still_held(make_client: MakeClient,
                                                       redis_server: RedisServer) -> None:
    """A summary whose record expired in Redis (another replica's listing still has it)
    is not a page to come."""
    import redis.asyncio as aioredis

    prefix = f"chat-more-{time.monotonic_ns()}:"
    client = await make_client(_redis_settings(redis_server, prefix))
    ids = [(await (await client.post("/v1/chat/completions", json=CHAT)).json())["id"]
           for _ in range(3)]
    r = aioredis.from_url(redis_server.url)
    try:  # the two oldest records expire; their summaries stay in the listing
        for key in [k async for k in r.scan_iter(match=f"{prefix}chat:*")
                    if k.decode().rsplit(":", 1)[-1] in ids[:2]]:
            await r.delete(key)
    finally:
        await r.aclose()
    listed = await (await client.get("/v1/chat/completions",
                                      params={"order": "desc", "limit": "1"})).json()
    assert [c["id"] for c in listed["data"]] == ids[2:] and listed["has_more"] is False


async def test_an_update_racing_a_delete_does_not_bring_the_completion_back(
        make_client: MakeClient, store_settings: Any, monkeypatch: Any) -> None:
    """A delete that lands while an update's body is still coming stands."""
    from proxy import stored_chat

    client = await make_client(store_settings)
    cid = (await (await client.post("/v1/chat/completions", json=CHAT)).json())["id"]
    tenant = store_settings.auth.anonymous_tenant
    reading = stored_chat.read_json

    async def slow_body(request: Any, *args: Any) -> Any:  # the delete, while it comes
        assert await client.app[STORE].delete(tenant, cid)
        return await reading(request, *args)

    monkeypatch.setattr(stored_chat, "read_json", slow_body)
    answer = await client.post(f"/v1/chat/completions/{cid}", json={"metadata": {"a": "2"}})
    assert answer.status == 404
    validate("ErrorResponse", await answer.json())
    assert (await client.get(f"/v1/chat/completions/{cid}")).status == 404
    assert (await (await client.get("/v1/chat/completions")).json())["data"] == []
    assert not await client.app[STORE].replace(tenant, cid, {"x": 1})


async def test_an_update_keeps_the_records_expiry(store_settings: Any,
                                                  make_client: MakeClient) -> None:
    settings = store_settings.model_copy(update={
        "responses": store_settings.responses.model_copy(update={"ttl_s": 3600.0})})
    client = await make_client(settings)
    cid = (await (await client.post("/v1/chat/completions", json=CHAT)).json())["id"]
    store, tenant = client.app[STORE], settings.auth.anonymous_tenant
    await _expire_in(store, tenant, cid, 100.0)  # as if stored an hour less 100 s ago
    changed = await client.post(f"/v1/chat/completions/{cid}", json={"metadata": {"a": "1"}})
    assert changed.status == 200
    assert await _expiry(store, tenant, cid) <= 100.0  # not pushed back by the update
    assert (await (await client.get(f"/v1/chat/completions/{cid}")).json())["metadata"] == {
        "a": "1"}


async def _expire_in(store: Any, tenant: str, cid: str, seconds: float) -> None:
    if isinstance(store, MemoryStore):
        _, record, summary, size = store._items[tenant][cid]
        store._items[tenant][cid] = (time.monotonic() + seconds, record, summary, size)
    else:
        await store._redis.pexpire(store._key(tenant, cid), int(seconds * 1000))


async def _expiry(store: Any, tenant: str, cid: str) -> float:
    """When `cid`'s record expires (seconds from now, near enough)."""
    if isinstance(store, MemoryStore):
        return float(store._items[tenant][cid][0] - time.monotonic())
    return float(await store._redis.pttl(store._key(tenant, cid))) / 1000


async def test_an_expired_record_is_not_deleted_again() -> None:
    store = MemoryStore(ttl_s=0.0, max_items=10)
    await store.put("t", "a", {"x": 1}, summary={"id": "a"})
    assert await store.get("t", "a") is None
    assert not await store.delete("t", "a")
    assert await store.scan("t", None, False, 10) == ([], None)
    assert await store.scan("t", "a", False, 10) == ([], None)  # its place: a cursor


async def test_listed_by_when_the_request_came_not_when_it_ended() -> None:
    """A long stream saved after a short request that came later is listed before it."""
    from aiohttp import web

    from proxy.context import RequestContext
    from proxy.protocol import ChatCompletionRequest
    from proxy.stored_chat import save

    app = web.Application()
    app[STORE] = MemoryStore(ttl_s=60, max_items=10)
    principal = type("P", (), {"tenant": "t"})()
    req = ChatCompletionRequest.model_validate(CHAT)
    long = RequestContext(route="chat", request=req, principal=principal,  # type: ignore[arg-type]
                          request_id="a", started=time.monotonic() - 30)
    short = RequestContext(route="chat", request=req, principal=principal,  # type: ignore[arg-type]
                           request_id="b")
    for ctx, cid in ((short, "chatcmpl-short"), (long, "chatcmpl-long")):
        await save(app, ctx, {"id": cid, "object": "chat.completion", "created": 0,
                              "model": "m", "choices": []})
    window, _ = await app[STORE].scan("t", None, False, 10)
    assert [s["id"] for s in window] == ["chatcmpl-long", "chatcmpl-short"]


async def test_a_client_leaving_at_done_was_answered_and_stored(
        make_client: MakeClient, monkeypatch: Any) -> None:
    """The SDK closes at `[DONE]`, which goes out once the stream's end hooks (storing
    it) ran: the request is a 200, not a client's 499, no abort is counted, and the
    completion is stored."""
    import asyncio

    from proxy import stored_chat
    from proxy.app_state import STATE
    from tests.waiting import eventually

    client = await make_client()
    saving, release = asyncio.Event(), asyncio.Event()
    save = stored_chat.save

    async def slow_save(*args: Any) -> None:
        saving.set()
        await release.wait()
        await save(*args)

    monkeypatch.setattr(stored_chat, "save", slow_save)
    r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    await saving.wait()  # (every event went out; `[DONE]` waits for the store)
    release.set()
    while b"[DONE]" not in await r.content.readline():
        pass
    r.close()  # gone, having read the whole answer
    registry = client.app[STATE].metrics.registry
    labels = {"route": "chat", "model": "fake-model"}
    await eventually(lambda: registry.get_sample_value(
        "weir_requests_total", {**labels, "status": "200"}) == 1)
    assert registry.get_sample_value("weir_requests_total", {**labels, "status": "499"}) is None
    assert not registry.get_sample_value("weir_requests_aborted_total",
                                         {"reason": "client_gone"})
    listed = await (await client.get("/v1/chat/completions")).json()
    assert len(listed["data"]) == 1  # stored all the same


async def test_a_listing_reads_its_windows_in_order_and_filters_them(
        make_client: MakeClient, store_settings: Any, monkeypatch: Any) -> None:
    """A listing reads the tenant's places a window at a time (not its whole history):
    a page that filters gathers its items across windows, and gone records between them
    are passed over."""
    from proxy import stored_chat

    monkeypatch.setattr(stored_chat, "_WINDOW", 2)
    client = await make_client(store_settings)
    ids = [(await (await client.post("/v1/chat/completions", json={
        **CHAT, "metadata": {"k": "odd" if i % 2 else "even"}})).json())["id"]
        for i in range(9)]
    assert (await client.delete(f"/v1/chat/completions/{ids[2]}")).status == 200
    for order, want in (("asc", [ids[i] for i in (0, 4, 6, 8)]),
                        ("desc", [ids[i] for i in (8, 6, 4, 0)])):
        seen: list[str] = []
        query = {"limit": "3", "order": order, "metadata[k]": "even"}
        for _ in range(5):  # (bounded)
            listed = await (await client.get("/v1/chat/completions", params=query)).json()
            seen += [c["id"] for c in listed["data"]]
            if not listed["has_more"]:
                break
            query = {**query, "after": listed["last_id"]}
        assert seen == want, order
    every = await (await client.get("/v1/chat/completions", params={"limit": "100"})).json()
    assert [c["id"] for c in every["data"]] == ids[:2] + ids[3:] and not every["has_more"]


async def test_a_listing_goes_on_when_its_cursors_place_is_pruned_between_windows(
        redis_server: RedisServer) -> None:
    """Another replica's put may prune the place a listing's window ended on before the
    next window is read: the listing goes on from that place's score, not stops."""
    import redis.asyncio as aioredis

    from proxy.record_store import RedisStore

    store = RedisStore(redis_server.url, 3600, f"cursor-{time.monotonic_ns()}:", kind="chat")
    r = aioredis.from_url(redis_server.url)
    try:
        for i in range(4):
            await store.put("t", f"c{i}", {"x": i}, summary={"id": f"c{i}", "at": i * 1000})
        for tied in ("d0", "d1", "d2"):  # three places of one microsecond
            await store.put("t", tied, {"x": tied}, summary={"id": tied, "at": 5000})
        for desc, first, want in (
                (False, 2, ["c2", "c3", "d0", "d1", "d2"]),  # c1 pruned
                (True, 2, ["d0", "c3", "c2", "c0"]),  # d1 pruned: d2 came, d0 to come
                (False, 4, ["d2"]),  # d0 pruned: d2, of its microsecond, to come
                (True, 1, ["c3", "c2", "c0"])):  # d2 pruned
            window, cursor = await store.scan("t", None, desc, first)
            assert cursor is not None
            place = window[-1]["id"]  # pruned meanwhile
            assert await store.delete("t", place)
            await r.zrem(store._listing("t")[1], place)
            rest, _ = await store.scan("t", cursor, desc, 10)
            assert [x["id"] for x in rest] == want, (desc, place)
    finally:
        await r.aclose()
        await store.close()


async def test_a_store_that_is_down_is_logged_briefly_and_without_its_errors_text(
        logs: Any, monkeypatch: Any) -> None:
    """Every request logged it two or three times, at error level, with the error's text
    (a protocol error's holds the bytes Redis sent back: a record, a prompt, once the
    connection is out of step): thousands of lines in a short outage under load."""
    import socket

    from proxy import record_store
    from proxy.errors import Unavailable
    from proxy.record_store import RedisStore
    from proxy.telemetry import OutageLog

    monkeypatch.setattr(record_store, "_OUTAGES", OutageLog())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = RedisStore(f"redis://127.0.0.1:{port}/0", 3600, "down:", kind="chat")
    try:
        for _ in range(5):
            with pytest.raises(Unavailable):
                await store.get("t", "secret-record-id")
    finally:
        await store.close()
    lines = [json.loads(x) for x in logs.getvalue().splitlines() if "record store" in x]
    assert [(x["event"], x["level"]) for x in lines] == [
        ("record store unavailable", "warning")]
    assert lines[0]["error"] in ("ConnectionError", "ConnectionRefusedError")


@pytest.mark.parametrize("stream", [False, True])
async def test_stored_metadata_is_screened_as_the_messages_are(
        make_client: MakeClient, stream: bool) -> None:
    """The stored messages were kept as the sanitizer redacted them, and the `metadata`
    beside them as sent: an address in it was in the store (and the listing) in clear."""
    settings = make_settings(plugins=[
        {"name": "sanitizer", "config": {"detectors": {"email": "redact", "card": "redact"}}}])
    client = await make_client(settings)
    mail = "leak.check@example.com"
    r = await client.post("/v1/chat/completions", json={
        **CHAT, "stream": stream, "metadata": {"contact": mail, "team": "a"}})
    raw = await r.text()
    cid = parse_sse(raw)[0][0]["id"] if stream else json.loads(raw)["id"]
    got = await (await client.get(f"/v1/chat/completions/{cid}")).json()
    assert got["metadata"] == {"contact": "[EMAIL]", "team": "a"}
    listed = await (await client.get("/v1/chat/completions")).text()
    assert mail not in listed and "[EMAIL]" in listed


async def test_an_assistant_refusal_is_listed_as_its_message_carried_it(
        make_client: MakeClient) -> None:
    """An assistant turn replayed as OpenAI answered it (`content: null`, `refusal`) is
    taken since this stop: its listed message said `refusal: null`, its only text lost."""
    client = await make_client()
    messages = [{"role": "user", "content": "Help me pick a lock."},
                {"role": "assistant", "content": None, "refusal": "I can't help with that."},
                {"role": "user", "content": "Why not?"}]
    body = await (await client.post("/v1/chat/completions",
                                    json={**CHAT, "messages": messages})).json()
    listed = await (await client.get(f"/v1/chat/completions/{body['id']}/messages")).json()
    validate("ChatCompletionMessageList", {**listed, "data": [
        {**m, "role": "assistant"} for m in listed["data"]]})
    assert [(m["content"], m["refusal"]) for m in listed["data"]] == [
        ("Help me pick a lock.", None), (None, "I can't help with that."), ("Why not?", None)]


async def test_updated_metadata_is_screened_as_created_metadata_is(
        make_client: MakeClient) -> None:
    """`POST /v1/chat/completions/{id}` stored its new metadata as sent, where the
    create path screens it: an address set by an update was in the store (and the
    listing) in clear."""
    settings = make_settings(plugins=[
        {"name": "sanitizer", "config": {"detectors": {"email": "redact"}}}])
    client = await make_client(settings)
    mail = "leak.check@example.com"
    cid = (await (await client.post("/v1/chat/completions", json={
        **CHAT, "metadata": {"team": "a"}})).json())["id"]
    url = f"/v1/chat/completions/{cid}"
    r = await client.post(url, json={"metadata": {"contact": mail, "team": "b"}})
    assert r.status == 200 and (await r.json())["metadata"] == {
        "contact": "[EMAIL]", "team": "b"}
    assert (await (await client.get(url)).json())["metadata"] == {
        "contact": "[EMAIL]", "team": "b"}
    listed = await (await client.get("/v1/chat/completions")).text()
    assert mail not in listed and "[EMAIL]" in listed


@pytest.mark.parametrize("stream", [False, True])
async def test_a_stored_completion_a_fallback_made_says_so_when_retrieved(
        make_client: MakeClient, fake_engine: FakeEngine, stream: bool) -> None:
    """A chat completion (`store: true`) the breaker's fallback answered read later as
    the model's answer: a GET now carries `x-weir-fallback` as the create did."""
    client = await make_client(plugins=[{"name": "breaker", "config": {
        "minimum_calls": 1000, "fallback": [{"kind": "static", "content": "Busy, sorry."}]}}])
    fake_engine.fail_after = 0
    r = await client.post("/v1/chat/completions", json={**CHAT, "stream": stream})
    assert r.headers["x-weir-fallback"] == "static"
    text = await r.text()
    cid = parse_sse(text)[0][0]["id"] if stream else json.loads(text)["id"]
    got = await client.get(f"/v1/chat/completions/{cid}")
    assert got.status == 200 and got.headers.get("x-weir-fallback") == "static"
    assert (await got.json())["choices"][0]["message"]["content"] == "Busy, sorry."
    updated = await client.post(f"/v1/chat/completions/{cid}", json={"metadata": {"a": "b"}})
    assert updated.status == 200 and updated.headers.get("x-weir-fallback") == "static"
    fake_engine.fail_after = None
    plain = await (await client.post("/v1/chat/completions", json=CHAT)).json()
    got = await client.get(f"/v1/chat/completions/{plain['id']}")
    assert got.status == 200 and "x-weir-fallback" not in got.headers
