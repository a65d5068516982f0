"""Write benchmark results: JSON with every figure, and a markdown table."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path
from typing import Any

import psutil

from bench.procs import RESULTS


def machine() -> dict[str, Any]:
    return {"cpus": psutil.cpu_count(), "memory_gib": round(psutil.virtual_memory().total / 2**30),
            "python": platform.python_version(), "platform": platform.platform()}


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def write(name: str, data: dict[str, Any], table: str) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    data = {"benchmark": name, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": machine(), **data}
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    (RESULTS / f"{name}.md").write_text(table + "\n")
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
