"""`python -m bench.chain_cost [--n N] [--rounds R]`: the CPU time the plugin chain
itself costs a streamed request, in process (no HTTP, no socket): config/weir.yaml's
chain (its rate limits raised, as the overhead suite's) against none and against each
plugin alone, over a terminal that answers a one-chunk stream at once; each request's
context built, the chain called, the stream primed, read and ended as the SSE writer
does. Less noisy on a shared machine than the server's CPU time (`bench.cpu_cost`):
the least of R rounds is shown, with the median. Every request asks the same text, so
the sanitizer's detectors find it among the texts they remember as clean: what is left
is the chain's plumbing, not its detectors' reading.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import AsyncIterator
from typing import Any

from bench.fleet import default_plugins
from bench.mock_engine import InstantEngine
from proxy.auth import Principal
from proxy.chain import Reply, Services, Stream, build_plugins, compose
from proxy.context import RequestContext
from proxy.loop import run_loop
from proxy.protocol import ChatCompletionRequest
from proxy.settings import PluginSpec, Settings
from proxy.telemetry import Metrics
from proxy.terminal import make_terminal

BODY = {"model": "m", "max_tokens": 64, "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "Tell me about store 17: its hours?"}]}


async def _chunks() -> AsyncIterator[dict[str, Any]]:
    yield {"choices": []}


async def _terminal(ctx: RequestContext) -> Reply:
    s = Stream(_chunks())
    s.usage = {"prompt_tokens": 10, "completion_tokens": 64, "total_tokens": 74}
    return s


async def _measure(names: list[str] | None, n: int, rounds: int) -> list[float]:
    specs = [PluginSpec.model_validate(p) for p in default_plugins()
             if names is None or p["name"] in names]
    settings = Settings()
    services = Services(terminal=make_terminal(settings, InstantEngine()),
                        settings=settings, metrics=Metrics())
    plugins = build_plugins(specs, services)
    for p in plugins:
        await p.start()
    chain = compose(plugins, _terminal, deadline_s=300)
    req = ChatCompletionRequest.model_validate(BODY)
    out = []
    try:
        for _ in range(rounds):
            t0 = time.process_time()
            for _ in range(n):
                ctx = RequestContext(route="chat", request=req, request_id="r",
                                     principal=Principal("t", "user", "u", key_id="k1"))
                s = await chain(ctx)
                assert isinstance(s, Stream)
                if s.primed_at is None:
                    await s.prime()
                async for _ in s.rest():
                    pass
                await s.end_shielded("completed")
            out.append((time.process_time() - t0) / n * 1e6)
    finally:
        for p in plugins:
            await p.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--each", action="store_true", help="each plugin alone too")
    a = ap.parse_args()
    runs: list[tuple[str, list[str] | None]] = [("none", []), ("all", None)]
    if a.each:
        runs += [(p["name"], [p["name"]]) for p in default_plugins()]
    for label, names in runs:
        us = run_loop(_measure(names, a.n, a.rounds))
        print(f"{label:10s} least {min(us):7.1f} us/request, median "
              f"{statistics.median(us):7.1f}")


if __name__ == "__main__":
    main()
