"""An engine that answers at once, to measure what the gateway itself costs.

It speaks Weir's Engine protocol like the real one: `tokens` deltas per answer, one word
each, the last with finish reason `stop` (`length` when `max_tokens` cuts it first);
nothing waits, so every microsecond a request takes is the gateway's (HTTP, auth,
plugins, rendering, SSE).

`step=True`: one token per turn of the event loop, as a real engine hands its outputs
(one engine step's deltas at a time, the loop running the other requests in between):
the streams under way interleave, and each waits a turn for its first token, where the
instant engine answered each whole before the next one ran.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

from proxy.engine.base import ChoiceDelta, EngineOutput, EngineStats, ModelInfo, SamplingOptions


class InstantEngine:
    def __init__(self, model: str = "mock", tokens: int = 16, max_model_len: int = 4096,
                 step: bool = False) -> None:
        self.model = model
        self.tokens = tokens
        self.step = step
        self._max_model_len = max_model_len
        self.vocab_size = 32000
        self.sampling_defaults: dict[str, object] = {}
        self.part_separator = "\n"
        self.answer_digest: str | None = None  # (no settings: cache keys as without one)

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    def ready(self) -> bool:
        return True

    def failed(self) -> bool:
        return False

    def models(self) -> list[ModelInfo]:
        return [ModelInfo(id=self.model, owned_by="bench", root="mock", created=0,
                          max_model_len=self._max_model_len)]

    def stats(self) -> EngineStats:
        return EngineStats()

    def encode(self, text: str) -> list[int]:
        return [1 + (ord(c) % 255) for c in text[: self._max_model_len // 2]]

    def decode(self, token_ids: list[int]) -> str:
        return "".join(chr(t - 1) for t in token_ids)

    def render_chat(self, messages: list[dict[str, Any]], tools: Any, *,
                    add_generation_prompt: bool = True,
                    continue_final_message: bool = False) -> list[int]:
        return self.encode(" ".join(str(m.get("content") or "") for m in messages))

    async def generate(self, prompt: list[int], options: SamplingOptions, request_id: str, *,
                       cache_salt: str | None = None, priority: int = 0,
                       ) -> AsyncGenerator[EngineOutput, None]:
        n = min(self.tokens, options.max_tokens)
        reason = "stop" if n < options.max_tokens else "length"
        for i in range(n):
            if self.step:
                await asyncio.sleep(0)  # (one engine step: the loop runs the others)
            last = i == n - 1
            yield EngineOutput(
                choices=[ChoiceDelta(index=c, text=" word", token_ids=[100 + i],
                                     finish_reason=reason if last else None)
                         for c in range(options.n)],
                prompt_tokens=len(prompt), finished=last)

    async def abort(self, request_id: str) -> None:
        pass

    def tool_parser(self, tools: list[dict[str, Any]]) -> None:
        return None  # no parser: `auto` answers text, as with an unconfigured engine
