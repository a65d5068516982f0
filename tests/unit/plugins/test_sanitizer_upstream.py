"""Sanitizer: every caller-supplied string that goes on to an upstream engine (which gets
the request as it came, extras and all) or is kept beside it, screened as the prompt is;
a `block` detector firing in one refuses the request; nothing of it logged."""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from plugins.sanitizer.config import SanitizerConfig
from plugins.sanitizer.plugin import SanitizerPlugin
from proxy.auth import Principal
from proxy.chain import Completion, Reply, Services
from proxy.context import RequestContext, screened_values
from proxy.errors import InvalidRequest
from proxy.protocol import ChatCompletionRequest, CompletionRequest
from proxy.settings import Settings
from proxy.telemetry import Metrics
from tests.fakes import FakeEngine
from tests.unit.test_upstream import Upstream, engine_for

KEY = "sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zQ7"
LOOK = "\u0455k-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zQ7"  # a Cyrillic look-alike "s"
ENCODED = "sk%2Dproj%2DAb3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zQ7"
GHP = "ghp_aB3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF3hJ6"
PIECES = ("Ab3dEf6hIj", "aB3dE6gH9j")  # of KEY and its disguises, of GHP


def sanitizer(**detectors: str) -> SanitizerPlugin:
    return SanitizerPlugin(SanitizerConfig.model_validate({"detectors": detectors}),
                           Services(terminal=FakeEngine(), settings=Settings(),
                                    metrics=Metrics()))


def context(body: dict[str, Any]) -> RequestContext:
    req = ChatCompletionRequest.model_validate({"model": "up-model", **body})
    return RequestContext(route="chat", request=req, principal=Principal("t", "user", "u"),
                          request_id="r")


def everywhere() -> dict[str, Any]:
    """A request with a key in every string a caller may send along a chat request."""
    return {
        "max_tokens": 5, "stop": [KEY, "\n\n"], "user": KEY, "bad_words": [LOOK, "darn"],
        "safety_identifier": f"s-{GHP}", "prompt_cache_key": ENCODED,
        "metadata": {KEY: "v", "k": LOOK},
        "prediction": {"type": "content", "content": [{"type": "text", "text": KEY,
                                                       "note": GHP}], "x": KEY},
        "documents": [{"title": KEY, "text": f"token {GHP}"}],  # (vLLM's RAG documents)
        "chat_template_kwargs": {"note": ENCODED},
        "tools": [{"type": "function", "function": {"name": "f", "description": KEY,
                                                     "x-note": LOOK}}],
        "tool_choice": {"type": "function", "function": {"name": "f", "n": KEY}, "note": KEY},
        "response_format": {"type": "text", "note": GHP},
        "messages": [
            {"role": "system", "content": LOOK, "note": KEY},
            {"role": "user", "name": f"bob {KEY}", "x": {"y": [ENCODED], KEY: 1},
             "content": [{"type": "text", "text": f"see {ENCODED}",
                          "cache_control": {"n": GHP}},
                         {"type": "text", "text": KEY[:20]}, {"type": "text", "text": KEY[20:]}]},
            {"role": "assistant", "content": None, "reasoning_content": f"use {KEY}",
             "tool_calls": [{"id": f"c-{KEY}", "type": "function", "note": LOOK, "function": {
                 "name": "f", "arguments": json.dumps({"a": KEY, "b": [ENCODED]}),
                 "x": GHP}}]},
            {"role": "tool", "tool_call_id": f"c-{KEY}", "note": KEY,
             "content": [{"type": "text", "text": f"got {GHP}"}]},
            {"role": "assistant", "content": [{"type": "refusal", "refusal": KEY}]},
            {"role": "user", "content": "go on"},
        ]}


def leaks(value: Any) -> list[str]:
    """Where a piece of a key is in `value`'s strings, its keys too."""
    said = json.dumps(value, ensure_ascii=False)
    return [p for p in PIECES if p in said]


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    up = Upstream()
    await up.server.start_server()
    yield up
    await up.server.close()


async def test_no_string_the_caller_sent_reaches_the_upstream_unscreened(
        upstream: Upstream, logs: io.StringIO) -> None:
    """Message extras (vLLM's `reasoning_content`, any field), a part's extras, an
    earlier call's and its function's extras, a named `tool_choice`'s, the stop
    sequences, a prediction, the request's own extras (`documents`,
    `chat_template_kwargs`) went upstream as sent: the upstream gets the request as it
    came (`exclude_unset`), and the sanitizer read only the texts of the prompt."""
    engine = await engine_for(upstream.base_url)
    try:
        ctx = context(everywhere())
        assert leaks(ctx.request.model_dump(by_alias=True, exclude_unset=True))
        await sanitizer(secret="redact")(ctx, engine)
    finally:
        await engine.close()
    [(_, body)] = upstream.seen
    assert body["messages"][2]["reasoning_content"] == "use [SECRET]"
    assert body["stop"] == ["[SECRET]", "\n\n"]
    assert body["bad_words"] == ["[SECRET]", "darn"]
    call = body["messages"][2]["tool_calls"][0]["id"]  # (its hash, the answer's too)
    assert call.startswith("call_") and body["messages"][3]["tool_call_id"] == call
    assert leaks(body) == [], json.dumps(body, ensure_ascii=False)
    assert ctx.key_request is not None  # (the cache's key: its extras too)
    said = ctx.key_request.model_dump(by_alias=True, exclude_unset=True)
    for field in ("user", "safety_identifier", "prompt_cache_key", "metadata"):
        said.pop(field)  # (no part of a cache key: `plugins/cache/keys.py`)
    assert leaks(said) == []
    assert "sanitizer detections" in logs.getvalue()
    assert leaks(logs.getvalue()) == []


async def test_what_holds_nothing_goes_on_as_it_came(upstream: Upstream) -> None:
    body = {"max_tokens": 5, "stop": ["END"], "documents": [{"title": "notes"}],
            "messages": [{"role": "user", "content": "hi", "note": "plain"},
                         {"role": "assistant", "content": None, "tool_calls": [
                             {"id": "c1", "type": "function", "function": {
                                 "name": "f", "arguments": "{}"}}]},
                         {"role": "tool", "tool_call_id": "c1", "content": "ok"}]}
    ctx = context(body)
    before = ctx.request
    seen: list[RequestContext] = []

    async def spy(c: RequestContext) -> Reply:
        seen.append(c)
        return Completion({"choices": []})

    await sanitizer(secret="redact", email="redact")(ctx, spy)
    assert seen[0].request == before and not seen[0].flags


# ------------------------------------------------- metadata's keys; blocks beside the prompt

async def test_metadata_keys_are_screened_as_its_values_are() -> None:
    ctx = context({"messages": [{"role": "user", "content": "hi"}],
                   "metadata": {KEY: "v", "note": "plain", "plain": "text"}})
    seen: list[RequestContext] = []

    async def spy(c: RequestContext) -> Reply:
        seen.append(c)
        return Completion({"choices": []})

    await sanitizer(secret="redact")(ctx, spy)
    said = seen[0].request
    assert isinstance(said, ChatCompletionRequest)
    assert said.metadata == {"[SECRET]": "v", "note": "plain", "plain": "text"}
    screen = sanitizer(secret="redact").screen_aside()
    assert screened_values({f"k {GHP}": "x", "a": "b"}, screen) == {"k [SECRET]": "x",
                                                                    "a": "b"}


@pytest.mark.parametrize("field", [
    {"metadata": {KEY: "v"}}, {"metadata": {"k": f"key {KEY}"}},
])
async def test_a_block_detector_firing_beside_the_prompt_blocks(
        field: dict[str, Any]) -> None:
    """A `block` detector that fired in `metadata` (keys or values) only hid the value
    there (a placeholder) and let the request through: refused as one whose prompt
    holds it."""
    san = sanitizer(secret="block")
    ctx = context({"messages": [{"role": "user", "content": "hi"}], **field})
    with pytest.raises(InvalidRequest) as e:
        await san(ctx, Completion)  # type: ignore[arg-type]
    in_prompt = context({"messages": [{"role": "user", "content": KEY}]})
    with pytest.raises(InvalidRequest) as same:
        await san(in_prompt, Completion)  # type: ignore[arg-type]
    assert (e.value.status, e.value.code, str(e.value)) == (
        same.value.status, same.value.code, str(same.value))
    assert e.value.code == "content_policy_violation"


@pytest.mark.parametrize(("field", "value"), [
    ("user", KEY), ("safety_identifier", f"s-{GHP}"), ("prompt_cache_key", LOOK),
    ("user", "jane.doe@example.com"),
])
async def test_an_identifier_a_block_detector_fires_on_goes_on_as_its_hash(
        field: str, value: str) -> None:
    """An identifier (`user`, `safety_identifier`, `prompt_cache_key`) is no text the
    model reads: one a `block` detector fires on goes on as its SHA-256 (as OpenAI asks
    apps to send it), the request not refused; an app sending its user's address as
    `user` was refused every request where `email` blocks."""
    ctx = context({"messages": [{"role": "user", "content": "hi"}], field: value})
    seen: list[RequestContext] = []

    async def spy(c: RequestContext) -> Reply:
        seen.append(c)
        return Completion({"choices": []})

    await sanitizer(secret="block", email="block")(ctx, spy)
    said = getattr(seen[0].request, field)
    assert said == hashlib.sha256(value.encode()).hexdigest()


async def test_ordinary_caller_texts_pass_a_block_detector() -> None:
    ctx = context({"messages": [{"role": "user", "content": "hi"}], "user": "user-123",
                   "metadata": {"order": "123e4567-e89b-12d3-a456-426614174000",
                                "api_key_name": "prod"}, "prompt_cache_key": "faq-v2"})
    seen: list[RequestContext] = []

    async def spy(c: RequestContext) -> Reply:
        seen.append(c)
        return Completion({"choices": []})

    await sanitizer(secret="block", email="block")(ctx, spy)
    assert seen and not seen[0].flags


async def test_a_completion_s_stop_and_extras_are_screened_too(upstream: Upstream) -> None:
    req = CompletionRequest.model_validate({
        "model": "up-model", "prompt": "hi", "max_tokens": 5, "stop": LOOK, "user": KEY,
        "bad_words": [f"x {GHP}"],
        "stream_options": None, "extra_note": {ENCODED: [f"token {GHP}"]}})
    ctx = RequestContext(route="completion", request=req,
                         principal=Principal("t", "user", "u"), request_id="r")
    async def answer(request: web.Request) -> web.StreamResponse:
        return web.json_response({
            "id": "cmpl-1", "object": "text_completion", "created": 1, "model": "up-model",
            "choices": [{"index": 0, "text": "ok", "finish_reason": "stop", "logprobs": None}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

    upstream.chat = answer
    engine = await engine_for(upstream.base_url)
    try:
        await sanitizer(secret="redact")(ctx, engine)
    finally:
        await engine.close()
    [(_, body)] = upstream.seen
    assert body["stop"] == "[SECRET]" and leaks(body) == [], body


@pytest.mark.parametrize("body", [
    {"messages": [{"role": "user", "content": "hi", "note": "x" * 1000}]},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi",
                                                "n": ["y" * 500] * 2}]}]},
    {"messages": [{"role": "user", "content": "hi"}], "documents": [{"t": "z" * 1000}]},
    {"messages": [{"role": "user", "content": "hi"}],
     "prediction": {"type": "content", "content": "p" * 1000}},
    {"messages": [{"role": "user", "content": "hi"}], "bad_words": ["b" * 1000]},
])
async def test_what_goes_on_beside_the_prompt_counts_in_the_limit_on_what_it_reads(
        body: dict[str, Any]) -> None:
    """The fields `_forwarded` reads are read as the prompt is: 3 MB of them in one
    message's extra field held the event loop for a second, past `max_total_chars`."""
    san = SanitizerPlugin(SanitizerConfig.model_validate(
        {"detectors": {"secret": "flag"}, "limits": {"max_total_chars": 1000}}),
        Services(terminal=FakeEngine(), settings=Settings(), metrics=Metrics()))
    with pytest.raises(InvalidRequest) as e:
        await san(context(body), Completion)  # type: ignore[arg-type]
    assert (e.value.status, e.value.param, e.value.code) == (400, "messages", "invalid_value")
    small = context({"messages": [{"role": "user", "content": "hi", "note": "x" * 900}]})
    san.refuse_ahead(small)  # (not refused)


async def test_a_completion_s_extra_fields_count_in_its_limit() -> None:
    san = SanitizerPlugin(SanitizerConfig.model_validate(
        {"detectors": {"secret": "flag"}, "limits": {"max_total_chars": 1000}}),
        Services(terminal=FakeEngine(), settings=Settings(), metrics=Metrics()))
    req = CompletionRequest.model_validate({"model": "m", "prompt": "hi", "x": "y" * 1000})
    ctx = RequestContext(route="completion", request=req,
                         principal=Principal("t", "user", "u"), request_id="r")
    with pytest.raises(InvalidRequest):
        san.refuse_ahead(ctx)


def test_metadata_keys_redacted_alike_stay_apart() -> None:
    """Keys screened to one placeholder ("[EMAIL]" for two addresses) made one entry of
    the dict: every value but the last was dropped, upstream and in the stores."""
    screen = sanitizer(secret="redact", email="redact").screen_aside()
    said = screened_values({"alice@example.com": "admin", "bob@example.com": "viewer",
                            "plain": "x"}, screen)
    assert sorted(said.values()) == ["admin", "viewer", "x"]
    assert said["plain"] == "x" and "[EMAIL]" in said
    assert not any("@" in k for k in said)
    said = screened_values({KEY: "a", GHP: "b", "[SECRET]": "c"}, screen)
    assert sorted(said.values()) == ["a", "b", "c"] and said["[SECRET]"] == "c"
    assert not any(KEY in k or GHP in k for k in said)


async def test_call_ids_count_in_the_limit_on_what_it_reads() -> None:
    """Call ids are read (`_call_ids`, each once) but were not counted: a 1.5 MB id in a
    call and its answer held the event loop for seconds, past `max_total_chars`."""
    san = SanitizerPlugin(SanitizerConfig.model_validate(
        {"detectors": {"secret": "redact"}, "limits": {"max_total_chars": 1000}}),
        Services(terminal=FakeEngine(), settings=Settings(), metrics=Metrics()))

    def body(call_id: str) -> dict[str, Any]:
        return {"tools": [{"type": "function", "function": {"name": "f"}}], "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "tool_calls": [{"id": call_id, "type": "function",
                                                  "function": {"name": "f",
                                                               "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": call_id, "content": "ok"}]}

    with pytest.raises(InvalidRequest) as e:
        await san(context(body("c" * 1000)), Completion)  # type: ignore[arg-type]
    assert (e.value.status, e.value.param, e.value.code) == (400, "messages", "invalid_value")
    san.refuse_ahead(context(body("c" * 900)))  # (each id counted once: not refused)


SECRET = "the-gateway-own-secret"
EMAIL_USER = "jane.doe@example.com"


async def _digests(settings: Settings, plugins: list[dict[str, Any]] | None = None,
                   ) -> tuple[str, str]:
    """(`user`, a call id) as a sanitizer under `settings` (with `plugins` after it)
    sends on an address given as each."""
    from proxy.chain import build_plugins
    from proxy.settings import PluginSpec

    services = Services(terminal=FakeEngine(), settings=settings, metrics=Metrics())
    specs = [PluginSpec.model_validate({"name": "sanitizer", "config": {
        "detectors": {"email": "redact"}}}),
        *(PluginSpec.model_validate(p) for p in plugins or ())]
    san = build_plugins(specs, services)[0]
    ctx = context({"user": EMAIL_USER, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": EMAIL_USER, "type": "function",
            "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": EMAIL_USER, "content": "ok"}]})
    spy: list[RequestContext] = []

    async def seen(c: RequestContext) -> Reply:
        spy.append(c)
        return Completion({"choices": []})

    await san(ctx, seen)
    req = spy[0].request
    assert isinstance(req, ChatCompletionRequest)
    return str(req.user), str(req.messages[2].tool_call_id)  # type: ignore[union-attr]


def _upstream(secret: str | None) -> Settings:
    return Settings.model_validate({"engine": {
        "kind": "upstream", "base_url": "http://127.0.0.1:9/v1", "models": ["up-model"],
        "on_behalf_of_secret": secret}})


async def test_identifier_and_call_id_digests_are_keyed_by_the_gateways_secret() -> None:
    """An identifier (`user`, ...) or a call id a detector fires on went upstream as its
    plain SHA-256: an upstream could test guesses of a low-entropy one (an address from
    a known list). Where the gateway has its secret (`on_behalf_of_secret`, the one that
    keys the caller's digests and the tenant's cache salt: never sent), they are HMACs
    keyed by it, the same on every replica with that config; without one, the plain
    digest as before."""
    import hmac

    user, call = await _digests(_upstream(SECRET))
    assert user == hmac.new(SECRET.encode(), b"weir-identifier:" + EMAIL_USER.encode(),
                            hashlib.sha256).hexdigest()
    assert call == "call_" + hmac.new(SECRET.encode(), b"weir-call-id:" + EMAIL_USER.encode(),
                                      hashlib.sha256).hexdigest()[:24]
    assert hashlib.sha256(EMAIL_USER.encode()).hexdigest() not in (user, call[5:])
    assert await _digests(_upstream(SECRET)) == (user, call)  # (another replica's)
    other = await _digests(_upstream("another-gateway-secret"))
    assert other[0] != user and other[1] != call
    plain = await _digests(_upstream(None))
    assert plain[0] == hashlib.sha256(EMAIL_USER.encode()).hexdigest()
    # an in-process engine whose breaker falls back to an upstream: that one's secret
    fallback = [{"name": "breaker", "config": {"fallback": [{
        "kind": "upstream", "base_url": "http://127.0.0.1:9/v1",
        "on_behalf_of_secret": SECRET}]}}]
    assert await _digests(Settings(), fallback) == (user, call)
