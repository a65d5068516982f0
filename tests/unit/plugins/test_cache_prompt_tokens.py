"""A hit's `usage.prompt_tokens` is the asker's prompt, as a miss of it counts it: a
semantic hit answers a paraphrase, whose prompt is not the stored question's."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.chain import Completion, Reply, Stream
from proxy.context import RequestContext
from proxy.preparing import prompt_tokens
from tests.fakes import FakeEngine
from tests.unit.plugins.test_cache import chunks_of, ctx, plugin, run

CONTINUOUS = {"include_usage": True, "continuous_usage_stats": True}
ASKED = "How can I reset my password please?"
PARAPHRASE = "How do I reset my password now please?"


def counted(c: RequestContext) -> int:
    """The prompt's tokens as the engine reads them (the plugin's terminal: FakeEngine)."""
    return prompt_tokens(FakeEngine(), c.request)


class Counting:
    """A stub call_next answering two choices whole, counting the prompt as a miss does."""

    calls = 0

    async def __call__(self, c: RequestContext) -> Reply:
        self.calls += 1
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
