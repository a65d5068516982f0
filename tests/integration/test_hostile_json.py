"""Hostile JSON bodies over HTTP: every one is a 400 or 413 in OpenAI's shape, never a
500, on every route that reads a body (chat with the cache on, completions, embeddings'
parser, the cache purge, fault injection), and the server keeps answering."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from proxy.engine.faults import FaultyEngine
from proxy.jsonbody import MAX_DEPTH
from tests.conftest import MakeClient, make_settings
from tests.fakes import FakeEngine
from tests.openai_spec import validate

OPERATOR = "sk-hostile-operator"
KEYS = [{"key": OPERATOR, "tenant": "ops", "role": "admin", "operator": True}]
H = {"Authorization": f"Bearer {OPERATOR}", "Content-Type": "application/json"}
MSG = '[{"role": "user", "content": "hi"}]'


def nested(depth: int, leaf: str = "0") -> str:
    opens = "".join("[" if i % 2 else '{"k":' for i in range(depth))
    closes = "".join("]" if i % 2 else "}" for i in reversed(range(depth)))
    return opens + leaf + closes


def bodies() -> list[tuple[str, str]]:
    """(name, body) variants of each family the battery found, and more of each."""
    out: list[tuple[str, str]] = []
    chat = '{"model": "fake-model", "messages": ' + MSG
    for digits in (65, 4_300, 4_301, 50_000):
        for field in ("seed", "max_tokens", "n", "top_k", "junk"):
            out.append((f"int{digits}-{field}", f'{chat}, "{field}": {"7" * digits}}}'))
    for depth in (MAX_DEPTH + 1, 300, 970, 3_000):
        for field in ("tools", "response_format", "tool_choice", "logit_bias", "junk"):
            out.append((f"deep{depth}-{field}", f'{chat}, "{field}": {nested(depth)}}}'))
        lone = nested(depth, '"\\udfff"')
        out.append((f"surrogate{depth}", f'{chat}, "junk": {lone}}}'))
        out.append((f"deep{depth}-message", '{"model": "fake-model", "messages": [{"role": '
                    f'"user", "content": "hi", "tool_calls": [{nested(depth)}]}}]}}'))
    for const in ("NaN", "Infinity", "-Infinity"):
        out.append((f"const-{const}", f'{chat}, "temperature": {const}}}'))
    out.append(("lone-surrogate-content", '{"model": "fake-model", "messages": '
                '[{"role": "user", "content": "a\\ud800b"}]}'))
    return out


@pytest.fixture
async def client(make_client: MakeClient) -> Any:
    settings = make_settings(
        auth={"mode": "keys", "keys": KEYS},
        engine={"faults": True},
        plugins=[{"name": "sanitizer"}, {"name": "cache", "config": {
            "semantic": {"enabled": False}, "store_truncated": True}}])
    return await make_client(settings, engine=FaultyEngine(FakeEngine()))  # type: ignore[arg-type]


async def test_every_hostile_body_is_a_400_on_every_route(client: Any) -> None:
    for name, body in bodies():
        for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings",
                     "/admin/cache/purge", "/admin/faults"):
            r = await client.post(path, data=body.encode(), headers=H)
            text = await r.text()
            assert r.status in (400, 404, 413), (name, path, r.status, text[:300])
            if r.status == 400:
                validate("ErrorResponse", json.loads(text))
    r = await client.post("/v1/chat/completions", headers=H,
                          json={"model": "fake-model", "messages": json.loads(MSG)})
    assert r.status == 200  # and it still serves


async def test_deep_tools_name_the_param_before_the_cache_key(client: Any) -> None:
    body = '{"model": "fake-model", "messages": ' + MSG + ', "tools": ' + nested(970) + "}"
    r = await client.post("/v1/chat/completions", data=body, headers=H)
    assert r.status == 400
    assert (await r.json())["error"]["param"] == "tools"


@pytest.mark.parametrize("body", ["[]", '"mode"', "3", "null", '["error"]', '{"mode": 5}',
                                  '{"mode": "error", "delay_s": "soon"}',
                                  '{"mode": "slow", "delay_s": -1}', '{"mode": "x"}',
                                  '{"mode": "ok", "extra": 1}'])
async def test_fault_injection_body_must_be_a_valid_object(client: Any, body: str) -> None:
    r = await client.post("/admin/faults", data=body, headers=H)
    assert r.status == 400, await r.text()
    validate("ErrorResponse", await r.json())
    r = await client.post("/admin/faults", json={"mode": "slow", "delay_s": 0.5}, headers=H)
    assert (await r.json()) == {"mode": "slow", "delay_s": 0.5}


async def test_100k_messages_are_refused_before_validation(
        client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import proxy.routes

    validated: list[Any] = []
    real = proxy.routes.parse_model
    monkeypatch.setattr(proxy.routes, "parse_model",
                        lambda m, d: validated.append(m) or real(m, d))
    body = json.dumps({"model": "fake-model",
                       "messages": [{"role": "user", "content": "hi"}] * 100_000})
    r = await client.post("/v1/chat/completions", data=io.BytesIO(body.encode()), headers=H)
    assert r.status == 400
    assert (await r.json())["error"]["param"] == "messages"
    assert validated == []  # refused by count, not after a full validation


class ThreadRecording(FakeEngine):
    """Records the thread each prompt is rendered or tokenized in."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.threads: list[str] = []

    def encode(self, text: str) -> list[int]:
        import threading

        self.threads.append(threading.current_thread().name)
        return super().encode(text)

    def render_chat(self, messages: list[dict[str, Any]], tools: Any, **kw: Any) -> list[int]:
        import threading

        self.threads.append(threading.current_thread().name)
        return super().render_chat(messages, tools, **kw)


@pytest.mark.parametrize("route", ["chat", "completion"])
async def test_a_long_prompt_is_tokenized_off_the_event_loop(
        make_client: MakeClient, route: str) -> None:
    """Tokenizing the sanitizer's 262,144 characters took ~0.3 s: on the event loop, it
    held every other request's stream that long, each time any client sent one (a cheap
    400 past the context). A long prompt is rendered and tokenized in a thread of its
    own; a short one stays on the loop."""
    import threading

    engine = ThreadRecording()
    client = await make_client(engine=engine)
    loop_thread = threading.current_thread().name
    path = "/v1/chat/completions" if route == "chat" else "/v1/completions"
    for text, off in (("hi", False), ("x " * 20_000, True)):
        body: dict[str, Any] = {"model": "fake-model", "max_tokens": 2}
        if route == "chat":
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        engine.threads.clear()
        r = await client.post(path, json=body)
        assert r.status == (400 if off else 200), await r.text()  # (past the context)
        assert engine.threads and all((t != loop_thread) == off for t in engine.threads), (
            text[:5], engine.threads)


async def test_a_long_prompt_s_cache_hit_counts_its_tokens_off_the_event_loop(
        make_client: MakeClient) -> None:
    """A cache hit for another prompt the key reads as the same (other spaces) reports
    the asker's prompt tokens, rendered as a miss renders them: a long prompt's render
    held the event loop there (each repeat with a space moved), though a miss of it is
    prepared in a thread of its own."""
    import threading

    engine = ThreadRecording(max_model_len=100_000)
    client = await make_client(make_settings(plugins=[
        {"name": "cache", "config": {"semantic": {"enabled": False},
                                     "store_truncated": True}}]), engine=engine)  # (kept cut)
    text = "word " * 5_000
    for prompt, layer in ((text, "miss"), ("word  " + text[5:], "exact")):
        engine.threads.clear()
        r = await client.post("/v1/chat/completions", json={
            "model": "fake-model", "max_tokens": 64, "temperature": 0,
            "messages": [{"role": "user", "content": prompt}]})
        seen = list(engine.threads)
        assert r.status == 200, await r.text()
        assert r.headers["X-Weir-Cache"] == layer
        assert (await r.json())["usage"]["prompt_tokens"] == len(
            engine.render_chat([{"role": "user", "content": prompt}], None))
        assert seen and threading.current_thread().name not in seen, (layer, seen)
