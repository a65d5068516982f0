"""The bench's instant engine (`bench.mock_engine`): with `step`, one token per turn of
the event loop, so concurrent answers interleave as a real engine's do; without, each
answer is handed whole before another runs."""

from __future__ import annotations

import asyncio

import pytest

from bench.mock_engine import InstantEngine
from proxy.engine.base import SamplingOptions


async def _order(engine: InstantEngine) -> list[str]:
    seen: list[str] = []

    async def read(name: str) -> None:
        async for out in engine.generate([1, 2], SamplingOptions(max_tokens=3), name):
            seen.append(name)
            assert out.choices[0].token_ids

    await asyncio.gather(read("a"), read("b"))
    return seen


@pytest.mark.parametrize(("step", "order"), [(False, list("aaabbb")), (True, list("ababab"))])
async def test_step_hands_one_token_per_loop_turn(step: bool, order: list[str]) -> None:
    assert await _order(InstantEngine("mock", 3, step=step)) == order


async def test_step_answers_as_the_instant_engine_does() -> None:
    async def answer(engine: InstantEngine) -> list[tuple[str | None, list[int], bool]]:
        return [(out.choices[0].finish_reason, out.choices[0].token_ids, out.finished)
                async for out in engine.generate([1], SamplingOptions(max_tokens=2), "r")]

    assert (await answer(InstantEngine("mock", 4, step=True))
            == await answer(InstantEngine("mock", 4)))
