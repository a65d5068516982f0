"""The real vLLM engine, driven through Weir's engine layer (below the parser, so values
the parser now refuses can still be sent): a request the engine refuses is always
released. A seed of 2**64 passes vLLM's own checks, is registered, and then fails in the
transport to the engine process; it used to stay counted as running for good (issue 16)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def seen() -> dict[str, Any]:
    run = subprocess.run([sys.executable, "-m", "tests.e2e.engine_probe"], cwd=ROOT,
                         capture_output=True, text=True, timeout=400)
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith("PROBE ")]
    assert run.returncode == 0 and lines, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads(lines[-1][len("PROBE "):])  # type: ignore[no-any-return]


def test_refused_seeds_are_released(seen: dict[str, Any]) -> None:
    for step in seen["bad_seed"]:
        assert step["error"] is not None  # the engine refused it ...
        assert step["running"] == 0  # ... and nothing stays running


def test_grammar_refusal_is_clean_and_released(seen: dict[str, Any]) -> None:
    err = seen["bad_schema"]["error"]
    assert err.startswith("EngineRejected: ") and "nonsense" in err
    assert ".cc" not in err and "/project" not in err
    assert seen["bad_schema"]["running"] == 0


def test_closed_generation_is_released_and_the_engine_still_serves(
        seen: dict[str, Any]) -> None:
    assert seen["closed_early_running"] == 0
    assert seen["fine"] == {"finished": True, "running": 0}


def test_a_whole_answer_cut_while_running_reports_what_it_generated(
        seen: dict[str, Any]) -> None:
    """What the rate limiter charges a cut non-streamed request: vLLM handed nothing over
    (final output only), so the engine reads the tokens its two choices had generated."""
    assert 10 <= seen["cut_whole"]["generated"] <= 400
    assert seen["cut_whole"]["running"] == 0


def test_a_whole_answer_under_way_tells_the_tokens_it_has_made(seen: dict[str, Any]) -> None:
    """What the breaker asks of a whole answer past `slow_call_s` (it tells no token until
    its end): an engine at work says it has made some; of a request it no longer holds,
    it cannot say."""
    assert 10 <= seen["cut_whole"]["progress_while_running"] <= 400
    assert seen["cut_whole"]["progress_after"] is None  # (it cannot say: not taken for 0)



def test_what_a_cut_request_generated_counts_choices_that_ended_already(
        seen: dict[str, Any]) -> None:
    """n > 1: vLLM drops a choice's state when it ends and keeps its output on the parent
    (final outputs only); the cut counts both, each parent once (read on stand-ins of
    vLLM's state, in the probe)."""
    assert seen["generated_parts"] == {"both": 30 + 12 + 400, "unknown": 0, "elsewhere": 0}


def test_a_cut_landing_as_the_final_output_arrives_counts_it(seen: dict[str, Any]) -> None:
    """The final output is in hand (its task done) when the cut reaches the caller: vLLM
    has dropped the request's state by then, so the output's own tokens are counted."""
    assert seen["cut_at_the_end"] == 12
