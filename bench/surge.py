"""A surge: about three times the engine's capacity, offered for a bounded time.

1. Unloaded: closed loop at the admission limit (no queueing); its request rate is the
   capacity, its latencies the baseline.
2. Surge: open loop at 3x that rate for `duration` seconds (arrivals do not wait for
   answers, as real traffic does not).
Reported: admitted requests' p50/p99 against the unloaded run, the share shed, and how
fast a shed request is answered. Peer: the same engine without admission in the same
run, where every request is let in and queues inside the engine.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.load import RunResult, one_request, pct, run_load, summarize
from bench.procs import Server, weir_server
from bench.report import md_table, ratio, write
from bench.serving import ENGINE

LIMIT = 16


def body(i: int, tokens: int) -> dict[str, Any]:
    return {"model": "weir-demo", "max_tokens": tokens, "ignore_eos": True, "temperature": 1,
            "messages": [{"role": "user", "content": f"surge request {i}"}]}


async def open_loop(url: str, rate: float, duration: float, tokens: int) -> RunResult:
    result = RunResult()
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn,
                                     timeout=aiohttp.ClientTimeout(total=120)) as session:
        tasks = []
        start = time.perf_counter()
        i = 0
        while (now := time.perf_counter() - start) < duration:
            target = i / rate
            if target > now:
                await asyncio.sleep(target - now)  # pacing the arrivals, not a sync point
            tasks.append(asyncio.create_task(one_request(session, url, body(i, tokens))))
            i += 1
        result.samples = list(await asyncio.gather(*tasks))
        result.wall_s = time.perf_counter() - start
    return result


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


def run(quick: bool = False) -> dict[str, Any]:
    tokens = 48
    duration = 8.0 if quick else 20.0
    admission = [{"name": "admission", "config": {
        "max_concurrent": LIMIT, "max_queue": LIMIT // 4, "max_queue_wait_s": 0.1}}]
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        guarded = weir_server(tmp, ENGINE, admission, name="weir-admission")
        open_door = weir_server(tmp, ENGINE, [], name="weir-no-admission")
        servers: list[Server] = [guarded, open_door]
        try:
            for s in servers:
                s.start()
            url = f"{guarded.base_url}/v1/chat/completions"
            asyncio.run(run_load(url, [body(i, 8) for i in range(LIMIT)], LIMIT))  # warm up
            unloaded = asyncio.run(run_load(url, [body(i, tokens) for i in range(LIMIT * 8)],
                                            LIMIT))
            base = summarize(unloaded)
            capacity = base["req_per_s"]
            surge = split(asyncio.run(open_loop(url, 3 * capacity, duration, tokens)))
            peer_url = f"{open_door.base_url}/v1/chat/completions"
            asyncio.run(run_load(peer_url, [body(i, 8) for i in range(LIMIT)], LIMIT))
            peer = split(asyncio.run(open_loop(peer_url, 3 * capacity, duration, tokens)))
        finally:
            for s in servers:
                s.stop()
    results = {"unloaded": base, "surge_with_admission": surge, "surge_without_admission": peer,
               "capacity_req_per_s": capacity, "offered_rate_req_per_s": round(3 * capacity, 2),
               "admitted_p99_over_unloaded_p99": ratio(surge["admitted_p99_ms"],
                                                       base["e2e_p99_ms"]),
               "peer_p99_over_unloaded_p99": ratio(peer["admitted_p99_ms"], base["e2e_p99_ms"])}
    rows = [["unloaded (closed loop, 16)", base["requests"], None, base["e2e_p50_ms"],
             base["e2e_p99_ms"], None, None],
            ["surge 3x, Weir admission", surge["offered"], surge["shed_share"],
             surge["admitted_p50_ms"], surge["admitted_p99_ms"], surge["shed_p50_ms"],
             surge["shed_p99_ms"]],
            ["surge 3x, no admission (peer)", peer["offered"], peer["shed_share"],
             peer["admitted_p50_ms"], peer["admitted_p99_ms"], None, None]]
    table = (f"Surge: capacity {capacity} req/s ({tokens} tokens each), offered "
             f"{round(3 * capacity, 1)} req/s for {duration:.0f} s.\n\n" +
             md_table(["run", "requests", "shed share", "p50 ms", "p99 ms", "shed p50 ms",
                       "shed p99 ms"], rows) +
             f"\n\nAdmitted p99 / unloaded p99: {results['admitted_p99_over_unloaded_p99']} "
             f"(without admission: {results['peer_p99_over_unloaded_p99']}).")
    write("surge", {"results": results, "targets": {"admitted_p99_within": "2x unloaded",
                                                    "shed_answer_ms": 10}}, table)
    print(table)
    return results
