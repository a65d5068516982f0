"""vLLM's request extensions over HTTP, on the fake engine: honoured ones reach the
engine and shape the answer (whole and streamed), refused ones are a 400 naming them on
the in-process engine, and an edge Weir passes every one of them on to its upstream as
sent (the upstream, a vLLM server or another Weir, decides)."""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestServer

from proxy.app import create_app
from tests.conftest import MakeClient, make_settings
from tests.fakes import FakeEngine
from tests.sse import parse_sse

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 6}
COMPLETION = {"model": "fake-model", "prompt": "hello", "max_tokens": 6}


async def test_stop_token_ids_end_the_answer_with_stop(make_client: MakeClient,
                                                       fake_engine: FakeEngine) -> None:
    """The fake's token i is id 10 + i: id 12 ends the answer at its third token, whose
    text is left out unless `include_stop_str_in_output` keeps it (as vLLM does)."""
    client = await make_client()
    for path, body, text in (("/v1/completions", COMPLETION, lambda c: c["text"]),
                             ("/v1/chat/completions", CHAT,
                              lambda c: c["message"]["content"])):
        plain = (await (await client.post(path, json=body)).json())["choices"][0]
        words = text(plain).split(" ")[1:]
        assert len(words) == 6 and plain["finish_reason"] == "length"
        for keep, want in ((False, words[:2]), (True, words[:3])):
            r = await client.post(path, json={**body, "stop_token_ids": [12],
                                              "include_stop_str_in_output": keep})
            assert r.status == 200, await r.text()
            out = await r.json()
            choice = out["choices"][0]
            assert choice["finish_reason"] == "stop" and out["usage"]["completion_tokens"] == 3
            assert text(choice) == "".join(" " + w for w in want)
            assert fake_engine.calls[-1][1].stop_token_ids == [12]
            assert fake_engine.calls[-1][1].include_stop_str_in_output is keep
            events, done = parse_sse(await (await client.post(path, json={
                **body, "stop_token_ids": [12], "include_stop_str_in_output": keep,
                "stream": True})).text())
            streamed = "".join((c.get("text") or (c.get("delta") or {}).get("content") or "")
                               for e in events for c in e["choices"])
            reasons = [c["finish_reason"] for e in events for c in e["choices"]
                       if c.get("finish_reason")]
            assert done and streamed == text(choice) and reasons == ["stop"]


async def test_refused_extensions_are_a_400_naming_them(make_client: MakeClient,
                                                        fake_engine: FakeEngine) -> None:
    client = await make_client()
    for path, body, name, value in (
            ("/v1/chat/completions", CHAT, "use_beam_search", True),
            ("/v1/chat/completions", CHAT, "chat_template", "{{ messages }}"),
            ("/v1/chat/completions", CHAT, "structured_outputs", {"regex": "a+"}),
            ("/v1/chat/completions", CHAT, "echo", True),
            ("/v1/completions", COMPLETION, "truncate_prompt_tokens", 4),
            ("/v1/completions", COMPLETION, "prompt_logprobs", 1),
            ("/v1/completions", COMPLETION, "add_special_tokens", False)):
        r = await client.post(path, json={**body, name: value})
        assert r.status == 400, (name, await r.text())
        err = (await r.json())["error"]
        assert (err["param"], err["code"], err["type"]) == (
            name, "unsupported_parameter", "invalid_request_error")
    assert not fake_engine.calls
    for path, body, name, value in (("/v1/chat/completions", CHAT, "use_beam_search", False),
                                    ("/v1/completions", COMPLETION, "priority", 0)):
        assert (await client.post(path, json={**body, name: value})).status == 200


async def test_an_edge_passes_every_extension_on_to_its_upstream(
        make_client: MakeClient) -> None:
    """Honoured ones arrive as sent (the central's engine gets them); refused ones too,
    for the upstream to decide (this central refuses them, naming them)."""
    engine = FakeEngine()
    server = TestServer(create_app(make_settings(), engine=engine))
    await server.start_server()
    try:
        edge = await make_client(make_settings(engine={
            "kind": "upstream", "base_url": f"http://127.0.0.1:{server.port}/v1",
            "models": ["fake-model"], "timeout_s": 5, "connect_timeout_s": 1}))
        honoured: dict[str, Any] = {
            "stop_token_ids": [12], "include_stop_str_in_output": True,
            "skip_special_tokens": False, "spaces_between_special_tokens": False,
            "allowed_token_ids": [3, 4], "bad_words": ["x"]}
        r = await edge.post("/v1/chat/completions", json={
            **CHAT, **honoured, "messages": [*CHAT["messages"],  # type: ignore[list-item]
                                             {"role": "assistant", "content": "Hi,"}],
            "add_generation_prompt": False, "continue_final_message": True})
        assert r.status == 200, await r.text()
        prompt, opts, _ = engine.calls[-1]
        assert {k: getattr(opts, k) for k in honoured} == honoured
        assert prompt == engine.render_chat(
            [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "Hi,"}],
            None, add_generation_prompt=False, continue_final_message=True)
        r = await edge.post("/v1/completions", json={**COMPLETION, "use_beam_search": True})
        assert r.status == 400 and (await r.json())["error"]["param"] == "use_beam_search"
        assert len(engine.calls) == 1
    finally:
        await server.close()
