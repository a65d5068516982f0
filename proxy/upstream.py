"""The upstream terminal: any OpenAI-compatible server (another Weir, a vLLM server, a
central cluster) behind Weir, as `engine.kind: upstream` or as a breaker fallback.
It serves at the OpenAI level, not on token ids (so it lives beside `LocalServing`, not
in the engine package): the request is forwarded as JSON through
one pooled aiohttp session, with connect and total timeouts, the W3C `traceparent`
passed on, and streams relayed chunk by chunk. An upstream 4xx is the client's error and
is passed through (status, body); a 5xx, a timeout or a refused connection is an engine
failure (502/504), which the breaker counts.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from .chain import Completion, Reply, Stream
from .context import RequestContext
from .engine.base import EngineStats, ModelInfo
from .errors import EngineError, ModelNotFound, Timeout, WeirError
from .rendering import ChunkAssembler
from .settings import UpstreamEngineSettings
from .streaming import SHUTDOWN
from .tracing import inject

_PATHS = {"chat": "/chat/completions", "completion": "/completions"}


class UpstreamError(WeirError):
    """An upstream 4xx, passed through as it came."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        raw = body.get("error")
        err: dict[str, Any] = raw if isinstance(raw, dict) else {}
        super().__init__(str(err.get("message") or "Upstream rejected the request."),
                         param=err.get("param"), code=err.get("code"))
        self.status = status
        self.type = str(err.get("type") or "invalid_request_error")


class Upstream:
    """A Terminal over an upstream server. `check_models=False` (a fallback target)
    forwards whatever model the request names."""

    def __init__(self, settings: UpstreamEngineSettings, *, check_models: bool = True) -> None:
        self.settings = settings
        self.check_models = check_models
        self.base = settings.base_url.rstrip("/")
        self._session: aiohttp.ClientSession | None = None
        self._models = list(settings.models)
        self._ready = False
        self._created = int(time.time())
        self.in_flight = 0

    async def start(self) -> None:
        s = self.settings
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=s.max_connections),
            timeout=aiohttp.ClientTimeout(total=s.timeout_s, connect=s.connect_timeout_s))
        if self.check_models and not self._models:
            try:
                async with self._session.get(f"{self.base}/models", headers=self._auth()) as r:
                    data = await r.json()
                self._models = [m["id"] for m in data.get("data", [])]
            except (aiohttp.ClientError, TimeoutError, ValueError):
                self._models = []
        self._ready = True

    async def close(self) -> None:
        self._ready = False
        if self._session is not None:
            await self._session.close()

    def ready(self) -> bool:
        return self._ready

    def models(self) -> list[ModelInfo]:
        return [ModelInfo(id=m, owned_by=self.settings.owned_by, root=m,  # not its address
                          created=self._created) for m in self._models]

    def stats(self) -> EngineStats:
        return EngineStats(running=self.in_flight)

    def _auth(self) -> dict[str, str]:
        key = self.settings.api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _headers(self, ctx: RequestContext) -> dict[str, str]:
        h = {**self._auth(), "Content-Type": "application/json"}
        if "x-request-id" in ctx.headers:
            h["x-request-id"] = ctx.headers["x-request-id"]
        if "traceparent" in ctx.headers:  # no active SDK span: pass the caller's on
            h["traceparent"] = ctx.headers["traceparent"]
        inject(h)  # the current span, when tracing is on, becomes the upstream's parent
        return h

    def routes(self) -> list[tuple[str, str, Any]]:
        return []

    def read_tokens(self, token_ids: list[int]) -> str | None:
        return None  # (the upstream holds the tokenizer)

    def has_model(self, model: str) -> bool:
        return not self.check_models or not self._models or model in self._models

    async def __call__(self, ctx: RequestContext) -> Reply:
        """Forward the request (after checking the model, unless told not to)."""
        if not self.has_model(ctx.model):
            raise ModelNotFound(ctx.model)
        assert self._session is not None, "Upstream.start() was not called"
        if ctx.engine_started is None:  # (the breaker times the call from here)
            ctx.engine_started = time.monotonic()
        body = ctx.request.model_dump(by_alias=True, exclude_none=True, exclude_defaults=False)
        if body.get("top_p") == 0:  # greedy, as the local engine decodes it (vLLM refuses 0)
            body["temperature"], body["top_p"] = 0, 1
        url = self.base + _PATHS[ctx.route]
        self.in_flight += 1
        try:
            resp = await self._session.post(url, data=json.dumps(body),
                                            headers=self._headers(ctx))
        except TimeoutError:
            self.in_flight -= 1
            raise Timeout("The upstream did not answer in time.") from None
        except aiohttp.ClientError:
            self.in_flight -= 1
            raise EngineError("The upstream is unreachable.") from None
        except asyncio.CancelledError as e:
            self.in_flight -= 1
            _left(ctx, e)
            raise
        if resp.status != 200 or not ctx.request.stream:
            try:
                return await self._whole(resp)
            except asyncio.CancelledError as e:
                _left(ctx, e)
                raise
            finally:
                self.in_flight -= 1
                resp.release()
        stream = Stream()
        stream.attach(self._relay(resp, ChunkAssembler(ctx.route), stream))
        return await stream.prime()

    async def _whole(self, resp: aiohttp.ClientResponse) -> Completion:
        try:
            data = await resp.json(content_type=None)
        except (aiohttp.ClientError, ValueError, TimeoutError):
            raise EngineError("The upstream sent an unreadable answer.") from None
        if resp.status >= 500:
            raise EngineError(f"The upstream failed ({resp.status}).")
        if resp.status >= 400:
            raise UpstreamError(resp.status, data if isinstance(data, dict) else {})
        return Completion(data)

    async def _relay(self, resp: aiohttp.ClientResponse, asm: ChunkAssembler,
                     stream: Stream) -> AsyncIterator[dict[str, Any]]:
        done = False
        try:
            buf = b""
            async for piece in resp.content.iter_any():
                buf += piece
                while b"\n\n" in buf:
                    event, buf = buf.split(b"\n\n", 1)
                    for line in event.split(b"\n"):
                        if not line.startswith(b"data: "):
                            continue
                        data = line[6:].strip()
                        if data == b"[DONE]":
                            asm.finish(stream)
                            done = True
                            return
                        chunk = json.loads(data)
                        if "error" in chunk:
                            raise EngineError("The upstream failed mid-stream.")
                        asm.feed(chunk)
                        yield chunk
        except (TimeoutError, aiohttp.ClientError, ValueError):
            raise EngineError("The upstream stream broke.") from None
        finally:
            if not done:
                asm.cut(stream)
            self.in_flight -= 1
            resp.release()


def _left(ctx: RequestContext, e: asyncio.CancelledError) -> None:
    """A request cut (its client gone, its deadline) while the upstream had it: what it
    spent comes only with the whole answer, which is never read, so the rate limiter
    charges its reservation (OpenAI bills an answer whose client left). A drain's cut is
    a 503 that says to retry elsewhere: nothing is charged."""
    if e.args != (SHUTDOWN,):
        ctx.spent_unknown = True
