"""Cache hits over HTTP: Weir's L1, L2 and semantic hits against the cold engine path and
against LiteLLM's proxy with its Redis cache (in front of vLLM's server), in one run.

Systems (each a real process; one redis-server of the benchmark's own):
- weir:     L1 exact + semantic (the embedded default's cache), Redis L2 on as well
- weir-l2:  L1 off, L2 on, same Redis: every exact hit comes from Redis
- vllm:     vLLM's OpenAI server (LiteLLM's upstream)
- litellm:  LiteLLM proxy, `cache: true` with Redis
Each path is first filled (misses), then measured: latency one request at a time (p50,
p99) and hit throughput with 16 concurrent clients. The cold path is Weir with
`Cache-Control: no-cache, no-store` (the engine answers every request).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import yaml

from bench.load import run_load, summarize
from bench.procs import ROOT, Server, free_port, vllm_server, weir_server
from bench.report import md_table, ratio, write
from bench.serving import ENGINE
from proxy.engine.demo_model import ensure_demo_model
from tests.redis_server import RedisServer

LITELLM_VENV = ROOT / "bench" / ".peers" / "litellm"
MASTER_KEY = "sk-bench-master-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {MASTER_KEY}"}  # LiteLLM needs it; Weir (open) ignores it
PAIRS = yaml.safe_load((ROOT / "tests" / "data" / "semantic_pairs.yaml").read_text())


def ensure_litellm() -> Path:
    """LiteLLM's proxy in a venv of its own (its pins would fight Weir's)."""
    exe = LITELLM_VENV / "bin" / "litellm"
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", str(LITELLM_VENV)], check=True)
        pip = [str(LITELLM_VENV / "bin" / "python"), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, "--upgrade", "pip"], check=True)
        subprocess.run([*pip, "litellm[proxy]", "redis"], check=True)
    return exe


def litellm_server(tmp: Path, upstream: str, redis: RedisServer) -> Server:
    port = free_port()
    cfg = {
        "model_list": [{"model_name": "weir-demo", "litellm_params": {
            "model": "openai/weir-demo", "api_base": f"{upstream}/v1", "api_key": "none"}}],
        "litellm_settings": {"cache": True, "cache_params": {
            "type": "redis", "host": "127.0.0.1", "port": redis.port,
            "namespace": f"litellm-{uuid.uuid4().hex[:6]}"}, "set_verbose": False},
        "general_settings": {"master_key": MASTER_KEY},
    }
    path = tmp / "litellm.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {"LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False", "NO_DOCS": "True"}
    return Server("litellm", [str(ensure_litellm()), "--config", str(path), "--host",
                              "127.0.0.1", "--port", str(port), "--num_workers", "1"],
                  f"http://127.0.0.1:{port}/health/liveliness", f"http://127.0.0.1:{port}",
                  tmp / "litellm.log", env=env)


def chat(content: str) -> dict[str, Any]:
    return {"model": "weir-demo", "temperature": 0, "max_tokens": 32,
            "messages": [{"role": "user", "content": content}]}


def questions(n: int) -> list[str]:
    return [f"Customer question {i}: how do I change the billing plan of account {i}?"
            for i in range(n)]


async def _measure(url: str, bodies: list[dict[str, Any]], headers: dict[str, str] | None,
                   concurrency_runs: int) -> dict[str, Any]:
    lat = await run_load(url, bodies, 1, {**AUTH, **(headers or {})})
    thr = await run_load(url, bodies * concurrency_runs, 16, {**AUTH, **(headers or {})})
    s = summarize(lat)
    t = summarize(thr)
    hits = sum(1 for x in lat.samples + thr.samples if x.cache in ("exact", "semantic"))
    return {"p50_ms": s["e2e_p50_ms"], "p99_ms": s["e2e_p99_ms"], "mean_ms": s["e2e_mean_ms"],
            "hit_req_per_s": t["req_per_s"], "errors": s["errors"] + t["errors"],
            "weir_hits": hits, "requests": len(lat.samples) + len(thr.samples)}


def run(quick: bool = False) -> dict[str, Any]:
    n = 30 if quick else 100
    reps = 2 if quick else 4
    model = str(ensure_demo_model())
    ensure_litellm()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        redis = RedisServer(tmp).start()
        rurl = redis.url
        cache_cfg = {"l2": {"enabled": True}, "redis": {"url": rurl, "timeout_s": 0.1},
                     "store_truncated": True}
        weir = weir_server(tmp, ENGINE, [{"name": "cache", "config": cache_cfg}],
                           extra={"embeddings": {"enabled": True}})
        weir_l2 = weir_server(tmp, ENGINE, [{"name": "cache", "config": {
            **cache_cfg, "exact": {"enabled": False}, "semantic": {"enabled": False},
            "redis": {"url": rurl, "timeout_s": 0.1, "key_prefix": "weir:l2only:"}}}],
            name="weir-l2")
        vllm = vllm_server(tmp, ENGINE, model)
        servers = [weir, weir_l2, vllm]
        try:
            for s in servers:
                s.start()
            litellm = litellm_server(tmp, vllm.base_url, redis)
            servers.append(litellm)
            litellm.start()

            def url(s: Server) -> str:
                return f"{s.base_url}/v1/chat/completions"

            exact = [chat(q) for q in questions(n)]
            cold_bodies = [chat(q + " (cold)") for q in questions(n)]
            no_cache = {"Cache-Control": "no-cache, no-store"}
            base = [chat(a) for a, _ in PAIRS["paraphrase"]]
            para = [chat(b) for _, b in PAIRS["paraphrase"]]

            async def scenario() -> None:
                # Fill every cache with the same questions (misses: the engine answers).
                for s in (weir, weir_l2, litellm):
                    await run_load(url(s), exact, 8, AUTH)
                for s in (weir, litellm):
                    await run_load(url(s), base, 4, AUTH)
                results["weir_cold_engine"] = await _measure(url(weir), cold_bodies[: n // 2],
                                                             no_cache, 1)
                results["litellm_cold"] = summarize(await run_load(
                    url(litellm), cold_bodies[: n // 2], 1, AUTH))
                results["weir_l1_exact_hit"] = await _measure(url(weir), exact, None, reps)
                results["weir_l2_exact_hit"] = await _measure(url(weir_l2), exact, None, reps)
                # First sight: every lookup embeds (no-store: no alias is kept).
                results["weir_semantic_hit"] = await _measure(
                    url(weir), para, {"Cache-Control": "no-store"}, reps)
                await run_load(url(weir), para, 4, AUTH)  # hits keep exact aliases
                results["weir_semantic_repeat"] = await _measure(url(weir), para, None, reps)
                results["litellm_redis_hit"] = await _measure(url(litellm), exact, None, reps)
                # The same paraphrases through LiteLLM: its cache matches exactly, so they
                # miss (the first time) and reach the engine.
                results["litellm_paraphrase"] = summarize(await run_load(
                    url(litellm), para, 1, AUTH))

            asyncio.run(scenario())
        finally:
            for s in servers:
                s.stop()
            redis.stop()
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
             "latency one request at a time, throughput with 16 clients).\n\n" +
             md_table(["path", "p50 ms", "p99 ms", "req/s (16 clients)",
                       "LiteLLM hit p50 / this p50"], rows))
    data = {"workload": {"questions": n, "paraphrases": len(PAIRS["paraphrase"]),
                         "throughput_repeats": reps, "engine": ENGINE},
            "results": results, "targets": {"l1_p50_ms": 2, "l2_p50_ms": 3,
                                            "semantic_p50_ms": 40}}
    write("cache", data, table)
    print(table)
    return data


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    run()
