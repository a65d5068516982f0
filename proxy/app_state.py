"""Typed application state: what the routes share, and the drain bookkeeping.

`track()` wraps every generation request: it counts it in flight and remembers its
task, so shutdown can wait for the count to reach zero (`drain`) and then cancel the
stragglers (`abort_all`), which closes their streams and aborts their generations.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from .auth import Authenticator
from .chain import BasePlugin, Next
from .embedding import Embedder
from .settings import Settings
from .streaming import CUT_BY_SHUTDOWN, SHUTDOWN
from .tally import Tally
from .telemetry import Metrics
from .terminal import Terminal


class BodyBudget:
    """The bytes of the request bodies being read, by owner (a tenant's account)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held = Tally()

    @property
    def held(self) -> dict[str, int]:
        return dict(self._held.items())

    def take(self, owner: str, size: int) -> bool:
        if not size:  # (nothing more to hold)
            return True
        total, mine = self._held.total, self._held.get(owner)
        if total and total + size > self.limit and (
                mine * len(self._held) >= total or total + size > 2 * self.limit):
            return False
        self._held.add(owner, size)
        return True

    def give(self, owner: str, size: int) -> None:
        self._held.add(owner, -size)


@dataclass
class AppState:
    settings: Settings
    terminal: Terminal
    auth: Authenticator
    metrics: Metrics
    plugins: list[BasePlugin[Any]]
    chain: Next
    #: The chain of /v1/embeddings (the plugins that serve it, then the embedder).
    embed_chain: Next | None = None
    embedder: Embedder | None = None
    draining: bool = False
    #: The event loop's time by which a shutdown must be over (`weir serve` sets it as
    #: its drain begins, where a thread ends an overrunning one): what closes past the
    #: drain keeps its own waits within it. None: no such deadline (tests, embedding).
    shutdown_by: float | None = None
    engine_error: BaseException | None = None
    #: Set once the engine has started (or failed to).
    engine_settled: asyncio.Event = field(default_factory=asyncio.Event)
    #: each generation's task, and its request (marked when the drain's end cuts it)
    _inflight: dict[asyncio.Task[Any], web.Request | None] = field(default_factory=dict)
    _idle: asyncio.Event = field(default_factory=asyncio.Event)

    #: the request bodies being read (`proxy.body`)
    bodies: BodyBudget = field(init=False)

    def __post_init__(self) -> None:
        self._idle.set()
        self.bodies = BodyBudget(self.settings.server.max_body_bytes_in_flight)

    @property
    def in_flight(self) -> int:
        return len(self._inflight)

    @contextmanager
    def track(self, request: web.Request | None = None) -> Iterator[None]:
        task = asyncio.current_task()
        assert task is not None
        self._inflight[task] = request
        self._idle.clear()
        self.metrics.in_flight.inc()
        try:
            yield
        finally:
            self._inflight.pop(task, None)
            self.metrics.in_flight.dec()
            if not self._inflight:
                self._idle.set()

    async def drain(self, timeout: float) -> bool:
        """Wait until nothing is in flight; False if the timeout came first."""
        try:
            async with asyncio.timeout(timeout):
                await self._idle.wait()
            return True
        except TimeoutError:
            return False

    async def abort_all(self, grace: float = 5.0) -> int:
        tasks = list(self._inflight)
        for t, request in list(self._inflight.items()):
            if request is not None:
                request[CUT_BY_SHUTDOWN] = True
            t.cancel(SHUTDOWN)  # streams end with an in-band error and [DONE]
        if tasks:
            await asyncio.wait(tasks, timeout=grace)
        self.metrics.aborted.labels("shutdown").inc(len(tasks))
        return len(tasks)

    def readiness(self) -> dict[str, Any]:
        if self.draining:
            status = "draining"
        elif self.failed():
            status = "failed"
        elif not self.terminal.ready():
            status = "loading"
        else:
            # (A shared dependency's outage, a `fail_closed` limiter's Redis, is not this
            # replica's: every replica shares it, so it stays ready, its requests that
            # need it get their own 503, and the details say so.)
            status = "ready"
        body: dict[str, Any] = {"status": status, "in_flight": self.in_flight}
        stats = self.terminal.stats()
        body["engine"] = {"ready": self.terminal.ready(), "running": stats.running,
                          "waiting": stats.waiting}
        plugins = {p.name: h for p in self.plugins if (h := p.health()) is not None}
        if plugins:
            body["plugins"] = plugins
        return body

    def failed(self) -> bool:
        """The engine failed to start, or died once started: this process serves no more
        generations until it restarts."""
        return self.engine_error is not None or self.terminal.failed()

    def refresh_gauges(self) -> None:
        stats = self.terminal.stats()
        self.metrics.engine_running.set(stats.running)
        self.metrics.engine_waiting.set(stats.waiting)
        if stats.kv_cache_usage is not None:
            self.metrics.kv_cache.set(stats.kv_cache_usage)
        for gpu, used in gpu_memory().items():
            self.metrics.gpu_memory.labels(gpu).set(used)


def gpu_memory() -> dict[str, int]:
    """Bytes in use per GPU (device-wide, so the engine's own process counts), if any.

    Read through NVML, which asks the driver and opens no CUDA context: torch's
    `mem_get_info` made one on every GPU in this process at the first scrape (the engine
    runs in its own processes, so this one had none), taking hundreds of MiB of each
    GPU from the engine and blocking the event loop while it did. NVML first (a context
    of this process's on one GPU, an embedder's, is none on the others); torch only
    without NVML, where this process has its CUDA context already. The GPUs are those
    CUDA sees (CUDA_VISIBLE_DEVICES), labelled as CUDA numbers them. No NVML (no driver,
    a CPU image) and no context: nothing. Metrics never fail for it.
    """
    import sys

    try:
        nvml = _nvml()
        if nvml is not None:
            return {str(i): int(nvml.nvmlDeviceGetMemoryInfo(handle).used)
                    for i, handle in enumerate(_visible(nvml))}
        cuda = getattr(sys.modules.get("torch"), "cuda", None)
        if cuda is not None and cuda.is_initialized():
            out = {}
            for i in range(cuda.device_count()):
                free, total = cuda.mem_get_info(i)
                out[str(i)] = int(total - free)
            return out
        return {}
    except Exception:  # a driver or init error is not worth a failed scrape
        return {}


_NVML: list[Any] = []  # the NVML module once initialised; None where it cannot be


def _nvml() -> Any:
    import sys

    if not _NVML:
        import importlib

        nvml: Any = None
        try:
            try:
                nvml = importlib.import_module("pynvml")
            except ImportError:
                if "vllm" not in sys.modules:  # (not vLLM's whole import for a scrape)
                    raise
                from .engine.vllm import bundled_nvml
                nvml = bundled_nvml()
            nvml.nvmlInit()
        except Exception:  # no library, no driver, no GPU
            nvml = None
        _NVML.append(nvml)
    return _NVML[0]


def _visible(nvml: Any) -> list[Any]:
    """NVML's handles of the GPUs CUDA shows this process, in CUDA's order: every one
    of the machine's without CUDA_VISIBLE_DEVICES; with it, its indices and UUIDs
    (`GPU-...`, `MIG-...`) up to the first CUDA cannot read (an empty one, `-1`, one
    out of range: CUDA sees no further), as CUDA reads it."""
    import os

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    handles = []
    for entry in (e.strip() for e in visible.split(",")):
        try:
            if entry.isdigit():
                if int(entry) >= nvml.nvmlDeviceGetCount():
                    break
                handles.append(nvml.nvmlDeviceGetHandleByIndex(int(entry)))
            elif entry.startswith(("GPU-", "MIG-")):
                handles.append(nvml.nvmlDeviceGetHandleByUUID(entry))
            else:
                break
        except Exception:  # NVMLError: a UUID not on this machine
            break
    return handles


STATE: web.AppKey[AppState] = web.AppKey("weir_state", AppState)
REQUEST_ID: web.RequestKey[str] = web.RequestKey("weir_request_id", str)
#: What the route learned about the request, for the access log (tenant, model, tokens).
INFO: web.RequestKey[dict[str, Any]] = web.RequestKey("weir_info", dict)
#: The response headers the chain's plugins set for this request (its context's): an
#: error answer carries them too (the rate limiter's `x-ratelimit-*` on a request it
#: charged and something later refused), as an answer does.
RESPONSE_HEADERS: web.RequestKey[dict[str, str]] = web.RequestKey("weir_response_headers",
                                                                  dict)
#: The request was counted as aborted by its client (once per request).
ABORTED: web.RequestKey[bool] = web.RequestKey("weir_aborted", bool)
