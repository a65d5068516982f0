"""Faults with real processes: `weir serve` on the real engine (with the fault-injecting
wrapper) under a steady load, while the engine hangs, errors and recovers and the Redis
behind the rate limiter is stopped and restarted. Every request must get a valid answer
or a clean OpenAI error (never a 500), none may outlive its deadline by much, nothing
sent may go unanswered, and the breaker must open and close again."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.redis_server import RedisServer
from tests.e2e.conftest import MODEL
from tests.e2e.server import WeirProcess, e2e_config
from tests.metrics import metric
from tests.openai_spec import validate

USER, ADMIN = "sk-chaos-user", "sk-chaos-admin"
DEADLINE_MS = 1500


@pytest.fixture(scope="module")
def chaos(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[WeirProcess, RedisServer]]:
    tmp = tmp_path_factory.mktemp("chaos")
    redis = RedisServer(tmp).start()
    cfg = e2e_config(
        engine={"faults": True},
        auth={"mode": "keys", "keys": [{"key": USER, "tenant": "t"},
                                       {"key": ADMIN, "tenant": "t", "role": "admin",
                                        "operator": True}]},
        plugins=[
            {"name": "rate_limit", "config": {
                "store": "redis", "redis": {"url": redis.url, "timeout_s": 0.2},
                "rules": [{"per": "tenant", "rpm": 100000, "concurrent": 64}]}},
            # A request cut by its own deadline is not an engine failure; one that waited
            # past slow_call_s for its first token is a slow call: a hung engine opens
            # the breaker through the slow-call rate.
            {"name": "breaker", "config": {
                "minimum_calls": 4, "failure_rate": 0.5, "open_s": 3, "half_open_calls": 1,
                "slow_call_s": 1.0, "slow_call_rate": 0.5,
                "fallback": [{"kind": "static", "content": "degraded"}]}},
            {"name": "admission", "config": {"max_concurrent": 16, "max_queue": 32,
                                             "deadline_s": 30}},
        ])
    proc = WeirProcess(tmp, cfg).start()
    yield proc, redis
    proc.stop()
    redis.stop()


class Load(threading.Thread):
    """Requests one after another until stopped (bounded in count), every one recorded."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.stop = threading.Event()
        self.sent = 0
        self.results: list[tuple[int, dict[str, Any], dict[str, str], float]] = []
        self.failures: list[str] = []

    def run(self) -> None:
        with httpx.Client(timeout=30) as c:
            for i in range(3000):
                if self.stop.is_set():
                    return
                self.sent += 1
                start = time.monotonic()
                try:
                    r = c.post(f"{self.url}/v1/chat/completions", json={
                        "model": MODEL, "max_tokens": 8, "temperature": 0.7,
                        "stream": i % 3 == 0,
                        "messages": [{"role": "user", "content": f"chaos {i}"}]},
                        headers={"Authorization": f"Bearer {USER}",
                                 "x-weir-timeout-ms": str(DEADLINE_MS)})
                except httpx.HTTPError as e:
                    self.failures.append(repr(e))
                    continue
                body: dict[str, Any] = {}
                if r.headers.get("content-type", "").startswith("application/json"):
                    body = r.json()
                elif r.status_code == 200:
                    assert r.text.rstrip().endswith("data: [DONE]") or '"error"' in r.text
                    body = {"stream": r.text}
                self.results.append((r.status_code, body, dict(r.headers),
                                     time.monotonic() - start))


def state(weir: WeirProcess) -> str:
    s: str = httpx.get(f"{weir.url}/health/ready").json()["plugins"]["breaker"]["state"]
    return s


def until(cond: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)  # polling another process's state


def fault(weir: WeirProcess, mode: str) -> None:
    r = httpx.post(f"{weir.url}/admin/faults", json={"mode": mode},
                   headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 200


def test_faults_and_recovery_under_load(chaos: tuple[WeirProcess, RedisServer],
                                        tmp_path: Path) -> None:
    weir, redis = chaos
    r = httpx.post(f"{weir.url}/admin/faults", json={"mode": "error"},
                   headers={"Authorization": f"Bearer {USER}"})
    assert r.status_code == 403
    load = Load(weir.url)
    load.start()
    try:
        until(lambda: len(load.results) >= 10, 60)  # healthy traffic first
        fault(weir, "hang")  # the engine stops answering: deadlines cut the requests
        until(lambda: state(weir) == "open", 30)
        fault(weir, "error")  # and then fails outright
        redis.stop()  # Redis goes away mid-load: the rate limiter fails open
        n = len(load.results)
        until(lambda: len(load.results) >= n + 10, 30)
        redis = RedisServer(tmp_path, port=redis.port).start()
        fault(weir, "ok")  # the engine recovers: the half-open trial closes the breaker
        until(lambda: state(weir) == "closed", 30)
        n = len(load.results)
        until(lambda: len(load.results) >= n + 10, 60)
    finally:
        load.stop.set()
        load.join(60)
        redis.stop()
    assert not load.failures, load.failures[:3]  # every request sent got an answer
    assert len(load.results) == load.sent
    statuses = {s for s, _, _, _ in load.results}
    assert 500 not in statuses and statuses <= {200, 503, 504}, statuses
    for status, body, _headers, elapsed in load.results:
        assert elapsed < DEADLINE_MS / 1000 + 3, (status, elapsed)
        if status != 200:
            validate("ErrorResponse", body)
        elif "choices" in body:
            validate("CreateChatCompletionResponse", body)
    fell_back = [h for s, _, h, _ in load.results if h.get("x-weir-fallback") == "static"]
    # A hung engine: the deadline cuts the request (aborting its generation) and, the
    # breaker being outside admission, the cut is answered by the fallback or as a 504.
    cut = [(s, h) for s, _, h, e in load.results if e >= 0.9 * DEADLINE_MS / 1000]
    real = [b for s, b, h, _ in load.results if s == 200 and "x-weir-fallback" not in h]
    assert fell_back and cut and real
    assert all(s == 504 or h.get("x-weir-fallback") == "static" for s, h in cut)
    assert real[-1] and load.results[-1][0] == 200  # served normally at the end
    metrics = httpx.get(f"{weir.url}/metrics").text
    assert metric(metrics, "weir_breaker_transitions_total", from_state="closed",
                  to_state="open") >= 1
    assert metric(metrics, "weir_breaker_transitions_total", from_state="half_open",
                  to_state="closed") >= 1
    # Redis was down while requests came: the limiter's store calls failed (and it fell
    # back to its local limiter, as every request above was answered).
    assert metric(metrics, "weir_rate_limit_store_errors_total") > 0
