"""Cache keys hold what the engine's answers depend on besides the request (its chat
template, tool parser, structured-output options, ...: `Terminal.answer_digest_for`): an
answer cached before such a change (Redis keeps them a day) is not replayed for a
request that is now answered otherwise."""

from __future__ import annotations

from plugins.cache.keys import exact_key, semantic_parts
from proxy.chain import Completion, Reply
from proxy.context import RequestContext
from proxy.engine import builtin_models
from proxy.engine.answering import answer_digest
from proxy.engine.chat_text import render_digest
from proxy.protocol import CompletionRequest
from tests.fakes import FakeEngine
from tests.unit.plugins.test_cache import ALICE, Engine, ctx, plugin, run
from tests.unit.test_builtin_models import SMOLLM2_OWN

ASKED = "How can I reset my password please?"
PARAPHRASE = "How do I reset my password now please?"


async def test_an_answer_cached_under_another_template_is_not_replayed() -> None:
    p, eng = plugin(semantic={"threshold": 0.8}), Engine()
    terminal = p.services.terminal
    assert isinstance(terminal, FakeEngine)
    terminal.answer_digest = render_digest(SMOLLM2_OWN, "\n")
    _, layer = await run(p, ctx(ASKED), eng)
    assert layer == "miss"
    assert [(await run(p, ctx(q), eng))[1] for q in (ASKED, PARAPHRASE)] == [
        "exact", "semantic"]
    # The engine now serves another template (an upgrade, the operator's): a new prompt.
    terminal.answer_digest = render_digest(builtin_models.chat_template("builtin:smollm2"),
                                           "\n")
    _, layer = await run(p, ctx(ASKED), eng)  # (nor its exact nor a semantic answer)
    assert layer == "miss" and eng.calls == 2
    assert [(await run(p, ctx(q), eng))[1] for q in (ASKED, PARAPHRASE)] == [
        "exact", "semantic"]  # (the answers made under the new one)
    assert eng.calls == 2


async def test_another_models_digest_moving_leaves_this_models_answers_served() -> None:
    """Keys hold the digest of the model asked for (`Terminal.answer_digest_for`): an
    upstream's one digest of its whole model list moved every model's keys when any
    model or adapter came, and every cached answer missed at once."""
    p, eng = plugin(semantic={"threshold": 0.8}), Engine()
    terminal = p.services.terminal
    assert isinstance(terminal, FakeEngine)
    terminal.model_digests = {"m": "m-a", "other": "o-a"}
    assert [(await run(p, ctx(q), eng))[1] for q in (ASKED, ASKED, PARAPHRASE)] == [
        "miss", "exact", "semantic"]
    terminal.model_digests = {"m": "m-a", "other": "o-b", "m-lora": "l-a"}
    assert [(await run(p, ctx(q), eng))[1] for q in (ASKED, PARAPHRASE)] == [
        "exact", "exact"]  # (the paraphrase's hit left it an alias)
    terminal.model_digests["m"] = "m-b"  # (another checkpoint behind "m")
    assert [(await run(p, ctx(q), eng))[1] for q in (ASKED, PARAPHRASE)] == [
        "miss", "semantic"]  # (the paraphrase: of the answer made under "m-b")
    assert eng.calls == 2


def completion() -> RequestContext:
    return RequestContext(route="completion", request=CompletionRequest.model_validate(
        {"model": "m", "prompt": ASKED, "temperature": 0}), principal=ALICE,
        request_id="r")


def test_the_digest_tells_renderings_apart_and_every_key_holds_it() -> None:
    """The rendering's digest tells templates (and the parts' separator) apart; every
    key holds the engine's digest, a completion's too (a tool parser or compact JSON
    shapes its answer as well), and where the terminal can tell none the keys stay what
    they were."""
    own, served = render_digest(SMOLLM2_OWN, "\n"), render_digest(
        builtin_models.chat_template("builtin:smollm2"), "\n")
    assert len({own, served, render_digest(SMOLLM2_OWN, ""), render_digest(None, "\n")}) == 4
    assert render_digest(SMOLLM2_OWN, "\n") == own
    chat = ctx(ASKED)
    assert exact_key(chat, "tenant", own) != exact_key(chat, "tenant", served)
    assert exact_key(chat, "tenant", None) == exact_key(chat, "tenant")
    assert semantic_parts(chat, "tenant", own) != semantic_parts(chat, "tenant", served)
    assert semantic_parts(chat, "tenant", None) == semantic_parts(chat, "tenant")
    assert exact_key(completion(), "tenant", own) != exact_key(completion(), "tenant", served)
    assert exact_key(completion(), "tenant", None) == exact_key(completion(), "tenant")


async def test_a_completion_cached_under_other_engine_settings_is_not_replayed() -> None:
    """A completion's answer depends on the engine's settings too (`response_format`
    under compact structured output, another model behind the name): its key held none
    of them, and an answer cached before a change was replayed."""
    p, calls = plugin(), []

    async def eng(c: RequestContext) -> Reply:
        calls.append(c)
        return Completion({"id": "cmpl-1", "object": "text_completion", "created": 1,
                           "model": "m", "choices": [{"index": 0, "text": "{}",
                                                      "logprobs": None, "finish_reason": "stop"}],
                           "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                     "total_tokens": 2}})

    terminal = p.services.terminal
    assert isinstance(terminal, FakeEngine)
    terminal.answer_digest = answer_digest({"structured_output_compact": True})
    assert [(await run(p, completion(), eng))[1] for _ in range(2)] == ["miss", "exact"]
    terminal.answer_digest = answer_digest({"structured_output_compact": False})
    assert [(await run(p, completion(), eng))[1] for _ in range(2)] == ["miss", "exact"]
    assert len(calls) == 2


def test_the_rendering_version_moves_with_how_earlier_calls_are_shown() -> None:
    """Cache keys hold `RENDERING_VERSION`, which says how Weir hands a chat to the
    template. Stop 47 changed what an earlier call's arguments are shown as (one JSON
    string as sent, `"Berlin"`, no longer its bare text; a lone surrogate's escape as
    sent): an answer cached for a conversation holding such a call (Redis keeps it a day)
    answered the prompt as it read before, and was replayed for the one it reads now.
    (Where `template_calls` shows calls otherwise again, bump the version with this.)"""
    from proxy.engine.chat_text import RENDERING_VERSION
    from proxy.protocol import ToolCall
    from proxy.tools import template_calls

    calls = [ToolCall.model_validate({"id": f"c{i}", "function": {"name": "f", "arguments": a}})
             for i, a in enumerate(['"Berlin"', '{"city": "Paris"}', '{"a": "\\ud800"}'])]
    shown = [c["function"]["arguments"] for c in template_calls(calls)]
    assert (RENDERING_VERSION, shown) == (2, ['"Berlin"', {"city": "Paris"}, '{"a": "\\ud800"}'])
