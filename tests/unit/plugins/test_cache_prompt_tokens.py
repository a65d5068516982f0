"""A hit's `usage.prompt_tokens` is the asker's prompt, as a miss of it counts it: a
semantic hit answers a paraphrase, whose prompt is not the stored question's; an exact
hit (or a wait on an identical generation) may answer another prompt too, one the key
reads as the same (other spaces, look-alike letters)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from proxy.chain import Completion, Reply, Stream
from proxy.context import RequestContext
from proxy.preparing import prompt_tokens
from proxy.protocol import CompletionRequest
from tests.fakes import FakeEngine
from tests.unit.plugins.test_cache import chunks_of, ctx, l1_misses, plugin, run
from tests.waiting import eventually

CONTINUOUS = {"include_usage": True, "continuous_usage_stats": True}
ASKED = "How can I reset my password please?"
PARAPHRASE = "How do I reset my password now please?"


def counted(c: RequestContext) -> int:
    """The prompt's tokens as the engine reads them (the plugin's terminal: FakeEngine)."""
    return prompt_tokens(FakeEngine(), c.request)


class Counting:
    """A stub call_next answering two choices whole, counting the prompt as a miss does."""

    calls = 0
    gate: asyncio.Event | None = None

    async def __call__(self, c: RequestContext) -> Reply:
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        n = counted(c)
        body = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
                "choices": [{"index": i, "message": {"role": "assistant", "content": text},
                             "logprobs": None, "finish_reason": "stop"}
                            for i, text in enumerate(["Use the reset link.", "Reset it."])],
                "usage": {"prompt_tokens": n, "completion_tokens": 9, "total_tokens": n + 9}}
        return Completion(body, usages={0: {"prompt_tokens": n, "completion_tokens": 6},
                                        1: {"prompt_tokens": n, "completion_tokens": 3}})


@pytest.mark.parametrize("stream", [False, True])
async def test_a_semantic_hit_reports_the_askers_prompt_tokens(stream: bool) -> None:
    """The paraphrase's prompt is longer than the stored question's: its hit reported
    (and the rate limiter charged, from the reply's usage) the stored question's count.
    It reports the asker's, in the usage, each replayed choice's and the request's own
    count; so does the paraphrase's alias (its next ask, an exact hit)."""
    p, eng = plugin(semantic={"threshold": 0.8}), Counting()
    _, layer = await run(p, ctx(ASKED, n=2), eng)
    assert layer == "miss"
    for expected_layer in ("semantic", "exact"):
        asker = ctx(PARAPHRASE, n=2, stream=stream,
                    stream_options=CONTINUOUS if stream else None)
        own = counted(asker)
        assert own != counted(ctx(ASKED))
        reply, layer = await run(p, asker, eng)
        assert layer == expected_layer and eng.calls == 1
        assert asker.prompt_tokens == own
        usage: dict[str, Any]
        if isinstance(reply, Stream):
            events = chunks_of(reply)
            assert [e["usage"]["prompt_tokens"] for e in events] == [own] * 3
            usage = events[-1]["usage"]
            assert reply.usage == usage  # (what the rate limiter settles on)
        else:
            assert isinstance(reply, Completion)
            usage = reply.body["usage"]
        assert usage == {"prompt_tokens": own, "completion_tokens": 9,
                         "total_tokens": own + 9}


def usage_of(reply: Reply) -> dict[str, Any]:
    if isinstance(reply, Stream):
        return chunks_of(reply)[-1]["usage"]  # type: ignore[no-any-return]
    assert isinstance(reply, Completion)
    return reply.body["usage"]  # type: ignore[no-any-return]


# Read by the exact key as ASKED (spaces collapsed, a zero-width space dropped), yet
# other prompts to the engine: other counts of tokens.
SAME_KEY = ["How  can I   reset my password please?",
            "How can I reset my pass\u200bword please?"]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("repeat", SAME_KEY)
async def test_an_exact_hit_of_another_prompt_reports_its_own_tokens(
        stream: bool, repeat: str) -> None:
    """The repeat's hit reported the stored prompt's count: its own, as its miss would."""
    p, eng = plugin(semantic={"enabled": False}), Counting()
    await run(p, ctx(ASKED, n=2), eng)
    asker = ctx(repeat, n=2, stream=stream,
                stream_options={"include_usage": True} if stream else None)
    own = counted(asker)
    assert own != counted(ctx(ASKED))
    reply, layer = await run(p, asker, eng)
    assert layer == "exact" and eng.calls == 1
    assert asker.prompt_tokens == own
    assert usage_of(reply) == {"prompt_tokens": own, "completion_tokens": 9,
                               "total_tokens": own + 9}


async def test_a_verbatim_repeat_is_not_counted_again() -> None:
    """The stored prompt's own repeat reports the stored count, without a render."""
    p, eng = plugin(semantic={"enabled": False}), Counting()
    await run(p, ctx(ASKED), eng)
    renders: list[object] = []
    terminal = p.services.terminal
    count = terminal.count_prompt

    async def counting(r: object) -> int | None:
        renders.append(r)
        return await count(r)  # type: ignore[arg-type]

    terminal.count_prompt = counting  # type: ignore[method-assign]
    reply, layer = await run(p, ctx(ASKED), eng)
    assert layer == "exact" and renders == []
    assert usage_of(reply)["prompt_tokens"] == counted(ctx(ASKED))


async def test_a_request_waiting_on_an_identical_generation_reports_its_own_tokens() -> None:
    """A follower whose prompt the key reads as the leader's took the leader's count."""
    p, eng = plugin(semantic={"enabled": False}), Counting()
    eng.gate = asyncio.Event()
    leader = asyncio.create_task(run(p, ctx(ASKED), eng))
    follower_ctx = ctx(SAME_KEY[0])
    follower = asyncio.create_task(run(p, follower_ctx, eng))
    await eventually(lambda: l1_misses(p) == 2)  # both looked up: the follower waits
    assert eng.calls == 1
    eng.gate.set()
    (lead_reply, lead_layer), (reply, layer) = await asyncio.gather(leader, follower)
    assert (lead_layer, layer) == ("miss", "coalesced") and eng.calls == 1
    assert usage_of(lead_reply)["prompt_tokens"] == counted(ctx(ASKED))
    assert usage_of(reply)["prompt_tokens"] == counted(follower_ctx)
    assert follower_ctx.prompt_tokens == counted(follower_ctx)


async def test_a_completions_exact_hit_reports_its_own_prompts_tokens() -> None:
    """A raw prompt is keyed with its invisible characters dropped: another prompt."""
    def completion(prompt: str) -> RequestContext:
        return RequestContext(route="completion", request=CompletionRequest.model_validate(
            {"model": "m", "prompt": prompt, "temperature": 0}), principal=ctx().principal,
            request_id="r", headers={})

    async def answer(c: RequestContext) -> Reply:
        n = counted(c)
        return Completion({"id": "cmpl-1", "object": "text_completion", "created": 1,
                           "model": "m", "choices": [{"index": 0, "text": " Sure.",
                                                      "logprobs": None,
                                                      "finish_reason": "stop"}],
                           "usage": {"prompt_tokens": n, "completion_tokens": 2,
                                     "total_tokens": n + 2}})

    p = plugin(semantic={"enabled": False})
    await run(p, completion("Reset my password"), answer)
    asker = completion("Reset my pass\u200bword")
    reply, layer = await run(p, asker, answer)
    assert layer == "exact"
    assert usage_of(reply)["prompt_tokens"] == counted(asker) != counted(
        completion("Reset my password"))


async def test_an_entry_stored_before_digests_were_kept_is_rendered_once() -> None:
    """An entry from before `asked` was kept (Redis holds them a day after an upgrade; L1
    takes them from there) cannot tell a verbatim repeat: each exact hit of it rendered
    the prompt again, the cost a hit must not pay. The first count that agrees with its
    usage is kept with it: the repeats after it are not rendered."""
    p, eng = plugin(semantic={"enabled": False}), Counting()
    await run(p, ctx(ASKED), eng)
    assert p.store.l1 is not None
    [entry] = p.store.l1.entries()
    entry.asked = ""  # as read back from an entry the version before stored
    renders: list[object] = []
    terminal = p.services.terminal
    count = terminal.count_prompt

    async def counting(r: object) -> int | None:
        renders.append(r)
        return await count(r)  # type: ignore[arg-type]

    terminal.count_prompt = counting  # type: ignore[method-assign]
    for _ in range(3):
        reply, layer = await run(p, ctx(ASKED), eng)
        assert layer == "exact"
        assert usage_of(reply)["prompt_tokens"] == counted(ctx(ASKED))
    assert len(renders) == 1
    # Another prompt the key reads as it is still counted as its own.
    asker = ctx(SAME_KEY[0])
    reply, _ = await run(p, asker, eng)
    assert usage_of(reply)["prompt_tokens"] == counted(asker) != counted(ctx(ASKED))


class Detailed(Counting):
    """Counting's answer with the engine's breakdowns: prefix-cache hits on the prompt
    (`cached_tokens`), reasoning tokens in the answer."""

    async def __call__(self, c: RequestContext) -> Reply:
        reply = await super().__call__(c)
        assert isinstance(reply, Completion)
        reply.body["usage"].update(prompt_tokens_details={"cached_tokens": counted(c) - 1},
                                   completion_tokens_details={"reasoning_tokens": 4})
        return reply


@pytest.mark.parametrize("paraphrase", [PARAPHRASE, "How do I reset my password please?"])
async def test_a_semantic_hit_reports_no_prefix_cache_hits_of_its_miss(paraphrase: str) -> None:
    """A paraphrase's hit replayed its miss's `prompt_tokens_details.cached_tokens`: the
    engine's prefix-cache hits on the stored question's prompt (capped at the asker's
    count, or whole where the two had as many tokens), though no engine read the
    asker's. Its usage is its own prompt's, no breakdown of it; the answer's own
    (`completion_tokens_details`) is still the answer's. A verbatim repeat (an exact hit
    of the same prompt) still reports its miss's whole usage."""
    p, eng = plugin(semantic={"threshold": 0.8}), Detailed()
    miss, layer = await run(p, ctx(ASKED), eng)
    assert layer == "miss" and isinstance(miss, Completion)
    asker = ctx(paraphrase)
    reply, layer = await run(p, asker, eng)
    assert layer == "semantic" and eng.calls == 1 and isinstance(reply, Completion)
    own = counted(asker)
    assert reply.body["usage"] == {"prompt_tokens": own, "completion_tokens": 9,
                                   "total_tokens": own + 9,
                                   "completion_tokens_details": {"reasoning_tokens": 4}}
    again, layer = await run(p, ctx(ASKED), eng)
    assert layer == "exact" and isinstance(again, Completion)
    assert again.body["usage"] == miss.body["usage"]


@pytest.mark.parametrize("semantic", [True, False])
async def test_a_hit_of_another_prompt_over_an_upstream_reports_no_prefix_cache_hits(
        semantic: bool) -> None:
    """Where the terminal cannot count the asker's prompt (an upstream holds the
    tokenizer), a paraphrase's hit (or an exact hit of a prompt the key reads as the same)
    reports the stored count, and replayed the miss's `cached_tokens` with it: the
    upstream's prefix-cache hits on another prompt. It reports the count alone; a
    verbatim repeat still reports the miss's whole usage."""
    p, eng = plugin(semantic={"threshold": 0.8, "enabled": semantic}), Detailed()

    async def uncounted(r: Any) -> None:
        return None

    p.services.terminal.count_prompt = uncounted  # type: ignore[method-assign]
    miss, layer = await run(p, ctx(ASKED), eng)
    assert layer == "miss" and isinstance(miss, Completion)
    stored = miss.body["usage"]["prompt_tokens"]
    other = PARAPHRASE if semantic else ASKED.replace(" ", "  ")
    reply, layer = await run(p, ctx(other), eng)
    assert layer == ("semantic" if semantic else "exact") and isinstance(reply, Completion)
    assert reply.body["usage"] == {"prompt_tokens": stored, "completion_tokens": 9,
                                   "total_tokens": stored + 9,
                                   "completion_tokens_details": {"reasoning_tokens": 4}}
    again, layer = await run(p, ctx(ASKED), eng)
    assert layer == "exact" and isinstance(again, Completion)
    assert again.body["usage"] == miss.body["usage"]
