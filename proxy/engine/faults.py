"""A fault-injecting wrapper around any Engine, for chaos and recovery tests.

Off unless `engine.faults: true`. Then `POST /admin/faults {"mode": ..., "delay_s": ...}`
(an operator key only: a fault hits every tenant) switches what `generate` does: `ok`
(pass through), `error` (fail at once, as a dead engine does), `hang` (never produce a
token, until the caller gives up), `slow` (wait `delay_s` before the first token).
Everything else passes through to the real engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any, Literal

from pydantic import Field

from ..config_model import ConfigModel
from .base import (
    Engine,
    EngineFailed,
    EngineOutput,
    EngineStats,
    ModelInfo,
    SamplingOptions,
    ToolCallParser,
)

Mode = Literal["ok", "error", "hang", "slow"]


class FaultRequest(ConfigModel):
    """The body of `POST /admin/faults`."""


    mode: Mode = Field(description="What `generate` does from now on.")
    delay_s: float | None = Field(None, ge=0, le=3600,
                                  description="Delay before the first token in `slow` mode.")


class FaultyEngine:
    def __init__(self, inner: Engine) -> None:
        self.inner = inner
        self.mode: Mode = "ok"
        self.delay_s = 1.0

    def switch(self, req: FaultRequest) -> None:
        self.mode = req.mode
        if req.delay_s is not None:
            self.delay_s = req.delay_s

    # Everything but `generate` is the inner engine's, stated one by one (the protocol
    # says what callers use; nothing passes through unseen).
    @property
    def max_model_len(self) -> int:
        return self.inner.max_model_len

    @property
    def vocab_size(self) -> int | None:
        return self.inner.vocab_size

    @property
    def sampling_defaults(self) -> Any:
        return self.inner.sampling_defaults

    @property
    def part_separator(self) -> str:
        return self.inner.part_separator

    @property
    def answer_digest(self) -> str | None:
        return self.inner.answer_digest

    def models(self) -> list[ModelInfo]:
        return self.inner.models()

    def stats(self) -> EngineStats:
        return self.inner.stats()

    def encode(self, text: str) -> list[int]:
        return self.inner.encode(text)

    def decode(self, token_ids: list[int]) -> str:
        return self.inner.decode(token_ids)

    def render_chat(self, messages: list[dict[str, Any]], tools: list[Any] | None, *,
                    add_generation_prompt: bool = True,
                    continue_final_message: bool = False) -> list[int]:
        return self.inner.render_chat(messages, tools,
                                      add_generation_prompt=add_generation_prompt,
                                      continue_final_message=continue_final_message)

    async def abort(self, request_id: str) -> None:
        await self.inner.abort(request_id)

    def generated_tokens(self, request_id: str) -> int | None:
        """What the inner engine has made; 0 for a request held by the fault (hung, or
        in its delay: the inner engine has not seen it)."""
        counted = getattr(self.inner, "generated_tokens", None)
        made = counted(request_id) if counted is not None else None
        return 0 if made is None and self.mode in ("hang", "slow") else made

    def tool_parser(self, tools: list[dict[str, Any]]) -> ToolCallParser | None:
        return self.inner.tool_parser(tools)

    async def start(self) -> None:
        await self.inner.start()

    async def close(self) -> None:
        await self.inner.close()

    def ready(self) -> bool:
        return self.inner.ready()

    def failed(self) -> bool:
        return self.inner.failed()

    async def generate(self, prompt: list[int], options: SamplingOptions, request_id: str,
                       **kw: Any) -> AsyncGenerator[EngineOutput, None]:
        if self.mode == "error":
            raise EngineFailed("injected fault")
        if self.mode == "hang":
            await asyncio.Event().wait()
        delay = self.delay_s if self.mode == "slow" else 0.0
        if delay:
            await asyncio.sleep(delay)  # the injected fault is the delay itself
        # (closed with this one, so the engine's abort runs at once, not at collection)
        async with aclosing(self.inner.generate(prompt, options, request_id, **kw)) as outs:
            async for out in outs:
                if delay and out.ttft_s is not None:  # the engine's own time leaves it out
                    out.ttft_s += delay
                delay = 0.0
                yield out
