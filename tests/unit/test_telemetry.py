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


def test_a_malformed_request_is_a_warning_and_our_own_failure_an_error(
        log: io.StringIO) -> None:
    """A client can send a too-long header line at will: it must not page anyone."""
    from aiohttp.http_exceptions import LineTooLong

    for exc, event in ((LineTooLong(b"x" * 10, "8190"), "Error handling request %s"),
                       (RuntimeError("ours"), "Unhandled error in %s")):
        try:
            raise exc
        except Exception:
            logging.getLogger("aiohttp.server").exception(event, "peer")
    got = lines(log)
    assert [(g["error"], g["level"]) for g in got] == [("LineTooLong", "warning"),
                                                       ("RuntimeError", "error")]


def test_any_library_s_warning_is_a_structured_line_without_its_arguments(
        log: io.StringIO) -> None:
    """Only aiohttp's and asyncio's records were bridged: the OTLP exporter's (a collector
    down: one per batch and retry) and any other library's went to stderr as plain text,
    into a log every other line of which is JSON, with their arguments (hosts, a reason's
    text). Every library's warnings reach the structured log now, scrubbed and
    rate-limited as aiohttp's are."""
    exporter = logging.getLogger("opentelemetry.exporter.otlp.proto.http.trace_exporter")
    for delay in (0.81, 1.67, 3.72):
        exporter.warning("Transient error %s encountered while exporting %s batch, "
                         "retrying in %.2fs.", "HTTPConnectionPool(host='sk-secret-host')",
                         "span", delay)
    logging.getLogger("some.library").error("failed for %(who)s", {"who": "sk-secret-who"})
    logging.getLogger("some.library").info("chatter below the bridge's level")
    got = lines(log)
    assert [(g["logger"], g["event"], g["level"]) for g in got] == [
        ("opentelemetry.exporter.otlp.proto.http.trace_exporter",
         "Transient error encountered while exporting batch, retrying in s.", "warning"),
        ("some.library", "failed", "error")]
    assert "sk-secret" not in log.getvalue()


def test_a_literal_percent_keeps_the_words_after_it(log: io.StringIO) -> None:
    """A space is no conversion flag here: "95% full" lost "% f" (read as `% f`)."""
    logging.getLogger("some.disk").warning("Disk 95% full, 100%% done")
    assert [g["event"] for g in lines(log)] == ["Disk 95% full, 100%% done"]


def test_labelled_children_are_memoised_and_count() -> None:
    m = telemetry.Metrics()
    a = telemetry.labelled(m.requests, "chat", "m", "200")
    assert telemetry.labelled(m.requests, "chat", "m", "200") is a
    a.inc()
    telemetry.labelled(m.requests, "chat", "m", "200").inc(2)
    telemetry.labelled(m.requests, "chat", "m", "429").inc()
    text = m.render().decode()
    assert 'weir_requests_total{model="m",route="chat",status="200"} 3.0' in text
    assert 'weir_requests_total{model="m",route="chat",status="429"} 1.0' in text


def test_labelled_stops_memoising_past_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(telemetry, "_CHILDREN_MAX", 2)
    m = telemetry.Metrics()
    for status in ("200", "400", "500", "503"):
        telemetry.labelled(m.requests, "chat", "m", status).inc()
    assert len(m.requests.__dict__["_weir_children"]) == 2
    assert m.render().decode().count("weir_requests_total{") == 4


def test_the_latency_histogram_tells_apart_requests_as_long_as_the_defaults_allow() -> None:
    """Its top finite bucket was 120 s, where a request may run 300 s under admission's
    default deadline and 600 s on an upstream: every request past 2 minutes fell in +Inf,
    and a p99 over them read as 120 s."""
    from plugins.admission.config import AdmissionConfig
    from proxy.settings import UpstreamEngineSettings

    longest = max(AdmissionConfig().deadline_s or 0,
                  UpstreamEngineSettings(base_url="http://up/v1").timeout_s)
    bounds = telemetry._LATENCY_BUCKETS
    assert bounds[-1] >= longest
    assert any(longest / 2 <= b < longest for b in bounds)  # not one bucket for 2-10 min


def test_observations_batched_read_as_each_observed_once_flushed() -> None:
    """A stream's gaps are counted aside and added at once: the histogram then reads as
    if each had been observed (bounds inclusive, as `observe`'s), and a full batch goes
    in before the end."""
    values = [0.0005, 0.001, 0.0011, 0.0025, 0.02, 0.3, 1.0, 7.0, 0.001]
    one, batched = telemetry.Metrics(), telemetry.Metrics()
    for v in values:
        telemetry.labelled(one.itl, "chat", "m").observe(v)
    held = telemetry.Observations(telemetry.labelled(batched.itl, "chat", "m"), batch=4)
    for v in values:
        held.observe(v)

    def samples(m: telemetry.Metrics) -> dict[str, float]:
        return {s.name + str(sorted(s.labels.items())): round(s.value, 9)  # (sums: float)
                for f in m.registry.collect() if f.name == "weir_inter_token_latency_seconds"
                for s in f.samples if not s.name.endswith("_created")}

    def count(m: telemetry.Metrics) -> float:
        return m.registry.get_sample_value("weir_inter_token_latency_seconds_count",
                                           {"route": "chat", "model": "m"}) or 0.0

    assert count(batched) == 8  # two batches of 4 went in; the ninth is held
    held.flush()
    assert samples(batched) == samples(one) and count(batched) == len(values)
    held.flush()  # (nothing held: nothing added)
    assert samples(batched) == samples(one)


def test_observations_of_a_histogram_kept_otherwise_are_each_observed() -> None:
    seen: list[float] = []

    class Other:
        def observe(self, v: float) -> None:
            seen.append(v)

    held = telemetry.Observations(Other())
    held.observe(0.5)
    held.flush()
    assert seen == [0.5]
