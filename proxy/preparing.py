"""Request preparation: an OpenAI request in, token ids and engine-neutral options out.

`prepare_chat` / `prepare_completion` render the prompt with the engine's tokenizer and
map OpenAI's parameters (and vLLM's extensions) to `SamplingOptions`, refusing what the
engine cannot do with a 400 naming the param (a prompt longer than the context, a token
id past the vocabulary, a vLLM extension it does not honour). Nothing here runs the
engine: `proxy.serving` does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import tools as T
from .engine.base import Engine, EngineRejected, SamplingOptions
from .errors import InvalidRequest, shown
from .protocol import (
    LOCAL_UNSUPPORTED,
    VLLM_CHAT_UNSUPPORTED,
    VLLM_COMPLETION_UNSUPPORTED,
    ChatCompletionRequest,
    CompletionRequest,
    OtherPart,
    ResponseFormat,
    refuse_unsupported,
)
from .text import fold


@dataclass(slots=True)
class Prepared:
    prompts: list[list[int]]
    options: SamplingOptions
    top_logprobs: int = 0
    echo_texts: list[str] = field(default_factory=list)
    #: A completion's `max_tokens: 0` with `echo`: the engine makes one token (it cannot
    #: make none) and the answer is the prompt alone.
    echo_only: bool = False
    #: Chat: makes one choice's tool-call tracker (model text -> tool_calls); None where
    #: the request can call no tool (no `tools`, or `tool_choice: none`): its answer is
    #: text, as a `text` tracker would pass it on, with no tracker to step per chunk.
    tracker: Any = None
    #: Chat with a tool parser reading the answer (`tool_choice: auto`): a whole answer
    #: is its stream assembled, so that the two agree on content and calls wherever the
    #: parser's whole and streaming readings differ (an answer cut inside a call).
    streams_calls: bool = False


def _message_dicts(req: ChatCompletionRequest, separator: str) -> list[dict[str, Any]]:
    out = []
    for i, m in enumerate(req.messages):
        if isinstance(m.content, list):
            for j, part in enumerate(m.content):
                if isinstance(part, OtherPart):
                    raise InvalidRequest(
                        f"Content parts of type `{shown(part.type)}` are not supported by this "
                        "model; only `text` parts are.",
                        param=f"messages[{i}].content[{j}].type",
                        code="unsupported_content",
                    )
        d: dict[str, Any] = {"role": m.role, "content": m.text(separator)}
        if m.name:
            d["name"] = m.name
        if m.tool_calls:
            d["tool_calls"] = T.template_calls(m.tool_calls)
        if m.tool_call_id:
            d["tool_call_id"] = m.tool_call_id
        out.append(d)
    return out


def _structured(fmt: ResponseFormat | None) -> tuple[dict[str, Any] | None, bool]:
    if fmt is None or fmt.type == "text":
        return None, False
    if fmt.type == "json_object":
        return None, True
    assert fmt.json_schema is not None
    return (fmt.json_schema.schema_ or {"type": "object"}), False


def _logit_bias(raw: dict[str, float] | None, vocab: int | None) -> dict[int, float] | None:
    if not raw:
        return None
    out = {}
    for k, v in raw.items():
        try:
            tid = int(k)
        except ValueError:
            raise InvalidRequest(f"Invalid token id `{shown(k)}` in `logit_bias`.",
                                 param="logit_bias", code="invalid_value") from None
        if tid < 0 or (vocab is not None and tid >= vocab):
            raise InvalidRequest(f"Token id {tid} in `logit_bias` is out of the vocabulary.",
                                 param="logit_bias", code="invalid_value")
        out[tid] = v
    return out


def _token_ids(ids: list[int] | None, vocab: int | None, param: str) -> list[int] | None:
    """Token ids a request names (`stop_token_ids`, `allowed_token_ids`), inside the
    vocabulary as vLLM requires (it indexes the logits with them)."""
    if not ids:
        return None
    if vocab is not None and (past := [t for t in ids if t >= vocab]):
        raise InvalidRequest(f"Token id {past[0]} in `{param}` is out of the vocabulary "
                             f"(ids are below {vocab}).", param=param, code="invalid_value")
    return list(ids)


def _options(
    req: ChatCompletionRequest | CompletionRequest,
    prompt_len: int,
    max_model_len: int,
    logprobs: int | None,
    vocab: int | None,
    prompt_param: str,
    default_limit: int | None = None,
) -> SamplingOptions:
    """`default_limit`: the model's own output limit (its generation config's
    `max_new_tokens`), for a request that names none; else the whole room left."""
    if prompt_len >= max_model_len:
        raise InvalidRequest(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"prompt has {prompt_len} tokens.",
            param=prompt_param,
            code="context_length_exceeded",
        )
    limit = req.output_limit
    room = max_model_len - prompt_len
    if limit is not None and limit > room:
        param = req.output_limit_param
        raise InvalidRequest(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {prompt_len + limit} tokens ({prompt_len} in the prompt, {limit} for "
            "the completion). Please reduce the prompt or the completion length.",
            param=param,
            code="context_length_exceeded",
        )
    cap = room if default_limit is None else min(default_limit, room)
    if limit is None and req.min_tokens > cap:  # (a limit named is checked at parse)
        raise _min_tokens_over(req.min_tokens, cap, "the model's context less the prompt"
                               if cap == room else "the model's default output limit")
    temperature = 1.0 if req.temperature is None else req.temperature
    top_p = 1.0 if req.top_p is None else req.top_p
    if req.greedy:  # (vLLM refuses `top_p: 0`, and samples a temperature below 0.01 at
        temperature, top_p = 0.0, 1.0  # 0.01: neither would be greedy there)
    schema, json_object = _structured(req.response_format)
    stop = req.stops
    return SamplingOptions(
        max_tokens=limit if limit is not None else cap,
        temperature=temperature,
        top_p=top_p,
        top_k=req.top_k,
        min_p=req.min_p or 0.0,
        repetition_penalty=req.repetition_penalty or 1.0,
        # Greedy choices are one answer n times (vLLM refuses n > 1 there): generated
        # once, handed out n times (`serving.engine_outputs`).
        n=1 if req.greedy else req.n,
        stop=stop,
        stop_token_ids=_token_ids(req.stop_token_ids, vocab, "stop_token_ids"),
        include_stop_str_in_output=req.include_stop_str_in_output,
        seed=req.seed,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        logit_bias=_logit_bias(req.logit_bias, vocab),
        logprobs=logprobs,
        min_tokens=req.min_tokens,
        ignore_eos=req.ignore_eos,
        json_schema=schema,
        json_object=json_object,
        # (an engine's refusal of the schema names it, as the request's own check does)
        schema_param="response_format.json_schema.schema" if schema is not None
        else "response_format",
        skip_special_tokens=req.skip_special_tokens,
        spaces_between_special_tokens=req.spaces_between_special_tokens,
        allowed_token_ids=_token_ids(req.allowed_token_ids, vocab, "allowed_token_ids"),
        bad_words=list(req.bad_words) if req.bad_words else None,
    )


def _chat_ids(engine: Engine, req: ChatCompletionRequest, tools: bool = True) -> list[int]:
    """The chat's prompt as the engine renders it (`tools` False: without the tools'
    definitions)."""
    messages = _message_dicts(req, engine.part_separator)
    try:
        return engine.render_chat(messages, req.tool_dicts() if tools else None,
                                  add_generation_prompt=req.add_generation_prompt,
                                  continue_final_message=req.continue_final_message)
    except EngineRejected as e:
        raise InvalidRequest(str(e), param=e.param or "messages", code="invalid_value") from None


def prompt_tokens(engine: Engine, req: ChatCompletionRequest | CompletionRequest) -> int:
    """The tokens of the request's prompt as `prepare_chat` / `prepare_completion` make
    them (its `usage.prompt_tokens` on a miss), without the rest of the preparation: for
    a cached answer to another prompt (a paraphrase's) to report the asker's. Raises as
    rendering does (InvalidRequest for what the template or the parts refuse)."""
    if isinstance(req, ChatCompletionRequest):
        return len(_chat_ids(engine, req))
    return sum(len(engine.encode(p)) if isinstance(p, str) else len(p)
               for p in req.prompts())


def prepare_chat(engine: Engine, req: ChatCompletionRequest) -> Prepared:
    refuse_unsupported(req.model_extra, LOCAL_UNSUPPORTED)
    refuse_unsupported(req.model_extra, VLLM_CHAT_UNSUPPORTED)
    ids = _chat_ids(engine, req)
    if req.tools and len(ids) >= engine.max_model_len:
        raise _tools_over(engine, req, len(ids))
    top = req.top_logprobs or 0
    opts = _options(req, len(ids), engine.max_model_len, top if req.logprobs else None,
                    engine.vocab_size, "messages", engine.sampling_defaults.get("max_tokens"))
    parses = T.shape_options(req, opts, engine)
    tracker = ((lambda: T.ToolCallTracker.for_request(req, engine.tool_parser))
               if T.mode(req, has_parser=True) != "text" else None)
    return Prepared([ids], opts, top_logprobs=top, streams_calls=parses, tracker=tracker)


def _tools_over(engine: Engine, req: ChatCompletionRequest, prompt: int) -> InvalidRequest:
    """A chat prompt with tools past the context: the tokens the tools' definitions take
    (the prompt rendered without them, told apart), as OpenAI's message counts those in
    the messages and those in the functions; `param` is `tools` where they alone are
    past the context or are the larger part, else `messages`. (Rendered again only on
    this refusal.)"""
    most = engine.max_model_len
    try:
        rest = len(_chat_ids(engine, req, tools=False))
    except InvalidRequest:  # (a template that will not render the chat without them)
        rest = prompt
    in_tools = max(prompt - rest, 0)
    return InvalidRequest(
        f"This model's maximum context length is {most} tokens. However, your prompt has "
        f"{prompt} tokens ({prompt - in_tools} in `messages`, {in_tools} in `tools`). "
        "Please reduce the length of `messages` or `tools`.",
        param="tools" if in_tools >= most or in_tools > prompt - in_tools else "messages",
        code="context_length_exceeded")


def echoed_prompts(req: CompletionRequest, sent: Any = None) -> list[str | list[int]]:
    """What `echo` gives back of each prompt: as the caller sent it (OpenAI's), not as
    the sanitizer passed it on normalized (look-alikes folded, invisible characters
    dropped: `proxy.text.fold`), unless a redaction changed it: then as the engine read
    it, the redaction made (the secret is never echoed, nor kept in a cached answer).
    `sent`: the request as sent (`RequestContext.sent`; None: `req` is it). Token ids
    are the engine's (their text is echoed). With `logprobs`, each prompt as the engine
    read it: its tokens are scored, and they join to the text their `text_offset`s
    index (echoed as sent, a folded character or a dropped one left them pointing into
    other characters)."""
    given = req.prompts()
    if not isinstance(sent, CompletionRequest) or req.logprobs is not None:
        return given
    asked = sent.prompts()
    if len(asked) != len(given):
        return given
    return [a if isinstance(a, str) and isinstance(g, str) and g in (a, fold(a)) else g
            for a, g in zip(asked, given, strict=True)]


class EchoAsSent:
    """A completion's choices, as an upstream sends them, with each echoed prompt given
    back as `echo` gives it (`echoed_prompts`): the upstream echoes the prompt it was
    sent, the chain's (normalized by the sanitizer). Called on a whole answer's choices,
    or on each chunk's: a choice's echo may come over several chunks, each of any length
    (as an upstream splits its text), so its text is held (the chunks go out with none)
    until it has spelled the echo, then given back with it swapped; text that leaves it
    (the upstream echoed something else), or a choice that ends inside it, goes out as
    it came."""

    def __init__(self, req: Any, sent: Any) -> None:
        self._n = 1
        self._swaps: dict[int, tuple[str, str]] = {}
        if isinstance(req, CompletionRequest) and req.echo:
            self._n = req.n
            self._swaps = {i: (given, back) for i, (given, back) in enumerate(
                zip(req.prompts(), echoed_prompts(req, sent), strict=False))
                if isinstance(given, str) and isinstance(back, str) and given != back}
        self._held: dict[int, str] = {}  # a choice's text so far, inside its echo
        self._seen: set[int] = set()  # choices whose echo went by

    def __call__(self, choices: Any) -> None:
        if not self._swaps or not isinstance(choices, list):
            return
        for c in choices:
            i, text = (c.get("index"), c.get("text")) if isinstance(c, dict) else (None, None)
            if not isinstance(i, int) or i in self._seen:
                continue
            held = self._held.get(i, "")
            text = held + (text if isinstance(text, str) else "")
            ended = c.get("finish_reason") is not None
            if not text:
                continue
            swap = self._swaps.get(i // self._n)
            if swap is None:
                self._seen.add(i)
                continue
            given, back = swap
            if text.startswith(given):
                c["text"] = back + text[len(given):]
            elif given.startswith(text) and not ended:
                self._held[i] = text
                c["text"] = ""
                continue
            elif held:  # (not the echo after all, or cut inside it: as it came)
                c["text"] = text
            self._held.pop(i, None)
            self._seen.add(i)


def prepare_completion(engine: Engine, req: CompletionRequest,
                       sent: CompletionRequest | None = None) -> Prepared:
    """`sent`: the request as the caller sent it, where the chain passed on another
    (`RequestContext.sent`): what `echo` gives back (`echoed_prompts`)."""
    refuse_unsupported(req.model_extra, VLLM_COMPLETION_UNSUPPORTED)
    if req.suffix:
        raise InvalidRequest("Unsupported parameter: `suffix`: this model does not fill in "
                             "the middle (the text after the completion).", param="suffix",
                             code="unsupported_parameter")
    if req.best_of is not None and req.best_of != req.n:
        raise InvalidRequest("Unsupported parameter: `best_of`: other than `n` (candidates "
                             "ranked, and only the best returned) is not supported.",
                             param="best_of", code="unsupported_parameter")
    prompts: list[list[int]] = []
    echo: list[str] = []
    vocab = engine.vocab_size
    # An error names the prompt at fault as the parser names an array's member (OpenAI's
    # `messages[2].content`): `prompt[1]` of several, `prompt` where there is one.
    one = isinstance(req.prompt, str) or isinstance(req.prompt[0], int)

    def param(i: int) -> str:
        return "prompt" if one else f"prompt[{i}]"

    echoed = echoed_prompts(req, sent) if req.echo else []
    for i, p in enumerate(req.prompts()):
        if isinstance(p, str):
            prompts.append(engine.encode(p))
            back = echoed[i] if req.echo else p
            echo.append(back if isinstance(back, str) else p)
        else:
            if vocab is not None and (past := next(
                    (j for j, t in enumerate(p) if t >= vocab), None)) is not None:
                raise InvalidRequest(f"The prompt holds token ids past the model's vocabulary "
                                     f"of {vocab}.", param=f"{param(i)}[{past}]",
                                     code="invalid_value")
            prompts.append(list(p))
            echo.append(engine.decode(prompts[-1]) if req.echo else "")
        if not prompts[-1]:  # the engine has nothing to start from
            raise InvalidRequest("The prompt is empty: it must hold at least one token.",
                                 param=param(i), code="invalid_value")
    longest = max(len(p) for p in prompts)
    at = param(next(i for i, p in enumerate(prompts) if len(p) == longest))
    if req.echo_only and longest >= engine.max_model_len:
        raise InvalidRequest(
            f"This model's maximum context length is {engine.max_model_len} tokens. However, "
            f"your prompt has {longest} tokens, and `max_tokens: 0` with `echo` still needs "
            "room for one token (the engine makes one and it is not shown).",
            param=at, code="context_length_exceeded")
    opts = _options(req, longest, engine.max_model_len, req.logprobs, vocab, at,
                    engine.sampling_defaults.get("max_tokens"))
    if req.echo and req.logprobs is not None:
        opts.prompt_logprobs = req.logprobs
    if req.echo_only:  # its one token is not shown: one generation serves every choice
        opts.max_tokens, opts.n = 1, 1
    return Prepared(prompts, opts, top_logprobs=req.logprobs or 0, echo_texts=echo,
                    echo_only=req.echo_only)


def _min_tokens_over(min_tokens: int, most: int, why: str) -> InvalidRequest:
    return InvalidRequest(f"`min_tokens` ({min_tokens}) may not exceed the tokens the answer "
                          f"may have ({most}: {why}).", param="min_tokens",
                          code="invalid_value")


def check_min_tokens(options: SamplingOptions, ceiling: int) -> None:
    """After the operator's output ceiling is applied: `min_tokens` within it (vLLM's
    own refusal named a `max_tokens` the client never sent, and no param)."""
    if options.min_tokens > options.max_tokens:
        raise _min_tokens_over(options.min_tokens, ceiling, "this server's output ceiling")
