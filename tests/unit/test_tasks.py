"""Stopping a background task whose cancellation gets lost on the way (as redis-py's
commands lose one on Python 3.11, through `asyncio.wait_for`)."""

from __future__ import annotations

import asyncio

import pytest

from proxy.tasks import cancel_and_wait


def stubborn(losses: int) -> tuple[asyncio.Task[None], list[int]]:
    """A loop that swallows its first `losses` cancellations, as a library that loses
    one does, and goes on looping."""
    lost = [0]

    async def run() -> None:
        while True:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                if lost[0] == losses:
                    raise
                lost[0] += 1

    return asyncio.create_task(run()), lost


@pytest.mark.parametrize("losses", [0, 1, 3])
async def test_a_task_that_loses_its_cancellations_still_ends(losses: int) -> None:
    task, lost = stubborn(losses)
    await asyncio.sleep(0)  # the task is in its loop
    async with asyncio.timeout(30):  # a guard: without repeating, this waits forever
        await cancel_and_wait(task)
    assert task.cancelled() and lost[0] == losses


async def test_several_tasks_none_and_finished_ones() -> None:
    async def fails() -> None:
        raise RuntimeError("on its way out")

    done = asyncio.create_task(asyncio.sleep(0))
    failed = asyncio.create_task(fails())
    await asyncio.wait({done, failed})
    (a, _), (b, _) = stubborn(1), stubborn(0)
    await asyncio.sleep(0)
    async with asyncio.timeout(30):
        await cancel_and_wait(a, None, done, failed, b)
    assert a.cancelled() and b.cancelled() and not done.cancelled()
    # The failure was retrieved: asyncio does not log it as never retrieved.
    assert failed._log_traceback is False  # type: ignore[attr-defined]
