"""Responses <-> chat: a Responses request becomes a chat request (so the same plugin
chain and engine path serve it), and a chat answer becomes a Response object.

The conversation a stored response keeps is in chat form (input and output, without
`instructions`: OpenAI does not carry those over to a follow-up), so
`previous_response_id` prepends it to the next request's input as it is.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Sequence
from typing import Any

from ..context import Screen, screened_values
from ..errors import InvalidRequest, shown
from ..protocol import (
    SCHEMA_MAPS,
    VLLM_CHAT_UNSUPPORTED,
    VLLM_NO_OPS,
    ChatCompletionRequest,
    parse_model,
)
from ..text import fold
from ..tools import order_agrees
from .models import (
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    ReasoningItem,
    ResponsesRequest,
    ToolChoiceFunction,
    given_id,
)

#: Chat params as the Responses API names them (for errors raised on the chat form).
_PARAMS = {"messages": "input", "max_completion_tokens": "max_output_tokens",
           "response_format": "text.format"}
_CHAT_SCHEMA = "text.format.json_schema"  # chat's json_schema fields sit in text.format


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(24)}"


def rename_param(e: InvalidRequest, instructions: bool = False) -> InvalidRequest:
    """An error about the chat form, naming the Responses params instead, in `param` and
    in its text; `instructions`: the chat form's first message holds them."""
    if e.param:
        e.param = _responses_param(e.param, instructions)
    e.message = _CHAT_NAME.sub(lambda m: f"`{_responses_param(m.group(1), instructions)}`",
                               e.message)
    return e


def _responses_param(param: str, instructions: bool = False) -> str:
    """A chat param as Responses names it (an index into `messages` is not one into
    `input`, so that is named whole; the first message is `instructions` where they
    were given)."""
    head, _, rest = param.partition(".")
    name = head.partition("[")[0]
    if name == "messages":
        return "instructions" if instructions and head == "messages[0]" else "input"
    if name in _PARAMS:
        param = _PARAMS[name] + (f".{rest}" if rest else "")
    elif name == "tools":  # chat's {"function": {...}} is flat in a Responses tool
        param = param.replace("].function.", "].", 1)
    return param.replace(_CHAT_SCHEMA, "text.format")


# A chat param named in an error's text: "`max_completion_tokens` may be at most ...",
# "past it at `tools[0].function.parameters`" (a tool's schema is flat here).
_CHAT_NAME = re.compile(r"`((?:" + "|".join([*_PARAMS, "tools"]) + r")(?![\w])[^`\s]*)`")


# ------------------------------------------------------------------------ to chat


def input_messages(items: list[MessageItem | FunctionCallItem | FunctionCallOutputItem],
                   ) -> list[dict[str, Any]]:
    """Input items as chat messages: calls join the assistant turn before them, and so
    does assistant text right after a call (a streamed answer that writes text after its
    call stores [call, message]): a call's outputs then follow its own turn."""
    return [m for m, _ in _turns(items)]


def _turns(items: Sequence[MessageItem | FunctionCallItem | FunctionCallOutputItem
                           | ReasoningItem]) -> list[tuple[dict[str, Any], list[int]]]:
    """`input_messages`, each message with the places in `items` of the items whose
    text it holds (reasoning items, which no prompt holds, are passed over)."""
    out: list[tuple[dict[str, Any], list[int]]] = []
    joined: dict[int, list[str]] = {}  # a turn's texts around its calls, joined at the end
    for n, item in enumerate(items):
        if isinstance(item, MessageItem):
            role = item.role  # (`developer` is read as the model's template reads it)
            last = out[-1][0] if out else None
            if role == "assistant" and last is not None and last["role"] == "assistant" \
                    and last.get("tool_calls"):
                joined.setdefault(len(out) - 1, [last["content"] or ""]).append(item.text())
                out[-1][1].append(n)
                continue
            out.append(({"role": role, "content": item.text()}, [n]))
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}
            if out and out[-1][0]["role"] == "assistant":
                out[-1][0].setdefault("tool_calls", []).append(call)
            else:
                out.append(({"role": "assistant", "content": None, "tool_calls": [call]}, []))
        elif isinstance(item, FunctionCallOutputItem):
            out.append(({"role": "tool", "tool_call_id": item.call_id,
                         "content": item.text()}, [n]))
    for k, texts in joined.items():
        out[k][0]["content"] = "".join(texts)
    return out


def _response_format(req: ResponsesRequest) -> dict[str, Any] | None:
    fmt = req.text.format if req.text else None
    if fmt is None or fmt.type != "json_schema":
        return None if fmt is None else {"type": fmt.type}
    return {"type": "json_schema", "json_schema": {
        "name": fmt.name, "schema": fmt.schema_, "strict": fmt.strict,
        "description": fmt.description}}


def _calls_of(message: dict[str, Any]) -> set[str]:
    """The ids of an assistant message's calls."""
    if message["role"] != "assistant":
        return set()
    return {c["id"] for c in message.get("tool_calls") or ()}


def _without_resent_calls(given: list[dict[str, Any]], stored: set[str],
                          cut: frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    """`given` without the stored response's calls sent again with their outputs, grouped
    ([call A, call B, output A, output B]) or each before its output ([call A, output A,
    call B, output B]): the calls are the stored turn's, the outputs answer it. Its cut
    calls sent again beside its kept ones (as its output listed them) are its too: an
    output for one is then told it was cut."""
    kept: list[dict[str, Any]] = []
    only_outputs = True  # all kept so far answer the stored calls (read as each is kept)
    for m in given:
        calls = _calls_of(m)
        resent = bool(calls & stored) and calls <= stored | cut
        if resent and only_outputs:
            continue
        kept.append(m)
        only_outputs = only_outputs and m["role"] == "tool" and m.get("tool_call_id") in stored
    return kept


def _calls_answered(conversation: list[dict[str, Any]], cut: frozenset[str] = frozenset(),
                    ) -> None:
    """Every `function_call_output` answers a `function_call` of the assistant turn
    before it (in this input or the earlier responses'), with only other outputs between,
    and every `function_call` has its output before the next message (the chat form's
    rules, said in the Responses API's words). `cut`: the calls of the earlier responses
    that their ends cut (no turn: an output for one is told so)."""
    open_calls: set[str] = set()
    unanswered: dict[str, None] = {}  # (in the turn's order: the first is named)
    answered: set[str] = set()
    for m in [*conversation, None]:
        if unanswered and (m is None or m["role"] != "tool"):
            raise InvalidRequest(f"No tool output found for function call "
                                 f"{shown(next(iter(unanswered)))}.", param="input",
                                 code="invalid_value")
        if m is None:
            break
        if m["role"] == "assistant":
            ids = [c["id"] for c in m.get("tool_calls") or ()]
            unanswered = dict.fromkeys(ids)
            open_calls, answered = set(unanswered), set()
            if len(open_calls) < len(ids):
                raise InvalidRequest(f"Duplicate 'call_id': {shown(_first_repeated(ids))} (each "
                                     "`function_call` needs a `call_id` of its own).",
                                     param="input", code="invalid_value")
        elif m["role"] != "tool":
            open_calls, answered = set(), set()
        elif m["tool_call_id"] in answered:
            raise InvalidRequest(f"Duplicate `function_call_output` for call_id "
                                 f"{shown(m['tool_call_id'])}: a call has one output.",
                                 param="input", code="invalid_value")
        elif m["tool_call_id"] in open_calls:
            unanswered.pop(m["tool_call_id"], None)
            answered.add(m["tool_call_id"])
        elif m["tool_call_id"] in cut:
            raise InvalidRequest(
                f"Function call {shown(m['tool_call_id'])} was cut before its arguments "
                "ended (its response's `max_output_tokens`, or its end; its `status` is "
                "`incomplete`): it is no turn to answer, so it takes no "
                "`function_call_output`.", param="input", code="invalid_value")
        else:
            raise InvalidRequest(
                "No function call found for a `function_call_output` item: its `call_id` "
                "must be that of a `function_call` before it (in the input or the earlier "
                "responses), with no message between them.", param="input",
                code="invalid_value")


def cut_calls(response: dict[str, Any]) -> frozenset[str]:
    """The `call_id`s of a stored response's function calls its end cut (kept out of its
    conversation: arguments half written are no turn)."""
    return frozenset(o["call_id"] for o in response.get("output") or ()
                     if o.get("type") == "function_call" and o.get("status") != "completed")


def cut_before(record: dict[str, Any]) -> frozenset[str]:
    """The `call_id`s of the calls cut in the responses before a stored one's, its chain
    back to its first (its record's `cut`: each response keeps its predecessors', so a
    follow-up reads one record, not the chain). A record without it (none was cut, or
    another version's): none."""
    kept = record.get("cut")
    return frozenset(c for c in kept if isinstance(c, str)) if isinstance(kept, list) \
        else frozenset()


def _first_repeated(ids: list[str]) -> str:
    """The first id that `ids` holds again."""
    seen: set[str] = set()
    for i in ids:
        if i in seen:
            return i
        seen.add(i)
    raise ValueError("no id is repeated")


#: The parameters of vLLM's Responses API that are chat's too (`seed`, `stop`, the
#: penalties, `logit_bias`, and vLLM's own extensions): passed into the chat request,
#: where chat's rules apply to them (honoured, or refused by the in-process engine with
#: a 400 and sent on to an upstream as given).
VLLM_PASSED = frozenset({
    "seed", "stop", "presence_penalty", "frequency_penalty", "logit_bias", "ignore_eos",
    "min_tokens", "stop_token_ids", "include_stop_str_in_output", "skip_special_tokens",
    "spaces_between_special_tokens", "allowed_token_ids", "bad_words",
    *VLLM_CHAT_UNSUPPORTED, *VLLM_NO_OPS})


def chat_request(req: ResponsesRequest, history: list[dict[str, Any]],
                 cut: frozenset[str] = frozenset(), earlier_cut: frozenset[str] = frozenset(),
                 ) -> tuple[ChatCompletionRequest, list[dict[str, Any]]]:
    """(the chat request, the conversation so far without instructions). `cut`: the
    calls of the previous response that were cut (not in `history`); `earlier_cut`:
    those of the responses before it (an output for any of them is told it was cut)."""
    given = input_messages(req.items())
    if history and (stored := _calls_of(history[-1])):
        given = _without_resent_calls(given, stored, cut)
    conversation = history + given
    _calls_answered(conversation, cut | earlier_cut)
    fmt = req.text.format if req.text else None
    if fmt is not None and fmt.type == "json_object" and "json" not in " ".join(
            [req.instructions or ""] + [m.get("content") or "" for m in conversation]).lower():
        raise InvalidRequest("Response input messages must contain the word 'json' in some "
                             "form to use `text.format` of type `json_object`.",
                             param="input", code="invalid_value")
    system = [{"role": "system", "content": req.instructions}] if req.instructions else []
    body: dict[str, Any] = {"model": req.model, "messages": system + conversation,
                            "stream": req.stream}
    if req.stream:
        body["stream_options"] = {"include_usage": True}
    optional = {"max_completion_tokens": req.max_output_tokens, "temperature": req.temperature,
                "top_p": req.top_p, "top_k": req.top_k, "min_p": req.min_p,
                "repetition_penalty": req.repetition_penalty,
                "user": req.user, "response_format": _response_format(req),
                # (this API takes it without tools, as OpenAI's does; chat does not)
                "parallel_tool_calls": req.parallel_tool_calls if req.tools else None}
    body.update({k: v for k, v in optional.items() if v is not None})
    body.update({k: v for k, v in (req.model_extra or {}).items() if k in VLLM_PASSED})
    if req.tools:
        body["tools"] = [{"type": "function", "function": t.model_dump(
            exclude={"type"}, exclude_none=True)} for t in req.tools]
    choice = req.tool_choice
    if isinstance(choice, ToolChoiceFunction):
        body["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    elif choice is not None and req.tools:
        body["tool_choice"] = choice
    try:
        return parse_model(ChatCompletionRequest, body), conversation
    except InvalidRequest as e:
        raise rename_param(e, bool(req.instructions)) from None


# ---------------------------------------------------------------------- from chat


def message_item(text: str, status: str, item_id: str | None = None) -> dict[str, Any]:
    return {"type": "message", "id": item_id or new_id("msg"), "status": status,
            "role": "assistant", "content": [] if status == "in_progress" else [
                text_part(text)]}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def call_item(call_id: str, name: str, arguments: str, status: str,
              item_id: str | None = None) -> dict[str, Any]:
    return {"type": "function_call", "id": item_id or new_id("fc"), "call_id": call_id,
            "name": name, "arguments": arguments, "status": status}


def _ids(items: Any) -> set[str]:
    """The ids of stored items (a record's `held`: the ids themselves)."""
    return {i["id"] if isinstance(i, dict) else i
            for i in (items if isinstance(items, list) else ())
            if isinstance(i, str) or (isinstance(i, dict) and isinstance(i.get("id"), str))}


def said(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The output items of `response` that a follow-up goes on from (what its record's
    conversation keeps): a failed or cut response's that it finished (an item the end
    cut, a call's arguments half written, is no turn to build on); one cut at its token
    limit (`incomplete`) keeps its text, which the model said, but not a call cut
    mid-arguments (a follow-up would owe it an output)."""
    return [it for it in response.get("output") or () if isinstance(it, dict) and (
        it.get("status") == "completed" or (
            response.get("status") not in ("failed", "cancelled")
            and it.get("type") != "function_call"))]


def held_before(record: dict[str, Any]) -> frozenset[str]:
    """The ids of the items a stored response's chain holds, back to its first: its
    input's, its output's that its conversation kept (`said`), and those its record
    keeps of the responses before it (its `held`: each response keeps its
    predecessors', as it keeps their cut calls). What the follow-ups of a follow-up of
    `record` may not send again."""
    return frozenset(_ids(record.get("held")) | _ids(said(record["response"]))
                     | _ids(record.get("input")))


def refuse_held_again(req: ResponsesRequest, record: dict[str, Any]) -> None:
    """A 400 for an input item sent with the id of one the previous response (`record`)
    holds, its input's or its output's, or one a response before it held: that item is
    in the conversation already, and sent again it would be said twice to the model
    (`input=prev.output + [...]` with `previous_response_id`). OpenAI's answer, in its
    words. Spared: function calls; the previous response's output where it made calls
    (its turn sent back with their outputs is the stored one, not a second:
    `_without_resent_calls` drops it); and what its end cut (no turn: `said`)."""
    response = record["response"]
    output = [] if any(isinstance(i, dict) and i.get("type") == "function_call"
                       for i in response.get("output") or ()) else said(response)
    held = _ids(record.get("held")) | _ids(output) | _ids(record.get("input"))
    for item in req.given():
        given = given_id(item)
        if given in held and not isinstance(item, FunctionCallItem):
            raise InvalidRequest(f"Duplicate item found with id {shown(given)}. Remove "
                                 "duplicate items from your input and try again.",
                                 param="input", code=None)  # (OpenAI's has none)


def input_items(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's input as the items `GET /v1/responses/{id}/input_items` lists, each
    with an id (its own where the client sent one)."""
    out: list[dict[str, Any]] = []
    for item in req.given():
        item_id = given_id(item)  # (each once: `ResponsesRequest._each_id_once`)
        if isinstance(item, MessageItem):
            if item.role == "assistant":
                out.append(message_item(item.text(), "completed", item_id))
            else:
                out.append({"type": "message", "id": item_id or new_id("msg"),
                            "status": "completed", "role": item.role,
                            "content": [{"type": "input_text", "text": item.text()}]})
        elif isinstance(item, FunctionCallItem):
            out.append(call_item(item.call_id, item.name, item.arguments, "completed",
                                 item_id))
        elif isinstance(item, ReasoningItem):
            out.append({**_named_fields(item), "id": item_id or new_id("rs")})
        else:
            out.append({"type": "function_call_output", "id": item_id or new_id("fco"),
                        "call_id": item.call_id, "output": item.text(),
                        "status": "completed"})
    return out


def output_items(message: dict[str, Any], finish_reason: str | None,
                 order: list[str | int] | None = None) -> list[dict[str, Any]]:
    """A chat answer's message as Response output items. Content null with no calls is
    a forced call cut before it began: no item, as its stream has none. An answer cut
    at the token limit leaves only its last item `incomplete`: the ones before it ended
    (the stream marks them `completed` as each closes). `order` (`Completion.order`):
    its text and calls in the order the model wrote them, as its stream sends them
    (text after a call is a message after it); without it, the text comes first."""
    items = []
    text = message.get("content")
    calls = message.get("tool_calls") or []
    if order is None or not order_agrees(order, text, calls):
        order = ([text] if text or (not calls and text is not None) else []) + list(
            range(len(calls)))
    for part in order:
        if isinstance(part, str):
            items.append(message_item(part, "completed"))
            continue
        c = calls[part]
        items.append(call_item(c["id"], c["function"]["name"], c["function"]["arguments"],
                               "completed"))
    if items and finish_reason == "length":
        items[-1]["status"] = "incomplete"
    return items


def output_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Output items back in chat form, for the stored conversation."""
    as_input: list[MessageItem | FunctionCallItem | FunctionCallOutputItem] = []
    for it in items:
        if it["type"] == "message":
            as_input.append(MessageItem(role="assistant",
                                        content="".join(p["text"] for p in it["content"])))
        else:
            as_input.append(FunctionCallItem(type="function_call", call_id=it["call_id"],
                                             name=it["name"], arguments=it["arguments"]))
    return input_messages(as_input)


# ------------------------------------------------------------- what a response keeps


def screened_request(req: ResponsesRequest, chat: ChatCompletionRequest,
                     ) -> ResponsesRequest:
    """`req` with the texts its Response echoes (instructions, tool descriptions and
    parameters, `text.format`'s description and schema) as the sanitizer passed them on
    in `chat`, the chat form of `req` once the chain ran (its system message is the
    instructions, its tools `req`'s, its `response_format` `req`'s `text.format`)."""
    update: dict[str, Any] = {}
    if req.instructions and chat.messages and chat.messages[0].role == "system":
        said = chat.messages[0].text()
        if said != fold(req.instructions):  # (redacted, not only folded)
            update["instructions"] = said
    fmt, said_fmt = (req.text.format if req.text else None), chat.response_format
    if (fmt is not None and req.text is not None and said_fmt is not None
            and said_fmt.json_schema is not None):  # (its prose, as the tools' below)
        screened = {"description": said_fmt.json_schema.description,
                    "schema_": said_fmt.json_schema.schema_}
        if screened != {"description": fmt.description, "schema_": fmt.schema_}:
            update["text"] = req.text.model_copy(update={"format": fmt.model_copy(
                update=screened)})
    if req.tools and chat.tools and len(chat.tools) == len(req.tools):
        update["tools"] = [t.model_copy(update={"description": c.function.description,
                                                "parameters": c.function.parameters})
                           for t, c in zip(req.tools, chat.tools, strict=True)]
    return req.model_copy(update=update) if update else req


def screened_echo(req: ResponsesRequest, screen: Screen) -> ResponsesRequest:
    """`req` with every text its Response echoes screened by `screen` (a background
    response's, echoed and stored `queued` before the chain screened it): the caller's
    texts, the instructions, the tools' descriptions and `text.format`'s."""
    req = screened_caller_text(req, screen)
    update: dict[str, Any] = {}
    if req.instructions:
        update["instructions"] = screen([req.instructions])[0]
    if req.tools:
        update["tools"] = [t.model_copy(update={
            "description": screen([t.description])[0] if t.description else t.description,
            "parameters": screened_schema(t.parameters, screen)}) for t in req.tools]
    fmt = req.text.format if req.text else None
    if req.text is not None and fmt is not None and (fmt.description or fmt.schema_):
        update["text"] = req.text.model_copy(update={"format": fmt.model_copy(update={
            "description": screen([fmt.description])[0] if fmt.description
            else fmt.description, "schema_": screened_schema(fmt.schema_, screen)})})
    return req.model_copy(update=update) if update else req


#: A schema's prose (shown to the model, not held to): the chain's sanitizer redacts it.
_SCHEMA_PROSE = frozenset({"description", "title", "$comment", "examples", "default"})


def screened_schema(schema: Any, screen: Screen) -> Any:
    """A JSON schema (a tool's parameters, `text.format`'s) with the strings of its prose
    screened, as the chain's sanitizer redacts them (a background response echoes and
    stores it before the chain ran); what holds the answer (names, `enum`) as it came."""
    found: list[tuple[Any, Any]] = []  # (container, key) of each prose string

    def walk(node: Any, prose: bool) -> Any:
        if isinstance(node, dict):
            out: dict[str, Any] = {}
            for k, v in node.items():
                said = prose or k in _SCHEMA_PROSE
                if k in SCHEMA_MAPS and isinstance(v, dict) and not said:
                    out[k] = {name: walk(sub, False) for name, sub in v.items()}
                    continue
                out[k] = walk(v, said)
                if said and isinstance(v, str):
                    found.append((out, k))
            return out
        if isinstance(node, list):
            items = [walk(v, prose) for v in node]
            found.extend((items, i) for i, v in enumerate(items)
                         if prose and isinstance(v, str))
            return items
        return node

    copy = walk(schema, False)
    for (node, k), text in zip(found, screen([node[k] for node, k in found]), strict=True):
        node[k] = text
    return copy if found else schema


def screened_caller_text(req: ResponsesRequest, screen: Screen,
                         metadata: dict[str, str] | None = None) -> ResponsesRequest:
    """`req` with the caller's texts that its Response echoes and the store keeps but no
    prompt holds (`metadata`'s values, `user`, `safety_identifier`, `prompt_cache_key`)
    screened: an address in `metadata` was kept as sent beside the same one redacted in
    the input. `metadata`: `req`'s metadata as the sanitizer screened it already
    (`RequestContext.aside_said`), not read again."""
    update: dict[str, Any] = {}
    if metadata is None and req.metadata:
        metadata = screened_values(req.metadata, screen)
    if req.metadata and metadata is not None and metadata != req.metadata:
        update["metadata"] = metadata
    for field in ("user", "safety_identifier", "prompt_cache_key"):
        value = getattr(req, field)
        if value and (text := screen([value])[0]) != value:
            update[field] = text
    return req.model_copy(update=update) if update else req


def aside_texts(req: ResponsesRequest) -> tuple[str, ...]:
    """The caller's texts `screened_caller_text` reads that the chat request does not
    carry (`metadata`'s keys and values, `safety_identifier`, `prompt_cache_key`; `user`
    goes on in it)."""
    out = [v for f in ("safety_identifier", "prompt_cache_key") if (v := getattr(req, f))]
    return (*out, *(t for k, v in (req.metadata or {}).items() for t in (k, v)))


def aside_chars(req: ResponsesRequest) -> int:
    """Characters of the texts that `screened_reasoning` and `screened_caller_text` read
    in `req` (in no prompt, so the chain's limits did not count them; `user` goes on in
    the chat request, where they count it)."""
    n = sum(len(t) for t in aside_texts(req))
    for item in req.given():
        if isinstance(item, ReasoningItem):
            n += len(item.encrypted_content or "")
            n += sum(len(p.text) for p in [*item.summary, *(item.content or ())])
    return n


def screened_conversation(req: ResponsesRequest, chat: ChatCompletionRequest,
                          ) -> list[dict[str, Any]]:
    """The conversation to keep (history and input, chat form), as the chain passed it
    on: `chat`'s messages after its instructions (`chat_request` built them so)."""
    first = 1 if req.instructions else 0
    return [m.model_dump(exclude_none=True) for m in chat.messages[first:]]


def screened_messages(messages: list[dict[str, Any]], before: list[str], screen: Screen,
                      before_speakers: list[str]) -> list[dict[str, Any]]:
    """`messages` (a conversation in chat form, as `chat_request` builds it) with their
    texts screened as the chain reads them: each message's text, as one conversation
    after `before` (the instructions), and each call's arguments as JSON."""
    held = [n for n, m in enumerate(messages) if isinstance(m.get("content"), str)]
    said = screen(before + [messages[n]["content"] for n in held],
                  speakers=before_speakers + [messages[n]["role"] for n in held])[len(before):]
    out = [{**m} for m in messages]
    for n, text in zip(held, said, strict=True):
        out[n]["content"] = text
    for m in out:
        if calls := m.get("tool_calls"):
            args = screen([c["function"]["arguments"] for c in calls], json=True)
            m["tool_calls"] = [{**c, "function": {**c["function"], "arguments": a}}
                               for c, a in zip(calls, args, strict=True)]
    return out


def screened_items(req: ResponsesRequest, items: list[dict[str, Any]], before: list[str],
                   screen: Screen, before_speakers: list[str] | None = None,
                   ) -> list[dict[str, Any]]:
    """`req`'s input items (`input_items(req)`) with their texts screened as the chain
    read them: each chat message's text (assistant text around a call is one message,
    as `input_messages` joins it) and each output, as one conversation after `before`
    (the instructions and the history's texts: a card may be split across them); call
    arguments each as JSON. Where a message's joined text is redacted otherwise than
    its items' texts one by one, the first item holds it and the others none.
    `before_speakers`: who wrote each of `before` (with each message's role, a card split
    over one speaker's two turns with another's between is found, as the chain finds it)."""
    turns = [(msg["role"], places) for msg, places in _turns(req.given()) if places]
    groups = [places for _, places in turns]
    calls = [n for n, it in enumerate(items) if it["type"] == "function_call"]
    out = [{**it} for it in items]
    texts = ["".join(_item_text(items[n]) for n in g) for g in groups]
    speakers = (None if before_speakers is None
                else before_speakers + [role for role, _ in turns])
    said = screen(before + texts, speakers=speakers)[len(before):]
    for g, text, joined in zip(groups, texts, said, strict=True):
        if joined == text:
            continue
        alone = screen([_item_text(items[n]) for n in g]) if len(g) > 1 else [joined]
        if "".join(alone) != joined:
            alone = [joined] + [""] * (len(g) - 1)
        for n, t in zip(g, alone, strict=True):
            _set_item_text(out, n, t)
    args = screen([items[n]["arguments"] for n in calls], json=True)
    for n, text in zip(calls, args, strict=True):
        out[n]["arguments"] = text
    return screened_reasoning(out, screen)


def _named_fields(item: ReasoningItem) -> dict[str, Any]:
    """A reasoning item as it is kept and listed: the fields the API names, on it and
    on its parts (what else a client put there is no part of it, and no screen reads
    it: a key there was stored as sent), none that is null."""
    out: dict[str, Any] = {"type": item.type,
                           "summary": [{"type": p.type, "text": p.text} for p in item.summary]}
    if item.content is not None:
        out["content"] = [{"type": p.type, "text": p.text} for p in item.content]
    if item.encrypted_content is not None:
        out["encrypted_content"] = item.encrypted_content
    if item.status is not None:
        out["status"] = item.status
    return out


def screened_reasoning(items: list[dict[str, Any]], screen: Screen) -> list[dict[str, Any]]:
    """`items` with their reasoning items' texts screened (no prompt holds them, so the
    chain never read them; they are stored and listed all the same), `encrypted_content`
    too: opaque to Weir, it is whatever the client sent (a key in it was stored as sent
    beside the same key redacted in the summary; OpenAI's own blobs read as nothing)."""
    out = [*items]
    for n, it in enumerate(items):
        if it["type"] == "reasoning" and isinstance(it.get("encrypted_content"), str):
            blob = screen([it["encrypted_content"]])[0]
            if blob != it["encrypted_content"]:
                out[n] = {**it, "encrypted_content": blob}
        if it["type"] == "reasoning":
            parts = [(field, k) for field in ("summary", "content")
                     for k, p in enumerate(it.get(field) or ()) if isinstance(p.get("text"), str)]
            said = screen([it[field][k]["text"] for field, k in parts])
            for (field, k), text in zip(parts, said, strict=True):
                if text != it[field][k]["text"]:
                    out[n] = {**out[n], field: [*out[n][field]]}
                    out[n][field][k] = {**out[n][field][k], "text": text}
    return out


def _item_text(item: dict[str, Any]) -> str:
    if item["type"] == "function_call_output":
        return str(item["output"])
    return "".join(p["text"] for p in item["content"] if isinstance(p.get("text"), str))


def _set_item_text(items: list[dict[str, Any]], n: int, text: str) -> None:
    """Item `n`'s text set to `text` (a message's first text part holds it)."""
    item = items[n]
    if item["type"] == "function_call_output":
        item["output"] = text
        return
    holds = [isinstance(p.get("text"), str) for p in item["content"]]
    if True in holds:
        first = holds.index(True)
        item["content"] = [{**p, "text": text} if k == first else p
                           for k, p in enumerate(item["content"]) if k == first or not holds[k]]


def history_texts(history: list[dict[str, Any]]) -> list[str]:
    """A stored conversation's texts in the order the chain reads them."""
    return [m["content"] for m in history if isinstance(m.get("content"), str)]


def history_speakers(history: list[dict[str, Any]]) -> list[str]:
    """Who wrote each of `history_texts(history)`."""
    return [m["role"] for m in history if isinstance(m.get("content"), str)]


def usage(chat_usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if chat_usage is None:
        return None
    cached = (chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {"input_tokens": chat_usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": chat_usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": chat_usage["prompt_tokens"] + chat_usage["completion_tokens"]}


def response_object(req: ResponsesRequest, *, id: str, created_at: int, status: str,
                    output: list[dict[str, Any]], usage_: dict[str, Any] | None,
                    error: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Response, echoing the request's settings as OpenAI does."""
    fmt = (req.text.format.model_dump(by_alias=True, exclude_none=True)
           if req.text and req.text.format else {"type": "text"})
    choice: Any = req.tool_choice if req.tool_choice is not None else "auto"
    if isinstance(choice, ToolChoiceFunction):
        choice = {"type": "function", "name": choice.name}
    body = {
        "id": id, "object": "response", "created_at": created_at, "status": status,
        "completed_at": int(time.time()) if status == "completed" else None,
        "error": error,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete"
        else None,
        "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
        "model": req.model, "output": output,
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id,
        "store": req.store, "background": req.background,
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "text": {"format": fmt}, "tool_choice": choice,
        "tools": [{"type": "function", "name": t.name, "description": t.description,
                   "parameters": t.parameters, "strict": t.strict} for t in req.tools or []],
        "truncation": "disabled", "metadata": req.metadata or {},
        # Echoed as given (they change nothing here; an upstream gets them); the tier is
        # the one that served it, as OpenAI says it: one engine serves all alike.
        "prompt_cache_key": req.prompt_cache_key, "safety_identifier": req.safety_identifier,
        "prompt_cache_retention": req.prompt_cache_retention, "service_tier": "default",
    }
    if usage_ is not None:  # not nullable in the spec: absent until known
        body["usage"] = usage_
    if req.user is not None:
        body["user"] = req.user
    return body


def response_from_chat(req: ResponsesRequest, body: dict[str, Any], *, id: str,
                       created_at: int, order: list[str | int] | None = None,
                       ) -> dict[str, Any]:
    """A whole chat answer (first choice) as a Response (`order`: `output_items`')."""
    choice = body["choices"][0]
    output = output_items(choice["message"], choice.get("finish_reason"), order)
    status = "incomplete" if choice.get("finish_reason") == "length" else "completed"
    return response_object(req, id=id, created_at=created_at, status=status, output=output,
                           usage_=usage(body.get("usage")))
