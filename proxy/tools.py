"""Tool calling on the chat route: how a request's `tool_choice` shapes generation, and
how the model's text becomes OpenAI `tool_calls`, whole and streamed.

Three modes, decided once per request (`mode`):
- `forced` (`required` or a named function): generation is constrained by a JSON schema
  built from the tools' own schemas, as vLLM's server does (`required`: an array of
  `{"name", "parameters"}` objects, one of the tools each; named: that function's
  parameters), so any model, the random demo model included, answers a valid call. That
  JSON is read here; it is Weir's own format, not a model's syntax. A named function's
  arguments stream as they come; a `required` array is read whole at the end.
- `parser` (`auto` with `engine.tool_parser` set): the model answers freely and the
  engine's parser (vLLM's registry: hermes, pythonic, ...) finds calls in its syntax.
  A whole answer with a call whose arguments are no JSON object is the model's text,
  as vLLM's server answers it; a stream has sent that call and ends with `stop`.
- `text` (`none`, no tools, or `auto` without a parser): the answer is text.

A `ToolCallTracker` follows one choice: `feed` turns each text delta into a content
delta and `delta.tool_calls` entries; `finish` flushes what only the end reveals; a
choice that called a tool ends with `finish_reason: "tool_calls"`, except a named
function's, which ends with `stop` (OpenAI's rule, which vLLM's server follows).
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field
from typing import Any, Literal

from . import responses as R
from .engine.base import SamplingOptions, ToolCallDelta, ToolCallParser
from .jsonbody import loads_finite, skip_ws
from .protocol import (
    ChatCompletionRequest,
    NamedToolChoice,
    ToolCall,
    rewritten,
    schema_refs,
)

Mode = Literal["text", "forced", "parser"]


def tool_chars(req: ChatCompletionRequest) -> int:
    """Characters the tool definitions and earlier calls add to the prompt (the chat
    template renders them), for estimates made before tokenizing (the rate limiter)."""
    n = len(json.dumps(req.tool_dicts())) if req.tools else 0
    return n + sum(len(c.function.name) + len(c.function.arguments)
                   for m in req.messages for c in m.tool_calls or [])


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


def call_id(parsed: str | None) -> str:
    """A call's id: the parser's where it is the model's own (Mistral's nine characters,
    which its template checks on the way back), else one of OpenAI's form (vLLM's parsers
    otherwise make random `chatcmpl-tool-...` ids, and only when not streaming)."""
    if parsed and not parsed.startswith("chatcmpl-tool-"):
        return parsed
    return new_call_id()


def mode(req: ChatCompletionRequest, has_parser: bool) -> Mode:
    if not req.tools or req.tool_choice == "none":
        return "text"
    if req.tool_choice == "required" or isinstance(req.tool_choice, NamedToolChoice):
        return "forced"
    return "parser" if has_parser else "text"


def _parameters(params: dict[str, Any] | None) -> dict[str, Any]:
    # No parameters still means an object of arguments.
    return params if params else {"type": "object", "properties": {}}


def forced_schema(req: ChatCompletionRequest) -> dict[str, Any] | None:
    """The JSON schema that makes any model answer a valid call (None: not forced)."""
    if not req.tools:
        return None
    choice = req.tool_choice
    if isinstance(choice, NamedToolChoice):
        tool = next(t for t in req.tools if t.function.name == choice.function.name)
        return _parameters(tool.function.parameters)
    if choice != "required":
        return None
    defs: dict[str, Any] = {}
    one_of = [{"type": "object",
               "properties": {"name": {"type": "string", "enum": [t.function.name]},
                              "parameters": _rebased(_parameters(t.function.parameters),
                                                     f"tool{i}", defs)},
               "required": ["name", "parameters"]}
              for i, t in enumerate(req.tools)]
    schema: dict[str, Any] = {"type": "array", "minItems": 1,
                              "items": {"type": "object", "anyOf": one_of}}
    if req.parallel_tool_calls is False:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema


def _rebased(params: dict[str, Any], name: str, defs: dict[str, Any]) -> dict[str, Any]:
    """A tool's parameters nested in the `required` schema, where their references to
    their own root (`#/$defs/Address`, as pydantic writes them, `#/definitions/...`, `#`)
    would point at the new root: a schema with references moves whole into the root's
    `$defs` under `name`, its references rebased onto it, and is referenced from its
    place."""
    # (A schema with its own `$id` resolves its references against itself in JSON
    # Schema, but the grammar compiler ignores `$id` and resolves them from the root: it
    # is rebased as any other, without the `$id`.)
    if not _refers(params):
        return params
    defs[name] = _rebase({k: v for k, v in params.items() if k != "$id"}, f"#/$defs/{name}")
    return {"$ref": f"#/$defs/{name}"}


def _pointer(ref: Any) -> bool:
    """A JSON-pointer reference into the schema (`#`, `#/...`; not an anchor's `#name`)."""
    return isinstance(ref, str) and (ref == "#" or ref.startswith("#/"))


def _refers(schema: dict[str, Any]) -> bool:
    return any(map(_pointer, schema_refs(schema)))


def _rebase(node: Any, base: str) -> Any:
    """`node` with its pointer references moved under `base`, where schemas stand (as
    `schema_refs` reads them: data such as `enum` as it is, names as names)."""

    def moved(node: dict[str, Any]) -> dict[str, Any]:
        ref = node.get("$ref")
        return {**node, "$ref": base + str(ref)[1:]} if _pointer(ref) else node
    return rewritten(node, moved)


def _forced_param(req: ChatCompletionRequest) -> str:
    """The param a forced call's schema comes from: the named tool's parameters, or the
    tools (`required`: every tool's parameters in one schema)."""
    if isinstance(req.tool_choice, NamedToolChoice) and req.tools:
        name = req.tool_choice.function.name
        for i, t in enumerate(req.tools):
            if t.function.name == name:
                return f"tools[{i}].function.parameters"
    return "tools"


def shape_options(req: ChatCompletionRequest, opts: SamplingOptions, engine: Any) -> bool:
    """Constrain forced calls to the tools' schema (over any `response_format`, as
    OpenAI does), with no `stop` strings or stop tokens: they end text, not a call's
    arguments (a stop word inside them cut the JSON mid-string); keep special tokens for
    a parser whose syntax uses them. True when a tool parser will read the answer."""
    m = mode(req, has_parser=True)
    if m == "forced":
        opts.json_schema, opts.json_object = forced_schema(req), False
        opts.schema_param = _forced_param(req)
        opts.stop, opts.stop_token_ids = [], None
    elif m == "parser" and engine.tool_parser(req.tool_dicts()) is not None:
        opts.skip_special_tokens = False
        return True
    return False


@dataclass(slots=True)
class ParsedToolCall:
    """One call read out of a forced answer's JSON; `arguments` is JSON text."""

    name: str
    arguments: str


def parse_forced(req: ChatCompletionRequest, text: str) -> list[ParsedToolCall]:
    """The constrained JSON as calls. A named function's text is its arguments as they
    are; `required`'s is an array of {"name", "parameters"}, Weir's own wrapper, which
    never reaches a client: cut short (`finish_reason: "length"`), its whole calls stay
    calls and the last keeps its arguments as far as they came (`""` where they had not
    begun), as a named function's do and as OpenAI answers; a call cut before its name
    was whole is dropped."""
    if isinstance(req.tool_choice, NamedToolChoice):
        return [ParsedToolCall(req.tool_choice.function.name, text)]
    calls: list[ParsedToolCall] = []
    i = skip_ws(text, 0)
    if not text.startswith("[", i):
        return calls
    i += 1
    while (i := skip_ws(text, i)) < len(text) and text[i] != "]":
        start = i
        try:
            c, i = _SHAPE.raw_decode(text, i)
        except RecursionError:  # nested past the parser: not calls to run
            return calls
        except json.JSONDecodeError:  # cut short: the name, the arguments as far as they came
            m = _CUT_CALL.match(text, start)
            if m is not None:  # (a name cut short is no call: nothing names it)
                calls.append(ParsedToolCall(json.loads(m["name"]), text[m.end("args"):]
                                            if m["args"] is not None else ""))
            return calls
        except ValueError:  # `NaN`, `Infinity`: no JSON, and no call to run
            return calls
        if isinstance(c, dict) and type(c.get("name")) is str and "parameters" in c:
            try:
                arguments = _compact(c["parameters"])
            except RecursionError:  # nested past what it writes back: not calls to run
                return calls
            calls.append(ParsedToolCall(c["name"], arguments))
        i = skip_ws(text, i)
        if text.startswith(",", i):
            i += 1
    return calls


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class _Number(str):
    """A number as the model wrote it (`1e400` converted would be `Infinity`, no JSON; an
    integer of thousands of digits, which Python refuses to convert, no cut)."""


#: Reads a forced answer keeping its numbers as written; `NaN` or `Infinity` are no JSON.
_SHAPE = json.JSONDecoder(parse_int=_Number, parse_float=_Number,
                          parse_constant=_no_constant)


def _compact(value: Any) -> str:
    """`value` as compact JSON (as a model writes arguments), its numbers as written."""
    if isinstance(value, _Number):
        return str.__str__(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(k, ensure_ascii=False)}:{_compact(v)}"
                              for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_compact(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


# A call cut short once its name was whole: its arguments from where they begin (none
# yet where the cut came before them: `arguments: ""`, as a named function cut there).
_CUT_CALL = re.compile(r'\{\s*"name"\s*:\s*(?P<name>"(?:[^"\\]|\\.)*")'
                       r'(?:\s*,\s*"parameters"\s*:\s*(?P<args>))?')


def template_calls(calls: list[ToolCall]) -> list[dict[str, Any]]:
    """Earlier calls as chat templates read them: arguments as an object where they are
    JSON (templates write `arguments | tojson`), as vLLM's own renderer passes them."""
    out = []
    for c in calls:
        try:
            args: Any = loads_finite(c.function.arguments)
        except (ValueError, RecursionError):  # not JSON (nor finite), or nested too deep
            args = c.function.arguments
        else:
            if isinstance(args, str):
                # one JSON string: templates write a string as it is, so read it would
                # be shown unquoted (`"arguments": Berlin`); as sent, it is the JSON
                args = c.function.arguments
            elif _ESCAPED_SURROGATE.search(c.function.arguments) and not _encodes(args):
                # JSON escaping a lone surrogate ("\ud800"), which a body may not hold
                # and no tokenizer reads: shown as sent, as other text that is no JSON
                args = c.function.arguments
        out.append({"id": c.id, "type": "function",
                    "function": {"name": c.function.name, "arguments": args}})
    return out


#: A JSON escape of a UTF-16 surrogate (`\ud800`): where arguments hold none, their
#: decoded strings are whole Unicode, and `_encodes` need not walk them.
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")


def _encodes(value: Any) -> bool:
    """Whether decoded JSON holds no lone surrogate (every string encodes as UTF-8)."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except (UnicodeEncodeError, RecursionError):  # (nested past the encoder: as sent too)
        return False
    return True


def call_dict(call: ParsedToolCall) -> dict[str, Any]:
    """A call as `message.tool_calls[i]`."""
    return {"id": new_call_id(), "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


@dataclass(slots=True)
class ToolCallTracker:
    """One choice's tool calls, from engine text to OpenAI's shapes."""

    mode: Mode
    req: ChatCompletionRequest
    parser: ToolCallParser | None = None
    _buffer: list[str] = field(default_factory=list)
    _ids: dict[int, str] = field(default_factory=dict)
    _streamed: list[str] = field(default_factory=list)  # content sent (parser mode)
    #: Parser mode: each call the parser found, by its index, as the client numbers it
    #: (None: dropped, `_kept`).
    _numbered: dict[int, int | None] = field(default_factory=dict)
    #: The names of the functions offered (`tools`, read by `for_request`): the calls a
    #: client may run.
    offered: frozenset[str] = frozenset()
    called: bool = False

    @classmethod
    def for_request(cls, req: ChatCompletionRequest,
                    make_parser: Any) -> ToolCallTracker:
        """`make_parser(tools)` is the engine's `tool_parser` (None when it has none)."""
        tools = req.tool_dicts()
        parser = make_parser(tools) if tools and req.tool_choice in (None, "auto") else None
        return cls(mode(req, parser is not None), req, parser,
                   offered=frozenset(t["function"]["name"] for t in tools or ()))

    # ------------------------------------------------------------------ whole answers

    def whole(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        """(content, tool_calls) of a whole answer, forced or text (a parser reads a
        whole answer step by step, as its stream: `StreamCalls`)."""
        assert self.mode != "parser"
        if self.mode == "text":
            return text, []
        calls = parse_forced(self.req, text)
        self.called = bool(calls)
        return None, [call_dict(c) for c in calls]  # the forced JSON is never content

    def reason(self, reason: str) -> str:
        """OpenAI's finish reason: `tool_calls` when the choice called a tool and stopped,
        unless the request named the function (then `stop`, as OpenAI answers)."""
        named = isinstance(self.req.tool_choice, NamedToolChoice)
        return "tool_calls" if self.called and reason == "stop" and not named else reason

    # ---------------------------------------------------------------------- streaming

    def feed(self, text: str, token_ids: list[int]) -> tuple[str | None,
                                                               list[dict[str, Any]]]:
        """(content delta, `delta.tool_calls`) for the next piece of text."""
        if self.mode == "text":
            return text, []
        if self.mode == "forced":
            if isinstance(self.req.tool_choice, NamedToolChoice):  # text is the arguments
                name = self.req.tool_choice.function.name
                first = not self.called
                if not text and not first:
                    return None, []
                return None, [self._delta(ToolCallDelta(0, name=name if first else None,
                                                        arguments=text))]
            self._buffer.append(text)  # `required`: the array is read whole at the end
            return None, []
        assert self.parser is not None
        self._buffer.append(text)
        content, deltas = self.parser.feed(text, token_ids)
        if content:
            self._streamed.append(content)
        return content, self._kept(deltas)

    def _kept(self, deltas: list[ToolCallDelta]) -> list[dict[str, Any]]:
        """The parser's deltas of the calls a client may run, numbered from 0 in the
        order they came. A call to a function not among `tools` is dropped whole (the
        model made the name up: OpenAI answers only calls of the tools offered, and a
        client, the SDK's `parse` among them, cannot run it); `parallel_tool_calls:
        false` keeps the first call kept."""
        out = []
        for d in deltas:
            if d.index not in self._numbered:  # a call's first delta names it
                kept = sum(i is not None for i in self._numbered.values())
                self._numbered[d.index] = kept if d.name in self.offered and (
                    kept == 0 or self.req.parallel_tool_calls is not False) else None
            index = self._numbered[d.index]
            if index is not None:
                out.append(self._delta(ToolCallDelta(index, d.id, d.name, d.arguments)))
        return out

    def finish(self, reason: str | None = None) -> tuple[str | None, list[dict[str, Any]]]:
        """What only the end of the answer reveals: forced calls, a parser's last args."""
        if self.mode == "forced" and not isinstance(self.req.tool_choice, NamedToolChoice):
            calls = parse_forced(self.req, "".join(self._buffer))
            if not calls:
                return None, []  # the forced JSON is never content
            self.called = True
            return None, [{"index": i, **call_dict(c)} for i, c in enumerate(calls)]
        if self.mode == "parser":
            assert self.parser is not None
            deltas = self._kept(self.parser.finish(cut=reason == "length"))
            if self._numbered:  # (a call dropped is not text either)
                # Every call dropped and no text: an empty text answer, its content ""
                # as the whole answer's (its stream had carried no content at all).
                empty = not self.called and not self._streamed
                return ("" if empty else None), deltas
            # No call after all (an answer that began like one, "[4, 5," cut at
            # max_tokens): the text the parser held back is content, as a whole answer's.
            text, sent = "".join(self._buffer), "".join(self._streamed)
            return (text[len(sent):] or None) if text.startswith(sent) else None, deltas
        return None, []

    def step(self, text: str, token_ids: list[int], reason: str | None,
             ) -> tuple[str | None, list[dict[str, Any]], str | None]:
        """One streamed step of the choice: (content delta, call deltas, finish reason);
        on the last step what only the end reveals is flushed and the reason mapped."""
        content, deltas = self.feed(text, token_ids)
        if reason is None:
            return content, deltas, None
        rest, more = self.finish(reason)
        if rest is not None:
            content = (content or "") + rest
        return content, deltas + more, self.reason(reason)

    def whole_choice(self, choice: dict[str, Any]) -> dict[str, Any]:
        """A whole chat choice with its calls read out of the text."""
        msg = choice["message"]
        msg["content"], calls = self.whole(msg["content"])
        choice["finish_reason"] = self.reason(choice["finish_reason"])
        if self.mode == "forced" and choice.get("logprobs") is not None:
            # the constrained JSON is no content (`required`'s is Weir's own wrapper):
            # no content logprobs, as a streamed forced answer has none
            choice["logprobs"] = {"content": None, "refusal": None}
        return with_calls(choice, calls)

    def _delta(self, d: ToolCallDelta) -> dict[str, Any]:
        self.called = True
        out: dict[str, Any] = {"index": d.index}
        if d.index not in self._ids:
            self._ids[d.index] = call_id(d.id)
            out["id"], out["type"] = self._ids[d.index], "function"
        fn: dict[str, Any] = {}
        if d.name is not None:
            fn["name"] = d.name
        if d.arguments is not None:
            fn["arguments"] = d.arguments
        if fn:
            out["function"] = fn
        return out


# ------------------------------------------------------------------ answer shapes


def with_calls(choice: dict[str, Any], calls: list[dict[str, Any]]) -> dict[str, Any]:
    """A whole chat choice carrying `message.tool_calls` (content null when empty)."""
    if calls:
        msg = choice["message"]
        msg["tool_calls"] = calls
        msg["content"] = msg["content"] or None
    return choice


def with_call_deltas(choice: dict[str, Any], deltas: list[dict[str, Any]]) -> dict[str, Any]:
    """A chunk choice carrying `delta.tool_calls`."""
    if deltas:
        choice["delta"]["tool_calls"] = deltas
    return choice


def finish_apart(choices: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """A chunk's choices as the chunks to send: the finish reasons of the choices that
    also carry call deltas taken off them, into a chunk of their own (an empty `delta`),
    as OpenAI sends them: the SDK's stream helper reads a finish reason before the deltas
    beside it, and never reports such a call's arguments as done."""
    apart = []
    for c in choices:
        if c["finish_reason"] is not None and c["delta"].get("tool_calls"):
            apart.append(R.chat_chunk_choice(c["index"], content=None, first=False,
                                             reason=c["finish_reason"], logprobs=None,
                                             stop_reason=c.pop("stop_reason", None)))
            c["finish_reason"] = None
    return [choices, apart] if apart else [choices]


def replay_deltas(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Whole calls as the deltas of one chunk (a cached answer streamed again)."""
    return [{"index": i, **c} for i, c in enumerate(calls)]


class CallAssembler:
    """A stream's `delta.tool_calls` put back together into whole calls."""

    def __init__(self) -> None:
        self.calls: dict[int, dict[str, Any]] = {}

    def feed(self, deltas: list[dict[str, Any]]) -> None:
        for d in deltas:
            call = self.calls.setdefault(d["index"], {
                "id": "", "type": "function", "function": {"name": "", "arguments": ""}})
            if d.get("id"):
                call["id"] = d["id"]
            fn = d.get("function") or {}
            call["function"]["name"] += fn.get("name") or ""
            call["function"]["arguments"] += fn.get("arguments") or ""

    def result(self) -> list[dict[str, Any]]:
        return [c for _, c in sorted(self.calls.items())]


def _json_object(text: str) -> bool:
    """Whether `text` is a JSON object, as OpenAI's call arguments always are (`NaN` and
    `Infinity` are no JSON; numbers are left as written, so an integer of thousands of
    digits is JSON too). Arguments that are JSON of another kind (a string, an array,
    null) are no call to run: a function's parameters are an object, vLLM's `required`
    path reads them as one, and several of its parsers (gigachat3, dots) refuse any
    other (hermes, llama3_json hand them on)."""
    try:
        value = _SHAPE.decode(text)
    except (ValueError, RecursionError):  # (nested past the parser: none a client reads)
        return False
    return isinstance(value, dict)


class StreamCalls:
    """The per-choice trackers of one streamed chat answer, and the calls they sent (the
    answer a plugin stores carries them): the chat renderer's whole tool-call hook."""

    def __init__(self, make_tracker: Any) -> None:
        self._make = make_tracker
        self._trackers: dict[int, ToolCallTracker] = {}
        self._sent: dict[int, CallAssembler] = {}
        #: Per choice, its content and calls in the order they came: runs of text (its
        #: pieces, joined when asked: a string grown piece by piece is copied whole at
        #: each, quadratic in a long answer) and calls (their index, where each began).
        self._order: dict[int, list[list[str] | int]] = {}

    def step(self, index: int, text: str, token_ids: list[int], reason: str | None,
             ) -> tuple[str | None, list[dict[str, Any]], str | None]:
        if self._make is None:
            return text, [], reason
        tracker = self._trackers.get(index)
        if tracker is None:
            tracker = self._trackers[index] = self._make()
        content, deltas, reason = tracker.step(text, token_ids, reason)
        order = self._order.setdefault(index, [])
        if content:
            if order and isinstance(order[-1], list):
                order[-1].append(content)
            else:
                order.append([content])
        if deltas:
            sent = self._sent.setdefault(index, CallAssembler())
            order += sorted({d["index"] for d in deltas if d["index"] not in sent.calls})
            sent.feed(deltas)
        if reason == "tool_calls" and tracker.mode == "parser" and not all(
                _json_object(c["function"]["arguments"]) for c in self.calls(index)):
            reason = "stop"  # arguments cut (a stop string) or no object: no call to run
        return content, deltas, reason

    def text_instead(self, index: int) -> str | None:
        """The model's whole text where a whole answer is that text and not its calls,
        else None: a parser's call whose arguments are no JSON object (`_json_object`),
        which no client can run. vLLM's server answers so (its whole-answer parser fails
        on such a call and hands back the model's text, every call with it); a stream
        has sent the calls as they came and cannot take them back (vLLM's sends them
        too): it only ends with `stop` (`step`; vLLM's ends with `tool_calls`)."""
        tracker = self._trackers.get(index)
        if tracker is None or tracker.mode != "parser" or all(
                _json_object(c["function"]["arguments"]) for c in self.calls(index)):
            return None
        return "".join(tracker._buffer)

    def has_text(self, index: int) -> bool:
        """Whether a choice's tokens are its content (not a forced call's JSON): only then
        do its chunks carry logprobs."""
        tracker = self._trackers.get(index)
        return tracker is None or tracker.mode != "forced"

    def calls(self, index: int) -> list[dict[str, Any]]:
        """The calls a choice sent, whole."""
        sent = self._sent.get(index)
        return sent.result() if sent is not None else []

    def order(self, index: int) -> list[str | int]:
        """A choice's content and calls in the order they came (`_order`)."""
        return ["".join(x) if isinstance(x, list) else x for x in self._order.get(index, ())]

    def answer(self, choices: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The choices with their calls, and where a choice has both text and calls, their
        `order` (as `Completion.order`: what a cache keeps to replay them in it); a
        choice whose whole answer is text (`text_instead`) as that text."""
        for c in choices:
            text = self.text_instead(c["index"])
            if text is not None:  # (kept as a whole answer gives it: the text)
                c["text"] = text
            elif c["index"] in self._sent:
                c["tool_calls"] = self._sent[c["index"]].result()
                order = self.order(c["index"])
                if order_agrees(order, c["text"], c["tool_calls"]):
                    c["order"] = order
        return choices


def order_agrees(order: Any, text: str | None, calls: list[dict[str, Any]]) -> bool:
    """Whether `order` (`Completion.order`) holds `text` and each of `calls` once (the
    answer as it went out: no plugin rewrote it since), both present (else there is no
    order to keep)."""
    if not isinstance(order, list) or not all(
            isinstance(p, str) or (isinstance(p, int) and not isinstance(p, bool))
            for p in order):
        return False
    said = [p for p in order if isinstance(p, str)]
    return bool(said and calls) and "".join(said) == text and all(said) and sorted(
        p for p in order if isinstance(p, int)) == list(range(len(calls)))


def whole_choice(make_tracker: Any, choice: dict[str, Any]) -> dict[str, Any]:
    """A whole chat choice with its calls read out of the text (the renderer's hook)."""
    return choice if make_tracker is None else make_tracker().whole_choice(choice)
