"""Wait for an observable condition (bounded). For effects that cross a process boundary
(Redis pub/sub between replicas) there is no in-process event to await."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def eventually(cond: Callable[[], bool], timeout: float = 1.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():  # noqa: ASYNC110 - polling a cross-process effect
            await asyncio.sleep(0.005)
