"""The OpenAI API over the fake engine: response shapes against the official spec."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import MakeClient, make_settings
from tests.fakes import FakeEngine
from tests.openai_spec import validate, validate_completion_chunk
from tests.sse import check_chat_stream, parse_sse

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


async def test_chat_completion_matches_spec(make_client: MakeClient, fake_engine: FakeEngine
                                            ) -> None:
    client = await make_client()
    r = await client.post("/v1/chat/completions", json=CHAT)
    assert r.status == 200
    body = await r.json()
    validate("CreateChatCompletionResponse", body)
    prompt = fake_engine.calls[0][0]
    assert body["choices"][0]["message"]["content"] == FakeEngine.expected_text(prompt, 5)
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": 5,
                             "total_tokens": len(prompt) + 5}
    assert r.headers["x-request-id"]


async def test_request_id_is_honoured(make_client: MakeClient) -> None:
    client = await make_client()
    r = await client.post("/v1/chat/completions", json=CHAT, headers={"x-request-id": "abc-1"})
    assert r.headers["x-request-id"] == "abc-1"
    r = await client.post("/v1/chat/completions", json=CHAT, headers={"x-request-id": "bad id"})
    assert r.headers["x-request-id"] != "bad id"


async def test_every_answer_streamed_or_not_carries_its_request_id(
        make_client: MakeClient) -> None:
    """A stream's head goes out inside its handler: the Responses API's streams had no
    `x-request-id` (chat's set it by hand)."""
    client = await make_client()
    responses = {"model": "fake-model", "input": "hi", "max_output_tokens": 16}
    for path, body in (("/v1/chat/completions", CHAT),
                       ("/v1/completions", {"model": "fake-model", "prompt": "hi",
                                            "max_tokens": 3}),
                       ("/v1/responses", responses)):
        for stream in (False, True):
            r = await client.post(path, json={**body, "stream": stream},
                                  headers={"x-request-id": "rid-7"})
            assert r.status == 200, (path, stream)
            assert r.headers.get("x-request-id") == "rid-7", (path, stream)
            await r.read()
            r = await client.post(path, json={**body, "stream": stream})
            assert len(r.headers.get("x-request-id", "")) >= 16, (path, stream)
            await r.read()
    for method, path in (("GET", "/v1/models"), ("GET", "/v1/nope"),
                         ("POST", "/v1/chat/completions")):
        r = await client.request(method, path, headers={"x-request-id": "rid-8"})
        assert r.headers.get("x-request-id") == "rid-8", path


async def test_chat_stream_matches_spec_and_agrees_with_whole(make_client: MakeClient) -> None:
    client = await make_client()
    whole = await (await client.post("/v1/chat/completions", json=CHAT)).json()
    r = await client.post("/v1/chat/completions",
                          json={**CHAT, "stream": True, "stream_options": {"include_usage": True}})
    assert r.status == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events, done = parse_sse(await r.text())
    assert done
    text = check_chat_stream(events, usage=True)
    assert text == whole["choices"][0]["message"]["content"]
    assert events[-1]["usage"] == whole["usage"]


async def test_chat_stream_without_usage_and_n2(make_client: MakeClient) -> None:
    client = await make_client()
    r = await client.post("/v1/chat/completions",
                          json={**CHAT, "stream": True, "n": 2, "temperature": 0.7})
    events, done = parse_sse(await r.text())
    assert done
    check_chat_stream(events, n=2)


async def test_greedy_choices_are_one_answer_n_times(make_client: MakeClient,
                                                     fake_engine: FakeEngine) -> None:
    """`n > 1` at temperature 0 (OpenAI takes it; vLLM refuses it): the engine answers
    once and every choice is that answer, whole and streamed, on chat and completions;
    the usage counts each choice's tokens, as OpenAI's does."""
    client = await make_client()
    body = await (await client.post("/v1/chat/completions", json={
        **CHAT, "n": 3, "temperature": 0, "max_tokens": 4})).json()
    validate("CreateChatCompletionResponse", body)
    texts = [c["message"]["content"] for c in body["choices"]]
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert len(set(texts)) == 1 and texts[0] and body["usage"]["completion_tokens"] == 12
    assert fake_engine.calls[-1][1].n == 1
    r = await client.post("/v1/chat/completions", json={
        **CHAT, "n": 2, "temperature": 0, "max_tokens": 4, "stream": True})
    events, done = parse_sse(await r.text())
    assert done
    check_chat_stream(events, n=2)
    streamed = ["".join(c["delta"].get("content") or "" for e in events
                        for c in e["choices"] if c["index"] == i) for i in (0, 1)]
    assert streamed[0] == streamed[1] == texts[0]
    done_body = await (await client.post("/v1/completions", json={
        "model": "fake-model", "prompt": ["a", "b"], "n": 2, "temperature": 0,
        "max_tokens": 3})).json()
    validate("CreateCompletionResponse", done_body)
    got = sorted((c["index"], c["text"]) for c in done_body["choices"])
    assert [i for i, _ in got] == [0, 1, 2, 3]
    assert got[0][1] == got[1][1] and got[2][1] == got[3][1] and got[0][1] != got[2][1]
    assert fake_engine.calls[-1][1].n == 1


async def test_chat_logprobs(make_client: MakeClient, fake_engine: FakeEngine) -> None:
    client = await make_client()
    r = await client.post("/v1/chat/completions",
                          json={**CHAT, "logprobs": True, "top_logprobs": 3})
    body = await r.json()
    validate("CreateChatCompletionResponse", body)
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == 5 and len(content[0]["top_logprobs"]) == 3
    assert fake_engine.calls[0][1].logprobs == 3


async def test_sampling_params_reach_the_engine(make_client: MakeClient, fake_engine: FakeEngine
                                                ) -> None:
    client = await make_client()
    r = await client.post("/v1/chat/completions", json={
        **CHAT, "temperature": 0.3, "top_p": 0.9, "seed": 7, "stop": "x",
        "presence_penalty": 0.5, "frequency_penalty": -0.5, "logit_bias": {"42": 5},
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "r", "schema": {"type": "object"}}},
        "user": "u1", "max_completion_tokens": 3, "min_p": 0.05, "repetition_penalty": 1.1})
    assert r.status == 200
    o = fake_engine.calls[0][1]
    assert (o.temperature, o.top_p, o.seed, o.stop, o.max_tokens) == (0.3, 0.9, 7, ["x"], 3)
    assert (o.presence_penalty, o.frequency_penalty, o.logit_bias) == (0.5, -0.5, {42: 5})
    assert o.json_schema == {"type": "object"} and not o.json_object
    assert (o.min_p, o.repetition_penalty) == (0.05, 1.1)  # vLLM's extensions too


async def test_default_max_tokens_is_the_rest_of_the_context(
        make_client: MakeClient, fake_engine: FakeEngine) -> None:
    fake_engine._max_model_len = 40
    client = await make_client()
    body = {**CHAT}
    del body["max_tokens"]
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status == 200
    prompt, opts, _ = fake_engine.calls[0]
    assert opts.max_tokens == 40 - len(prompt)


async def test_cache_salt_is_per_tenant(make_client: MakeClient, fake_engine: FakeEngine) -> None:
    client = await make_client(auth={"mode": "keys", "keys": [
        {"key": "ka", "tenant": "a"}, {"key": "ka2", "tenant": "a"}, {"key": "kb", "tenant": "b"}]})
    for key in ("ka", "ka2", "kb"):
        r = await client.post("/v1/chat/completions", json=CHAT,
                              headers={"Authorization": f"Bearer {key}"})
        assert r.status == 200
    salts = [c[2] for c in fake_engine.calls]
    assert salts[0] == salts[1] != salts[2]


async def _completion(client: Any, **kw: Any) -> dict[str, Any]:
    r = await client.post("/v1/completions", json={"model": "fake-model", "max_tokens": 4, **kw})
    assert r.status == 200, await r.text()
    body: dict[str, Any] = await r.json()
    validate("CreateCompletionResponse", body)
    return body


async def test_completions_prompt_forms(make_client: MakeClient, fake_engine: FakeEngine) -> None:
    client = await make_client()
    one = await _completion(client, prompt="hello")
    assert one["object"] == "text_completion" and len(one["choices"]) == 1
    many = await _completion(client, prompt=["a", "b", "c"], n=2, temperature=1)
    assert [c["index"] for c in many["choices"]] == list(range(6))
    ids = await _completion(client, prompt=[5, 6, 7])
    assert fake_engine.calls[-1][0] == [5, 6, 7]
    assert ids["usage"]["prompt_tokens"] == 3
    await _completion(client, prompt=[[5, 6], [7]])
    echo = await _completion(client, prompt="say", echo=True)
    assert echo["choices"][0]["text"].startswith("say ")
    lp = await _completion(client, prompt="x", logprobs=2)
    assert len(lp["choices"][0]["logprobs"]["tokens"]) == 4
    assert len(lp["choices"][0]["logprobs"]["top_logprobs"][0]) == 2


async def test_completion_stream(make_client: MakeClient) -> None:
    client = await make_client()
    r = await client.post("/v1/completions", json={
        "model": "fake-model", "prompt": ["a", "b"], "max_tokens": 3, "stream": True,
        "stream_options": {"include_usage": True}})
    events, done = parse_sse(await r.text())
    assert done
    for e in events:
        validate_completion_chunk(e)
    assert len({e["id"] for e in events}) == 1
    finishes = [c["index"] for e in events for c in e["choices"] if c["finish_reason"]]
    assert sorted(finishes) == [0, 1]
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 6


async def test_streamed_completion_logprob_offsets_match_the_whole_answer(
        make_client: MakeClient) -> None:
    """Each token's `text_offset` is its place in the choice's text, echoed prompt
    included: a stream numbered its first token from 0 after an echo (the whole answer
    from the prompt's end)."""
    client = await make_client()
    for echo in (False, True):
        ask = {"model": "fake-model", "prompt": "say hello", "max_tokens": 5, "logprobs": 1,
               "echo": echo}
        whole = (await (await client.post("/v1/completions", json=ask)).json())["choices"][0]
        r = await client.post("/v1/completions", json={**ask, "stream": True})
        events, done = parse_sse(await r.text())
        text = "".join(c["text"] for e in events for c in e["choices"])
        offsets = [o for e in events for c in e["choices"]
                   for o in (c.get("logprobs") or {}).get("text_offset", [])]
        assert done and text == whole["text"]
        assert offsets == whole["logprobs"]["text_offset"], echo
        tokens = whole["logprobs"]["tokens"]
        assert all(text[o:o + len(t)] == t for o, t in zip(offsets, tokens, strict=True))


def _without_first_nulls(body: dict[str, Any]) -> dict[str, Any]:
    """`body` with each choice's leading null logprob (a prompt's first token) dropped:
    OpenAI's spec types the items as numbers, its API and vLLM's send null there."""
    out = json.loads(json.dumps(body))
    for c in out["choices"]:
        lp = c.get("logprobs")
        if lp and lp["token_logprobs"] and lp["token_logprobs"][0] is None:
            for k in ("tokens", "token_logprobs", "text_offset", "top_logprobs"):
                del lp[k][:1]
    return out


async def _echo_stream(client: Any, ask: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """A streamed completion assembled per choice: text, finish reason, logprobs."""
    r = await client.post("/v1/completions", json={**ask, "stream": True})
    assert r.status == 200, await r.text()
    events, done = parse_sse(await r.text())
    assert done
    out: dict[int, dict[str, Any]] = {}
    for e in events:
        validate_completion_chunk(_without_first_nulls(e))
        for c in e["choices"]:
            got = out.setdefault(c["index"], {"text": "", "finish_reason": None, "logprobs": {
                "tokens": [], "token_logprobs": [], "text_offset": [], "top_logprobs": []}})
            got["text"] += c["text"]
            got["finish_reason"] = c["finish_reason"] or got["finish_reason"]
            for k, v in (c.get("logprobs") or {}).items():
                got["logprobs"][k] += v
    return out


async def test_echo_with_logprobs_scores_the_prompt(make_client: MakeClient,
                                                   fake_engine: FakeEngine) -> None:
    """lm-evaluation-harness scores a text as `echo` + `logprobs` (+ `max_tokens` 0 or 1),
    often with token ids: each prompt token's logprob comes first (the first null), then
    the generated ones; whole and streamed alike, per prompt and per choice."""
    client = await make_client()
    for prompt in ("say hi", [1, 40, 50, 60], ["ab", "cde"]):
        for max_tokens in (0, 2):
            ask = {"model": "fake-model", "prompt": prompt, "echo": True, "logprobs": 2,
                   "max_tokens": max_tokens, "n": 2, "temperature": 1}
            r = await client.post("/v1/completions", json=ask)
            assert r.status == 200, await r.text()
            body = await r.json()
            validate("CreateCompletionResponse", _without_first_nulls(body))
            assert fake_engine.calls[-1][1].prompt_logprobs == 2
            prompts = [prompt] if not isinstance(prompt, list) or isinstance(
                prompt[0], int) else prompt
            streamed = await _echo_stream(client, ask)
            assert len(body["choices"]) == 2 * len(prompts)
            for c in body["choices"]:
                p = prompts[c["index"] // 2]
                ids = fake_engine.encode(p) if isinstance(p, str) else p
                text = p if isinstance(p, str) else fake_engine.decode(p)
                lp = c["logprobs"]
                assert lp["token_logprobs"][:len(ids)] == [None] + [
                    -i / 10 for i in range(1, len(ids))]
                assert lp["top_logprobs"][0] is None
                assert lp["top_logprobs"][1] == {lp["tokens"][1]: -0.1, " p0": -5.0}
                # each prompt token's place in the echoed text (the fake's BOS has none)
                assert all(text[o:o + len(t)] == t for o, t in zip(
                    lp["text_offset"], lp["tokens"][:len(ids)], strict=False))
                if max_tokens == 0:  # the prompt alone: nothing generated is shown
                    assert c["text"] == text and c["finish_reason"] == "length"
                    assert len(lp["tokens"]) == len(ids)
                else:
                    assert c["text"].startswith(text) and len(c["text"]) > len(text)
                    assert len(lp["tokens"]) == len(ids) + max_tokens
                    assert lp["text_offset"][len(ids)] == len(text)
                    assert lp["token_logprobs"][len(ids):] == [-0.5] * max_tokens
                assert streamed[c["index"]] == {k: c[k] for k in (
                    "text", "finish_reason", "logprobs")}, (prompt, max_tokens)


async def test_an_echo_of_no_text_streams_its_prompt_logprobs(make_client: MakeClient) -> None:
    """A prompt whose text is empty (a BOS token alone) and a first step with no text:
    the prompt's entries wait for the next chunk, as a step's do (they were dropped)."""
    from proxy.engine.base import ChoiceDelta, EngineOutput, TokenLogprob, TopLogprob

    class Quiet(FakeEngine):
        async def generate(self, prompt: list[int], options: Any, request_id: str,
                           **kw: Any) -> Any:
            first = self.prompt_entries(prompt, options.prompt_logprobs or 0)
            yield EngineOutput([ChoiceDelta(0, "", [])], len(prompt), False,
                               prompt_logprobs=first)
            top = [TopLogprob(" a", -0.5, None)]
            yield EngineOutput([ChoiceDelta(0, " a", [9], [TokenLogprob(" a", -0.5, None, top)],
                                            "length")], len(prompt), True)

    client = await make_client(engine=Quiet())
    ask = {"model": "fake-model", "prompt": [1], "echo": True, "logprobs": 1, "max_tokens": 1}
    whole = (await (await client.post("/v1/completions", json=ask)).json())["choices"][0]
    streamed = (await _echo_stream(client, ask))[0]
    assert whole["logprobs"]["tokens"] == ["", " a"] and whole["text"] == " a"
    assert streamed == {k: whole[k] for k in ("text", "finish_reason", "logprobs")}


async def test_max_tokens_zero_is_only_for_echo(make_client: MakeClient,
                                                fake_engine: FakeEngine) -> None:
    client = await make_client()
    r = await client.post("/v1/completions", json={"model": "fake-model", "prompt": "x",
                                                   "max_tokens": 0})
    assert r.status == 400
    body = await r.json()
    validate("ErrorResponse", body)
    assert body["error"]["param"] == "max_tokens" and "echo" in body["error"]["message"]
    # said as every bound is (chat's `max_tokens: 0` too), not in pydantic's words
    assert body["error"]["code"] == "integer_below_min_value"
    assert body["error"]["message"].startswith(
        "Invalid `max_tokens`: integer below minimum value. Expected a value >= 1")
    assert not fake_engine.calls
    echoed = await _completion(client, prompt="hello there", echo=True, max_tokens=0)
    assert echoed["choices"][0]["text"] == "hello there"
    assert echoed["usage"]["completion_tokens"] == 0  # nothing generated is shown
    three = await _completion(client, prompt="hey", echo=True, max_tokens=0, n=3,
                              temperature=1)
    assert [c["text"] for c in three["choices"]] == ["hey"] * 3
    assert fake_engine.calls[-1][1].n == 1  # one hidden token made, not three
    r = await client.post("/v1/completions", json={  # the one hidden token needs room
        "model": "fake-model", "prompt": [5] * fake_engine.max_model_len, "echo": True,
        "max_tokens": 0})
    body = await r.json()
    assert r.status == 400 and body["error"]["code"] == "context_length_exceeded"
    assert "room for one token" in body["error"]["message"]
    assert fake_engine.calls[-1][1].prompt_logprobs is None  # none asked, none computed


async def test_models(make_client: MakeClient) -> None:
    client = await make_client()
    body = await (await client.get("/v1/models")).json()
    validate("ListModelsResponse", body)
    assert body["data"][0]["id"] == "fake-model" and body["data"][0]["root"] == "/fake"
    one = await client.get("/v1/models/fake-model")
    validate("Model", await one.json())
    missing = await client.get("/v1/models/nope")
    assert missing.status == 404
    err = await missing.json()
    validate("ErrorResponse", err)
    assert err["error"]["code"] == "model_not_found"


async def test_models_respect_key_scope(make_client: MakeClient) -> None:
    client = await make_client(auth={"mode": "keys", "keys": [
        {"key": "k", "tenant": "a", "models": ["other"]}]})
    h = {"Authorization": "Bearer k"}
    body = await (await client.get("/v1/models", headers=h)).json()
    assert body["data"] == []
    assert (await client.get("/v1/models/fake-model", headers=h)).status == 404
    assert (await client.get("/v1/models")).status == 401


async def test_health_and_metrics(make_client: MakeClient, fake_engine: FakeEngine) -> None:
    client = await make_client()
    assert (await client.get("/health/live")).status == 200
    ready = await client.get("/health/ready")
    assert ready.status == 200 and (await ready.json())["status"] == "ready"
    await client.post("/v1/chat/completions", json=CHAT)
    text = await (await client.get("/metrics")).text()
    assert 'weir_requests_total{model="fake-model",route="chat",status="200"} 1.0' in text


async def test_a_whole_answers_logprobs_are_bounded(
        make_client: MakeClient, fake_engine: FakeEngine, monkeypatch: Any) -> None:
    """`n: 128` with `top_logprobs: 20` built ~10 KB a token in memory (gigabytes for one
    request) before anything went out. Past the bound the generation stops and the
    client is told to ask for less or stream; a stream holds none of it and goes on."""
    monkeypatch.setattr("proxy.rendering.MAX_WHOLE_LOGPROBS", 100)
    client = await make_client()
    big = {**CHAT, "n": 4, "max_tokens": 20, "logprobs": True, "top_logprobs": 3}
    r = await client.post("/v1/chat/completions", json=big)
    body = await r.json()
    assert r.status == 400, body
    assert body["error"]["code"] == "answer_too_large"
    assert body["error"]["param"] == "top_logprobs" and "stream" in body["error"]["message"]
    r = await client.post("/v1/completions", json={
        "model": "fake-model", "prompt": ["a", "b"], "n": 4, "max_tokens": 20, "logprobs": 2})
    assert r.status == 400 and (await r.json())["error"]["param"] == "logprobs"
    r = await client.post("/v1/chat/completions", json={**big, "stream": True})
    events, done = parse_sse(await r.text())
    assert r.status == 200 and done
    assert {c["index"] for e in events for c in e["choices"]} == {0, 1, 2, 3}
    r = await client.post("/v1/chat/completions",
                          json={**CHAT, "logprobs": True, "top_logprobs": 3})
    assert r.status == 200  # 5 tokens x 4 entries: within it


@pytest.mark.parametrize("stream", [False, True])
async def test_chat_logprobs_of_part_of_a_character_keep_their_bytes(
        make_client: MakeClient, fake_engine: FakeEngine, stream: bool) -> None:
    """A token that is part of a UTF-8 character (text "", as vLLM names it) keeps its
    entry and its own `bytes`, chosen and in `top_logprobs`, whole and streamed (a stream
    sends no content for it): the tokens join to the content, their bytes to its UTF-8."""
    fake_engine.byte_tokens = [("Hi ", b"Hi "), ("", b"\xe6\x97"), ("日", b"\xa5"),
                               ("!", b"!")]
    r = await client_post(await make_client(), {
        **CHAT, "logprobs": True, "top_logprobs": 1, "max_tokens": 4, "stream": stream})
    if stream:
        events, done = parse_sse(r)
        assert done
        content = "".join(c["delta"].get("content") or "" for e in events
                          for c in e["choices"])
        entries = [t for e in events for c in e["choices"]
                   for t in ((c.get("logprobs") or {}).get("content") or [])]
    else:
        choice = json.loads(r)["choices"][0]
        content, entries = choice["message"]["content"], choice["logprobs"]["content"]
    assert content == "Hi 日!"
    assert [t["token"] for t in entries] == ["Hi ", "", "日", "!"]
    assert [t["bytes"] for t in entries] == [list(b"Hi "), [0xE6, 0x97], [0xA5], [0x21]]
    assert [t["top_logprobs"][0]["bytes"] for t in entries] == [t["bytes"] for t in entries]


async def client_post(client: Any, body: dict[str, Any]) -> str:
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status == 200, await r.text()
    return await r.text()


async def test_a_chat_answer_names_the_service_tier_its_request_set(
        make_client: MakeClient) -> None:
    """OpenAI: "When the `service_tier` parameter is set, the response body will include
    the `service_tier` value based on the processing mode actually used" (every chunk of
    a stream too). One engine serves every request alike: `default`, whatever was asked,
    as the Responses API answers; cached replays and stored completions alike. Left
    unset, the answer says nothing of it, as before."""
    client = await make_client(make_settings(plugins=[{"name": "cache", "config": {
        "store_truncated": True, "semantic": {"enabled": False}}}]))
    ask = {**CHAT, "temperature": 0, "max_tokens": 3}
    seen = set()
    for tier in ("auto", "flex", "priority"):
        for _ in range(2):  # a miss, then the cache's replay of it
            r = await client.post("/v1/chat/completions",
                                  json={**ask, "service_tier": tier, "store": True})
            seen.add(r.headers.get("x-weir-cache"))
            body = await r.json()
            validate("CreateChatCompletionResponse", body)
            assert body["service_tier"] == "default", (tier, r.headers.get("x-weir-cache"))
            stored = await (await client.get(f"/v1/chat/completions/{body['id']}")).json()
            assert stored["service_tier"] == "default"
            r = await client.post("/v1/chat/completions", json={
                **ask, "service_tier": tier, "stream": True, "store": True,
                "stream_options": {"include_usage": True}})
            events, done = parse_sse(await r.text())
            assert done and events
            check_chat_stream(events, usage=True)
            assert {e.get("service_tier") for e in events} == {"default"}, tier
            stored = await (await client.get(f"/v1/chat/completions/{events[0]['id']}")).json()
            assert stored["service_tier"] == "default"
    assert seen == {"miss", "exact"}
    r = await client.post("/v1/chat/completions", json=ask)
    assert r.headers["x-weir-cache"] == "exact"  # the answer the tiers had
    assert "service_tier" not in await r.json()
    r = await client.post("/v1/chat/completions", json={**ask, "stream": True})
    events, _ = parse_sse(await r.text())
    assert all("service_tier" not in e for e in events)
