"""The real vLLM engine, driven through Weir's engine layer (below the parser, so values
the parser now refuses can still be sent): a request the engine refuses is always
released. A seed of 2**64 passes vLLM's own checks, is registered, and then fails in the
transport to the engine process; it used to stay counted as running for good."""

from __future__ import annotations

import gc
import warnings
from collections.abc import AsyncIterator
from contextlib import aclosing

import pytest

from proxy.engine.base import EngineFailed, EngineRejected, SamplingOptions
from proxy.settings import VllmEngineSettings

with warnings.catch_warnings():  # torch's own import-time deprecations
    warnings.simplefilter("ignore", DeprecationWarning)
    from proxy.engine.vllm import VllmEngine


async def drain(it: AsyncIterator[object]) -> None:
    async for _ in it:
        pass


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_refused_requests_are_released() -> None:
    engine = VllmEngine(VllmEngineSettings(
        model="builtin:demo", dtype="float32", max_model_len=256, max_num_seqs=8,
        cpu_kvcache_space_gib=1, warmup=False))
    await engine.start()
    try:
        prompt = engine.render_chat([{"role": "user", "content": "hello"}], None)
        for i, seed in enumerate([2**64, -(2**63) - 1, 2**64, 10**30]):
            with pytest.raises((EngineFailed, EngineRejected)):
                await drain(engine.generate(prompt, SamplingOptions(max_tokens=4, seed=seed),
                                            f"bad-seed-{i}"))
            assert engine.stats().running == 0, f"request {i} left running"

        # A json_schema the grammar compiler refuses: a 400 without its source paths.
        with pytest.raises(EngineRejected) as rejected:
            await drain(engine.generate(
                prompt, SamplingOptions(max_tokens=4, json_schema={"type": "nonsense"}),
                "bad-schema"))
        assert ".cc" not in str(rejected.value) and "/project" not in str(rejected.value)
        assert rejected.value.param == "response_format"
        assert engine.stats().running == 0

        # Closing a generation half-way releases it at once.
        async with aclosing(engine.generate(
                prompt, SamplingOptions(max_tokens=200, ignore_eos=True), "closed")) as it:
            async for _ in it:
                break
        assert engine.stats().running == 0

        # The engine still serves.
        outs = [o async for o in engine.generate(prompt, SamplingOptions(max_tokens=4),
                                                 "fine")]
        assert outs[-1].finished and engine.stats().running == 0
    finally:
        await engine.close()
        gc.collect()  # the engine client's sockets are finalized here, not at exit
