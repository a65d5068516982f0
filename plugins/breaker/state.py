"""The breaker's state machine, pure and clock-injected (tests drive time by hand).

closed    -> open       when, over the sliding window, at least `minimum_calls` outcomes
                        were seen and the failure rate or the slow-call rate passes its
                        threshold
open      -> half_open  after `open_s`
half_open -> closed     after `half_open_calls` trial calls all succeeded
half_open -> open       on any failed trial, or when a trial gives no sign of life for
                        `half_open_max_wait_s`: no first token, or no new token since its
                        last where the engine tells its progress (a stuck trial cannot
                        wedge the breaker; one answering at length is not stuck)

Only engine outcomes are recorded; local rejections never reach `record`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

State = Literal["closed", "open", "half_open"]

#: What a caller refused while half-open trials are under way is told to wait.
HALF_OPEN_RETRY_S = 1.0


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    window_s: float = 30.0
    minimum_calls: int = 10
    failure_rate: float = 0.5
    slow_call_s: float = 10.0
    slow_call_rate: float = 0.8
    open_s: float = 15.0
    half_open_calls: int = 2
    half_open_max_wait_s: float = 30.0


@dataclass(slots=True)
class Verdict:
    """One call's outcome in the window; `held` while the window holds it."""
    at: float
    failed: bool
    slow: bool
    held: bool = True


class Breaker:
    def __init__(self, policy: BreakerPolicy, clock: Callable[[], float],
                 on_change: Callable[[State, State], None] | None = None) -> None:
        self.p = policy
        self.clock = clock
        self.on_change = on_change
        self.state: State = "closed"
        self._outcomes: deque[Verdict] = deque()
        # Running counts over the window: each record is O(1), not a scan of the window.
        self._failures = 0
        self._slows = 0
        self._opened_at = 0.0
        self._trials: dict[int, float] = {}  # permit id -> started
        self._trial_ok = 0
        self._next_id = 0

    # ------------------------------------------------------------------ permits

    def allow(self) -> int | None:
        """A permit id when a call may go to the engine, else None (the breaker is open)."""
        now = self.clock()
        self._tick(now)
        if self.state == "closed":
            return self._permit(None)
        if self.state == "open":
            return None
        # half-open: a bounded number of trial calls at a time
        if len(self._trials) + self._trial_ok >= self.p.half_open_calls:
            return None
        return self._permit(now)

    def _permit(self, trial_started: float | None) -> int:
        self._next_id += 1
        if trial_started is not None:
            self._trials[self._next_id] = trial_started
        return self._next_id

    def record(self, permit: int, *, failed: bool, slow: bool = False) -> Verdict | None:
        """The call's outcome; returns it where it joined the window (so a call told slow
        while in flight can be told `failed` later, `failed_after`)."""
        now = self.clock()
        if permit in self._trials:
            del self._trials[permit]
            if failed or slow:
                self._open(now)
            else:
                self._trial_ok += 1
                if self._trial_ok >= self.p.half_open_calls:
                    self._set("closed")
                    self._clear()
            return None
        if self.state != "closed":
            return None  # a call admitted before the breaker opened
        outcome = Verdict(now, failed, slow)
        self._outcomes.append(outcome)
        self._failures += failed
        self._slows += slow
        self._trim(now)
        self._judge(now)
        return outcome

    def failed_after(self, outcome: Verdict) -> None:
        """A call told slow while in flight (`record`'s outcome) ended in a failure: it
        counts as one in the window too, so an engine that hangs on part of its calls
        opens the breaker by its failure rate, as it did when its hung calls counted only
        at their end (a timeout); not when the window no longer holds it."""
        now = self.clock()
        self._trim(now)
        if self.state != "closed" or outcome.failed or not outcome.held:
            return
        outcome.failed = True
        self._failures += 1
        self._judge(now)

    def _judge(self, now: float) -> None:
        n = len(self._outcomes)
        if n >= self.p.minimum_calls:
            if (self._failures / n >= self.p.failure_rate
                    or self._slows / n >= self.p.slow_call_rate):
                self._open(now)

    def answering(self, permit: int, progress: bool = False) -> None:
        """A sign of life from a trial whose answer has begun: `progress`, the engine
        made tokens since the last (its silence is counted from now); else, where its
        progress cannot be told, its first token (not stuck however long the answer
        runs: its end tells its outcome, and an upstream's stream its own stall
        timeout ends). A healthy trial streaming a long answer reopened the breaker once
        it had run `half_open_max_wait_s`; one that stops making tokens is stuck again
        after that long."""
        if permit in self._trials:
            self._trials[permit] = self.clock() if progress else math.inf

    def retry_in(self) -> float:
        """Seconds a refused caller should wait before asking again: while open, the time
        left until it half-opens; while half-open with its trial slots full, a short wait
        (the trials under way decide it soon, closed or open again). 0 when closed."""
        now = self.clock()
        self._tick(now)
        if self.state == "open":
            return max(0.0, self._opened_at + self.p.open_s - now)
        if self.state == "half_open":
            return HALF_OPEN_RETRY_S
        return 0.0

    def release(self, permit: int) -> None:
        """The call ended without an engine outcome (client abort, local rejection)."""
        self._trials.pop(permit, None)

    # -------------------------------------------------------------------- state

    def _tick(self, now: float) -> None:
        if self.state == "open" and now - self._opened_at >= self.p.open_s:
            self._set("half_open")
            self._trials.clear()
            self._trial_ok = 0
        elif self.state == "half_open":
            stuck = [k for k, t in self._trials.items() if now - t >= self.p.half_open_max_wait_s]
            if stuck:
                self._open(now)

    def _trim(self, now: float) -> None:
        while self._outcomes and now - self._outcomes[0].at > self.p.window_s:
            gone = self._outcomes.popleft()
            gone.held = False
            self._failures -= gone.failed
            self._slows -= gone.slow

    def _clear(self) -> None:
        for gone in self._outcomes:
            gone.held = False
        self._outcomes.clear()
        self._failures = self._slows = 0

    def _open(self, now: float) -> None:
        self._opened_at = now
        self._trials.clear()
        self._trial_ok = 0
        self._clear()
        self._set("open")

    def _set(self, state: State) -> None:
        if state != self.state:
            old, self.state = self.state, state
            if self.on_change is not None:
                self.on_change(old, state)

    def snapshot(self) -> dict[str, object]:
        now = self.clock()
        self._tick(now)
        self._trim(now)  # outcomes past the window are not in it (they were shown)
        return {"state": self.state, "window_calls": len(self._outcomes),
                "trials_in_flight": len(self._trials)}

    @property
    def trials_in_flight(self) -> int:
        return len(self._trials)
