"""`proxy.wire_errors.answer_in_http_1_1`: aiohttp has no public way to choose an
answer's status-line version (it writes the request's); these tests hold its private
fields to what the status line says, so an aiohttp that changed them fails here."""

from __future__ import annotations

import pytest
from aiohttp import HttpVersion, HttpVersion10, HttpVersion11, web
from aiohttp.test_utils import make_mocked_request

from proxy.wire_errors import answer_in_http_1_1


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
