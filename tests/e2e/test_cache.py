"""End to end: the cache and the sanitizer in a real `weir serve` on the real engine,
through the OpenAI SDK (raw responses, for the x-weir-cache header)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.conftest import MODEL
from tests.e2e.server import WeirProcess, e2e_config
from tests.e2e.server import sdk as sdk_client
from tests.metrics import metric
from tests.openai_spec import validate
from tests.sse import check_chat_stream, parse_sse

KEYS = [{"key": "sk-cache-acme", "tenant": "acme"}, {"key": "sk-cache-globex", "tenant": "globex"}]


@pytest.fixture(scope="module")
def cached(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WeirProcess]:
    cfg = e2e_config(auth={"mode": "keys", "keys": KEYS}, embeddings={"enabled": True},
                     plugins=[{"name": "sanitizer", "config": {}},
                              {"name": "cache", "config": {"store_truncated": True}}])
    proc = WeirProcess(tmp_path_factory.mktemp("weir-cache"), cfg).start()
    yield proc
    proc.stop()


def sdk(weir: WeirProcess, key: str = "sk-cache-acme") -> openai.OpenAI:
    return sdk_client(weir.url, key)  # type: ignore[no-any-return]


def ask(client: openai.OpenAI, content: str, system: str | None = None,
        **kw: Any) -> tuple[str, str, Any]:
    messages = [{"role": "user", "content": content}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, max_tokens=12, temperature=0, **kw)
    reply = raw.parse()
    return raw.headers["x-weir-cache"], raw.headers.get("age", ""), reply


def test_exact_hit_whole_and_streamed(cached: WeirProcess) -> None:
    c = sdk(cached)
    layer, _, first = ask(c, "What are the support hours for premium customers?")
    assert layer == "miss"
    layer, age, second = ask(c, "What are the support hours for premium customers?")
    assert layer == "exact" and age.isdigit()
    assert second.choices[0].message.content == first.choices[0].message.content
    r = httpx.post(f"{cached.url}/v1/chat/completions", timeout=60,
                   headers={"Authorization": "Bearer sk-cache-acme"},
                   json={"model": MODEL, "temperature": 0, "max_tokens": 12, "stream": True,
                         "stream_options": {"include_usage": True},
                         "messages": [{"role": "user", "content":
                                       "What are the support hours for premium customers?"}]})
    assert r.headers["x-weir-cache"] == "exact"
    events, done = parse_sse(r.text)
    assert done and check_chat_stream(events, usage=True) == first.choices[0].message.content
    assert events[-1]["usage"]["completion_tokens"] == first.usage.completion_tokens


def test_semantic_hit_and_near_miss(cached: WeirProcess) -> None:
    c = sdk(cached)
    ask(c, "How do I cancel my subscription?")
    layer, _, _ = ask(c, "How can I cancel my subscription?")
    assert layer == "semantic"
    ask(c, "Please cancel order 123")
    layer, _, _ = ask(c, "Please cancel order 456")
    assert layer == "miss"


def test_tenants_are_isolated(cached: WeirProcess) -> None:
    acme, globex = sdk(cached), sdk(cached, "sk-cache-globex")
    ask(acme, "What is the discount for the enterprise tier?")
    layer, _, _ = ask(globex, "What is the discount for the enterprise tier?",
                      extra_headers={"Cache-Control": "no-store"})
    assert layer == "miss"
    layer, _, _ = ask(globex, "What's the discount for the enterprise tier?",
                      extra_headers={"Cache-Control": "no-store"})
    assert layer == "miss"


def test_sensitive_requests_bypass(cached: WeirProcess) -> None:
    c = sdk(cached)
    for _ in range(2):
        layer, _, _ = ask(c, "My card 4111 1111 1111 1111 was charged twice")
        assert layer == "bypass"


def test_embeddings_endpoint(cached: WeirProcess) -> None:
    r = sdk(cached).embeddings.create(model="all-MiniLM-L6-v2", input=["hello", "world"])
    assert len(r.data) == 2 and len(r.data[0].embedding) == 384
    body = httpx.post(f"{cached.url}/v1/embeddings", timeout=60,
                      headers={"Authorization": "Bearer sk-cache-acme"},
                      json={"model": "all-MiniLM-L6-v2", "input": "hello"}).json()
    validate("CreateEmbeddingResponse", body)


def access_lines(weir: WeirProcess, offset: int) -> list[dict[str, Any]]:
    """The JSON access-log lines the server wrote after `offset` bytes of its log."""
    with open(weir.log_path, "rb") as f:
        f.seek(offset)
        lines = f.read().decode(errors="replace").splitlines()
    out = []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("event") == "request":
            out.append(entry)
    return out


def test_cache_metrics_and_access_log_move(cached: WeirProcess) -> None:
    # A system prompt of its own: a fresh cache partition, whatever ran before.
    system = f"Metrics test {uuid.uuid4().hex}"
    offset = cached.log_path.stat().st_size
    before = httpx.get(f"{cached.url}/metrics").text
    c = sdk(cached)
    assert ask(c, "How do I cancel my subscription?", system)[0] == "miss"
    assert ask(c, "How do I cancel my subscription?", system)[0] == "exact"
    assert ask(c, "How can I cancel my subscription?", system)[0] == "semantic"
    after = httpx.get(f"{cached.url}/metrics").text
    for layer in ("l1", "semantic"):
        moved = (metric(after, "weir_cache_lookups_total", layer=layer, result="hit")
                 - metric(before, "weir_cache_lookups_total", layer=layer, result="hit"))
        assert moved == 1, layer
    # The access log records each request's cache result (the server writes the line
    # before it answers; the file is read until the three lines are there, bounded).
    deadline = time.monotonic() + 10
    while len(lines := access_lines(cached, offset)) < 3:
        assert time.monotonic() < deadline, lines
        time.sleep(0.05)  # another process's file
    chat = [e["cache"] for e in lines if e.get("path") == "/v1/chat/completions"]
    assert chat == ["miss", "exact", "semantic"]
