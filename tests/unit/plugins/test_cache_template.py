"""Cache keys hold what the engine renders a chat with (its chat template, digested):
an answer cached before a template change (Redis keeps them a day) is not replayed for
a request whose prompt now reads otherwise."""

from __future__ import annotations

from plugins.cache.keys import exact_key, semantic_parts
from proxy.context import RequestContext
from proxy.engine import builtin_models
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
    terminal.render_digest = render_digest(SMOLLM2_OWN, "\n")
    _, layer = await run(p, ctx(ASKED), eng)
    assert layer == "miss"
    assert [(await run(p, ctx(q), eng))[1] for q in (ASKED, PARAPHRASE)] == [
        "exact", "semantic"]
    # The engine now serves another template (an upgrade, the operator's): a new prompt.
    terminal.render_digest = render_digest(builtin_models.chat_template("builtin:smollm2"),
                                           "\n")
    _, layer = await run(p, ctx(ASKED), eng)  # (nor its exact nor a semantic answer)
    assert layer == "miss" and eng.calls == 2
    assert [(await run(p, ctx(q), eng))[1] for q in (ASKED, PARAPHRASE)] == [
        "exact", "semantic"]  # (the answers made under the new one)
    assert eng.calls == 2


def completion() -> RequestContext:
    return RequestContext(route="completion", request=CompletionRequest.model_validate(
        {"model": "m", "prompt": ASKED, "temperature": 0}), principal=ALICE,
        request_id="r")


def test_the_digest_is_the_rendering_s_and_only_a_chat_s_key_holds_it() -> None:
    """The digest tells templates (and the parts' separator) apart; a completion's key
    (no template) and every key where the terminal cannot tell it (an upstream renders)
    stay what they were."""
    own, served = render_digest(SMOLLM2_OWN, "\n"), render_digest(
        builtin_models.chat_template("builtin:smollm2"), "\n")
    assert len({own, served, render_digest(SMOLLM2_OWN, ""), render_digest(None, "\n")}) == 4
    assert render_digest(SMOLLM2_OWN, "\n") == own
    chat = ctx(ASKED)
    assert exact_key(chat, "tenant", own) != exact_key(chat, "tenant", served)
    assert exact_key(chat, "tenant", None) == exact_key(chat, "tenant")
    assert semantic_parts(chat, "tenant", own) != semantic_parts(chat, "tenant", served)
    assert semantic_parts(chat, "tenant", None) == semantic_parts(chat, "tenant")
    assert exact_key(completion(), "tenant", own) == exact_key(completion(), "tenant")


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
