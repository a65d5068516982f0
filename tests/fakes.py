"""A fake Engine for unit and integration tests (never for the e2e suite).

Deterministic: the answer is derived from the prompt's token ids, one word a token,
so tests can predict it. A stop string equal to a word ends its choice there, as vLLM
ends one: the word left out of the text, `stop_reason` naming the string. `delay`
paces tokens; `fail_after` raises EngineFailed after that many tokens; `active` and
`aborted` show what the engine is doing, so tests can check that disconnects really
abort.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from proxy.engine.base import (
    ChoiceDelta,
    EngineFailed,
    EngineOutput,
    EngineStats,
    ModelInfo,
    SamplingOptions,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
)
from proxy.preparing import prompt_tokens
from proxy.protocol import ChatCompletionRequest, CompletionRequest

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]


class FakeEngine:
    def __init__(self, *, model: str = "fake-model", max_model_len: int = 512,
                 delay: float = 0.0, ready: bool = True, vocab_size: int = 1000,
                 tool_parser: bool = False) -> None:
        self.model = model
        #: When set, answers are this text (in 4-character pieces) instead of words.
        self.script: str | None = None
        #: When set, answers are these tokens, each (its text, its own bytes), as vLLM
        #: gives a token that is part of a UTF-8 character: text "" (the token that
        #: completes the character has all of its text), its bytes the part it holds.
        self.byte_tokens: list[tuple[str, bytes]] | None = None
        self.has_tool_parser = tool_parser
        self._max_model_len = max_model_len
        self.delay = delay
        self._ready = ready
        self.dead = False
        self.vocab_size = vocab_size
        #: the model's generation-config defaults (`Engine.sampling_defaults`)
        self.sampling_defaults: dict[str, Any] = {}
        #: `Engine.part_separator`: the text parts of a message read one a line
        self.part_separator = "\n"
        #: `Engine.answer_digest` (cache keys hold it; None: they are as without one): a
        #: test sets it, and changes it as a settings change would.
        self.answer_digest: str | None = None
        #: Per model (`Terminal.answer_digest_for`), over `answer_digest`.
        self.model_digests: dict[str, str] = {}
        self.fail_after: int | None = None
        #: Of each prompt, the tokens its answer reports read from the prefix cache (at
        #: most the prompt's: vLLM's `num_cached_tokens`)
        self.cached_tokens = 0
        self.active: set[str] = set()
        self.aborted: list[str] = []
        self.calls: list[tuple[list[int], SamplingOptions, str | None]] = []
        self.started = False
        self.closed = False
        self.token_gate: asyncio.Event | None = None  # when set, each token waits on it
        self._waiters: list[tuple[Any, asyncio.Future[None]]] = []
        #: request id -> tokens generated so far (`generated_tokens`), while it runs
        self.progress: dict[str, int] = {}

    def answer_digest_for(self, model: str) -> str | None:
        """`Terminal.answer_digest_for`, where a test serves this engine as the terminal."""
        return self.model_digests.get(model, self.answer_digest)

    def generated_tokens(self, request_id: str) -> int | None:
        """As vLLM's: None for a request it no longer holds (dropped with its last
        output, before the caller has read it)."""
        return self.progress.get(request_id)

    def _changed(self) -> None:
        for pred, fut in self._waiters:
            if not fut.done() and pred():
                fut.set_result(None)

    async def wait_until(self, pred: Any, timeout: float = 5.0) -> None:
        """Wake when `pred()` holds (checked whenever the set of active requests changes)."""
        if pred():
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (pred, fut)
        self._waiters.append(entry)
        try:
            async with asyncio.timeout(timeout):
                await fut
        finally:
            self._waiters.remove(entry)

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    async def start(self) -> None:
        self.started = True

    async def close(self) -> None:
        self.closed = True

    def ready(self) -> bool:
        return self._ready

    def set_ready(self, value: bool) -> None:
        self._ready = value

    def failed(self) -> bool:
        return self.dead

    def die(self) -> None:
        """As vLLM's engine process dying: not ready, and failed for good."""
        self._ready, self.dead = False, True

    def models(self) -> list[ModelInfo]:
        return [ModelInfo(id=self.model, owned_by="test", root="/fake", created=1700000000,
                          max_model_len=self._max_model_len)]

    def stats(self) -> EngineStats:
        return EngineStats(running=len(self.active))

    def encode(self, text: str) -> list[int]:
        return [1] + [ord(c) % 997 + 2 for c in text]

    def decode(self, token_ids: list[int]) -> str:
        return "".join(chr(t - 2) for t in token_ids if t >= 2)

    def read_tokens(self, token_ids: list[int]) -> str | None:
        """(As `LocalServing.read_tokens`: tests that hand plugins the engine as their
        terminal.)"""
        return self.decode(token_ids)

    async def count_prompt(self, request: ChatCompletionRequest | CompletionRequest,
                           ) -> int | None:
        """(As `LocalServing.count_prompt`, for the same tests.)"""
        return prompt_tokens(self, request)

    async def prepare(self, ctx: Any) -> None:
        """(As `Terminal.prepare`, for the same tests: nothing ahead.)"""

    def prepares_ahead(self, ctx: Any) -> bool:
        """(As `Terminal.prepares_ahead`: True, so `prepare` is called, and a test may
        replace it.)"""
        return True

    def prompt_entries(self, prompt: list[int], k: int) -> list[TokenLogprob]:
        """The prompt's logprobs: the first token has none; token i's is -i/10."""
        out = [TokenLogprob(self.decode(prompt[:1]), None, None, [])]
        for i, t in enumerate(prompt[1:], 1):
            tok = self.decode([t])
            top = [TopLogprob(tok, -i / 10, list(tok.encode()))] + [
                TopLogprob(f" p{j}", -5.0 - j, None) for j in range(k)]
            out.append(TokenLogprob(tok, -i / 10, list(tok.encode()), top))
        return out

    def render_chat(self, messages: list[dict[str, Any]], tools: Any, *,
                    add_generation_prompt: bool = True,
                    continue_final_message: bool = False) -> list[int]:
        ids = [1]
        for m in messages:
            ids.append(3)
            ids.extend(ord(c) % 997 + 2 for c in m["role"] + ":" + str(m["content"]))
        # (the default render ends as it always did: marks only for the vLLM controls)
        if not add_generation_prompt:
            ids.append(5)
        if continue_final_message:
            ids.append(6)
        return ids

    def tool_parser(self, tools: list[dict[str, Any]]) -> FakeToolParser | None:
        return FakeToolParser() if self.has_tool_parser else None

    def _pieces(self, prompt: list[int], options: SamplingOptions) -> list[str] | None:
        """Scripted or schema-constrained answers (the twin of structured output)."""
        if options.json_schema is not None:
            text = json.dumps(schema_instance(options.json_schema))
        elif self.byte_tokens is not None:
            return [t for t, _ in self.byte_tokens][:options.max_tokens]
        elif self.script is not None:
            text = self.script
        else:
            return None
        return [text[i:i + 4] for i in range(0, len(text), 4)][:options.max_tokens]

    @staticmethod
    def expected_text(prompt: list[int], n_tokens: int, choice: int = 0) -> str:
        seed = sum(prompt) + choice
        return "".join(" " + WORDS[(seed + i) % len(WORDS)] for i in range(n_tokens))

    async def generate(self, prompt: list[int], options: SamplingOptions, request_id: str, *,
                       cache_salt: str | None = None, priority: int = 0,
                       ) -> AsyncGenerator[EngineOutput, None]:
        self.calls.append((prompt, options, cache_salt))
        self.active.add(request_id)
        self.progress[request_id] = 0
        self._changed()
        finished_ok = False
        pieces = self._pieces(prompt, options)
        try:
            seed = sum(prompt)
            steps = options.max_tokens if pieces is None else len(pieces)
            stopped: set[int] = set()  # choices a stop string ended
            # Token i is id 10 + i: a stop token id ends the answer there, its text left
            # out unless kept (vLLM's `stop_token_ids`, `include_stop_str_in_output`).
            stop_at = next((i for i in range(steps) if 10 + i in (options.stop_token_ids
                                                                  or ())), None)
            if stop_at is not None:
                steps = stop_at + 1
            for i in range(steps):
                if self.token_gate is not None:
                    await self.token_gate.wait()
                if self.delay:
                    await asyncio.sleep(self.delay)
                else:
                    await asyncio.sleep(0)
                if self.fail_after is not None and i >= self.fail_after:
                    raise EngineFailed("injected failure")
                self.progress[request_id] = i + 1
                if i == steps - 1:  # its last output: dropped as vLLM drops it
                    self.progress.pop(request_id, None)
                last = i == steps - 1
                reason = ("length" if i == options.max_tokens - 1 and i != stop_at
                          else "stop")
                choices = []
                for c in range(options.n):
                    if c in stopped:
                        continue
                    word = (" " + WORDS[(seed + c + i) % len(WORDS)] if pieces is None
                            else pieces[i])
                    if pieces is None and word.strip() in options.stop:
                        stopped.add(c)
                        choices.append(ChoiceDelta(index=c, text="", token_ids=[10 + i],
                                                   logprobs=[] if options.logprobs is not None
                                                   else None, finish_reason="stop",
                                                   stop_reason=word.strip()))
                        continue
                    if i == stop_at and not options.include_stop_str_in_output:
                        word = ""
                    lp = None
                    if options.logprobs is not None:
                        own = (list(self.byte_tokens[i][1]) if self.byte_tokens is not None
                               else list(word.encode()))
                        top = [TopLogprob(word, -0.5, own)] + [
                            TopLogprob(f" t{k}", -1.0 - k, None) for k in range(options.logprobs)]
                        lp = [TokenLogprob(word, -0.5, own, top)]
                    choices.append(ChoiceDelta(index=c, text=word, token_ids=[10 + i],
                                               logprobs=lp,
                                               finish_reason=reason if last else None,
                                               stop_reason=10 + i if i == stop_at else None))
                last = last or len(stopped) == options.n
                yield EngineOutput(
                    choices=choices, prompt_tokens=len(prompt), finished=last,
                    cached_tokens=min(self.cached_tokens, len(prompt)),
                    prompt_logprobs=self.prompt_entries(prompt, options.prompt_logprobs)
                    if i == 0 and options.prompt_logprobs is not None else None)
                if last:
                    break
            finished_ok = True
        finally:
            self.active.discard(request_id)
            self.progress.pop(request_id, None)
            if not finished_ok:
                self.aborted.append(request_id)
            self._changed()

    async def abort(self, request_id: str) -> None:
        self.active.discard(request_id)
        self.aborted.append(request_id)
        self._changed()


def schema_instance(schema: dict[str, Any]) -> Any:
    """A small value that validates against `schema` (the subset tool schemas use)."""
    if "enum" in schema:
        return schema["enum"][0]
    if "anyOf" in schema:
        return schema_instance({**schema["anyOf"][0], **{k: v for k, v in schema.items()
                                                         if k != "anyOf"}})
    kind = schema.get("type", "object")
    if kind == "array":
        item = schema_instance(schema.get("items", {}))
        return [item] * max(1, int(schema.get("minItems", 1)))
    if kind == "object":
        props = schema.get("properties", {})
        return {k: schema_instance(props[k]) for k in schema.get("required", props)}
    return {"string": "x", "integer": 1, "number": 1.5, "boolean": True, "null": None}[kind]



class HoldingEngine(FakeEngine):
    """Answers its first tokens, then holds until `hold` is set."""

    def __init__(self, after: int = 2) -> None:
        super().__init__()
        self.hold = asyncio.Event()
        self.after = after
        self.held = 0  # generations waiting at the hold (`wait_until` sees it change)

    async def generate(self, *args: Any, **kwargs: Any) -> AsyncGenerator[Any, None]:
        n = 0
        async with aclosing(super().generate(*args, **kwargs)) as outputs:
            async for out in outputs:
                yield out
                n += 1
                if n >= self.after and not self.hold.is_set():
                    self.held += 1
                    self._changed()
                    try:
                        await self.hold.wait()
                    finally:
                        self.held -= 1


class FakeToolParser:
    """Finds `<call>{"name": ..., "arguments": {...}}</call>` (a made-up syntax)."""

    _CALL = re.compile(r"<call>(.*?)</call>", re.S)

    def __init__(self) -> None:
        self._text = ""
        self._sent = 0  # calls already streamed
        self._content_sent = 0

    def feed(self, delta: str, token_ids: list[int]) -> tuple[str | None, list[ToolCallDelta]]:
        self._text += delta
        calls = [self._read(m) for m in self._CALL.findall(self._text)]
        out = []
        for i, (name, args) in enumerate(calls[self._sent:], start=self._sent):
            half = len(args) // 2  # two argument pieces, as a real parser streams them
            out += [ToolCallDelta(i, f"fake-{i}", name),
                    ToolCallDelta(i, arguments=args[:half]),
                    ToolCallDelta(i, arguments=args[half:])]
        self._sent = len(calls)
        # the text outside whole calls, up to one begun (text after a call is content too)
        plain = self._CALL.sub("", self._text).split("<", 1)[0]
        content = plain[self._content_sent:] or None
        self._content_sent = len(plain)
        return content, out

    def finish(self, cut: bool = False) -> list[ToolCallDelta]:
        return []

    @staticmethod
    def _read(body: str) -> tuple[str, str]:
        """A call's name and arguments; a body that is no JSON is read as vLLM's hermes
        parser streams one: the name, and the arguments' text as the model wrote it."""
        try:
            c = json.loads(body)
        except ValueError:
            name = re.search(r'"name"\s*:\s*"([^"]*)"', body)
            args = re.search(r'"arguments"\s*:\s*', body)
            return (name[1] if name else "",
                    body[args.end():].rstrip().removesuffix("}") if args else "")
        return c["name"], json.dumps(c["arguments"])


class FakeEmbedder:
    """Bag-of-words vectors: same words, same vector; deterministic and instant."""

    model_id = "fake-embedder"
    max_tokens = 256  # (a word is a token)

    def __init__(self, dim: int = 64) -> None:
        self.dim = dim
        self.calls = 0

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def ready(self) -> None:
        pass

    async def embed(self, texts: list[str],
                    refuse_over: int | None = None) -> tuple[Any, list[int]]:
        import hashlib

        import numpy as np

        from proxy.embedding import refuse_long

        self.calls += 1
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in t.lower().replace("?", " ").replace(",", " ").split():
                h = int(hashlib.md5(w.encode()).hexdigest(), 16)
                out[i, h % self.dim] += 1.0
            n = np.linalg.norm(out[i])
            if n:
                out[i] /= n
        counts = [len(t.split()) for t in texts]
        refuse_long(counts, refuse_over)
        return out, counts
