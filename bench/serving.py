"""Weir against vLLM's own OpenAI server: same model, same engine settings.

Weir runs its whole chain (sanitizer, rate limit, breaker, admission; the cache looks at
`Cache-Control: no-cache, no-store` and steps aside), so the figures are the gateway's
full cost on the engine path. Workload: C concurrent streaming chat requests with a
fixed output length (`ignore_eos`), each with a distinct prompt, alternating the two
systems round by round (ABBA order) so drift on a shared machine hits both. Reports
request throughput, output tokens/s, TTFT and end-to-end p50/p99, and Weir/vLLM ratios.
"""

from __future__ import annotations

from typing import Any

from bench.fleet import Fleet, System
from bench.load import RunResult, merge, run_load, summarize
from bench.report import md_table, ratio, write
from proxy.loop import run_loop

SUITE = "serving"


def bodies(model: str, n: int, tokens: int, offset: int) -> list[dict[str, Any]]:
    return [{"model": model, "stream": True, "max_tokens": tokens, "ignore_eos": True,
             "temperature": 0, "stream_options": {"include_usage": True},
             "messages": [{"role": "user",
                           "content": f"Question {offset + i}: how do I change my plan?"}]}
            for i in range(n)]


def run(fleet: Fleet) -> dict[str, Any]:
    quick = fleet.quick
    concurrency = 32
    tokens = 64 if quick else 128
    per_round = 64 if quick else 128
    rounds = 2 if quick else 4
    weir, vllm = fleet.need("weir"), fleet.need("vllm")
    servers: dict[str, System] = {"weir": weir, "vllm": vllm}
    bypass = {"Cache-Control": "no-cache, no-store"}

    def load(s: System, b: list[dict[str, Any]]) -> RunResult:
        return run_loop(run_load(s.chat_url, b, concurrency, s.headers(SUITE, bypass)))

    for s in servers.values():  # same warm-up burst for both
        load(s, bodies(fleet.served, concurrency, 16, 10_000))
    per: dict[str, list[RunResult]] = {k: [] for k in servers}
    order = list(servers)
    for rnd in range(rounds):
        for name in (order if rnd % 2 == 0 else order[::-1]):
            per[name].append(load(servers[name], bodies(fleet.served, per_round, tokens,
                                                       rnd * per_round)))
    summary = {k: summarize(merge(v)) for k, v in per.items()}
    for k in summary:
        summary[k]["rounds"] = [summarize(r) for r in per[k]]
        summary[k]["peak_rss_mib"] = round(servers[k].server.peak_rss / 2**20)
    w, v = summary["weir"], summary["vllm"]
    ratios = {
        "throughput_weir_over_vllm": ratio(w["req_per_s"], v["req_per_s"]),
        "tok_per_s_weir_over_vllm": ratio(w["output_tok_per_s"], v["output_tok_per_s"]),
        "ttft_p50_weir_over_vllm": ratio(w["ttft_p50_ms"], v["ttft_p50_ms"]),
        "e2e_p50_weir_over_vllm": ratio(w["e2e_p50_ms"], v["e2e_p50_ms"]),
        "e2e_p99_weir_over_vllm": ratio(w["e2e_p99_ms"], v["e2e_p99_ms"]),
    }
    workload = {"concurrency": concurrency, "output_tokens": tokens, "requests_per_round":
                per_round, "rounds": rounds, "stream": True, "engine": fleet.engine}
    rows = [[name, s["ok"], s["req_per_s"], s["output_tok_per_s"], s["ttft_p50_ms"],
             s["ttft_p99_ms"], s["e2e_p50_ms"], s["e2e_p99_ms"], s["peak_rss_mib"]]
            for name, s in (("Weir, all plugins (cache bypassed)", w), ("vLLM OpenAI server", v))]
    rows.append(["Weir / vLLM", None, ratios["throughput_weir_over_vllm"],
                 ratios["tok_per_s_weir_over_vllm"], ratios["ttft_p50_weir_over_vllm"], None,
                 ratios["e2e_p50_weir_over_vllm"], ratios["e2e_p99_weir_over_vllm"], None])
    table = (f"Serving: {concurrency} concurrent streaming chat requests, {tokens} output "
             f"tokens each (ignore_eos), {rounds} alternating rounds of {per_round}.\n\n" +
             md_table(["system", "ok", "req/s", "out tok/s", "TTFT p50 ms", "TTFT p99 ms",
                       "E2E p50 ms", "E2E p99 ms", "peak RSS MiB (run)"], rows))
    data = {"workload": workload, "results": summary, "ratios": ratios}
    write("serving", data, table)
    print(table)
    return data
