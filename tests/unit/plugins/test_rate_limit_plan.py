"""Rate limits: a caller's buckets are planned once and kept (`RateLimitPlugin._plan`),
apart for every key, user, tenant, role and model, and the kept plans are bounded."""

from __future__ import annotations

from typing import Any

import pytest

from plugins.rate_limit import plugin as rate_limit_plugin
from plugins.rate_limit.plugin import RateLimitPlugin
from proxy.auth import Principal
from proxy.context import RequestContext
from tests.unit.plugins.test_rate_limit_tenants import answer, ctx
from tests.unit.plugins.test_rate_limit_tenants import plugin as make_plugin

RULES = [{"per": "key", "rpm": 100, "tpm": 100_000, "concurrent": 4},
         {"per": "user", "rpm": 50, "overrides": {"a/vip": {"rpm": 70}}},
         {"per": "role", "tpm": 90_000}, {"per": "model", "rpm": 1000},
         {"per": "tenant", "concurrent": 8}]


def plugin() -> RateLimitPlugin:
    return make_plugin(RULES)


def test_each_caller_has_its_own_buckets() -> None:
    p = plugin()
    base = Principal("a", "user", "alice", key_id="ka")
    callers = [(base, "m"), (Principal("a", "user", "alice", key_id="kb"), "m"),
               (Principal("a", "user", "vip", key_id="ka"), "m"),
               (Principal("a", "admin", "alice", key_id="ka"), "m"),
               (Principal("b", "user", "alice", key_id="ka"), "m"), (base, "n")]
    plans = [p._plan(ctx(who, model)) for who, model in callers]
    keys = [set(plan.per_of) for plan in plans]
    for i in range(len(keys)):
        for j in range(i + 1, len(keys)):
            assert keys[i] != keys[j]
    # the override of user a/vip is its plan's, and no other caller's
    assert [b.limit for b in plans[2].rpm] == [100, 70, 1000]
    assert [b.limit for b in plans[0].rpm] == [100, 50, 1000]
    assert plans[0].own == {"weir:rl:0:key:ka:r": "rpm", "weir:rl:0:key:ka:t": "tpm",
                            "weir:rl:1:user:a/alice:r": "rpm",
                            "weir:rl:2:role:a/user:t": "tpm"}
    assert p._plan(ctx(base)) is plans[0]


async def test_a_callers_plan_is_built_once(monkeypatch: pytest.MonkeyPatch) -> None:
    p = plugin()
    built: list[str] = []
    dimension = rate_limit_plugin._dimension

    def counted(c: RequestContext, per: str) -> Any:
        built.append(per)
        return dimension(c, per)

    monkeypatch.setattr(rate_limit_plugin, "_dimension", counted)
    who = Principal("a", "user", "alice", key_id="ka")
    headers = []
    for _ in range(3):
        c = ctx(who)
        await p(c, answer)
        headers.append(c.response_headers["x-ratelimit-remaining-requests"])
    assert built == [r["per"] for r in RULES]  # once, for the first request
    assert headers == ["49", "48", "47"]  # (the tightest own rule: the user's)


async def test_kept_plans_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rate_limit_plugin, "_PLANS", 3)
    p = plugin()
    for i in range(10):
        await p(ctx(Principal("a", "user", f"u{i}", key_id=f"k{i}")), answer)
    assert len(p._plans) == 3
    assert [who[0] for who in p._plans] == ["k7", "k8", "k9"]
