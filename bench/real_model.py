"""The FAQ workload on a real model: SmolLM2-135M-Instruct, the embedded default.

The headline table (table.py) runs on the generated demo model with ignore_eos: every
answer is exactly 32 tokens. Here the answers are the model's own: it stops when it has
answered (or at `MAX_TOKENS`), so the table measures a real answer length distribution,
and the cache stores only answers that ended on their own (`store_truncated: false`, as
shipped), so a repeat of a question whose answer was cut is a miss again.

Systems, each on the same converted checkpoint and engine settings (config/weir.yaml's):
vLLM's OpenAI server, and Weir with every plugin on (bench/fleet.py's "weir" role, the
semantic layer and Redis L2 included). Rounds alternate (AB, BA); the servers of the
earlier suites are stopped first (two engines of this size fit beside nothing else).
"""

from __future__ import annotations

import collections
import statistics
from typing import Any

from bench.fleet import Fleet, System, engine_for
from bench.load import RunResult, merge, pct, run_load, summarize
from bench.report import md_table, ratio, write
from bench.table import faq_bodies
from proxy.loop import run_loop

SUITE = "real_model"
MODEL = "builtin:smollm2"
MAX_TOKENS = 256


def answer_lengths(r: RunResult) -> dict[str, Any]:
    """Completion tokens of the answers the engine generated (cache hits replay one)."""
    toks = [s.tokens for s in r.ok() if s.cache in (None, "miss", "bypass")]
    return {"answers": len(toks),
            "mean": round(statistics.fmean(toks), 1) if toks else None,
            "p50": pct([float(t) for t in toks], 50), "p90": pct([float(t) for t in toks], 90),
            "cut_at_max_tokens": sum(t >= MAX_TOKENS for t in toks)}


def run(fleet: Fleet) -> dict[str, Any]:
    quick = fleet.quick
    n, rounds, clients = (16, 2, 8) if quick else (48, 2, 8)
    fleet.retire()
    with Fleet(quick=quick, engine=engine_for(MODEL), store_truncated=False) as real:
        systems: dict[str, System] = {s.label: s for s in (real.need("vllm"),
                                                            real.need("weir"))}
        per: dict[str, list[RunResult]] = {k: [] for k in systems}

        async def scenario() -> None:
            order = list(systems)
            for rnd in range(rounds):
                bodies = faq_bodies(real.served, n, 0.6, seed=rnd, max_tokens=MAX_TOKENS)
                for name in (order if rnd % 2 == 0 else order[::-1]):
                    s = systems[name]
                    per[name].append(await run_load(s.chat_url, s.bodies(bodies, SUITE),
                                                    clients, s.headers(SUITE), timeout_s=900))

        run_loop(scenario())
        merged = {k: merge(v) for k, v in per.items()}
        summary = {k: summarize(v) | {"answer_tokens": answer_lengths(v),
                                      "peak_rss_mib": round(systems[k].server.peak_rss / 2**20)}
                   for k, v in merged.items()}
        layers = dict(collections.Counter(s.cache or "none" for s in merged[
            real.need("weir").label].samples))
    weir, vllm = summary["Weir, all plugins"], summary["vLLM server"]
    ratios = {"req_per_s": ratio(weir["req_per_s"], vllm["req_per_s"]),
              "p50": ratio(weir["e2e_p50_ms"], vllm["e2e_p50_ms"]),
              "p99": ratio(weir["e2e_p99_ms"], vllm["e2e_p99_ms"]),
              "ttft_p50": ratio(weir["ttft_p50_ms"], vllm["ttft_p50_ms"])}
    rows = [[k, s["ok"], s["e2e_mean_ms"], s["e2e_p50_ms"], s["e2e_p99_ms"], s["ttft_p50_ms"],
             s["req_per_s"], s["output_tok_per_s"], s["answer_tokens"]["mean"],
             s["answer_tokens"]["p90"], s["answer_tokens"]["cut_at_max_tokens"],
             s["peak_rss_mib"]] for k, s in summary.items()]
    table = "\n\n".join([
        f"FAQ workload on {MODEL} (SmolLM2-135M-Instruct, {engine_for(MODEL)['dtype']}, "
        f"eager, CPU): {n} requests "
        f"a round x {rounds} rounds, {clients} clients, 60% repeats (30% of them "
        f"paraphrased), half streamed, temperature 0, up to {MAX_TOKENS} tokens, no "
        "ignore_eos: the model's own answer lengths. Answers cut at max_tokens are not "
        "stored (config/weir.yaml's `store_truncated: false`).",
        md_table(["system", "ok", "mean ms", "p50 ms", "p99 ms", "TTFT p50", "req/s",
                  "out tok/s", "answer tokens mean", "answer tokens p90",
                  f"answers cut at {MAX_TOKENS}", "peak RSS MiB"], rows),
        "Weir / vLLM's server: " + ", ".join(f"{k} {v}" for k, v in ratios.items()) + ".",
        "Weir's answers by cache layer (`x-weir-cache`): " + ", ".join(
            f"{k} {v}" for k, v in sorted(layers.items())) + ".",
    ])
    data = {"workload": {"model": MODEL, "requests_per_round": n, "rounds": rounds,
                         "clients": clients, "repeat_ratio": 0.6, "max_tokens": MAX_TOKENS,
                         "quick": quick},
            "results": summary, "ratios": ratios, "weir_cache_layers": layers}
    write(SUITE, data, table)
    print(table)
    return data
