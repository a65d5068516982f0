"""Cache hits over HTTP: Weir's L1, L2 and semantic hits against the cold engine path and
against LiteLLM's proxy with its Redis cache (in front of vLLM's server), in one run.

Systems (bench/fleet.py; each a real process, one redis-server of the benchmark's own):
- weir:     all plugins; the cache's L1 exact + semantic layers, Redis L2 on as well
- weir-l2:  the cache alone with L1 off and L2 on: every exact hit comes from Redis
- vllm:     vLLM's OpenAI server (LiteLLM's upstream)
- litellm:  LiteLLM proxy, `cache: true` with Redis
Each path is first filled (misses), then measured: latency one request at a time (p50,
p99) and hit throughput with 16 concurrent clients. The cold path is Weir with
`Cache-Control: no-cache, no-store` (the engine answers every request).
"""

from __future__ import annotations

from typing import Any

import yaml

from bench.fleet import Fleet, System
from bench.load import run_load, summarize
from bench.procs import ROOT
from bench.report import md_table, ratio, write
from proxy.loop import run_loop

SUITE = "cache"
PAIRS = yaml.safe_load((ROOT / "tests" / "data" / "semantic_pairs.yaml").read_text())


def chat(model: str, content: str) -> dict[str, Any]:
    return {"model": model, "temperature": 0, "max_tokens": 32,
            "messages": [{"role": "user", "content": content}]}


def questions(n: int) -> list[str]:
    return [f"Customer question {i}: how do I change the billing plan of account {i}?"
            for i in range(n)]


async def _measure(system: System, bodies: list[dict[str, Any]],
                   headers: dict[str, str] | None, concurrency_runs: int) -> dict[str, Any]:
    hdrs = system.headers(SUITE, headers)
    bodies = system.bodies(bodies, SUITE)
    lat = await run_load(system.chat_url, bodies, 1, hdrs)
    thr = await run_load(system.chat_url, bodies * concurrency_runs, 16, hdrs)
    s = summarize(lat)
    t = summarize(thr)
    hits = sum(1 for x in lat.samples + thr.samples if x.cache in ("exact", "semantic"))
    return {"p50_ms": s["e2e_p50_ms"], "p99_ms": s["e2e_p99_ms"], "mean_ms": s["e2e_mean_ms"],
            "hit_req_per_s": t["req_per_s"], "errors": s["errors"] + t["errors"],
            "weir_hits": hits, "requests": len(lat.samples) + len(thr.samples)}


async def _fill(system: System, bodies: list[dict[str, Any]], concurrency: int) -> None:
    await run_load(system.chat_url, system.bodies(bodies, SUITE), concurrency,
                   system.headers(SUITE))


def run(fleet: Fleet) -> dict[str, Any]:
    quick = fleet.quick
    n = 20 if quick else 100
    reps = 2 if quick else 4
    weir, weir_l2, litellm = fleet.need("weir"), fleet.need("weir-l2"), fleet.need("litellm")
    results: dict[str, Any] = {}
    model = fleet.served
    exact = [chat(model, q) for q in questions(n)]
    cold_bodies = [chat(model, q + " (cold)") for q in questions(n)]
    no_cache = {"Cache-Control": "no-cache, no-store"}
    base = [chat(model, a) for a, _ in PAIRS["paraphrase"]]
    para = [chat(model, b) for _, b in PAIRS["paraphrase"]]

    async def scenario() -> None:
        # Fill every cache with the same questions (misses: the engine answers).
        for s in (weir, weir_l2, litellm):
            await _fill(s, exact, 8)
        for s in (weir, litellm):
            await _fill(s, base, 4)
        results["weir_cold_engine"] = await _measure(weir, cold_bodies[: n // 2], no_cache, 1)
        results["litellm_cold"] = summarize(await run_load(
            litellm.chat_url, litellm.bodies(cold_bodies[: n // 2], SUITE), 1,
            litellm.headers(SUITE)))
        results["weir_l1_exact_hit"] = await _measure(weir, exact, None, reps)
        results["weir_l2_exact_hit"] = await _measure(weir_l2, exact, None, reps)
        # First sight: every lookup embeds (no-store: no alias is kept).
        results["weir_semantic_hit"] = await _measure(weir, para, {"Cache-Control": "no-store"},
                                                      reps)
        await _fill(weir, para, 4)  # hits keep exact aliases
        results["weir_semantic_repeat"] = await _measure(weir, para, None, reps)
        results["litellm_redis_hit"] = await _measure(litellm, exact, None, reps)
        # The same paraphrases through LiteLLM: its cache matches exactly, so they miss
        # (the first time) and reach the engine.
        results["litellm_paraphrase"] = summarize(await run_load(
            litellm.chat_url, litellm.bodies(para, SUITE), 1, litellm.headers(SUITE)))

    run_loop(scenario())
    lit = results["litellm_redis_hit"]
    rows = []
    for name, label in (("weir_l1_exact_hit", "Weir exact hit (L1)"),
                        ("weir_l2_exact_hit", "Weir exact hit (L2, Redis)"),
                        ("weir_semantic_hit", "Weir semantic hit (first sight)"),
                        ("weir_semantic_repeat", "Weir repeated paraphrase (alias)"),
                        ("litellm_redis_hit", "LiteLLM proxy hit (Redis cache)"),
                        ("weir_cold_engine", "Weir cold (engine)")):
        r = results[name]
        rows.append([label, r["p50_ms"], r["p99_ms"], r["hit_req_per_s"],
                     ratio(lit["p50_ms"], r["p50_ms"])])
    lp = results["litellm_paraphrase"]
    rows.insert(5, ["LiteLLM, same paraphrases (miss: engine)", lp["e2e_p50_ms"],
                    lp["e2e_p99_ms"], None, ratio(lit["p50_ms"], lp["e2e_p50_ms"])])
    results["ratios"] = {
        "litellm_hit_p50_over_weir_l1_p50": ratio(lit["p50_ms"],
                                                  results["weir_l1_exact_hit"]["p50_ms"]),
        "litellm_hit_p50_over_weir_l2_p50": ratio(lit["p50_ms"],
                                                  results["weir_l2_exact_hit"]["p50_ms"]),
        "litellm_hit_p50_over_weir_semantic_p50": ratio(
            lit["p50_ms"], results["weir_semantic_hit"]["p50_ms"]),
        "litellm_paraphrase_p50_over_weir_semantic_p50": ratio(
            lp["e2e_p50_ms"], results["weir_semantic_hit"]["p50_ms"]),
        "weir_l1_hit_throughput_over_litellm": ratio(
            results["weir_l1_exact_hit"]["hit_req_per_s"], lit["hit_req_per_s"]),
    }
    table = (f"Cache hits over HTTP (non-streaming chat, {n} FAQ questions, 32 tokens; "
             "latency one request at a time, throughput with 16 clients; Weir with all its "
             "plugins on).\n\n" +
             md_table(["path", "p50 ms", "p99 ms", "req/s (16 clients)",
                       "LiteLLM hit p50 / this p50"], rows))
    data = {"workload": {"questions": n, "paraphrases": len(PAIRS["paraphrase"]),
                         "throughput_repeats": reps, "engine": fleet.engine},
            "results": results, "targets": {"l1_p50_ms": 2, "l2_p50_ms": 3,
                                            "semantic_p50_ms": 40}}
    write("cache", data, table)
    print(table)
    return data
