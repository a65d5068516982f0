"""The engine's prefix-cache salt between tenants: one per tenant (users of a tenant
share it: a timing side channel between them only), a gateway's callers each their own,
and none a client can choose."""

from __future__ import annotations

from tests.conftest import MakeClient
from tests.fakes import FakeEngine

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
CALLER = "ab" * 16 + "." + "cd" * 16
OTHER = "ef" * 16 + "." + "cd" * 16


async def test_the_prefix_cache_salt_parts_tenants_and_a_gateways_callers(
        make_client: MakeClient, fake_engine: FakeEngine) -> None:
    client = await make_client(auth={"mode": "keys", "keys": [
        {"key": "ka", "tenant": "a", "user": "alice"},
        {"key": "ka-admin", "tenant": "a", "role": "admin", "user": "root"},
        {"key": "kb", "tenant": "b", "user": "alice"},  # the same user name elsewhere
        {"key": "k-slash", "tenant": "a/b"},
        {"key": "gw", "tenant": "a", "on_behalf_of": True}]})
    asks = [("ka", None), ("ka-admin", None), ("kb", None), ("k-slash", None),
            ("gw", CALLER), ("gw", OTHER), ("gw", None)]
    for key, caller in asks:
        headers = {"Authorization": f"Bearer {key}"}
        if caller is not None:
            headers["x-weir-on-behalf-of"] = caller
        r = await client.post("/v1/chat/completions", json=CHAT, headers=headers)
        assert r.status == 200, await r.text()
    # a batch of prompts: each prompt's engine call carries its tenant's salt
    r = await client.post("/v1/completions", json={"model": "fake-model", "max_tokens": 2,
                                                   "prompt": ["x", "y"]},
                          headers={"Authorization": "Bearer kb"})
    assert r.status == 200
    salts = [c[2] for c in fake_engine.calls]
    assert all(isinstance(s, str) and len(s) == 32 for s in salts)
    a, a_admin, b, slash, caller, other, gateway, *batch = salts
    assert a == a_admin == gateway  # one tenant's users and roles share it
    assert len({a, b, slash, caller, other}) == 5  # every other tenant has its own
    assert batch == [b, b]


async def test_a_client_cannot_choose_the_salt(make_client: MakeClient,
                                               fake_engine: FakeEngine) -> None:
    """vLLM's `cache_salt` in a request would let a client pick another tenant's salt
    (it is a digest of the tenant's name): it is refused."""
    client = await make_client(auth={"mode": "keys", "keys": [{"key": "ka", "tenant": "a"}]})
    r = await client.post("/v1/chat/completions", json={**CHAT, "cache_salt": "b"},
                          headers={"Authorization": "Bearer ka"})
    assert r.status == 400
    body = await r.json()
    assert body["error"]["param"] == "cache_salt" and fake_engine.calls == []
