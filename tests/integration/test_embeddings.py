"""/v1/embeddings with the real offline MiniLM model (the default runtime), and the
embedder's batching and slicing."""

from __future__ import annotations

import asyncio
import base64

import numpy as np
import pytest

from proxy.app_state import STATE
from tests.conftest import MakeClient
from tests.openai_spec import validate
from tests.waiting import eventually

MODEL = "all-MiniLM-L6-v2"


@pytest.fixture
async def client(make_client: MakeClient):  # type: ignore[no-untyped-def]
    c = await make_client(embeddings={"enabled": True})
    await c.app[STATE].embedder.ready()  # type: ignore[union-attr]
    return c


async def test_embeddings_shape_and_meaning(client) -> None:  # type: ignore[no-untyped-def]
    r = await client.post("/v1/embeddings", json={"model": MODEL, "input": [
        "How do I reset my password?", "I forgot my password, how can I change it?",
        "What is the capital of France?"]})
    assert r.status == 200
    body = await r.json()
    validate("CreateEmbeddingResponse", body)
    vecs = np.array([d["embedding"] for d in body["data"]])
    assert vecs.shape == (3, 384)
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-4)
    assert vecs[0] @ vecs[1] > 0.6 > vecs[0] @ vecs[2]
    assert body["usage"]["prompt_tokens"] > 0


async def test_base64_matches_float(client) -> None:  # type: ignore[no-untyped-def]
    f = await (await client.post("/v1/embeddings", json={"model": MODEL, "input": "x"})).json()
    b = await (await client.post("/v1/embeddings", json={
        "model": MODEL, "input": "x", "encoding_format": "base64"})).json()
    decoded = np.frombuffer(base64.b64decode(b["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(decoded, f["data"][0]["embedding"], atol=1e-6)


async def test_the_embedding_model_is_listed(client) -> None:  # type: ignore[no-untyped-def]
    body = await (await client.get("/v1/models")).json()
    validate("ListModelsResponse", body)
    assert [m["id"] for m in body["data"]] == ["fake-model", MODEL]
    one = await client.get(f"/v1/models/{MODEL}")
    assert one.status == 200 and (await one.json())["id"] == MODEL


async def test_errors(client) -> None:  # type: ignore[no-untyped-def]
    r = await client.post("/v1/embeddings", json={"model": "nope", "input": "x"})
    assert r.status == 404
    r = await client.post("/v1/embeddings", json={"model": MODEL, "input": []})
    assert r.status == 400 and (await r.json())["error"]["param"] == "input"
    r = await client.post("/v1/embeddings", json={"model": MODEL, "input": "x",
                                                  "dimensions": 12})
    assert r.status == 400 and (await r.json())["error"]["param"] == "dimensions"


async def test_a_model_asked_of_the_route_it_does_not_serve_is_told_so(
        make_client: MakeClient) -> None:
    """The chat model asked for embeddings, or the embedding model (listed by
    `/v1/models`) asked for a chat, was told it "does not exist": it is a 404 naming
    `model` that says what the model serves, as OpenAI answers a model asked of an
    endpoint it does not serve ("This is not a chat model and thus not supported in the
    v1/chat/completions endpoint": 404 `invalid_request_error`, `param: model`), its
    code `model_not_supported`. A key that may not use the model is still refused it
    (403), and a name nothing serves is still a 404 `model_not_found`."""
    keys = {"mode": "keys", "keys": [{"key": "sk-all", "tenant": "a"},
                                     {"key": "sk-emb", "tenant": "b", "models": [MODEL]}]}
    client = await make_client(embeddings={"enabled": True}, auth=keys)
    await client.app[STATE].embedder.ready()  # type: ignore[union-attr]
    every, emb_only = ({"Authorization": f"Bearer {k}"} for k in ("sk-all", "sk-emb"))
    r = await client.post("/v1/embeddings", json={"model": "fake-model", "input": "x"},
                          headers=every)
    assert r.status == 404, await r.text()
    body = await r.json()
    validate("ErrorResponse", body)
    error = body["error"]
    assert (error["type"], error["param"], error["code"]) == (
        "invalid_request_error", "model", "model_not_supported")
    assert "does not serve embeddings" in error["message"] and MODEL in error["message"]
    r = await client.post("/v1/embeddings", json={"model": "fake-model", "input": "x"},
                          headers=emb_only)
    assert r.status == 403
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    for path, req in (("/v1/chat/completions", chat),
                      ("/v1/completions", {"model": MODEL, "prompt": "hi"}),
                      ("/v1/responses", {"model": MODEL, "input": "hi"})):
        r = await client.post(path, json=req, headers=emb_only)
        assert r.status == 404, (path, await r.text())
        error = (await r.json())["error"]
        assert (error["type"], error["param"], error["code"]) == (
            "invalid_request_error", "model", "model_not_supported"), path
        assert "embedding model" in error["message"]
    r = await client.post("/v1/embeddings", json={"model": "nope", "input": "x"},
                          headers=every)
    assert r.status == 404 and (await r.json())["error"]["code"] == "model_not_found"
    r = await client.post("/v1/chat/completions", json={**chat, "model": "nope"},
                          headers=every)
    assert r.status == 404 and (await r.json())["error"]["code"] == "model_not_found"


async def test_an_input_longer_than_the_model_reads_is_a_400(  # type: ignore[no-untyped-def]
        client) -> None:
    """The model reads 256 tokens: a longer text's vector would stand for its start
    only. OpenAI and vLLM refuse it; so does Weir, naming the input. One that fits
    exactly is embedded, and its count is its whole length."""
    long = "hello world " * 200  # 400 tokens and the two markers
    r = await client.post("/v1/embeddings", json={"model": MODEL, "input": long})
    assert r.status == 400
    error = await r.json()
    validate("ErrorResponse", error)
    assert error["error"]["code"] == "context_length_exceeded"
    assert error["error"]["param"] == "input" and "402 tokens" in error["error"]["message"]
    r = await client.post("/v1/embeddings", json={"model": MODEL, "input": ["hi", long]})
    assert r.status == 400 and "input[1]" in (await r.json())["error"]["message"]
    assert (await r.json())["error"]["param"] == "input[1]"
    fits = "hello world " * 127  # 254 tokens and the two markers: 256
    r = await client.post("/v1/embeddings", json={"model": MODEL, "input": fits})
    assert r.status == 200 and (await r.json())["usage"]["prompt_tokens"] == 256


async def test_a_long_input_past_the_window_takes_no_pass_of_the_model(  # type: ignore[no-untyped-def]
        client) -> None:
    """A long text past the window is counted before it queues for the one worker, and
    refused there: no pass of the model (a 2 MB one held it ~5 s, every tenant's
    semantic lookups behind it), the same 400 as a pass's count gave."""
    emb = client.app[STATE].embedder
    before = emb.batches
    r = await client.post("/v1/embeddings", json={
        "model": MODEL, "input": ["hi", "hello world " * 20_000]})
    assert r.status == 400
    error = (await r.json())["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "input[1]"
    assert "40002 tokens" in error["message"]
    assert emb.batches == before


@pytest.mark.parametrize("ids", [[15339, 1917], [[15339, 1917], [9906]]])
async def test_token_id_input_is_refused_in_words(client, ids) -> None:  # type: ignore[no-untyped-def]
    """What LangChain's OpenAIEmbeddings sends by default: tiktoken ids, which name
    nothing in this model's vocabulary. A 400 that says what to send instead."""
    r = await client.post("/v1/embeddings", json={"model": MODEL, "input": ids})
    assert r.status == 400
    err = (await r.json())["error"]
    assert err["param"] == "input" and err["type"] == "invalid_request_error"
    assert "Token-id input" in err["message"] and "check_embedding_ctx_length" in err["message"]


async def test_concurrent_callers_are_batched(client) -> None:  # type: ignore[no-untyped-def]
    emb = client.app[STATE].embedder
    before = emb.batches
    results = await asyncio.gather(*(emb.embed([f"question number {i}"]) for i in range(24)))
    assert all(v.shape == (1, 384) for v, _ in results)
    assert emb.batches - before < 24
    single, _ = await emb.embed(["question number 3"])
    assert np.allclose(single[0], results[3][0][0], atol=1e-5)


async def test_a_large_batch_does_not_hold_up_a_lookup(client) -> None:  # type: ignore[no-untyped-def]
    emb = client.app[STATE].embedder
    texts = [f"customer question number {i} about an order" for i in range(2048)]
    big = asyncio.create_task(client.post("/v1/embeddings", json={"model": MODEL,
                                                                  "input": texts}))
    started = emb.batches
    await eventually(lambda: emb.batches > started and bool(emb._bulk), timeout=30)
    lookup = asyncio.create_task(emb.embed(["When are you open?"]))
    done, _ = await asyncio.wait({big, lookup}, return_when=asyncio.FIRST_COMPLETED)
    assert lookup in done and not big.done()  # served between two slices of the batch
    r = await big
    body = await r.json()
    assert r.status == 200 and len(body["data"]) == 2048
    assert [d["index"] for d in body["data"]] == list(range(2048))
    alone, _ = await emb.embed([texts[1500]])
    assert np.allclose(body["data"][1500]["embedding"], alone[0], atol=1e-4)


async def test_embeddings_are_rate_limited_like_any_route(make_client: MakeClient) -> None:
    """A key at its limit is refused here too, with OpenAI's headers; tokens are counted."""
    c = await make_client(embeddings={"enabled": True}, plugins=[
        {"name": "rate_limit", "config": {"rules": [{"per": "key", "rpm": 5,
                                                     "tpm": 1_000_000}]}},
        {"name": "admission", "config": {"max_concurrent": 2, "max_queue": 4}}])
    await c.app[STATE].embedder.ready()  # type: ignore[union-attr]
    statuses = []
    for _ in range(8):
        r = await c.post("/v1/embeddings", json={"model": MODEL, "input": ["a b c d"] * 3})
        statuses.append(r.status)
        if r.status == 200:
            assert r.headers["x-ratelimit-limit-requests"] == "5"
        else:
            body = await r.json()
            assert body["error"]["code"] == "rate_limit_exceeded" and "Retry-After" in r.headers
    assert statuses == [200] * 5 + [429] * 3
    limiter = next(p for p in c.app[STATE].plugins if p.name == "rate_limit")
    assert limiter.local.in_flight() == 0  # type: ignore[attr-defined]
    admission = next(p for p in c.app[STATE].plugins if p.name == "admission")
    assert admission.gate.in_use == admission.embed_gate.in_use == 0  # type: ignore[attr-defined]
