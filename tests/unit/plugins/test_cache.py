"""Cache plugin against a stub call_next: keys, tiers, capture, replay, coalescing, scope."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from plugins.cache.config import CacheConfig
from plugins.cache.entry import Entry
from plugins.cache.keys import _EXTENSIONS, _NOT_ANSWER, _PARAMS, _params, exact_key, scope_id
from plugins.cache.l1 import L1
from plugins.cache.plugin import CachePlugin, Directives, request_directives
from plugins.cache.semantic import guard_ok
from proxy.auth import Principal
from proxy.chain import Completion, Reply, Services, Stream
from proxy.context import RequestContext
from proxy.errors import Timeout
from proxy.protocol import ChatCompletionRequest, CompletionRequest
from proxy.rendering import ChunkAssembler
from proxy.settings import Settings
from proxy.telemetry import Metrics
from tests.fakes import FakeEmbedder, FakeEngine
from tests.openai_spec import validate
from tests.sse import check_chat_stream
from tests.waiting import eventually

ALICE = Principal("acme", "user", "alice")
BOB = Principal("acme", "user", "bob")
EVE = Principal("globex", "user", "eve")
ADMIN = Principal("acme", "admin", "root")


def plugin(**cfg: Any) -> CachePlugin:
    services = Services(terminal=FakeEngine(), settings=Settings(), metrics=Metrics(),
                        embedder=FakeEmbedder())  # type: ignore[arg-type]
    return CachePlugin(CacheConfig.model_validate(cfg), services)


def ctx(content: str = "How do I reset my password?", principal: Principal = ALICE,
        headers: dict[str, str] | None = None, **kw: Any) -> RequestContext:
    body = {"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                                       {"role": "user", "content": content}],
            "temperature": 0, **kw}
    return RequestContext(route="chat", request=ChatCompletionRequest.model_validate(body),
                          principal=principal, request_id="r", headers=headers or {})


def answer(text: str = "Use the reset link.", reason: str = "stop") -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "logprobs": None, "finish_reason": reason}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11}}


class Engine:
    """A stub call_next that counts generations; optionally streams."""

    def __init__(self, text: str = "Use the reset link.", reason: str = "stop",
                 gate: asyncio.Event | None = None) -> None:
        self.calls = 0
        self.text, self.reason, self.gate = text, reason, gate
        self.no_usage = False  # (an upstream that ignores `stream_options`)
        self.entered = asyncio.Event()

    async def __call__(self, c: RequestContext) -> Reply:
        self.calls += 1
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        if not c.request.stream:
            return Completion(answer(self.text, self.reason))
        # Like every producer, the stream leaves its answer on itself when it ends.
        stream = Stream()
        return stream.attach(self._chunks(c, stream))

    async def _chunks(self, c: RequestContext,
                      stream: Stream) -> AsyncIterator[dict[str, Any]]:
        asm = ChunkAssembler(c.route)
        async for chunk in self._words(c):
            asm.feed(chunk)
            yield chunk
        asm.finish(stream)
        if stream.usage is None and not self.no_usage:
            # (as the engine and an upstream asked for it leave it: the usage is known
            # whether or not the client asked for its chunk)
            stream.usage = {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11}

    async def _words(self, c: RequestContext) -> AsyncIterator[dict[str, Any]]:
        words = self.text.split(" ")
        for i, w in enumerate(words):
            last = i == len(words) - 1
            yield {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m",
                   "choices": [{"index": 0, "delta": ({"role": "assistant"} if i == 0 else {})
                                | {"content": (" " if i else "") + w}, "logprobs": None,
                                "finish_reason": self.reason if last else None}]}
        if c.request.include_usage:
            yield {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m",
                   "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 4,
                                            "total_tokens": 11}}


CHUNKS: dict[int, list[dict[str, Any]]] = {}


async def run(p: CachePlugin, c: RequestContext, engine: Any) -> tuple[Any, str]:
    """Run one request; a Stream reply is read to the end (its chunks in `chunks_of`)."""
    reply = await p(c, engine)
    if isinstance(reply, Stream):
        CHUNKS[id(reply)] = [x async for x in reply]
    await drain(p)
    return reply, c.response_headers.get("x-weir-cache", "")


def chunks_of(reply: Stream) -> list[dict[str, Any]]:
    return CHUNKS.pop(id(reply))


def sample(p: CachePlugin, name: str, **labels: str) -> float:
    """A metric's value in the plugin's registry (0 before its first increment)."""
    return p.services.metrics.registry.get_sample_value(name, labels) or 0.0


def l1_misses(p: CachePlugin) -> float:
    return sample(p, "weir_cache_lookups_total", layer="l1", result="miss")


async def drain(p: CachePlugin) -> None:
    """Wait for the background store tasks (Redis, index) the plugin started."""
    await p.store.drain()


async def test_miss_then_exact_hit_with_age() -> None:
    p, eng = plugin(), Engine()
    _, first = await run(p, ctx(), eng)
    reply, second = await run(p, ctx(), eng)
    assert (first, second, eng.calls) == ("miss", "exact", 1)
    assert isinstance(reply, Completion)
    validate("CreateChatCompletionResponse", reply.body)
    assert reply.body["choices"][0]["message"]["content"] == "Use the reset link."
    assert reply.body["usage"]["completion_tokens"] == 4


async def test_stream_replay_has_live_shapes() -> None:
    p, eng = plugin(), Engine()
    await run(p, ctx(), eng)
    reply, layer = await run(p, ctx(stream=True, stream_options={"include_usage": True}), eng)
    assert layer == "exact" and eng.calls == 1
    # Every chunk in hand: the SSE writer sends the replay in one write.
    assert isinstance(reply, Stream) and reply.whole
    text = check_chat_stream(chunks_of(reply), usage=True)
    assert text == "Use the reset link."


async def test_streamed_miss_is_stored_when_complete() -> None:
    p, eng = plugin(), Engine()
    await run(p, ctx(stream=True), eng)
    reply, layer = await run(p, ctx(), eng)
    assert layer == "exact" and eng.calls == 1
    assert reply.body["choices"][0]["message"]["content"] == "Use the reset link."  # type: ignore[union-attr]


async def test_cancelled_stream_stores_nothing() -> None:
    p, eng = plugin(), Engine()
    reply = await p(ctx(stream=True), eng)
    assert isinstance(reply, Stream)
    it = reply.__aiter__()
    await it.__anext__()
    await reply.aclose()
    await drain(p)
    _, layer = await run(p, ctx(), eng)
    assert layer == "miss" and eng.calls == 2


@pytest.mark.parametrize(("a", "b"), [
    ("How do I reset my password?", "How  do I reset my password? "),
    ("How do I reset my password?", "Ｈｏｗ do I reset my pass\u200bword?"),
])
async def test_equivalent_prompts_share_a_key(a: str, b: str) -> None:
    assert exact_key(ctx(a), "tenant") == exact_key(ctx(b), "tenant")


def test_what_the_engine_reads_differently_has_its_own_key() -> None:
    """Blanks that change the answer are keyed: code's indentation (the engine reads the
    text's layout), and a raw completion prompt's trailing space or blank lines (they
    make other tokens to continue from). One had been served the other's answer."""
    assert exact_key(ctx("def f():\n    return 1"), "tenant") != exact_key(
        ctx("def f():\n return 1"), "tenant")

    def completion(prompt: str) -> RequestContext:
        return RequestContext(route="completions", request=CompletionRequest.model_validate(
            {"model": "m", "prompt": prompt, "temperature": 0}), principal=ALICE,
            request_id="r", headers={})

    keys = {exact_key(completion(p), "tenant") for p in (
        "The answer is", "The answer is ", "The answer is\n\n", "The  answer is")}
    assert len(keys) == 4
    assert exact_key(completion("Ｔhe answer is"), "tenant") == exact_key(
        completion("The answer is"), "tenant")  # look-alikes still fold


def test_key_keeps_the_order_of_stops_that_end_alike() -> None:
    """Stop strings are keyed in any order, except where one ends another: those end
    the answer at one character, and the engine keeps the one listed first (`["o",
    "so"]` answers "I'm s", `["so", "o"]` "I'm "), so a replay would give the other."""
    assert exact_key(ctx(stop=["a", "b"]), "tenant") == exact_key(ctx(stop=["b", "a"]),
                                                                 "tenant")
    assert exact_key(ctx(stop=["o", "so"]), "tenant") != exact_key(ctx(stop=["so", "o"]),
                                                                  "tenant")
    assert exact_key(ctx(stop=["o", "so", "x"]), "tenant") == exact_key(
        ctx(stop=["o", "so", "x"]), "tenant")


def test_key_ignores_transport_but_not_output_params() -> None:
    base = exact_key(ctx(), "tenant")
    assert exact_key(ctx(stream=True, stream_options={"include_usage": True}, user="x"),
                     "tenant") == base
    for kw in ({"max_tokens": 5}, {"stop": ["x"]}, {"presence_penalty": 1}):
        assert exact_key(ctx(**kw), "tenant") != base, kw
    sampled = exact_key(ctx(temperature=0.7), "tenant")  # (greedy decoding reads neither)
    for kw in ({"seed": 1}, {"top_p": 0.5}):
        assert exact_key(ctx(temperature=0.7, **kw), "tenant") != sampled, kw
    in_json = ctx("How do I reset my password? Reply in JSON.")
    assert exact_key(ctx("How do I reset my password? Reply in JSON.",
                         response_format={"type": "json_object"}), "tenant") != exact_key(
        in_json, "tenant")
    assert exact_key(ctx(principal=EVE), "tenant") != base
    assert exact_key(ctx(principal=BOB), "tenant") == base
    assert exact_key(ctx(principal=BOB), "user") != exact_key(ctx(), "user")


_TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {}}}]


@pytest.mark.parametrize(("route", "base", "stated", "other"), [
    ("chat", {}, {"logprobs": False, "n": 1, "presence_penalty": 0, "frequency_penalty": 0.0,
                  "logit_bias": {}, "response_format": {"type": "text"}, "top_logprobs": 0,
                  "stream_options": None, "stop": [], "ignore_eos": False, "min_tokens": 0},
     [{"presence_penalty": 0.5}, {"frequency_penalty": -1}, {"logit_bias": {"1": 5}},
      {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
      {"n": 2}, {"min_tokens": 1}]),
    ("chat", {"tools": _TOOLS}, {"tool_choice": "auto", "parallel_tool_calls": True},
     [{"tool_choice": "none"}, {"tool_choice": "required"}, {"parallel_tool_calls": False}]),
    ("completion", {}, {"echo": False, "n": 1, "best_of": 1, "suffix": "",
                        "presence_penalty": 0.0, "logit_bias": {}},
     [{"echo": True}, {"best_of": 2}, {"suffix": "."}, {"logprobs": 0},
      {"presence_penalty": 1}]),
    ("completion", {"n": 2}, {"best_of": 2}, [{"best_of": 3}]),
])
def test_a_field_stated_at_its_default_shares_the_key_of_one_left_out(
        route: str, base: dict[str, Any], stated: dict[str, Any],
        other: list[dict[str, Any]]) -> None:
    """`presence_penalty: 0`, `logit_bias: {}`, a `text` response format, `best_of`
    equal to `n` ask what leaving them out asks: each had a key of its own, and the same
    question missed. A value that changes the answer still keys apart (completions'
    `logprobs: 0` asks for the sampled token's logprob). The sampling defaults a model's
    generation config may set (temperature, top_p, ...) are not folded."""
    def key(filled: bool = True, **kw: Any) -> str:
        if route == "chat":
            return exact_key(ctx(**base, **kw), "tenant", defaults_filled=filled)
        req = CompletionRequest.model_validate(
            {"model": "m", "prompt": "Once", "temperature": 0, **base, **kw})
        return exact_key(RequestContext(route="completion", request=req, principal=ALICE,
                                        request_id="r", headers={}), "tenant",
                         defaults_filled=filled)

    left_out = key()
    assert key(**stated) == left_out
    for name, value in stated.items():
        assert key(**{name: value}) == left_out, name
    for kw in other:
        assert key(**kw) != left_out, kw
    if route == "chat" and not base:
        assert key(temperature=1.0) != key(temperature=None)  # (the model's default)
        # An upstream applies its model's own penalties to a request that leaves them out
        # (vLLM reads them from its generation config): 0 is another request there.
        assert key(False, presence_penalty=0) != key(False)
        assert key(False, logit_bias={}, response_format={"type": "text"}) == key(False)


def test_a_field_weir_does_not_know_sent_as_null_keys_as_left_out() -> None:
    """`reasoning_effort: null`, or an assistant message an SDK dumped with `audio: null`
    and `function_call: null`, asks what leaving them out asks (a server reads null as
    the default); each keyed apart. A value still keys apart."""
    base = exact_key(ctx(), "tenant")
    assert exact_key(ctx(reasoning_effort=None, verbosity=None, x_custom=None),
                     "tenant") == base
    assert exact_key(ctx(x_custom=0), "tenant") != base
    turn = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "How do I reset my password?"}]
    dumped = [*turn[:1], {**turn[1], "audio": None, "function_call": None}, *turn[2:]]
    assert exact_key(ctx(messages=dumped), "tenant") == exact_key(ctx(messages=turn),
                                                                  "tenant")
    assert exact_key(ctx(messages=[*turn[:1], {**turn[1], "x_note": "a"}, *turn[2:]]),
                     "tenant") != exact_key(ctx(messages=turn), "tenant")


async def test_penalties_at_0_share_an_entry_over_the_in_process_engine_only() -> None:
    """The plugin says whose defaults the request holds (`engine.kind`)."""
    from proxy.settings import Settings as S

    local = plugin()
    eng = Engine()
    await run(local, ctx(), eng)
    _, layer = await run(local, ctx(presence_penalty=0, frequency_penalty=0.0), eng)
    assert layer == "exact" and eng.calls == 1
    services = Services(terminal=FakeEngine(), settings=S.model_validate({"engine": {
        "kind": "upstream", "base_url": "http://127.0.0.1:1/v1", "models": ["m"]}}),
        metrics=Metrics(), embedder=FakeEmbedder())  # type: ignore[arg-type]
    relayed = CachePlugin(CacheConfig.model_validate({}), services)
    await run(relayed, ctx(), eng)
    _, layer = await run(relayed, ctx(presence_penalty=0), eng)
    assert layer == "miss" and eng.calls == 3


def test_a_schema_s_key_order_is_keyed() -> None:
    """A tool's or a response format's schema whose properties come in another order is
    another request: a forced call's or a structured answer's JSON follows its schema's
    order (as OpenAI documents), and the model reads the schema as written. The key
    sorted every object's keys, so an answer made for `{city, unit}` was replayed, its
    keys in that order, to a request whose schema says `{unit, city}`."""
    city, unit = {"type": "string"}, {"type": "string", "enum": ["c", "f"]}
    ab = {"type": "object", "properties": {"city": city, "unit": unit}}
    ba = {"type": "object", "properties": {"unit": unit, "city": city}}
    ab_outer = {"properties": {"city": city, "unit": unit}, "type": "object"}

    def tools(params: dict[str, Any]) -> RequestContext:
        return ctx(tools=[{"type": "function", "function": {"name": "w", "parameters": params}}],
                   tool_choice={"type": "function", "function": {"name": "w"}})

    def fmt(schema: dict[str, Any]) -> RequestContext:
        return ctx("Weather in Nice? JSON please.", response_format={
            "type": "json_schema", "json_schema": {"name": "w", "schema": schema}})

    for make in (tools, fmt):
        keys = [exact_key(make(s), "tenant") for s in (ab, ba, ab_outer)]
        assert len(set(keys)) == 3, make
        assert exact_key(make(ab), "tenant") == keys[0]  # (the same order: the same key)
    from plugins.cache.keys import semantic_parts
    parts = [semantic_parts(fmt(s), "tenant") for s in (ab, ba)]
    assert parts[0] is not None and parts[1] is not None
    assert parts[0][0] != parts[1][0]


def test_a_schema_s_key_order_is_keyed_in_fields_weir_does_not_know() -> None:
    """The same for a schema in a field Weir passes on without reading it (an upstream's
    `guided_json`, vLLM's structured outputs): its key order is the answer's too."""
    city, unit = {"type": "string"}, {"type": "string"}
    ab = {"type": "object", "properties": {"city": city, "unit": unit}}
    ba = {"type": "object", "properties": {"unit": unit, "city": city}}
    from plugins.cache.keys import semantic_parts
    made = [ctx("Weather in Nice? JSON please.", guided_json=s) for s in (ab, ba)]
    assert exact_key(made[0], "tenant") != exact_key(made[1], "tenant")
    parts = [semantic_parts(c, "tenant") for c in made]
    assert parts[0] is not None and parts[1] is not None
    assert parts[0][0] != parts[1][0]
    assert exact_key(ctx(guided_json=ab), "tenant") == exact_key(ctx(guided_json=ab), "tenant")


def test_an_assistant_refusal_in_the_history_is_keyed() -> None:
    """Two conversations whose earlier assistant turn refused in other words are two
    prompts (the refusal is that turn's text), and a refusal is not an empty turn."""
    def ctx(refusal: str | None, content: str | None = None) -> RequestContext:
        turns = [{"role": "user", "content": "do it"},
                 {"role": "assistant", "content": content, "refusal": refusal},
                 {"role": "user", "content": "why?"}]
        return RequestContext(route="chat", request=ChatCompletionRequest.model_validate(
            {"model": "m", "messages": turns, "temperature": 0}), principal=ALICE,
            request_id="r", headers={})

    keys = {exact_key(ctx("No."), "tenant"), exact_key(ctx("I can't."), "tenant"),
            exact_key(ctx(None, ""), "tenant"), exact_key(ctx("No.", "Sure."), "tenant"),
            exact_key(ctx(None, "Sure."), "tenant")}
    assert len(keys) == 5


def test_prompt_cache_options_change_no_key() -> None:
    """OpenAI's `prompt_cache_options` (how long OpenAI keeps a prompt's prefix) was an
    unknown field, keyed as if it changed the answer: a client sending it missed every
    entry stored without it (and each `mode` had entries of its own)."""
    def ctx(**kw: Any) -> RequestContext:
        return RequestContext(route="chat", request=ChatCompletionRequest.model_validate(
            {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0,
             **kw}), principal=ALICE, request_id="r", headers={})

    base = exact_key(ctx(), "tenant")
    for opts in ({"ttl": "30m"}, {"mode": "explicit"}, {"ttl": "30m", "mode": "implicit"}):
        assert exact_key(ctx(prompt_cache_options=opts), "tenant") == base


def test_every_field_weir_declares_is_keyed_or_said_not_to_change_the_answer() -> None:
    """A declared field is no `model_extra`, so it is keyed only where the key names it:
    one left out made two requests one key (`best_of`, which an upstream honours: the best
    of three sampled answers shared the entry of one sampled answer)."""
    keyed = {*_PARAMS, *_EXTENSIONS, *_NOT_ANSWER, "model", "messages", "prompt", "stop",
             "max_tokens", "max_completion_tokens"}  # (the last two: `output_limit`)
    for model in (ChatCompletionRequest, CompletionRequest):
        assert set(model.model_fields) - keyed == set(), model.__name__

    def completion(**kw: Any) -> RequestContext:
        return RequestContext(route="completion", request=CompletionRequest.model_validate(
            {"model": "m", "prompt": "Once", "temperature": 0.8, "seed": 1, **kw}),
            principal=ALICE, request_id="r", headers={})

    assert exact_key(completion(best_of=3), "tenant") != exact_key(completion(), "tenant")


#: vLLM's extensions the in-process engine honours, each at a value that changes the
#: answer (a chat's template controls need a final assistant message to continue).
_PREFILL = [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hi,"}]
EXTENSIONS: list[dict[str, Any]] = [
    {"stop_token_ids": [5]}, {"stop_token_ids": [6]}, {"include_stop_str_in_output": True},
    {"skip_special_tokens": False}, {"spaces_between_special_tokens": False},
    {"allowed_token_ids": [5]}, {"allowed_token_ids": [5, 6]}, {"bad_words": ["reset"]},
    {"add_generation_prompt": False},
    {"add_generation_prompt": False, "continue_final_message": True, "messages": _PREFILL},
]


def _ext_ctx(**kw: Any) -> RequestContext:
    body = {"model": "m", "messages": [{"role": "user", "content": "How do I reset it?"}],
            "temperature": 0, **kw}
    return RequestContext(route="chat", request=ChatCompletionRequest.model_validate(body),
                          principal=ALICE, request_id="r", headers={})


def test_each_vllm_extension_the_engine_honours_has_its_own_key() -> None:
    """Two requests differing only in one of them are two answers (the cache and the
    coalescing key on `exact_key`); at its default each keeps the key it had before."""
    from plugins.cache.keys import semantic_parts

    base = exact_key(_ext_ctx(), "tenant")
    keys = [exact_key(_ext_ctx(**kw), "tenant") for kw in EXTENSIONS]
    assert base not in keys and len(set(keys)) == len(keys)
    prefill = exact_key(_ext_ctx(messages=_PREFILL, add_generation_prompt=False), "tenant")
    assert prefill != keys[-1]  # continued, or a new turn after it
    defaults = {"stop_token_ids": [], "include_stop_str_in_output": False,
                "skip_special_tokens": True, "spaces_between_special_tokens": True,
                "allowed_token_ids": None, "bad_words": [], "add_generation_prompt": True,
                "continue_final_message": False}
    assert exact_key(_ext_ctx(**defaults), "tenant") == base
    # the semantic layer's partition too (a paraphrase is only served within it)
    base_part = semantic_parts(_ext_ctx(), "tenant")
    assert base_part is not None
    for kw in EXTENSIONS[:-1]:
        part = semantic_parts(_ext_ctx(**kw), "tenant")
        assert part is not None and part[0] != base_part[0], kw


def test_a_continued_final_message_is_keyed_as_a_raw_prompt() -> None:
    """Continued (`continue_final_message`), the last message's end is the prompt's end:
    "The answer is" and "The answer is " are two prompts (a trailing space makes other
    tokens), as two completion prompts are; a message not continued is keyed
    normalized, as before."""
    def prefill(text: str, continued: bool) -> str:
        msgs = [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": text}]
        return exact_key(_ext_ctx(messages=msgs, add_generation_prompt=False,
                                  continue_final_message=continued), "tenant")

    assert prefill("The answer is", True) != prefill("The answer is ", True)
    assert prefill("The answer is", False) == prefill("The answer is ", False)


def test_completion_extensions_have_their_own_key() -> None:
    def completion(**kw: Any) -> RequestContext:
        return RequestContext(route="completions", request=CompletionRequest.model_validate(
            {"model": "m", "prompt": "The answer is", "temperature": 0, **kw}),
            principal=ALICE, request_id="r", headers={})

    keys = {exact_key(completion(**kw), "tenant") for kw in [{}, *EXTENSIONS[:8]]}
    assert len(keys) == 9


@pytest.mark.parametrize("kw", EXTENSIONS, ids=lambda kw: "+".join(kw))
async def test_a_request_differing_in_a_vllm_extension_never_joins_another(
        kw: dict[str, Any]) -> None:
    """While one generation is under way, a request that differs from it only in one of
    them generates for itself, and neither is answered with the other's answer."""
    gate = asyncio.Event()
    p, eng = plugin(semantic={"enabled": False}), Engine(gate=gate)
    base_kw = {"messages": _PREFILL, "add_generation_prompt": False} if (
        "continue_final_message" in kw) else {}
    leader = asyncio.create_task(run(p, _ext_ctx(**base_kw), eng))
    await eng.entered.wait()  # held at the gate, generating
    other = asyncio.create_task(run(p, _ext_ctx(**kw), eng))
    await eventually(lambda: eng.calls == 2)  # it reached the engine: it did not wait
    gate.set()
    layers = [layer for _, layer in await asyncio.gather(leader, other)]
    assert layers == ["miss", "miss"] and sample(p, "weir_cache_coalesced_total") == 0


def test_key_holds_what_the_text_leaves_out() -> None:
    """An image (audio, a file) beside the same text, and fields Weir does not know (an
    upstream engine may honour them: `guided_choice`, `repetition_penalty`), make another
    question: one user was served the answer to another's image. Who asks and how it is
    kept (`user`, `store`, `metadata`, `safety_identifier`) still share one entry."""
    from plugins.cache.keys import semantic_parts

    def with_image(url: str) -> RequestContext:
        return ctx([{"type": "text", "text": "What is in this picture?"},  # type: ignore[arg-type]
                    {"type": "image_url", "image_url": {"url": url}}])

    text_only = exact_key(ctx("What is in this picture?"), "tenant")
    alice, bob = (exact_key(with_image(u), "tenant") for u in ("https://x/a.png",
                                                                "https://x/b.png"))
    assert len({text_only, alice, bob}) == 3
    assert exact_key(with_image("https://x/a.png"), "tenant") == alice
    assert semantic_parts(with_image("https://x/a.png"), "tenant") is None
    base = exact_key(ctx(), "tenant")
    for kw in ({"guided_choice": ["a", "b"]}, {"repetition_penalty": 1.2},
               {"chat_template_kwargs": {"x": 1}}):
        assert exact_key(ctx(**kw), "tenant") != base, kw
        parts = semantic_parts(ctx(**kw), "tenant")
        assert parts is not None and parts[0] != semantic_parts(ctx(), "tenant")[0]  # type: ignore[index]
    for kw in ({"store": True}, {"metadata": {"a": "b"}}, {"safety_identifier": "u1"},
               {"service_tier": "auto"}, {"request_id": "r-1"}, {"session_id": "s-1"}):
        assert exact_key(ctx(**kw), "tenant") == base, kw  # (vLLM's ids: a new one each)


def test_the_asker_s_name_partitions_the_semantic_layer() -> None:
    """`name` on the question is part of the prompt the model reads ("bob" asks): a
    paraphrase, or the same question, from another name (or none) is no hit."""
    from plugins.cache.keys import semantic_parts

    def named(name: str | None) -> RequestContext:
        msg: dict[str, Any] = {"role": "user", "content": "How do I reset my password?"}
        if name is not None:
            msg["name"] = name
        req = ChatCompletionRequest.model_validate(
            {"model": "m", "messages": [msg], "temperature": 0})
        return RequestContext(route="chat", request=req, principal=ALICE, request_id="r")

    parts = {n: semantic_parts(named(n), "tenant") for n in (None, "bob", "carol")}
    assert all(p is not None for p in parts.values())
    assert len({p[0] for p in parts.values() if p is not None}) == 3
    assert semantic_parts(named("bob"), "tenant") == parts["bob"]


async def test_non_deterministic_requests_bypass() -> None:
    p, eng = plugin(), Engine()
    _, layer = await run(p, ctx(temperature=1.0), eng)
    assert layer == "bypass"
    _, layer = await run(p, ctx(temperature=1.0, seed=3), eng)
    assert layer == "miss"
    _, layer = await run(p, ctx(temperature=1.0, top_p=0), eng)  # greedy decoding
    assert layer == "miss"
    wide = plugin(deterministic_only=False)
    await run(wide, ctx(temperature=1.0), eng)
    _, layer = await run(wide, ctx(temperature=1.0), eng)
    assert layer == "exact"


async def test_a_temperature_below_the_engine_s_epsilon_is_greedy() -> None:
    """Below 1e-5 the engine is sent temperature 0 (vLLM would sample it at 0.01): one
    answer, cached, and the same one temperature 0 gives, whatever the `top_p`, `top_k`,
    `min_p` or `seed` (greedy decoding reads none of them)."""
    p, eng = plugin(), Engine()
    _, layer = await run(p, ctx(temperature=1e-6), eng)
    assert layer == "miss"
    for kw in ({"temperature": 0}, {"temperature": 9.9e-6, "top_p": 0.5, "seed": 7},
               {"temperature": 0, "top_k": 3, "min_p": 0.2}, {"temperature": 1.0, "top_p": 0}):
        _, layer = await run(p, ctx(**kw), eng)
        assert layer == "exact", kw
    assert eng.calls == 1
    _, layer = await run(p, ctx(temperature=1e-5), eng)  # sampled: not cached
    assert layer == "bypass"


async def test_a_temperature_below_epsilon_with_n_is_keyed_as_sent() -> None:
    """With `n` > 1 a temperature below 1e-5 goes to an upstream as it is (vLLM refuses
    temperature 0 there, and samples it at 0.01, reading `seed`, `top_p`, `top_k`):
    such a request is no greedy one to the cache, keyed by what it sent."""
    p, eng = plugin(), Engine()
    _, layer = await run(p, ctx(temperature=1e-6, n=2, seed=1), eng)
    assert layer == "miss"
    for kw in ({"seed": 2}, {"temperature": 0}, {"seed": 1, "top_k": 3}):
        _, layer = await run(p, ctx(**{"temperature": 1e-6, "n": 2, **kw}), eng)
        assert layer == "miss", kw
    _, layer = await run(p, ctx(temperature=1e-6, n=2), eng)  # sampled, unseeded
    assert layer == "bypass"
    for kw in ({"temperature": 0, "seed": 5},  # greedy on any engine: temperature 0's
               {"top_p": 0, "temperature": 1e-6, "top_k": 3}):
        _, layer = await run(p, ctx(n=2, **kw), eng)
        assert layer == "exact", kw


async def test_stale_fallback_looks_up_only_what_could_have_been_stored() -> None:
    p, eng = plugin(stale_grace_s=60), Engine()
    await run(p, ctx(), eng)
    lookups: list[str] = []
    real = p.store.get

    async def counted(key: str, scope: str, allow_stale: bool = False,
                      max_age: float | None = None) -> Any:
        lookups.append(key)
        return await real(key, scope, allow_stale, max_age)

    p.store.get = counted  # type: ignore[method-assign]
    hit = await p.stale(ctx())
    assert hit is not None and hit.headers["x-weir-cache"] == "stale" and len(lookups) == 1
    # Sampled, or asking not to be served from the cache: not a lookup at all.
    assert await p.stale(ctx(temperature=1.0)) is None
    assert await p.stale(ctx(headers={"cache-control": "no-cache"})) is None
    assert len(lookups) == 1


async def test_cache_control_headers() -> None:
    p, eng = plugin(), Engine()
    await run(p, ctx(headers={"cache-control": "no-store"}), eng)
    _, layer = await run(p, ctx(), eng)
    assert layer == "miss"  # nothing was stored
    _, layer = await run(p, ctx(headers={"cache-control": "no-cache"}), eng)
    assert layer == "bypass" and eng.calls == 3  # read skipped though an entry exists
    _, layer = await run(p, ctx(), eng)
    assert layer == "exact"
    _, layer = await run(p, ctx(headers={"cache-control": "no-cache, no-store"}), eng)
    assert layer == "bypass" and eng.calls == 4


@pytest.mark.parametrize(("headers", "stored"), [
    ({"cache-control": "max-age=0"}, True), ({"cache-control": "no-store, max-age=0"}, False),
    ({"pragma": "no-cache"}, True), ({"cache-control": 'max-age="0"'}, True),
    ({"cache-control": "max-age=-1"}, True),
])
async def test_directives_that_skip_the_read(headers: dict[str, str], stored: bool) -> None:
    """`max-age=0` (any answer is too old) and, without Cache-Control, HTTP/1.0's
    `Pragma: no-cache` skip the read as `no-cache` does (a `bypass`): the answer is stored
    in place of the old one unless `no-store` says otherwise."""
    p, eng = plugin(), Engine()
    await run(p, ctx(), eng)
    key, scope = exact_key(ctx(), p.cfg.scope), scope_id(ALICE, p.cfg.scope)
    old = await p.store.get(key, scope)
    assert old is not None
    old.created -= 1000
    stamp = old.created
    _, layer = await run(p, ctx(headers=headers), eng)
    assert layer == "bypass" and eng.calls == 2
    entry = await p.store.get(key, scope)
    assert entry is not None
    assert (entry.created > stamp + 500) if stored else (entry.created == stamp)


@pytest.mark.parametrize("headers", [
    {"cache-control": "max-age=abc"}, {"cache-control": "max-stale"},
    {"pragma": "no-cache", "cache-control": "max-age=60"},  # Cache-Control wins
])
async def test_directives_that_still_read(headers: dict[str, str]) -> None:
    p, eng = plugin(), Engine()
    await run(p, ctx(), eng)
    _, layer = await run(p, ctx(headers=headers), eng)
    assert layer == "exact" and eng.calls == 1


@pytest.mark.parametrize(("headers", "expected"), [
    ({}, Directives()),
    ({"cache-control": "max-age = 60"}, Directives(max_age=60)),
    ({"cache-control": "Max-Age=60, MAX-AGE=30"}, Directives(max_age=30)),
    ({"cache-control": "no-store,no-cache"}, Directives(read=False, write=False)),
    ({"cache-control": "only-if-cached"}, Directives(only_if_cached=True)),
    ({"cache-control": "max-stale=5, min-fresh=3, no-transform"}, Directives()),
    ({"cache-control": "  ", "pragma": "no-cache"}, Directives(read=False)),
    ({"cache-control": "max-age=10", "pragma": "no-cache"}, Directives(max_age=10)),
])
def test_request_directives(headers: dict[str, str], expected: Directives) -> None:
    assert request_directives(headers) == expected


async def test_only_if_cached_answers_from_the_cache_or_504() -> None:
    """`only-if-cached`: a stored answer (exact or a paraphrase's), else a 504
    `not_cached`, never a generation, also when the request could never be cached."""
    p, eng = plugin(semantic={"threshold": 0.8}), Engine()
    only = {"cache-control": "only-if-cached"}
    for c, said in ((ctx(headers=only), "miss"), (ctx(headers=only, temperature=1.0), "bypass"),
                    (ctx(headers={"cache-control": "only-if-cached, no-cache"}), "bypass")):
        with pytest.raises(Timeout) as e:
            await run(p, c, eng)
        assert e.value.status == 504 and e.value.code == "not_cached"
        # (an error's answer carries the chain's headers: it had none)
        assert c.response_headers.get("x-weir-cache") == said
    assert eng.calls == 0
    await run(p, ctx("How can I reset my password please?"), eng)
    _, layer = await run(p, ctx("How can I reset my password please?", headers=only), eng)
    assert layer == "exact"
    _, layer = await run(p, ctx("How do I reset my password please?", headers=only), eng)
    assert layer == "semantic" and eng.calls == 1


async def test_max_age_serves_only_answers_young_enough() -> None:
    """`max-age=N`: an answer older than N seconds is not served (a miss generates and
    stores a fresh one); one young enough is, and the stale fallback honours it too."""
    p, eng = plugin(semantic={"enabled": False}, stale_grace_s=600), Engine()
    await run(p, ctx(), eng)
    key, scope = exact_key(ctx(), p.cfg.scope), scope_id(ALICE, p.cfg.scope)
    old = await p.store.get(key, scope)
    assert old is not None
    old.created -= 120  # two minutes old
    young = {"cache-control": "max-age=60"}
    _, layer = await run(p, ctx(headers={"cache-control": "max-age=600"}), eng)
    assert layer == "exact" and eng.calls == 1  # old enough for this client
    _, layer = await run(p, ctx(headers=young), eng)
    assert layer == "miss" and eng.calls == 2
    _, layer = await run(p, ctx(headers=young), eng)
    assert layer == "exact" and eng.calls == 2  # the fresh answer was stored
    entry = await p.store.get(key, scope)
    assert entry is not None
    entry.created -= 120
    assert await p.stale(ctx(headers=young)) is None
    assert await p.stale(ctx(headers={"cache-control": "max-age=600"})) is not None


async def test_max_age_applies_to_paraphrases() -> None:
    p, eng = plugin(semantic={"threshold": 0.8}), Engine()
    asked = "How can I reset my password please?"
    await run(p, ctx(asked), eng)
    old = await p.store.get(exact_key(ctx(asked), p.cfg.scope), scope_id(ALICE, p.cfg.scope))
    assert old is not None
    old.created -= 120
    for part in p.store.index.partitions.values():  # (the semantic layer's own copy)
        for held, _ in part.entries.values():
            held.created -= 120
    paraphrase = "How do I reset my password please?"
    _, layer = await run(p, ctx(paraphrase, headers={"cache-control": "max-age=60"}), eng)
    assert layer == "miss" and eng.calls == 2
    _, layer = await run(p, ctx("How do I reset my password, please?",
                                headers={"cache-control": "max-age=60"}), eng)
    assert layer == "semantic" and eng.calls == 2  # the fresh paraphrase's answer


async def test_sensitive_and_injection() -> None:
    p, eng = plugin(sensitive_patterns=[r"(?i)password"]), Engine()
    await run(p, ctx(), eng)
    _, layer = await run(p, ctx(), eng)
    assert layer == "bypass" and eng.calls == 2
    q = plugin()
    c = ctx()
    c.sensitive = True
    _, layer = await run(q, c, eng)
    assert layer == "bypass"
    c = ctx()
    c.flags.add("injection")
    await run(q, c, eng)
    _, layer = await run(q, ctx(), eng)
    assert layer == "miss"  # the injection-flagged answer was not written


_CALLED = [{"role": "user", "content": "What should I do next?"},
           {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {
               "name": "lookup", "arguments": '{"diagnosis": "x"}'}}]},
           {"role": "tool", "tool_call_id": "c1", "content": "found"}]
_TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}}}}}]


@pytest.mark.parametrize("kw", [
    {"messages": _CALLED},  # an earlier call's arguments
    {"messages": _CALLED[:1], "tools": [{"type": "function", "function": {
        "name": "lookup", "description": "Looks up a diagnosis."}}]},  # a tool's text
    {"messages": [{"role": "user", "name": "diagnosis", "content": "Hi"}]},  # a name
    {"messages": _CALLED[:1], "tools": _TOOLS, "tool_choice": {
        "type": "function", "function": {"name": "lookup"}}, "response_format": {
            "type": "json_schema", "json_schema": {"name": "diagnosis_form"}}},
])
async def test_a_sensitive_pattern_anywhere_the_model_reads_bypasses(kw: dict[str, Any],
                                                                      ) -> None:
    """`sensitive_patterns` read the messages' text only: a match in an earlier call's
    arguments, a tool's definition, a speaker's name or the response format (all read
    by the model) was cached and served."""
    p, eng = plugin(sensitive_patterns=[r"(?i)diagnosis"]), Engine()
    for _ in range(2):
        _, layer = await run(p, _ext_ctx(**kw), eng)
        assert layer == "bypass"
    assert eng.calls == 2


@pytest.mark.parametrize(("text", "reason", "cfg", "stored"), [
    ("fine", "stop", {}, True),
    ("cut off", "length", {}, False),
    ("cut off", "length", {"store_truncated": True}, True),
    ("   ", "stop", {}, False),
])
async def test_what_is_stored(text: str, reason: str, cfg: dict[str, Any], stored: bool) -> None:
    p, eng = plugin(**cfg), Engine(text, reason)
    await run(p, ctx(), eng)
    _, layer = await run(p, ctx(), eng)
    assert (layer == "exact") is stored


async def test_errors_and_fallbacks_are_not_stored() -> None:
    p = plugin()

    async def boom(c: RequestContext) -> Reply:
        raise RuntimeError("engine down")

    with pytest.raises(RuntimeError):
        await p(ctx(), boom)

    async def fallback(c: RequestContext) -> Reply:
        return Completion(answer("degraded"), headers={"x-weir-fallback": "static"})

    await run(p, ctx(), fallback)  # type: ignore[arg-type]
    _, layer = await run(p, ctx(), Engine())
    assert layer == "miss"


@pytest.mark.parametrize("reason", ["stop", "length"])
@pytest.mark.parametrize("stream", [False, True])
async def test_concurrent_identical_misses_coalesce(stream: bool, reason: str) -> None:
    """An answer cut by max_tokens is not stored (store_truncated is off), but the
    requests waiting on it take it all the same: it is what each would generate (the
    same key, max_tokens included). They used to generate anew after the wait."""
    gate = asyncio.Event()
    # Exact layer only: a request's last step before it joins a leader is its L1 miss.
    p, eng = plugin(semantic={"enabled": False}), Engine(reason=reason, gate=gate)

    layers: list[str] = []

    async def one() -> str:
        reply, layer = await run(p, ctx(stream=stream), eng)
        layers.append(layer)
        if isinstance(reply, Stream):
            return check_chat_stream(chunks_of(reply))
        return reply.body["choices"][0]["message"]["content"]  # type: ignore[no-any-return]

    tasks = [asyncio.create_task(one())]
    await eng.entered.wait()  # the leader is generating, held at the gate
    tasks += [asyncio.create_task(one()) for _ in range(7)]
    await eventually(lambda: l1_misses(p) == 8)  # every follower has looked up and missed
    # The followers wait for the leader: none has an answer or has reached the engine.
    assert eng.calls == 1 and not any(t.done() for t in tasks)
    assert sample(p, "weir_cache_coalesced_total") == 0
    gate.set()
    texts = await asyncio.gather(*tasks)
    assert eng.calls == 1 and set(texts) == {"Use the reset link."}
    assert sample(p, "weir_cache_coalesced_total") == 7  # answered by the leader's generation
    assert sorted(layers) == ["coalesced"] * 7 + ["miss"]  # the header says which
    _, layer = await run(p, ctx(stream=stream), eng)  # stored only if whole
    assert layer == ("exact" if reason == "stop" else "miss")


class FailingLeader:
    """A call_next whose first call (the leader) waits at `gate`, then raises `error`;
    the later ones answer once `later` is set."""

    def __init__(self, error: Exception) -> None:
        self.error, self.calls = error, 0
        self.entered, self.gate, self.later = (asyncio.Event(), asyncio.Event(),
                                               asyncio.Event())

    async def __call__(self, c: RequestContext) -> Reply:
        self.calls += 1
        self.entered.set()
        if self.calls == 1:
            await self.gate.wait()
            raise self.error
        await self.later.wait()
        return Completion(answer())


async def test_a_failed_leader_lets_followers_generate() -> None:
    p = plugin(semantic={"enabled": False})
    flaky = FailingLeader(RuntimeError("leader failed"))
    flaky.later.set()
    leader = asyncio.create_task(p(ctx(), flaky))
    await flaky.entered.wait()
    follower = asyncio.create_task(p(ctx(), flaky))
    await eventually(lambda: l1_misses(p) == 2)  # the follower missed and joined the leader
    assert flaky.calls == 1 and not follower.done()
    flaky.gate.set()
    with pytest.raises(RuntimeError):
        await leader
    assert isinstance(await follower, Completion) and flaky.calls == 2  # it generated
    assert sample(p, "weir_cache_coalesced_total") == 0


async def test_a_leader_past_its_own_deadline_hands_the_lead_to_a_follower() -> None:
    """The leader's deadline is its own (`x-weir-timeout-ms`), not the question's: a
    follower takes the lead and its answer is stored (each follower generated for itself,
    and nothing was stored)."""
    from proxy.errors import DeadlineExceeded

    p = plugin(semantic={"enabled": False})
    slow = FailingLeader(DeadlineExceeded("The request did not finish within its deadline."))
    leader = asyncio.create_task(p(ctx(), slow))
    await slow.entered.wait()
    followers = [asyncio.create_task(p(ctx(), slow)) for _ in range(3)]
    await eventually(lambda: l1_misses(p) == 4)
    slow.gate.set()
    with pytest.raises(DeadlineExceeded):
        await leader
    await eventually(lambda: slow.calls >= 2)  # the new leader is generating
    slow.later.set()
    replies = await asyncio.gather(*followers)
    assert all(isinstance(r, Completion) for r in replies)
    assert slow.calls == 2  # one follower generated; the others took its answer
    assert sample(p, "weir_cache_coalesced_total") == 2
    _, layer = await run(p, ctx(), Engine())
    assert layer == "exact"


async def test_semantic_hit_within_scope_only() -> None:
    p, eng = plugin(semantic={"threshold": 0.8}), Engine()
    await run(p, ctx("How can I reset my password please?"), eng)
    _, layer = await run(p, ctx("How do I reset my password please?"), eng)
    assert layer == "semantic" and eng.calls == 1
    _, layer = await run(p, ctx("How do I reset my password please?", principal=EVE), eng)
    assert layer == "miss"  # another tenant: another partition
    _, layer = await run(p, ctx("How do I reset my password please?", max_tokens=9), eng)
    assert layer == "miss"  # other parameters: another partition


async def test_semantic_guard_refuses_changed_numbers() -> None:
    p, eng = plugin(semantic={"threshold": 0.5}), Engine()
    await run(p, ctx("please cancel my order 123 now"), eng)
    _, layer = await run(p, ctx("please cancel my order 456 now"), eng)
    assert layer == "miss"
    assert not guard_ok("I can log in", "I cannot log in")
    assert not guard_ok("Flights from Paris to London", "Flights from London to Paris")
    assert guard_ok("How do I reset my password?", "How can I reset my password?")


async def test_per_user_cap_evicts_the_oldest() -> None:
    p, eng = plugin(per_user_max_entries=2, semantic={"enabled": False}), Engine()
    for q in ("first question here", "second question here", "third question here"):
        await run(p, ctx(q), eng)
    _, layer = await run(p, ctx("third question here"), eng)
    assert layer == "exact"
    _, layer = await run(p, ctx("second question here", principal=BOB), eng)
    assert layer == "exact"  # bob reads alice's entry (same tenant scope)
    _, layer = await run(p, ctx("first question here"), eng)
    assert layer == "miss"  # evicted: alice owns at most 2


async def test_one_key_keeps_an_faq_past_a_thousand_questions() -> None:
    """An app behind one API key owns every entry it stores: the default cap must hold a
    busy FAQ (the FAQ benchmark asks ~3,000 distinct questions in a 15 s window; a cap
    of 1,000 turned a third of its repeats into misses)."""
    p, eng = plugin(semantic={"enabled": False}), Engine()
    questions = [f"How do I change the invoice settings for team {i}?" for i in range(3000)]
    for q in questions:
        await run(p, ctx(q), eng)
    await drain(p)
    _, layer = await run(p, ctx(questions[0]), eng)
    assert layer == "exact" and eng.calls == len(questions)


async def test_local_purge_by_content() -> None:
    from plugins.cache.entry import matcher

    p, eng = plugin(), Engine()
    await run(p, ctx("tell me about the acme merger"), eng)
    await run(p, ctx("unrelated question entirely"), eng)
    l1, _ = p.store.purge_local(matcher({"contains": "ACME"}))
    assert l1 == 1
    _, layer = await run(p, ctx("tell me about the acme merger"), eng)
    assert layer == "miss"
    _, layer = await run(p, ctx("unrelated question entirely"), eng)
    assert layer == "exact"


async def test_completions_are_cached_too() -> None:
    p = plugin()

    async def eng(c: RequestContext) -> Reply:
        return Completion({"id": "cmpl-1", "object": "text_completion", "created": 1,
                           "model": "m", "choices": [{"index": 0, "text": "hi",
                                                      "logprobs": None, "finish_reason": "stop"}],
                           "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                     "total_tokens": 2}})

    c1 = RequestContext(route="completion", principal=ALICE, request_id="r",
                        request=CompletionRequest.model_validate(
                            {"model": "m", "prompt": "x", "temperature": 0}))
    await run(p, c1, eng)  # type: ignore[arg-type]
    c2 = RequestContext(route="completion", principal=ALICE, request_id="r",
                        request=CompletionRequest.model_validate(
                            {"model": "m", "prompt": "x", "temperature": 0}))
    reply, layer = await run(p, c2, eng)  # type: ignore[arg-type]
    assert layer == "exact"
    validate("CreateCompletionResponse", reply.body)  # type: ignore[union-attr]


def entry(key: str, size_text: str = "x", expires: float = 100.0) -> Entry:
    return Entry(key=key, route="chat", model="m", scope="s", tenant="t", role="r", user="u",
                 prompt="p", usage={"prompt_tokens": 1, "completion_tokens": 1},
                 choices=[{"index": 0, "text": size_text, "finish_reason": "stop"}],
                 created=0.0, expires=expires, stale_until=expires + 50)


def test_l1_is_bounded_in_bytes_and_lru() -> None:
    l1 = L1(max_bytes=300)
    for k in "abc":
        l1.put(entry(k), 100)
    assert l1.get("a", 1.0) is not None  # a is now the most recent
    l1.put(entry("d"), 100)
    assert l1.get("b", 1.0) is None and l1.get("a", 1.0) is not None
    assert l1.bytes <= 300
    l1.put(entry("huge"), 1000)
    assert l1.get("huge", 1.0) is None


def test_l1_ttl_and_stale_grace() -> None:
    l1 = L1(max_bytes=10_000)
    l1.put(entry("k", expires=10.0), 10)
    assert l1.get("k", 5.0) is not None
    assert l1.get("k", 20.0) is None
    assert l1.get("k", 20.0, allow_stale=True) is not None
    assert l1.get("k", 70.0, allow_stale=True) is None and len(l1) == 0


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        CacheConfig.model_validate({"l2": {"enabled": True}})
    with pytest.raises(ValueError):
        CacheConfig.model_validate({"scope": "planet"})
    with pytest.raises(ValueError):
        CacheConfig.model_validate({"sensitive_patterns": ["("]})


async def test_semantic_hit_is_promoted_to_an_exact_alias() -> None:
    p, eng = plugin(semantic={"threshold": 0.8}), Engine()
    await run(p, ctx("How can I reset my password please?"), eng)
    _, layer = await run(p, ctx("How do I reset my password please?"), eng)
    assert layer == "semantic"
    calls = p.embedder.calls  # type: ignore[union-attr]
    _, layer = await run(p, ctx("How do I reset my password please?"), eng)
    assert layer == "exact" and p.embedder.calls == calls  # type: ignore[union-attr]
    from plugins.cache.entry import matcher

    p.store.purge_local(matcher({"contains": "can I reset"}))  # the original's text
    _, layer = await run(p, ctx("How do I reset my password please?",
                                headers={"cache-control": "no-store"}), eng)
    assert layer == "miss"  # the alias went with the original


_M = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("body", [
    {"model": "m", "messages": _M},
    {"model": "m", "messages": _M, "temperature": 0, "seed": 3, "logit_bias": {"1": 2.0},
     "stop": ["b", "a"], "logprobs": True, "top_logprobs": 2, "echo": True},
    {"model": "m", "messages": _M, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object"}, "strict": None}},
     "tools": [{"type": "function", "function": {"name": "f", "parameters": {}, "x": 1}}],
     "tool_choice": {"type": "function", "function": {"name": "f"}},
     "parallel_tool_calls": False},
    {"model": "m", "messages": _M, "tools": [{"type": "function", "function": {"name": "f"}}],
     "tool_choice": "required"},
    {"model": "m", "prompt": "x", "suffix": "s", "logprobs": 2, "echo": True, "best_of": 2},
    {"model": "m", "prompt": [1, 2], "top_k": 5, "min_tokens": 1, "ignore_eos": True},
    {"model": "m", "messages": _M, "min_p": 0.1, "repetition_penalty": 1.2},
    # vLLM's extensions at their defaults: the key an earlier version gave
    {"model": "m", "messages": _M, "stop_token_ids": [], "skip_special_tokens": True,
     "add_generation_prompt": True, "bad_words": [], "include_stop_str_in_output": False},
])
def test_key_params_are_the_whole_model_dump(body: dict[str, Any]) -> None:
    """The key's parameters, read field by field, are what a whole-model dump gave (keys
    written by an earlier version, in a shared Redis, stay valid)."""
    model = ChatCompletionRequest if "messages" in body else CompletionRequest
    req = model.model_validate(body)
    want = req.model_dump(include=set(_PARAMS), exclude_none=True, by_alias=True)
    want.update(stop=sorted(req.stops), max_tokens=req.output_limit)
    assert _params(req) == want


def _sensitive_ctx() -> RequestContext:
    c = ctx()
    c.sensitive = True  # the sanitizer found personal data
    return c


TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(("kind", "make"), [
    ("sensitive", _sensitive_ctx),
    ("matches a sensitive pattern", lambda: ctx("My card PIN is 1234, what now?")),
    ("sampled", lambda: ctx(temperature=0.9)),
    ("no-cache, no-store", lambda: ctx(headers={"cache-control": "no-cache, no-store"})),
    ("offers tools", lambda: ctx(tools=[TOOL])),
    ("a tool turn", lambda: ctx(messages=[
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "lookup", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "Sunny"}])),
    ("too long", lambda: ctx("How do I reset my password? " * 100)),
    ("too short", lambda: ctx("Hi?")),
    ("a completion", lambda: RequestContext(
        route="completion", principal=ALICE, request_id="r",
        request=CompletionRequest.model_validate(
            {"model": "m", "prompt": "How do I reset my password?", "temperature": 0}))),
])
async def test_what_the_semantic_layer_can_never_serve_is_never_embedded(
        kind: str, make: Any) -> None:
    """Asked twice (a lookup, a store, a second lookup), with every miss embedded at once
    (no lazy vectors): the embedder never runs. The same question asked plainly is."""
    p = plugin(sensitive_patterns=[r"(?i)\bPIN\b"], semantic={"lazy": False})
    assert p.embedder is not None
    for _ in range(2):
        await run(p, make(), Engine())
    assert p.embedder.calls == 0, kind  # type: ignore[attr-defined]
    await run(p, ctx(), Engine())
    assert p.embedder.calls > 0  # type: ignore[attr-defined]


def per_request(p: CachePlugin) -> tuple[float, float]:
    return (sample(p, "weir_cache_lookups_total", layer="all", result="hit"),
            sample(p, "weir_cache_lookups_total", layer="all", result="miss"))


async def test_layer_all_counts_each_request_once_hit_or_miss() -> None:
    """`layer="all"` (the README's, what a hit ratio is alerted on) was emitted only for a
    bypass: a request's hit or miss was spread over l1, l2 and semantic, where a
    semantic hit is also an l1 miss."""
    p, eng = plugin(semantic={"threshold": 0.8}), Engine()
    _, layer = await run(p, ctx("How can I reset my password please?"), eng)
    assert layer == "miss" and per_request(p) == (0, 1)
    _, layer = await run(p, ctx("How can I reset my password please?"), eng)
    assert layer == "exact" and per_request(p) == (1, 1)  # an L1 hit
    _, layer = await run(p, ctx("How do I reset my password please?"), eng)
    assert layer == "semantic" and per_request(p) == (2, 1)
    assert sample(p, "weir_cache_lookups_total", layer="l1", result="miss") == 2
    _, layer = await run(p, ctx("Where is your office located?"), eng)
    assert layer == "miss" and per_request(p) == (2, 2)
    # a request that does not read the cache is no lookup: a bypass, or nothing
    await run(p, ctx("Where is your office located?", temperature=0.7), eng)
    await run(p, ctx("Where is your office located?", headers={"cache-control": "no-cache"}),
              eng)
    assert per_request(p) == (2, 2)
    assert sample(p, "weir_cache_lookups_total", layer="all", result="bypass") == 1


@pytest.mark.parametrize("word", ["diag\u200bnosis",  # a zero-width space
                                  "\uff44\uff49\uff41\uff47\uff4e\uff4f\uff53\uff49\uff53"])
@pytest.mark.parametrize("where", ["message", "arguments", "tool", "suffix"])
async def test_a_sensitive_pattern_reads_every_part_as_it_reads_the_messages(
        word: str, where: str) -> None:
    """The messages' text is read normalized (a zero-width space dropped, full-width
    letters folded), so a pattern is not dodged there; what else the model reads (an
    earlier call's arguments, a tool's definition, a completion's suffix) was read raw,
    so the same spelling there was cached and served."""
    if where == "suffix":
        c = RequestContext(route="completion", request=CompletionRequest.model_validate(
            {"model": "m", "prompt": "Once", "suffix": f"a {word}", "temperature": 0}),
            principal=ALICE, request_id="r", headers={})
    else:
        kw: dict[str, Any] = {
            "message": {"messages": [{"role": "user", "content": f"My {word}?"}]},
            "arguments": {"messages": [_CALLED[0], {**_CALLED[1], "tool_calls": [{
                "id": "c1", "type": "function", "function": {
                    "name": "lookup", "arguments": json.dumps({"q": word},
                                                              ensure_ascii=False)}}]},
                _CALLED[2]]},
            "tool": {"messages": _CALLED[:1], "tools": [{"type": "function", "function": {
                "name": "lookup", "description": f"Looks up a {word}."}}]},
        }[where]
        c = _ext_ctx(**kw)
    p, eng = plugin(sensitive_patterns=[r"(?i)diagnosis"]), Engine()
    _, layer = await run(p, c, eng)
    assert layer == "bypass"


def test_names_holding_a_separator_keep_their_own_cache_scope() -> None:
    """Tenant `a;u=b` (scope `tenant`) and tenant `a` with user `b` (scope `user`) were one
    scope string, `t=a;u=b`; and tenant `a;u=b` user `c` against tenant `a` user
    `b;u=c`. Every name is escaped, so each caller's scope is its own."""
    from proxy.auth import Principal

    assert scope_id(Principal("a;u=b", "user", "x"), "tenant") != scope_id(
        Principal("a", "user", "b"), "user")
    assert scope_id(Principal("a;u=b", "user", "c"), "user") != scope_id(
        Principal("a", "user", "b;u=c"), "user")
    assert scope_id(Principal("acme", "user", "alice@example.com"), "user") == (
        "t=acme;u=alice@example.com")


def test_text_parts_and_the_text_they_join_to_are_two_keys() -> None:
    """A message's text parts reach the model as the engine joins them: glued, where the
    chat template walks the parts itself ("a" + "b" reads "ab"), one a line elsewhere.
    The key joined them one a line whatever the model, so parts `["a", "b"]` and the
    string "a\\nb" shared an entry on a model that read them as two prompts."""
    def parts(*texts: str) -> list[dict[str, str]]:
        return [{"type": "text", "text": t} for t in texts]

    def key(content: Any) -> str:
        return exact_key(ctx(content), "tenant")

    assert key(parts("Hello", "world")) != key("Hello\nworld")
    assert key(parts("Hello", "world")) != key(parts("Hello\nworld"))
    assert key(parts("Hello", "world")) == key(parts("Hello", "world"))
    assert key(parts("Hello world")) == key("Hello world")  # one part reads as its text


@pytest.mark.parametrize("stream", [True, False])
async def test_an_answer_that_came_without_its_usage_is_not_stored(stream: bool) -> None:
    """An upstream that ignores `stream_options` (or sends a whole answer without
    `usage`) leaves no usage: stored as 0 tokens, every hit on it said it took none (a
    rate limit and a bill counting nothing). Not stored: the next answer, with its usage,
    is; and a hit carries the usage of the answer it replays."""
    p = plugin()

    class NoUsage(Engine):
        async def __call__(self, c: RequestContext) -> Reply:
            reply = await super().__call__(c)
            if isinstance(reply, Completion):
                del reply.body["usage"]
            return reply

        async def _words(self, c: RequestContext) -> AsyncIterator[dict[str, Any]]:
            async for chunk in super()._words(c):
                if chunk["choices"]:  # (no usage chunk, asked for or not)
                    yield chunk

    eng = NoUsage()
    eng.no_usage = True
    await run(p, ctx(stream=stream), eng)
    reply, layer = await run(p, ctx(stream=True, stream_options={"include_usage": True}), eng)
    assert layer == "miss" and eng.calls == 2
    if isinstance(reply, Stream):
        assert not reply.usage or reply.usage["completion_tokens"] > 0
    good = Engine()
    await run(p, ctx(), good)
    reply, layer = await run(p, ctx(stream=True, stream_options={"include_usage": True}), good)
    assert layer == "exact" and good.calls == 1
    usage = chunks_of(reply)[-1]["usage"]
    assert usage["completion_tokens"] > 0 and usage["prompt_tokens"] > 0
