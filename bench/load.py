"""Load generators: closed loop (C workers send N requests in total) and open loop
(arrivals at a rate, not waiting for answers), both over one lean client (`Client`) and,
as the suites run them (`proxy.loop.run_loop`), on uvloop where it is installed.

Every request is timed from send to first content (TTFT; a whole answer's is its end)
and to the end (E2E); the output token count comes from the server's own usage report.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import statistics
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit


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


_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')


class Client:
    """A lean HTTP/1.1 client for one URL, as wrk or oha would be: keep-alive
    connections reused across requests (an idle one per request in flight at most), the
    bodies serialised before the clock starts, each answer parsed as its bytes arrive by
    a protocol's callback (no coroutine per read), a whole answer only searched for its
    usage, a stream's events fed to an `SseTally`. The load generator shares the cores the
    servers use, and every CPU microsecond it spends is taken from them, more from the
    faster server (it is asked more per second): on the FAQ workload at 120 req/s an
    aiohttp client on asyncio's loop used 1.1-1.6 ms of CPU a request, this one 0.5-0.8
    (bench/results/other_machines/README.md); at ~4,800 exact hits/s on one core, a
    stream-reader version of it used 17-19% of a core, aiohttp's 65-72%."""

    def __init__(self, url: str, headers: dict[str, str] | None = None) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self._head = (f"POST {parts.path or '/'} HTTP/1.1\r\nHost: {self.host}:{self.port}"
                      "\r\nContent-Type: application/json\r\n"
                      + "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items()))
        self._idle: list[_Connection] = []

    def encode(self, body: dict[str, Any]) -> Request:
        data = json.dumps(body).encode()
        return Request(f"{self._head}Content-Length: {len(data)}\r\n\r\n".encode() + data,
                       bool(body.get("stream")))

    async def send(self, req: Request) -> Sample:
        start = time.perf_counter()
        while True:
            conn = self._idle.pop() if self._idle else None
            reused = conn is not None
            try:
                if conn is None:
                    _, conn = await asyncio.get_running_loop().create_connection(
                        _Connection, self.host, self.port)
                sample, keep = await conn.exchange(req, start)
            except _Unanswered:
                _close(conn)
                if reused:
                    continue  # the server closed an idle connection, before or as this was sent
                return Sample(False, 0, None, time.perf_counter() - start, 0)
            except (OSError, _Broken):
                _close(conn)
                return Sample(False, 0, None, time.perf_counter() - start, 0)
            except BaseException:  # cancelled mid-answer: the connection is unusable
                _close(conn)
                raise
            if keep and not conn.lost:
                self._idle.append(conn)
            else:
                _close(conn)
            return sample

    def close(self) -> None:
        while self._idle:
            _close(self._idle.pop())


@dataclass(frozen=True, slots=True)
class Request:
    data: bytes
    stream: bool


class _Unanswered(Exception):
    """The connection ended before any byte of an answer."""


class _Broken(Exception):
    """The connection ended, or the answer was malformed, partway through an answer."""


_MAX_HEAD = 1 << 16


class _Connection(asyncio.Protocol):
    """One keep-alive connection, one request at a time: the answer is parsed as it
    arrives (head; then the body by Content-Length, by chunks, or to the connection's
    end) and `exchange`'s future gets its sample."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self._done: asyncio.Future[tuple[Sample, bool]] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def exchange(self, req: Request, start: float) -> asyncio.Future[tuple[Sample, bool]]:
        if self.lost or self.transport is None or self.transport.is_closing():
            raise _Unanswered  # closed since it went idle: nothing was sent
        self._req, self._start, self._buf = req, start, b""
        self._status: int | None = None
        self._length: int | None = None
        self._chunked = self._trailers = self._answered = False
        self._cache: str | None = None
        self._keep = True
        self._tally = SseTally()
        self._parts: list[bytes] = []
        self._ttft: float | None = None
        self._done = asyncio.get_running_loop().create_future()
        self.transport.write(req.data)
        return self._done

    def data_received(self, data: bytes) -> None:
        if self._done is None or self._done.done():
            return  # nothing asked: not an answer
        self._answered = True
        self._buf += data
        try:
            self._parse()
        except ValueError as e:
            self._fail(_Broken(str(e)))

    def eof_received(self) -> bool:
        self.lost = True
        if self._done is not None and not self._done.done() and self._status is not None \
                and self._length is None and not self._chunked:
            self._take(self._buf)  # the body ran to the connection's end
            self._finish()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._fail(_Broken("connection lost") if self._answered else _Unanswered())

    def _fail(self, exc: Exception) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_exception(exc)
        if self.transport is not None:
            self.transport.close()

    def _parse(self) -> None:
        if self._status is None:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > _MAX_HEAD:
                    raise ValueError("answer head too long")
                return
            self._head(self._buf[:end])
            self._buf = self._buf[end + 4:]
        if self._chunked:
            self._chunks()
        elif self._length is not None and len(self._buf) >= self._length:
            self._take(self._buf[:self._length])
            self._finish()

    def _head(self, raw: bytes) -> None:
        self._status = int(raw[9:12])
        for line in raw.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                self._length = int(value)
            elif name == b"transfer-encoding":
                self._chunked = b"chunked" in value.lower()
            elif name == b"x-weir-cache":
                self._cache = value.strip().decode()
            elif name == b"connection" and value.strip().lower() == b"close":
                self._keep = False
        if self._length is None and not self._chunked:
            self._keep = False  # the body runs to the connection's end

    def _chunks(self) -> None:
        buf = self._buf
        while True:
            if self._trailers:  # after the last chunk: trailers, then a blank line
                if buf.startswith(b"\r\n") or b"\r\n\r\n" in buf:
                    self._finish()
                    return
                break
            eol = buf.find(b"\r\n")
            if eol < 0:
                break
            size = int(buf[:eol].split(b";", 1)[0], 16)
            if not size:
                buf, self._trailers = buf[eol + 2:], True
                continue
            if len(buf) < eol + 4 + size:
                break
            self._take(buf[eol + 2:eol + 2 + size])
            buf = buf[eol + 4 + size:]
        self._buf = buf

    def _take(self, data: bytes) -> None:
        if self._req.stream and self._status == 200:
            if self._tally.feed(data) and self._ttft is None:
                self._ttft = time.perf_counter() - self._start
        else:
            self._parts.append(data)

    def _finish(self) -> None:
        e2e = time.perf_counter() - self._start
        ok = self._status == 200
        if self._req.stream and ok:
            sample = Sample(True, 200, self._ttft, e2e, self._tally.tokens, self._cache)
        else:
            found = _TOKENS.search(b"".join(self._parts)) if ok else None
            sample = Sample(ok, self._status or 0, e2e if ok else None, e2e,
                            int(found.group(1)) if found else 0, self._cache)
        assert self._done is not None
        self._done.set_result((sample, self._keep))


def _close(conn: _Connection | None) -> None:
    if conn is not None and conn.transport is not None:
        conn.transport.close()


async def run_load(url: str, bodies: list[dict[str, Any]], concurrency: int,
                   headers: dict[str, str] | None = None, timeout_s: float = 600) -> RunResult:
    """Closed loop: `concurrency` workers, each sending its next body once its last is
    answered, until every body is sent."""
    client = Client(url, headers)
    requests = [client.encode(b) for b in bodies]
    requests.reverse()
    result = RunResult()

    async def worker() -> None:
        while requests:
            result.samples.append(await client.send(requests.pop()))

    start = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        client.close()
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
    client = Client(url, headers)
    requests = [client.encode(b) for b in bodies]
    in_flight = 0

    def answered(_: object) -> None:
        nonlocal in_flight
        in_flight -= 1

    tasks = []
    start = time.perf_counter()
    due = 0.0
    try:
        for i, req in enumerate(requests):
            if max_in_flight is not None and in_flight > max_in_flight:
                result.unsent = len(requests) - i
                break
            now = time.perf_counter() - start
            if due > now:
                await asyncio.sleep(due - now)  # pacing the arrivals, not a sync point
            in_flight += 1
            task = asyncio.create_task(client.send(req))
            task.add_done_callback(answered)
            tasks.append(task)
            due += rng.expovariate(rate) if seed is not None else 1 / rate
        done, pending = await asyncio.wait(tasks, timeout=drain_s) if tasks else (set(), set())
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    finally:
        client.close()
    result.samples = [t.result() for t in tasks if t in done]
    result.samples += [Sample(False, 0, None, drain_s, 0) for _ in pending]
    result.wall_s = time.perf_counter() - start
    return result
