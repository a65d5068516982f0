"""The event loop Weir runs on: uvloop where it is installed (as vLLM's own server does),
asyncio's default loop otherwise. uvloop's loop roughly halves the per-event cost of
sockets and callbacks, which is most of what a streaming gateway does."""

from __future__ import annotations

import asyncio
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
