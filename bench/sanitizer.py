"""The sanitizer's added latency per request, on 4 KB and 64 KB prompts.

Measured in process: the plugin's `__call__` around a stub `call_next`, against a
pass-through plugin in the same run (the peer: what any chain step costs), on prompts of
FAQ-like text with a sprinkling of PII, so every detector does real work.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from typing import Any

from bench.fleet import Fleet
from bench.load import pct
from bench.report import md_table, write
from plugins.sanitizer.config import SanitizerConfig
from plugins.sanitizer.plugin import SanitizerPlugin
from proxy.auth import Principal
from proxy.chain import BasePlugin, Completion, PluginConfig, Reply, Services
from proxy.context import RequestContext
from proxy.protocol import ChatCompletionRequest
from proxy.settings import Settings
from proxy.telemetry import Metrics

WORDS = ("how do i reset my password the order was shipped yesterday but tracking says "
         "nothing can you help with the invoice for my subscription plan please").split()
PII = ["jane.doe@example.com", "+44 20 7946 0958", "4111 1111 1111 1111", "192.168.0.12",
       "13812345678", "这个问题怎么解决"]


def prompt(size: int, rng: random.Random) -> str:
    out: list[str] = []
    n = 0
    while n < size:
        w = rng.choice(PII) if rng.random() < 0.01 else rng.choice(WORDS)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)[:size]


class PassThrough(BasePlugin):
    name = "passthrough"


async def _time(plugin: Any, ctxs: list[RequestContext]) -> list[float]:
    async def terminal(ctx: RequestContext) -> Reply:
        return Completion({})

    out = []
    for ctx in ctxs:
        t = time.perf_counter()
        await plugin(ctx, terminal)
        out.append(time.perf_counter() - t)
    return out


def _ctxs(size: int, n: int) -> list[RequestContext]:
    rng = random.Random(size)
    ctxs = []
    for i in range(n):
        req = ChatCompletionRequest.model_validate({"model": "m", "messages": [
            {"role": "system", "content": "You are a helpful support agent."},
            {"role": "user", "content": prompt(size, rng)}]})
        ctxs.append(RequestContext(route="chat", request=req,
                                   principal=Principal("t", "user", "u"), request_id=str(i)))
    return ctxs


def run(fleet: Fleet) -> dict[str, Any]:
    quick = fleet.quick
    services = Services(terminal=None, settings=Settings(), metrics=Metrics())  # type: ignore[arg-type]
    sanitizer = SanitizerPlugin(SanitizerConfig(), services)
    passthrough = PassThrough(PluginConfig(), services)
    n = 200 if quick else 1000
    results: dict[str, Any] = {}
    rows = []
    for size in (4096, 65536):
        count = n if size == 4096 else n // 5
        asyncio.run(_time(sanitizer, _ctxs(size, 20)))  # warm regex caches
        s = asyncio.run(_time(sanitizer, _ctxs(size, count)))
        p = asyncio.run(_time(passthrough, _ctxs(size, count)))
        r = {"requests": count,
             "sanitizer_p50_ms": round(pct(s, 50) * 1000, 3),  # type: ignore[operator]
             "sanitizer_p99_ms": round(pct(s, 99) * 1000, 3),  # type: ignore[operator]
             "sanitizer_mean_ms": round(statistics.fmean(s) * 1000, 3),
             "passthrough_p50_ms": round(pct(p, 50) * 1000, 4),  # type: ignore[operator]
             "added_p50_ms": round((pct(s, 50) - pct(p, 50)) * 1000, 3)}  # type: ignore[operator]
        results[f"{size // 1024}KB"] = r
        rows.append([f"{size // 1024} KB", count, r["sanitizer_p50_ms"], r["sanitizer_p99_ms"],
                     r["passthrough_p50_ms"], r["added_p50_ms"]])
    table = ("Sanitizer added latency per request (all detectors on, normalization on).\n\n" +
             md_table(["prompt", "requests", "sanitizer p50 ms", "sanitizer p99 ms",
                       "pass-through p50 ms", "added p50 ms"], rows))
    data = {"results": results, "target": "4 KB p50 < 1 ms"}
    write("sanitizer", data, table)
    print(table)
    return data
