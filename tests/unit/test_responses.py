"""The response builders (proxy/responses.py): every shape they make validates against
OpenAI's official schemas, and the details the spec leaves to them (role only in a first
delta, `usage: null` on chunks when usage is asked for, logprob offsets) hold."""

from __future__ import annotations

import pytest

from proxy import responses as R
from proxy.engine.base import TokenLogprob, TopLogprob
from tests.openai_spec import validate, validate_completion_chunk

LOGPROBS = [
    TokenLogprob(" he", -0.1, list(b" he"), [TopLogprob(" he", -0.1, list(b" he")),
                                             TopLogprob(" she", -2.5, list(b" she")),
                                             TopLogprob(" it", -3.0, None)]),
    TokenLogprob("llo", -0.2, list(b"llo"), [TopLogprob("llo", -0.2, list(b"llo"))]),
]


def test_ids_are_prefixed_and_unique() -> None:
    ids = {R.new_id("chatcmpl") for _ in range(100)}
    assert len(ids) == 100 and all(i.startswith("chatcmpl-") for i in ids)


def test_usage_totals_and_cached_tokens() -> None:
    assert R.usage(7, 4) == {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11}
    assert R.usage(7, 4, cached=5)["prompt_tokens_details"] == {"cached_tokens": 5}


@pytest.mark.parametrize(("engine", "openai"), [
    ("length", "length"), ("stop", "stop"), ("abort", "stop"), (None, "stop")])
def test_finish_reasons_map_to_openais_enum(engine: str | None, openai: str) -> None:
    assert R.finish(engine) == openai


@pytest.mark.parametrize("with_logprobs", [False, True])
def test_chat_completion_matches_the_spec(with_logprobs: bool) -> None:
    lp = R.chat_logprobs(LOGPROBS, top=2) if with_logprobs else None
    body = R.chat_completion(id=R.new_id("chatcmpl"), model="m", created=R.now(),
                             usage_=R.usage(3, 2),
                             choices=[R.chat_choice(0, " hello", "stop", lp),
                                      R.chat_choice(1, " bye", "length", lp)])
    validate("CreateChatCompletionResponse", body)
    assert body["choices"][0]["message"] == {"role": "assistant", "content": " hello",
                                             "refusal": None}
    if with_logprobs:
        first = body["choices"][0]["logprobs"]["content"][0]
        assert [t["token"] for t in first["top_logprobs"]] == [" he", " she"]  # top 2 only
    else:
        assert body["choices"][0]["logprobs"] is None


@pytest.mark.parametrize("include_usage", [False, True])
def test_chat_chunks_carry_the_role_once_and_usage_when_asked(include_usage: bool) -> None:
    cid, created = R.new_id("chatcmpl"), R.now()

    def chunk(content: str | None, first: bool, reason: str | None) -> dict[str, object]:
        return R.chat_chunk(id=cid, model="m", created=created, include_usage=include_usage,
                            choices=[R.chat_chunk_choice(0, content=content, first=first,
                                                         reason=reason, logprobs=None)])

    chunks = [chunk("", True, None), chunk(" hi", False, None), chunk(None, False, "stop")]
    if include_usage:
        chunks.append(R.usage_chunk(id=cid, model="m", created=created,
                                    object_="chat.completion.chunk", usage_=R.usage(3, 1)))
    for c in chunks:
        validate("CreateChatCompletionStreamResponse", c)
    deltas = [c["choices"][0]["delta"] for c in chunks[:3]]  # type: ignore[index]
    assert deltas == [{"role": "assistant", "content": ""}, {"content": " hi"}, {}]
    if include_usage:
        assert all(c["usage"] is None for c in chunks[:3])
        assert chunks[3]["choices"] == [] and chunks[3]["usage"]["total_tokens"] == 4  # type: ignore[index]
    else:
        assert all("usage" not in c for c in chunks)


def test_completion_body_and_chunks_match_the_spec() -> None:
    lp = R.completion_logprobs(LOGPROBS, top=2, offset=10)
    body = R.completion_body(id=R.new_id("cmpl"), model="m", created=R.now(),
                             usage_=R.usage(3, 2),
                             choices=[R.completion_choice(0, " hello", "stop", lp)])
    validate("CreateCompletionResponse", body)
    chunk = R.completion_body(id=R.new_id("cmpl"), model="m", created=R.now(), usage_=None,
                              choices=[R.completion_choice(0, " he", None, None)])
    validate_completion_chunk(chunk)
    assert "usage" not in chunk


def test_completion_logprobs_offsets_and_tops() -> None:
    lp = R.completion_logprobs(LOGPROBS, top=2, offset=10)
    assert lp["tokens"] == [" he", "llo"] and lp["token_logprobs"] == [-0.1, -0.2]
    assert lp["text_offset"] == [10, 13]  # each token starts where the last one ended
    assert lp["top_logprobs"] == [{" he": -0.1, " she": -2.5}, {"llo": -0.2}]
    # `logprobs: 0`: the chosen token alone at each place (OpenAI: up to logprobs + 1
    # entries; vLLM's server sends the chosen one), never an empty list beside the tokens
    assert R.completion_logprobs(LOGPROBS, top=0, offset=0)["top_logprobs"] == [
        {" he": -0.1}, {"llo": -0.2}]


def test_completion_alternatives_that_are_parts_of_characters_are_each_kept() -> None:
    """A completion's `top_logprobs` is a map by token text, and vLLM names every token
    that is part of a character "": several such alternatives (and the chosen one, where
    it is one) were one key, all but the last lost, and the chosen one's logprob
    overwritten. Each is kept: the chosen one under its text (as in `tokens`), an
    alternative of no text of its own spelled by its bytes as OpenAI spells them
    (`bytes:\\xe2\\x80`), one whose text an earlier one has by its id."""
    chosen = TokenLogprob("", -0.1, [0xE2, 0x80], [
        TopLogprob("", -0.1, [0xE2, 0x80], 10), TopLogprob("", -1.5, [0xE2], 11),
        TopLogprob("", -2.5, [0xE3, 0x81], 12), TopLogprob(" a", -3.0, list(b" a"), 13),
        TopLogprob(" a", -4.0, list(b" a"), 14)])
    completes = TokenLogprob("\u201c", -0.2, [0x9C], [
        TopLogprob("", -1.0, [0xE2], 11), TopLogprob("\u201c", -0.2, [0x9C], 20),
        TopLogprob("", -2.0, [0xE3], 21)])
    lp = R.completion_logprobs([chosen, completes], top=5, offset=0)
    assert lp["tokens"] == ["", "\u201c"]
    assert lp["top_logprobs"] == [
        {"": -0.1, "bytes:\\xe2": -1.5, "bytes:\\xe3\\x81": -2.5, " a": -3.0,
         "token_id:14": -4.0},
        {"bytes:\\xe2": -1.0, "\u201c": -0.2, "bytes:\\xe3": -2.0}]
    assert [len(t) for t in lp["top_logprobs"]] == [5, 3]
    # the top 1 and the chosen one, as before
    assert R.completion_logprobs([completes], top=1, offset=0)["top_logprobs"] == [
        {"bytes:\\xe2": -1.0, "\u201c": -0.2}]
