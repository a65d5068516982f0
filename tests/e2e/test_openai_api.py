"""End to end: the official OpenAI SDK against `weir serve` on the real vLLM engine.

The model is the generated random-weight Llama, so texts are gibberish; the tests
assert what must hold for any model: shapes (validated against OpenAI's spec), token
counts, determinism at temperature 0 and with a seed, stop strings, logit bias, and
structured output that parses.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.conftest import KEY_A, KEY_B, MODEL
from tests.e2e.server import WeirProcess, sdk
from tests.openai_spec import validate, validate_completion_chunk
from tests.sse import check_chat_stream, parse_sse

MSG = [{"role": "user", "content": "How do I reset my password?"}]
AUTH = {"Authorization": f"Bearer {KEY_A}"}


def raw(weir: WeirProcess, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{weir.url}{path}", json=body, headers=AUTH, timeout=120)


# ------------------------------------------------------------------------- models


def test_models_list_and_retrieve(client: openai.OpenAI, weir: WeirProcess) -> None:
    models = client.models.list()
    # The engine's model, and the embedding model /v1/embeddings serves.
    assert [m.id for m in models.data] == [MODEL, "all-MiniLM-L6-v2"]
    body = httpx.get(f"{weir.url}/v1/models", headers=AUTH).json()
    validate("ListModelsResponse", body)
    assert body["data"][0]["owned_by"] == "weir"
    # the model as configured, not where the server keeps its files
    assert body["data"][0]["root"].startswith("builtin:") and "/" not in body["data"][0][
        "root"]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("no-such-model")
    assert e.value.code == "model_not_found"


def test_the_startup_heap_is_hidden_from_the_garbage_collector(weir: WeirProcess) -> None:
    """`weir serve` freezes what the engine's start allocated (vLLM, torch: hundreds of
    thousands of objects), so no collection of the oldest generation walks it while
    serving (a ~0.45 s stall of every stream each time)."""
    ready = [json.loads(line) for line in weir.log_text().splitlines()
             if '"event": "engine ready"' in line]
    assert len(ready) == 1 and ready[0]["gc_frozen_objects"] > 100_000


# --------------------------------------------------------------------------- chat


def test_chat_completion_shape(client: openai.OpenAI, weir: WeirProcess) -> None:
    r = client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=8, temperature=0)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.usage is not None and r.usage.completion_tokens == 8
    assert r.choices[0].finish_reason == "length"
    body = raw(weir, "/v1/chat/completions",
               {"model": MODEL, "messages": MSG, "max_tokens": 8, "temperature": 0}).json()
    validate("CreateChatCompletionResponse", body)
    assert body["choices"][0]["message"]["content"] == r.choices[0].message.content


def test_chat_stream_shape_and_agreement(client: openai.OpenAI, weir: WeirProcess) -> None:
    whole = client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=12,
                                           temperature=0)
    text = ""
    usage = None
    for chunk in client.chat.completions.create(
            model=MODEL, messages=MSG, max_tokens=12, temperature=0, stream=True,
            stream_options={"include_usage": True}):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        if chunk.usage:
            usage = chunk.usage
    assert text == whole.choices[0].message.content
    assert usage is not None and usage.completion_tokens == 12
    r = raw(weir, "/v1/chat/completions", {
        "model": MODEL, "messages": MSG, "max_tokens": 12, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True}})
    events, done = parse_sse(r.text)
    assert done
    assert check_chat_stream(events, usage=True) == text


def test_whole_answers_agree_with_streams_choice_by_choice(client: openai.OpenAI) -> None:
    """A whole answer comes from the engine in one output (vLLM's FINAL_ONLY), a stream
    step by step: texts, logprobs, finish reasons and usage agree for every choice."""
    kw: dict[str, Any] = dict(model=MODEL, messages=MSG, max_tokens=9, temperature=1.0,
                              seed=77, n=2, logprobs=True, top_logprobs=2)
    whole = client.chat.completions.create(**kw)
    text = {0: "", 1: ""}
    tokens: dict[int, list[str]] = {0: [], 1: []}
    reasons = {}
    usage = None
    for chunk in client.chat.completions.create(stream=True,
                                                stream_options={"include_usage": True}, **kw):
        for c in chunk.choices:
            text[c.index] += c.delta.content or ""
            tokens[c.index] += [t.token for t in (c.logprobs.content or [])] if c.logprobs else []
            if c.finish_reason:
                reasons[c.index] = c.finish_reason
        usage = chunk.usage or usage
    assert sorted(c.index for c in whole.choices) == [0, 1]
    for c in whole.choices:
        assert c.message.content == text[c.index] and c.finish_reason == reasons[c.index]
        assert c.logprobs is not None and c.logprobs.content is not None
        assert [t.token for t in c.logprobs.content] == tokens[c.index]
        assert all(len(t.top_logprobs) == 2 for t in c.logprobs.content)
    assert usage is not None and whole.usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (
        whole.usage.prompt_tokens, whole.usage.completion_tokens) and usage.completion_tokens > 0


def test_content_parts_and_roles(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, max_tokens=4, messages=[
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text",
                                                                       "text": "there"}]},
        {"role": "assistant", "content": "Hello.", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "lookup", "arguments": "{}"}}]},
        {"role": "tool", "content": "42", "tool_call_id": "call_1"},
        {"role": "user", "content": "Thanks"},
    ])
    assert r.usage is not None and r.usage.completion_tokens == 4


def test_n_choices_seed_and_temperature(client: openai.OpenAI) -> None:
    kw: dict[str, Any] = dict(model=MODEL, messages=MSG, max_tokens=10, temperature=1.0,
                              top_p=0.95)
    r = client.chat.completions.create(n=3, **kw)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    a = client.chat.completions.create(seed=1234, **kw).choices[0].message.content
    b = client.chat.completions.create(seed=1234, **kw).choices[0].message.content
    assert a == b


def test_stop_sequence_cuts_the_answer(client: openai.OpenAI) -> None:
    base = client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=30,
                                          temperature=0).choices[0].message.content
    assert base and len(base) > 10
    stop = base[len(base) // 2: len(base) // 2 + 3]
    cut = client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=30,
                                         temperature=0, stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == base[: base.index(stop)]


def test_penalties_change_greedy_output(client: openai.OpenAI) -> None:
    kw: dict[str, Any] = dict(model=MODEL, messages=MSG, max_tokens=40, temperature=0)
    plain = client.chat.completions.create(**kw).choices[0].message.content
    pen = client.chat.completions.create(frequency_penalty=2.0, presence_penalty=2.0,
                                         **kw).choices[0].message.content
    assert plain != pen


def test_logprobs_and_logit_bias(client: openai.OpenAI, weir: WeirProcess) -> None:
    r = client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=6,
                                       temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 6
    assert all(len(t.top_logprobs) == 3 for t in content)
    assert all(t.logprob <= 0 for t in content)
    # Push one ordinary token to +100: greedy decoding must pick it every time.
    ids = httpx.post(f"{weir.url}/v1/completions", headers=AUTH, timeout=60, json={
        "model": MODEL, "prompt": "hello", "max_tokens": 1, "logprobs": 0}).json()
    token = ids["choices"][0]["logprobs"]["tokens"][0]
    tok_id = 300  # any id inside the 2k vocabulary
    biased = client.chat.completions.create(
        model=MODEL, messages=MSG, max_tokens=5, temperature=0, logprobs=True,
        logit_bias={str(tok_id): 100})
    toks = [t.token for t in biased.choices[0].logprobs.content]  # type: ignore[union-attr]
    assert len(set(toks)) == 1, toks
    assert token is not None


# ------------------------------------------------------------ vLLM's extensions
# Sent as vLLM's server takes them (the SDK's `extra_body`); each changes the answer.


@functools.cache
def demo_tokenizer() -> Any:
    from transformers import AutoTokenizer

    from proxy.engine.demo_model import ensure_demo_model

    return AutoTokenizer.from_pretrained(str(ensure_demo_model()))


@functools.cache
def word_token() -> tuple[int, str]:
    """An ordinary token that is a word of its own (its text tokenizes back to it)."""
    tok = demo_tokenizer()
    for tid in range(300, 2000):
        text = tok.decode([tid])
        if text.isalpha() and len(text) >= 3 and tok.encode(
                text, add_special_tokens=False) == [tid]:
            return tid, str(text)
    raise AssertionError("no word token in the demo vocabulary")


def test_stop_token_ids_end_the_answer_and_can_be_kept(client: openai.OpenAI) -> None:
    tid, text = word_token()
    kw: dict[str, Any] = dict(model=MODEL, messages=MSG, max_tokens=8, temperature=0,
                              logit_bias={str(tid): 100})  # every token is `tid`
    forced = client.chat.completions.create(**kw)
    assert forced.choices[0].message.content == text * 8
    assert forced.choices[0].finish_reason == "length"
    stopped = client.chat.completions.create(**kw, extra_body={"stop_token_ids": [tid]})
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].message.content == ""
    assert stopped.usage is not None and stopped.usage.completion_tokens == 1
    kept = client.chat.completions.create(**kw, extra_body={
        "stop_token_ids": [tid], "include_stop_str_in_output": True})
    assert kept.choices[0].finish_reason == "stop"
    assert kept.choices[0].message.content == text


def test_allowed_token_ids_hold_every_token_to_them(client: openai.OpenAI) -> None:
    tid, text = word_token()
    r = client.completions.create(model=MODEL, prompt="Tell me a story", max_tokens=6,
                                  temperature=0, extra_body={"allowed_token_ids": [tid]})
    assert r.choices[0].text == text * 6
    with pytest.raises(openai.BadRequestError) as e:  # past the vocabulary: vLLM's 400
        client.completions.create(model=MODEL, prompt="Tell me a story", max_tokens=6,
                                  extra_body={"allowed_token_ids": [tid, 10**6]})
    assert e.value.body["param"] == "allowed_token_ids"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as e:  # one it does not honour: named
        client.completions.create(model=MODEL, prompt="Tell me a story", max_tokens=6,
                                  extra_body={"use_beam_search": True})
    assert e.value.code == "unsupported_parameter"


def test_bad_words_are_never_generated(client: openai.OpenAI) -> None:
    tid, text = word_token()
    kw: dict[str, Any] = dict(model=MODEL, messages=MSG, max_tokens=8, temperature=0,
                              logit_bias={str(tid): 100}, logprobs=True)
    assert client.chat.completions.create(**kw).choices[0].message.content == text * 8
    banned = client.chat.completions.create(**kw, extra_body={"bad_words": [text]})
    tokens = [t.token for t in banned.choices[0].logprobs.content]  # type: ignore[union-attr]
    assert len(tokens) == 8 and all(t.strip() != text for t in tokens), tokens


def test_include_stop_str_in_output_keeps_the_stop_string(client: openai.OpenAI) -> None:
    kw: dict[str, Any] = dict(model=MODEL, messages=MSG, max_tokens=30, temperature=0)
    base = client.chat.completions.create(**kw).choices[0].message.content
    assert base and len(base) > 10
    stop = base[len(base) // 2: len(base) // 2 + 3]
    want = base[: base.index(stop) + len(stop)]
    kept = client.chat.completions.create(**kw, stop=[stop],
                                          extra_body={"include_stop_str_in_output": True})
    assert kept.choices[0].finish_reason == "stop"
    assert kept.choices[0].message.content == want
    text, reasons = "", []
    for chunk in client.chat.completions.create(
            **kw, stop=[stop], stream=True, extra_body={"include_stop_str_in_output": True}):
        for c in chunk.choices:
            text += c.delta.content or ""
            reasons += [c.finish_reason] if c.finish_reason else []
    assert text == want and reasons == ["stop"]


def test_continue_final_message_continues_an_assistant_prefill(
        client: openai.OpenAI) -> None:
    """The answer continues the final assistant message, as a completion of the prompt
    the template renders with that message left open (vLLM's server's prefill)."""
    prefill = [*MSG, {"role": "assistant", "content": "To reset it, open"}]
    cont = client.chat.completions.create(
        model=MODEL, messages=prefill, max_tokens=8, temperature=0,
        extra_body={"add_generation_prompt": False, "continue_final_message": True})
    tok = demo_tokenizer()
    ids = tok.encode(tok.apply_chat_template(
        prefill, add_generation_prompt=False, continue_final_message=True, tokenize=False),
        add_special_tokens=False)
    ref = client.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0)
    assert cont.usage is not None and cont.usage.prompt_tokens == len(ids)
    assert cont.choices[0].message.content == ref.choices[0].text
    new_turn = client.chat.completions.create(model=MODEL, messages=prefill,
                                              max_tokens=8, temperature=0)
    assert new_turn.usage is not None and new_turn.usage.prompt_tokens > len(ids)
    with pytest.raises(openai.BadRequestError):  # both at once: vLLM refuses it too
        client.chat.completions.create(model=MODEL, messages=prefill, max_tokens=8,
                                       extra_body={"continue_final_message": True})


def test_max_completion_tokens(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, messages=MSG, max_completion_tokens=3,
                                       temperature=0)
    assert r.usage is not None and r.usage.completion_tokens == 3


def test_n_greedy_choices_are_one_answer(client: openai.OpenAI) -> None:
    """vLLM refuses n > 1 at temperature 0; OpenAI answers it: n copies of one answer."""
    r = client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=8,
                                       temperature=0, n=2)
    assert len(r.choices) == 2 and r.choices[0].message.content == r.choices[
        1].message.content
    assert r.usage is not None and r.usage.completion_tokens % 2 == 0  # both counted
    assert r.choices[0].finish_reason == r.choices[1].finish_reason


def test_json_schema_output_parses(client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "string",
                                                          "enum": ["yes", "no"]}},
              "required": ["answer"], "additionalProperties": False}
    r = client.chat.completions.create(
        model=MODEL, messages=MSG, max_tokens=30, temperature=0,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "yn", "schema": schema, "strict": True}})
    assert json.loads(r.choices[0].message.content or "") in ({"answer": "yes"},
                                                              {"answer": "no"})


def test_json_object_output_is_json(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "How do I reset my password? "
                                "Answer in JSON."}],
        max_tokens=20, temperature=0, response_format={"type": "json_object"})
    content = r.choices[0].message.content or ""
    assert content.startswith("{")
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(content), dict)


def test_unknown_fields_and_user_are_accepted(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=2, user="u-1",
                                       extra_body={"some_new_openai_field": True})
    assert r.usage is not None and r.usage.completion_tokens == 2


def test_stored_chat_completions_through_the_sdk(client: openai.OpenAI,
                                                 weir: WeirProcess) -> None:
    """`store: true`, then the SDK's own calls: retrieve, list (by metadata), messages,
    update and delete; another tenant finds none of it."""
    tag = {"run": str(time.monotonic_ns())}
    made = client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=4,
                                          store=True, metadata=tag)
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=MSG, max_tokens=4, store=True, metadata=tag, stream=True))
    got = client.chat.completions.retrieve(made.id)
    assert got.choices[0].message.content == made.choices[0].message.content
    assert got.metadata == tag
    again = client.chat.completions.retrieve(chunks[0].id)
    assert again.choices[0].message.content == "".join(
        c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert again.usage is not None and again.usage.completion_tokens == 4
    listed = client.chat.completions.list(metadata=tag, model=MODEL)
    assert [c.id for c in listed.data] == [made.id, chunks[0].id]
    messages = client.chat.completions.messages.list(made.id)
    assert [(m.role, m.content) for m in messages.data] == [("user", MSG[0]["content"])]
    updated = client.chat.completions.update(made.id, metadata={"kept": "yes"})
    assert updated.metadata == {"kept": "yes"}
    other = sdk(weir.url, KEY_B)
    with pytest.raises(openai.NotFoundError):
        other.chat.completions.retrieve(made.id)
    assert other.chat.completions.list(metadata=tag).data == []
    deleted = client.chat.completions.delete(made.id)
    assert deleted.deleted and deleted.id == made.id
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.retrieve(made.id)


# -------------------------------------------------------------------- completions


def test_completions_prompt_forms(client: openai.OpenAI, weir: WeirProcess) -> None:
    one = client.completions.create(model=MODEL, prompt="The gateway", max_tokens=5,
                                    temperature=0)
    assert one.object == "text_completion" and one.usage and one.usage.completion_tokens == 5
    many = client.completions.create(model=MODEL, prompt=["a", "b"], max_tokens=3,
                                     temperature=0)
    assert sorted(c.index for c in many.choices) == [0, 1]
    toks = client.completions.create(model=MODEL, prompt=[5, 207, 714], max_tokens=3)
    assert toks.usage is not None and toks.usage.prompt_tokens == 3
    nested = client.completions.create(model=MODEL, prompt=[[5, 207], [714]], max_tokens=2)
    assert len(nested.choices) == 2
    for body in ({"prompt": "x", "max_tokens": 3, "logprobs": 2},
                 {"prompt": ["a", "b"], "max_tokens": 2, "n": 2, "temperature": 1}):
        validate("CreateCompletionResponse",
                 raw(weir, "/v1/completions", {"model": MODEL, **body}).json())


def test_echo_logprobs_score_a_text_as_generation_saw_it(client: openai.OpenAI,
                                                         weir: WeirProcess) -> None:
    """lm-evaluation-harness's loglikelihood: `echo` + `logprobs` + `max_tokens` 0 gives
    each prompt token's logprob (the first none). Scored so, a greedy continuation's
    tokens have the logprobs its generation reported; whole and streamed agree."""
    for prompt in ("Once upon a time", "The capital of France is"):
        gen = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3,
                                        temperature=0, logprobs=1).choices[0]
        assert gen.logprobs and gen.logprobs.tokens and gen.logprobs.token_logprobs
        ask = {"model": MODEL, "prompt": prompt + gen.text, "echo": True, "logprobs": 1,
               "max_tokens": 0}
        body = raw(weir, "/v1/completions", ask).json()
        scored = body["choices"][0]
        lp = scored["logprobs"]
        assert scored["text"] == prompt + gen.text and scored["finish_reason"] == "length"
        assert len(lp["tokens"]) == body["usage"]["prompt_tokens"]
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        assert all(isinstance(x, float) and x <= 0 for x in lp["token_logprobs"][1:])
        assert all(t in top for t, top in zip(lp["tokens"][1:], lp["top_logprobs"][1:],
                                              strict=True))
        assert lp["tokens"][-3:] == gen.logprobs.tokens
        assert lp["token_logprobs"][-3:] == pytest.approx(gen.logprobs.token_logprobs,
                                                          abs=1e-3)
        events, done = parse_sse(raw(weir, "/v1/completions", {**ask, "stream": True}).text)
        assert done
        streamed = [c for e in events for c in e["choices"]]
        assert "".join(c["text"] for c in streamed) == scored["text"]
        assert [t for c in streamed for t in (c["logprobs"] or {}).get("tokens", [])
                ] == lp["tokens"]
    # token ids, as the harness sends them: echoed as their text, each scored
    ids = client.completions.create(model=MODEL, prompt=[5, 207, 714], echo=True, logprobs=2,
                                    max_tokens=2, temperature=0).choices[0]
    assert ids.logprobs and ids.logprobs.tokens and len(ids.logprobs.tokens) == 5
    assert ids.text == "".join(ids.logprobs.tokens)


def test_echo_logprobs_spell_a_prompt_whose_first_character_is_split(
        weir: WeirProcess) -> None:
    """A prompt whose first character the byte-level vocabulary splits over tokens (a CJK
    character, an emoji): its echoed tokens showed "\ufffd" and "" for it; they spell
    the prompt, whole and streamed, and each token's own bytes join to its UTF-8. Each
    token's alternatives hold it, and as many keys as the engine gave (partial ones
    were one "" key)."""
    for prompt in ("日本語 is Japanese", "😀 smile", "é"):
        ask = {"model": MODEL, "prompt": prompt, "echo": True, "logprobs": 5,
               "max_tokens": 0}
        scored = raw(weir, "/v1/completions", ask).json()["choices"][0]
        lp = scored["logprobs"]
        assert scored["text"] == prompt and "".join(lp["tokens"]) == prompt
        assert all(t in top for t, top in zip(lp["tokens"][1:], lp["top_logprobs"][1:],
                                              strict=True))
        assert all(5 <= len(top) <= 6 for top in lp["top_logprobs"][1:])
        events, done = parse_sse(raw(weir, "/v1/completions", {**ask, "stream": True}).text)
        assert done and [t for e in events for c in e["choices"]
                         for t in (c["logprobs"] or {}).get("tokens", [])] == lp["tokens"]


def test_completion_stream_agrees(client: openai.OpenAI, weir: WeirProcess) -> None:
    whole = client.completions.create(model=MODEL, prompt="Once", max_tokens=10, temperature=0)
    text = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt="Once", max_tokens=10, temperature=0, stream=True) if c.choices)
    assert text == whole.choices[0].text
    r = raw(weir, "/v1/completions", {"model": MODEL, "prompt": "Once", "max_tokens": 5,
                                      "stream": True, "stream_options": {"include_usage": True}})
    events, done = parse_sse(r.text)
    assert done
    for e in events:
        validate_completion_chunk(e)
    assert events[-1]["usage"]["completion_tokens"] == 5


async def test_async_sdk_concurrent_streams(aclient: openai.AsyncOpenAI) -> None:
    async def one(i: int) -> str:
        text = ""
        stream = await aclient.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"question {i}"}],
            max_tokens=16, temperature=0, stream=True)
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
        return text

    texts = await asyncio.gather(*(one(i) for i in range(16)))
    assert all(texts)
    again = await one(3)
    assert again == texts[3]  # batching does not change greedy output
    await aclient.close()


def test_engine_gauges_move_while_generating(weir: WeirProcess) -> None:
    """weir_engine_* come from vLLM's scheduler stats: they must move under a request."""
    import threading

    from prometheus_client.parser import text_string_to_metric_families

    started = threading.Event()

    def long_stream() -> None:
        with httpx.stream("POST", f"{weir.url}/v1/chat/completions", headers=AUTH, timeout=120,
                          json={"model": MODEL, "messages": MSG, "max_tokens": 900,
                                "ignore_eos": True, "stream": True}) as r:
            for _ in r.iter_bytes():
                started.set()

    t = threading.Thread(target=long_stream, daemon=True)
    t.start()
    assert started.wait(60)

    def gauges() -> dict[str, float]:
        text = httpx.get(f"{weir.url}/metrics").text
        return {s.name: s.value for f in text_string_to_metric_families(text)
                for s in f.samples if s.name.startswith("weir_engine_")}

    seen = gauges()
    deadline = time.monotonic() + 20
    while seen["weir_engine_kv_cache_usage_ratio"] <= 0 and time.monotonic() < deadline:
        time.sleep(0.05)  # the scheduler reports once per engine step
        seen = gauges()
    assert seen["weir_engine_requests_running"] >= 1
    assert 0 < seen["weir_engine_kv_cache_usage_ratio"] <= 1
    t.join(120)


def test_streamed_logprob_offsets_survive_text_held_for_a_stop_string(
        weir: WeirProcess) -> None:
    """vLLM holds text back while it might be a stop string's start; the tokens' offsets
    in the stream are their places in the text all the same (they lagged by the text held
    back), as in the whole answer."""
    body = {"model": MODEL, "prompt": "Tell me a story", "max_tokens": 16, "logprobs": 1,
            "temperature": 0, "stop": ["xyzw"]}
    whole = raw(weir, "/v1/completions", body).json()["choices"][0]
    events, done = parse_sse(raw(weir, "/v1/completions", {**body, "stream": True}).text)
    offsets = [o for e in events for c in e["choices"]
               for o in (c.get("logprobs") or {}).get("text_offset", [])]
    assert done and offsets == whole["logprobs"]["text_offset"]


# ------------------------------------------------------------- vLLM server parity


def test_stop_reason_names_the_stop_string_as_vllm_s_server_does(
        client: openai.OpenAI, weir: WeirProcess) -> None:
    """vLLM's `stop_reason` on chat and completions, whole and streamed (with the finish
    reason): the stop string that ended the choice, null when it ran to its length."""
    ask: dict[str, Any] = {"model": MODEL, "max_tokens": 30, "temperature": 0}
    stops = {}
    for route, body in (("/v1/chat/completions", {**ask, "messages": MSG}),
                        ("/v1/completions", {**ask, "prompt": "Once upon a time"})):
        chat = route == "/v1/chat/completions"
        spec = "CreateChatCompletionResponse" if chat else "CreateCompletionResponse"
        base = raw(weir, route, body).json()
        validate(spec, base)
        text = base["choices"][0]["message"]["content"] if chat else base["choices"][0]["text"]
        assert len(text) > 10, text
        stop = stops[route] = text[len(text) // 2: len(text) // 2 + 3]
        if base["choices"][0]["finish_reason"] == "length":
            assert base["choices"][0]["stop_reason"] is None
        cut = raw(weir, route, {**body, "stop": [stop]}).json()
        validate(spec, cut)
        assert cut["choices"][0]["finish_reason"] == "stop"
        assert cut["choices"][0]["stop_reason"] == stop
        events, done = parse_sse(raw(weir, route, {**body, "stop": [stop], "stream": True}).text)
        assert done
        for e in events:
            validate("CreateChatCompletionStreamResponse", e) if chat else (
                validate_completion_chunk(e))
        ends = [c for e in events for c in e["choices"] if c["finish_reason"]]
        assert [(c["finish_reason"], c["stop_reason"]) for c in ends] == [("stop", stop)]
    # through the SDK, which keeps the field it does not know
    stop = stops["/v1/chat/completions"]
    sdk_cut = client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=30,
                                             temperature=0, stop=[stop])
    assert (sdk_cut.choices[0].model_extra or {}).get("stop_reason") == stop


def test_continuous_usage_stats_stream_the_usage_so_far(weir: WeirProcess) -> None:
    """vLLM's `stream_options.continuous_usage_stats`: every chunk carries the usage so
    far (validated against the spec's chunk schemas), the last the stream's usage."""
    options = {"include_usage": True, "continuous_usage_stats": True}
    ask: dict[str, Any] = {"model": MODEL, "max_tokens": 8, "temperature": 0, "stream": True,
                           "ignore_eos": True, "stream_options": options}
    for route, body in (("/v1/chat/completions", {**ask, "messages": MSG}),
                        ("/v1/completions", {**ask, "prompt": "Once upon a time"})):
        events, done = parse_sse(raw(weir, route, body).text)
        assert done
        chat = route == "/v1/chat/completions"
        for e in events:
            validate("CreateChatCompletionStreamResponse", e) if chat else (
                validate_completion_chunk(e))
        final = events[-1]
        assert final["choices"] == [] and final["usage"]["completion_tokens"] == 8
        running = [e["usage"] for e in events[:-1]]
        assert running and all(u["prompt_tokens"] == final["usage"]["prompt_tokens"]
                               and u["total_tokens"] == u["prompt_tokens"]
                               + u["completion_tokens"] for u in running)
        counts = [u["completion_tokens"] for u in running]
        assert counts == sorted(counts) and counts[-1] == 8 and counts[0] >= 1


def test_a_completion_s_null_max_tokens_is_16_as_on_vllm_s_server(
        client: openai.OpenAI, weir: WeirProcess) -> None:
    """Completions' documented default, null included (not the rest of the context)."""
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": None,
            "ignore_eos": True, "temperature": 0}
    got = raw(weir, "/v1/completions", body).json()
    validate("CreateCompletionResponse", got)
    assert got["usage"]["completion_tokens"] == 16
    assert got["choices"][0]["finish_reason"] == "length"
    r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=None,
                                  temperature=0, extra_body={"ignore_eos": True})
    assert r.usage is not None and r.usage.completion_tokens == 16


def test_a_token_of_part_of_a_character_has_its_own_bytes(client: openai.OpenAI) -> None:
    """Held to the byte tokens of "日" (each a byte of it in the demo's byte-level
    vocabulary), every token's `bytes`, chosen and alternatives, are its own byte: vLLM
    names such a token "" (or "\ufffd"), and its bytes were null (or U+FFFD's)."""
    tok = demo_tokenizer()
    ids = tok.encode("日", add_special_tokens=False)
    assert len(ids) == 3
    for stream in (False, True):
        r: Any = client.chat.completions.create(
            model=MODEL, messages=MSG, max_tokens=6, temperature=0, logprobs=True,
            top_logprobs=2, stream=stream, extra_body={"allowed_token_ids": ids})
        content = ([t for c in r for ch in c.choices
                    for t in ((ch.logprobs and ch.logprobs.content) or [])]
                   if stream else r.choices[0].logprobs.content)
        assert len(content) == 6
        own = [[b] for b in "日".encode()]
        assert all(t.bytes in own for t in content), [t.bytes for t in content]
        # (alternatives are any tokens: each has bytes of its own, none U+FFFD's)
        assert all(a.bytes and a.bytes != list("\ufffd".encode())
                   for t in content for a in t.top_logprobs)
