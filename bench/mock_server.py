"""`python -m bench.mock_server --config FILE [--tokens N] [--step] [--profile OUT]`: Weir
with the config's plugins, over an engine that answers at once (bench/mock_engine.py;
`--step`: one token per turn of the event loop, as a real engine hands them).

Prints `weir: listening on URL` like `weir serve`. With `--profile`, the whole server
runs under cProfile and the stats are written to OUT when it gets SIGTERM/SIGINT.

Before it listens, its startup heap (the plugins, the embedding model, the regexes) is
hidden from the garbage collector, as `weir serve` hides it once its engine is up
(`proxy.loop.freeze_startup_heap`): otherwise each collection of the oldest generation
walked it, and a chain with more to load (the embedder) paid for its size per request
here but not in `weir serve`.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import signal
import sys

from aiohttp import web

from bench.mock_engine import InstantEngine
from proxy.app import create_app
from proxy.app_state import STATE
from proxy.loop import freeze_startup_heap, run_loop
from proxy.settings import load_settings
from proxy.telemetry import configure_logging


async def _serve(config: str, port: int, tokens: int, step: bool = False) -> None:
    settings = load_settings(config)
    configure_logging(settings.logging)
    model = settings.engine.served_model_name or "mock"
    app = create_app(settings, engine=InstantEngine(model, tokens, step=step))
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    await startup_done(app)
    freeze_startup_heap()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    sys.stderr.write(f"weir: listening on http://127.0.0.1:{runner.addresses[0][1]}\n")
    sys.stderr.flush()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


async def startup_done(app: web.Application) -> None:
    """The engine started and the embedding model loaded (what `weir serve` has done by
    the time it freezes its heap: its engine takes far longer than the embedder)."""
    st = app[STATE]
    await st.engine_settled.wait()
    if st.embedder is not None:
        await st.embedder.ready()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--step", action="store_true")
    p.add_argument("--profile")
    a = p.parse_args()
    if a.profile:
        prof = cProfile.Profile()
        prof.enable()
        try:
            run_loop(_serve(a.config, a.port, a.tokens, a.step))
        finally:
            prof.disable()
            prof.dump_stats(a.profile)
    else:
        run_loop(_serve(a.config, a.port, a.tokens, a.step))


if __name__ == "__main__":
    main()
