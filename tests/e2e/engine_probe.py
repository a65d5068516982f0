"""Drives the real vLLM engine through Weir's engine layer and prints what it saw, as
JSON (run as a script by `test_engine_refusals.py`: the engine's processes and sockets
then live and die with this process, not with the test session)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from types import SimpleNamespace
from typing import Any

from proxy.engine.base import SamplingOptions
from proxy.engine.vllm import VllmEngine, _counted, _generated
from proxy.settings import VllmEngineSettings

BAD_SEEDS = [2**64, -(2**63) - 1, 2**64, 10**30]


async def drain(it: AsyncIterator[Any]) -> str | None:
    """None if the generation finished, else the error's type and message."""
    try:
        async for _ in it:
            pass
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return None


def _state(tokens: int, parent: Any = None) -> Any:
    detok = SimpleNamespace(num_output_tokens=lambda: tokens)
    return SimpleNamespace(detokenizer=detok, parent_req=parent)


def generated_parts() -> dict[str, int]:
    """`_generated` on stand-ins of vLLM's state: two choices running, two that ended
    (their outputs on the parent), and one whose state is gone."""
    done = SimpleNamespace(token_ids=[1] * 200)
    parent = SimpleNamespace(output_aggregator=[done, None, done, None])
    proc = SimpleNamespace(
        external_req_ids={"r": ["r-a", "r-b", "r-gone"]},
        request_states={"r-a": _state(30, parent), "r-b": _state(12, parent)})
    llm: Any = SimpleNamespace(output_processor=proc)
    return {"both": _generated(llm, "r"), "unknown": _generated(llm, "other"),
            "elsewhere": _generated(SimpleNamespace(), "r")}  # type: ignore[arg-type]


async def cut_at_the_end() -> int:
    """A cut that reaches the caller once the final output's task is done (the output in
    hand, not yet handed over): the step-by-step order asyncio runs ready callbacks in."""
    final = SimpleNamespace(finished=True, outputs=[SimpleNamespace(token_ids=[1] * 7),
                                                    SimpleNamespace(token_ids=[2] * 5)])
    release = asyncio.Event()

    async def vllm_outputs() -> Any:
        await release.wait()
        yield final

    options = SamplingOptions(max_tokens=10, final_only=True)
    empty: Any = SimpleNamespace(output_processor=SimpleNamespace(
        external_req_ids={}, request_states={}))
    consumer = asyncio.ensure_future(anext(_counted(empty, vllm_outputs(), "r", options)))
    await asyncio.sleep(0)  # the consumer has made the step's task
    release.set()
    await asyncio.sleep(0)  # the step ran and finished; the consumer is not resumed yet
    consumer.cancel()
    await asyncio.gather(consumer, return_exceptions=True)
    return options.generated


async def probe() -> dict[str, Any]:
    engine = VllmEngine(VllmEngineSettings(
        model="builtin:demo", dtype="float32", max_model_len=256, max_num_seqs=8,
        cpu_kvcache_space_gib=1, warmup=False))
    await engine.start()
    seen: dict[str, Any] = {"bad_seed": [], "generated_parts": generated_parts(),
                            "cut_at_the_end": await cut_at_the_end()}
    try:
        prompt = engine.render_chat([{"role": "user", "content": "hello"}], None)
        for i, seed in enumerate(BAD_SEEDS):
            err = await drain(engine.generate(
                prompt, SamplingOptions(max_tokens=4, seed=seed), f"bad-seed-{i}"))
            seen["bad_seed"].append({"error": err, "running": engine.stats().running})
        err = await drain(engine.generate(
            prompt, SamplingOptions(max_tokens=4, json_schema={"type": "nonsense"}),
            "bad-schema"))
        seen["bad_schema"] = {"error": err, "running": engine.stats().running}
        async with aclosing(engine.generate(
                prompt, SamplingOptions(max_tokens=200, ignore_eos=True), "closed")) as it:
            async for _ in it:
                break
        seen["closed_early_running"] = engine.stats().running
        # A whole answer (final output only) cut while it runs: nothing reached the
        # caller, and the engine says what it had generated (both choices). A streamed
        # request beside it paces the cut: ten of its steps ran with the other in them.
        whole = SamplingOptions(max_tokens=200, ignore_eos=True, n=2, final_only=True)
        cut = asyncio.ensure_future(drain(engine.generate(prompt, whole, "cut-whole")))
        async with aclosing(engine.generate(
                prompt, SamplingOptions(max_tokens=200, ignore_eos=True), "pacer")) as it:
            steps = 0
            async for _ in it:
                steps += 1
                if steps == 10:
                    break
        progress = engine.generated_tokens("cut-whole")  # (what the breaker asks)
        cut.cancel()
        await asyncio.gather(cut, return_exceptions=True)
        seen["cut_whole"] = {"generated": whole.generated, "running": engine.stats().running,
                             "progress_while_running": progress,
                             "progress_after": engine.generated_tokens("cut-whole")}
        outs = [o async for o in engine.generate(prompt, SamplingOptions(max_tokens=4),
                                                 "fine")]
        seen["fine"] = {"finished": outs[-1].finished, "running": engine.stats().running}
    finally:
        await engine.close()
    return seen


if __name__ == "__main__":
    print("PROBE " + json.dumps(asyncio.run(probe())), flush=True)
