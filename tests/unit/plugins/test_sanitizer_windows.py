"""Sanitizer: the windows read around a text's escapes and around a detector's places
(`credentials._reaches`, shared by `_escape_windows` and `windows_around`) are the ones
the two loops it replaced merged: each place widened by the reach, overlapping ones
merged, None past the most windows."""

from __future__ import annotations

import random

import pytest

from plugins.sanitizer import credentials
from plugins.sanitizer.credentials import _WINDOW_REACH, _WINDOWS_MOST


def _merged_as_before(places: list[tuple[int, int]]) -> list[tuple[int, int]] | None:
    out: list[list[int]] = []
    for lo, hi in ((a - _WINDOW_REACH, b + _WINDOW_REACH) for a, b in places):
        if not out or lo > out[-1][1]:
            out.append([lo, hi])  # (a new window)
        else:
            out[-1][1] = hi
    return None if len(out) > _WINDOWS_MOST else [(lo, hi) for lo, hi in out]


@pytest.mark.parametrize("seed", range(20))
def test_reaches_merge_as_the_two_loops_did(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(200):
        starts = sorted(rng.randrange(0, 80_000) for _ in range(rng.randrange(0, 40)))
        places = [(s, s + rng.choice((1, 1, 3, 6))) for s in starts]
        assert credentials._reaches(places) == _merged_as_before(places)
