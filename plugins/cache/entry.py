"""A cached answer, how it is captured from a live reply, and how it is replayed.

An Entry holds the answer's choices (text and finish reason), its usage, and who it
belongs to (scope, tenant, role, user: for isolation checks and purges). It is captured
from a whole Completion body or assembled from a stream's chunks, and replayed through
`proxy.responses`, so a cached answer has the same shapes as a live one: streamed when
the request streams (usage chunk included when asked), whole otherwise.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from typing import Any

from proxy import responses as R
from proxy import tools as T
from proxy.protocol import ChatCompletionRequest, CompletionRequest


@dataclass(slots=True)
class Entry:
    key: str
    route: str
    model: str
    choices: list[dict[str, Any]]  # {"index", "text", "finish_reason"[, "tool_calls"]}
    usage: dict[str, int]
    scope: str
    tenant: str
    role: str
    user: str
    prompt: str
    created: float = field(default_factory=time.time)
    expires: float = 0.0
    stale_until: float = 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_json(cls, data: str | bytes) -> Entry:
        return cls(**json.loads(data))

    def fresh(self, now: float) -> bool:
        return now < self.expires

    def usable(self, now: float, allow_stale: bool) -> bool:
        return now < (self.stale_until if allow_stale else self.expires)

    def answer_text(self) -> str:
        return "\n".join(c["text"] for c in self.choices)

    def age(self, now: float) -> int:
        return max(0, int(now - self.created))


def capture_body(body: dict[str, Any], route: str) -> tuple[list[dict[str, Any]],
                                                            dict[str, int]] | None:
    """Choices and usage of a whole answer, or None if it is not a normal answer."""
    choices = []
    for c in body.get("choices") or []:
        text = (c.get("message") or {}).get("content") if route == "chat" else c.get("text")
        calls = (c.get("message") or {}).get("tool_calls") if route == "chat" else None
        if calls and text is None:
            text = ""
        if not isinstance(text, str) or c.get("finish_reason") is None:
            return None
        choices.append({"index": c["index"], "text": text, "finish_reason": c["finish_reason"]})
        if calls:
            choices[-1]["tool_calls"] = calls
    usage = body.get("usage") or {}
    if not choices:
        return None
    return choices, {"prompt_tokens": int(usage.get("prompt_tokens", 0)),
                     "completion_tokens": int(usage.get("completion_tokens", 0))}


class StreamAssembler:
    """Collects a live stream's chunks into an answer (the stream passes through)."""

    def __init__(self, route: str) -> None:
        self.route = route
        self.texts: dict[int, list[str]] = {}
        self.reasons: dict[int, str] = {}
        self.usage: dict[str, int] | None = None
        self.error = False
        self.calls: dict[int, T.CallAssembler] = {}

    def feed(self, chunk: dict[str, Any]) -> None:
        if "error" in chunk:
            self.error = True
            return
        for c in chunk.get("choices") or []:
            i = c["index"]
            piece = (c.get("delta") or {}).get("content") if self.route == "chat" else c.get(
                "text")
            self.texts.setdefault(i, []).append(piece or "")
            deltas = (c.get("delta") or {}).get("tool_calls") if self.route == "chat" else None
            if deltas:
                self.calls.setdefault(i, T.CallAssembler()).feed(deltas)
            if c.get("finish_reason"):
                self.reasons[i] = c["finish_reason"]
        if chunk.get("usage"):
            u = chunk["usage"]
            self.usage = {"prompt_tokens": int(u.get("prompt_tokens", 0)),
                          "completion_tokens": int(u.get("completion_tokens", 0))}

    def result(self) -> tuple[list[dict[str, Any]], dict[str, int]] | None:
        if self.error or not self.texts or set(self.texts) != set(self.reasons):
            return None
        choices = [{"index": i, "text": "".join(t), "finish_reason": self.reasons[i]}
                   for i, t in sorted(self.texts.items())]
        for c in choices:
            if c["index"] in self.calls:
                c["tool_calls"] = self.calls[c["index"]].result()
        return choices, self.usage or {"prompt_tokens": 0, "completion_tokens": 0}


def _usage(entry: Entry) -> dict[str, Any]:
    return R.usage(entry.usage["prompt_tokens"], entry.usage["completion_tokens"])


def replay_body(entry: Entry, req: ChatCompletionRequest | CompletionRequest) -> dict[str, Any]:
    if entry.route == "chat":
        return R.chat_completion(
            id=R.new_id("chatcmpl"), model=req.model, created=R.now(), usage_=_usage(entry),
            choices=[T.with_calls(R.chat_choice(c["index"], c["text"], c["finish_reason"], None),
                                  c.get("tool_calls") or [])
                     for c in entry.choices])
    return R.completion_body(
        id=R.new_id("cmpl"), model=req.model, created=R.now(), usage_=_usage(entry),
        choices=[R.completion_choice(c["index"], c["text"], c["finish_reason"], None)
                 for c in entry.choices])


async def replay_stream(entry: Entry, req: ChatCompletionRequest | CompletionRequest,
                        ) -> AsyncIterator[dict[str, Any]]:
    """The answer as a stream: one content chunk per choice carrying its finish reason."""
    created, model = R.now(), req.model
    include_usage = req.include_usage
    if entry.route == "chat":
        cid = R.new_id("chatcmpl")
        for c in entry.choices:
            calls = c.get("tool_calls") or []
            choice = R.chat_chunk_choice(c["index"], content=c["text"] or (None if calls else ""),
                                         first=True, reason=c["finish_reason"], logprobs=None)
            yield R.chat_chunk(id=cid, model=model, created=created, include_usage=include_usage,
                               choices=[T.with_call_deltas(choice, T.replay_deltas(calls))])
        obj = "chat.completion.chunk"
    else:
        cid = R.new_id("cmpl")
        for c in entry.choices:
            yield R.completion_body(id=cid, model=model, created=created, usage_=None,
                                    choices=[R.completion_choice(c["index"], c["text"],
                                                                 c["finish_reason"], None)])
        obj = "text_completion"
    if include_usage:
        yield R.usage_chunk(id=cid, model=model, created=created, object_=obj,
                            usage_=_usage(entry))
