"""`proxy.wire_errors.answer_in_http_1_1`: aiohttp has no public way to choose an
answer's status-line version (it writes the request's); these tests hold its private
fields to what the status line says, so an aiohttp that changed them fails here."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from unittest import mock

import pytest
from aiohttp import HttpVersion, HttpVersion10, HttpVersion11, http_parser, web
from aiohttp.test_utils import make_mocked_request

from proxy.wire_errors import _HttpOnly, answer_in_http_1_1


@contextlib.contextmanager
def _http_only_parsers() -> Iterator[Callable[[], _HttpOnly]]:
    """Makes the HTTP-only check over aiohttp's C parser, on one loop (skips without it)."""
    parser_c = getattr(http_parser, "HttpRequestParserC", None)
    if parser_c is None:
        pytest.skip("aiohttp without its C parser")
    loop = asyncio.new_event_loop()
    protocol = mock.Mock(_reading_paused=False)
    try:
        yield lambda: _HttpOnly(parser_c(protocol, loop, 2**16, max_line_size=8190,
                                         max_field_size=8190))
    finally:
        loop.close()


@pytest.mark.parametrize("version", [HttpVersion(2, 0), HttpVersion10, HttpVersion(0, 9)])
async def test_the_answer_s_status_line_says_http_1_1(version: HttpVersion) -> None:
    request = make_mocked_request("GET", "/v1/models", version=version)
    assert request.version == version  # (read once: aiohttp caches it)
    answer_in_http_1_1(request)
    assert request.version == HttpVersion11
    resp = web.Response(status=505)
    await resp.prepare(request)
    status_line = request.writer.write_headers.call_args.args[0]  # type: ignore[attr-defined]
    assert status_line == "HTTP/1.1 505 HTTP Version Not Supported"


async def test_an_aiohttp_without_those_fields_still_answers() -> None:
    """Should aiohttp's fields go, the answer keeps the request's version: its error
    answer (a parser's refusal, a 505) is still given, not lost to an AttributeError."""
    request = make_mocked_request("GET", "/v1/models", version=HttpVersion(2, 0))
    del request._cache
    answer_in_http_1_1(request)


def test_a_split_rtsp_line_after_an_http_one_on_its_connection_is_refused() -> None:
    """llhttp reads `GET /v1/models RTSP/1.0` as HTTP/1.0. The check looks for a request's
    own line where it came (split: the bytes kept of the piece before): the HTTP line of
    the request before it on the connection, same method and target, was kept too and
    taken for its own, so the RTSP line was served."""
    from aiohttp.http_exceptions import BadStatusLine

    with _http_only_parsers() as make:
        parser = make()
        messages, _, _ = parser.feed_data(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        assert len(messages) == 1
        assert not parser.feed_data(b"GET /v1/models RT")[0]
        with pytest.raises(BadStatusLine):
            parser.feed_data(b"SP/1.0\r\nHost: x\r\n\r\n")
        # an HTTP line split so is served
        parser = make()
        parser.feed_data(b"GET /v1/models HT")
        assert len(parser.feed_data(b"TP/1.1\r\nHost: x\r\n\r\n")[0]) == 1


def test_the_http_only_check_copies_no_bytes_of_a_request_whose_line_is_where_it_is() -> None:
    """The check cost about 4 us a request, every request: it built its search string
    twice and copied the bytes after each head (a body, up to 16 KiB) to keep them. Now
    a line where it should be is matched in place and the pieces fed are kept by
    reference; they are joined only where a line must be looked for across them."""
    from proxy.wire_errors import _KEPT, _PIECES

    with _http_only_parsers() as make:
        parser = make()
        data = b"POST /v1/x HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\n{}"
        assert len(parser.feed_data(data)[0]) == 1
        assert parser._kept[0] is data  # (not copied)
        assert not parser.feed_data(b"{}")[0]
        # a head sent a byte at a time is kept in few pieces, and found across them
        head = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
        for i in range(len(head) - 1):
            assert not parser.feed_data(head[i:i + 1])[0]
            assert len(parser._kept) <= _PIECES + 1 and parser._size <= 2 * _KEPT
        assert len(parser.feed_data(head[-1:])[0]) == 1


@pytest.mark.parametrize("piece", [20, 3000, 200_000])
def test_the_http_only_check_holds_a_bounded_tail_of_what_it_was_fed(piece: int) -> None:
    """The check keeps the last bytes fed (to find a request line split across reads).
    It kept pieces by reference and, past 32 of them, joined them into one that it never
    cut: a body sent in small reads (a chunked upload's small writes) was all held, and
    copied again every 32 reads (2 MB in 50-byte reads: 2 MB held, over a second of
    copying); a single large read was held whole (256 KiB a connection). Now at most
    three times `_KEPT` is held, and a line split across many reads is still found."""
    from aiohttp.http_exceptions import BadStatusLine

    from proxy.wire_errors import _KEPT

    def held(parser: _HttpOnly) -> int:
        return sum(len(k) for k in parser._kept)

    with _http_only_parsers() as make:
        parser = make()
        size = min(piece * 5000, 400_000)
        head = b"POST /v1/x HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % size
        body = b"GET  /v1/models  HTTP/1.1\r\n" * (size // 27 + 1)
        body = body[:size]
        first = head + body[:piece]
        assert len(parser.feed_data(first)[0]) == 1
        assert held(parser) <= 3 * _KEPT
        for at in range(piece, size, piece):  # (bounded: 5,000 reads at most)
            assert not parser.feed_data(body[at:at + piece])[0]
            assert held(parser) <= 3 * _KEPT, (at, held(parser))
        # the next request's line, in other protocols and split in reads of a byte, is
        # still found (and a body's words like a line were no request line)
        line = b"GET /v1/models RTSP/1.0\r\nHost: x\r\n\r\n"
        for i in range(len(line) - 1):
            assert not parser.feed_data(line[i:i + 1])[0]
        with pytest.raises(BadStatusLine):
            parser.feed_data(line[-1:])
