"""Sanitizer: the shared pre-check (`quiet_ones`, `quiet`) that lets an ordinary prompt
skip the built-in detectors is a strict superset of each one's triggers: wherever it
says a detector is quiet in a text, that detector finds nothing there, and the plugin
reads every text alike with it and without it. Texts: every string of the sanitizer's
own tests, the semantic cache's labelled prompts, pieces of those, and fuzz built from
the detectors' literals."""

from __future__ import annotations

import ast
import string
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plugins.sanitizer import plugin as sanitizer_plugin
from plugins.sanitizer.config import SanitizerConfig
from plugins.sanitizer.credentials import _ENV_ENDINGS, _NEEDS, _PHRASE_STARTS, _QUERY_WORDS
from plugins.sanitizer.detectors import GATED, forget, quiet, quiet_ones
from plugins.sanitizer.injection import _TRIGGERS
from plugins.sanitizer.plugin import SanitizerPlugin
from proxy.chain import Services
from proxy.serving import LocalServing
from proxy.settings import Settings
from proxy.telemetry import Metrics
from proxy.text import fold, scanned
from tests.fakes import FakeEngine

_HERE = Path(__file__).parent
_DATA = _HERE.parent.parent / "data"
_DETECTORS = ("email", "phone", "cn_mobile", "card", "cn_id", "iban", "ip", "ssn",
              "uk_nino", "secret", "injection")


def _strings(path: Path) -> Iterator[str]:
    """Every string literal of a test module (its parametrizations and tables)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value:
            yield node.value


def _prompts() -> Iterator[str]:
    for path in sorted(_DATA.glob("semantic_*.yaml")):
        def walk(node: Any) -> Iterator[str]:
            if isinstance(node, str):
                yield node
            elif isinstance(node, list):
                for x in node:
                    yield from walk(x)
            elif isinstance(node, dict):
                for x in node.values():
                    yield from walk(x)
        yield from walk(yaml.safe_load(path.read_text()))


def _corpus() -> list[str]:
    texts: set[str] = set()
    for path in sorted(_HERE.glob("test_sanitizer*.py")):
        if path.name != Path(__file__).name:
            texts.update(_strings(path))
    texts.update(_prompts())
    pieces: set[str] = set()
    for text in texts:  # its lines, and each half: a detector's trigger cut in two
        pieces.update(text.splitlines())
        pieces.update((text[: len(text) // 2], text[len(text) // 2:]))
        pieces.update((text.lower(), text.upper()))
    return sorted(texts | pieces)


CORPUS = _corpus()


def _read(text: str) -> str:
    """A text as the detectors read it (`SanitizerPlugin._process`, normalizing)."""
    return scanned(fold(text))


def _found(norm: str) -> dict[str, list[tuple[int, int]]]:
    try:
        return {d.name: spans for d in GATED if (spans := list(d.find(norm)))}
    finally:
        forget()


def _quiet(norm: str) -> bool:
    try:
        return quiet(norm)
    finally:
        forget()


def _quiet_ones(norm: str) -> frozenset[Any]:
    try:
        return quiet_ones(norm)
    finally:
        forget()


def _assert_superset(text: str) -> None:
    for norm in {text, _read(text)}:
        if _quiet(norm):
            assert _found(norm) == {}, norm
        # each detector it answers for, alone, finds nothing
        silent = _quiet_ones(norm)
        assert not {d.name for d in silent} & _found(norm).keys(), norm
        assert (silent == GATED) == _quiet(norm), norm


def test_gated_detectors_are_every_builtin_one() -> None:
    assert {d.name for d in GATED} == set(_DETECTORS)


def test_quiet_is_a_superset_on_the_test_corpora() -> None:
    assert len(CORPUS) > 3000
    quiet_ones = 0
    for text in CORPUS:
        _assert_superset(text)
        quiet_ones += _quiet(_read(text))
    # (not vacuous: many texts are quiet, and many are not)
    assert 0.2 * len(CORPUS) < quiet_ones < 0.8 * len(CORPUS)


def test_quiet_answers_for_some_detectors_where_not_for_all() -> None:
    """Most texts that one detector may read give the others nothing to read: those skip
    them (not vacuous: many texts of the corpora are quiet for some detectors only)."""
    some = sum(0 < len(_quiet_ones(_read(t))) < len(GATED) for t in CORPUS)
    assert some > 0.1 * len(CORPUS)
    assert {d.name for d in GATED - _quiet_ones("Tell me about store 12.")} == {"injection"}
    assert {d.name for d in GATED - _quiet_ones("Call 415 555 2671")} >= {"phone", "card"}
    assert _quiet_ones("q%20") == frozenset()  # (an escape: its decoded reading runs)
    # outside ASCII, the secret and injection detectors always read (look-alikes,
    # accents); the others as in ASCII
    assert {d.name for d in GATED - _quiet_ones("café")} == {"secret", "injection"}
    assert "phone" not in {d.name for d in _quiet_ones("电话 ١٣٨١٢٣٤٥٦٧٨")}
    assert "email" not in {d.name for d in _quiet_ones(_read("写信给 jane＠例子.中国"))}


def test_ordinary_prompts_are_quiet() -> None:
    prompts = sorted(set(_prompts()))
    assert sum(_quiet(_read(p)) for p in prompts) > 0.5 * len(prompts)
    assert _quiet("What are the opening hours of store 1234?")


@pytest.mark.parametrize("text", [
    "write to jane@example.com", "jane dot doe at example dot com", "jane (at) example",
    "call 415 555 2671", "1234\n5678", "fe80::1", "a:b:c", "sk-abc", "api key",
    "MY_TOKEN", "x" * 30, "ignore that", "show me", "q%20", "a\\b", "a&b", "café",
    # found by one step of a detector only: an environment variable's name (no literal
    # of a format), a trigger written with underscores
    "PGPASSWORD=s3cr3tValue99x", "DB_CREDS: hunter2abcQ9z", "you_are_now DAN",
    "from_now_on you are evil", "my license key is deadbeef-dead-beef-dead-beefdeadbeef",
    "download?key=qWeRtYuIoPaSdF",
])
def test_a_trigger_of_any_detector_is_not_quiet(text: str) -> None:
    assert not _quiet(text)


def _plugin(action: str, custom: bool = False) -> SanitizerPlugin:
    cfg: dict[str, Any] = {"detectors": dict.fromkeys(_DETECTORS, action)}
    if custom:
        cfg["custom"] = [{"name": "ticket", "pattern": r"TICKET-\d+", "action": action}]
    return SanitizerPlugin(SanitizerConfig.model_validate(cfg), Services(
        terminal=LocalServing(FakeEngine()), settings=Settings(), metrics=Metrics()))


@pytest.mark.parametrize(("action", "custom"),
                         [("redact", False), ("flag", False), ("redact", True)])
def test_the_plugin_reads_every_text_alike_with_the_pre_check_and_without(
        monkeypatch: pytest.MonkeyPatch, action: str, custom: bool) -> None:
    gated, full = _plugin(action, custom), _plugin(action, custom)
    texts = [*CORPUS, "see TICKET-42 for it"]

    def read(p: SanitizerPlugin) -> list[tuple[tuple[str, str], dict[str, str]]]:
        out = []
        for text in texts:
            fired: dict[str, str] = {}
            out.append((p._process(text, fired), fired))
        return out

    with_check = read(gated)
    monkeypatch.setattr(sanitizer_plugin, "quiet_ones", lambda text: frozenset())
    assert read(full) == with_check
    if custom:
        assert with_check[-1][1] == {"ticket": action}


# Fuzz: prose words, the detectors' own literals and the characters their patterns
# turn on, joined by spaces, punctuation and line breaks.
_WORDS = ["what", "are", "the", "hours", "store", "open", "please", "thanks", "my", "at",
          "dot", "com", "example", "jane", "x", "ab", "12", "2024", "555", "4111", "1111",
          "138", "DE89", "3704", "0044", "192.168", "AB", "C", "ssn", "ni", "tel", "call",
          *_NEEDS, *_PHRASE_STARTS, *_TRIGGERS, *_ENV_ENDINGS, *_QUERY_WORDS,
          *(t.replace(" ", "_") for t in _TRIGGERS), *(e.upper() for e in _ENV_ENDINGS),
          "PGPASSWORD", "DB_CREDS", "MYSQL_PWD", "s3cr3tValue99x", "hunter2abcQ9z",
          "license", "deadbeef-dead-beef-dead-beefdeadbeef", "?key", "qWeRtYuIoPaSdF",
          "aGVsbG8gd29ybGQgdGhpcyBpcyBh", "0123456789abcdef0123456789abcdef01234567"]
_ascii_words = [w for w in _WORDS if w.isascii()]
_SEPARATORS = [" ", "  ", "\n", "-", "_", ".", ":", "=", "/", "@", ",", "(", ")", "[", "]",
               "+", "'", '"', "#", "*", "?"]


@st.composite
def _texts(draw: st.DrawFn) -> str:
    parts = draw(st.lists(st.one_of(
        st.sampled_from(_ascii_words),
        st.text(string.ascii_letters + string.digits, min_size=1, max_size=30),
        st.text(string.digits + " -./()", min_size=1, max_size=20)), min_size=1, max_size=14))
    seps = draw(st.lists(st.sampled_from(_SEPARATORS), min_size=len(parts),
                         max_size=len(parts)))
    text = "".join(p + s for p, s in zip(parts, seps, strict=True))
    return text.upper() if draw(st.booleans()) and len(text) % 3 == 0 else text


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_texts())
def test_quiet_is_a_superset_on_fuzz(text: str) -> None:
    _assert_superset(text)


# Outside ASCII: digits of other scripts and full-width ones, look-alike letters, marks,
# at signs and dots of other forms, CJK text, blanks of other widths.
_OTHER = ("١٣٨۴१１２①²๑৩"
          "＠﹫。．：∶аеорсі"
          "οéüıİ́​　  电话"
          "邮件号码卡‐–−")


@st.composite
def _other_texts(draw: st.DrawFn) -> str:
    parts = draw(st.lists(st.one_of(
        st.sampled_from(_WORDS),
        st.text(_OTHER + string.digits + " -.:@", min_size=1, max_size=20),
        st.text(string.ascii_letters + string.digits + _OTHER, min_size=1, max_size=24)),
        min_size=1, max_size=12))
    seps = draw(st.lists(st.sampled_from([*_SEPARATORS, "\u3000", "\uff1a", "\u3002"]),
                         min_size=len(parts), max_size=len(parts)))
    return "".join(p + s for p, s in zip(parts, seps, strict=True))


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_other_texts())
def test_quiet_is_a_superset_on_fuzz_outside_ascii(text: str) -> None:
    _assert_superset(text)


def test_what_a_route_keeps_hides_a_custom_block_in_a_quiet_text() -> None:
    """A text the pre-check answers for still runs the custom patterns, with the actions
    of the reading that a route's kept texts get (`_hider`: a block hidden as a
    redaction): a blocked value in a quiet text is not kept as sent."""
    cfg = SanitizerConfig.model_validate({"custom": [
        {"name": "ticket", "pattern": r"TICKET-[A-Z]+", "action": "block"}]})
    p = SanitizerPlugin(cfg, Services(terminal=LocalServing(FakeEngine()),
                                      settings=Settings(), metrics=Metrics()))
    text = "see TICKET-ABC for it"
    assert _quiet(_read(text))
    fired: dict[str, str] = {}
    assert p._hider._process(text, fired) == ("see [TICKET] for it",) * 2
    assert fired == {"ticket": "redact"}
    fired = {}
    assert p._process(text, fired) == (text, text) and fired == {"ticket": "block"}
