"""The event loop Weir runs on: uvloop where it is installed (as vLLM's own server does),
asyncio's default loop otherwise. uvloop's loop roughly halves the per-event cost of
sockets and callbacks, which is most of what a streaming gateway does.

`freeze_startup_heap`: once the engine is up, everything allocated so far (torch, vLLM,
the tokenizer: about 680,000 objects) is moved out of the garbage collector's sight, as
vLLM's server does; otherwise each collection of the oldest generation walks that whole
heap, about 0.45 s on these CPUs, and stalls every stream for as long.

`one_blas_thread`: numpy's BLAS (OpenBLAS) starts a thread per core. The gateway's one
use of it, the semantic search (a matrix-vector product on the event loop), is small and
memory-bound; split over two threads on a machine whose other core runs the engine, it
waits for a thread the scheduler has not run: measured with both cores busy, a search
over 10,000 entries took 8.0 ms p50 in one run of two (0.19 ms in the other), 0.13-0.14
ms with one thread, every run.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_name() -> str:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def one_blas_thread() -> None:
    from threadpoolctl import threadpool_limits

    threadpool_limits(1, user_api="blas")


def freeze_startup_heap() -> int:
    """Collect, then freeze what survives; returns how many objects were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
