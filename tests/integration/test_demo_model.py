"""`weir make-demo-model` writes a loadable checkpoint with a chat template."""

from __future__ import annotations

import json
from pathlib import Path

from transformers import AutoTokenizer

from proxy.cli import main
from proxy.engine.demo_model import ensure_demo_model


def test_make_demo_model(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    assert main(["make-demo-model", str(out)]) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["head_dim"] == 64  # vLLM's CPU attention rejects 16
    assert cfg["num_hidden_layers"] == 2 and cfg["vocab_size"] <= 2048
    assert (out / "model.safetensors").stat().st_size < 5_000_000
    tok = AutoTokenizer.from_pretrained(out)
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text.endswith("<|assistant|>\n")
    ids = tok.encode("reset my password", add_special_tokens=False)
    assert tok.decode(ids) == "reset my password"


def test_ensure_demo_model_is_cached(tmp_path: Path) -> None:
    first = ensure_demo_model(tmp_path)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert ensure_demo_model(tmp_path) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
