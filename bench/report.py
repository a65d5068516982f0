"""Write benchmark results: JSON with every figure, a markdown table, and the README's
benchmark section, rendered from those tables (a test keeps the README in step)."""

from __future__ import annotations

import json
import platform
import re
import time
from pathlib import Path
from typing import Any

import psutil

from bench.procs import RESULTS, ROOT

# A full run writes bench/results/ (what the README shows); --quick writes a folder of
# its own inside it, so a smoke run never replaces the figures the README cites.
_OUT = [RESULTS]
README = ROOT / "README.md"
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
SECTIONS = [
    ("table", "**Headline** (`bench/table.py`; `latency_cdf.png`, `throughput_sweep.png`):"),
    ("serving", "**Serving** (`bench/serving.py`, Weir against vLLM's OpenAI server):"),
    ("cache", "**Cache hits** (`bench/cache.py`, against LiteLLM's proxy with its Redis "
              "cache):"),
    ("surge", "**Surge** (`bench/surge.py`, three times capacity):"),
    ("sanitizer", "**Sanitizer** (`bench/sanitizer.py`):"),
    ("overhead", "**Gateway overhead** (`bench/overhead.py`; vLLM's own client for the "
                 "engine path):"),
    ("real_model", "**A real model** (`bench/real_model.py`, SmolLM2-135M-Instruct, its own "
                   "answer lengths):"),
    ("run", "**This run** (`bench/results/run.json`):"),
]


def use_results_dir(path: Path) -> None:
    _OUT[0] = path


def results_dir() -> Path:
    _OUT[0].mkdir(parents=True, exist_ok=True)
    return _OUT[0]


def machine() -> dict[str, Any]:
    return {"cpus": psutil.cpu_count(), "memory_gib": round(psutil.virtual_memory().total / 2**30),
            "python": platform.python_version(), "platform": platform.platform()}


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def write(name: str, data: dict[str, Any], table: str) -> Path:
    out = results_dir()
    data = {"benchmark": name, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": machine(), **data}
    path = out / f"{name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    (out / f"{name}.md").write_text(table + "\n")
    return path


def md_table(headers: list[str], rows: list[list[Any]]) -> str:
    def fmt(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:,.2f}"
        return str(v)

    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(out)


def readme_section(results: Path = RESULTS) -> str:
    """The README's benchmark figures: every suite's table from a full run's results."""
    parts = []
    for name, title in SECTIONS:
        md = results / f"{name}.md"
        if md.exists():
            parts.append(f"{title}\n\n{md.read_text().strip()}")
    return "\n\n".join(parts)


def readme_with_results(text: str, results: Path = RESULTS) -> str:
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise ValueError(f"README has no {BEGIN} ... {END} section")
    return pattern.sub(lambda _: f"{BEGIN}\n{readme_section(results)}\n{END}", text)


def update_readme() -> None:
    README.write_text(readme_with_results(README.read_text()))
