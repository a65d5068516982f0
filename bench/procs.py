"""Start and stop the servers a benchmark compares (Weir, vLLM's server, LiteLLM's proxy),
and watch their memory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

from bench.redis_server import free_port

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
LITELLM_VENV = ROOT / "bench" / ".peers" / "litellm"


class Server:
    """A server process with a readiness URL; its tree's peak RSS is sampled."""

    def __init__(self, name: str, cmd: list[str], ready_url: str, base_url: str,
                 log: Path, env: dict[str, str] | None = None) -> None:
        self.name, self.cmd, self.ready_url, self.base_url = name, cmd, ready_url, base_url
        self.log_path = log
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.ready_after_s = 0.0
        self.peak_rss = 0
        self._stop_sampling = threading.Event()

    def start(self, timeout: float = 600) -> Server:
        self._log = open(self.log_path, "wb")
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, env=self.env, stdout=self._log,
                                     stderr=subprocess.STDOUT)
        threading.Thread(target=self._sample, daemon=True).start()
        deadline = self.started_at + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited early; see {self.log_path}")
            try:
                if httpx.get(self.ready_url, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} not ready after {timeout}s")
            time.sleep(0.25)
        self.ready_after_s = time.monotonic() - self.started_at
        return self

    def _tree(self) -> list[psutil.Process]:
        """Its process and every descendant (the engine's own processes); none once it
        has ended."""
        if not self.proc or self.proc.poll() is not None:
            return []
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return []

    def _sample(self) -> None:
        while not self._stop_sampling.is_set() and self.proc and self.proc.poll() is None:
            try:
                rss = sum(p.memory_info().rss for p in self._tree())
                self.peak_rss = max(self.peak_rss, rss)
            except psutil.Error:
                pass
            self._stop_sampling.wait(0.5)

    def cpu_seconds(self) -> float:
        """CPU time (user + system) its process tree has used so far; 0 once it is gone."""
        total = 0.0
        for p in self._tree():
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass  # a child that ended between the listing and the read
        return total

    def stop(self) -> None:
        self._stop_sampling.set()
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if hasattr(self, "_log"):
            self._log.close()


def weir_server(tmp: Path, engine: dict[str, Any], plugins: list[dict[str, Any]] | None = None,
                name: str = "weir", extra: dict[str, Any] | None = None) -> Server:
    port = free_port()
    cfg: dict[str, Any] = {
        "server": {"host": "127.0.0.1", "port": port},
        "engine": {"kind": "vllm", **engine},
        "auth": {"mode": "open"},
        "logging": {"level": "warning", "access_log": False},
        "plugins": plugins or [],
        **(extra or {}),
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return Server(name, [sys.executable, "-m", "proxy", "serve", "--config", str(path)],
                  f"http://127.0.0.1:{port}/health/ready", f"http://127.0.0.1:{port}",
                  tmp / f"{name}.log")


def _cuda() -> bool:
    import torch  # (vLLM's dependency: installed wherever its server runs)

    return bool(torch.cuda.is_available())


def vllm_server(tmp: Path, engine: dict[str, Any], model_path: str,
                name: str = "vllm") -> Server:
    """vLLM's own OpenAI server with the same model and engine settings as Weir's.

    Every engine setting is passed as vLLM's flag of the same name (Weir's engine settings
    use vLLM's names), so a GPU model's settings reach both systems alike.
    """
    port = free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path]
    settings = {**engine, **engine.get("extra_args", {})}
    for key, value in settings.items():
        if key in ("model", "kind", "extra_args", "warmup", "owned_by", "faults",
                   "structured_output_compact") or value is None:
            continue
        if key == "cpu_kvcache_space_gib":  # as Weir's engine passes it: CPU builds only
            if _cuda():  # (a GPU's cache is sized by gpu_memory_utilization, in both)
                continue
            key, value = "kv_cache_memory_bytes", int(value * 2**30)
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            cmd.append(flag if value else f"--no-{key.replace('_', '-')}")
        else:
            cmd += [flag, str(value)]
    cmd += ["--host", "127.0.0.1", "--port", str(port)]
    return Server(name, cmd, f"http://127.0.0.1:{port}/health", f"http://127.0.0.1:{port}",
                  tmp / f"{name}.log")


def ensure_litellm() -> Path:
    """LiteLLM's proxy in a venv of its own (its pins would fight Weir's)."""
    exe = LITELLM_VENV / "bin" / "litellm"
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", str(LITELLM_VENV)], check=True)
        pip = [str(LITELLM_VENV / "bin" / "python"), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, "--upgrade", "pip"], check=True)
        subprocess.run([*pip, "litellm[proxy]", "redis"], check=True)
    return exe


def litellm_server(tmp: Path, upstream: str, model: str, redis_port: int,
                   master_key: str) -> Server:
    """LiteLLM's proxy with its Redis cache in front of `upstream` (an OpenAI server)."""
    port = free_port()
    cfg = {
        "model_list": [{"model_name": model, "litellm_params": {
            "model": f"openai/{model}", "api_base": f"{upstream}/v1", "api_key": "none"}}],
        "litellm_settings": {"cache": True, "cache_params": {
            "type": "redis", "host": "127.0.0.1", "port": redis_port,
            "namespace": f"litellm-{uuid.uuid4().hex[:6]}"}, "set_verbose": False},
        "general_settings": {"master_key": master_key},
    }
    path = tmp / "litellm.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {"LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False", "NO_DOCS": "True"}
    return Server("litellm", [str(ensure_litellm()), "--config", str(path), "--host",
                              "127.0.0.1", "--port", str(port), "--num_workers", "1"],
                  f"http://127.0.0.1:{port}/health/liveliness", f"http://127.0.0.1:{port}",
                  tmp / "litellm.log", env=env)
