"""Tokenizing so that a client's text never becomes a control token.

A tokenizer turns the text `<|end|>` (or `</s>`, `<|im_start|>`, any special token) into
the control token itself, wherever it occurs. In a rendered chat that lets a message
close its own turn and forge a system or assistant turn. Here the template's own markers
stay control tokens and the messages' text never does:

- A message whose text holds no special-token string renders as usual (the common case,
  one template render, the same ids as before).
- Otherwise each such message's text is swapped for a unique marker, the template is
  rendered once, and the result is tokenized piece by piece: template text as usual,
  message text with `split_special_tokens` (so `<|end|>` becomes plain `<`, `|`, ...).
  The swap is only used when putting the texts back yields exactly what the template
  renders from the real messages (a template that trims or rewrites its content fails
  that check).
- Failing that, each special-token string in the messages gets a word joiner (U+2060)
  after its first character, which no tokenizer reads as a control token.
- Every other string a client gives the template gets that escape too (`escaped`): a
  message's `name`, its earlier calls (names, ids, arguments) and the tool definitions
  (descriptions, schemas), which templates write raw or through `tojson`.

Completion prompts are not chats: the engine tokenizes them as vLLM's server does
(`VllmEngine.encode`), markers and all, since their whole text is the client's own.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Callable
from typing import Any

import orjson

Render = Callable[[list[dict[str, Any]]], str]
_JOINER = "\u2060"
#: How Weir hands a chat to the template (`proxy.preparing._message_dicts`, `ChatText`):
#: bump it where that changes what a template is given, so that cache keys change too.
#: 2: an earlier call's arguments that are one JSON string, or escape a lone surrogate,
#: are given as sent (`proxy.tools.template_calls`, stop 47).
RENDERING_VERSION = 2


def render_digest(template: Any, separator: str) -> str:
    """A digest of how chats become prompts: the chat template served (text, or a
    tokenizer's named templates; None: none), the text parts' separator, and
    `RENDERING_VERSION`. Cache keys hold it: an answer cached under another template
    (Redis keeps entries a day) answered another prompt."""
    data = orjson.dumps([RENDERING_VERSION, separator, template],
                        option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS, default=str)
    return hashlib.sha256(data).hexdigest()[:32]


def _system_first(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The system messages merged into one at the start, as vLLM's server merges them
    once it has made developer messages system ones (templates such as Qwen's refuse a
    system turn anywhere else): their texts with a blank line between, empty ones left
    out; the messages as they were where one system message already leads."""
    system = [i for i, m in enumerate(messages) if m.get("role") == "system"]
    if not system or system == [0]:
        return messages
    merged = "\n\n".join(t for i in system if (t := messages[i].get("content") or ""))
    return [{"role": "system", "content": merged},
            *(m for m in messages if m.get("role") != "system")]


class ChatText:
    """Wraps a Hugging Face tokenizer (the engine's); one per tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        specials = {str(t) for t in getattr(tokenizer, "all_special_tokens", [])}
        for tok in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
            if getattr(tok, "special", False):
                specials.add(str(tok.content))
        specials.discard("")
        ordered = sorted(specials, key=len, reverse=True)  # longest first in the alternation
        self._special = re.compile("|".join(map(re.escape, ordered))) if ordered else None
        #: OpenAI's `developer` role is its newer name for `system`; a template with no
        #: turn of that name (most) would render a role the model never saw in training.
        self._developer = "developer" in str(getattr(tokenizer, "chat_template", "") or "") or any(
            "developer" in t for t in specials)  # (a model with a developer turn's token)

    def has_special(self, text: str) -> bool:
        return self._special is not None and self._special.search(text) is not None

    def encode_text(self, text: str, *, add_special_tokens: bool) -> list[int]:
        """Client text: special-token strings stay plain text."""
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens,
                                          split_special_tokens=True))

    def _encode_template(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False,
                                          split_special_tokens=False))

    def render(self, messages: list[dict[str, Any]], render: Render) -> list[int]:
        """Token ids of the rendered chat; `render` applies the chat template."""
        if not self._developer and any(m.get("role") == "developer" for m in messages):
            messages = _system_first([{**m, "role": "system"} if m.get("role") == "developer"
                                      else m for m in messages])
        # (what else a message holds: its name, calls, call id; `role` is a known word)
        messages = [m if len(m) <= 2 else {
            k: v if k in ("role", "content") else self.escaped(v) for k, v in m.items()}
            for m in messages]
        risky = [i for i, m in enumerate(messages)
                 if isinstance(m.get("content"), str) and self.has_special(m["content"])]
        if not risky:
            return self._encode_template(render(messages))
        ids = self._render_marked(messages, risky, render)
        if ids is not None:
            return ids
        escaped = [{**m, "content": self.escape(m["content"])} if i in risky else m
                   for i, m in enumerate(messages)]
        return self._encode_template(render(escaped))

    def escape(self, text: str) -> str:
        assert self._special is not None
        return self._special.sub(lambda m: m.group(0)[0] + _JOINER + m.group(0)[1:], text)

    def escaped(self, value: Any) -> Any:
        """A JSON-like value (tool definitions, a message's fields) with every string in
        it, keys too, escaped where it holds a special-token string; the value itself
        where none does (the common case: one serialization and one search)."""
        special = self._special
        if special is None:
            return value
        try:
            if not special.search(orjson.dumps(value).decode()):
                return value
        except (TypeError, orjson.JSONEncodeError):  # nested past orjson's depth: walk
            pass
        root = [value]
        todo: list[tuple[Any, Any]] = [(root, 0)]
        while todo:  # (iterative: client data nests as deep as the parser lets it)
            holder, at = todo.pop()
            v = holder[at]
            if isinstance(v, str):
                if special.search(v):
                    holder[at] = self.escape(v)
            elif isinstance(v, dict):
                copy = {self.escape(k) if isinstance(k, str) and special.search(k) else k: x
                        for k, x in v.items()}
                holder[at] = copy
                todo.extend((copy, k) for k in copy)
            elif isinstance(v, list):
                copy_list = list(v)
                holder[at] = copy_list
                todo.extend((copy_list, i) for i in range(len(copy_list)))
        return root[0]

    def _render_marked(self, messages: list[dict[str, Any]], risky: list[int],
                       render: Render) -> list[int] | None:
        nonce = secrets.token_hex(8)
        marked = [{**m, "content": f"\ue000{nonce}.{i}\ue001"} if i in risky else m
                  for i, m in enumerate(messages)]
        pieces = re.split(f"\ue000{nonce}\\.(\\d+)\ue001", render(marked))
        found = [int(p) for p in pieces[1::2]]
        if sorted(found) != risky:  # a marker dropped, repeated or rewritten
            return None
        texts = {i: messages[i]["content"] for i in risky}
        restored = "".join(p if j % 2 == 0 else texts[int(p)] for j, p in enumerate(pieces))
        if restored != render(messages):
            return None
        ids: list[int] = []
        for j, p in enumerate(pieces):
            if j % 2 == 0:
                if p:
                    ids += self._encode_template(p)
            else:
                ids += self.encode_text(texts[int(p)], add_special_tokens=False)
        return ids
