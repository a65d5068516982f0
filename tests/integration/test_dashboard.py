"""/dashboard in headless Chromium: the page reads /metrics and shows live numbers."""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from proxy.app import create_app
from tests.conftest import make_settings
from tests.fakes import FakeEngine
from tests.threaded_server import serve_in_thread

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed "
                                "(make test installs it where it can: apt-get install chromium)")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars"]


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    settings = make_settings(plugins=[{"name": "cache", "config": {
        "semantic": {"enabled": False}, "store_truncated": True}}, {"name": "breaker"}])
    with serve_in_thread(lambda: create_app(settings, engine=FakeEngine(delay=0.002))) as url:
        yield url


class Traffic(threading.Thread):
    """Requests (half of them repeats, so the cache hits) until told to stop."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.stop = url, threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=10) as c:
            for i in range(5000):  # bounded in count; stopped sooner by the test
                if self.stop.is_set():
                    return
                c.post(f"{self.url}/v1/chat/completions", json={
                    "model": "fake-model", "temperature": 0, "max_tokens": 2,
                    "messages": [{"role": "user", "content": f"q{i % 10}"}]})


def chromium(url: str, tmp: Path, *extra: str) -> subprocess.CompletedProcess[bytes]:
    assert CHROMIUM is not None
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp / 'profile'}", *extra, url],
                          capture_output=True, timeout=90, check=False)


def test_dashboard_shows_live_numbers(server: str, tmp_path: Path) -> None:
    page = httpx.get(f"{server}/dashboard")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    traffic = Traffic(server)
    traffic.start()
    try:
        dom = chromium(f"{server}/dashboard", tmp_path, "--virtual-time-budget=7000",
                       "--dump-dom").stdout.decode()
        shot = tmp_path / "dashboard.png"
        chromium(f"{server}/dashboard", tmp_path, "--virtual-time-budget=7000",
                 "--window-size=1200,700", f"--screenshot={shot}")
    finally:
        traffic.stop.set()
        traffic.join(10)
    assert re.search(r'class="value closed" id="breaker">closed<', dom), dom[-2000:]
    assert 'id="status">live' in dom
    rps = dom.split('id="rps">')[1].split("<")[0]
    assert rps != "-" and float(rps) > 0
    hit = dom.split('id="hit">')[1].split("<")[0]
    assert hit.endswith("%") and int(hit.split()[0]) > 0
    data = shot.read_bytes()
    if keep := __import__("os").environ.get("WEIR_KEEP_SCREENSHOT"):
        Path(keep).write_bytes(data)
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # drawn, not blank
