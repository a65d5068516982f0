"""Cancellations that get lost on the way (as redis-py's commands lose one on Python
3.11, through `asyncio.wait_for`): stopping a background task anyway, and raising a
request's cancellation again after the call that lost it."""

from __future__ import annotations

import asyncio

import pytest

from proxy.tasks import cancel_and_wait, lost_cancellation


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


async def test_a_cancelled_caller_still_waits_for_the_tasks_to_end() -> None:
    """As a cancelled `gather` does: the caller's cancellation comes out only once
    the tasks it was stopping have ended."""
    task, _ = stubborn(1)
    await asyncio.sleep(0)
    stopper = asyncio.create_task(cancel_and_wait(task))
    await asyncio.sleep(0)  # the stopper is waiting on the task
    stopper.cancel()
    async with asyncio.timeout(30):
        await asyncio.wait({stopper})
    assert stopper.cancelled() and task.done()


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


async def losing_call(started: asyncio.Event) -> str:
    """A call that finishes as its cancellation arrives and returns all the same."""
    started.set()
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        pass
    return "result"


async def test_a_lost_cancellation_is_raised_after_the_call() -> None:
    started, after = asyncio.Event(), []

    async def request(guarded: bool) -> None:
        if guarded:
            with lost_cancellation():
                await losing_call(started)
        else:
            await losing_call(started)
        after.append(guarded)  # what the request would go on to do (generate)

    for guarded in (False, True):
        started.clear()
        task = asyncio.create_task(request(guarded))
        await started.wait()
        task.cancel()
        await asyncio.wait({task})
    assert after == [False]  # the unguarded request ran on; the guarded one stopped
    assert task.cancelled()


async def test_a_timeout_inside_the_call_is_not_a_lost_cancellation() -> None:
    """A timeout that fires inside takes its own cancellation back, lost or not."""
    with lost_cancellation():
        try:
            async with asyncio.timeout(0):
                await asyncio.Event().wait()
        except TimeoutError:
            pass
        async with asyncio.timeout(0):  # fires, and the call loses its cancellation
            assert await losing_call(asyncio.Event()) == "result"
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


class Stubborn:
    """A Redis command that loses its cancellations (redis-py opening a connection to a
    frozen Redis did), ending only when `release` is set."""

    def __init__(self) -> None:
        self.release, self.started = asyncio.Event(), asyncio.Event()
        self.lost = 0

    async def __call__(self, *args: object, **kw: object) -> None:
        self.started.set()
        while True:
            try:
                await self.release.wait()
                return None
            except asyncio.CancelledError:
                self.lost += 1


async def test_redis_calls_end_on_time_when_the_command_loses_its_cancellation() -> None:
    """The cache's reads and the rate limiter's calls end within their timeout: an
    `asyncio.timeout` around the command waited for it to take the cancellation, and
    one that lost it ran on to its socket timeout (4 s for the cache's 50 ms read,
    whenever Redis froze under load)."""
    from prometheus_client import CollectorRegistry, Counter

    from plugins.cache.config import RedisConfig
    from plugins.cache.redis_store import RedisStore as CacheRedis
    from plugins.rate_limit.gcra import Bucket, StoreError
    from plugins.rate_limit.gcra import RedisStore as LimitRedis
    from tests.waiting import eventually

    errors = Counter("e", "e", ["op"], registry=CollectorRegistry())
    cache = CacheRedis(RedisConfig(url="redis://127.0.0.1:1/0", timeout_s=0.01),
                       errors, "r1")
    limits = LimitRedis("redis://127.0.0.1:1/0", timeout_s=0.01)
    get, admit = Stubborn(), Stubborn()
    cache.client.get = get  # type: ignore[method-assign]
    limits._admit = admit  # type: ignore[assignment]
    read = asyncio.ensure_future(cache.get_exact("k"))
    admitted = asyncio.ensure_future(limits.admit([Bucket("b", 10, 1)], [], "l", 1000))
    try:
        await eventually(lambda: read.done() and admitted.done(), timeout=2.0)
        assert read.result() is None and not cache.healthy
        assert isinstance(admitted.exception(), StoreError)
        # (the commands were cancelled, and lost it)
        await eventually(lambda: bool(get.lost and admit.lost))
    finally:
        get.release.set()
        admit.release.set()
        await asyncio.gather(read, admitted, return_exceptions=True)
        await cache.client.aclose()
        await limits.close()


async def test_abandon_after_passes_on_a_result_and_a_callers_cancellation() -> None:
    from proxy.tasks import abandon_after

    async def answer() -> int:
        return 7

    assert await abandon_after(answer(), 1.0) == 7
    hang = Stubborn()
    caller = asyncio.ensure_future(abandon_after(hang(), 60.0))
    await hang.started.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    hang.release.set()


async def test_a_call_the_loop_ran_late_is_not_timed_out() -> None:
    """A store call is timed by the clock, but run by the event loop: a loop too busy to
    run it (a long synchronous step, a GC pause, a queue of ready callbacks) held back a
    reply Redis sent in time, and the call was timed out all the same: the rate limiter
    fell back to its local limiter, and the cache missed, under ordinary load on two cores
    with the default 50 ms. The time the loop lagged is not counted: a call has its time
    and a few turns of the loop. Here the clock's time is up before the loop ran the
    call at all (a timeout of 0)."""
    from proxy.tasks import abandon_after

    async def answered_in_two_turns() -> int:
        await asyncio.sleep(0)  # (sent)
        await asyncio.sleep(0)  # (its reply read)
        return 7

    assert await abandon_after(answered_in_two_turns(), 0.0) == 7
    hang = Stubborn()
    with pytest.raises(TimeoutError):  # one that does not answer still times out
        await abandon_after(hang(), 0.0)
    hang.release.set()


async def test_run_now_runs_a_coroutine_that_does_not_pause_at_once() -> None:
    from proxy.tasks import run_now

    seen: list[str] = []

    async def settles() -> int:
        seen.append("settled")
        return 1

    assert run_now(settles()) is None and seen == ["settled"]

    gate = asyncio.Event()

    async def pauses() -> None:
        seen.append("began")
        await gate.wait()
        seen.append("ended")

    rest = run_now(pauses())
    assert rest is not None and seen == ["settled", "began"]
    waiting = asyncio.ensure_future(rest)  # type: ignore[arg-type]
    gate.set()
    async with asyncio.timeout(10):
        await waiting
    assert seen == ["settled", "began", "ended"]
