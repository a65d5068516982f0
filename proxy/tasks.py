"""Stopping background tasks.

A cancellation can be lost. On Python 3.11, `asyncio.wait_for` returns the result of
the operation it waits on, instead of raising, when that operation finishes just as the
cancellation arrives; redis-py sends every command through `wait_for` (its socket
timeout). A loop that lost its cancellation runs on, and whoever waits for it to end
waits forever: a replica's Redis listener kept a shutdown (and a CI run) waiting that
way, one close in about a hundred. So a task is cancelled again until it has ended
(`cancel_and_wait`), and a call that may lose one raises it again (`lost_cancellation`):
a request whose client left during a Redis command would otherwise run on, and
generate, for nobody.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
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


@contextmanager
def lost_cancellation() -> Iterator[None]:
    """Around a call that may lose a cancellation: if the task was cancelled during the
    call and the call returned all the same, raise the cancellation here. (A timeout
    inside the call that fired takes its own cancellation back, so it does not count.)"""
    task = asyncio.current_task()
    before = task.cancelling() if task is not None else 0
    yield
    if task is not None and task.cancelling() > before:
        raise asyncio.CancelledError
