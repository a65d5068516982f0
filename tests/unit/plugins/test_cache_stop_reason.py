"""vLLM's `stop_reason` and `continuous_usage_stats` through the cache: kept in entries
(and in Redis's JSON, older entries without it read as null), replayed by exact and
semantic hits and by coalesced requests alike."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

import pytest

from plugins.cache.entry import BadEntry, Entry, replay_body, replay_stream
from proxy.chain import Completion, Reply, Stream
from proxy.context import RequestContext
from proxy.preparing import prompt_tokens
from proxy.protocol import ChatCompletionRequest, CompletionRequest
from tests.fakes import FakeEngine
from tests.openai_spec import validate, validate_completion_chunk
from tests.sse import check_chat_stream
from tests.unit.plugins.test_cache import (
    Engine,
    chunks_of,
    ctx,
    l1_misses,
    plugin,
    run,
)
from tests.waiting import eventually

CONTINUOUS = {"include_usage": True, "continuous_usage_stats": True}


class StopEngine(Engine):
    """The stub engine, its answers ended by a stop string (`stop_reason`)."""

    def __init__(self, stop_reason: Any = "###", **kw: Any) -> None:
        super().__init__(**kw)
        self.stop_reason = stop_reason

    async def __call__(self, c: RequestContext) -> Reply:
        reply = await super().__call__(c)
        if isinstance(reply, Completion):
            reply.body["choices"][0]["stop_reason"] = self.stop_reason
        return reply

    async def _words(self, c: RequestContext) -> Any:
        async for chunk in super()._words(c):
            for choice in chunk["choices"]:
                if choice["finish_reason"] is not None:
                    choice["stop_reason"] = self.stop_reason
            yield chunk


def whole_stop_reason(reply: Reply) -> Any:
    assert isinstance(reply, Completion)
    if "refusal" in reply.body["choices"][0]["message"]:  # (not the stub's own answer)
        validate("CreateChatCompletionResponse", reply.body)
    return reply.body["choices"][0]["stop_reason"]


def streamed_stop_reason(reply: Reply, usage: bool = False) -> Any:
    assert isinstance(reply, Stream)
    events = chunks_of(reply)
    check_chat_stream(events, usage=usage)
    return next(c["stop_reason"] for e in events for c in e["choices"] if c["finish_reason"])


@pytest.mark.parametrize("stop_reason", ["###", 128009])
@pytest.mark.parametrize("miss_streams", [False, True])
async def test_a_semantic_hit_replays_the_stop_reason_of_its_miss(
        miss_streams: bool, stop_reason: Any) -> None:
    p, eng = plugin(semantic={"threshold": 0.8}), StopEngine(stop_reason)
    reply, layer = await run(p, ctx("How can I reset my password please?",
                                    stream=miss_streams), eng)
    assert layer == "miss"
    got = streamed_stop_reason(reply) if miss_streams else whole_stop_reason(reply)
    assert got == stop_reason
    reply, layer = await run(p, ctx("How do I reset my password please?"), eng)
    assert layer == "semantic" and whole_stop_reason(reply) == stop_reason
    reply, layer = await run(p, ctx("How do I reset my password now please?", stream=True),
                             eng)
    assert layer == "semantic" and streamed_stop_reason(reply) == stop_reason
    assert eng.calls == 1


@pytest.mark.parametrize("stream", [False, True])
async def test_coalesced_requests_get_the_leader_s_stop_reason(stream: bool) -> None:
    gate = asyncio.Event()
    p, eng = plugin(semantic={"enabled": False}), StopEngine(gate=gate)
    options = {"stream_options": CONTINUOUS} if stream else {}
    tasks = [asyncio.create_task(run(p, ctx(stream=stream, **options), eng))]
    await eng.entered.wait()
    tasks += [asyncio.create_task(run(p, ctx(stream=stream, **options), eng))
              for _ in range(2)]
    await eventually(lambda: l1_misses(p) == 3)
    gate.set()
    replies = await asyncio.gather(*tasks)
    assert eng.calls == 1 and sorted(layer for _, layer in replies) == [
        "coalesced", "coalesced", "miss"]
    for reply, layer in replies:
        if not stream:
            assert whole_stop_reason(reply) == "###"
            continue
        assert isinstance(reply, Stream)
        events = chunks_of(reply)
        # (the invariants, with each chunk's running usage set aside)
        check_chat_stream([{**e, "usage": None} if e["choices"] else e for e in events],
                          usage=True)
        ends = [c for e in events for c in e["choices"] if c["finish_reason"]]
        assert [c["stop_reason"] for c in ends] == ["###"]
        if layer == "coalesced":  # replayed: each chunk has the answer's usage
            assert [e["usage"] for e in events] == [events[-1]["usage"]] * len(events)
            assert events[-1]["usage"]["total_tokens"] == 11


def entry(**choice: Any) -> Entry:
    return Entry(key="k", route="chat", model="m", usage={"prompt_tokens": 7,
                                                          "completion_tokens": 4},
                 choices=[{"index": 0, "text": "Use the link.", "finish_reason": "stop",
                           **choice}], scope="global", tenant="t", role="user", user="u")


def chat(**kw: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **kw})


@pytest.mark.parametrize("stop_reason", ["###", 7, None])
async def test_redis_s_json_keeps_the_stop_reason(stop_reason: Any) -> None:
    back = Entry.from_json(entry(stop_reason=stop_reason).to_json(with_prompt=False))
    assert replay_body(back, chat())["choices"][0]["stop_reason"] == stop_reason
    chunks = [c async for c in replay_stream(back, chat(stream=True))]
    assert chunks[-1]["choices"][0]["stop_reason"] == stop_reason


async def test_an_entry_stored_before_stop_reason_was_kept_replays_null() -> None:
    old = entry()  # no "stop_reason" in its choice, as an older version stored it
    data = json.loads(old.to_json())
    assert "stop_reason" not in data["choices"][0]
    back = Entry.from_json(json.dumps(data))
    body = replay_body(back, chat())
    validate("CreateChatCompletionResponse", body)
    assert body["choices"][0]["stop_reason"] is None
    chunks = [c async for c in replay_stream(back, chat(stream=True))]
    assert chunks[-1]["choices"][0]["stop_reason"] is None


@pytest.mark.parametrize("bad", [True, 1.5, {"x": 1}, ["###"]])
def test_a_stored_stop_reason_of_another_type_is_a_miss(bad: Any) -> None:
    with pytest.raises(BadEntry):
        Entry.from_json(entry(stop_reason=bad).to_json())


async def test_a_replayed_completion_stream_carries_continuous_usage() -> None:
    e = entry(stop_reason="###")
    e.route = "completion"
    req = CompletionRequest.model_validate({"model": "m", "prompt": "hi", "stream": True,
                                            "stream_options": CONTINUOUS})
    chunks = [c async for c in replay_stream(e, req)]
    for c in chunks:
        validate_completion_chunk(c)
    usage = {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11}
    assert [c["usage"] for c in chunks] == [usage, usage]
    assert chunks[0]["choices"][0]["stop_reason"] == "###"


class TwoChoices:
    """A stub call_next answering two choices of unequal lengths, whole, with each
    choice's own usage counted (`Completion.usages`, as the engine's renderer leaves it)."""

    calls = 0

    async def __call__(self, c: RequestContext) -> Reply:
        self.calls += 1
        body = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
                "choices": [{"index": i, "message": {"role": "assistant", "content": text},
                             "logprobs": None, "finish_reason": "stop"}
                            for i, text in enumerate(["Use the reset link.", "Reset it."])],
                "usage": {"prompt_tokens": 7, "completion_tokens": 9, "total_tokens": 16}}
        return Completion(body, usages={0: {"prompt_tokens": 7, "completion_tokens": 6},
                                        1: {"prompt_tokens": 7, "completion_tokens": 3}})


async def test_exact_and_semantic_hits_give_each_replayed_choice_its_own_usage() -> None:
    """With `n` > 1 and `continuous_usage_stats`, a miss sends each choice's own usage in
    its chunks (one choice a chunk); a hit, exact or semantic, replays each choice with
    the usage its last chunk had then, not the answer's totals, and the totals last (the
    paraphrase's own prompt tokens: `test_cache_prompt_tokens`)."""
    p, eng = plugin(semantic={"threshold": 0.8}), TwoChoices()
    reply, layer = await run(p, ctx("How can I reset my password please?", n=2), eng)
    assert layer == "miss"
    for asked in ("How can I reset my password please?",
                  "How do I reset my password now please?"):
        c = ctx(asked, n=2, stream=True, stream_options=CONTINUOUS)
        reply, layer = await run(p, c, eng)
        assert isinstance(reply, Stream) and layer in ("exact", "semantic")
        pt = 7 if layer == "exact" else prompt_tokens(FakeEngine(), c.request)
        events = chunks_of(reply)
        own = {e["choices"][0]["index"]: e["usage"] for e in events if e["choices"]}
        assert all(len(e["choices"]) == 1 for e in events[:-1])
        assert own == {0: {"prompt_tokens": pt, "completion_tokens": 6, "total_tokens": pt + 6},
                       1: {"prompt_tokens": pt, "completion_tokens": 3, "total_tokens": pt + 3}}
        assert events[-1] == {**events[-1], "choices": [], "usage": {
            "prompt_tokens": pt, "completion_tokens": 9, "total_tokens": pt + 9}}
    assert layer == "semantic" and eng.calls == 1


async def test_redis_s_json_keeps_each_choice_s_usage_and_older_entries_share_it_out(
        ) -> None:
    """Each choice's usage survives Redis's JSON. An entry without them (an upstream's
    answer, or one stored before they were kept) shares its totals out evenly, so its
    chunks still add up to its usage chunk; a count of another type is a miss."""
    e = entry(usage={"prompt_tokens": 7, "completion_tokens": 3})
    e.choices.append({"index": 1, "text": "Reset it.", "finish_reason": "stop",
                      "usage": {"prompt_tokens": 7, "completion_tokens": 1}})
    req = chat(n=2, stream=True, stream_options=CONTINUOUS)
    back = Entry.from_json(e.to_json(with_prompt=False))
    chunks = [c async for c in replay_stream(back, req)]
    assert [c["usage"]["completion_tokens"] for c in chunks] == [3, 1, 4]
    for c in back.choices:
        del c["usage"]
    chunks = [c async for c in replay_stream(back, req)]
    assert [(c["usage"]["prompt_tokens"], c["usage"]["completion_tokens"])
            for c in chunks] == [(7, 2), (7, 2), (7, 4)]
    with pytest.raises(BadEntry):
        Entry.from_json(entry(usage={"prompt_tokens": 7, "completion_tokens": "3"}).to_json())


async def test_an_upstream_s_usage_details_are_kept_and_replayed_from_redis() -> None:
    """An upstream's `completion_tokens_details` (reasoning tokens) and
    `prompt_tokens_details` are kept with the entry, through Redis's JSON, and replayed
    whole and streamed; what is no count in them (a string, a negative) is dropped. A
    paraphrase's usage has none of its miss's prompt breakdown (another prompt's
    `cached_tokens`), whatever its own count; the answer's reasoning tokens it has."""
    from plugins.cache.entry import asked_with, captured_usage

    usage = captured_usage({"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11,
                            "prompt_tokens_details": {"cached_tokens": 6, "x": "y"},
                            "completion_tokens_details": {"reasoning_tokens": 3,
                                                          "audio_tokens": -1}})
    assert usage is not None
    back = Entry.from_json(replace(entry(), usage=usage).to_json(with_prompt=False))
    want = {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11,
            "prompt_tokens_details": {"cached_tokens": 6},
            "completion_tokens_details": {"reasoning_tokens": 3}}
    assert replay_body(back, chat())["usage"] == want
    validate("CompletionUsage", want)
    chunks = [c async for c in replay_stream(back, chat(
        stream=True, stream_options={"include_usage": True}))]
    assert chunks[-1]["usage"] == want
    for own in (5, 7):  # (fewer tokens, or as many)
        asked = replay_body(asked_with(back, own), chat())["usage"]
        assert asked == {"prompt_tokens": own, "completion_tokens": 4, "total_tokens": own + 4,
                         "completion_tokens_details": {"reasoning_tokens": 3}}
