"""`weir make-demo-model` writes loadable checkpoints with a chat template: the generated
demo model, and SmolLM2 converted from its GGUF; builds are atomic and built once."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from proxy.cli import main
from proxy.engine import smollm2
from proxy.engine.demo_model import ensure_demo_model
from proxy.engine.model_cache import ensure_built, publish


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


# ------------------------------------------------------------------ builds and the cache

def test_concurrent_first_starts_build_once(tmp_path: Path) -> None:
    """The second starter checks, finds no model (the first is mid-build), waits on the
    build lock, then finds the first one's result valid and reuses it."""
    target = tmp_path / "models" / "m"
    builds: list[Path] = []
    building, release = threading.Event(), threading.Event()
    b_checks = [threading.Event(), threading.Event()]

    def build(out: Path) -> None:
        builds.append(out)
        building.set()
        assert release.wait(30)
        (out / "weights").write_text("w")

    def valid(folder: Path) -> bool:
        ok = (folder / "weights").exists()
        if threading.current_thread().name == "b":
            next(e for e in b_checks if not e.is_set()).set()
        return ok

    results: dict[str, Path] = {}

    def start(name: str) -> None:
        results[name] = ensure_built(target, valid, build)

    a = threading.Thread(target=start, args=("a",), name="a")
    b = threading.Thread(target=start, args=("b",), name="b")
    a.start()
    assert building.wait(30)
    b.start()
    assert b_checks[0].wait(30)  # b saw no model while a was still building ...
    # ... and does not look again (nor build) until a is done: it waits on the lock.
    # (A negative check, so bounded; it cannot fail spuriously when the lock works.)
    assert not b_checks[1].wait(0.5)
    release.set()
    a.join(30)
    b.join(30)
    assert results == {"a": target, "b": target}
    assert b_checks[1].is_set() and len(builds) == 1
    assert [p.name for p in target.parent.iterdir() if not p.name.endswith(".lock")] == ["m"]


def test_failed_build_leaves_nothing_behind(tmp_path: Path) -> None:
    target = tmp_path / "m"

    def build(out: Path) -> None:
        (out / "half").write_text("x")
        raise RuntimeError("conversion broke")

    with pytest.raises(RuntimeError, match="conversion broke"):
        publish(target, build)
    assert list(tmp_path.iterdir()) == []


def test_an_invalid_copy_is_replaced(tmp_path: Path) -> None:
    target = tmp_path / "m"
    target.mkdir()
    (target / "stale").write_text("half-written by a crashed start")
    out = ensure_built(target, lambda d: (d / "ok").exists(),
                       lambda d: (d / "ok").write_text("ok"))
    assert out == target and sorted(p.name for p in target.iterdir()) == ["ok"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".m.lock", "m"]


# ------------------------------------------------------------------- builtin:smollm2

@pytest.fixture(scope="module")
def smollm2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real conversion (~20-30 s: dequantize, save, a one-prompt sanity check)."""
    out = tmp_path_factory.mktemp("smollm2") / "smollm2"
    assert main(["make-demo-model", "--model", "smollm2", str(out)]) == 0
    return out


def test_smollm2_is_an_ordinary_llama_checkpoint(smollm2_dir: Path) -> None:
    cfg = json.loads((smollm2_dir / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]) == (576, 30, 49152)
    assert cfg["tie_word_embeddings"] is True
    assert 250_000_000 < (smollm2_dir / "model.safetensors").stat().st_size < 300_000_000
    manifest = json.loads((smollm2_dir / smollm2.MANIFEST).read_text())
    assert manifest["weights_sha256"] == smollm2.WEIGHTS_SHA256
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == cfg["eos_token_id"]


def test_smollm2_checksums_catch_a_damaged_copy(smollm2_dir: Path, tmp_path: Path) -> None:
    assert smollm2.is_valid(smollm2_dir)
    copy = tmp_path / "copy"
    shutil.copytree(smollm2_dir, copy)
    with open(copy / "tokenizer.json", "r+b") as fh:
        fh.seek(100)
        fh.write(b"#")
    assert not smollm2.is_valid(copy)
    (copy / "tokenizer.json").unlink()
    assert not smollm2.is_valid(copy)


def test_ensure_smollm2_reuses_a_valid_copy(smollm2_dir: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    target = smollm2.smollm2_dir(tmp_path)
    target.parent.mkdir(parents=True)
    shutil.copytree(smollm2_dir, target)

    def no_build(out: Path) -> None:
        raise AssertionError("a valid copy must be reused, not rebuilt")

    monkeypatch.setattr(smollm2, "build_smollm2", no_build)
    assert smollm2.ensure_smollm2(tmp_path) == target
