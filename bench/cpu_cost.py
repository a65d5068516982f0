"""`python -m bench.cpu_cost [--rounds R] [--n N] [--concurrency C]`: the gateway's CPU
time per streamed miss, every plugin on (config/weir.yaml's chain) against none.

Wall-clock rates mislead on a shared machine; CPU time does not (much): each server runs
over the instant engine (bench/mock_engine.py, 64 tokens), and the CPU time (user +
system) its process used while it answered N streamed, sampled requests (the cache
steps aside) is read before and after. Rounds alternate the servers. With
max_tokens 1 and 64, the per-request floor and the per-chunk cost come apart:
per chunk = (cpu(64) - cpu(1)) / 63. The kernel counts CPU time in ticks (10 ms here):
one round's figure moves in steps of 10 ms / N (25 us a request at N = 400), so take N
in the thousands for effects of a few microseconds, and read the medians over rounds.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench.fleet import default_plugins
from bench.load import run_load
from bench.overhead import mock_weir
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
    a = p.parse_args()
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
        s.cmd += ["--tokens", "64"]
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


if __name__ == "__main__":
    main()
