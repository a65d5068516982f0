"""A cached answer, how it is captured from a live reply, and how it is replayed.

An Entry holds the answer's choices (text, finish reason and vLLM's `stop_reason`: an
entry stored before it was kept replays it as null), its usage, and who it
belongs to (scope, tenant, role, user: for isolation checks and purges). `prompt` (for
purges by content) lives in process memory; what leaves the process (Redis) carries it
only when the operator opts in, so an entry read back from Redis may have it empty. It
is captured from a whole Completion body or from what a finished Stream carries (its
`answer` and `usage`), and replayed through
`proxy.responses`, so a cached answer has the same shapes as a live one: streamed when
the request streams (usage chunk included when asked; with `continuous_usage_stats`,
one choice a chunk, each with that choice's own usage, as the miss's last chunk of it
carried it: each choice keeps it), whole otherwise.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

import orjson

from proxy import responses as R
from proxy import tools as T
from proxy.protocol import ChatCompletionRequest, CompletionRequest, continuous_usage
from proxy.rendering import usage_ok


@dataclass(slots=True)
class Entry:
    key: str
    route: str
    model: str
    #: {"index", "text", "finish_reason"[, "stop_reason"][, "usage"][, "tool_calls"[,
    #: "order"]]}; `order`: a choice's text and calls in the order the model wrote them,
    #: where it has both and it is known (`Completion.order`): the Responses API's items
    #: keep it. `usage`: the choice's own (its prompt's tokens, those it generated), where
    #: the answer counted them (`Completion.usages`; not an upstream's, nor an entry
    #: stored before they were kept).
    choices: list[dict[str, Any]]
    #: {"prompt_tokens", "completion_tokens"[, "prompt_tokens_details"][,
    #: "completion_tokens_details"]}: the miss's (an entry stored before the breakdowns
    #: were kept replays none).
    usage: dict[str, Any]
    scope: str
    tenant: str
    role: str
    user: str
    prompt: str = ""
    created: float = field(default_factory=time.time)
    expires: float = 0.0
    stale_until: float = 0.0
    #: A paraphrase kept as an exact alias (`promote`): the key of the entry it answers
    #: from. In memory only (never stored): a purge naming that entry drops the alias.
    source: str = ""
    #: Such an alias's asker (tenant, role, user, their paraphrase), where it came from: a
    #: purge of that user (or tenant, role) drops the alias, which holds their prompt. In
    #: memory only, as `source`.
    asker: tuple[str, str, str, str] | None = None
    #: The prompt its usage counts, verbatim (`keys.asked_digest`): the key reads the
    #: prompt normalized (spaces collapsed, look-alikes folded), so a repeat may be
    #: another prompt, of other tokens. "" (an entry stored before it was kept): unknown.
    asked: str = ""

    def to_json(self, *, with_prompt: bool = True) -> str:
        return self._dumps(with_prompt).decode()

    def size(self) -> int:
        """Its JSON's size in bytes (UTF-8, as Redis stores it): what the byte bounds
        count. Its length in characters let an answer of 4-byte characters (emoji, rare
        CJK) take four times a bound."""
        return len(self._dumps(True))

    def _dumps(self, with_prompt: bool) -> bytes:
        # A shallow dict: the choices and usage are plain JSON already (asdict's deep
        # copy was most of a store's cost).
        data = {name: getattr(self, name) for name in _FIELDS}
        if not with_prompt:
            del data["prompt"]
        try:
            return orjson.dumps(data)
        except TypeError:  # what orjson refuses (a lone surrogate from an upstream's
            return json.dumps(data, separators=(",", ":")).encode()  # JSON, a huge int)

    @classmethod
    def from_json(cls, data: str | bytes) -> Entry:
        """An entry read back (from Redis: anything may be there, another version's
        entry, or garbage). Fields it does not know are left out; one it needs that is
        missing or of the wrong type raises BadEntry, never a TypeError further on."""
        try:
            try:
                d = orjson.loads(data)
            except orjson.JSONDecodeError:  # escaped by to_json's fallback
                d = json.loads(data)
        except (ValueError, TypeError, RecursionError):
            raise BadEntry("not JSON") from None
        if not isinstance(d, dict):
            raise BadEntry("not an object")
        for name, kind in _TYPES.items():
            if (name in d and (not isinstance(d[name], kind) or isinstance(d[name], bool))) or (
                    name in _REQUIRED and name not in d):
                raise BadEntry(name)
        if not choices_ok(d["choices"]) or not usage_ok(d["usage"]):
            raise BadEntry("choices or usage")
        if d["route"] not in ("chat", "completion") or not all(
                math.isfinite(d[k]) for k in ("created", "expires", "stale_until") if k in d):
            raise BadEntry("route or times")
        return cls(**{k: v for k, v in d.items() if k in _TYPES})

    def fresh(self, now: float) -> bool:
        return now < self.expires

    def usable(self, now: float, allow_stale: bool) -> bool:
        return now < (self.stale_until if allow_stale else self.expires)

    def answer_text(self) -> str:
        return "\n".join(c["text"] for c in self.choices)

    def age(self, now: float) -> int:
        return max(0, int(now - self.created))

    def young(self, now: float, max_age: float | None) -> bool:
        """Whether it is at most `max_age` seconds old (None: any age), as a request's
        `Cache-Control: max-age` asks."""
        return max_age is None or self.age(now) <= max_age


_FIELDS = tuple(f.name for f in fields(Entry) if f.name not in ("source", "asker"))
_NUMBER = (int, float)
#: Each stored field's type (bool is an int to Python: not a number here either).
_TYPES: dict[str, Any] = {"key": str, "route": str, "model": str, "choices": list,
                          "usage": dict, "scope": str, "tenant": str, "role": str,
                          "user": str, "prompt": str, "created": _NUMBER,
                          "expires": _NUMBER, "stale_until": _NUMBER, "asked": str}
_REQUIRED = frozenset({"key", "route", "model", "choices", "usage", "scope", "tenant",
                       "role", "user"})


class BadEntry(ValueError):
    """A stored entry that cannot be read (garbage, or a shape this version does not
    know): a miss, never an answer or a 500. `field`: what of it could not be read (a
    field's name, never its value)."""

    def __init__(self, field: str) -> None:
        super().__init__(field)
        self.field = field


def choices_ok(choices: list[Any]) -> bool:
    """Whether `choices` are an answer's: each of a choice's shape, indexed 0 to n - 1
    once each (in any order), as a reply carries them."""
    return bool(choices) and all(choice_ok(c) for c in choices) and sorted(
        c["index"] for c in choices) == list(range(len(choices)))


def choice_ok(c: Any) -> bool:
    return (isinstance(c, dict) and isinstance(c.get("index"), int)
            and isinstance(c.get("text"), str) and isinstance(c.get("finish_reason"), str)
            and _stop_reason_ok(c.get("stop_reason"))
            and ("usage" not in c or usage_ok(c["usage"]))
            and isinstance(c.get("tool_calls", []), list)
            and all(_call_ok(t) for t in c.get("tool_calls", []))
            and ("order" not in c or T.order_agrees(c["order"], c["text"],
                                                    c.get("tool_calls", []))))


def _stop_reason_ok(r: Any) -> bool:
    """A stop string, a stop token id, or none (vLLM's `stop_reason`)."""
    return r is None or isinstance(r, str) or (isinstance(r, int) and not isinstance(r, bool))


def _call_ok(t: Any) -> bool:
    fn = t.get("function") if isinstance(t, dict) else None
    return (isinstance(fn, dict) and isinstance(fn.get("name"), str)
            and isinstance(fn.get("arguments"), str))


def capture_body(body: dict[str, Any], route: str, order: list[str | int] | None = None,
                 usages: dict[int, dict[str, int]] | None = None,
                 ) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
    """Choices and usage of a whole answer, or None if it is not a normal answer: one of
    another shape (an upstream's) is not stored, since each replay would read it again.
    `order` (`Completion.order`): the first choice's text and calls in the order the
    model wrote them, kept with it where it agrees with them; `usages`
    (`Completion.usages`): each choice's own usage, kept with it."""
    raw, usage = body.get("choices"), captured_usage(body.get("usage"))
    if not isinstance(raw, list) or not raw or usage is None:
        return None
    choices = []
    for c in raw:
        if not isinstance(c, dict):
            return None
        message = c.get("message") if route == "chat" else None
        if route == "chat" and not isinstance(message, dict):
            return None
        text = message.get("content") if message is not None else c.get("text")
        calls = message.get("tool_calls") if message is not None else None
        if calls and text is None:
            text = ""
        choice = {"index": c.get("index"), "text": text, "finish_reason": c.get("finish_reason"),
                  "stop_reason": c.get("stop_reason")}
        own = usages.get(c["index"]) if usages is not None and isinstance(
            c.get("index"), int) else None
        if own is not None:
            choice["usage"] = dict(own)
        if calls:
            choice["tool_calls"] = calls
            if c.get("index") == 0 and T.order_agrees(order, text, calls):
                choice["order"] = order
        if not choice_ok(choice):
            return None
        choices.append(choice)
    return (choices, usage) if choices_ok(choices) else None


def captured_usage(usage: Any) -> dict[str, Any] | None:
    """An answer's usage as an entry keeps it, or None where what it gives is no usage
    (none given: an upstream that sent none, not asked or ignoring `stream_options`; as
    zeros, every hit on it had said it took no tokens)."""
    if not isinstance(usage, dict):
        return None
    kept: dict[str, Any] = {k: usage.get(k, 0) for k in ("prompt_tokens", "completion_tokens")}
    # Its breakdowns too (the engine's prefix-cache hits, an upstream's reasoning tokens):
    # a hit reports the usage of the miss that made it.
    return {**kept, **R.usage_details(usage)} if usage_ok(kept) else None


def asked_with(entry: Entry, prompt_tokens: int) -> Entry:
    """`entry` as the answer to another prompt of `prompt_tokens` tokens (a paraphrase's:
    a semantic hit), in its usage and each choice's. The miss's breakdown of its prompt
    (`prompt_tokens_details`: the engine's prefix-cache hits on it) is no count of this
    one, which no engine read: left out; the answer's own (`completion_tokens_details`)
    still holds. For a chat's entry (one prompt: the semantic layer's), the only kind it
    is given."""
    usage = {k: v for k, v in entry.usage.items() if k != "prompt_tokens_details"}
    usage["prompt_tokens"] = prompt_tokens
    return replace(entry, usage=usage, choices=[
        {**c, "usage": {**c["usage"], "prompt_tokens": prompt_tokens}} if "usage" in c else c
        for c in entry.choices])


def _usage(entry: Entry) -> dict[str, Any]:
    """The usage of the miss that made it, its breakdowns included (copies: a body's)."""
    u = R.usage(entry.usage["prompt_tokens"], entry.usage["completion_tokens"])
    u.update((k, dict(v)) for k, v in R.usage_details(entry.usage).items())
    return u


def _fresh_ids(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A replayed tool call gets an id of its own: clients match a call's result to it
    by id, across a conversation that may hold the same cached call twice."""
    return [{**c, "id": T.new_call_id()} for c in calls]


def replay_body(entry: Entry, req: ChatCompletionRequest | CompletionRequest) -> dict[str, Any]:
    if entry.route == "chat":
        return R.chat_completion(
            id=R.new_id("chatcmpl"), model=req.model, created=R.now(), usage_=_usage(entry),
            choices=[T.with_calls(R.chat_choice(c["index"], c["text"], c["finish_reason"], None,
                                                c.get("stop_reason")),
                                  _fresh_ids(c.get("tool_calls") or []))
                     for c in entry.choices])
    return R.completion_body(
        id=R.new_id("cmpl"), model=req.model, created=R.now(), usage_=_usage(entry),
        choices=[R.completion_choice(c["index"], c["text"], c["finish_reason"], None,
                                     c.get("stop_reason"))
                 for c in entry.choices])


def replay_order(entry: Entry) -> list[str | int] | None:
    """The first choice's text and calls in the order the model wrote them, where kept
    (`Completion.order`: a whole hit's Responses items follow it)."""
    first = next((c for c in entry.choices if c["index"] == 0), None)
    return first.get("order") if first is not None else None


async def replay_stream(entry: Entry, req: ChatCompletionRequest | CompletionRequest,
                        ) -> AsyncIterator[dict[str, Any]]:
    """The answer as a stream: one content chunk per choice carrying its finish reason
    (after its calls, in a chunk of its own: `finish_apart`); with
    `continuous_usage_stats`, each carries its choice's own usage (`choice_usages`), as
    the miss's last chunk of that choice did (one choice a chunk there too)."""
    created, model = R.now(), req.model
    include_usage = req.include_usage
    running = choice_usages(entry, req.n) if continuous_usage(req) else None
    if entry.route == "chat":
        cid = R.new_id("chatcmpl")
        for c in entry.choices:
            own = running[c["index"]] if running is not None else None
            for choice in _replayed_pieces(c):
                for part in T.finish_apart([choice]):
                    yield R.chat_chunk(id=cid, model=model, created=created,
                                       include_usage=include_usage, choices=part,
                                       usage_=own and {**own})  # (one dict a chunk)
        obj = "chat.completion.chunk"
    else:
        cid = R.new_id("cmpl")
        for c in entry.choices:
            yield R.completion_body(id=cid, model=model, created=created,
                                    usage_=(running[c["index"]] if running is not None
                                            else None),
                                    choices=[R.completion_choice(c["index"], c["text"],
                                                                 c["finish_reason"], None,
                                                                 c.get("stop_reason"))])
        obj = "text_completion"
    if include_usage:
        yield R.usage_chunk(id=cid, model=model, created=created, object_=obj,
                            usage_=_usage(entry))


def choice_usages(entry: Entry, n: int) -> dict[int, dict[str, Any]]:
    """Each choice's own usage by its index, as a miss's last chunk of it carries it with
    `continuous_usage_stats`: its prompt's tokens and the tokens it generated (the
    choices of the prompt `index // n`). An entry that did not keep them for each choice
    (relayed from an upstream, which counts only the totals, or stored before they were
    kept) has its totals shared out evenly: each prompt's choices its prompt tokens, each
    choice its part of the completion tokens (the first ones one more where they do not
    divide), so they still add up to the usage chunk's."""
    if all("usage" in c for c in entry.choices):
        return {c["index"]: R.usage(c["usage"]["prompt_tokens"],
                                    c["usage"]["completion_tokens"]) for c in entry.choices}
    count = len(entry.choices)
    prompts = max(1, count // max(1, n))
    prompt = _shares(entry.usage["prompt_tokens"], prompts)
    completion = _shares(entry.usage["completion_tokens"], count)
    return {i: R.usage(prompt[min(i // max(1, n), prompts - 1)], completion[i])
            for i in range(count)}


def _shares(total: int, parts: int) -> list[int]:
    """`total` in `parts` whole parts as even as can be, the larger ones first."""
    return [total // parts + (k < total % parts) for k in range(parts)]


def _replayed_pieces(c: dict[str, Any]) -> list[dict[str, Any]]:
    """A chat choice's chunk choices: one, its text and calls, or where its `order` is
    kept, one per piece in that order (a Responses stream makes its items in the order
    its deltas come), its finish reason on the last."""
    calls = _fresh_ids(c.get("tool_calls") or [])
    order: list[str | int] = c.get("order") or []
    if not order:
        choice = R.chat_chunk_choice(c["index"], content=c["text"] or (None if calls else ""),
                                     first=True, reason=c["finish_reason"], logprobs=None,
                                     stop_reason=c.get("stop_reason"))
        return [T.with_call_deltas(choice, T.replay_deltas(calls))]
    out = []
    for k, part in enumerate(order):
        choice = R.chat_chunk_choice(
            c["index"], content=part if isinstance(part, str) else None, first=k == 0,
            reason=c["finish_reason"] if k == len(order) - 1 else None, logprobs=None,
            stop_reason=c.get("stop_reason"))
        if isinstance(part, int):
            T.with_call_deltas(choice, [{"index": part, **calls[part]}])
        out.append(choice)
    return out


Match = Callable[[Entry], bool]


def matcher(f: dict[str, Any]) -> Match:
    """The entry filter of purges and stats: every field given (tenant, role, user, key)
    must equal the entry's (its owner's, or an alias's asker's; a key the entry's own or,
    for a paraphrase's alias, its original's), except that a tenant
    covers the callers a gateway's key of it forwards for (`tenant~...`, `proxy.auth`);
    `contains` is a case-insensitive substring of the prompt or the answer."""
    needle = (f.get("contains") or "").casefold()
    tenant, role, user, key = (f.get(k) for k in ("tenant", "role", "user", "key"))
    below = f"{tenant}~"

    def whose(t: str, r: str, u: str) -> bool:
        return ((not tenant or t == tenant or t.startswith(below))
                and (not role or r == role) and (not user or u == user))

    def match(e: Entry) -> bool:
        if key and key != e.key and key != e.source:
            return False
        # Whose words a filter may test: the owner's prompt, where it names the owner;
        # a paraphrase alias's asker's own words, where it names the asker (each tests
        # only text of its own, and the answer, which both were given).
        prompts = [e.prompt] if whose(e.tenant, e.role, e.user) else []
        if e.asker is not None and whose(*e.asker[:3]):
            prompts.append(e.asker[3])
        if not prompts:
            return False
        return not needle or any(needle in p.casefold() for p in prompts) or (
            needle in e.answer_text().casefold())

    return match


def text_bytes(text: str) -> int:
    """`text`'s size in bytes, UTF-8 (a lone surrogate counted as its three)."""
    return len(text.encode("utf-8", "surrogatepass"))
