"""The in-process engine's answer digest (`VllmEngine.answer_digest`, which cache keys
hold) moves with every setting that shapes an answer to the same request, and with none
that only changes how fast answers come: an operator's change of tool parser (or compact
JSON, ...) while Redis still held a day of entries replayed answers made under the old
one."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from proxy.settings import VllmEngineSettings

with warnings.catch_warnings():  # torch's own import-time deprecations
    warnings.simplefilter("ignore", DeprecationWarning)
    from proxy.engine.vllm import VllmEngine


def digest(renders: str = "r", max_model_len: int = 2048,
           defaults: dict[str, Any] | None = None, **settings: Any) -> str:
    """What a started engine of `settings` takes as its digest (not started here: the
    template's digest, context length and defaults are what a start reads)."""
    engine = VllmEngine(VllmEngineSettings.model_validate(settings))
    return engine.digest_of(renders, max_model_len, defaults or {})


@pytest.mark.parametrize("changed", [
    {"tool_parser": "hermes"}, {"structured_output_compact": False},
    {"tokenizer": "HuggingFaceTB/SmolLM2-135M-Instruct"}, {"model": "builtin:smollm2"},
    {"dtype": "float16"}, {"quantization": "fp8"}, {"kv_cache_dtype": "fp8"},
    {"extra_args": {"reasoning_parser": "deepseek_r1"}},
])
def test_each_answer_shaping_setting_moves_the_digest(changed: dict[str, Any]) -> None:
    assert digest(**changed) != digest()


def test_what_a_start_reads_moves_it_too() -> None:
    """The chat template (and how Weir renders a chat), the context length an answer
    with no `max_tokens` stops at, the model's generation-config defaults."""
    assert len({digest(), digest(renders="other"), digest(max_model_len=4096),
                digest(defaults={"temperature": 0.6})}) == 4


def test_the_weights_loaded_move_it() -> None:
    """What `dtype: auto` resolved to and the checkpoint's fingerprint (a checkpoint
    replaced under the same path kept the old one's digest: its answers were replayed
    for a day)."""
    engine = VllmEngine(VllmEngineSettings.model_validate({}))

    def loaded(**kw: str) -> str:
        return engine.digest_of("r", 2048, {}, {"dtype": "torch.bfloat16", "weights": "a", **kw})
    assert len({loaded(), loaded(dtype="torch.float16"), loaded(weights="b"), digest()}) == 4
    assert loaded() == loaded()


def test_what_only_changes_speed_does_not() -> None:
    """One config, one digest (every replica's the same: they share Redis's entries);
    batch size, memory, prefix caching, warm-up and the admin faults are no part."""
    assert digest() == digest() == digest(
        max_num_seqs=8, gpu_memory_utilization=0.5, enable_prefix_caching=False,
        cpu_kvcache_space_gib=2.0, warmup=False, faults=True, owned_by="me",
        served_model_name="other")
