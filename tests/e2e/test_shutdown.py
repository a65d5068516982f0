"""Graceful shutdown under load, with the real engine in its own `weir serve`."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.e2e.conftest import KEY_A, MODEL
from tests.e2e.server import WeirProcess, e2e_config
from tests.sse import parse_sse

AUTH = {"Authorization": f"Bearer {KEY_A}"}
DRAIN_S = 3


class StreamClient(threading.Thread):
    """One streaming request; records whether it started and how it ended."""

    def __init__(self, url: str, max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.url, self.max_tokens = url, max_tokens
        self.started = threading.Event()
        self.body = ""
        self.error: Exception | None = None

    def run(self) -> None:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "tell me"}],
                "max_tokens": self.max_tokens, "ignore_eos": True, "stream": True}
        try:
            with httpx.stream("POST", f"{self.url}/v1/chat/completions", json=body,
                              headers=AUTH, timeout=120) as r:
                for text in r.iter_text():
                    self.body += text
                    self.started.set()
        except httpx.HTTPError as e:
            self.error = e
        finally:
            self.started.set()


def assert_cut(clients: list[StreamClient]) -> None:
    """Each stream was cut by the shutdown, and told so in-band before [DONE]."""
    for c in clients:
        events, done = parse_sse(c.body)
        assert done, c.body[-300:]
        assert events[-1]["error"]["code"] == "shutting_down", c.body[-300:]


def assert_exited_cleanly(weir: WeirProcess, children: list[psutil.Process],
                          timeout: float) -> None:
    assert weir.proc is not None
    assert weir.proc.wait(timeout) == 0, weir.tail()
    _, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, f"orphaned engine processes: {alive}"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_graceful_shutdown_under_load(tmp_path: Path, sig: int) -> None:
    weir = WeirProcess(tmp_path, e2e_config(server={"drain_timeout_s": DRAIN_S},
                                            engine={"max_model_len": 4096})).start()
    try:
        children = psutil.Process(weir.pid).children(recursive=True)
        assert children, "the engine core runs in child processes"
        short = [StreamClient(weir.url, 40) for _ in range(8)]
        long = [StreamClient(weir.url, 4000) for _ in range(3)]
        for c in short + long:
            c.start()
        for c in short + long:
            assert c.started.wait(60)
        weir.signal(sig)

        # Readiness turns 503 at once and new work is refused while in-flight work drains.
        deadline = time.monotonic() + 3
        while httpx.get(f"{weir.url}/health/ready").status_code != 503:
            assert time.monotonic() < deadline
        r = httpx.post(f"{weir.url}/v1/chat/completions", headers=AUTH, json={
            "model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2})
        assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"
        assert "Retry-After" in r.headers

        for c in short + long:
            c.join(60)
        for c in short:  # finished inside the drain window: complete, ending in [DONE]
            events, done = parse_sse(c.body)
            assert done, c.body[-300:]
            assert events[-1]["choices"][0]["finish_reason"] == "length"
        assert_cut(long)  # still running at the drain timeout: cut, and told so in-band
        assert_exited_cleanly(weir, children, timeout=60)
        log = weir.log_text()
        assert "drain timeout: aborted in-flight requests" in log
        assert '"count": 3' in log
    finally:
        weir.stop()


@pytest.mark.parametrize("first, second", [(signal.SIGTERM, signal.SIGTERM),
                                           (signal.SIGHUP, signal.SIGINT)],
                         ids=["SIGTERM-SIGTERM", "SIGHUP-SIGINT"])
def test_a_second_signal_cuts_the_drain_and_no_engine_process_outlives_the_server(
        tmp_path: Path, first: int, second: int) -> None:
    """SIGHUP drains as SIGTERM does; a second signal ends the drain at once (the streams
    get their in-band error and [DONE]) but never the engine's shutdown: the default
    handler used to kill the server mid-drain, leaving the engine's processes running
    on their own and the clients without an answer."""
    weir = WeirProcess(tmp_path, e2e_config(server={"drain_timeout_s": 600},
                                            engine={"max_model_len": 4096})).start()
    try:
        children = psutil.Process(weir.pid).children(recursive=True)
        assert children, "the engine core runs in child processes"
        long = [StreamClient(weir.url, 4000) for _ in range(2)]
        for c in long:
            c.start()
        for c in long:
            assert c.started.wait(60)
        weir.signal(first)
        deadline = time.monotonic() + 30
        while httpx.get(f"{weir.url}/health/ready").status_code != 503:
            assert time.monotonic() < deadline
        weir.signal(second)
        for c in long:
            c.join(120)
        assert_cut(long)
        assert_exited_cleanly(weir, children, timeout=120)
        assert "second signal: aborted in-flight requests" in weir.log_text()
    finally:
        weir.stop()
