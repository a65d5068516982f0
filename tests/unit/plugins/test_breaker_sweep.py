"""The breaker's sweep (`BreakerPlugin._sweep`), run by every new request over every
call under way, passes over the calls too young to be late without testing each in
full, and finds exactly the late calls that the full test finds."""

from __future__ import annotations

import random
import time
from typing import Any

import pytest

from plugins.breaker.plugin import BreakerPlugin, _made_none
from proxy.context import RequestContext
from tests.unit.plugins.test_breaker import ctx, plugin


def _late_in_full(p: BreakerPlugin, now: float) -> set[int]:
    """The late calls as the sweep found them before its fast path: each call tested in
    full."""
    return {k for k, c in p._running.items() if c.engine_ttft_s is None
            and c.engine_started is not None
            and ((now - c.engine_started > p.cfg.slow_call_s
                  and (c.engine_live or _made_none(c)))
                 or p._whole_slow(c, now))}


def _call(rng: random.Random, now: float) -> RequestContext:
    c = ctx(stream=rng.random() < 0.5)
    c.engine_started = (None if rng.random() < 0.1
                        else now - rng.choice((0.0, 0.5, 2.0, 4.0, 6.0, 9.0, 11.0, 40.0)))
    c.engine_ttft_s = 0.01 if rng.random() < 0.3 else None
    c.engine_timed = rng.random() < 0.5
    c.engine_live = rng.random() < 0.5
    made = rng.choice((None, 0, 3))
    c.engine_progress = None if made is None else (lambda made=made: made)
    return c


@pytest.mark.parametrize("cfg", [{"slow_call_s": 10}, {"slow_call_s": 10, "whole_call_s": 5},
                                 {"slow_call_s": 3, "whole_call_s": 30}])
def test_the_sweep_finds_the_late_calls_the_full_test_finds(cfg: dict[str, Any]) -> None:
    rng = random.Random(12)
    for _ in range(200):
        p = plugin(**cfg)
        now = time.monotonic()
        for i in range(rng.randrange(1, 12)):
            p._running[i] = _call(rng, now)
        # (the test reads a clock a little before the sweep's: a call it finds late is late
        # for the sweep too; no age is within a second of a limit)
        expected = _late_in_full(p, now)
        told: set[int] = set()

        def record(permit: int, *, failed: bool, slow: bool = False,
                   told: set[int] = told) -> None:
            told.add(permit)

        p._record = record  # type: ignore[method-assign, assignment]
        p._sweep()
        assert told == expected


def test_young_calls_are_passed_over_without_the_full_test(
        monkeypatch: pytest.MonkeyPatch) -> None:
    p = plugin(slow_call_s=30, whole_call_s=60)
    now = time.monotonic()
    for i in range(64):  # streams awaiting their first token, well within both limits
        c = ctx(stream=True)
        c.engine_started, c.engine_timed = now, True
        p._running[i] = c
    tested: list[RequestContext] = []

    def whole_slow(c: RequestContext, now: float) -> bool:
        tested.append(c)
        return False

    monkeypatch.setattr(p, "_whole_slow", whole_slow)
    p._sweep()
    assert tested == []
    assert len(p._running) == 64
