"""Weir (no plugins) against vLLM's own OpenAI server: same model, same engine settings.

Workload: C concurrent streaming chat requests with a fixed output length
(`ignore_eos`), each with a distinct prompt, alternating the two systems round by round
(ABBA order) so drift on a shared machine hits both. Reports request throughput,
output tokens/s, TTFT and end-to-end p50/p99, and Weir/vLLM ratios.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

from bench.load import RunResult, run_load, summarize
from bench.procs import Server, vllm_server, weir_server
from bench.report import md_table, ratio, write
from proxy.engine.demo_model import ensure_demo_model

ENGINE = {"model": "builtin:demo", "served_model_name": "weir-demo", "dtype": "float32",
          "max_model_len": 2048, "max_num_seqs": 64, "seed": 0,
          "enable_prefix_caching": True, "cpu_kvcache_space_gib": 1}


def bodies(n: int, tokens: int, offset: int) -> list[dict[str, Any]]:
    return [{"model": "weir-demo", "stream": True, "max_tokens": tokens, "ignore_eos": True,
             "temperature": 0, "stream_options": {"include_usage": True},
             "messages": [{"role": "user",
                           "content": f"Question {offset + i}: how do I change my plan?"}]}
            for i in range(n)]


def merge(results: list[RunResult]) -> RunResult:
    out = RunResult()
    for r in results:
        out.samples += r.samples
        out.wall_s += r.wall_s
    return out


def run(quick: bool = False) -> dict[str, Any]:
    concurrency = 32
    tokens = 64 if quick else 128
    per_round = 64 if quick else 128
    rounds = 2 if quick else 4
    model = str(ensure_demo_model())
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        servers: dict[str, Server] = {
            "weir": weir_server(tmp, ENGINE),
            "vllm": vllm_server(tmp, ENGINE, model),
        }
        try:
            for s in servers.values():  # one after the other: each loads on both cores
                s.start()
            for s in servers.values():  # same warm-up burst for both
                asyncio.run(run_load(f"{s.base_url}/v1/chat/completions",
                                     bodies(concurrency, 16, 10_000), concurrency))
            per: dict[str, list[RunResult]] = {k: [] for k in servers}
            order = list(servers)
            for rnd in range(rounds):
                for name in (order if rnd % 2 == 0 else order[::-1]):
                    s = servers[name]
                    per[name].append(asyncio.run(run_load(
                        f"{s.base_url}/v1/chat/completions",
                        bodies(per_round, tokens, rnd * per_round), concurrency)))
        finally:
            for s in servers.values():
                s.stop()
    summary = {k: summarize(merge(v)) for k, v in per.items()}
    for k in summary:
        summary[k]["rounds"] = [summarize(r) for r in per[k]]
        summary[k]["peak_rss_mib"] = round(servers[k].peak_rss / 2**20)
        summary[k]["ready_after_s"] = round(servers[k].ready_after_s, 1)
    w, v = summary["weir"], summary["vllm"]
    ratios = {
        "throughput_weir_over_vllm": ratio(w["req_per_s"], v["req_per_s"]),
        "tok_per_s_weir_over_vllm": ratio(w["output_tok_per_s"], v["output_tok_per_s"]),
        "ttft_p50_weir_over_vllm": ratio(w["ttft_p50_ms"], v["ttft_p50_ms"]),
        "e2e_p50_weir_over_vllm": ratio(w["e2e_p50_ms"], v["e2e_p50_ms"]),
        "e2e_p99_weir_over_vllm": ratio(w["e2e_p99_ms"], v["e2e_p99_ms"]),
    }
    workload = {"concurrency": concurrency, "output_tokens": tokens, "requests_per_round":
                per_round, "rounds": rounds, "stream": True, "engine": ENGINE}
    rows = [[name, s["ok"], s["req_per_s"], s["output_tok_per_s"], s["ttft_p50_ms"],
             s["ttft_p99_ms"], s["e2e_p50_ms"], s["e2e_p99_ms"], s["peak_rss_mib"]]
            for name, s in (("Weir (no plugins)", w), ("vLLM OpenAI server", v))]
    rows.append(["Weir / vLLM", None, ratios["throughput_weir_over_vllm"],
                 ratios["tok_per_s_weir_over_vllm"], ratios["ttft_p50_weir_over_vllm"], None,
                 ratios["e2e_p50_weir_over_vllm"], ratios["e2e_p99_weir_over_vllm"], None])
    table = (f"Serving: {concurrency} concurrent streaming chat requests, {tokens} output "
             f"tokens each (ignore_eos), {rounds} alternating rounds of {per_round}.\n\n" +
             md_table(["system", "ok", "req/s", "out tok/s", "TTFT p50 ms", "TTFT p99 ms",
                       "E2E p50 ms", "E2E p99 ms", "peak RSS MiB"], rows))
    data = {"workload": workload, "results": summary, "ratios": ratios}
    write("serving", data, table)
    print(table)
    return data
