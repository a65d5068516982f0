"""Where Weir answers as vLLM's own OpenAI server does, over the fake engine: a choice's
`stop_reason` (whole, streamed and replayed from the cache), `stream_options.
continuous_usage_stats`, and a completion's `"max_tokens": null` (the default 16)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import MakeClient
from tests.fakes import WORDS, FakeEngine
from tests.openai_spec import validate, validate_completion_chunk
from tests.sse import check_chat_stream, parse_sse

MESSAGES = [{"role": "user", "content": "hi"}]
CHAT = {"model": "fake-model", "messages": MESSAGES, "max_tokens": 6, "temperature": 0}
COMPLETION = {"model": "fake-model", "prompt": "hi", "max_tokens": 6, "temperature": 0}
CACHE = [{"name": "cache", "config": {"semantic": {"enabled": False}, "store_truncated": True}}]


def third_word(route: str) -> str:
    """The fake engine's third word for the request (a stop string it is sure to meet)."""
    fake = FakeEngine()
    prompt = fake.render_chat(MESSAGES, None) if route == "chat" else fake.encode("hi")
    return WORDS[(sum(prompt) + 2) % len(WORDS)]


def head(route: str) -> str:
    """The text before that word: what a stop on it leaves."""
    fake = FakeEngine()
    prompt = fake.render_chat(MESSAGES, None) if route == "chat" else fake.encode("hi")
    return FakeEngine.expected_text(prompt, 2)


async def post(client: Any, route: str, body: dict[str, Any]) -> Any:
    path = "/v1/chat/completions" if route == "chat" else "/v1/completions"
    r = await client.post(path, json=body)
    assert r.status == 200, await r.text()
    if body.get("stream"):
        events, done = parse_sse(await r.text())
        assert done
        return events, r.headers.get("x-weir-cache")
    return await r.json(), r.headers.get("x-weir-cache")


def whole_choice(body: dict[str, Any], route: str) -> tuple[str, str, Any]:
    validate("CreateChatCompletionResponse" if route == "chat" else "CreateCompletionResponse",
             body)
    c = body["choices"][0]
    text = c["message"]["content"] if route == "chat" else c["text"]
    assert "stop_reason" in c  # null included, as vLLM's server sends it
    return text, c["finish_reason"], c["stop_reason"]


def streamed_choice(events: list[dict[str, Any]], route: str, usage: bool = False
                    ) -> tuple[str, str, Any]:
    if route == "chat":
        text = check_chat_stream(events, usage=usage)
    else:
        for e in events:
            validate_completion_chunk(e)
        text = "".join(c["text"] for e in events for c in e["choices"])
    ends = [c for e in events for c in e["choices"] if c["finish_reason"] is not None]
    assert len(ends) == 1 and "stop_reason" in ends[0]  # with its finish reason, once
    before = [c for e in events for c in e["choices"] if c["finish_reason"] is None]
    if route == "chat":  # only there, as vLLM's chat stream sends it
        assert all("stop_reason" not in c for c in before)
    else:  # null in every chunk before it, as vLLM's completion stream sends it
        assert all(c["stop_reason"] is None for c in before)
    return text, ends[0]["finish_reason"], ends[0]["stop_reason"]


@pytest.mark.parametrize("route", ["chat", "completion"])
async def test_stop_reason_names_the_stop_string_whole_and_streamed(
        make_client: MakeClient, route: str) -> None:
    """vLLM's `stop_reason`: the stop string that ended a choice; null where the answer
    ran to its length (or to the model's own end of text)."""
    client = await make_client()
    base = CHAT if route == "chat" else COMPLETION
    stop = third_word(route)
    body = {**base, "stop": ["nothing-like-it", stop]}
    assert whole_choice((await post(client, route, body))[0], route) == (
        head(route), "stop", stop)
    events, _ = await post(client, route, {**body, "stream": True})
    assert streamed_choice(events, route) == (head(route), "stop", stop)
    # cut at max_tokens: no stop string ended it
    assert whole_choice((await post(client, route, base))[0], route)[1:] == ("length", None)
    events, _ = await post(client, route, {**base, "stream": True})
    assert streamed_choice(events, route)[1:] == ("length", None)


@pytest.mark.parametrize("route", ["chat", "completion"])
async def test_a_cached_replay_keeps_the_stop_reason_of_its_miss(
        make_client: MakeClient, fake_engine: FakeEngine, route: str) -> None:
    """Exact hits, whole and streamed, of answers stored from a whole miss and from a
    streamed one: the same `stop_reason` the miss gave."""
    client = await make_client(plugins=CACHE)
    base = CHAT if route == "chat" else COMPLETION
    stop = third_word(route)
    for n, miss_streams in enumerate((False, True)):
        body = {**base, "stop": [stop], "max_tokens": 6 + n}  # (each round its own key)
        got, layer = await post(client, route, {**body, "stream": miss_streams})
        assert layer == "miss"
        miss = (streamed_choice(got, route) if miss_streams else whole_choice(got, route))
        assert miss == (head(route), "stop", stop)
        got, layer = await post(client, route, body)
        assert layer == "exact" and whole_choice(got, route) == miss
        got, layer = await post(client, route, {**body, "stream": True})
        assert layer == "exact" and streamed_choice(got, route) == miss
    assert len(fake_engine.calls) == 2


def running_usage(events: list[dict[str, Any]]) -> list[tuple[int, int, int]]:
    """(prompt, completion, total) of each chunk that carries choices."""
    out = []
    for e in events:
        if e["choices"]:
            u = e["usage"]
            assert set(u) >= {"prompt_tokens", "completion_tokens", "total_tokens"}
            out.append((u["prompt_tokens"], u["completion_tokens"], u["total_tokens"]))
    return out


@pytest.mark.parametrize("route", ["chat", "completion"])
async def test_continuous_usage_stats_put_the_usage_so_far_in_every_chunk(
        make_client: MakeClient, fake_engine: FakeEngine, route: str) -> None:
    """vLLM's `stream_options.continuous_usage_stats` (beside `include_usage`): each
    chunk carries the tokens so far; the usage chunk still ends the stream. Without
    `include_usage` it asks nothing, as vLLM reads it."""
    client = await make_client()
    base = CHAT if route == "chat" else COMPLETION
    opts = {"include_usage": True, "continuous_usage_stats": True}
    events, _ = await post(client, route, {**base, "stream": True, "stream_options": opts})
    prompt = len(fake_engine.calls[-1][0])
    for e in events:
        validate("CreateChatCompletionStreamResponse", e) if route == "chat" else (
            validate_completion_chunk(e))
    assert running_usage(events) == [(prompt, k, prompt + k) for k in range(1, 7)]
    assert events[-1]["choices"] == [] and events[-1]["usage"] == {
        "prompt_tokens": prompt, "completion_tokens": 6, "total_tokens": prompt + 6}
    events, _ = await post(client, route, {**base, "stream": True, "stream_options": {
        "continuous_usage_stats": True}})
    assert all(e.get("usage") is None for e in events) and all(e["choices"] for e in events)


@pytest.mark.parametrize("temperature", [0, 1])  # (greedy: one sequence, handed out n times)
@pytest.mark.parametrize("route", ["chat", "completion"])
async def test_continuous_usage_with_several_choices_is_each_choice_s_own(
        make_client: MakeClient, fake_engine: FakeEngine, route: str,
        temperature: float) -> None:
    """With `n` > 1 (and a completion's several prompts), vLLM's server sends one choice
    a chunk, its usage that choice's: its prompt's tokens and the tokens it generated so
    far (they were the answer's totals so far, the choices of a step in one chunk); the
    usage chunk still gives the totals."""
    client = await make_client()
    opts = {"include_usage": True, "continuous_usage_stats": True}
    body = {**(CHAT if route == "chat" else {**COMPLETION, "prompt": ["hi", "hello there"]}),
            "max_tokens": 3, "n": 2, "temperature": temperature, "stream": True,
            "stream_options": opts}
    events, _ = await post(client, route, body)
    prompts = [len(p) for p, *_ in fake_engine.calls[-1:]] if route == "chat" else [
        len(fake_engine.encode(p)) for p in ("hi", "hello there")]
    seen: dict[int, int] = {}
    for e in events[:-1]:
        (c,) = e["choices"]
        seen[c["index"]] = seen.get(c["index"], 0) + 1
        prompt = prompts[c["index"] // 2]
        assert e["usage"] == {"prompt_tokens": prompt, "completion_tokens": seen[c["index"]],
                              "total_tokens": prompt + seen[c["index"]]}
    assert seen == dict.fromkeys(range(2 * len(prompts)), 3)
    assert events[-1]["choices"] == [] and events[-1]["usage"] == {
        "prompt_tokens": sum(prompts), "completion_tokens": 6 * len(prompts),
        "total_tokens": sum(prompts) + 6 * len(prompts)}


@pytest.mark.parametrize("route", ["chat", "completion"])
async def test_a_cached_replay_carries_continuous_usage_too(
        make_client: MakeClient, fake_engine: FakeEngine, route: str) -> None:
    """A replay's chunks are all in hand: each carries the answer's usage, the one its
    usage chunk reports (the miss's)."""
    client = await make_client(plugins=CACHE)
    base = CHAT if route == "chat" else COMPLETION
    body = {**base, "stream": True, "stream_options": {"include_usage": True,
                                                       "continuous_usage_stats": True}}
    live, layer = await post(client, route, body)
    assert layer == "miss"
    replay, layer = await post(client, route, body)
    assert layer == "exact" and len(fake_engine.calls) == 1
    final = live[-1]["usage"]
    assert replay[-1] == {**replay[-1], "choices": [], "usage": final}
    assert running_usage(replay) == [(final["prompt_tokens"], final["completion_tokens"],
                                      final["total_tokens"])]
    assert running_usage(live)[-1] == running_usage(replay)[-1]
    for e in replay:
        validate("CreateChatCompletionStreamResponse", e) if route == "chat" else (
            validate_completion_chunk(e))


def usage_by_choice(events: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """Each choice's running usage, chunk by chunk (one choice a chunk)."""
    out: dict[int, list[dict[str, Any]]] = {}
    for e in events:
        if e["choices"]:
            (c,) = e["choices"]  # one choice a chunk, as a miss sends them
            out.setdefault(c["index"], []).append(e["usage"])
    return out


@pytest.mark.parametrize("miss_streams", [False, True])
@pytest.mark.parametrize("route", ["chat", "completion"])
async def test_a_replay_of_several_choices_gives_each_chunk_its_choice_s_usage(
        make_client: MakeClient, fake_engine: FakeEngine, route: str,
        miss_streams: bool) -> None:
    """With `n` > 1 (a completion's several prompts too) and `continuous_usage_stats`, a
    miss sends one choice a chunk with that choice's usage: its prompt's tokens and the
    tokens it generated. A replay sends each choice whole, one a chunk, with the usage
    that choice's last chunk had in the miss (it carried the answer's totals), whether
    the entry came from a streamed miss or a whole one."""
    client = await make_client(plugins=CACHE)
    stop = third_word(route)  # (choice 0 meets it third, choice 1 second: unequal lengths)
    opts = {"include_usage": True, "continuous_usage_stats": True}
    base = CHAT if route == "chat" else {**COMPLETION, "prompt": ["hi", "hello there"]}
    # (sampled with a seed, to be cached: greedy choices would be one sequence n times)
    body = {**base, "n": 2, "stop": [stop], "temperature": 1, "seed": 0, "stream": True,
            "stream_options": opts}
    live, layer = await post(client, route, body if miss_streams else {
        **body, "stream": False, "stream_options": None})
    assert layer == "miss"
    if miss_streams:
        expected = {i: u[-1] for i, u in usage_by_choice(live).items()}
        final = live[-1]["usage"]
    else:  # the same request streamed (no cache) shows what each choice counts
        final = live["usage"]
        events, layer = await post(client, route, {**body, "seed": 1})
        assert layer == "miss" and events[-1]["usage"] == final
        expected = {i: u[-1] for i, u in usage_by_choice(events).items()}
    assert len({u["completion_tokens"] for u in expected.values()}) > 1  # (unequal)
    replay, layer = await post(client, route, body)
    assert layer == "exact"
    assert replay[-1] == {**replay[-1], "choices": [], "usage": final}
    got = usage_by_choice(replay)
    assert {i: u[-1] for i, u in got.items()} == expected
    assert all(u == [u[-1]] * len(u) for u in got.values())  # (all of it in hand)
    for e in replay:
        validate("CreateChatCompletionStreamResponse", e) if route == "chat" else (
            validate_completion_chunk(e))


async def test_a_completion_s_null_max_tokens_is_the_default_16(
        make_client: MakeClient, fake_engine: FakeEngine) -> None:
    """As OpenAI and vLLM read it (not the rest of the context, 512 tokens here); so the
    cache keys a null as the 16 it is. Chat's null is still no limit of its own."""
    client = await make_client(plugins=CACHE)
    body = {"model": "fake-model", "prompt": "hi", "temperature": 0, "max_tokens": None}
    got, layer = await post(client, "completion", body)
    assert layer == "miss" and got["usage"]["completion_tokens"] == 16
    assert fake_engine.calls[-1][1].max_tokens == 16
    for same in ({"max_tokens": 16}, {}):
        got, layer = await post(client, "completion", {**{k: v for k, v in body.items()
                                                          if k != "max_tokens"}, **same})
        assert layer == "exact" and got["usage"]["completion_tokens"] == 16
    got, _ = await post(client, "chat", {**CHAT, "max_tokens": None})
    assert fake_engine.calls[-1][1].max_tokens == 512 - len(fake_engine.calls[-1][0])


async def test_the_model_s_generation_config_fills_what_a_request_leaves_unset(
        make_client: MakeClient) -> None:
    """vLLM's server applies the model's generation_config.json (`temperature`, `top_p`,
    ..., `max_new_tokens`) where a request says nothing; Weir hard-coded 1.0 and the whole
    context. Applied before the chain: a model that defaults to greedy decoding has its
    answers to requests without `temperature` cached as deterministic ones."""
    engine = FakeEngine()
    engine.sampling_defaults = {"temperature": 0.0, "top_k": 5, "max_tokens": 4}
    client = await make_client(engine=engine, plugins=CACHE)
    bare = {"model": "fake-model", "messages": MESSAGES}
    body, cache = await post(client, "chat", bare)
    options = engine.calls[-1][1]
    assert (options.temperature, options.top_k, options.max_tokens) == (0.0, 5, 4)
    assert body["usage"]["completion_tokens"] == 4 and cache == "miss"
    _, cache = await post(client, "chat", bare)
    assert cache == "exact"  # (deterministic by the model's default)
    # what the request says wins
    await post(client, "chat", {**bare, "temperature": 0.7, "top_k": 2, "max_tokens": 6})
    options = engine.calls[-1][1]
    assert (options.temperature, options.top_k, options.max_tokens) == (0.7, 2, 6)


def test_a_generation_config_s_values_are_taken_within_a_request_s_bounds() -> None:
    from proxy.protocol import model_defaults

    assert model_defaults({"temperature": 0.6, "top_p": 0.9, "top_k": 20, "min_p": 0.05,
                           "repetition_penalty": 1.1, "max_tokens": 512}) == {
        "temperature": 0.6, "top_p": 0.9, "top_k": 20, "min_p": 0.05,
        "repetition_penalty": 1.1, "max_tokens": 512}
    assert model_defaults({"temperature": 7, "top_p": float("nan"), "top_k": 1.5,
                           "max_tokens": 0, "min_p": True, "bogus": 1}) == {}


@pytest.mark.parametrize("route", ["chat", "completion"])
@pytest.mark.parametrize("stream", [False, True])
async def test_a_cache_hit_reports_the_cached_tokens_of_its_miss(
        make_client: MakeClient, fake_engine: FakeEngine, route: str, stream: bool) -> None:
    """The usage of a hit is the usage of the miss that made it, its
    `prompt_tokens_details.cached_tokens` (the engine's prefix cache) included: a hit
    dropped them, so a client reading them saw its usage change between two answers of
    the same text (whole and streamed with `include_usage`)."""
    fake_engine.cached_tokens = 2
    client = await make_client(plugins=CACHE)
    body = {**(CHAT if route == "chat" else COMPLETION), "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    usages = []
    for want in ("miss", "exact"):
        out, cache = await post(client, route, body)
        assert cache == want
        usage = out[-1]["usage"] if stream else out["usage"]
        validate("CompletionUsage", usage)
        usages.append(usage)
    assert usages[0]["prompt_tokens_details"] == {"cached_tokens": 2}
    assert usages[1] == usages[0]
