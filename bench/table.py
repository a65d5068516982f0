"""The headline table, side by side with peers, all measured in one run.

Workload: FAQ-like chat traffic: a fixed set of questions and paraphrases; each request
repeats an earlier question (exactly, or as a paraphrase) with probability
`repeat_ratio`, else asks a new one; half the requests stream; temperature 0.
Systems, alternated round by round (ABCD, DCBA ...):
1. engine, no batching: vLLM's server with `max_num_seqs: 1` (one request at a time)
2. vLLM's OpenAI server, same model and engine settings
3. LiteLLM's proxy with its Redis cache, in front of (2)
4. Weir with every plugin on (the embedded default: sanitizer, rate limit, cache,
   breaker, admission)
Then: a concurrency sweep (Weir with the cache bypassed, against vLLM's server), cold
start (process start to ready; first request against steady state), and how a cache
lookup and the semantic index scale with entries. Plots go to bench/results/.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from bench.cache import AUTH, litellm_server
from bench.load import RunResult, run_load, summarize
from bench.procs import RESULTS, ROOT, Server, vllm_server, weir_server
from bench.report import md_table, ratio, write
from bench.serving import ENGINE, merge
from proxy.engine.demo_model import ensure_demo_model
from tests.redis_server import RedisServer

PAIRS = yaml.safe_load((ROOT / "tests" / "data" / "semantic_pairs.yaml").read_text())
TOPICS = ["invoice", "password", "refund", "shipping", "plan", "account", "card", "order",
          "delivery", "subscription"]


def faq_bodies(n: int, repeat_ratio: float, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    base = [a for a, _ in PAIRS["paraphrase"]]
    para = dict(PAIRS["paraphrase"])
    asked: list[str] = []
    out = []
    for i in range(n):
        if asked and rng.random() < repeat_ratio:
            q = rng.choice(asked)
            if q in para and rng.random() < 0.3:
                q = para[q]
        else:
            topic, team = rng.choice(TOPICS), rng.randint(1, 10**6)
            q = base[i % len(base)] if i < len(base) else (
                f"How do I change the {topic} settings for team {team}?")
            asked.append(q)
        out.append({"model": "weir-demo", "temperature": 0, "max_tokens": 32,
                    "stream": i % 2 == 0, "stream_options": {"include_usage": True}
                    if i % 2 == 0 else None,
                    "messages": [{"role": "user", "content": q}]})
    for b in out:
        if b["stream_options"] is None:
            del b["stream_options"]
    return out


async def _sweep(url: str, levels: list[int], headers: dict[str, str]) -> list[dict[str, Any]]:
    rows = []
    for c in levels:
        bodies = [{"model": "weir-demo", "max_tokens": 32, "ignore_eos": True, "temperature": 0,
                   "stream": True, "stream_options": {"include_usage": True},
                   "messages": [{"role": "user", "content": f"sweep {c} {i}"}]}
                  for i in range(max(8, 3 * c))]
        s = summarize(await run_load(url, bodies, c, headers))
        rows.append({"concurrency": c, "req_per_s": s["req_per_s"],
                     "output_tok_per_s": s["output_tok_per_s"], "e2e_p50_ms": s["e2e_p50_ms"],
                     "ttft_p50_ms": s["ttft_p50_ms"]})
    return rows


def scaling(sizes: list[int]) -> list[dict[str, Any]]:
    """In process: an L1 lookup and a semantic search, as entries per scope grow."""
    from plugins.cache.entry import Entry
    from plugins.cache.l1 import L1
    from plugins.cache.semantic import Partition

    rng = np.random.default_rng(0)
    rows = []
    for n in sizes:
        l1 = L1(max_bytes=2**40)
        part = Partition(384, n)
        for i in range(n):
            e = Entry(key=f"k{i}", route="chat", model="m", scope="s", tenant="t", role="r",
                      user="u", prompt="p", usage={"prompt_tokens": 1, "completion_tokens": 1},
                      choices=[{"index": 0, "text": "a", "finish_reason": "stop"}],
                      expires=1e12, stale_until=1e12)
            l1.put(e, 200)
            v = rng.standard_normal(384).astype(np.float32)
            part.add(f"k{i}", v / np.linalg.norm(v), e, "q")
        keys = [f"k{i}" for i in rng.integers(0, n, 2000)]
        t = time.perf_counter()
        for k in keys:
            l1.get(k, 1.0)
        l1_us = (time.perf_counter() - t) / len(keys) * 1e6
        qs = rng.standard_normal((50, 384)).astype(np.float32)
        times = []
        for q in qs:
            t = time.perf_counter()
            part.search(q / np.linalg.norm(q), 1.0)
            times.append(time.perf_counter() - t)
        rows.append({"entries": n, "l1_lookup_us": round(l1_us, 2),
                     "semantic_search_p50_ms": round(statistics.median(times) * 1000, 3),
                     "semantic_index_mib": round(part.vecs.nbytes / 2**20, 1)})
    return rows


def plots(per: dict[str, RunResult], sweep: dict[str, list[dict[str, Any]]]) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, r in per.items():
        xs = sorted(s.e2e * 1000 for s in r.ok())
        if xs:
            ax.plot(xs, np.linspace(0, 1, len(xs)), label=label)
    ax.set_xscale("log")
    ax.set_xlabel("end-to-end latency (ms, log)")
    ax.set_ylabel("share of requests")
    ax.set_title("Latency distribution, FAQ workload")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "latency_cdf.png", dpi=110)
    names.append("latency_cdf.png")
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, rows in sweep.items():
        ax.plot([r["concurrency"] for r in rows], [r["output_tok_per_s"] for r in rows],
                marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent streaming requests")
    ax.set_ylabel("output tokens / s")
    ax.set_title("Throughput against concurrency (continuous batching)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "throughput_sweep.png", dpi=110)
    names.append("throughput_sweep.png")
    return names


def run(quick: bool = False) -> dict[str, Any]:
    n = 64 if quick else 192
    rounds = 2 if quick else 3
    clients = 16
    levels = [1, 8, 32] if quick else [1, 4, 8, 16, 32, 64]
    sizes = [1000, 10000] if quick else [1000, 10000, 100000]
    model = str(ensure_demo_model())
    default_cfg = yaml.safe_load((ROOT / "config" / "weir.yaml").read_text())
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        redis = RedisServer(tmp).start()
        one = vllm_server(tmp, {**ENGINE, "max_num_seqs": 1}, model, name="vllm-1seq")
        vllm = vllm_server(tmp, ENGINE, model)
        weir = weir_server(tmp, ENGINE, default_cfg["plugins"], name="weir-all",
                           extra={"embeddings": {"enabled": True}})
        # The same chain without the semantic layer: what the embedding model costs when
        # it shares the CPU with the engine (on a GPU machine it does not).
        exact_only = [p if p["name"] != "cache" else
                      {**p, "config": {**p["config"], "semantic": {"enabled": False}}}
                      for p in default_cfg["plugins"]]
        weir_exact = weir_server(tmp, ENGINE, exact_only, name="weir-exact",
                                 extra={"embeddings": {"enabled": False}})
        servers: list[Server] = [one, vllm, weir, weir_exact]
        try:
            for s in servers:
                s.start()
            lite = litellm_server(tmp, vllm.base_url, redis)
            servers.append(lite)
            lite.start()
            systems = {"engine, no batching": one, "vLLM server": vllm,
                       "LiteLLM + Redis cache": lite, "Weir, all plugins": weir,
                       "Weir, all plugins, exact cache only": weir_exact}

            async def scenario() -> tuple[dict[str, list[RunResult]], dict[str, Any]]:
                per: dict[str, list[RunResult]] = {k: [] for k in systems}
                first: dict[str, Any] = {}
                for name in ("vLLM server", "Weir, all plugins"):
                    s = systems[name]
                    t = time.perf_counter()
                    await run_load(f"{s.base_url}/v1/chat/completions",
                                   [{"model": "weir-demo", "max_tokens": 32, "temperature": 0,
                                     "messages": [{"role": "user", "content": "first"}]}], 1,
                                   AUTH)
                    first[name] = round((time.perf_counter() - t) * 1000, 1)
                order = list(systems)
                for rnd in range(rounds):
                    bodies = faq_bodies(n, 0.6, seed=rnd)
                    for name in (order if rnd % 2 == 0 else order[::-1]):
                        per[name].append(await run_load(
                            f"{systems[name].base_url}/v1/chat/completions", bodies, clients,
                            AUTH, timeout_s=900))
                return per, first

            per, first = asyncio.run(scenario())
            nocache = {**AUTH, "Cache-Control": "no-cache, no-store"}
            sweep = {"Weir (cache bypassed)": asyncio.run(_sweep(
                f"{weir.base_url}/v1/chat/completions", levels, nocache)),
                "vLLM server": asyncio.run(_sweep(f"{vllm.base_url}/v1/chat/completions",
                                                  levels, AUTH))}
        finally:
            for s in servers:
                s.stop()
            redis.stop()
    merged = {k: merge(v) for k, v in per.items()}
    summary = {k: summarize(v) | {"peak_rss_mib": round(systems[k].peak_rss / 2**20)}
               for k, v in merged.items()}
    cold = {name: {"ready_after_s": round(systems[name].ready_after_s, 1),
                   "first_request_ms": first[name],
                   "steady_p50_ms": summary[name]["e2e_p50_ms"]}
            for name in ("vLLM server", "Weir, all plugins")}
    scale = scaling(sizes)
    rows = [[k, s["ok"], s["e2e_mean_ms"], s["e2e_p50_ms"], s["e2e_p99_ms"], s["ttft_p50_ms"],
             s["ttft_p99_ms"], s["req_per_s"], s["output_tok_per_s"], s["peak_rss_mib"]]
            for k, s in summary.items()]
    w = summary["Weir, all plugins"]
    ratios = {f"weir_over_{k}": {"req_per_s": ratio(w["req_per_s"], s["req_per_s"]),
                                 "p50": ratio(w["e2e_p50_ms"], s["e2e_p50_ms"]),
                                 "p99": ratio(w["e2e_p99_ms"], s["e2e_p99_ms"])}
              for k, s in summary.items() if not k.startswith("Weir")}
    we = summary["Weir, all plugins, exact cache only"]
    ratios |= {f"weir_exact_only_over_{k}": {
        "req_per_s": ratio(we["req_per_s"], s["req_per_s"]),
        "p50": ratio(we["e2e_p50_ms"], s["e2e_p50_ms"]),
        "p99": ratio(we["e2e_p99_ms"], s["e2e_p99_ms"])}
        for k, s in summary.items() if not k.startswith("Weir")}
    try:
        pngs = plots(merged, sweep)
    except ImportError:
        pngs = []
    table = "\n\n".join([
        f"FAQ workload: {n} requests a round x {rounds} rounds, {clients} clients, 60% "
        "repeats (30% of them paraphrased), half streamed, 32 tokens, systems alternated.",
        md_table(["system", "ok", "mean ms", "p50 ms", "p99 ms", "TTFT p50", "TTFT p99",
                  "req/s", "out tok/s", "peak RSS MiB"], rows),
        "Ratios (Weir / peer): " + "; ".join(
            f"{k.replace('_over_', ' / ')}: {v['req_per_s']}x req/s, p50 x{v['p50']}, "
            f"p99 x{v['p99']}" for k, v in ratios.items()),
        "Concurrency sweep (streaming, 32 tokens, ignore_eos; output tokens/s):",
        md_table(["concurrency", *sweep], [[lv, *(sweep[k][i]["output_tok_per_s"]
                                                  for k in sweep)]
                                           for i, lv in enumerate(levels)]),
        "Cold start:",
        md_table(["system", "start to ready s", "first request ms", "steady p50 ms"],
                 [[k, v["ready_after_s"], v["first_request_ms"], v["steady_p50_ms"]]
                  for k, v in cold.items()]),
        "Cache scaling (in process, per scope):",
        md_table(["entries", "L1 lookup us", "semantic search p50 ms", "index MiB"],
                 [[r["entries"], r["l1_lookup_us"], r["semantic_search_p50_ms"],
                   r["semantic_index_mib"]] for r in scale]),
    ])
    data = {"workload": {"requests_per_round": n, "rounds": rounds, "clients": clients,
                         "repeat_ratio": 0.6, "engine": ENGINE},
            "results": summary, "ratios": ratios, "sweep": sweep, "cold_start": cold,
            "scaling": scale, "plots": pngs}
    write("table", data, table)
    print(table)
    return data
