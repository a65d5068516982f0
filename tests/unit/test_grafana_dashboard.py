"""The Helm chart's Grafana dashboard (helm/weir/dashboards/weir.json): its PromQL names
only metrics Weir exports, and the figures it plots are the ones the README defines,
computed from the samples of real requests."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from proxy.app_state import STATE
from tests.conftest import MakeClient, make_settings

DASHBOARD = Path(__file__).parents[2] / "helm" / "weir" / "dashboards" / "weir.json"
_SELECTOR = re.compile(r"(weir_[a-z_]+)(?:\{([^}]*)\})?")
_MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
_SUM_RATE = re.compile(r"sum\(rate\((weir_[a-z_]+(?:\{[^}]*\})?)\[\w+\]\)\)")


def exprs() -> dict[str, list[str]]:
    """Each panel's title and its queries."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return {p["title"]: [t["expr"] for t in p.get("targets", [])] for p in panels}


def _matches(labels: dict[str, str], matchers: str) -> bool:
    for name, op, value in _MATCHER.findall(matchers or ""):
        got = labels.get(name, "")
        ok = {"=": got == value, "!=": got != value,
              "=~": re.fullmatch(value, got) is not None,
              "!~": re.fullmatch(value, got) is None}[op]
        if not ok:
            return False
    return True


def evaluate(expr: str, samples: list[tuple[str, dict[str, str], float]]) -> float:
    """`expr` over one scrape, each counter's rate taken as its value (as the rate of
    traffic that started from zero): `sum(rate(SELECTOR[w]))`, `clamp_min` and
    arithmetic, what the dashboard's ratios are made of."""

    def total(m: re.Match[str]) -> str:
        sel = _SELECTOR.fullmatch(m.group(1))
        assert sel is not None, m.group(1)
        return repr(sum(v for name, labels, v in samples
                        if name == sel.group(1) and _matches(labels, sel.group(2))))

    arithmetic = _SUM_RATE.sub(total, expr).replace("clamp_min(", "max(")
    assert re.fullmatch(r"[\d.e+\-*/() ,max]+", arithmetic), arithmetic
    return float(eval(arithmetic, {"__builtins__": {}, "max": max}))


async def test_every_metric_the_dashboard_queries_is_exported(make_client: MakeClient) -> None:
    plugins = [{"name": n} for n in ("sanitizer", "rate_limit", "cache", "breaker",
                                     "admission")]
    client = await make_client(make_settings(plugins=plugins))
    registry = client.server.app[STATE].metrics.registry
    exported = set(registry._names_to_collectors)  # every sample name, children or not
    queried = {m.group(1) for qs in exprs().values() for q in qs
               for m in _SELECTOR.finditer(q)}
    assert queried and queried <= exported, queried - exported


async def test_the_cache_hit_ratio_is_hits_over_requests_that_read_the_cache(
        make_client: MakeClient) -> None:
    """README: the hit ratio is `all` hit / (hit + miss). The panel divided the hits of
    every layer by L1's lookups plus `all`'s (bypasses too): every request counted twice,
    so a cache that answered everything showed 50%."""
    client = await make_client(make_settings(plugins=[{"name": "cache", "config": {
        "semantic": {"enabled": False}, "store_truncated": True}}]))

    def ask(q: str, temperature: float = 0) -> dict[str, Any]:
        return {"model": "fake-model", "temperature": temperature, "max_tokens": 2,
                "messages": [{"role": "user", "content": q}]}

    # 3 hits, 2 misses; 2 requests the cache does not read (not deterministic)
    for q in ("q1", "q1", "q1", "q2", "q2"):
        r = await client.post("/v1/chat/completions", json=ask(q))
        assert r.status == 200
    for q in ("q1", "q3"):
        r = await client.post("/v1/chat/completions", json=ask(q, temperature=1))
        assert r.status == 200 and r.headers["x-weir-cache"] == "bypass"
    text = await (await client.get("/metrics")).text()
    samples = [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text)
               for s in f.samples]
    (query,) = exprs()["Cache hit ratio"]
    assert evaluate(query, samples) == 3 / 5
