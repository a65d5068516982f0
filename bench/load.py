"""Load generators: closed loop (C workers send N requests in total) and open loop
(arrivals at a rate, not waiting for answers).

Every request is timed from send to first content byte (TTFT) and to the end (E2E); the
output token count comes from the server's own usage report.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp


@dataclass
class Sample:
    ok: bool
    status: int
    ttft: float | None
    e2e: float
    tokens: int
    cache: str | None = None


@dataclass
class RunResult:
    samples: list[Sample] = field(default_factory=list)
    wall_s: float = 0.0
    unsent: int = 0  # open loop: arrivals not sent, the system having fallen behind

    def ok(self) -> list[Sample]:
        return [s for s in self.samples if s.ok]


def merge(results: list[RunResult]) -> RunResult:
    out = RunResult()
    for r in results:
        out.samples += r.samples
        out.wall_s += r.wall_s
    return out


def pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    vs = sorted(values)
    k = (len(vs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(vs) - 1)
    return vs[lo] + (vs[hi] - vs[lo]) * (k - lo)


def summarize(r: RunResult) -> dict[str, Any]:
    ok = r.ok()
    e2e = [s.e2e for s in ok]
    ttft = [s.ttft for s in ok if s.ttft is not None]
    toks = sum(s.tokens for s in ok)
    ms = 1000.0
    return {
        "requests": len(r.samples),
        "ok": len(ok),
        "errors": len(r.samples) - len(ok),
        "wall_s": round(r.wall_s, 3),
        "req_per_s": round(len(ok) / r.wall_s, 3) if r.wall_s else None,
        "output_tok_per_s": round(toks / r.wall_s, 1) if r.wall_s else None,
        "e2e_mean_ms": round(statistics.fmean(e2e) * ms, 2) if e2e else None,
        "e2e_p50_ms": round(pct(e2e, 50) * ms, 2) if e2e else None,  # type: ignore[operator]
        "e2e_p99_ms": round(pct(e2e, 99) * ms, 2) if e2e else None,  # type: ignore[operator]
        "ttft_p50_ms": round(pct(ttft, 50) * ms, 2) if ttft else None,  # type: ignore[operator]
        "ttft_p99_ms": round(pct(ttft, 99) * ms, 2) if ttft else None,  # type: ignore[operator]
    }


class SseTally:
    """What a client needs from a chat stream: when its first content came, and the output
    token count of its usage chunk. Only the events that can say either are decoded: a
    32-token stream costs the client ~70 us here against ~180 us when every chunk was
    decoded (on the cores the servers share; a small share, but it grows with the rate
    of the faster server)."""

    def __init__(self) -> None:
        self.buf = b""
        self.content = False
        self.tokens = 0

    def feed(self, chunk: bytes) -> bool:
        """Take bytes off the wire; True if they held the first content."""
        self.buf += chunk
        first = False
        while b"\n\n" in self.buf:
            event, self.buf = self.buf.split(b"\n\n", 1)
            if not event.startswith(b"data: ") or event == b"data: [DONE]":
                continue
            if not self.content and (b'"content"' in event or b'"text"' in event):
                data = json.loads(event[6:])
                if any((c.get("delta") or {}).get("content") or c.get("text")
                       for c in data.get("choices", [])):
                    self.content = first = True
            if b'"completion_tokens"' in event:
                usage = json.loads(event[6:]).get("usage")
                if usage:
                    self.tokens = usage.get("completion_tokens", 0)
        return first


async def one_request(session: aiohttp.ClientSession, url: str, body: dict[str, Any],
                      headers: dict[str, str] | None = None) -> Sample:
    start = time.perf_counter()
    ttft = None
    tokens = 0
    try:
        async with session.post(url, json=body, headers=headers) as resp:
            cache = resp.headers.get("x-weir-cache")
            if resp.status != 200:
                await resp.read()
                return Sample(False, resp.status, None, time.perf_counter() - start, 0, cache)
            if not body.get("stream"):
                data = await resp.json()
                ttft = time.perf_counter() - start
                tokens = (data.get("usage") or {}).get("completion_tokens", 0)
                return Sample(True, 200, ttft, ttft, tokens, cache)
            tally = SseTally()
            async for chunk in resp.content.iter_any():
                if tally.feed(chunk) and ttft is None:
                    ttft = time.perf_counter() - start
            tokens = tally.tokens
            return Sample(True, 200, ttft, time.perf_counter() - start, tokens, cache)
    except (TimeoutError, aiohttp.ClientError):
        return Sample(False, 0, None, time.perf_counter() - start, 0)


async def run_load(url: str, bodies: list[dict[str, Any]], concurrency: int,
                   headers: dict[str, str] | None = None, timeout_s: float = 600) -> RunResult:
    result = RunResult()
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    for b in bodies:
        queue.put_nowait(b)
    conn = aiohttp.TCPConnector(limit=concurrency * 2)
    async with aiohttp.ClientSession(connector=conn,
                                     timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:

        async def worker() -> None:
            while not queue.empty():
                body = queue.get_nowait()
                result.samples.append(await one_request(session, url, body, headers))

        start = time.perf_counter()
        async with asyncio.timeout(timeout_s):
            await asyncio.gather(*(worker() for _ in range(concurrency)))
        result.wall_s = time.perf_counter() - start
    return result


async def run_load_lean(url: str, bodies: list[dict[str, Any]], concurrency: int,
                        headers: dict[str, str] | None = None,
                        timeout_s: float = 600) -> RunResult:
    """Closed loop like `run_load`, for whole (not streamed) answers, with a lean client:
    one keep-alive HTTP/1.1 connection per worker, the requests serialised before the
    clock starts, a response read by its Content-Length and not parsed. It is for
    measuring how many requests a server carries, as wrk or oha would: on one core it
    uses about a fifth of the CPU an aiohttp client does for the same requests (measured
    at ~4,800 exact hits/s: 17-19% against 65-72%), so a faster server does not end up
    measuring its client. Output tokens are not counted."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    head = (f"POST {parts.path or '/'} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            "Content-Type: application/json\r\n"
            + "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items()))
    requests = []
    for b in bodies:
        data = json.dumps(b).encode()
        requests.append(f"{head}Content-Length: {len(data)}\r\n\r\n".encode() + data)
    requests.reverse()
    result = RunResult()

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                  req: bytes) -> tuple[Sample, bool]:
        """One request on an open connection: its sample, and whether the connection
        stays usable."""
        start = time.perf_counter()
        writer.write(req)
        raw = await reader.readuntil(b"\r\n\r\n")
        status = int(raw[9:12])
        length, cache, keep = None, None, True
        for line in raw.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"x-weir-cache":
                cache = value.strip().decode()
            elif name == b"connection" and value.strip().lower() == b"close":
                keep = False
        if length is None:  # chunked or unframed: not what this client is for
            raise ValueError("run_load_lean reads Content-Length bodies only")
        await reader.readexactly(length)
        e2e = time.perf_counter() - start
        return Sample(status == 200, status, e2e, e2e, 0, cache), keep

    async def worker() -> None:
        conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        try:
            while requests:
                req = requests.pop()
                start = time.perf_counter()
                try:
                    if conn is None:
                        conn = await asyncio.open_connection(host, port)
                    sample, keep = await one(*conn, req)
                except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                    sample, keep = Sample(False, 0, None, time.perf_counter() - start, 0), False
                result.samples.append(sample)
                if not keep and conn is not None:  # the server closed it, or it broke
                    conn[1].close()
                    conn = None
        finally:
            if conn is not None:
                conn[1].close()

    start = time.perf_counter()
    async with asyncio.timeout(timeout_s):
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    result.wall_s = time.perf_counter() - start
    return result


async def open_loop(url: str, bodies: list[dict[str, Any]], rate: float,
                    headers: dict[str, str] | None = None, seed: int | None = None,
                    max_in_flight: int | None = None, drain_s: float = 120) -> RunResult:
    """Open loop: one body per arrival at `rate` per second, never waiting for answers
    (as real traffic does not). Arrivals are evenly spaced, or Poisson when `seed` is
    given. Past `max_in_flight` unanswered requests the system is not keeping up: no
    more are sent (`unsent` counts them). Requests still open `drain_s` after the last
    arrival are cancelled and count as failures.
    """
    rng = random.Random(seed)
    result = RunResult()
    conn = aiohttp.TCPConnector(limit=0)
    in_flight = 0

    def answered(_: object) -> None:
        nonlocal in_flight
        in_flight -= 1

    async with aiohttp.ClientSession(connector=conn,
                                     timeout=aiohttp.ClientTimeout(total=600)) as session:
        tasks = []
        start = time.perf_counter()
        due = 0.0
        for i, body in enumerate(bodies):
            if max_in_flight is not None and in_flight > max_in_flight:
                result.unsent = len(bodies) - i
                break
            now = time.perf_counter() - start
            if due > now:
                await asyncio.sleep(due - now)  # pacing the arrivals, not a sync point
            in_flight += 1
            task = asyncio.create_task(one_request(session, url, body, headers))
            task.add_done_callback(answered)
            tasks.append(task)
            due += rng.expovariate(rate) if seed is not None else 1 / rate
        done, pending = await asyncio.wait(tasks, timeout=drain_s) if tasks else (set(), set())
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        result.samples = [t.result() for t in tasks if t in done]
        result.samples += [Sample(False, 0, None, drain_s, 0) for _ in pending]
        result.wall_s = time.perf_counter() - start
    return result
