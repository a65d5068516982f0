"""Library log records (aiohttp, asyncio) reach the structured log scrubbed and
rate-limited: an accept-error storm is one line per window, with a count."""

from __future__ import annotations

import errno
import io
import json
import logging
from collections.abc import Iterator

import pytest

import proxy.telemetry as telemetry
from proxy.settings import LoggingSettings
from proxy.telemetry import configure_logging


@pytest.fixture
def log() -> Iterator[io.StringIO]:
    buf = io.StringIO()
    configure_logging(LoggingSettings(), stream=buf)
    yield buf
    configure_logging(LoggingSettings())


def accept_error() -> None:
    exc = OSError(errno.EMFILE, "Too many open files")
    logging.getLogger("asyncio").error(
        "socket.accept() out of system resource\nsocket: <fd=6>", exc_info=(OSError, exc, None))


def lines(buf: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in buf.getvalue().splitlines()]


def test_accept_error_storm_is_one_line_per_window(log: io.StringIO,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(telemetry.time, "monotonic", lambda: now[0])
    for _ in range(5000):
        accept_error()
    now[0] += telemetry._BURST_WINDOW_S
    accept_error()
    got = lines(log)
    assert len(got) == 2
    assert got[0]["event"] == "socket.accept() out of system resource"
    assert (got[0]["error"], got[0]["errno"]) == ("OSError", errno.EMFILE)
    assert got[1]["suppressed"] == 4999
    assert "Traceback" not in log.getvalue() and "fd=6" not in log.getvalue()


def test_exception_messages_and_arguments_are_dropped(log: io.StringIO) -> None:
    try:
        raise ValueError("Authorization: Bearer sk-secret-in-message")
    except ValueError:
        logging.getLogger("aiohttp.server").exception("Error handling request from %s",
                                                      "sk-secret-in-args")
    text = log.getvalue()
    assert "sk-secret" not in text
    assert lines(log)[0]["error"] == "ValueError"
