"""Rate limits between tenants: what a tenant's answers tell of the others' traffic,
and which overrides a tenant's or user's name can reach."""

from __future__ import annotations

from typing import Any

import pytest

from plugins.rate_limit.config import RateLimitConfig
from plugins.rate_limit.plugin import RateLimitPlugin
from proxy.auth import Principal
from proxy.chain import Completion, Reply, Services
from proxy.context import RequestContext
from proxy.errors import RateLimited
from proxy.protocol import ChatCompletionRequest
from proxy.settings import Settings
from proxy.telemetry import Metrics
from tests.fakes import FakeEngine

A = Principal("a", "user", "alice", key_id="ka")
B = Principal("b", "user", "bob", key_id="kb")


def plugin(rules: list[dict[str, Any]]) -> RateLimitPlugin:
    services = Services(terminal=FakeEngine(), settings=Settings(), metrics=Metrics())
    return RateLimitPlugin(RateLimitConfig.model_validate({"rules": rules}), services)


def ctx(principal: Principal, model: str = "m") -> RequestContext:
    req = ChatCompletionRequest.model_validate(
        {"model": model, "messages": [{"role": "user", "content": "x" * 40}],
         "max_tokens": 10})
    return RequestContext(route="chat", request=req, request_id="r", principal=principal)


async def answer(c: RequestContext) -> Reply:
    return Completion({"usage": {"total_tokens": 5}})


async def call(p: RateLimitPlugin, principal: Principal) -> dict[str, str]:
    c = ctx(principal)
    await p(c, answer)
    return {k: v for k, v in c.response_headers.items() if k.startswith("x-ratelimit")}


@pytest.mark.parametrize("shared", ["global", "model"])
async def test_a_shared_rule_shows_no_tenant_the_others_usage(shared: str) -> None:
    """A `global` (or `model`) bucket counts every tenant's requests: had its remaining
    count been the tightest in the headers, tenant b would read how much a sends."""
    p = plugin([{"per": shared, "rpm": 100, "tpm": 100_000},
                {"per": "key", "rpm": 1000, "tpm": 1_000_000}])
    before = await call(p, B)
    for _ in range(20):
        await call(p, A)
    after = await call(p, B)
    assert after["x-ratelimit-limit-requests"] == "1000"  # b's own key rule
    assert after["x-ratelimit-remaining-requests"] == "998"  # its two requests only
    assert after["x-ratelimit-limit-tokens"] == "1000000"
    assert before["x-ratelimit-remaining-tokens"] == after["x-ratelimit-remaining-tokens"]
    await p.close()


async def test_only_a_global_rule_sends_no_counts_and_its_429_only_when_to_retry() -> None:
    p = plugin([{"per": "global", "rpm": 3}])
    for _ in range(3):
        assert await call(p, A) == {}
    with pytest.raises(RateLimited) as e:
        await call(p, B)
    assert e.value.status == 429 and "this server" in str(e.value)
    h = e.value.headers
    assert int(h["retry-after"]) >= 1 and int(h["retry-after-ms"]) >= 1
    assert not [k for k in h if k.startswith("x-ratelimit")]
    await p.close()


async def test_a_tenant_rule_still_shows_in_the_headers() -> None:
    p = plugin([{"per": "tenant", "rpm": 10}, {"per": "global", "rpm": 5}])
    assert (await call(p, A))["x-ratelimit-remaining-requests"] == "9"
    assert (await call(p, B))["x-ratelimit-remaining-requests"] == "9"
    await p.close()


@pytest.mark.parametrize("per", ["user", "role"])
async def test_a_name_holding_a_slash_reaches_no_other_override(per: str) -> None:
    """Overrides are keyed `tenant/user` (or `tenant/role`) unescaped, but a key holds
    exactly one `/` (config validation): a name holding one never reads as another
    tenant's or user's key. Tenant `a` with user `b/c`, tenant `a/b` with user `c`, and
    a request's own `user` field (which names no principal) all miss `a/b`'s override;
    only user (or role) `b` of tenant `a` gets it."""
    p = plugin([{"per": per, "rpm": 100, "overrides": {"a/b": {"rpm": 1}}}])

    def who(tenant: str, name: str) -> Principal:
        if per == "user":
            return Principal(tenant, "user", name, key_id="k")
        return Principal(tenant, name, "u", key_id="k")

    async def limit(principal: Principal, **body: Any) -> str:
        req = ChatCompletionRequest.model_validate(
            {"model": "m", "messages": [{"role": "user", "content": "hi"}], **body})
        c = RequestContext(route="chat", request=req, request_id="r", principal=principal)
        await p(c, answer)
        return c.response_headers["x-ratelimit-limit-requests"]

    assert await limit(who("a", "b/c")) == "100"
    assert await limit(who("a/b", "c")) == "100"
    assert await limit(who("a", "x"), user="b") == "100"
    assert await limit(who("a", "b")) == "1"
    await p.close()


@pytest.mark.parametrize("name", ["sk-the-key-itself", "alice", "acme/alice", "ABCDEF012345",
                                  "abcdef01234"])
def test_a_per_key_override_naming_no_key_fingerprint_is_refused(name: str) -> None:
    """A per-key rule's overrides are matched against the key's fingerprint (the first 12
    hex digits of its SHA-256), which nothing said: an override keyed by the key itself,
    its user or anything else was accepted and never applied, the key keeping the rule's
    limit without a word. It is refused at load, naming what to write."""
    with pytest.raises(ValueError, match="fingerprint"):
        RateLimitConfig.model_validate(
            {"rules": [{"per": "key", "rpm": 100, "overrides": {name: {"rpm": 1}}}]})


async def test_a_per_key_override_by_fingerprint_applies() -> None:
    from proxy.auth import Authenticator
    from proxy.settings import AuthSettings, sha256_hex

    auth = Authenticator(AuthSettings.model_validate(
        {"mode": "keys", "keys": [{"key": "sk-limited-key", "tenant": "t"},
                                  {"key": "sk-other-key", "tenant": "t"}]}))
    limited = auth.authenticate({"Authorization": "Bearer sk-limited-key"})
    other = auth.authenticate({"Authorization": "Bearer sk-other-key"})
    fingerprint = sha256_hex("sk-limited-key")[:12]
    for allowed in (fingerprint, "anonymous"):  # (`anonymous`: every caller, auth open)
        RateLimitConfig.model_validate(
            {"rules": [{"per": "key", "rpm": 1, "overrides": {allowed: {"rpm": 2}}}]})
    p = plugin([{"per": "key", "rpm": 100, "overrides": {fingerprint: {"rpm": 1}}}])
    await p(ctx(limited), answer)
    with pytest.raises(RateLimited):
        await p(ctx(limited), answer)
    await p(ctx(other), answer)
    await p(ctx(other), answer)
    await p.close()


def test_a_refused_per_key_override_s_error_holds_no_key_text() -> None:
    """The refusal quoted the override's name, which is the key itself when one was
    written there (what the rule's own words, "per key", invite): the key went to the
    startup error, and so to the logs. It names the override by its place and the
    fingerprint to write instead."""
    from proxy.settings import sha256_hex

    key = "sk-proj-Secret0123456789abcdef"
    with pytest.raises(ValueError) as e:
        RateLimitConfig.model_validate({"rules": [{"per": "key", "rpm": 100, "overrides": {
            sha256_hex("sk-other")[:12]: {"rpm": 5}, key: {"rpm": 1}}}]})
    message = str(e.value)
    assert key not in message and "Secret0123" not in message
    assert "override 2" in message and sha256_hex(key)[:12] in message
    with pytest.raises(ValueError, match="`abcdef012345`"):  # (an upper-case fingerprint)
        RateLimitConfig.model_validate(
            {"rules": [{"per": "key", "rpm": 100, "overrides": {"ABCDEF012345": {"rpm": 1}}}]})


async def test_a_store_outage_logs_no_exception_message(logs: Any) -> None:
    """The rate-limit store's outage was logged with the error's message (`str(e)`),
    which a store may fill with a Redis reply (a stored value) or a URL with its
    password; the line names the failed call's error type."""
    import json

    from plugins.rate_limit.gcra import StoreError

    secret = "redis://:SECRET-pass-0123456789@redis.internal:6379"
    p = plugin([{"per": "key", "rpm": 10}])
    try:
        try:
            raise ConnectionError(f"{secret} refused")
        except ConnectionError:
            raise StoreError(f"ConnectionError: {secret}") from None
    except StoreError as e:
        p._store_failed(e)
    await p.close()
    said = [json.loads(x) for x in logs.getvalue().splitlines()
            if "rate-limit store unavailable" in x]
    assert len(said) == 1 and said[0]["error"] == "ConnectionError"
    assert secret not in logs.getvalue()
