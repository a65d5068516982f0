"""Multi-turn near misses: the same last question after other earlier turns is never
served another conversation's answer (the earlier turns are the semantic partition's),
and after the same turns a follow-up that changes what it asks misses by the guard."""

from __future__ import annotations

from typing import Any

import pytest

from plugins.cache.keys import semantic_parts
from plugins.cache.semantic import guard_ok
from proxy.auth import Principal
from proxy.context import RequestContext
from proxy.protocol import ChatCompletionRequest


def _turns(*texts: str) -> RequestContext:
    msgs: list[dict[str, Any]] = [{"role": ("user", "assistant")[i % 2], "content": t}
                                  for i, t in enumerate(texts)]
    return RequestContext(
        route="chat", request=ChatCompletionRequest.model_validate(
            {"model": "m", "messages": msgs, "temperature": 0}),
        principal=Principal("acme", "user", "alice"), request_id="r", headers={})


@pytest.mark.parametrize(("first", "other"), [
    ("I ordered a laptop.", "I ordered a phone."),
    ("My order is 123", "My order is 456"),
    ("I live in France", "I live in Germany"),
    ("I can log in", "I can't log in"),
    ("I want to upgrade", "I want to downgrade"),
    ("I have 10 GB", "I have 10 MB"),
    ("Answer in French.", "Answer in German."),
    ("I'm an admin", "I'm a user"),
    ("Which plan is cheapest?", "Which plan is most expensive?"),
    ("My plan is monthly", "My plan is yearly"),
    ("I bought it on May 5", "I bought it on May 25"),
    ("Hello", "hello"),
    ("I want to import contacts", "I want to export contacts"),
    ("My son's account", "My account"),
    ("Explain like I'm five", "Explain like a pirate"),
])
def test_other_earlier_turns_are_another_partition(first: str, other: str) -> None:
    a = semantic_parts(_turns(first, "OK", "How do I do that?"), "tenant")
    b = semantic_parts(_turns(other, "OK", "How do I do that?"), "tenant")
    assert a is not None and b is not None and a[0] != b[0]


@pytest.mark.parametrize(("stored", "asked"), [
    ("And order 124?", "And order 125?"),
    ("And to Spain?", "And to Italy?"),
    ("Can you say it in French?", "Can you say it in German?"),
    ("Why?", "How long does it take?"),
    ("What about the monthly plan?", "What about the yearly plan?"),
    ("And if I don't?", "And if I do?"),
    ("Shorter please.", "Longer please."),
])
def test_a_follow_up_that_asks_another_thing_misses(stored: str, asked: str) -> None:
    turns = ("How do I reset my password?", "Go to settings.")
    a = semantic_parts(_turns(*turns, stored), "tenant")
    b = semantic_parts(_turns(*turns, asked), "tenant")
    assert a is not None and b is not None and a[0] == b[0]
    assert not guard_ok(b[1], a[1])
