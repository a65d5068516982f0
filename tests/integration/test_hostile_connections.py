"""Connection limits on a real listening socket (what `weir serve` runs): slowloris heads
and stalled bodies are cut, idle connections closed, a connection cap refuses cleanly,
and aiohttp's parser errors never write a key to the log."""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import re
import socket
import zlib
from collections.abc import AsyncIterator
from typing import Any

import brotli
import pytest
from backports.zstd import compress as zstd_compress

from proxy.app import create_app
from proxy.app_state import STATE
from proxy.listener import Listener, listen
from tests.conftest import make_settings
from tests.fakes import FakeEngine
from tests.openai_spec import validate
from tests.waiting import eventually

KEY = "sk-LEAKCHECK-5c1d0e7f9a2b4c6d"
#: A chat request's head with its key, up to its body's framing fields and its end.
CHAT_POST = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
             + KEY.encode() + b"\r\nContent-Type: application/json\r\n")
WAIT = 10  # bound on any wait for the server; the limits under test are well below it


async def start(access_log: bool = False, engine: FakeEngine | None = None,
                **server: Any) -> Listener:
    settings = make_settings(server={"host": "127.0.0.1", "port": 0, **server},
                             auth={"mode": "keys", "keys": [{"key": KEY}]},
                             logging={"access_log": access_log})
    app = create_app(settings, engine=engine or FakeEngine())
    return await listen(app, settings.server, "127.0.0.1", 0)


@pytest.fixture
async def served(request: pytest.FixtureRequest) -> AsyncIterator[Listener]:
    listener = await start(**getattr(request, "param", {}))
    try:
        yield listener
    finally:
        await listener.close()


def requests_counted(listener: Listener, **labels: str) -> float:
    """`weir_requests_total{labels}` as the listener's app counts it."""
    registry = listener.runner.app[STATE].metrics.registry
    return registry.get_sample_value("weir_requests_total", labels) or 0.0


async def connect(listener: Listener) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", listener.port)


async def response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    async with asyncio.timeout(WAIT):
        status = int((await reader.readline()).split()[1])
        headers = {}
        while (line := await reader.readline()) not in (b"\r\n", b""):
            k, _, v = line.decode().partition(":")
            headers[k.strip().lower()] = v.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers, body


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    async with asyncio.timeout(WAIT):
        try:
            return await reader.read() == b""
        except ConnectionResetError:  # aborted: as closed as it gets
            return True


async def answer_then_close(head: bytes) -> tuple[int, dict[str, str], bytes]:
    """Sends `head` on a connection to a listener of its own: its answer, the connection
    (asserted) closed by the server after it."""
    listener = await start()
    try:
        reader, writer = await connect(listener)
        writer.write(head)
        answer = await response(reader)
        assert await closed_by_server(reader), answer
        writer.close()
    finally:
        await listener.close()
    return answer


def metrics(listener: Listener) -> str:
    return listener.runner.app[STATE].metrics.render().decode()


LIVE = b"GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.mark.parametrize("served", [{"header_timeout_s": 0.3}], indirect=True)
async def test_slowloris_head_is_cut(served: Listener) -> None:
    reader, writer = await connect(served)
    writer.write(b"GET /health/live HTTP/1.1\r\nHost: x\r\n")  # never ends the head
    await writer.drain()
    assert await closed_by_server(reader)
    assert served.guard.head_timeouts == 1
    assert 'weir_connections_closed_total{reason="head_timeout"} 1.0' in metrics(served)
    writer.close()


@pytest.mark.parametrize("served", [{"header_timeout_s": 0.3}], indirect=True)
async def test_idle_time_between_requests_is_not_head_time(served: Listener) -> None:
    reader, writer = await connect(served)
    for _ in range(2):
        writer.write(LIVE)
        assert (await response(reader))[0] == 200
        await asyncio.sleep(0.5)  # the idle gap under test, longer than the head timeout
    assert served.guard.head_timeouts == 0
    writer.close()


@pytest.mark.parametrize("served", [{"body_timeout_s": 0.3}], indirect=True)
async def test_stalled_body_is_a_408(served: Listener) -> None:
    reader, writer = await connect(served)
    writer.write(CHAT_POST + b"Content-Length: 100\r\n\r\n{\"model\"")
    status, headers, body = await response(reader)
    assert status == 408
    assert json.loads(body)["error"]["code"] == "request_timeout"
    # The rest of the body never came: what the client sends next would be read as it,
    # so the answer ends the connection (aiohttp then lingers, reading what comes).
    assert headers.get("connection") == "close"
    writer.close()


_WHOLE = json.dumps({"model": "fake-model", "max_tokens": 2,
                     "messages": [{"role": "user", "content": "hi"}]}).encode()
_ZIPPED = gzip.compress(_WHOLE)


def _chunks(body: bytes, end: bool) -> bytes:
    return b"%x\r\n%s\r\n" % (len(body), body) + (b"0\r\n\r\n" if end else b"")


_BODIES = {  # name: (head fields, the whole body as sent)
    "chunked": (b"Transfer-Encoding: chunked\r\n", _chunks(_WHOLE, True)),
    "gzip": (b"Content-Encoding: gzip\r\nContent-Length: %d\r\n" % len(_ZIPPED), _ZIPPED),
    "gzip-chunked": (b"Content-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n",
                     _chunks(_ZIPPED, True)),
}


@pytest.mark.parametrize("served", [{"body_timeout_s": 0.3}], indirect=True)
@pytest.mark.parametrize("kind", sorted(_BODIES))
@pytest.mark.parametrize("whole", [True, False])
async def test_a_body_is_timed_unless_it_came_whole_with_its_head(
        served: Listener, kind: str, whole: bool) -> None:
    """A body that came whole with its head is read at once, without the body timeout's
    timer (it has nothing left to wait for): chunked or compressed, it is answered. One
    that has not all come (its last chunk, its last compressed bytes) is still timed: a
    408, not a handler held."""
    fields, body = _BODIES[kind]
    if not whole:  # all but its end: the terminating chunk, or the gzip trailer
        body = body[:-5]
    reader, writer = await connect(served)
    writer.write(CHAT_POST + fields + b"\r\n" + body)
    status, _, raw = await response(reader)
    assert status == (200 if whole else 408), raw
    if not whole:
        assert json.loads(raw)["error"]["code"] == "request_timeout"
    writer.close()


@pytest.mark.parametrize("served", [{"body_timeout_s": 0.3}], indirect=True)
async def test_a_body_stalled_after_its_100_continue_is_a_408(served: Listener) -> None:
    reader, writer = await connect(served)
    writer.write(CHAT_POST + b"Content-Length: %d\r\nExpect: 100-continue\r\n\r\n"
                 % len(_WHOLE))
    async with asyncio.timeout(WAIT):
        assert await reader.readline() == b"HTTP/1.1 100 Continue\r\n"
        assert await reader.readline() == b"\r\n"
    writer.write(_WHOLE[:10])  # and never the rest
    status, _, raw = await response(reader)
    assert status == 408 and json.loads(raw)["error"]["code"] == "request_timeout"
    writer.close()


@pytest.mark.parametrize("served", [{"idle_timeout_s": 0.3}], indirect=True)
async def test_idle_connection_is_closed(served: Listener) -> None:
    reader, writer = await connect(served)
    writer.write(LIVE)
    assert (await response(reader))[0] == 200
    assert await closed_by_server(reader)  # nothing more sent: closed after the idle time
    reader2, writer2 = await connect(served)  # a connection that never sends a byte too
    assert await closed_by_server(reader2)
    writer.close()
    writer2.close()


@pytest.mark.parametrize("served", [{"max_connections": 2}], indirect=True)
async def test_at_the_cap_the_oldest_idle_connection_makes_room(served: Listener) -> None:
    held = [await connect(served) for _ in range(2)]
    for reader, writer in held:
        writer.write(LIVE)
        assert (await response(reader))[0] == 200  # accepted, now idle keep-alive
    reader, writer = await connect(served)
    writer.write(LIVE)
    assert (await response(reader))[0] == 200  # served: a probe still gets through
    assert await closed_by_server(held[0][0])  # the oldest idle one made room
    assert served.guard.evicted == 1 and served.guard.refused == 0
    text = metrics(served)
    assert 'weir_connections_closed_total{reason="evicted"} 1.0' in text
    assert "weir_connections_open 2.0" in text
    for _, w in [*held, (reader, writer)]:
        w.close()


@pytest.mark.parametrize("served", [{"max_connections": 2}], indirect=True)
async def test_connection_cap_refuses_cleanly_when_none_is_idle(served: Listener) -> None:
    held = [await connect(served) for _ in range(2)]
    for _, writer in held:  # heads in progress: not idle, not to be evicted
        writer.write(b"GET /health/live HTTP/1.1\r\n")
        await writer.drain()
    await eventually(lambda: len(served.guard.open) == 2 and not any(
        c.idle for c in served.guard.open.values()), timeout=WAIT)
    reader, writer = await connect(served)
    writer.write(LIVE)
    status, headers, body = await response(reader)
    assert status == 503 and headers["connection"] == "close"
    assert headers["retry-after"] == "1" and headers["retry-after-ms"] == "1000"
    assert json.loads(body)["error"]["code"] == "too_many_connections"
    assert await closed_by_server(reader)
    assert served.guard.refused == 1
    writer.close()
    held[0][1].write(b"Host: x\r\n\r\n")  # one head completes: answered, then idle
    assert (await response(held[0][0]))[0] == 200
    reader, writer = await connect(served)
    writer.write(LIVE)
    assert (await response(reader))[0] == 200
    for _, w in [*held, (reader, writer)]:
        w.close()


@pytest.mark.parametrize("head", [
    b"GET /v1/models HTTP/1.1\r\nAuthorization: Bearer " + KEY.encode() + b"\x01\r\n\r\n",
    b"GET /v1/models HTTP/1.1\r\nAuthorization: Bearer " + KEY.encode() + b"\x7f\x00\r\n\r\n",
    b"GET /v1/models HTTP/1.1\r\nAuthorization: Bearer " + KEY.encode() + b"x" * 9000
    + b"\r\n\r\n",
    b"GET /v1/models?" + KEY.encode() * 400 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/models HTTP/1.1\r\nX-" + KEY.encode() + b": a\r\n" * 200 + b"\r\n",
    b"GET /v1/models HTTP/1.1\r\nContent-Length: " + KEY.encode() + b"\r\n\r\n",
])
async def test_parser_errors_never_log_the_key(head: bytes, logs: io.StringIO,
                                               capfd: pytest.CaptureFixture[str]) -> None:
    status, _, body = await answer_then_close(head)
    assert status in (400, 413, 431)
    error = json.loads(body)["error"]  # OpenAI's shape, not aiohttp's echo of the line
    assert set(error) == {"message", "type", "param", "code"}
    assert KEY[3:15].encode() not in body
    out, err = capfd.readouterr()
    text = logs.getvalue()
    assert "Error handling request" in text  # it was logged (the positive control) ...
    for where in (text, out, err):
        assert KEY not in where and KEY[3:15] not in where  # ... but without the key


@pytest.mark.parametrize("path", [b"GET /v1/models", b"POST /v1/chat/completions",
                                  b"POST /v1/responses", b"POST /v1/embeddings",
                                  b"GET /v1/responses/resp_x"])
async def test_a_key_that_is_not_utf8_is_a_401_not_a_500(served: Listener, path: bytes,
                                                         logs: io.StringIO) -> None:
    """Header bytes that are not UTF-8 (aiohttp hands them on as surrogates) in the key:
    the key is wrong like any other, never a server error or an error-level log."""
    reader, writer = await connect(served)
    body = b'{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}'
    writer.write(path + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-\xe9\xe9\xff\r\n"
                 b"Content-Type: application/json\r\nContent-Length: "
                 + str(len(body)).encode() + b"\r\n\r\n" + body)
    status, _, raw = await response(reader)
    writer.close()
    assert status == 401, raw
    assert json.loads(raw)["error"]["code"] == "invalid_api_key"
    assert "unhandled" not in logs.getvalue()


@pytest.mark.parametrize("served", [{"access_log": True}], indirect=True)
async def test_an_expectation_it_cannot_meet_is_an_openai_417(logs: io.StringIO,
                                                               served: Listener) -> None:
    """`Expect: 100-continue` gets its `100 Continue` and then the answer; any other
    expectation an OpenAI-shaped 417 (aiohttp's own was plain text) that ends the
    connection. Answered before the middlewares, it still carries the caller's request id
    and has its access-log line."""
    from tests.openai_spec import validate

    body = json.dumps({"model": "fake-model", "max_tokens": 2,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    head = CHAT_POST + b"Content-Length: " + str(len(body)).encode() + b"\r\n"
    reader, writer = await connect(served)
    writer.write(head + b"Expect: 100-continue\r\n\r\n")
    async with asyncio.timeout(WAIT):
        assert await reader.readline() == b"HTTP/1.1 100 Continue\r\n"
        assert await reader.readline() == b"\r\n"
    writer.write(body)
    assert (await response(reader))[0] == 200
    writer.close()
    reader, writer = await connect(served)
    counted = requests_counted(served, route="chat", model="", status="417")
    writer.write(head + b"X-Request-Id: req-417-a\r\nExpect: something-else\r\n\r\n" + body)
    status, headers, raw = await response(reader)
    assert status == 417 and headers.get("connection") == "close"
    assert requests_counted(served, route="chat", model="", status="417") == counted + 1
    assert headers.get("x-request-id") == "req-417-a"
    lines = [json.loads(line) for line in logs.getvalue().splitlines() if "req-417-a" in line]
    assert [(x["status"], x["path"], x.get("error")) for x in lines] == [
        (417, "/v1/chat/completions", "expectation_failed")]
    error = json.loads(raw)
    validate("ErrorResponse", error)
    assert error["error"]["code"] == "expectation_failed"
    writer.close()


async def test_a_body_over_the_limit_is_refused_before_the_client_sends_it(
        served: Listener) -> None:
    """`Expect: 100-continue` with a `Content-Length` past `server.max_body_bytes`: a 413
    at once, not a `100 Continue` that had the client upload it all first."""
    limit = served.runner.app[STATE].settings.server.max_body_bytes
    reader, writer = await connect(served)
    writer.write(CHAT_POST + b"Content-Length: " + str(limit + 1).encode()
                 + b"\r\nExpect: 100-continue\r\n\r\n")
    status, headers, raw = await response(reader)
    writer.close()
    assert status == 413 and headers.get("connection") == "close"
    assert json.loads(raw)["error"]["code"] == "request_too_large"


@pytest.mark.parametrize("served", [{"access_log": True}], indirect=True)
async def test_a_client_that_half_closed_is_logged_and_counted_499(
        logs: io.StringIO, served: Listener) -> None:
    """A client that sends its whole request and shuts its side (`SHUT_WR`) gets nothing:
    aiohttp closes the connection at EOF. A handler fast enough to finish anyway (the
    model list, a refusal) was logged and counted as its status, 200 or 401, though no
    byte of it was delivered."""
    counted = requests_counted(served, route="chat", model="", status="499")
    for rid, head in ((b"half-closed-models", b"GET /v1/models HTTP/1.1\r\n"
                       b"Authorization: Bearer " + KEY.encode() + b"\r\n"),
                      (b"half-closed-401", b"POST /v1/chat/completions HTTP/1.1\r\n"
                       b"Content-Type: application/json\r\nContent-Length: 2\r\n")):
        reader, writer = await connect(served)
        writer.write(head + b"Host: x\r\nX-Request-Id: " + rid + b"\r\n\r\n"
                     + (b"{}" if head.startswith(b"POST") else b""))
        writer.write_eof()
        async with asyncio.timeout(WAIT):
            assert await reader.read() == b""  # nothing was sent
        writer.close()

    def logged() -> dict[str, int]:
        lines = [json.loads(x) for x in logs.getvalue().splitlines() if "half-closed" in x]
        return {x["request_id"]: x["status"] for x in lines if x["event"] == "request"}

    await eventually(lambda: len(logged()) == 2, timeout=WAIT)
    assert logged() == {"half-closed-models": 499, "half-closed-401": 499}
    assert requests_counted(served, route="chat", model="", status="499") == counted + 1
    assert requests_counted(served, route="chat", model="", status="401") == 0


@pytest.mark.parametrize("served", [{"access_log": True}], indirect=True)
@pytest.mark.parametrize("key", [None, b"sk-wrong-key"])
async def test_100_continue_is_sent_only_to_a_request_with_a_valid_key(
        logs: io.StringIO, served: Listener, key: bytes | None) -> None:
    """`Expect: 100-continue` was answered before the key was checked: an unauthenticated
    client was invited to upload its body, to be refused after. It gets its 401 (OpenAI's
    shape) instead, before any body (`Connection: close`: the connection ends after it)."""
    from tests.openai_spec import validate

    counted = requests_counted(served, route="chat", model="", status="401")
    reader, writer = await connect(served)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                 + (b"Authorization: Bearer " + key + b"\r\n" if key else b"")
                 + b"X-Request-Id: expect-401\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 1000000\r\nExpect: 100-continue\r\n\r\n")
    status, headers, raw = await response(reader)  # no body was sent: no 100 first
    assert status == 401 and headers.get("connection") == "close"
    assert headers.get("x-should-retry") == "false" and "www-authenticate" in headers
    error = json.loads(raw)
    validate("ErrorResponse", error)
    assert error["error"]["code"] == ("invalid_api_key" if key else "missing_api_key")
    writer.close()
    assert requests_counted(served, route="chat", model="", status="401") == counted + 1
    lines = [json.loads(x) for x in logs.getvalue().splitlines() if "expect-401" in x]
    assert [(x["status"], x["path"]) for x in lines] == [(401, "/v1/chat/completions")]


async def test_a_whole_answer_its_client_does_not_read_is_cut() -> None:
    """A whole (not streamed) answer goes out after its handler has returned: a client
    that never reads it held its bytes in the server's memory, and its connection, for
    good (nothing timed the write; idle connections are closed only between requests).
    The write timeout cuts it, as it cuts a stalled stream; the server serves others."""
    engine = FakeEngine(max_model_len=100_000)
    listener = await start(engine=engine, write_timeout_s=0.3)
    body = json.dumps({"model": "fake-model", "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 20_000, "logprobs": True, "top_logprobs": 20}).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a reader that stalls
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        await loop.sock_connect(sock, ("127.0.0.1", listener.port))
        await loop.sock_sendall(sock, CHAT_POST + b"Content-Length: "
                                + str(len(body)).encode() + b"\r\n\r\n" + body)
        await eventually(lambda: len(engine.calls) == 1, timeout=WAIT)  # answered ...
        await eventually(lambda: not listener.guard.open, timeout=WAIT)  # ... never read
        assert listener.guard.write_timeouts == 1
        assert 'weir_connections_closed_total{reason="write_timeout"} 1.0' in metrics(listener)
        reader, writer = await connect(listener)
        writer.write(LIVE)
        assert (await response(reader))[0] == 200
        writer.close()
    finally:
        sock.close()
        await listener.close()


@pytest.mark.parametrize("served", [{"max_head_bytes": 16384}], indirect=True)
@pytest.mark.parametrize("whole", [True, False])
@pytest.mark.parametrize("blank", [b"", b"\r\n\r\n", b"\r\n"])
async def test_a_request_head_past_its_total_size_is_a_431(served: Listener, whole: bool,
                                                           blank: bytes) -> None:
    """Lines (8190 bytes) and fields (128) each had a bound, their product (a 1 MiB
    head) none: every connection could make the server hold a head that size (~1.7 MB
    of memory each) while it arrived. A head past `max_head_bytes`, sent whole or in
    part, is a 431 (OpenAI's shape) and the connection ends; its body is no head."""
    reader, writer = await connect(served)
    fields = b"".join(b"X-F%d: " % i + b"a" * 4000 + b"\r\n" for i in range(8))
    # (blank lines before a request line are skipped by the parser: no head's end)
    writer.write(blank + b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + fields
                 + (b"\r\n" if whole else b""))
    status, headers, body = await response(reader)
    assert status == 431 and headers.get("connection") == "close"
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "request_header_fields_too_large"
    assert await closed_by_server(reader)
    assert 'weir_connections_closed_total{reason="head_too_large"} 1.0' in metrics(served)
    writer.close()
    reader, writer = await connect(served)  # a head under it, with a body past it
    payload = json.dumps({"model": "fake-model", "input": "a" * 40_000}).encode()
    writer.write(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                 + KEY.encode() + b"\r\nContent-Type: application/json\r\nContent-Length: "
                 + str(len(payload)).encode() + b"\r\n\r\n" + payload)
    assert (await response(reader))[0] != 431
    writer.write(LIVE)  # and the connection goes on
    assert (await response(reader))[0] == 200
    # A body its handler left unread (a 401 answered before it came) is no head either.
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                 b"Content-Type: application/json\r\nContent-Length: "
                 + str(len(payload)).encode() + b"\r\n\r\n")
    assert (await response(reader))[0] == 401
    writer.write(payload + LIVE)
    assert (await response(reader))[0] == 200
    writer.close()


_CHAT = json.dumps({"model": "fake-model",
                    "messages": [{"role": "user", "content": "hi"}]}).encode()


@pytest.mark.parametrize("framing, body", [
    (b"Transfer-Encoding: chunked", b"zz\r\n" + _CHAT + b"\r\n0\r\n\r\n"),
])
async def test_a_body_aiohttps_parser_refuses_is_an_invalid_body(
        served: Listener, framing: bytes, body: bytes) -> None:
    """A body that arrives with its head and that aiohttp's parser itself refuses (a
    malformed chunk) was answered as a malformed request
    head (`invalid_http_request`, "its request line or a header is malformed"), where
    the same body arriving after its head is the documented `invalid_body`."""
    reader, writer = await connect(served)
    if b"%d" in framing:
        framing = framing % len(body)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                 + KEY.encode() + b"\r\nContent-Type: application/json\r\n" + framing
                 + b"\r\n\r\n" + body)
    status, _, raw = await response(reader)
    assert status == 400
    error = json.loads(raw)["error"]
    assert error["code"] == "invalid_body" and "body" in error["message"]
    assert await closed_by_server(reader)
    writer.close()


async def test_a_head_naming_chunked_badly_is_still_the_heads_fault(served: Listener) -> None:
    reader, writer = await connect(served)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                 b"Transfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n")
    status, _, raw = await response(reader)
    assert status == 400 and json.loads(raw)["error"]["code"] == "invalid_http_request"
    writer.close()


@pytest.mark.parametrize("coding", [b"gzip, chunked", b"foo, chunked", b"chunked, chunked"])
async def test_a_transfer_coding_other_than_chunked_is_refused(
        served: Listener, coding: bytes) -> None:
    """aiohttp frames a body by its last transfer coding, `chunked`, and ignored the
    others: a body sent as `Transfer-Encoding: gzip, chunked` was read as if it were not
    compressed (the front proxy that decoded it and Weir saw different bodies). As
    nginx and Envoy answer, a coding the server does not implement is a 501 (not to be
    retried: it is the request's fault), and no body is read."""
    reader, writer = await connect(served)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                 + KEY.encode() + b"\r\nContent-Type: application/json\r\n"
                 b"Transfer-Encoding: " + coding + b"\r\n\r\n"
                 + b"%x\r\n" % len(_CHAT) + _CHAT + b"\r\n0\r\n\r\n")
    status, headers, raw = await response(reader)
    if coding == b"chunked, chunked":  # aiohttp's parser refuses it itself
        assert status == 400
    else:
        assert status == 501 and headers.get("x-should-retry") == "false"
        error = json.loads(raw)["error"]
        assert error["code"] == "unsupported_transfer_encoding"
        assert error["type"] == "invalid_request_error"
    writer.close()


@pytest.mark.parametrize("body", [b"", b"{}"])
async def test_requests_pipelined_behind_a_running_one_are_not_read_past_the_bound(
        body: bytes) -> None:
    """While a request runs (a stream), what its client sends after its body is the next
    requests, which aiohttp parsed at once, heads of up to 1 MiB each, 32 queued: ten
    such connections held 430 MB. Past `max_head_bytes` read ahead, the connection is
    not read until its request has ended; then the pipelined requests are answered.
    Pipelined requests with a body too: aiohttp resumed reading as each body ended."""
    engine = FakeEngine()
    engine.token_gate = asyncio.Event()  # the stream runs until the gate opens
    served = await start(engine=engine, max_head_bytes=16384)
    reader, writer = await connect(served)
    chat = json.dumps({"model": "fake-model", "stream": True, "max_tokens": 2,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                 + KEY.encode() + b"\r\nContent-Type: application/json\r\nContent-Length: "
                 + str(len(chat)).encode() + b"\r\n\r\n" + chat)
    await engine.wait_until(lambda: len(engine.active) == 1, timeout=WAIT)
    head = LIVE[:-2] + b"".join(b"X-F%d: " % i + b"a" * 1000 + b"\r\n" for i in range(8))
    if body:
        head += b"Content-Length: %d\r\n" % len(body)
    for _ in range(20):  # 160 KB of requests, each head under the bound (and fewer
        # than aiohttp's own queue of 32 parsed requests, past which it stops reading)
        writer.write(head + b"\r\n" + body)
    await writer.drain()
    transport, = served.guard.open
    await eventually(lambda: not transport.is_reading(), timeout=WAIT)
    engine.token_gate.set()
    async with asyncio.timeout(WAIT):  # the stream ends ...
        stream = await reader.readuntil(b"\r\n0\r\n\r\n")  # (the chunked end)
    assert b"data: [DONE]" in stream
    for _ in range(20):  # ... and every pipelined request is answered
        assert (await response(reader))[0] == 200
    writer.close()
    await served.close()



async def test_a_body_pipelined_behind_a_running_request_is_no_head() -> None:
    """A request pipelined behind a running one, its body still arriving when that one
    ends (reading was held past `max_head_bytes`, or the body is simply long): its body
    was counted as the next request's head and the request answered 431, the connection
    closed. Its body is no head, as one its handler left unread is not."""
    engine = FakeEngine(max_model_len=1_000_000)
    engine.token_gate = asyncio.Event()  # the stream runs until the gate opens
    served = await start(engine=engine, max_head_bytes=16384)
    reader, writer = await connect(served)

    def post(body: bytes) -> bytes:
        return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                + KEY.encode() + b"\r\nContent-Type: application/json\r\nContent-Length: "
                + str(len(body)).encode() + b"\r\n\r\n" + body)

    chat = json.dumps({"model": "fake-model", "stream": True, "max_tokens": 2,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    long = json.dumps({"model": "fake-model", "max_tokens": 2,
                       "messages": [{"role": "user", "content": "word " * 120_000}]}).encode()
    writer.write(post(chat))
    await engine.wait_until(lambda: len(engine.active) == 1, timeout=WAIT)
    writer.write(post(long) + LIVE)  # a 600 KB body behind it, then another request
    transport, = served.guard.open
    await eventually(lambda: not transport.is_reading(), timeout=WAIT)  # held
    engine.token_gate.set()
    async with asyncio.timeout(WAIT):  # the stream ends ...
        await reader.readuntil(b"\r\n0\r\n\r\n")
    status, _, raw = await response(reader)  # ... and the pipelined ones are answered
    assert status == 200, raw
    assert (await response(reader))[0] == 200
    assert served.guard.open  # the connection goes on
    writer.close()
    await served.close()


@pytest.mark.parametrize("line", [b"GET /v1/models HTTP/2.0\r\nHost: x\r\n",
                                  b"GET /health/live HTTP/2.0\r\nHost: x\r\n",
                                  b"GET /v1/models\r\n"])  # (HTTP/0.9's request line)
async def test_a_request_line_in_another_http_version_is_a_505_in_http_1_1(
        served: Listener, line: bytes) -> None:
    """`HTTP/2.0` (or 0.9's bare request line) sent over HTTP/1 was served, its answer's
    status line echoing the version (`HTTP/2.0 200 OK`). It gets an OpenAI-shaped 505
    in HTTP/1.1 (as nginx answers) that ends the connection."""
    reader, writer = await connect(served)
    writer.write(line + b"Authorization: Bearer " + KEY.encode() + b"\r\n\r\n")
    async with asyncio.timeout(WAIT):
        status_line = await reader.readline()
    assert status_line.startswith(b"HTTP/1.1 505 "), status_line
    headers = {}
    while (h := await reader.readline()) not in (b"\r\n", b""):
        k, _, v = h.decode().partition(":")
        headers[k.strip().lower()] = v.strip()
    body = await reader.readexactly(int(headers["content-length"]))
    error = json.loads(body)["error"]
    assert error["code"] == "http_version_not_supported"
    assert error["type"] == "invalid_request_error"
    assert headers.get("connection") == "close"
    assert await closed_by_server(reader)
    writer.close()


def _gzip_bad_crc(data: bytes) -> bytes:
    body = gzip.compress(data)
    return body[:-8] + bytes(4) + body[-4:]


@pytest.mark.parametrize("coding, body", [
    (b"gzip", gzip.compress(_CHAT)[:-8]),  # its trailer cut off: the JSON is all there
    (b"gzip", gzip.compress(_CHAT)[:-3]),
    (b"gzip", _gzip_bad_crc(_CHAT)),
    (b"gzip", gzip.compress(_CHAT) + b"tail"),
    (b"deflate", zlib.compress(_CHAT)[:-4]),
    (b"deflate", zlib.compress(_CHAT)[:-12]),
    (b"br", brotli.compress(_CHAT)[:-1]),
    (b"zstd", zstd_compress(_CHAT)[:-4]),
])
async def test_a_body_its_coding_does_not_end_is_an_invalid_body(
        served: Listener, coding: bytes, body: bytes) -> None:
    """aiohttp checked that a deflate stream ended, no other coding's: a gzip body whose
    trailer (its CRC and length) was cut off, or wrong, was served as the JSON it held,
    a br or zstd one cut short read as its part that came. Each is a 400 `invalid_body`;
    its bytes were all read, so the connection goes on serving."""
    reader, writer = await connect(served)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                 + KEY.encode() + b"\r\nContent-Type: application/json\r\n"
                 b"Content-Encoding: " + coding + b"\r\nContent-Length: "
                 + str(len(body)).encode() + b"\r\n\r\n" + body)
    status, _, raw = await response(reader)
    assert status == 400, raw
    error = json.loads(raw)["error"]
    assert error["code"] == "invalid_body" and coding.decode() in error["message"]
    whole = gzip.compress(_CHAT)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                 + KEY.encode() + b"\r\nContent-Type: application/json\r\n"
                 b"Content-Encoding: gzip\r\nContent-Length: "
                 + str(len(whole)).encode() + b"\r\n\r\n" + whole)
    assert (await response(reader))[0] == 200
    writer.close()


@pytest.mark.parametrize("head", [
    b"GET /v1/models HTTP/1.10\r\nHost: x\r\n\r\n",  # (HTTP/1.2: a 505)
    b"GET /v1/models HTTP/1.1\r\n\r\n",  # no Host
    b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-A: a\r\n folded\r\n\r\n",
    b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n",
    b"GET /v1/models HTTP/1.0\r\nX-\xc3\xa9: a\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
    b"Content-Length: 3\r\n\r\n{}",
])
async def test_a_head_its_parser_refuses_is_answered_in_http_1_1(served: Listener,
                                                                 head: bytes) -> None:
    """aiohttp answers a head its parser refuses as if it were an HTTP/1.0 request
    (`HTTP/1.0 400 Bad Request`), whatever it said; a server answers in the highest
    version it speaks (RFC 9110, 6.2), as nginx does: `HTTP/1.1 400`."""
    reader, writer = await connect(served)
    writer.write(head)
    async with asyncio.timeout(WAIT):
        status_line = await reader.readline()
        rest = await reader.read()  # the answer, to the connection's end
    assert status_line.startswith(b"HTTP/1.1 400 "), status_line
    assert rest.endswith(b'"code": "invalid_http_request"}}')
    writer.close()


async def test_connect_is_a_405_that_ends_the_connection(served: Listener) -> None:
    """`CONNECT host:443` (a client taking Weir for a forward proxy) was a 404 "Unknown
    request URL: CONNECT ." that kept the connection, whose next bytes (the tunnel's, a
    TLS hello) would be read as a request. Weir is no proxy: a 405 (as nginx answers)
    whose empty `Allow` says the tunnel's target allows no method (RFC 9110 10.2.1),
    ending the connection."""
    for target in (b"host:443", b"/v1/models"):
        reader, writer = await connect(served)
        writer.write(b"CONNECT " + target + b" HTTP/1.1\r\nHost: host:443\r\n\r\n")
        status, headers, raw = await response(reader)
        assert status == 405, raw
        assert headers.get("allow") == ""
        assert headers.get("connection") == "close"
        error = json.loads(raw)["error"]
        assert error["code"] == "method_not_allowed"
        assert error["type"] == "invalid_request_error"
        assert await closed_by_server(reader)
        writer.close()


async def test_options_asterisk_is_a_405_naming_the_servers_methods(served: Listener) -> None:
    """`OPTIONS *` (about the server as a whole, RFC 9110 9.3.7) was a 404 "Unknown
    request URL: OPTIONS *". Weir answers OPTIONS on no resource (no CORS): a 405 whose
    `Allow` names the methods the server serves, as `OPTIONS /v1/models` names its
    route's; the connection goes on."""
    reader, writer = await connect(served)
    writer.write(b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n" + LIVE)
    status, headers, raw = await response(reader)
    assert status == 405, raw
    assert headers["allow"] == "DELETE, GET, HEAD, POST"
    assert json.loads(raw)["error"]["code"] == "method_not_allowed"
    assert (await response(reader))[0] == 200  # the pipelined request is served
    writer.close()


@pytest.mark.parametrize("served", [{"access_log": True}], indirect=True)
async def test_a_505_and_a_connect_have_their_code_in_the_access_log(
        logs: io.StringIO, served: Listener) -> None:
    """Answered by the middlewares, not a handler, a 505 and a CONNECT's 405 had an
    access-log line without the `error` every other error answer's line has."""
    for line in (b"GET /v1/models HTTP/2.0", b"CONNECT host:443 HTTP/1.1"):
        reader, writer = await connect(served)
        writer.write(line + b"\r\nHost: x\r\n\r\n")
        status, _, raw = await response(reader)
        assert status in (405, 505), raw
        writer.close()
    lines = [json.loads(x) for x in logs.getvalue().splitlines() if '"request"' in x]
    assert [(x["status"], x.get("error")) for x in lines] == [
        (505, "http_version_not_supported"), (405, "method_not_allowed")]


@pytest.mark.parametrize("served", [{"access_log": True, "max_head_bytes": 16384}],
                         indirect=True)
@pytest.mark.parametrize("head, status, code", [
    (b"GET /v1/models?\x01" + KEY.encode() + b" HTTP/1.1\r\nHost: x\r\n\r\n", 400,
     "invalid_http_request"),  # a bad request line
    (b"GET /v1/models HTTP/1.1\r\nAuthorization: Bearer " + KEY.encode() + b"\x01\r\n\r\n",
     400, "invalid_http_request"),  # a bad header
    (b"GET /v1/models HTTP/1.1\r\nAuthorization: Bearer " + KEY.encode() + b"x" * 9000
     + b"\r\n\r\n", 400, "invalid_http_request"),  # a header line too long
    (b"GET /v1/models HTTP/1.1\r\nAuthorization: Bearer " + KEY.encode() + b"\r\n"
     + b"".join(b"X-F%d: " % i + b"a" * 4000 + b"\r\n" for i in range(8)) + b"\r\n",
     431, "request_header_fields_too_large"),  # a head too large
    (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"zz\r\n" + KEY.encode() + b"\r\n0\r\n\r\n", 400, "invalid_body"),  # a bad chunk
], ids=["line", "header", "long-header", "head-too-large", "chunk"])
async def test_a_request_the_parser_refuses_has_its_access_log_line(
        logs: io.StringIO, served: Listener, head: bytes, status: int, code: str) -> None:
    """A request refused below the middlewares (aiohttp's parser, a head past
    `max_head_bytes`) was answered but left no access-log line: a flood of malformed
    requests, or a client whose every request was refused, showed in no log. It has its
    line: its status and error code, and nothing of the request (unparsed bytes, a key
    may be in them: no method, no path, no header). Its answer carries the line's
    request id, as every other answer does (it had none: the id in the log reached no
    client)."""
    reader, writer = await connect(served)
    writer.write(head)
    got, headers, raw = await response(reader)
    assert got == status
    assert json.loads(raw)["error"]["code"] == code
    writer.close()
    lines = [json.loads(x) for x in logs.getvalue().splitlines() if '"request"' in x]
    assert [(x["status"], x.get("error"), x["path"]) for x in lines] == [
        (status, code, "(unparsed)")]
    assert lines[0]["request_id"] and KEY[3:15] not in logs.getvalue()
    assert headers.get("x-request-id") == lines[0]["request_id"]


@pytest.mark.parametrize("head", [
    b"GET /v1/models?\x01 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/models HTTP/1.1\r\n" + b"X-F: " + b"a" * 70000 + b"\r\n\r\n",
], ids=["line", "head-too-large"])
async def test_a_request_the_parser_refuses_has_a_request_id_without_the_access_log(
        served: Listener, head: bytes) -> None:
    """Its answer has an `x-request-id` of its own when no access log is written too."""
    reader, writer = await connect(served)
    writer.write(head)
    status, headers, _ = await response(reader)
    assert status in (400, 431)
    assert re.fullmatch(r"[0-9a-f]{32}", headers.get("x-request-id", "")), headers
    writer.close()


def _chat_body(pad: int = 0) -> bytes:
    """A chat request, `pad` bytes of JSON whitespace longer."""
    return b"{" + b" " * pad + json.dumps({
        "model": "fake-model", "max_tokens": 2,
        "messages": [{"role": "user", "content": "hi"}]}).encode()[1:]


async def _budget_client(make_client: Any) -> Any:
    keys = [{"key": "k-a", "tenant": "acme", "user": "a"},
            {"key": "k-b", "tenant": "globex", "user": "b"}]
    return await make_client(make_settings(
        auth={"mode": "keys", "keys": keys},
        server={"max_body_bytes": 65536, "max_body_bytes_in_flight": 131072}))


def _post(client: Any, key: str, data: Any, **headers: str) -> Any:
    return client.post("/v1/chat/completions", data=data, headers={
        "Authorization": f"Bearer {key}", "Content-Type": "application/json", **headers})


async def test_bodies_being_received_at_once_are_bounded_fairly(make_client: Any) -> None:
    """Every connection a client could open, each sending a full body slowly, held its
    body in memory (6 MB each for 4 MB bodies) before any limit or queue saw the
    request. Past `max_body_bytes_in_flight` (the bytes read so far) the tenant holding
    an even share or more is refused a 503 `overloaded`; another tenant's body is still
    read."""
    client = await _budget_client(make_client)
    st = client.app[STATE]
    go = asyncio.Event()
    body = _chat_body(60_000)

    async def slow() -> AsyncIterator[bytes]:  # chunked: all but its end, then a wait
        yield body[:-10]
        await go.wait()
        yield body[-10:]

    uploads = [asyncio.ensure_future(_post(client, "k-a", slow())) for _ in range(2)]
    await eventually(lambda: st.bodies.held.get("acme") == 2 * (len(body) - 10))
    r = await _post(client, "k-a", slow())
    got = await r.json()
    assert r.status == 503 and got["error"]["code"] == "overloaded", got
    assert r.headers["retry-after"] == "1"
    small = _chat_body()
    r = await _post(client, "k-a", small)  # whole with its head: held already, so it is read
    assert r.status == 200, await r.text()
    other = asyncio.ensure_future(_post(client, "k-b", body))  # globex holds none: read
    r = await other
    assert r.status == 200, await r.text()
    go.set()
    assert [(await u).status for u in uploads] == [200, 200]
    assert st.bodies.held == {}
    r = await _post(client, "k-a", small)
    assert r.status == 200


@pytest.mark.parametrize("announced", [False, True])
async def test_a_body_counts_the_bytes_read_not_what_it_announces(make_client: Any,
                                                                 announced: bool) -> None:
    """A chunked body was counted at `max_body_bytes` and one with a Content-Length at
    it, for as long as the upload took: a few uploads that sent ten bytes (announcing
    the limit, or chunked) and stalled held the whole budget, and every other body,
    any tenant's, was refused a 503. They hold what they sent."""
    client = await _budget_client(make_client)
    st = client.app[STATE]
    go = asyncio.Event()
    body = _chat_body(60_000)

    async def stalled() -> AsyncIterator[bytes]:
        yield body[:10]
        await go.wait()
        yield body[10:]

    length = {"Content-Length": str(len(body))} if announced else {}
    uploads = [asyncio.ensure_future(_post(client, key, stalled(), **length))
               for key in ("k-a", "k-a", "k-b", "k-b")]
    await eventually(lambda: st.bodies.held == {"acme": 20, "globex": 20})
    for key in ("k-a", "k-b"):
        r = await _post(client, key, body)  # read: nothing near the budget is held
        assert r.status == 200, await r.text()
    go.set()
    assert [(await u).status for u in uploads] == [200] * 4
    assert st.bodies.held == {}


@pytest.mark.parametrize("served", [{"max_head_bytes_in_flight": 100_000}], indirect=True)
async def test_heads_arriving_at_once_are_bounded_in_all(served: Listener) -> None:
    """Each head had a bound (64 KiB), all of them together none: every connection the
    cap allows (thousands) sending a large head slowly held ~100 KB each until the head
    timeout. Past `max_head_bytes_in_flight` the connection whose head grows gets a 503
    `overloaded` and is closed; a head that comes whole is still served."""
    part = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + b"".join(
        b"X-F%d: " % i + b"a" * 7000 + b"\r\n" for i in range(6))  # ~42 KB, unfinished
    held = []
    for _ in range(2):
        reader, writer = await connect(served)
        writer.write(part)
        await writer.drain()
        held.append((reader, writer))
    await eventually(lambda: served.guard.head_held == 2 * len(part), timeout=WAIT)
    reader, writer = await connect(served)
    writer.write(part)
    status, headers, body = await response(reader)
    assert status == 503 and headers.get("retry-after") == "1"
    assert headers.get("retry-after-ms") == "1000"
    assert json.loads(body)["error"]["code"] == "overloaded"
    # (the id its access-log line names, as every other answer carries)
    assert re.fullmatch(r"[0-9a-f]{32}", headers.get("x-request-id", "")), headers
    assert await closed_by_server(reader)
    assert 'weir_connections_closed_total{reason="heads_in_flight"} 1.0' in metrics(served)
    writer.close()
    reader, writer = await connect(served)
    writer.write(LIVE)  # a whole head: counted nowhere
    assert (await response(reader))[0] == 200
    writer.close()
    for _, w in held:  # the held ones leave: their bytes are counted no more
        w.close()
    await eventually(lambda: served.guard.head_held == 0, timeout=WAIT)


@pytest.mark.parametrize("served", [{"access_log": True}], indirect=True)
async def test_a_method_the_server_does_not_know_is_a_501(logs: io.StringIO,
                                                          served: Listener) -> None:
    """A request line whose method aiohttp's parser knows no such method of (`FOO`) was
    a 400 saying the request line is malformed; it is a well-formed request in a method
    the server does not implement: a 501 (RFC 9110 9.1), OpenAI-shaped, not echoing the
    request. A method it knows but the path does not serve is a 405 naming the methods
    that are (`Allow`)."""
    reader, writer = await connect(served)
    writer.write(b"FOO /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                 + KEY.encode() + b"\r\n\r\n")
    status, headers, raw = await response(reader)
    assert status == 501, raw
    body = json.loads(raw)
    validate("ErrorResponse", body)
    assert body["error"]["code"] == "method_not_implemented" and "FOO" not in raw.decode()
    assert KEY not in raw.decode() and headers.get("x-request-id")
    assert headers["x-should-retry"] == "false"  # (the OpenAI SDK retries a 5xx)
    writer.close()
    lines = [json.loads(x) for x in logs.getvalue().splitlines() if '"request"' in x]
    assert [(x["status"], x.get("error")) for x in lines] == [(501, "method_not_implemented")]
    reader, writer = await connect(served)
    writer.write(b"PROPFIND /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
    status, headers, raw = await response(reader)
    assert status == 405 and headers["allow"] == "GET, HEAD"
    assert json.loads(raw)["error"]["code"] == "method_not_allowed"
    writer.close()


@pytest.fixture(params=["c", "python"])
def parser(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """aiohttp's request parser the listener uses: its C one (llhttp), as `weir serve`
    runs, or its Python one (what `AIOHTTP_NO_EXTENSIONS=1` runs)."""
    import aiohttp.web_protocol
    from aiohttp.http_parser import HttpRequestParserC, HttpRequestParserPy
    monkeypatch.setattr(aiohttp.web_protocol, "HttpRequestParser",
                        HttpRequestParserC if request.param == "c" else HttpRequestParserPy)
    return str(request.param)


@pytest.mark.parametrize(("line", "status", "code"), [
    (b"FOO /v1/models HTTP/1.1", 501, "method_not_implemented"),
    (b"FOO /v1/nope HTTP/1.1", 501, "method_not_implemented"),
    (b"get /v1/models HTTP/1.1", 501, "method_not_implemented"),
    (b"DESCRIBE /v1/models HTTP/1.1", 501, "method_not_implemented"),  # (RTSP's)
    (b"PROPFIND /v1/models HTTP/1.1", 405, "method_not_allowed"),
    (b"PATCH /v1/models HTTP/1.1", 405, "method_not_allowed"),
    (b"G@T /v1/models HTTP/1.1", 400, "invalid_http_request"),
    (b"PRI /v1/models HTTP/1.1", 400, "invalid_http_request"),
    (b"GET /v1/models HTTP/1.1", 200, None),
])
async def test_a_method_is_answered_alike_by_either_parser(
        parser: str, line: bytes, status: int, code: str | None) -> None:
    """aiohttp's Python parser took any token as a method (upper-cased: `get` was GET):
    the `FOO` its C parser refuses, a 501, was routed there (a 405, a 404). Either parser
    reads the same methods, and each line gets the same answer."""
    listener = await start()
    try:
        reader, writer = await connect(listener)
        writer.write(line + b"\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
                     + b"\r\n\r\n")
        got, _, raw = await response(reader)
        assert got == status, (parser, raw)
        if code is not None:
            assert json.loads(raw)["error"]["code"] == code
            assert KEY not in raw.decode()
        if status == 501:
            assert await closed_by_server(reader)
        writer.close()
    finally:
        await listener.close()


@pytest.mark.parametrize("data", [
    LIVE + b"G@T / HTTP/1.1\r\nHost: x\r\n\r\n",
    b"G@T / HTTP/1.1\r\nHost: x\r\n\r\n" + LIVE,
    LIVE + LIVE + b"GET /\x01 HTTP/1.1\r\n\r\n" + LIVE,
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
    b"Authorization: Bearer " + KEY.encode() + b"\r\n\r\n{}G@T / HTTP/1.1\r\n\r\n",
])
async def test_requests_pipelined_with_a_malformed_one_end_in_its_400(
        parser: str, data: bytes) -> None:
    """Requests sent in one packet with a malformed request line: aiohttp's parser drops
    what it read of that packet before the error (the requests before it are not served:
    none ran), and the client gets the 400, OpenAI-shaped, as the connection's last
    answer; the connection is closed and nothing of it is held (no hang, no leak)."""
    listener = await start()
    try:
        reader, writer = await connect(listener)
        writer.write(data)
        async with asyncio.timeout(WAIT):
            got = await reader.read()  # (to the server's close)
        heads = [line for line in got.split(b"\r\n") if line.startswith(b"HTTP/1.1 ")]
        assert heads and heads[-1] == b"HTTP/1.1 400 Bad Request", (parser, got)
        assert all(h == b"HTTP/1.1 200 OK" for h in heads[:-1])
        assert json.loads(got[got.rindex(b"\r\n\r\n") + 4:])["error"]["code"] == (
            "invalid_http_request")
        assert KEY.encode() not in got
        writer.close()
        await eventually(lambda: not listener.guard.open, timeout=WAIT)
        assert listener.guard.head_held == 0
    finally:
        await listener.close()


APP = "https://app.example.com"
_BIG = b"".join(b"X-F%d: " % i + b"a" * 4000 + b"\r\n" for i in range(8))


@pytest.mark.parametrize(("head", "status"), [
    # (a head past `max_head_bytes`, its Origin line whole, or split across two pieces)
    ([b"GET /v1/models HTTP/1.1\r\nHost: x\r\nOrigin: " + APP.encode() + b"\r\n" + _BIG],
     431),
    ([b"GET /v1/models HTTP/1.1\r\nHost: x\r\nOrig", b"in: " + APP.encode()[:12],
      APP.encode()[12:] + b"\r\n" + _BIG], 431),
    ([b"GET /v1/models HTTP/1.1\r\nHost: x\r\norigin:" + APP.encode() + b" \r\n"
      b"Bad\x01Field: x\r\n\r\n"], 400),  # (what the parser refuses)
    ([b"FOO /v1/models HTTP/1.1\r\nHost: x\r\nOrigin: " + APP.encode() + b"\r\n\r\n"], 501),
])
@pytest.mark.parametrize("origins", [[APP], ["*"], ["https://other.example.com"]])
async def test_an_answer_below_the_app_to_an_allowed_origin_grants_it(
        head: list[bytes], status: int, origins: list[str]) -> None:
    """Answers written on the connection below the app (a head too large, what the
    parser refuses) carried no CORS headers: a page saw a network error, not the status.
    They carry what every other answer does, by the Origin line of the head as it came:
    the grant where it is allowed (only then), and `Vary: Origin` where origins are
    listed."""
    listener = await start(max_head_bytes=16384, cors={"allow_origins": origins})
    try:
        reader, writer = await connect(listener)
        for piece in head:
            writer.write(piece)
            await writer.drain()
        got, headers, raw = await response(reader)
        assert got == status, raw
        granted = {"*": "*", APP: APP}.get(origins[0])
        assert headers.get("access-control-allow-origin") == granted
        assert ("x-request-id" in headers.get("access-control-expose-headers", "")) == (
            granted is not None)
        assert (headers.get("vary") == "Origin") == (origins != ["*"])
        assert await closed_by_server(reader)
        writer.close()
    finally:
        await listener.close()


async def test_an_answer_below_the_app_grants_no_origin_another_head_sent() -> None:
    """The Origin line is the refused head's own: one sent with an earlier request on
    the connection, or in its body, grants nothing; `server.cors` off, nothing at all."""
    listener = await start(max_head_bytes=16384, cors={"allow_origins": [APP]})
    try:
        reader, writer = await connect(listener)
        body = b"\r\nOrigin: " + APP.encode() + b"\r\n"
        writer.write(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nOrigin: " + APP.encode()
                     + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        assert (await response(reader))[0] == 401
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + _BIG)
        got, headers, _ = await response(reader)
        assert got == 431 and "access-control-allow-origin" not in headers
        writer.close()
    finally:
        await listener.close()
    listener = await start(max_head_bytes=16384)
    try:
        reader, writer = await connect(listener)
        writer.write(b"FOO / HTTP/1.1\r\nOrigin: " + APP.encode() + b"\r\n\r\n")
        got, headers, _ = await response(reader)
        assert got == 501 and not any(h.startswith("access-control") or h == "vary"
                                      for h in headers)
        writer.close()
    finally:
        await listener.close()


@pytest.mark.parametrize("origins", [[APP], ["*"]])
async def test_a_connection_refused_at_the_cap_grants_any_origin_alone(
        origins: list[str]) -> None:
    """Refused at the cap before a byte of its head is read, a connection's 503 cannot
    know its origin: it grants `*` where any origin is allowed, and nothing (but
    `Vary: Origin`) where origins are listed."""
    listener = await start(max_connections=1, cors={"allow_origins": origins})
    try:
        held = await connect(listener)
        held[1].write(b"GET /health/live HTTP/1.1\r\n")  # (a head in progress: not idle)
        await held[1].drain()
        await eventually(lambda: any(not c.idle for c in listener.guard.open.values()),
                         timeout=WAIT)
        reader, writer = await connect(listener)
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nOrigin: " + APP.encode()
                     + b"\r\n\r\n")
        got, headers, _ = await response(reader)
        assert got == 503
        assert headers.get("access-control-allow-origin") == ("*" if origins == ["*"]
                                                              else None)
        assert (headers.get("vary") == "Origin") == (origins != ["*"])
        for w in (writer, held[1]):
            w.close()
    finally:
        await listener.close()


@pytest.mark.parametrize("line", [b"DESCRIBE /v1/models RTSP/1.0",
                                  b"SETUP /v1/chat/completions RTSP/1.0",
                                  b"GET_PARAMETER /nope RTSP/1.0"])
async def test_an_rtsp_method_in_an_rtsp_request_line_is_a_501_under_either_parser(
        parser: str, line: bytes) -> None:
    """aiohttp's C parser (llhttp) reads a request line of RTSP (`RTSP/1.0`), its
    methods included: `DESCRIBE` was routed (a 405, a 404), where its Python parser, and
    either one for an `HTTP/1.1` line, answers the 501 of a method Weir knows nothing of."""
    got, headers, raw = await answer_then_close(
        line + b"\r\nHost: x\r\nCSeq: 1\r\nAuthorization: Bearer " + KEY.encode()
        + b"\r\n\r\n")
    assert got == 501, (parser, raw)
    assert json.loads(raw)["error"]["code"] == "method_not_implemented"
    assert headers.get("x-should-retry") == "false"
    assert KEY not in raw.decode()


async def _line_answer(parser: str, pieces: list[bytes]) -> tuple[int, dict[str, str], bytes]:
    """The last answer to `pieces` sent one after another on one connection (which the
    server must then close), under `parser`."""
    listener = await start()
    try:
        reader, writer = await connect(listener)
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
        async with asyncio.timeout(WAIT):
            got = await reader.read()  # (to the server's close)
        writer.close()
        head, _, body = got[got.rindex(b"HTTP/1.1 "):].partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = {k.strip().lower(): v.strip()
                   for k, _, v in (h.partition(":") for h in lines[1:])}
        assert KEY.encode() not in got, (parser, got)
        return int(lines[0].split()[1]), headers, body
    finally:
        await listener.close()


_AUTH = b"Authorization: Bearer " + KEY.encode() + b"\r\n"


@pytest.mark.parametrize("pieces", [
    [b"GET /v1/models RTSP/1.0\r\nHost: x\r\n" + _AUTH + b"\r\n"],
    [b"GET /v1/models RTSP/1.1\r\nHost: x\r\n" + _AUTH + b"\r\n"],  # (llhttp: HTTP/1.1)
    [b"GET /v1/models RTSP/2.0\r\nHost: x\r\n" + _AUTH + b"\r\n"],
    [b"POST /v1/chat/completions RTSP/1.0\r\nHost: x\r\n" + _AUTH
     + b"Content-Length: 2\r\n\r\n{}"],
    [b"SOURCE /v1/models ICE/1.0\r\nHost: x\r\n" + _AUTH + b"\r\n"],
    [b"GET /v1/models RT", b"SP/1.0\r\nHost: x\r\n" + _AUTH + b"\r\n"],  # (split)
    [b"GET /v1/models RTSP/1.0\r\nHost: x\r\n", _AUTH, b"\r\n"],  # (head in pieces)
    [LIVE + b"GET /v1/models RTSP/1.0\r\nHost: x\r\n" + _AUTH + b"\r\n"],  # (pipelined)
    [b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n" + _AUTH
     + b"\r\n{}GET /v1/models RTSP/1.0\r\nHost: x\r\n" + _AUTH + b"\r\n"],
])
async def test_a_request_line_in_another_protocol_is_a_400_under_either_parser(
        parser: str, pieces: list[bytes]) -> None:
    """A request line whose protocol is no HTTP (`RTSP/1.0`, `ICE/1.0`) is no HTTP request:
    aiohttp's C parser (llhttp) read it as HTTP/1.0 (a 200, its model list answered) where
    its Python parser refuses it, as nginx and Envoy do: a 400 under either, that ends
    the connection."""
    status, headers, body = await _line_answer(parser, pieces)
    assert status == 400, (parser, body)
    assert json.loads(body)["error"]["code"] == "invalid_http_request"
    assert headers.get("connection") == "close"


@pytest.mark.parametrize("pieces", [
    [b"GET  /v1/models  HTTP/1.1\r\nHost: x\r\n" + _AUTH + b"\r\n"],
    [b"GET /v1/models  HTTP/1.1\r\nHost: x\r\n" + _AUTH + b"\r\n"],
    [b"GET  /v1/models HTTP/1.1\r\nHost: x\r\n" + _AUTH + b"\r\n"],
    [b"POST   /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n" + _AUTH
     + b"\r\n{}"],
    [b"GET  /v1/mo", b"dels HTTP/1.1\r\nHost: x\r\n" + _AUTH + b"\r\n"],  # (split)
    [LIVE + b"GET /v1/models  HTTP/1.1\r\nHost: x\r\n" + _AUTH + b"\r\n"],  # (pipelined)
])
async def test_a_request_line_with_doubled_spaces_is_a_400_under_either_parser(
        parser: str, pieces: list[bytes]) -> None:
    """RFC 9112 3: a request line is its method, target and version, each after one space.
    aiohttp's C parser (llhttp) read `GET  /  HTTP/1.1` as `GET / HTTP/1.1` (served)
    where its Python parser refuses it: a 400 under either, that ends the connection."""
    status, headers, body = await _line_answer(parser, pieces)
    assert status == 400, (parser, body)
    assert json.loads(body)["error"]["code"] == "invalid_http_request"
    assert headers.get("connection") == "close"


@pytest.mark.parametrize(("line", "status", "code"), [
    (b"FOO", 400, "invalid_http_request"),  # (no request line: no method, target, version)
    (b"GET", 400, "invalid_http_request"),
    (b"GET /v1/models", 505, "http_version_not_supported"),  # (HTTP/0.9's line)
    (b"POST /v1/chat/completions", 505, "http_version_not_supported"),
    (b"GET /v1/models HTTP/1.2", 505, "http_version_not_supported"),
    (b"GET /v1/models HTTP/2.0", 505, "http_version_not_supported"),
    (b"GET /v1/models HTTP/3.0", 505, "http_version_not_supported"),
    (b"GET /v1/models HTTP/0.9", 505, "http_version_not_supported"),
    (b"GET /v1/models HTTP/9.9", 505, "http_version_not_supported"),
    (b"GET /v1/models HTTP/1.10", 400, "invalid_http_request"),  # (no version's syntax)
    (b"GET /v1/models HTTP/11.1", 400, "invalid_http_request"),
    (b"GET /v1/models http/1.1", 400, "invalid_http_request"),
    (b"GET /v1/models HTTP/1", 400, "invalid_http_request"),
    (b"GET /v1/models HTTP/1.1 x", 400, "invalid_http_request"),
])
async def test_a_request_lines_version_is_answered_alike_by_either_parser(
        parser: str, line: bytes, status: int, code: str) -> None:
    """A bare `FOO` was llhttp's 501 (an unknown method) and the Python parser's 400; a
    line without a version (HTTP/0.9's) llhttp's 505 and the Python parser's 400; a
    version of HTTP's syntax but not 1.0 or 1.1 (`HTTP/1.2`, `HTTP/3.0`) llhttp's 400 and
    the Python parser's 505. Either answers each alike: a line that is none is a 400, a
    version Weir does not speak a 505 (as the README says), each ending the connection."""
    got, headers, body = await _line_answer(parser, [line + b"\r\nHost: x\r\n" + _AUTH
                                                     + b"\r\n"])
    assert got == status, (parser, body)
    assert json.loads(body)["error"]["code"] == code
    assert headers.get("connection") == "close"
    if status == 505:
        assert headers.get("x-should-retry") == "false"


@pytest.mark.parametrize("origins", [["*"], [APP]])
async def test_the_origin_line_is_looked_for_only_where_origins_are_listed(
        origins: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """With `allow_origins: ["*"]` an answer below the app grants `*` whatever the head's
    Origin: its heads are not searched for one (they were, for nothing), and the grant
    still goes out; where origins are listed, they are, and it is the head's own."""
    import proxy.connections
    searched: list[bytes] = []
    find = proxy.connections._Guarded._find_origin

    def counted(self: Any, head: bytes) -> None:
        searched.append(head)
        find(self, head)

    monkeypatch.setattr(proxy.connections._Guarded, "_find_origin", counted)
    listener = await start(max_head_bytes=16384, cors={"allow_origins": origins})
    try:
        reader, writer = await connect(listener)
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nOrigin: " + APP.encode()
                     + b"\r\n" + _BIG)
        got, headers, _ = await response(reader)
        assert got == 431
        assert headers.get("access-control-allow-origin") == origins[0]
        assert bool(searched) == (origins != ["*"])
        writer.close()
    finally:
        await listener.close()


@pytest.mark.parametrize("text", [b"GET / RTSP/1.0", b"SOURCE /mount ICE/1.0"])
async def test_a_body_chunk_ending_in_words_like_a_request_line_is_served(
        parser: str, text: bytes) -> None:
    """A chunked body is the client's: a chunk that ends inside a JSON string with
    `GET / RTSP/1.0` (the chunk's CR LF after it) is no request line. Scanning all bytes
    for such lines refused this legit request (a 400) and cost a body of one long word
    and an `RTSP/` CPU quadratic in its length; Weir looks at no body for them."""
    listener = await start()
    try:
        reader, writer = await connect(listener)
        first = b'{"model": "fake-model", "messages": [{"role": "user", "content": "' + text
        rest = b'"}]}'
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + _AUTH
                     + b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                     + b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(first), first,
                                                               len(rest), rest))
        await writer.drain()
        status, _, body = await response(reader)
        writer.close()
        assert status == 200, (parser, body)
        assert json.loads(body)["object"] == "chat.completion"
    finally:
        await listener.close()


async def test_an_unknown_method_logs_one_clean_line_under_either_parser(
        parser: str, logs: io.StringIO, capfd: pytest.CaptureFixture[str]) -> None:
    """An unknown method's 501 logs one line (aiohttp's "Error handling request", its
    error's type alone) under either parser: no traceback, nothing of the request."""
    status, _, _ = await answer_then_close(
        b"FOO /v1/models HTTP/1.1\r\nHost: x\r\n" + _AUTH + b"\r\n")
    assert status == 501
    out, err = capfd.readouterr()
    text = logs.getvalue()
    assert len([x for x in text.splitlines() if "Error handling request" in x]) == 1
    for where in (text, out, err):
        assert "Traceback" not in where and "FOO" not in where, (parser, where)
        assert KEY not in where and "/v1/models" not in where


@pytest.mark.parametrize("head", [
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, chunked\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
    b"Transfer-Encoding: CHUNKED\r\n",
    b"GET /v1/models HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, chunked\r\n",
])
async def test_chunked_named_twice_is_a_400_under_either_parser(parser: str,
                                                                head: bytes) -> None:
    """RFC 9112 6.1: chunked is never applied more than once. aiohttp's C parser refuses
    such a head (a 400); its Python parser framed the body as chunked once (a GET was
    served, a POST was the route's 501 for a transfer coding besides chunked)."""
    body = b'{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}'
    status, headers, raw = await _line_answer(parser, [
        head + _AUTH + b"Content-Type: application/json\r\n\r\n"
        + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)])
    assert status == 400, (parser, raw)
    assert json.loads(raw)["error"]["code"] == "invalid_http_request"
    assert headers.get("connection") == "close"


@pytest.mark.parametrize("length", [b"18446744073709551616",  # (2**64)
                                    b"99999999999999999999999"])
async def test_a_content_length_past_64_bits_is_answered_alike_by_either_parser(
        parser: str, length: bytes) -> None:
    """A Content-Length past 64 bits was llhttp's 400 (it overflows) and the Python
    parser's 413 (Python's int took it): a 400 under either."""
    got, _, raw = await _line_answer(parser, [
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + _AUTH
        + b"Content-Type: application/json\r\nContent-Length: " + length + b"\r\n\r\n"])
    assert got == 400, (parser, raw)
    assert json.loads(raw)["error"]["code"] == "invalid_http_request"


@pytest.mark.parametrize("line", [b"GET /v1/models\xff HTTP/1.1",
                                  b"GET /v1/models?a=\xc3\xa9 HTTP/1.1",
                                  b"GET /v1/\xc3\xa9 HTTP/1.1"])
async def test_a_byte_past_ascii_in_the_request_target_is_a_400_under_either_parser(
        parser: str, line: bytes) -> None:
    """RFC 3986 targets are ASCII: llhttp refuses one with a byte past it (a 400) where
    aiohttp's Python parser routed it (a 404 quoting the byte, or the models served)."""
    status, headers, body = await _line_answer(parser, [line + b"\r\nHost: x\r\n" + _AUTH
                                                        + b"\r\n"])
    assert status == 400, (parser, body)
    assert json.loads(body)["error"]["code"] == "invalid_http_request"
    assert headers.get("connection") == "close"
