"""The systems one benchmark run compares: started once, on first use, shared by every suite.

Starting an engine costs about 45 s on these 2-core machines (three Python processes
import torch and vLLM; starting two at once takes as long as one after the other), so a
run starts each server once and every suite measures the same processes. Suites stay
apart by API key: each suite is its own tenant in Weir (its own cache scope and vLLM
prefix-cache salt) and its own cache namespace in LiteLLM, and the prompts of each suite
are its own, so vLLM's prefix cache carries nothing from one suite to the next.

Roles:
- `vllm`           vLLM's own OpenAI server (the engine settings below; LiteLLM's upstream)
- `one-at-a-time`  the engine serving one request at a time: vLLM's server with
                   `max_num_seqs: 1`; with `--quick`, vLLM's server behind a Weir whose
                   admission lets one request in at a time (no second engine start)
- `weir`           Weir with every plugin on: sanitizer, rate limit, cache (L1, semantic,
                   Redis L2), breaker, admission; the in-process engine
- `weir-exact`     the same without the semantic layer (not in `--quick`)
- `weir-l2`        Weir with only the Redis layer of the cache, in front of `vllm`
- `litellm`        LiteLLM's proxy with its Redis cache, in front of `vllm`

The servers share the machine's cores, so a suite calls `quiet()` before each measured
window: work one system leaves running after its window (Weir embedding the questions it
deferred once idle, an engine finishing what a client gave up on) must not land in the
next system's window.
"""

from __future__ import annotations

import copy
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench import SUITES
from bench.procs import ROOT, Server, litellm_server, vllm_server, weir_server
from bench.redis_server import RedisServer
from proxy.engine import builtin_models

# The embedded default's engine. `python -m bench --model ID --engine KEY=VALUE` builds a
# fleet with other settings (a GPU model id, dtype, gpu_memory_utilization ...).
DEFAULT_ENGINE: dict[str, Any] = {
    "model": "builtin:demo", "served_model_name": "weir-demo", "dtype": "float32",
    "max_model_len": 2048, "max_num_seqs": 64, "seed": 0, "enable_prefix_caching": True,
    "cpu_kvcache_space_gib": 1}
# CPU settings of the built-in models beyond the demo's (config/weir.yaml's for SmolLM2).
BUILTIN_ENGINES: dict[str, dict[str, Any]] = {
    "builtin:smollm2": {"dtype": "float32", "extra_args": {"enforce_eager": True}},
}

LITELLM_KEY = "sk-bench-master-0123456789abcdef"
# Admission in the benchmarked Weir: the engine's batch, a short queue, a short wait; a
# surge is shed in milliseconds instead of queueing for seconds.
ADMISSION = {"max_concurrent": 64, "max_queue": 16, "max_queue_wait_s": 0.25,
             "deadline_s": 300}


def default_plugins(store_truncated: bool = False) -> list[dict[str, Any]]:
    """config/weir.yaml's chain as shipped, but for limits a benchmark would trip (and,
    for answers that always run to max_tokens, `store_truncated`: repeats of them could
    never hit otherwise)."""
    plugins = yaml.safe_load((ROOT / "config" / "weir.yaml").read_text())["plugins"]
    for p in plugins:
        if p["name"] == "rate_limit":
            # The limiter does its full work per request; the limits are set above what
            # the benchmark offers, so it never refuses.
            p["config"]["rules"] = [{"per": "key", "rpm": 10_000_000, "tpm": 10**10,
                                     "concurrent": 1024}]
        elif p["name"] == "cache" and store_truncated:
            p["config"]["store_truncated"] = True
    return list(plugins)


def engine_for(model: str, served_name: str | None = None,
               base: dict[str, Any] | None = None) -> dict[str, Any]:
    """The engine settings that serve `model` in every system: a built-in one
    (`builtin:smollm2`: the CPU settings of the embedded default; vLLM's server gets the
    converted folder) or any id or path (the demo's CPU settings do not carry over)."""
    engine = copy.deepcopy(base if base is not None else DEFAULT_ENGINE)
    engine["model"] = model
    engine["served_model_name"] = served_name or builtin_models.served_name(model)
    if model in builtin_models.BUILTINS:
        engine.update(copy.deepcopy(BUILTIN_ENGINES.get(model, {})))
    else:
        engine.pop("dtype", None)
        engine.pop("cpu_kvcache_space_gib", None)
    return engine


def weir_key(suite: str) -> str:
    return f"sk-bench-{suite}-0123456789abcdef"


@dataclass
class System:
    """One system under test: where it listens and how a suite's requests reach it."""

    label: str
    kind: str  # weir | vllm | litellm
    server: Server
    notes: str = ""

    @property
    def chat_url(self) -> str:
        return f"{self.server.base_url}/v1/chat/completions"

    def headers(self, suite: str, extra: dict[str, str] | None = None) -> dict[str, str]:
        key = LITELLM_KEY if self.kind == "litellm" else weir_key(suite)
        return {"Authorization": f"Bearer {key}", **(extra or {})}

    def bodies(self, bodies: list[dict[str, Any]], suite: str) -> list[dict[str, Any]]:
        if self.kind != "litellm":
            return bodies
        # LiteLLM's per-request cache namespace keeps one suite's entries from the next.
        return [{**b, "cache": {"namespace": f"bench-{suite}"}} for b in bodies]


@dataclass
class Fleet:
    quick: bool = False
    engine: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_ENGINE))
    systems: dict[str, System] = field(default_factory=dict)
    # Weir stores answers cut at max_tokens: the suites' ignore_eos answers always are.
    # False (as shipped) for a model's own answer lengths (bench/real_model.py).
    store_truncated: bool = True

    @property
    def served(self) -> str:
        """The model name clients send."""
        return str(self.engine.get("served_model_name") or self.engine["model"])

    def __post_init__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="weir-bench-")
        self.tmp = Path(self._tmp.name)
        self._redis: RedisServer | None = None
        self.started: list[Server] = []
        self.retired: list[Server] = []  # started, then stopped by retire()
        self.quiet_waits: list[float] = []  # seconds each quiet() waited

    def quiet(self, timeout_s: float = 30.0, interval_s: float = 0.25,
              share: float = 0.05) -> float:
        """Wait until every running server is idle: their process trees together used
        under `share` of one core over `interval_s`. Returns the seconds waited (at most
        `timeout_s`: a server busy for good cannot hold a run up)."""
        start = time.monotonic()
        before = sum(s.cpu_seconds() for s in self.started)
        while time.monotonic() - start < timeout_s:
            time.sleep(interval_s)
            now = sum(s.cpu_seconds() for s in self.started)
            if now - before < share * interval_s:
                break
            before = now
        waited = time.monotonic() - start
        self.quiet_waits.append(waited)
        return waited

    def quiet_summary(self) -> dict[str, Any]:
        w = self.quiet_waits
        return {"waits": len(w), "total_s": round(sum(w), 1),
                "max_s": round(max(w, default=0.0), 2)}

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for s in reversed(self.started):
            s.stop()
        self.started.clear()
        self.systems.clear()
        if self._redis is not None:
            self._redis.stop()
            self._redis = None
        self._tmp.cleanup()

    def retire(self) -> None:
        """Stop the servers started so far, for a suite that needs the memory and cores
        (their records stay in `retired`); a later `get` starts a role again."""
        running = list(self.started)
        self.close()
        self.retired += running
        self._tmp = tempfile.TemporaryDirectory(prefix="weir-bench-")
        self.tmp = Path(self._tmp.name)

    # ------------------------------------------------------------------ pieces

    @property
    def redis(self) -> RedisServer:
        if self._redis is None:
            self._redis = RedisServer(self.tmp).start()
        return self._redis

    def model_path(self) -> str:
        """What vLLM's server loads: built-in models are built (or reused) first."""
        return builtin_models.resolve(str(self.engine["model"]))

    def _start(self, system: System) -> System:
        self.started.append(system.server)
        system.server.start()
        return system

    @staticmethod
    def weir_auth() -> dict[str, Any]:
        return {"mode": "keys", "keys": [{"key": weir_key(s), "tenant": s, "user": s}
                                         for s in SUITES]}

    def weir_plugins(self, semantic: bool = True) -> list[dict[str, Any]]:
        """The embedded default's chain (`default_plugins`), with Redis L2 on and the
        bench's own admission."""
        out = default_plugins(self.store_truncated)
        for p in out:
            cfg = p.setdefault("config", {})
            if p["name"] == "cache":
                cfg["l2"] = {"enabled": True}
                cfg["redis"] = {"url": self.redis.url, "timeout_s": 0.1,
                                "key_prefix": f"weir:{'all' if semantic else 'exact'}:"}
                cfg["semantic"] = {**cfg.get("semantic", {}), "enabled": semantic}
            elif p["name"] == "admission":
                cfg.update(ADMISSION)
        return out

    # ------------------------------------------------------------------ systems

    def get(self, role: str) -> System | None:
        """The system playing `role`, started on first use; None if this run has none."""
        if role not in self.systems:
            system = self._make(role)
            if system is None:
                return None
            self.systems[role] = self._start(system)
        return self.systems[role]

    def need(self, role: str) -> System:
        s = self.get(role)
        assert s is not None, role
        return s

    def _make(self, role: str) -> System | None:
        engine = dict(self.engine)
        if role == "vllm":
            return System("vLLM server", "vllm",
                          vllm_server(self.tmp, engine, self.model_path()))
        if role == "one-at-a-time":
            if not self.quick:
                return System("engine, no batching", "vllm", vllm_server(
                    self.tmp, {**engine, "max_num_seqs": 1}, self.model_path(),
                    name="vllm-1seq"), "vLLM's server with max_num_seqs 1")
            admit_one = [{"name": "admission", "config": {
                "max_concurrent": 1, "max_queue": 1024, "max_queue_wait_s": 600}}]
            return System("engine, no batching", "weir", self._upstream(
                "gate", admit_one), "vLLM's server behind a one-at-a-time admission gate")
        if role == "weir":
            return System("Weir, all plugins", "weir", weir_server(
                self.tmp, engine, self.weir_plugins(), name="weir-all",
                extra={"auth": self.weir_auth(), "embeddings": {"enabled": True}}))
        if role == "weir-bare":
            return System("Weir, no plugins", "weir", weir_server(
                self.tmp, engine, [], name="weir-bare",
                extra={"auth": self.weir_auth(), "embeddings": {"enabled": False}}))
        if role == "weir-default":
            return System("Weir, config/weir.yaml", "weir", weir_server(
                self.tmp, engine, default_plugins(self.store_truncated), name="weir-default",
                extra={"auth": self.weir_auth(), "embeddings": {"enabled": True}}))
        if role == "weir-exact":
            if self.quick:
                return None
            return System("Weir, all plugins, exact cache only", "weir", weir_server(
                self.tmp, engine, self.weir_plugins(semantic=False), name="weir-exact",
                extra={"auth": self.weir_auth(), "embeddings": {"enabled": False}}))
        if role == "weir-l2":
            l2_only = [{"name": "cache", "config": {
                "exact": {"enabled": False}, "semantic": {"enabled": False},
                "l2": {"enabled": True}, "store_truncated": True,
                "redis": {"url": self.redis.url, "timeout_s": 0.1,
                          "key_prefix": "weir:l2only:"}}}]
            return System("Weir, Redis cache only", "weir", self._upstream("weir-l2", l2_only))
        if role == "litellm":
            return System("LiteLLM + Redis cache", "litellm", litellm_server(
                self.tmp, self.need("vllm").server.base_url, self.served, self.redis.port,
                LITELLM_KEY))
        raise KeyError(role)

    def _upstream(self, name: str, plugins: list[dict[str, Any]]) -> Server:
        """A Weir with no engine of its own, in front of the `vllm` role's server."""
        vllm = self.need("vllm")
        engine = {"kind": "upstream", "base_url": f"{vllm.server.base_url}/v1",
                  "models": [self.served]}
        return weir_server(self.tmp, engine, plugins, name=name,
                           extra={"auth": self.weir_auth(), "embeddings": {"enabled": False}})
