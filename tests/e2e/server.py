"""Start `weir serve` as a real process and wait until it is ready."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.conftest import lookup_first

ROOT = Path(__file__).resolve().parents[2]
LISTEN = re.compile(r"weir: listening on (http://[\w.:\[\]-]+)\n")  # the whole line


def e2e_config(**overrides: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "server": {"host": "127.0.0.1", "port": 0, "drain_timeout_s": 20,
                   "write_timeout_s": 3, "keepalive_s": 5},
        "engine": {"model": "builtin:demo", "served_model_name": "weir-demo",
                   "dtype": "float32", "max_model_len": 1024, "max_num_seqs": 32,
                   # a fraction of a GiB: vLLM's own variable took whole GiB only
                   "cpu_kvcache_space_gib": 0.75, "seed": 0},
        "auth": {"mode": "keys", "keys": [
            {"key": "sk-test-tenant-a", "tenant": "a", "role": "user"},
            {"key": "sk-test-tenant-b", "tenant": "b", "role": "user", "models": ["other"]},
        ]},
        "logging": {"level": "info", "format": "json"},
        "observability": {"health_details": "open"},  # the tests read the engine's counts
        "plugins": [],
    }
    for k, v in overrides.items():
        cfg[k] = {**cfg.get(k, {}), **v} if isinstance(v, dict) else v
    # A paraphrase's lookup (an embedding on a CPU the engine shares) is waited for, and
    # not given up after 100 ms: on a loaded machine the miss won the race, or the
    # lookup timed out, and a test that asked for a semantic hit got a miss at random.
    cfg["plugins"] = [lookup_first(p) for p in cfg["plugins"]]
    return cfg


class WeirProcess:
    def __init__(self, tmp: Path, config: dict[str, Any]) -> None:
        self.config_path = tmp / "weir.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = tmp / "weir.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self, timeout: float = 300) -> WeirProcess:
        try:
            return self._start(timeout)
        except BaseException:
            self.stop(timeout=30)
            raise

    def _start(self, timeout: float) -> WeirProcess:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "proxy", "serve", "--config", str(self.config_path)],
            cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while not self.url:
            self._check_alive()
            if m := LISTEN.search(self.log_path.read_text(errors="replace")):
                self.url = m.group(1)
            elif time.monotonic() > deadline:
                raise TimeoutError("weir did not start listening")
            else:
                time.sleep(0.2)
        while True:
            self._check_alive()
            try:
                if httpx.get(f"{self.url}/health/ready", timeout=5).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("weir did not become ready:\n" + self.tail())
            time.sleep(0.5)

    def _check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"weir exited with {self.proc.returncode}:\n{self.tail()}")

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 60) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
        return self.proc.returncode


#: Every SDK client the e2e tests made, closed at the end of the session (an unclosed
#: client's pool is a ResourceWarning when collected, which pytest turns into a failure).
CLIENTS: list[Any] = []


def sdk(url: str, key: str, **kw: Any) -> Any:
    """An OpenAI SDK client for `url` (a Weir base URL), closed at the session's end."""
    import openai

    opts: dict[str, Any] = {"max_retries": 0, "timeout": 120, **kw}
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, **opts)
    CLIENTS.append(client)
    return client


def async_sdk(url: str, key: str, **kw: Any) -> Any:
    import openai

    opts: dict[str, Any] = {"max_retries": 0, "timeout": 120, **kw}
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, **opts)
    CLIENTS.append(client)
    return client

