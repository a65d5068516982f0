"""`python -m bench.cpu_cost [--rounds R] [--n N] [--concurrency C] [--step] [--hits]`: the
gateway's CPU time per streamed miss, every plugin on (config/weir.yaml's chain) against
none; with `--hits`, per exact cache hit, every plugin on (below).

Wall-clock rates mislead on a shared machine; CPU time does not (much): each server runs
over the instant engine (bench/mock_engine.py, 64 tokens), and the CPU time (user +
system) its process used while it answered N streamed, sampled requests (the cache
steps aside) is read before and after. Rounds alternate the servers. With
max_tokens 1 and 64, the per-request floor and the per-chunk cost come apart:
per chunk = (cpu(64) - cpu(1)) / 63. The kernel counts CPU time in ticks (10 ms here):
one round's figure moves in steps of 10 ms / N (25 us a request at N = 400), so take N
in the thousands for effects of a few microseconds, and read the medians over rounds.
`--step`: the engine hands one token per turn of the event loop, as a real one does
(`bench.mock_engine`): the streams interleave, and each awaits its first token while the
others run (an `--against` checkout must know `bench.mock_server --step` too).

`--hits`: the CPU time per exact cache hit, every plugin on: whole (non-streamed)
answers to deterministic questions (temperature 0), 10 distinct ones asked over and
over, each stored once before the rounds (and its semantic vector made while the
server idles), so every measured request is an `exact` hit (checked). `--against` runs
the other checkout's server beside it, rounds alternated. `--profile OUT` runs one more
server of this checkout under cProfile (`bench.mock_server --profile`), sends it the
same hits and prints its top frames by own time and by cumulative time; the stats stay
in OUT (`python -m pstats OUT`).
"""

from __future__ import annotations

import argparse
import pstats
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.fleet import default_plugins
from bench.load import run_load
from bench.overhead import mock_weir, question_bodies
from bench.procs import Server
from proxy.loop import run_loop


def _bodies(n: int, max_tokens: int) -> list[dict[str, Any]]:
    return [{"model": "mock", "max_tokens": max_tokens, "stream": True,
             "messages": [{"role": "user", "content": f"Tell me about store {i}."}]}
            for i in range(n)]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--n", type=int, default=400)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--only", choices=("all", "none"))
    p.add_argument("--against", metavar="ROOT",
                   help="another checkout of Weir (a commit to compare with): its servers "
                        "run beside these, rounds alternated (named old-all, old-none)")
    p.add_argument("--step", action="store_true",
                   help="the engine hands one token per turn of the event loop")
    p.add_argument("--hits", action="store_true",
                   help="CPU per exact cache hit (whole answers), every plugin on")
    p.add_argument("--profile", metavar="OUT",
                   help="with --hits: one more server under cProfile, its stats to OUT")
    a = p.parse_args()
    if a.hits:
        hits(a)
        return
    tmp = Path(tempfile.mkdtemp(prefix="weir-cpu-"))
    servers = {"all": mock_weir(tmp, "all", default_plugins(), True, None),
               "none": mock_weir(tmp, "none", [], False, None)}
    if a.only:
        servers = {a.only: servers[a.only]}
    if a.against:
        for name in list(servers):
            old = mock_weir(tmp, f"old-{name}", default_plugins() if name == "all" else [],
                            name == "all", None)
            # (a script, not -m: the current directory must not come first on the path)
            old.cmd[1:3] = [str(Path(a.against) / "bench" / "mock_server.py")]
            old.env["PYTHONPATH"] = a.against
            servers[f"old-{name}"] = old
    for s in servers.values():
        s.cmd += ["--tokens", "64", *(["--step"] if a.step else [])]
    per: dict[tuple[str, int], list[float]] = {}
    try:
        for s in servers.values():
            s.start(timeout=180)
        for s in servers.values():  # warm-up
            run_loop(run_load(s.base_url + "/v1/chat/completions", _bodies(100, 64), 4))
        for rnd in range(a.rounds):
            names = list(servers) if rnd % 2 == 0 else list(reversed(servers))
            for mt in (1, 64):
                for name in names:
                    s = servers[name]
                    before = s.cpu_seconds()
                    r = run_loop(run_load(s.base_url + "/v1/chat/completions",
                                          _bodies(a.n, mt), a.concurrency))
                    used = s.cpu_seconds() - before
                    bad = len(r.samples) - len(r.ok())
                    if bad:
                        raise SystemExit(f"{name}: {bad} failed requests")
                    per.setdefault((name, mt), []).append(used / a.n * 1e6)
    finally:
        for s in servers.values():
            s.stop()
    shutil.rmtree(tmp, ignore_errors=True)  # (kept after a failure: its servers' logs)
    med = {k: statistics.median(v) for k, v in per.items()}
    for (name, mt), v in sorted(per.items()):
        print(f"{name:5s} max_tokens={mt:2d}: median {med[name, mt]:7.1f} us/request, "
              f"least {min(v):7.1f}; rounds {', '.join(f'{x:.0f}' for x in v)}")
    for name in servers:
        chunk = (med[name, 64] - med[name, 1]) / 63
        print(f"{name:5s} per request (1 token) {med[name, 1]:.1f} us; per chunk "
              f"{chunk:.2f} us; 64-token request {med[name, 64]:.1f} us")
    for pre in ("", "old-"):
        if f"{pre}all" in servers and f"{pre}none" in servers:
            print(f"{pre}all - {pre}none, 64 tokens: "
                  f"{med[pre + 'all', 64] - med[pre + 'none', 64]:.1f} us/request; 1 token: "
                  f"{med[pre + 'all', 1] - med[pre + 'none', 1]:.1f} us/request")


def _hit_bodies(n: int) -> list[dict[str, Any]]:
    return question_bodies(n, stream=False, deterministic=True, distinct=10)


def _hits_round(s: Server, n: int, concurrency: int) -> float:
    """CPU microseconds per request of `s` answering `n` exact hits."""
    before = s.cpu_seconds()
    r = run_loop(run_load(s.base_url + "/v1/chat/completions", _hit_bodies(n), concurrency))
    used = s.cpu_seconds() - before
    if len(r.ok()) != n or {x.cache for x in r.samples} != {"exact"}:
        raise SystemExit(f"{s.name}: {n - len(r.ok())} failed, answers "
                         f"{sorted({x.cache or '-' for x in r.samples})} (not all exact hits)")
    return used / n * 1e6


def _warm_hits(s: Server) -> None:
    """Store the questions, let the idle server embed them, then warm up on hits."""
    run_loop(run_load(s.base_url + "/v1/chat/completions", _hit_bodies(10), 1))
    time.sleep(3)  # (the semantic layer embeds what it stored while nothing is in flight)
    run_loop(run_load(s.base_url + "/v1/chat/completions", _hit_bodies(500), 4))


def hits(a: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="weir-cpu-hits-"))
    servers = {"new": mock_weir(tmp, "new", default_plugins(), True, None)}
    if a.against:
        old = mock_weir(tmp, "old", default_plugins(), True, None)
        old.cmd[1:3] = [str(Path(a.against) / "bench" / "mock_server.py")]
        old.env["PYTHONPATH"] = a.against
        servers["old"] = old
    per: dict[str, list[float]] = {}
    try:
        for s in servers.values():
            s.start(timeout=180)
        for s in servers.values():
            _warm_hits(s)
        for rnd in range(a.rounds):
            for name in (list(servers) if rnd % 2 == 0 else list(reversed(servers))):
                per.setdefault(name, []).append(_hits_round(servers[name], a.n,
                                                            a.concurrency))
    finally:
        for s in servers.values():
            s.stop()
    for name, v in per.items():
        print(f"{name:4s} exact hit: median {statistics.median(v):7.1f} us/request, least "
              f"{min(v):7.1f}; rounds {', '.join(f'{x:.0f}' for x in v)}")
    if "old" in per:
        print(f"new - old: {statistics.median(per['new']) - statistics.median(per['old']):.1f}"
              " us/request (medians)")
    if a.profile:
        prof = mock_weir(tmp, "profiled", default_plugins(), True, None)
        prof.cmd += ["--profile", a.profile]
        try:
            prof.start(timeout=180)
            _warm_hits(prof)
            _hits_round(prof, a.n, a.concurrency)
        finally:
            prof.stop()
        st = pstats.Stats(a.profile)
        st.sort_stats("tottime").print_stats(30)
        st.sort_stats("cumulative").print_stats(45)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
