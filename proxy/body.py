"""Reading a request body: content type, the one size limit, a time limit, then JSON.

`server.max_body_bytes` is the only body-size limit (aiohttp's `client_max_size` is set
from it, and routes pass it here); `server.body_timeout_s` bounds how long a client may
take to send the body, so a stalled upload cannot hold a handler forever.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from .app_state import STATE
from .errors import InvalidRequest, PayloadTooLarge, RequestTimeout
from .jsonbody import decode_json_object


async def read_json(request: web.Request, limit: int) -> tuple[dict[str, Any], int]:
    """The body as a JSON object and its size in bytes, or a 400 / 408 / 413."""
    ctype = request.content_type
    if ctype != "application/json" and not ctype.endswith("+json"):
        raise InvalidRequest(
            f"Unsupported content type `{ctype or 'none'}`; send `application/json`.",
            code="invalid_content_type",
        )
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(f"The request body is larger than the limit of {limit} bytes.")
    timeout = request.app[STATE].settings.server.body_timeout_s
    try:
        if request.content.is_eof():  # a small body comes with the headers: all there
            body = await request.read()
        else:
            async with asyncio.timeout(timeout):
                body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise PayloadTooLarge(
            f"The request body is larger than the limit of {limit} bytes.") from None
    except TimeoutError:
        raise RequestTimeout(
            f"The request body did not arrive within {timeout:g} s.") from None
    if len(body) > limit:  # a chunked body under the server-wide limit, over this one
        raise PayloadTooLarge(f"The request body is larger than the limit of {limit} bytes.")
    return decode_json_object(body), len(body)
