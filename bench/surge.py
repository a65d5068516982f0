"""A surge: about three times the engine's capacity, offered for a bounded time.

1. Unloaded: closed loop at the admission limit (no queueing); its request rate is the
   capacity, its latencies the baseline.
2. Surge: open loop at 3x that rate for `duration` seconds (arrivals do not wait for
   answers, as real traffic does not).
Reported: admitted requests' p50/p99 against the unloaded run, the share shed, and how
fast a shed request is answered. System: Weir with all plugins (bench/fleet.py; its
admission: the engine's batch of 64, a queue of 16, a 0.25 s wait); the requests sample
at temperature 1, so the cache steps aside. Peer: vLLM's server, the same engine without
admission, in the same run, where every request is let in and queues inside the engine.
"""

from __future__ import annotations

from typing import Any

from bench.fleet import ADMISSION, Fleet, System
from bench.load import RunResult, open_loop, pct, run_load, summarize
from bench.report import md_table, ratio, write
from proxy.loop import run_loop

SUITE = "surge"
LIMIT = int(ADMISSION["max_concurrent"])


def body(model: str, i: int, tokens: int) -> dict[str, Any]:
    return {"model": model, "max_tokens": tokens, "ignore_eos": True, "temperature": 1,
            "messages": [{"role": "user", "content": f"surge request {i}"}]}


def split(r: RunResult) -> dict[str, Any]:
    ok = [s.e2e for s in r.samples if s.ok]
    shed = [s.e2e for s in r.samples if s.status == 503]
    other = [s for s in r.samples if not s.ok and s.status != 503]
    ms = 1000.0
    return {"offered": len(r.samples), "admitted": len(ok), "shed": len(shed),
            "other_errors": len(other),
            "shed_share": round(len(shed) / len(r.samples), 3) if r.samples else None,
            "admitted_p50_ms": round(pct(ok, 50) * ms, 1) if ok else None,  # type: ignore[operator]
            "admitted_p99_ms": round(pct(ok, 99) * ms, 1) if ok else None,  # type: ignore[operator]
            "shed_p50_ms": round(pct(shed, 50) * ms, 2) if shed else None,  # type: ignore[operator]
            "shed_p99_ms": round(pct(shed, 99) * ms, 2) if shed else None}  # type: ignore[operator]


def run(fleet: Fleet) -> dict[str, Any]:
    # Answers of a second or more, as real ones are: the surge is three times what the
    # engine can answer, not a flood of tiny requests the load generator itself limits.
    tokens = 128
    duration = 3.0 if fleet.quick else 12.0
    guarded, peer_sys = fleet.need("weir"), fleet.need("vllm")
    model = fleet.served

    def closed(s: System, bodies: list[dict[str, Any]]) -> RunResult:
        return run_loop(run_load(s.chat_url, bodies, LIMIT, s.headers(SUITE)))

    def surge(s: System, rate: float) -> dict[str, Any]:
        bodies = [body(model, i, tokens) for i in range(round(rate * duration))]
        return split(run_loop(open_loop(s.chat_url, bodies, rate, s.headers(SUITE))))

    closed(guarded, [body(model, i, 8) for i in range(LIMIT)])  # warm up
    unloaded = [body(model, i, tokens) for i in range(LIMIT * (3 if fleet.quick else 6))]
    base = summarize(closed(guarded, unloaded))
    capacity = base["req_per_s"]
    surged = surge(guarded, 3 * capacity)
    closed(peer_sys, [body(model, i, 8) for i in range(LIMIT)])
    peer = surge(peer_sys, 3 * capacity)
    results = {"unloaded": base, "surge_with_admission": surged, "surge_without_admission": peer,
               "capacity_req_per_s": capacity, "offered_rate_req_per_s": round(3 * capacity, 2),
               "admitted_p99_over_unloaded_p99": ratio(surged["admitted_p99_ms"],
                                                       base["e2e_p99_ms"]),
               "peer_p99_over_unloaded_p99": ratio(peer["admitted_p99_ms"], base["e2e_p99_ms"])}
    rows = [[f"unloaded (closed loop, {LIMIT})", base["requests"], None, base["e2e_p50_ms"],
             base["e2e_p99_ms"], None, None],
            ["surge 3x, Weir admission", surged["offered"], surged["shed_share"],
             surged["admitted_p50_ms"], surged["admitted_p99_ms"], surged["shed_p50_ms"],
             surged["shed_p99_ms"]],
            ["surge 3x, vLLM server, no admission (peer)", peer["offered"], peer["shed_share"],
             peer["admitted_p50_ms"], peer["admitted_p99_ms"], None, None]]
    table = (f"Surge: capacity {capacity} req/s ({tokens} tokens each), offered "
             f"{round(3 * capacity, 1)} req/s for {duration:.0f} s.\n\n" +
             md_table(["run", "requests", "shed share", "p50 ms", "p99 ms", "shed p50 ms",
                       "shed p99 ms"], rows) +
             f"\n\nAdmitted p99 / unloaded p99: {results['admitted_p99_over_unloaded_p99']} "
             f"(without admission: {results['peer_p99_over_unloaded_p99']}).")
    write("surge", {"results": results, "targets": {"admitted_p99_within": "2x unloaded",
                                                    "admission": ADMISSION,
                                                    "shed_answer_ms": 10}}, table)
    print(table)
    return results
