"""`weir serve` as a process, where no engine is needed to see it: a socket it cannot
listen on, and the processes it leaves behind."""

from __future__ import annotations

import multiprocessing
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from proxy import cli

ROOT = Path(__file__).resolve().parents[2]


def _sleep() -> None:
    time.sleep(600)


@pytest.mark.parametrize("where", ["taken", "bad host", "no host name"])
def test_a_socket_it_cannot_listen_on_is_one_line_and_exit_1(tmp_path: Path,
                                                            where: str) -> None:
    """An address in use or a host that does not resolve was a 20-line traceback."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    host = {"taken": "127.0.0.1", "bad host": "no-such-host.invalid",
            "no host name": "a..b"}[where]
    config = tmp_path / "weir.yaml"
    config.write_text(
        "engine: {kind: upstream, base_url: 'http://127.0.0.1:9/v1', models: [m]}\n"
        f"server: {{host: '{host}', port: {port}}}\nembeddings: {{enabled: false}}\n"
        "auth: {mode: open}\n")
    try:
        done = subprocess.run([sys.executable, "-m", "proxy", "serve", "--config", str(config)],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
    finally:
        taken.close()
    assert done.returncode == 1, done.stderr
    assert f"weir: cannot listen on {host}:{port}" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_processes_it_started_end_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the engine left running is ended before the server exits; a server whose
    engine is still loading exits at once (the loop's close would wait for the load)."""
    child = multiprocessing.get_context("spawn").Process(target=_sleep, daemon=True)
    child.start()
    exits: list[int] = []
    monkeypatch.setattr(os, "_exit", exits.append)
    assert cli._exit(0, engine_loading=False) == 0 and exits == []
    assert not child.is_alive()
    cli._exit(3, engine_loading=True)
    assert exits == [3]


async def test_a_shutdown_the_loop_cannot_run_is_ended_from_a_thread(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The drain's timeouts run on the event loop, which CPU-bound work in the process
    (the engine's output processing for many long streams with logprobs) held for tens
    of seconds: a drain of 6 s ran 54 s, past the orchestrator's grace. The deadline
    runs in a thread of its own, through a loop held the whole time."""
    import threading

    ended = threading.Event()
    codes: list[int] = []

    def exit_now(code: int, grace_s: float = 5.0) -> None:
        codes.append(code)
        ended.set()

    monkeypatch.setattr(cli, "_exit_now", exit_now)
    deadline = cli._shutdown_deadline(0.05)
    assert ended.wait(timeout=30)  # the event loop held all along: nothing on it runs
    ended.clear()
    cli._shutdown_deadline(0.05, 0, "teardown")  # a teardown that hangs keeps its code
    assert ended.wait(timeout=30) and codes == [1, 0]
    kept = cli._shutdown_deadline(0.05)
    kept.cancel()  # a shutdown that ends in time
    ended.clear()
    kept.join()
    assert not ended.is_set() and not deadline.is_alive()
