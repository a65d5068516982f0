"""Builders for OpenAI response objects and stream chunks (JSON-ready dicts).

One place decides the shapes, so live answers, cached replays and fallbacks all look
alike. Shapes follow the official spec (`shared/openai/openapi.yaml`): chat chunks carry
the role only in a choice's first delta; every chunk of a stream has the same id;
a choice's `finish_reason` is set exactly once, with vLLM's `stop_reason` beside it (the
stop string or stop token id that ended the choice; null otherwise), as a whole choice
carries it (a completion's chunks carry it null before that, as vLLM's server sends
them); with `include_usage`, each chunk has `usage: null` (or, with vLLM's
`continuous_usage_stats`, the usage so far) and a last chunk carries the usage with
`choices: []`.
"""

from __future__ import annotations

import time
from typing import Any

from .engine.base import TokenLogprob, TopLogprob
from .ids import new_hex

#: What a stop string or stop token id ended a choice with (vLLM's `stop_reason`).
StopReason = int | str | None


def new_id(prefix: str) -> str:
    return f"{prefix}-{new_hex(96)}"


def usage(prompt: int, completion: int, cached: int = 0) -> dict[str, Any]:
    u: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if cached:
        u["prompt_tokens_details"] = {"cached_tokens": cached}
    return u


#: The breakdowns a usage may carry (OpenAI's `CompletionUsage`): each a map of counts.
USAGE_DETAILS = ("prompt_tokens_details", "completion_tokens_details")


def usage_details(usage: Any) -> dict[str, dict[str, int]]:
    """The breakdowns of `usage` (its `prompt_tokens_details`, `completion_tokens_details`:
    ours, or an upstream's), their whole non-negative counts only (what else is there is
    no count to replay); none where it has none."""
    if not isinstance(usage, dict):
        return {}
    kept = {}
    for name in USAGE_DETAILS:
        d = usage.get(name)
        counts = {k: v for k, v in d.items() if type(v) is int and v >= 0} \
            if isinstance(d, dict) else {}
        if counts:
            kept[name] = counts
    return kept


def finish(reason: str | None) -> str:
    """Engine finish reasons to OpenAI's enum ('abort' only reaches here on shutdown)."""
    return "length" if reason == "length" else "stop"


# ------------------------------------------------------------------------------ chat


def chat_logprobs(entries: list[TokenLogprob], top: int) -> list[dict[str, Any]]:
    return [
        {
            "token": e.token,
            "logprob": e.logprob,
            "bytes": e.bytes,
            "top_logprobs": [
                {"token": t.token, "logprob": t.logprob, "bytes": t.bytes} for t in e.top[:top]
            ],
        }
        for e in entries
    ]


def chat_completion(
    *,
    id: str,
    model: str,
    created: int,
    choices: list[dict[str, Any]],
    usage_: dict[str, Any],
) -> dict[str, Any]:
    return {
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage_,
    }


def chat_choice(
    index: int, text: str, reason: str, logprobs: list[dict[str, Any]] | None,
    stop_reason: StopReason = None,
) -> dict[str, Any]:
    return {
        "index": index,
        "message": {"role": "assistant", "content": text, "refusal": None},
        "logprobs": {"content": logprobs, "refusal": None} if logprobs is not None else None,
        "finish_reason": reason,
        "stop_reason": stop_reason,
    }


def chat_chunk(
    *,
    id: str,
    model: str,
    created: int,
    choices: list[dict[str, Any]],
    include_usage: bool,
    usage_: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`usage_`: the usage so far (`continuous_usage_stats`), else null."""
    chunk: dict[str, Any] = {
        "id": id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": choices,
    }
    if include_usage:
        chunk["usage"] = usage_
    return chunk


def chat_chunk_choice(
    index: int,
    *,
    content: str | None,
    first: bool,
    reason: str | None,
    logprobs: list[dict[str, Any]] | None,
    stop_reason: StopReason = None,
) -> dict[str, Any]:
    """`stop_reason` goes out with the finish reason (the choice's last chunk), as vLLM's
    server sends it."""
    delta: dict[str, Any] = {}
    if first:
        delta["role"] = "assistant"
    if content is not None:
        delta["content"] = content
    choice = {
        "index": index,
        "delta": delta,
        "logprobs": {"content": logprobs, "refusal": None} if logprobs is not None else None,
        "finish_reason": reason,
    }
    if reason is not None:
        choice["stop_reason"] = stop_reason
    return choice


def usage_chunk(
    *, id: str, model: str, created: int, object_: str, usage_: dict[str, Any]
) -> dict[str, Any]:
    return {
        "id": id,
        "object": object_,
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage_,
    }


# ------------------------------------------------------------------------ completions


def completion_logprobs(entries: list[TokenLogprob], top: int, offset: int,
                        prompt: list[TokenLogprob] | None = None) -> dict[str, Any]:
    """A completion choice's `logprobs`: the echoed `prompt`'s entries first (placed from
    0), then the generated ones (placed from `offset`, where they start in the text). A
    prompt's first token has no logprob: null in `token_logprobs` and `top_logprobs`, as
    OpenAI's and vLLM's servers send it (OpenAI's spec types these items as numbers)."""
    tokens, token_logprobs, tops, offsets = [], [], [], []
    for part, start in ((prompt or [], 0), (entries, offset)):
        pos = start
        for e in part:
            tokens.append(e.token)
            token_logprobs.append(e.logprob)
            tops.append(None if e.logprob is None else _top_map(e, top))
            offsets.append(pos)
            pos += len(e.token)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "text_offset": offsets,
            "top_logprobs": tops}


def _top_map(e: TokenLogprob, top: int) -> dict[str, float | None]:
    """A completion token's `top_logprobs`: the top ones and always the chosen one, up
    to `logprobs` + 1, as OpenAI says (`logprobs: 0` is the chosen one alone, as vLLM's
    server sends it), by rank. Keyed by token text, the chosen one's as in `tokens`; an
    alternative whose text is no key of its own (part of a character, "", as the
    chosen one or another may be; or a text an earlier one has) is spelled by its
    bytes as OpenAI spells a token that is no UTF-8 text (`bytes:\\xe2\\x80`), else by
    its id (vLLM's `token_id:N`): a dict of texts kept only one of them."""
    out: dict[str, float | None] = {}
    chosen = False
    for t in e.top[:top]:
        if not chosen and t.token == e.token and t.bytes == e.bytes:
            out[e.token] = e.logprob
            chosen = True
            continue
        out[_alternative_key(t, out, e.token)] = t.logprob
    if not chosen:
        out[e.token] = e.logprob
    return out


def _alternative_key(t: TopLogprob, taken: dict[str, float | None], chosen: str) -> str:
    if t.token and t.token != chosen and t.token not in taken:
        return t.token
    if not t.token and t.bytes:
        spelled = "bytes:" + "".join(f"\\x{b:02x}" for b in t.bytes)
        if spelled != chosen and spelled not in taken:
            return spelled
    if t.id is not None:
        return f"token_id:{t.id}"
    return t.token  # (nothing else to tell it by: as before)


def completion_body(
    *,
    id: str,
    model: str,
    created: int,
    choices: list[dict[str, Any]],
    usage_: dict[str, Any] | None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
    }
    if usage_ is not None:
        body["usage"] = usage_
    return body


def completion_choice(
    index: int, text: str, reason: str | None, logprobs: dict[str, Any] | None,
    stop_reason: StopReason = None,
) -> dict[str, Any]:
    """A whole choice, or a streamed one: `stop_reason` in every chunk, null until the
    last (vLLM's server sends a completion's so; its chat chunks carry it in the last
    alone: `chat_chunk_choice`)."""
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason,
            "stop_reason": stop_reason}


def now() -> int:
    return int(time.time())
