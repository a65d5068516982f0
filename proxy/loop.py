"""The event loop Weir runs on: uvloop where it is installed (as vLLM's own server does),
asyncio's default loop otherwise. uvloop's loop roughly halves the per-event cost of
sockets and callbacks, which is most of what a streaming gateway does.

`freeze_startup_heap`: once the engine is up, everything allocated so far (torch, vLLM,
the tokenizer: about 680,000 objects) is moved out of the garbage collector's sight, as
vLLM's server does; otherwise each collection of the oldest generation walks that whole
heap, about 0.45 s on these CPUs, and stalls every stream for as long.
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


def freeze_startup_heap() -> int:
    """Collect, then freeze what survives; returns how many objects were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
