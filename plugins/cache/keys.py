"""Cache keys: the canonical request, the scope, and the semantic partition.

The exact key hashes everything that changes the answer: route, model, the normalized
messages (or prompt) with their tool calls and tool results, and every output-shaping
parameter (tools, tool_choice and parallel_tool_calls included, and vLLM's extensions:
stop_token_ids, allowed_token_ids, bad_words, the chat-template controls, ...), a value
that means the field left out (`presence_penalty: 0`, `logit_bias: {}`) as left out. Never
`stream`, `stream_options`, `user` or headers. The scope id is hashed in, so the same prompt in two
tenants has two keys. Every key holds what the engine's answers depend on besides the
request too (`Terminal.answer_digest_for` the model asked for: its chat template and
how Weir renders a chat, its tool parser, structured-output options, model, context
length, generation defaults and vLLM arguments, digested once at start; an upstream's:
what its model list says serves that model), so that an answer cached under other
settings (an upgrade's, the operator's; Redis keeps them a day) is not replayed for a
request that is now answered otherwise. The semantic partition is the same hash without
the last user message: a semantic hit only ever returns an answer produced under the same scope,
model, system prompt, earlier turns and parameters.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

import orjson
from pydantic import BaseModel

from proxy.auth import Principal, key_part
from proxy.context import RequestContext
from proxy.preparing import echoed_prompts
from proxy.protocol import ChatCompletionRequest, CompletionRequest, RefusalPart, TextPart
from proxy.text import fold, normalize

_PARAMS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "n", "seed",
           "presence_penalty", "frequency_penalty", "logit_bias", "response_format", "tools",
           "tool_choice",
           "parallel_tool_calls", "ignore_eos", "min_tokens", "echo", "suffix", "logprobs",
           "top_logprobs", "best_of")
#: vLLM's extensions the in-process engine honours: keyed where they differ from their
#: default (a request that leaves them at it keeps the key an earlier version gave it).
_EXTENSIONS = ("stop_token_ids", "include_stop_str_in_output", "skip_special_tokens",
               "spaces_between_special_tokens", "allowed_token_ids", "bad_words",
               "add_generation_prompt", "continue_final_message")


def scope_id(principal: Principal, scope: str) -> str:
    if scope == "global":
        return "global"
    tenant = key_part(principal.tenant)
    if scope == "tenant":
        return f"t={tenant}"
    if scope == "role":
        return f"t={tenant};r={key_part(principal.role)}"
    return f"t={tenant};u={key_part(principal.user)}"


def _params(req: ChatCompletionRequest | CompletionRequest) -> dict[str, Any]:
    # What `req.model_dump(include=_PARAMS, exclude_none=True, by_alias=True)` gives
    # (tests/unit/plugins/test_cache.py holds them equal), field by field: a whole-model
    # dump was a visible share of a cache hit, and most of these are plain values.
    dumped: dict[str, Any] = {}
    extra = req.model_extra or {}
    fields = type(req).model_fields
    for name in _PARAMS:
        # (getattr on a name the model lacks raises inside pydantic: slow, so not that)
        v = getattr(req, name) if name in fields else extra.get(name)
        if v is None:
            continue
        if isinstance(v, BaseModel):
            v = v.model_dump(exclude_none=True, by_alias=True)
        elif isinstance(v, list) and v and isinstance(v[0], BaseModel):
            v = [x.model_dump(exclude_none=True, by_alias=True) for x in v]
        dumped[name] = v
    for name in _EXTENSIONS:
        field = fields.get(name)
        if field is not None and (v := getattr(req, name)) != field.default and v != []:
            dumped[name] = v
    dumped["stop"] = _stop_key(req.stops)
    dumped["max_tokens"] = req.output_limit
    return dumped


_NOTHING = object()

#: What greedy decoding reads none of: vLLM resets them and draws no random number.
_NOT_GREEDY = ("top_p", "top_k", "min_p", "seed")


#: Values a request may state that mean what leaving the field out means (OpenAI's
#: default, vLLM's, and the in-process engine's reading): `presence_penalty: 0` and no
#: `presence_penalty` ask one question. Not the sampling parameters a model's generation
#: config may default otherwise (temperature, top_p, top_k, min_p, repetition_penalty):
#: left out, those are the model's, which a stated value overrides. (`n: 1`, `echo:
#: false`, chat's `logprobs: false` are the fields' defaults: one key already.)
_AS_LEFT_OUT: dict[str, Any] = {
    "logit_bias": {},
    "response_format": {"type": "text"}, "parallel_tool_calls": True,
    # (tools given, as `tool_choice` needs: `auto`, as vLLM and OpenAI read none)
    "tool_choice": "auto",
    "suffix": "",  # (an empty suffix is none: `preparing` reads it so)
    "top_logprobs": 0,  # (`req.top_logprobs or 0`; with logprobs, bypassed anyway)
}

#: What a model's generation config may default otherwise too (vLLM reads its penalties),
#: left out as `_AS_LEFT_OUT` only where the model's defaults were filled into the request
#: before the chain (`with_model_defaults`: the in-process engine's), so that a penalty
#: still left out is 0; an upstream applies its own, which may not be 0.
_AS_LEFT_OUT_BY_THE_MODEL: dict[str, Any] = {"presence_penalty": 0.0,
                                             "frequency_penalty": 0.0}
_AS_LEFT_OUT_FILLED: dict[str, Any] = {**_AS_LEFT_OUT, **_AS_LEFT_OUT_BY_THE_MODEL}


def _keyed_params(req: ChatCompletionRequest | CompletionRequest,
                  defaults_filled: bool) -> dict[str, Any]:
    """`_params`, without the values that mean the field left out (`_AS_LEFT_OUT`, and
    `best_of` equal to `n`; the penalties at 0 where `defaults_filled`), and a greedy
    request's as temperature 0's (`greedy`: a temperature below vLLM's epsilon, or
    `top_p: 0`, goes to the engine as temperature 0, whose one answer no `top_p`,
    `top_k`, `min_p` or `seed` changes)."""
    params = _params(req)
    folded = _AS_LEFT_OUT_FILLED if defaults_filled else _AS_LEFT_OUT
    for name, left_out in folded.items():
        v = params.get(name, _NOTHING)
        # (a bool is no number here: `parallel_tool_calls: true` is not `1`)
        if v == left_out and isinstance(v, bool) == isinstance(left_out, bool):
            del params[name]
    if params.get("best_of") == req.n:  # (candidates: `n` unless said)
        del params["best_of"]
    if req.greedy_anywhere:  # (with `n` > 1, 1e-6 is sampled by a vLLM upstream)
        params["temperature"] = 0.0
        for name in _NOT_GREEDY:
            params.pop(name, None)
    return params


def _stop_key(stops: list[str]) -> list[str]:
    """The stop strings as the answer depends on them: in any order (sorted, one key),
    unless one ends another (`so` and `o`). Those end the answer at the same character
    and the engine keeps the one listed first (vLLM's tie-break): `["o", "so"]` answers
    "I'm s" where `["so", "o"]` answers "I'm ", so their order is part of the key."""
    if any(a != b and a.endswith(b) for a in stops for b in stops):
        return list(stops)
    return sorted(stops)


#: Fields a request may carry that do not change its answer (who asks, how it is billed
#: or kept): not in the key. Any other field Weir does not know is (an upstream engine
#: may honour it).
_NOT_ANSWER = frozenset({"user", "store", "metadata", "service_tier", "prompt_cache_key",
                         "safety_identifier", "prompt_cache_retention",
                         "prompt_cache_options", "stream",
                         "stream_options",
                         # a predicted output speeds an answer up, never changes it
                         "prediction",
                         # vLLM's: a client's own name for the request, its session
                         "request_id", "session_id"})


def _extras(obj: BaseModel) -> dict[str, Any] | None:
    """The fields Weir does not know that may change the answer; one sent as null is
    left out, as a server reads it (`reasoning_effort: null`, a message dumped by an SDK
    with `audio: null`): OpenAI's and vLLM's read null as the field's default."""
    extra = obj.model_extra
    if not extra:
        return None
    kept = {k: v for k, v in extra.items() if k not in _NOT_ANSWER and v is not None}
    return kept or None


def _messages(req: ChatCompletionRequest) -> list[dict[str, Any]]:
    out = []
    # A final message the answer continues (`continue_final_message`) is a raw prompt's
    # end: keyed as a completion's is (`fold`), since a trailing space makes other tokens.
    open_end = len(req.messages) - 1 if req.continue_final_message else -1
    for n, m in enumerate(req.messages):
        text = m.text()
        msg: dict[str, Any] = {
            "role": m.role, "content": fold(text) if n == open_end else normalize(text),
            "name": m.name,
            "tool_calls": [c.model_dump() for c in m.tool_calls] if m.tool_calls else None,
            "tool_call_id": m.tool_call_id}
        if m.refusal is not None:  # (read as the text only where there is no content)
            msg["refusal"] = m.refusal
        # Text parts are joined as the engine joins them, glued or one a line, which
        # the text above cannot tell: parts and the text they join to are two keys.
        if isinstance(m.content, list) and (n_texts := sum(
                isinstance(p, TextPart | RefusalPart) for p in m.content)) > 1:
            msg["text_parts"] = n_texts
        # What the text leaves out (an image, audio, a file; fields Weir does not know)
        # is keyed too: two requests with one text and two images are two questions.
        if isinstance(m.content, list) and any(
                not isinstance(p, TextPart | RefusalPart) for p in m.content):
            msg["parts"] = [p.model_dump() for p in m.content
                            if not isinstance(p, TextPart | RefusalPart)]
        if (extra := _extras(m)) is not None:
            msg["extra"] = extra
        out.append(msg)
    return out


def _dumps(obj: Any, sort: bool = True) -> bytes:
    try:
        return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS if sort else None)
    except TypeError:  # what orjson refuses: an integer past 64 bits, a lone surrogate
        return json.dumps(obj, sort_keys=sort, separators=(",", ":"),
                          ensure_ascii=False).encode("utf-8", "surrogatepass")


def _hash(obj: Any) -> str:
    return hashlib.sha256(_dumps(obj)).hexdigest()


#: Parameters holding JSON schemas, whose objects' key order is part of the answer.
_SCHEMAS = ("tools", "response_format")


def _schemas_in_order(params: dict[str, Any], extra: dict[str, Any] | None) -> str | None:
    """The tools' and the response format's JSON with its keys in the order the client
    wrote them (`_hash` sorts every object's keys): a schema's properties are generated
    in its order (a forced call's arguments, a structured answer, as OpenAI documents),
    and the model reads the schema as written, so another order is another request. So
    are the fields Weir does not know (`extra`: an upstream's `guided_json`,
    `structured_outputs`), which may hold a schema too."""
    held = {k: params[k] for k in _SCHEMAS if k in params}
    if extra is not None:
        held["extra"] = extra
    return _dumps(held, sort=False).decode("utf-8", "surrogatepass") if held else None


def key_request(ctx: RequestContext) -> ChatCompletionRequest | CompletionRequest:
    return ctx.key_request if ctx.key_request is not None else ctx.request


def exact_key(ctx: RequestContext, scope: str, answers: str | None = None, *,
              defaults_filled: bool = False) -> str:
    """`answers`: what the engine's answers depend on besides the request
    (`Terminal.answer_digest_for` the model; None where none can be told, and the key is
    what it was).
    `defaults_filled`: the model's sampling defaults were filled into the request (the
    in-process engine's; `_keyed_params`)."""
    req = key_request(ctx)
    params = _keyed_params(req, defaults_filled)
    body: dict[str, Any] = {"scope": scope_id(ctx.principal, scope), "route": ctx.route,
                            "model": req.model, "params": params}
    if (extra := _extras(req)) is not None:
        body["extra"] = extra
    if (in_order := _schemas_in_order(params, extra)) is not None:
        body["schemas_in_order"] = in_order
    if answers is not None:
        body["engine"] = answers
    if isinstance(req, ChatCompletionRequest):
        body["messages"] = _messages(req)
    else:
        # A raw prompt is continued as it ends: a trailing space (or a blank line) makes
        # other tokens, so only look-alikes are folded, not its blanks.
        body["prompt"] = [fold(p) if isinstance(p, str) else p for p in req.prompts()]
        if req.echo:  # (the answer holds its prompts as echoed: as sent, or redacted)
            body["echoed"] = echoed_prompts(engine_req, ctx.sent) if isinstance(
                engine_req := ctx.request, CompletionRequest) else None
    return _hash(body)


def asked_digest(ctx: RequestContext) -> str:
    """The request's prompt as the engine reads it, verbatim (what `exact_key` reads
    normalized): an entry's usage counts the prompt of this digest; a repeat of another
    one (other spaces, look-alike letters) is another count of tokens."""
    req = ctx.request
    if isinstance(req, ChatCompletionRequest):
        texts: list[Any] = [(m.role, m.name, m.text()) for m in req.messages]
    else:
        texts = list(req.prompts())
    return _hash(texts)


def semantic_parts(ctx: RequestContext, scope: str, answers: str | None = None, *,
                   defaults_filled: bool = False) -> tuple[str, str] | None:
    """(partition, question text) for a chat request ending in a user message; None for
    what the semantic layer never serves (a completion, a tool turn, a request offering
    tools: a paraphrase must not replay another request's tool calls). `answers`,
    `defaults_filled`: as `exact_key`'s."""
    req = key_request(ctx)
    if (not isinstance(req, ChatCompletionRequest) or req.messages[-1].role != "user"
            or req.tools):
        return None
    msgs = _messages(req)
    if "parts" in msgs[-1] or "extra" in msgs[-1]:
        return None  # the question is more than its text: only an exact repeat is one
    question = msgs[-1]["content"]
    params = _keyed_params(req, defaults_filled)
    part: dict[str, Any] = {"scope": scope_id(ctx.principal, scope), "model": req.model,
                            "context": msgs[:-1], "params": params}
    if answers is not None:
        part["engine"] = answers
    if msgs[-1]["name"] is not None:  # who asks is part of the prompt the model reads
        part["asker"] = msgs[-1]["name"]
    if (extra := _extras(req)) is not None:
        part["extra"] = extra
    if (in_order := _schemas_in_order(params, extra)) is not None:
        part["schemas_in_order"] = in_order
    partition = _hash(part)
    return partition, question


def prompt_text(ctx: RequestContext,
                read_tokens: Callable[[list[int]], str | None] | None = None) -> str:
    """The request's text, for `sensitive_patterns` and purges by content (kept with the
    entry, never logged); a prompt of token ids as `read_tokens` tells its text (the
    terminal's: a local engine's tokenizer), else as nothing."""
    req = key_request(ctx)
    if isinstance(req, ChatCompletionRequest):
        return "\n".join(normalize(m.text()) for m in req.messages)
    texts = [p if isinstance(p, str) else (read_tokens(p) if read_tokens else None)
             for p in req.prompts()]
    return "\n".join(normalize(t) for t in texts if t)


def request_text(ctx: RequestContext,
                 read_tokens: Callable[[list[int]], str | None] | None = None) -> str:
    """Everything of the request the model reads, for `sensitive_patterns`: its text
    (`prompt_text`), and what a chat request carries besides (the speakers' names, the
    names and arguments of earlier calls, the tool definitions, the response format) or
    a completion's suffix. A pattern found only there (`{"diagnosis": ...}` in a call's
    arguments) keeps the request out of the cache as one in a message does; each part is
    read normalized, as the messages are (a zero-width space or full-width letters there
    hid a match)."""
    text = prompt_text(ctx, read_tokens)
    req = key_request(ctx)
    more: list[str] = []
    if isinstance(req, ChatCompletionRequest):
        for m in req.messages:
            if m.name:
                more.append(m.name)
            for call in m.tool_calls or ():
                more += [call.function.name, call.function.arguments]
        if req.tools:
            more.append(json.dumps(req.tool_dicts(), ensure_ascii=False))
        if req.response_format is not None:
            more.append(json.dumps(req.response_format.model_dump(
                exclude_none=True, by_alias=True), ensure_ascii=False))
    elif req.suffix:
        more.append(req.suffix)
    return "\n".join([text, *map(normalize, more)]) if more else text
