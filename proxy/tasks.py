"""Stopping background tasks.

A cancellation can be lost. On Python 3.11, `asyncio.wait_for` returns the result of
the operation it waits on, instead of raising, when that operation finishes just as the
cancellation arrives; redis-py sends every command through `wait_for` (its socket
timeout). A loop that lost its cancellation runs on, and whoever waits for it to end
waits forever: a replica's Redis listener kept a shutdown (and a CI run) waiting that
way, one close in about a hundred. So a task is cancelled again until it has ended.
"""

from __future__ import annotations

import asyncio
from typing import Any

#: How long one cancellation gets before it is repeated.
RECANCEL_S = 0.1


async def cancel_and_wait(*tasks: asyncio.Future[Any] | None) -> None:
    """Cancel `tasks` (None is skipped) and return once each has ended. What a task
    raised on its way out is retrieved and dropped, as `gather(return_exceptions=True)`
    would."""
    given = [t for t in tasks if t is not None]
    pending = {t for t in given if not t.done()}
    while pending:
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_S)
    for t in given:
        if not t.cancelled():
            t.exception()
