"""The in-process vLLM engine: `AsyncLLM` behind Weir's Engine protocol.

Longer than most modules on purpose: it is the only module that imports vllm, so every
vLLM-specific piece (engine args, sampling params, chat rendering, tool parsers) lives
here and nowhere else.

The only module that imports vllm. It builds `AsyncEngineArgs` from YAML, starts
`AsyncLLM` in a worker thread (loading takes tens of seconds and must not block the event
loop, so `/health/live` answers meanwhile), renders chat templates with the engine's
own tokenizer, maps Weir's `SamplingOptions` to `SamplingParams` (DELTA outputs, so each
step carries only new tokens), and runs one warm-up request before it reports ready.

vLLM's engine core runs in a spawned process; `close()` shuts it down and waits for it,
so no engine process outlives Weir.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import re
import threading
import time
from collections.abc import AsyncGenerator
from typing import Any

from ..protocol import model_defaults, with_subschemas
from ..settings import VllmEngineSettings
from ..telemetry import get_logger
from . import builtin_models, call_json, regex_screen
from .answering import answer_digest, weights_fingerprint
from .base import (
    ChoiceDelta,
    EngineFailed,
    EngineOutput,
    EngineOverloaded,
    EngineRejected,
    EngineStats,
    ModelInfo,
    SamplingOptions,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
)
from .chat_text import ChatText, render_digest

# Keep vLLM's own logging to warnings unless the operator asks for more: its INFO lines
# are not structured and can name request ids at a high rate.
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

from vllm import envs as vllm_envs
from vllm.config.structured_outputs import StructuredOutputsConfig
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.openai.chat_completion.protocol import (
    ChatCompletionRequest as VllmChatRequest,
)
from vllm.exceptions import GracefulHTTPError, VLLMClientError
from vllm.inputs.engine import tokens_input
from vllm.outputs import RequestOutput
from vllm.platforms import current_platform
from vllm.renderers.hf import resolve_chat_template_content_format
from vllm.sampling_params import (
    RequestOutputKind,
    SamplingParams,
    StructuredOutputsParams,
)
from vllm.tokenizers.hf import ThreadSafeHFTokenizerMixin
from vllm.tool_parsers import ToolParser, ToolParserManager
from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError
from vllm.v1.metrics.loggers import StatLoggerBase
from vllm.v1.structured_output.backend_xgrammar import (
    STRING_SUPPORTED_FORMATS,
    has_xgrammar_unsupported_json_features,
)

log = get_logger("weir.engine")

# What `VllmEngine.start` passes AsyncEngineArgs itself (from `engine.<name>`): the same
# name in `extra_args` is an argument given twice.
_SET_BY_WEIR = ("model", "served_model_name", "tokenizer", "dtype", "quantization",
                "kv_cache_dtype", "max_num_seqs", "max_model_len", "gpu_memory_utilization",
                "enable_prefix_caching", "tensor_parallel_size", "seed", "disable_log_stats")


def extra_args_errors(extra: dict[str, Any]) -> list[tuple[str, str]]:
    """(key, message) for each `engine.extra_args` entry AsyncEngineArgs would refuse
    when the engine starts, minutes after the config was read: a name it has no
    argument for, one Weir sets itself, or a value not of the argument's type (a
    type pydantic cannot check, e.g. a torch dtype, is taken as it is)."""
    import dataclasses
    import sys

    from pydantic import ConfigDict, TypeAdapter, ValidationError

    from ..config_model import takes_bool

    fields = {f.name: f for f in dataclasses.fields(AsyncEngineArgs)}
    scope = vars(sys.modules[AsyncEngineArgs.__module__])
    errors: list[tuple[str, str]] = []
    for key, value in extra.items():
        field = fields.get(key)
        if field is None:
            errors.append((key, "not an argument of vLLM's engine (AsyncEngineArgs)"))
            continue
        if key in _SET_BY_WEIR:
            errors.append((key, "set by Weir itself" if key == "disable_log_stats"
                           else f"set by Weir from `engine.{key}`: set that instead"))
            continue
        try:
            kind = eval(field.type, scope) if isinstance(field.type, str) else field.type
            adapter: TypeAdapter[Any] = TypeAdapter(
                kind, config=ConfigDict(arbitrary_types_allowed=True))
        except Exception:  # (a type pydantic cannot read: not checked)
            continue
        if isinstance(value, bool) and not takes_bool(kind):
            errors.append((key, f"`{str(value).lower()}` is not a valid value here "
                                f"(expected {field.type})"))
            continue
        try:
            adapter.validate_python(value)
        except ValidationError as e:
            first = e.errors()[0]["msg"] if e.errors() else str(e)
            errors.append((key, f"{first} (expected {field.type})"))
    return errors


_FINISH = {"stop": "stop", "length": "length", "abort": "abort"}


class _StatsTap(StatLoggerBase):
    """Keeps the scheduler's latest numbers (running, waiting, KV-cache use)."""

    def __init__(self, vllm_config: Any, engine_index: int = 0, *, sink: EngineStats) -> None:
        self.sink = sink

    def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
               engine_idx: int = 0) -> None:
        if scheduler_stats is not None:
            self.sink.running = scheduler_stats.num_running_reqs
            self.sink.waiting = scheduler_stats.num_waiting_reqs
            self.sink.kv_cache_usage = float(scheduler_stats.kv_cache_usage)

    def log_engine_initialized(self) -> None:
        pass


class VllmEngine:
    def __init__(self, settings: VllmEngineSettings) -> None:
        self.settings = settings
        self._llm: AsyncLLM | None = None
        self._tokenizer: Any = None
        self._bytes: TokenBytes | None = None  # (read from `_tokenizer`: `_token_bytes`)
        #: Each thread's tokenizer and its `ChatText` (`_tok`, `_text`); the event loop's
        #: (where it started; else the first to tokenize) uses `_tokenizer` itself.
        self._own = threading.local()
        self._home: int | None = None
        self._homing = threading.Lock()
        self._ready = False
        self._model_path: str = settings.model
        builtin_models.check_source(settings.model)  # before listening: names the fix
        self._served = settings.served_model_name or builtin_models.served_name(settings.model)
        self._created = int(time.time())
        self._max_model_len = settings.max_model_len or 0
        self._stats = EngineStats()
        self._tool_parser: type[ToolParser] | None = None
        self._chat_template: str | None = None  # in place of the tokenizer's, where set
        self._vocab_size: int | None = None
        self._defaults: dict[str, Any] = {}
        self._part_separator = "\n"
        self._answer_digest: str | None = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    @property
    def vocab_size(self) -> int | None:
        return self._vocab_size

    @property
    def sampling_defaults(self) -> dict[str, Any]:
        return self._defaults

    @property
    def part_separator(self) -> str:
        return self._part_separator

    @property
    def answer_digest(self) -> str | None:
        return self._answer_digest

    def ready(self) -> bool:
        return self._ready and self._llm is not None and not self._llm.errored

    def failed(self) -> bool:
        return self._ready and self._llm is not None and self._llm.errored

    async def start(self) -> None:
        s = self.settings
        extra = dict(s.extra_args)
        if (s.cpu_kvcache_space_gib is not None and current_platform.is_cpu()
                and "kv_cache_memory_bytes" not in extra):
            # in bytes: vLLM reads its VLLM_CPU_KVCACHE_SPACE as whole GiB ("1.5" made
            # the engine's start fail), and that variable, where it is set, still wins
            extra["kv_cache_memory_bytes"] = int(s.cpu_kvcache_space_gib * 2**30)
        if s.model in builtin_models.BUILTINS:
            self._model_path = await asyncio.to_thread(builtin_models.resolve, s.model)
        if s.structured_output_compact and "structured_outputs_config" not in extra:
            # Engine-wide in vLLM: compact JSON for json_object / json_schema answers.
            extra["structured_outputs_config"] = StructuredOutputsConfig(
                backend="xgrammar", disable_any_whitespace=True)
        args = AsyncEngineArgs(
            model=self._model_path,
            served_model_name=[self._served],
            tokenizer=s.tokenizer,
            dtype=builtin_models.dtype(s.model, s.dtype),  # type: ignore[arg-type]
            quantization=s.quantization,  # type: ignore[arg-type]
            kv_cache_dtype=s.kv_cache_dtype,  # type: ignore[arg-type]
            max_num_seqs=s.max_num_seqs,
            max_model_len=s.max_model_len,  # type: ignore[arg-type]
            gpu_memory_utilization=s.gpu_memory_utilization,
            enable_prefix_caching=s.enable_prefix_caching,
            tensor_parallel_size=s.tensor_parallel_size,
            seed=s.seed,
            disable_log_stats=False,
            **extra,
        )
        sink = self._stats

        def tap(vllm_config: Any, engine_index: int = 0) -> _StatsTap:
            return _StatsTap(vllm_config, engine_index, sink=sink)

        self._llm = await asyncio.to_thread(AsyncLLM.from_engine_args, args,
                                            stat_loggers=[tap])
        # vLLM reads its environment settings anew on every lookup until this is called
        # (its engine processes call it once started; its API server never does): the
        # stats of every engine output looked one up, ~3% of the event loop's samples
        # at 220 req/s of FAQ traffic. Weir sets none of them after this point.
        vllm_envs.enable_envs_cache()
        self._tokenizer = self._llm.get_tokenizer()
        self._home = threading.get_ident()  # (the event loop's: `_tok`)
        # A built-in model's own template may lack what Weir serves it with (tools):
        # passed to each render (vLLM's tokenizer lends out copies of itself to render).
        self._chat_template = (builtin_models.chat_template(s.model)
                               if s.tokenizer is None else None)
        self._tool_parser = _tool_parser_class(s.tool_parser, self._tokenizer)
        self._max_model_len = int(self._llm.model_config.max_model_len)
        self._vocab_size = int(self._llm.model_config.get_vocab_size())
        self._part_separator = content_part_separator(self._tokenizer,
                                                      self._llm.model_config,
                                                      self._chat_template)
        # What vLLM's server applies where a request says nothing (its
        # `--generation-config auto`): the model's generation_config.json.
        self._defaults = model_defaults(self._llm.model_config.get_diff_sampling_param())
        self._answer_digest = self.digest_of(render_digest(
            self._chat_template or getattr(self._tokenizer, "chat_template", None),
            self._part_separator), self._max_model_len, self._defaults, {
                # (what `auto` resolved to, and the checkpoint: one replaced under the
                # same path kept the old one's digest, and its answers were replayed)
                "dtype": str(self._llm.model_config.dtype),
                # (a built-in's folder is built on each machine from what its name says)
                "weights": None if s.model in builtin_models.BUILTINS else
                await asyncio.to_thread(weights_fingerprint, self._model_path)})
        if s.warmup:
            await self._warmup()
        self._ready = True

    def digest_of(self, renders: str, max_model_len: int,
                  defaults: dict[str, Any], loaded: dict[str, Any] | None = None) -> str:
        """`answer_digest` of this engine's answer-affecting settings: how it renders a
        chat (`renders`), the model as configured and loaded, its context length and
        generation defaults (as started), the tool parser, compact structured output
        and vLLM's own arguments (any of which may shape an answer: all of them), and
        what identifies the weights loaded (`loaded`: the resolved dtype, the
        checkpoint's `weights_fingerprint`)."""
        s = self.settings
        return answer_digest({"loaded": loaded,
            "renders": renders, "model": s.model, "tokenizer": s.tokenizer,
            "dtype": s.dtype, "quantization": s.quantization,
            "kv_cache_dtype": s.kv_cache_dtype, "max_model_len": max_model_len,
            "defaults": defaults, "tool_parser": s.tool_parser,
            "structured_output_compact": s.structured_output_compact,
            "extra_args": s.extra_args})

    async def _warmup(self) -> None:
        """The paths a first request would otherwise pay for, while nobody waits: greedy
        decoding, and sampling with logprobs (the first `logprobs` request after a
        start held the engine for seconds, every tenant's requests behind it)."""
        prompt = self.render_chat([{"role": "user", "content": "warm up"}], None)
        for i, opts in enumerate((
                SamplingOptions(max_tokens=4, temperature=0.0),
                SamplingOptions(max_tokens=4, temperature=0.7, seed=0, logprobs=5))):
            async for _ in self.generate(prompt, opts, f"weir-warmup-{i}"):
                pass

    async def close(self) -> None:
        self._ready = False
        llm, self._llm = self._llm, None
        if llm is not None:
            await asyncio.to_thread(llm.shutdown)

    # ------------------------------------------------------------------- metadata

    def models(self) -> list[ModelInfo]:
        return [
            ModelInfo(
                id=self._served,
                owned_by=self.settings.owned_by,
                root=self.settings.model,  # as configured: not the cache's own path
                created=self._created,
                max_model_len=self._max_model_len or None,
            )
        ]

    def stats(self) -> EngineStats:
        if self._llm is None:
            return EngineStats()
        unfinished = self._llm.get_num_unfinished_requests()
        s = self._stats
        # The scheduler's numbers lag by a step; unfinished requests are exact here.
        return EngineStats(running=unfinished, waiting=min(s.waiting, unfinished),
                           kv_cache_usage=s.kv_cache_usage)

    # ----------------------------------------------------------------- tokenizing

    def _token_bytes(self) -> TokenBytes:
        if self._bytes is None or self._bytes.tokenizer is not self._tokenizer:
            self._bytes = TokenBytes(self._tokenizer)
        return self._bytes

    def _tok(self) -> Any:
        """This thread's tokenizer. A long prompt is prepared in the preparing thread
        while the event loop prepares short ones (`LocalServing`), and an HF tokenizer
        is not thread-safe: an encode sets `split_special_tokens` on its one Rust
        tokenizer, then encodes, so another thread's encode between the two read the
        other setting (a client's `<|end|>` made a control token, or the template's
        marker plain text). The event loop (the thread `start` ran on, which uses it
        beside this: logprobs' bytes, tool parsers) uses the engine's; any other thread
        a deep copy of its own, made once. vLLM's own tokenizer lends out a copy of
        itself to each call already: shared."""
        tok = self._tokenizer
        if isinstance(tok, ThreadSafeHFTokenizerMixin):
            return tok
        me = threading.get_ident()
        if self._home is None:
            with self._homing:
                if self._home is None:
                    self._home = me
        if me == self._home:
            return tok
        own = self._own
        if getattr(own, "source", None) is not tok:
            own.tokenizer, own.source = copy.deepcopy(tok), tok
        return own.tokenizer

    def _text(self) -> ChatText:
        """`ChatText` over this thread's tokenizer (`_tok`)."""
        tok, own = self._tok(), self._own
        text: ChatText | None = getattr(own, "text", None)
        if text is None or text.tokenizer is not tok:
            text = own.text = ChatText(tok)
        return text

    def encode(self, text: str) -> list[int]:
        # A completion prompt is the client's raw text, tokenized as vLLM's server does:
        # its special-token strings are control tokens (an app that templates a prompt
        # itself writes them); no turn of Weir's is in it to forge.
        return list(self._tok().encode(text, add_special_tokens=True))

    def decode(self, token_ids: list[int]) -> str:
        return str(self._tok().decode(token_ids))

    def render_chat(self, messages: list[dict[str, Any]], tools: list[Any] | None, *,
                    add_generation_prompt: bool = True,
                    continue_final_message: bool = False) -> list[int]:
        text = self._text()  # (this thread's: `_tok`)
        tools = text.escaped(tools)  # (a description is client text too)

        def render(msgs: list[dict[str, Any]]) -> str:
            return str(text.tokenizer.apply_chat_template(
                msgs, tools=tools, chat_template=self._chat_template,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message, tokenize=False))

        try:
            # Message text never becomes a control token; the template's markers do.
            return text.render(messages, render)
        except Exception as e:  # jinja raises for roles or shapes a template refuses
            raise EngineRejected(
                f"The model's chat template rejected the messages: {_clean(str(e))}",
                param="messages") from None

    # ----------------------------------------------------------------- generating

    def _sampling_params(self, o: SamplingOptions) -> SamplingParams:
        structured = None
        if o.json_schema is not None:
            try:
                loose = _loosened(o.json_schema)
            except Exception:  # a shape the walk does not expect: the schema's fault
                raise EngineRejected("The JSON schema could not be read.",
                                     param=o.schema_param) from None
            # As JSON text: the request goes to the engine process through msgpack,
            # which carries no integer past 64 bits, and a schema may hold one (a
            # `const`, an `enum`); the grammar compiler reads the text either way.
            structured = StructuredOutputsParams(json=json.dumps(loose))
        elif o.json_object:
            structured = StructuredOutputsParams(json_object=True)
        try:
            return SamplingParams(
                n=o.n,
                temperature=o.temperature,
                top_p=o.top_p,
                top_k=o.top_k or 0,
                min_p=o.min_p,
                repetition_penalty=o.repetition_penalty,
                seed=_engine_seed(o.seed),
                stop=o.stop or None,
                stop_token_ids=o.stop_token_ids,
                include_stop_str_in_output=o.include_stop_str_in_output,
                max_tokens=o.max_tokens,
                min_tokens=o.min_tokens,
                presence_penalty=o.presence_penalty,
                frequency_penalty=o.frequency_penalty,
                logit_bias=o.logit_bias,
                logprobs=o.logprobs,
                prompt_logprobs=o.prompt_logprobs,
                ignore_eos=o.ignore_eos,
                skip_special_tokens=o.skip_special_tokens,
                spaces_between_special_tokens=o.spaces_between_special_tokens,
                allowed_token_ids=o.allowed_token_ids,
                bad_words=o.bad_words,
                structured_outputs=structured,
                # As vLLM's server asks: a whole answer comes in one output, not one
                # per step, each of which woke this request's reader and the renderer.
                output_kind=(RequestOutputKind.FINAL_ONLY if o.final_only
                             else RequestOutputKind.DELTA),
            )
        except (VLLMClientError, ValueError) as e:
            raise _rejected(e, o.schema_param) from None

    async def generate(
        self,
        prompt: list[int],
        options: SamplingOptions,
        request_id: str,
        *,
        cache_salt: str | None = None,
        priority: int = 0,
    ) -> AsyncGenerator[EngineOutput, None]:
        llm = self._llm
        if llm is None or llm.errored:
            raise EngineFailed("engine is not running")
        params = self._sampling_params(options)
        want_logprobs = options.logprobs is not None
        finished = False
        seen = 0  # tokens handed over before this output
        outputs = llm.generate(tokens_input(prompt, cache_salt=cache_salt), params, request_id)
        if options.final_only:
            outputs = _counted(llm, outputs, request_id, options)
        try:
            async for out in outputs:
                if any(c.finish_reason == "error" for c in out.outputs):
                    raise _failed(out, options, seen)
                seen += sum(len(c.token_ids) for c in out.outputs)
                choices = [
                    ChoiceDelta(
                        index=c.index,
                        text=c.text,
                        token_ids=list(c.token_ids),
                        logprobs=_logprobs(c.logprobs, _shown(c, options),
                                           self._token_bytes())
                        if want_logprobs else None,
                        finish_reason=_FINISH.get(c.finish_reason or "", c.finish_reason),
                        stop_reason=_stop_reason(c),
                    )
                    for c in out.outputs
                ]
                finished = out.finished
                yield EngineOutput(
                    choices=choices,
                    prompt_tokens=len(out.prompt_token_ids or prompt),
                    finished=out.finished,
                    cached_tokens=out.num_cached_tokens or 0,
                    prompt_logprobs=_prompt_entries(self._token_bytes(), prompt,
                                                    out.prompt_logprobs)
                    if out.prompt_logprobs else None,
                    ttft_s=_ttft(out),
                )
        except GracefulHTTPError as e:
            raise EngineOverloaded(_clean(str(e))) from None
        except VLLMClientError as e:
            raise _rejected(e, options.schema_param) from None
        except EngineGenerateError as e:
            if seen == 0 and isinstance(e.__cause__, OverflowError):
                # A value of this request that the transport to the engine process
                # cannot carry: the request's fault, not the engine's (the breaker must
                # not count it against every tenant).
                raise EngineRejected("The request holds a number past what the engine "
                                     "can take (64 bits).") from None
            raise EngineFailed(type(e).__name__) from e
        except EngineDeadError as e:
            raise EngineFailed(type(e).__name__) from e
        finally:
            # vLLM registers a request before it hands it to its engine process, and a
            # refusal after that point (or any exception on our side of the loop) would
            # leave the request counted as running for good. Aborting an id vLLM no
            # longer knows is a no-op.
            if not finished and not llm.errored:
                await llm.abort(request_id)

    async def abort(self, request_id: str) -> None:
        if self._llm is not None:
            await self._llm.abort(request_id)

    def generated_tokens(self, request_id: str) -> int | None:
        """The tokens a request under way has generated so far (a whole answer's, which
        tells none until its end): the breaker tells a hung engine from a working one.
        None where the engine cannot say: a request it no longer holds (it just ended:
        vLLM drops its state with its last output), or state kept elsewhere than this
        version keeps it."""
        if self._llm is None:
            return None
        try:
            if request_id not in self._llm.output_processor.external_req_ids:
                return None
        except (AttributeError, TypeError):
            return None
        return _generated(self._llm, request_id)

    def tool_parser(self, tools: list[dict[str, Any]]) -> _ToolParserAdapter | None:
        if self._tool_parser is None:
            return None
        return _ToolParserAdapter(self._tool_parser, self._tok(), tools)


# ------------------------------------------------------------------- tool parsing


def _tool_parser_class(name: str | None, tokenizer: Any) -> type[ToolParser] | None:
    """vLLM's parser registered under `name` (the `--tool-call-parser` names), checked
    against the model's tokenizer once at start (some need special tokens it may lack)."""
    if name is None:
        log.info("no engine.tool_parser configured: `tool_choice: auto` answers text; "
                 "`required` and named tool choices still answer with calls")
        return None
    try:
        cls = ToolParserManager.get_tool_parser(name)
    except KeyError:
        known = ", ".join(sorted(ToolParserManager.list_registered()))
        raise ValueError(f"engine.tool_parser: unknown parser `{name}` (known: {known})"
                         ) from None
    if cls is Hermes2ProToolParser and all(
            callable(getattr(cls, m, None)) for m in ("_extract_tool_name", "_extract_tool_args")):
        cls = _HermesCalls
    try:
        cls(tokenizer, [])
    except Exception as e:  # parsers raise what they like when a token is missing
        raise ValueError(f"engine.tool_parser: `{name}` does not fit this model: {e}"
                         ) from None
    return cls


class _HermesCalls(Hermes2ProToolParser):
    """vLLM's hermes parser, a streamed call's name and arguments read as members of its
    JSON object (`call_json`): it read the name as the first `"name": "..."` anywhere in
    the text and the arguments as all the text after `"arguments":` to the object's end,
    so arguments written before the name (`{"arguments": {...}, "name": "f"}`), or a
    member after them, went out as arguments (`{...}, "name": "f"`), and a `name` key
    inside arguments written first named the call. It reads every call's text again at
    each token: each read goes on from the one before it (`call_json.Reader`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._calls = call_json.Reader()

    def _extract_tool_name(self, tc_json: str) -> str | None:  # type: ignore[override]
        return call_json.member_string(tc_json, "name", self._calls)

    def _extract_tool_args(self, tc_json: str,  # type: ignore[override]
                           is_complete: bool) -> str | None:
        return call_json.member_text(tc_json, "arguments", self._calls)


class _ToolParserAdapter:
    """One answer's vLLM tool parser behind Weir's engine-neutral `ToolCallParser`."""

    def __init__(self, cls: type[ToolParser], tokenizer: Any,
                 tools: list[dict[str, Any]]) -> None:
        self._request = VllmChatRequest.model_validate(
            {"messages": [], "tools": tools, "tool_choice": "auto"})
        self._parser = cls(tokenizer, self._request.tools)  # type: ignore[arg-type]
        self._text = ""
        self._ids: list[int] = []
        self._named: set[int] = set()  # calls whose name was streamed

    def feed(self, delta: str, token_ids: list[int]) -> tuple[str | None, list[ToolCallDelta]]:
        prev_text, prev_ids = self._text, self._ids
        self._text, self._ids = prev_text + delta, prev_ids + token_ids
        msg = self._parser.extract_tool_calls_streaming(
            prev_text, self._text, delta, prev_ids, self._ids, token_ids, self._request)
        if msg is None:
            return None, []
        deltas = [ToolCallDelta(d.index, d.id, d.function.name if d.function else None,
                                d.function.arguments if d.function else None)
                  for d in msg.tool_calls]
        self._named.update(d.index for d in deltas if d.name)
        return msg.content, deltas

    def finish(self, cut: bool = False) -> list[ToolCallDelta]:
        """The last call's arguments the parser held back, if that call was begun (an
        answer cut before a call's name was whole has no call). vLLM reads absent
        arguments as {}: right for a call the model closed without any, made up for one
        `cut` (max_tokens) before they began."""
        calls = self._parser.prev_tool_call_arr
        index = len(calls) - 1
        if index not in self._named or (cut and "arguments" not in calls[index]):
            return []
        rest = self._parser.get_remaining_unstreamed_args()
        if not rest:
            return []
        return [ToolCallDelta(index, arguments=rest)]


# Native code (the grammar compiler) prefixes its messages with a time and a source path.
_NATIVE_NOISE = re.compile(
    r"\[\d{1,2}:\d{2}:\d{2}\]\s*"  # [22:43:45]
    r"|(?:[A-Za-z]:)?[/\\](?:[\w+-]+[/\\])*[\w+-]+(?:\.[\w+-]+)*"
    r"\.(?:cc|cpp|cxx|c|h|hpp|py|rs)\b(?::\d+)*:?\s*"
)
_MAX_MESSAGE = 500


async def _counted(llm: AsyncLLM, outputs: AsyncGenerator[RequestOutput, None],
                   request_id: str, options: SamplingOptions
                   ) -> AsyncGenerator[RequestOutput, None]:
    """vLLM's outputs for a request that hands over only its final one, each awaited in a
    task of its own, so that a cancellation (client gone, deadline) reaches this frame
    before vLLM's generator, which aborts the request and drops its state at once: what
    the request had generated is read first (`options.generated`, what it spent)."""
    try:
        while True:
            step = asyncio.ensure_future(anext(outputs))
            try:
                out = await asyncio.shield(step)
            except StopAsyncIteration:
                return
            except asyncio.CancelledError:
                if step.done() and not step.cancelled() and step.exception() is None:
                    done = step.result()  # the final output, in hand as the cut came
                    options.generated += sum(len(c.token_ids) for c in done.outputs)
                else:
                    options.generated += _generated(llm, request_id)
                    step.cancel()
                    await asyncio.gather(step, return_exceptions=True)
                raise
            yield out
            if out.finished:  # vLLM's generator ends at once after it: no task for that
                async for _ in outputs:
                    pass
                return
    finally:
        await outputs.aclose()


def _generated(llm: AsyncLLM, request_id: str) -> int:
    """The tokens a request still running has generated (every choice of it): vLLM keeps
    them on its output processor's per-request state until the request ends, and the
    choices that ended already (n > 1) on their parent's aggregated outputs. 0 where that
    state is not where this version keeps it."""
    try:
        proc = llm.output_processor
        states = [s for i in proc.external_req_ids.get(request_id, ())
                  if (s := proc.request_states.get(i)) is not None]
        running = sum(s.detokenizer.num_output_tokens() for s in states
                      if s.detokenizer is not None)
        parents = {id(s.parent_req): s.parent_req for s in states if s.parent_req is not None}
        ended = sum(len(o.token_ids) for p in parents.values()
                    for o in p.output_aggregator if o is not None)
        return int(running + ended)
    except (AttributeError, TypeError):
        return 0


# Schema keywords the grammar compiler cannot enforce; vLLM refuses a schema holding
# them. They narrow values a schema already types (a multiple, distinct items, a string
# format, a length beside a pattern): the answer is constrained without them, as OpenAI
# constrains a tool that is not strict, where vLLM's server falls back to another
# compiler. (Object keywords that decide which keys exist are left to be refused.)
_NUMBER_ONLY = ("multipleOf",)
_ARRAY_ONLY = ("uniqueItems", "contains", "minContains", "maxContains")


def _loosened(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` without the keywords the compiler refuses, nor the regexes it would quote
    in the log (a copy; as given when it holds none)."""
    schema = regex_screen.screened(schema)
    if not has_xgrammar_unsupported_json_features(schema):
        return schema
    return _loosen(schema)  # type: ignore[no-any-return]


def _loosen(node: Any) -> Any:
    if not isinstance(node, dict):
        return node
    types = node.get("type")
    kinds = ({types} if isinstance(types, str) else
             {t for t in types if isinstance(t, str)} if isinstance(types, list) else set())
    out: dict[str, Any] = {}
    for key, value in node.items():
        if kinds & {"integer", "number"} and key in _NUMBER_ONLY:
            continue
        if "array" in kinds and key in _ARRAY_ONLY:
            continue
        if "string" in kinds:
            if key == "format" and value not in STRING_SUPPORTED_FORMATS:
                continue
            if key in ("minLength", "maxLength") and ("pattern" in node or "format" in node):
                continue
        out[key] = value
    return with_subschemas(out, _loosen)


def _clean(message: str) -> str:
    """An engine message fit for a client: no source paths, no stamps, bounded (cut before
    the regex runs, as the message can quote the client's own input)."""
    text = " ".join(_NATIVE_NOISE.sub("", message[: _MAX_MESSAGE * 2]).split())
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."


def _failed(out: RequestOutput, options: SamplingOptions, seen: int = 0) -> Exception:
    """A choice vLLM ended in error (it said `finish_reason: "error"`). With a schema, its
    grammar failed: before any token, it did not compile in the engine process (a
    pattern past the compiler, which the front-end check passed); after some, it refused
    every token the model could write next (a schema no finite value matches, a
    recursion with no way out). Either is the request's fault, a 400 naming the schema,
    never counted against the engine (vLLM's other per-request errors come from KV
    connectors and multimodal encoders, which this engine has none of). Else the
    engine's."""
    if options.json_schema is not None or options.json_object:
        if not seen and not any(len(c.token_ids) for c in out.outputs):
            return EngineRejected("The engine could not compile this JSON schema into a "
                                  "grammar (a pattern or a size past what it supports).",
                                  param=options.schema_param)
        return EngineRejected("The engine could not go on under this JSON schema: no "
                              "token the model could write next fits it (a schema that no "
                              "finite value matches, such as a recursion with no way out).",
                              param=options.schema_param)
    return EngineFailed("the engine failed the request")


def _rejected(e: Exception, schema_param: str) -> EngineRejected:
    """`schema_param`: the request param the JSON schema came from (SamplingOptions)."""
    message = _clean(str(e)) or "The engine refused the request."
    param = getattr(e, "parameter", None)
    if param is None and ("schema" in message.lower() or "grammar" in message.lower()):
        param = schema_param
    return EngineRejected(message, param=param)


def content_part_separator(tokenizer: Any, model_config: Any,
                           chat_template: str | None = None) -> str:
    """How vLLM's server joins a message's text parts for this model's chat template
    (read as its server reads it, `--chat-template-content-format auto`): a template
    that walks `content` itself (the "openai" content format) is handed the parts and
    writes them one after another; any other gets them one a line (its `"\\n".join`)."""
    fmt = resolve_chat_template_content_format(chat_template, None, "auto", tokenizer,
                                               model_config=model_config)
    return "" if fmt == "openai" else "\n"


def _ttft(out: Any) -> float | None:
    """vLLM's own time to the request's first token (its stats, on every output), from
    when its scheduler took the request (a wait in vLLM's queue, behind other requests,
    is load, not slowness: its engine-core clock), else from its arrival."""
    stats = getattr(out, "metrics", None)
    if stats is None:
        return None
    first, scheduled = getattr(stats, "first_token_ts", 0.0), getattr(stats, "scheduled_ts", 0.0)
    if first and scheduled and first >= scheduled:
        return float(first - scheduled)
    latency = getattr(stats, "first_token_latency", 0.0)
    return float(latency) if latency and latency > 0 else None


def _prompt_entries(own: TokenBytes, prompt: list[int], entries: Any) -> list[TokenLogprob]:
    """vLLM's prompt logprobs (None for the first token, then one map per token) as one
    entry per prompt token; the first has no logprob, as vLLM's server and OpenAI show.
    Their tokens spell the prompt as vLLM spells a character split over tokens
    elsewhere: "" for each part but the last, which has the whole character."""
    text = str(own.tokenizer.decode(prompt[:1]))
    first = TokenLogprob(token=text, logprob=None, bytes=own(prompt[0], text) if prompt
                         else None, top=[])
    out = [first, *_logprobs(list(entries)[1:], prompt[1:], own)]
    if text.endswith("\ufffd"):
        _spell_head(own.tokenizer, prompt, out)
    return out


#: UTF-8's longest character, in bytes: the most tokens one character is split over.
_MOST_PARTS = 4


def _spell_head(tokenizer: Any, prompt: list[int], out: list[TokenLogprob]) -> None:
    """The first entries, where the prompt's first token ends inside a character: vLLM
    reads a token's text against the prompt tokens before it, which leave out the first
    (it has no logprob), so the first was "\ufffd" (decoded alone) and the tokens that
    complete its character "" (or their own bytes garbled). Each part is "" and the
    token that completes the character has all of it, as vLLM spells a character split
    later on; an alternative there reads the same parts before it. Left as they were
    where no token in UTF-8's longest character completes it (token ids that spell
    no text), or where the first token was whole (a "\ufffd" of the prompt's own)."""
    head = prompt[:_MOST_PARTS]
    for end in range(1, len(head)):
        whole = str(tokenizer.decode(head[:end + 1]))
        if whole.endswith("\ufffd"):
            continue
        if whole.startswith(out[0].token):
            return
        out[0].token = ""
        for i in range(1, end + 1):
            e = out[i]
            e.token = whole if i == end else ""
            for t in e.top:
                if t.token == "" or "\ufffd" in t.token:  # ("", or its bytes garbled)
                    t.token = _after(tokenizer, head[:i], t)
        return


def _after(tokenizer: Any, parts: list[int], alt: TopLogprob) -> str:
    """An alternative's text after `parts` (the pieces of one unfinished character):
    the character it completes, or "" where it does not complete one."""
    if alt.id is None:
        return alt.token
    text = str(tokenizer.decode([*parts, alt.id]))
    return "" if text.endswith("\ufffd") else text


_SEED_BITS = 32
_MASK64 = (1 << 64) - 1


def _engine_seed(seed: int | None) -> int | None:
    """A request's `seed` (OpenAI's int64) as the engine's sampler reads it. On CPU,
    vLLM seeds a torch CPU generator, whose Mersenne Twister keeps a seed's low 32 bits
    alone: a seed and that seed plus any multiple of 2**32 (-1 and 2**32 - 1 among
    them) sampled the same answer. One outside 0 .. 2**32 - 1 is mixed into that range
    (splitmix64's finalizer), so that two seeds share a sampling only by chance, as two
    seeds drawn at random may, and no longer by their low bits; one inside it is
    passed as vLLM's server passes it, as is one outside int64 (vLLM refuses it; the
    HTTP layer's bounds refused it before). Other platforms' generators read all 64
    bits."""
    if (seed is None or 0 <= seed < 1 << _SEED_BITS or not -(1 << 63) <= seed < 1 << 63
            or not current_platform.is_cpu()):
        return seed
    z = seed & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> (64 - _SEED_BITS)


def _stop_reason(c: Any) -> int | str | None:
    """What ended a choice, as vLLM's server reports it (`stop_reason`): the stop string
    matched or the stop token id; None for the model's end of text or a length cut."""
    r = getattr(c, "stop_reason", None)
    return r if isinstance(r, str | int) and not isinstance(r, bool) else None


def _shown(c: Any, options: SamplingOptions) -> Any:
    """The tokens of a choice's text: an end-of-turn or stop token (`stop_reason` None or
    a token id) ends the answer and is not in its text, so it has no logprob entry (the
    entries' tokens join to the content, as OpenAI's do), unless the request keeps it
    (`include_stop_str_in_output`: vLLM then detokenizes it too)."""
    ids = c.token_ids
    if (c.finish_reason == "stop" and not isinstance(c.stop_reason, str) and len(ids)
            and not options.include_stop_str_in_output):
        return ids[:-1]
    return ids


def _logprobs(entries: Any, token_ids: Any, own: TokenBytes | None = None,
              ) -> list[TokenLogprob]:
    """`own`: each token's own bytes (None: its text's, as before a tokenizer is known)."""
    out: list[TokenLogprob] = []
    bytes_of = own or _text_bytes
    for tid, entry in zip(token_ids, entries or [], strict=False):
        chosen = entry.get(tid)
        tops = sorted(entry.items(), key=lambda item: item[1].rank or 0)
        out.append(
            TokenLogprob(
                token=_tok(chosen),
                logprob=max(float(chosen.logprob), -9999.0) if chosen else -9999.0,
                bytes=bytes_of(tid, _tok(chosen)),
                top=[TopLogprob(_tok(lp), max(float(lp.logprob), -9999.0),
                                bytes_of(t, _tok(lp)), t)
                     for t, lp in tops],
            )
        )
    return out


def _tok(lp: Any) -> str:
    return (lp.decoded_token if lp is not None else None) or ""


def _text_bytes(token_id: int, text: str) -> list[int] | None:
    return list(text.encode("utf-8")) if text else None


def _byte_chars() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the character standing for each byte in a byte-level
    BPE vocabulary (printable ones for themselves, the rest moved past U+0100)."""
    kept = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    moved = [b for b in range(256) if b not in kept]
    return {**{chr(b): b for b in kept}, **{chr(256 + i): b for i, b in enumerate(moved)}}


_BYTE_CHARS = _byte_chars()
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class TokenBytes:
    """A token's own bytes (a logprob's `bytes`, as OpenAI gives them): for a token that
    is part of a UTF-8 character, that part, where vLLM's text of it is "" (the token
    completing the character is given all of its text). Read from the vocabulary: a
    byte-level BPE's piece is its bytes spelled in GPT-2's alphabet, a byte-fallback
    token `<0xE6>` one byte; any other token (an added token, a SentencePiece word, a
    tokenizer of another kind) is its text's bytes, as before."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._kind = _decoder_kinds(tokenizer)
        self._added = set(getattr(tokenizer, "added_tokens_decoder", None) or ())
        self._known: dict[int, list[int] | None] = {}

    def __call__(self, token_id: int, text: str) -> list[int] | None:
        if token_id in self._known:
            return self._known[token_id] or _text_bytes(token_id, text)
        own = self._own(token_id)
        if len(self._known) < 1 << 18:  # (a vocabulary's worth)
            self._known[token_id] = own
        return own or _text_bytes(token_id, text)

    def _own(self, token_id: int) -> list[int] | None:
        if not self._kind or token_id in self._added:
            return None
        try:
            piece = self.tokenizer.convert_ids_to_tokens(token_id)
        except Exception:  # (an id past the vocabulary: its text, as before)
            return None
        if not isinstance(piece, str) or not piece:
            return None
        if "ByteFallback" in self._kind and (m := _BYTE_TOKEN.fullmatch(piece)):
            return [int(m.group(1), 16)]
        if "ByteLevel" in self._kind and all(c in _BYTE_CHARS for c in piece):
            return [_BYTE_CHARS[c] for c in piece]
        return None


def _decoder_kinds(tokenizer: Any) -> set[str]:
    """The kinds of the tokenizer's decoder that spell bytes (`ByteLevel`, `ByteFallback`):
    none known, none read (its tokens' text is their bytes). The decoder's own JSON is
    read, not the whole tokenizer's (its vocabulary and merges: tens of MB to serialize
    and parse on the event loop, at the first request asking for logprobs)."""
    if getattr(tokenizer, "byte_decoder", None):  # (a slow GPT-2-like tokenizer)
        return {"ByteLevel"}
    try:
        decoder = tokenizer.backend_tokenizer.decoder
        decoder = json.loads(decoder.__getstate__()) if decoder is not None else None
    except Exception:  # (no Rust tokenizer behind it: a Mistral, a tiktoken one)
        return set()
    kinds: set[str] = set()
    stack = [decoder]
    while stack:
        d = stack.pop()
        if isinstance(d, dict):
            if d.get("type") in ("ByteLevel", "ByteFallback"):
                kinds.add(d["type"])
            stack.extend(d.get("decoders") or [])
    return kinds



def bundled_nvml() -> Any:
    """vLLM's own copy of NVML's bindings (`vllm.third_party.pynvml`), for the GPU
    memory metric where no `pynvml` is installed beside it: this module is the one
    that imports vLLM."""
    from vllm.third_party import pynvml
    return pynvml
