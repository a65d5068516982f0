"""LocalEmbedder's scheduling over a fake runtime: batching, urgent lane, slices, cancel."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from proxy.embed_models import build_once
from proxy.embedding import BULK_PASS_CHARS, Embedder, InputTooLong, LocalEmbedder
from proxy.errors import Unavailable
from proxy.settings import EmbeddingSettings
from tests.fakes import FakeEmbedder


class Runtime:
    """Vector i has 1.0 at position hash(text) % dim; records each pass's texts. Every
    pass waits for `gate` (a threading.Event: the pass runs in the worker thread)."""

    dim = 16

    def __init__(self) -> None:
        self.passes: list[list[str]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def __call__(self, texts: list[str]) -> tuple[np.ndarray, list[int]]:
        self.passes.append(list(texts))
        self.entered.set()
        assert self.gate.wait(10)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            out[i, int(t.split()[-1]) % self.dim] = 1.0
        return out, [len(t.split()) for t in texts]


async def started(rt: Runtime, batch_max: int = 8) -> LocalEmbedder:
    emb = LocalEmbedder(EmbeddingSettings(batch_max=batch_max), runtime=lambda: rt)
    await emb.start()
    await emb.ready()
    return emb


async def wait_entered(rt: Runtime) -> None:
    await asyncio.to_thread(rt.entered.wait, 10)
    rt.entered.clear()


async def test_concurrent_small_calls_share_a_pass() -> None:
    rt = Runtime()
    emb = await started(rt)
    rt.gate.clear()
    first = asyncio.create_task(emb.embed(["q 0"]))
    await wait_entered(rt)  # the first pass runs; the others queue meanwhile
    rest = [asyncio.create_task(emb.embed([f"q {i}"])) for i in range(1, 6)]
    await asyncio.sleep(0)
    rt.gate.set()
    results = await asyncio.gather(first, *rest)
    assert rt.passes == [["q 0"], [f"q {i}" for i in range(1, 6)]]
    for i, (vecs, counts) in enumerate(results):
        assert vecs.shape == (1, 16) and vecs[0, i] == 1.0 and counts == [2]
    await emb.close()


async def test_a_large_call_is_sliced_and_a_lookup_overtakes_it() -> None:
    rt = Runtime()
    emb = await started(rt, batch_max=8)
    rt.gate.clear()
    big = asyncio.create_task(emb.embed([f"doc {i}" for i in range(40)]))
    await wait_entered(rt)  # slice 1 of 5 is running
    lookup = asyncio.create_task(emb.embed(["lookup 7"]))
    await asyncio.sleep(0)
    rt.gate.set()
    vecs, counts = await lookup
    assert vecs[0, 7] == 1.0 and counts == [2]
    # the lookup went into the second pass, ahead of the bulk call's remaining slices
    assert rt.passes[1][0] == "lookup 7" and len(rt.passes[1]) == 8
    assert all(len(p) <= 8 for p in rt.passes)
    big_vecs, big_counts = await big
    assert big_vecs.shape == (40, 16) and big_counts == [2] * 40
    assert [int(np.argmax(v)) for v in big_vecs] == [i % 16 for i in range(40)]
    await emb.close()


async def test_long_bulk_texts_make_short_passes_so_lookups_wait_little() -> None:
    """One tenant's large embeddings request of long documents must not hold every
    tenant's semantic lookups past their deadline: a pass takes bulk text up to
    BULK_PASS_CHARS (at least one text), not batch_max long documents."""
    rt = Runtime()
    emb = await started(rt, batch_max=8)
    rt.gate.clear()
    docs = ["x" * 1500 + f" doc {i}" for i in range(10)]
    big = asyncio.create_task(emb.embed(docs))
    await wait_entered(rt)
    lookup = asyncio.create_task(emb.embed(["lookup 3"]))
    await asyncio.sleep(0)
    rt.gate.set()
    await lookup
    await big
    assert rt.passes[0] == docs[:1]  # 1,506 characters: the next would pass the budget
    assert rt.passes[1] == ["lookup 3", docs[1]]
    assert all(sum(len(t) for t in p if " doc " in t) <= BULK_PASS_CHARS or len(p) == 1
               for p in rt.passes)
    huge = ["y" * 100_000 + " 1", "z" * 100_000 + " 2"]  # each one past the budget
    assert (await emb.embed(huge))[0].shape[0] == 2
    assert rt.passes[-2:] == [huge[:1], huge[1:]]
    short = [f"s {i}" for i in range(20)]  # short texts still fill a pass
    await emb.embed(short)
    assert rt.passes[-3:] == [short[:8], short[8:16], short[16:]]
    await emb.close()


async def test_a_cancelled_call_is_not_embedded_further() -> None:
    rt = Runtime()
    emb = await started(rt, batch_max=4)
    rt.gate.clear()
    big = asyncio.create_task(emb.embed([f"doc {i}" for i in range(40)]))
    await wait_entered(rt)
    big.cancel()
    rt.gate.set()
    with pytest.raises(asyncio.CancelledError):
        await big
    after = await emb.embed(["q 1"])
    assert after[0][0, 1] == 1.0
    assert rt.passes == [[f"doc {i}" for i in range(4)], ["q 1"]]
    await emb.close()


async def test_a_call_that_refuses_long_texts_stops_at_the_first_one() -> None:
    """/v1/embeddings refuses a request holding a text past the model's window: the
    refusal comes from the pass that finds it, the call's later texts not embedded (a
    2,048-text request with a long second text ran every pass, a minute of a core,
    before its 400)."""
    rt = Runtime()
    emb = await started(rt, batch_max=4)
    docs = [f"doc {i}" for i in range(40)]
    docs[5] = "a much longer doc 5"  # 5 words: past a limit of 2
    docs[9] = "another long doc 9"
    with pytest.raises(InputTooLong) as caught:
        await emb.embed(docs, refuse_over=2)
    assert (caught.value.index, caught.value.tokens) == (5, 5)
    assert rt.passes == [docs[:4], docs[4:8]]
    vecs, counts = await emb.embed(docs[:5], refuse_over=2)  # all within: embedded
    assert vecs.shape == (5, 16) and counts == [2] * 5
    _, counts = await emb.embed(docs[5:6])  # a lookup takes a long text's start
    assert counts == [5]
    await emb.close()


async def test_a_model_that_fails_to_load_fails_calls_instead_of_hanging() -> None:
    def broken() -> Runtime:
        raise OSError("model files missing")

    emb = LocalEmbedder(EmbeddingSettings(), runtime=broken)
    await emb.start()
    with pytest.raises(OSError):
        await emb.ready()
    with pytest.raises(Unavailable) as e:  # a 503 to callers, not their own 500
        await asyncio.wait_for(emb.embed(["q 1"]), 10)
    assert (e.value.status, e.value.code) == (503, "model_unavailable")
    await emb.close()


async def test_a_model_that_fails_to_load_logs_no_exception_message(logs: Any) -> None:
    """The line said the exception's message, which may quote a secret (a path, a hub
    URL with a token): it names the error's type and where it was raised, as every
    other unexpected error's line does."""
    secret = "hf_SECRET0123456789"

    def broken() -> Runtime:
        raise OSError(f"https://user:{secret}@hub.internal/model: no such file")

    emb = LocalEmbedder(EmbeddingSettings(), runtime=broken)
    await emb.start()
    with pytest.raises(Unavailable):  # (the worker logged its line before this)
        await asyncio.wait_for(emb.embed(["q 1"]), 10)
    await emb.close()
    lines = [json.loads(line) for line in logs.getvalue().splitlines() if line.strip()]
    failed = [line for line in lines if line["event"] == "embedding model failed to load"]
    assert len(failed) == 1 and failed[0]["error"] == "OSError", lines
    assert "test_embedding.py" in failed[0]["at"]
    assert secret not in logs.getvalue() and "hub.internal" not in logs.getvalue()


async def test_empty_input_and_the_protocol() -> None:
    emb = await started(Runtime())
    vecs, counts = await emb.embed([])
    assert vecs.shape == (0, 16) and counts == []
    fakes: list[Embedder] = [emb, FakeEmbedder()]  # both satisfy the protocol (mypy)
    assert all(f.dim > 0 for f in fakes)
    await emb.close()


async def test_two_large_calls_take_turns() -> None:
    rt = Runtime()
    emb = await started(rt, batch_max=4)
    rt.gate.clear()
    first = asyncio.create_task(emb.embed([f"a {i}" for i in range(12)]))
    await wait_entered(rt)
    second = asyncio.create_task(emb.embed([f"b {i}" for i in range(8)]))
    await asyncio.sleep(0)
    rt.gate.set()
    await asyncio.gather(first, second)
    heads = [p[0].split()[0] for p in rt.passes]
    assert heads == ["a", "a", "b", "a", "b"]  # not a, a, a, b, b: b takes turns with a
    await emb.close()


def test_derived_models_are_built_once_and_atomically(tmp_path: Path) -> None:
    builds: list[Path] = []

    def build(d: Path) -> None:
        builds.append(d)
        (d / "model.onnx").write_text("weights")

    def broken(d: Path) -> None:
        (d / "model.onnx").write_text("half")
        raise OSError("disk full")

    target = tmp_path / "embeddings" / "m-v1"
    with pytest.raises(OSError):
        build_once(target, broken)
    assert not target.exists() and list(target.parent.iterdir()) == []  # no half model
    assert build_once(target, build) == target and (target / "model.onnx").read_text() == "weights"
    assert builds[0] != target  # built elsewhere, then renamed into place
    assert build_once(target, broken) == target and len(builds) == 1  # reused, not rebuilt

    def lost_race(d: Path) -> None:  # another process renames its copy in first
        (d / "model.onnx").write_text("mine")
        other = tmp_path / "embeddings" / "m-v2"
        other.mkdir()
        (other / "model.onnx").write_text("theirs")
        (other / "READY").write_text("ok\n")

    other = tmp_path / "embeddings" / "m-v2"
    assert build_once(other, lost_race) == other
    assert (other / "model.onnx").read_text() == "theirs"
    assert sorted(p.name for p in other.parent.iterdir()) == ["m-v1", "m-v2"]


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="no per-thread priority here")
async def test_the_worker_thread_yields_the_cpu_to_serving() -> None:
    rt = Runtime()
    emb = LocalEmbedder(EmbeddingSettings(nice=7), runtime=lambda: rt)
    await emb.start()
    await emb.ready()
    await emb.embed(["q 1"])  # runs in the worker thread
    assert emb.thread_id is not None and emb.thread_id != threading.get_native_id()
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert os.getpriority(os.PRIO_PROCESS, emb.thread_id) == min(19, mine + 7)
    await emb.close()


def test_a_long_text_s_whole_count_leaves_the_gil_to_serving() -> None:
    """A text past the model's window is counted whole (its 400 says how many tokens it
    holds). `Tokenizer.encode` held the GIL throughout once the runtime's batch encoding
    had run: a 2 MB embeddings input stalled the event loop (every request) for seconds
    while the worker thread counted it. The count now leaves the GIL to other threads:
    the gaps this thread sees while it runs are a small part of it."""
    import time

    from tokenizers import Tokenizer

    from proxy.embed_models import _whole_counter, minilm_dir

    path = minilm_dir()
    Tokenizer.from_file(str(path / "tokenizer.json")).encode_batch(["warm"])  # as a pass
    count = _whole_counter(path)
    text = "x " * 400_000
    done = threading.Event()
    result: list[int] = []

    def work() -> None:
        result.append(count(text))
        done.set()

    worker = threading.Thread(target=work)
    started = last = time.perf_counter()
    worst = 0.0
    worker.start()
    while not done.is_set():
        time.sleep(0.002)
        now = time.perf_counter()
        worst, last = max(worst, now - last), now
    worker.join(10)
    assert result == [400_002]  # (with its [CLS] and [SEP])
    assert worst < (last - started) / 2


class CountingRuntime(Runtime):
    """Also counts texts alone (`count`, as the built-in runtimes do), recording them."""

    def __init__(self) -> None:
        super().__init__()
        self.counted: list[list[str]] = []

    def count(self, texts: list[str]) -> list[int]:
        self.counted.append(list(texts))
        return [len(t.split()) for t in texts]


async def test_a_long_text_past_the_window_is_refused_without_a_pass() -> None:
    """A 2 MB text past the window took a pass of the one worker (~5 s: tokenized cut,
    then counted whole) before its 400, while every tenant's semantic lookups waited for
    it. A text long enough to be past the window is counted first, in a thread of its
    own: refused there, it never queues, and a pass under way does not hold its 400."""
    rt = CountingRuntime()
    emb = await started(rt)
    rt.gate.clear()
    busy = asyncio.create_task(emb.embed(["q 0"]))
    await wait_entered(rt)  # a pass runs (and waits on the gate)
    long = "w " * 5_000
    async with asyncio.timeout(10):
        with pytest.raises(InputTooLong) as caught:
            await emb.embed(["q 1", long, "v " * 6_000], refuse_over=256)
    assert (caught.value.index, caught.value.tokens) == (1, 5_000)
    assert rt.counted == [[long]] and rt.passes == [["q 0"]]  # (none after the first)
    rt.gate.set()
    await busy
    _, counts = await emb.embed(["q 1", "w " * 2_000 + "3"], refuse_over=4_000)
    assert counts == [2, 2_001]  # (within: embedded, the pass's counts)
    assert ["w " * 2_000 + "3"] in rt.passes
    await emb.close()


def test_a_priority_not_lowered_logs_no_exception_message(
        monkeypatch: pytest.MonkeyPatch, logs: Any) -> None:
    """`setpriority` refused: the warning said the OSError's message (which may name a
    path or more); it names the error's type."""
    from proxy import embedding

    secret = "/home/alice/sk-proj-SECRET-0123456789"

    def refuse(*args: Any) -> None:
        raise PermissionError(1, "Operation not permitted", secret)

    monkeypatch.setattr(embedding.os, "setpriority", refuse)
    embedding._lower_priority(5)
    said = [json.loads(x) for x in logs.getvalue().splitlines()
            if "embedding thread's priority" in x]
    assert len(said) == 1 and said[0]["error"] == "PermissionError"
    assert secret not in logs.getvalue()
