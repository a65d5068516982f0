"""The test helper that serves an app on a thread's own event loop."""

from __future__ import annotations

import gc

import httpx
from aiohttp import web

from tests.threaded_server import serve_in_thread


def test_a_threaded_server_leaves_no_event_loop_open() -> None:
    """Its loop was never closed: a later test's garbage collection found the loop and its
    self-pipe's two sockets unclosed, and failed that test (the suite turns those
    ResourceWarnings into errors), whichever test it was."""
    with serve_in_thread(web.Application) as url:
        assert httpx.get(f"{url}/nowhere").status_code == 404
    gc.collect()  # an unclosed loop or socket collected here fails this test
