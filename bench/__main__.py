"""`python -m bench [--quick] [--only NAME ...] [--model ID] [--engine KEY=VALUE ...]`

Runs the benchmarks against one fleet of servers (bench/fleet.py), started once and
shared by the suites, and writes bench/results/ (run.json: what ran and how long) and
the README's benchmark section; `--quick` writes bench/results/quick/ and leaves the
README alone.
On a GPU machine: `python -m bench --model meta-llama/Llama-3.1-8B-Instruct
--engine dtype=bfloat16 --engine gpu_memory_utilization=0.85 --engine max_model_len=8192`.
"""

from __future__ import annotations

import argparse
import importlib
import time
from typing import Any

import yaml

from bench import SUITES
from bench.fleet import DEFAULT_ENGINE, Fleet, engine_for
from bench.procs import RESULTS
from bench.report import update_readme, use_results_dir, write


def engine_setting(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), yaml.safe_load(value)


def engine_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The fleet's engine: the embedded default's, changed by --model, --served-model-name
    and --engine (in that order)."""
    engine = dict(DEFAULT_ENGINE)
    if args.model:
        engine = engine_for(args.model, args.served_model_name)
    elif args.served_model_name:
        engine["served_model_name"] = args.served_model_name
    engine.update(dict(args.engine))
    return engine


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench")
    parser.add_argument("--quick", action="store_true", help="smaller, faster run")
    parser.add_argument("--only", nargs="*", choices=SUITES, help="suites to run")
    parser.add_argument("--model", help="engine model: builtin:smollm2 (a real small model "
                        "on CPU), a Hugging Face id or a local path (default: builtin:demo, "
                        "the generated CPU model)")
    parser.add_argument("--served-model-name", help="the name clients send as `model`")
    parser.add_argument("--engine", action="append", type=engine_setting, default=[],
                        metavar="KEY=VALUE", help="an engine setting (Weir's engine keys, "
                        "which are vLLM's own names), for both Weir and vLLM's server")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    engine = engine_settings(args)
    suites = args.only or list(SUITES)
    if args.quick:
        use_results_dir(RESULTS / "quick")
    timings: dict[str, float] = {}
    start = time.monotonic()
    with Fleet(quick=args.quick, engine=engine) as fleet:
        for name in suites:
            t = time.monotonic()
            print(f"== {name}", flush=True)
            importlib.import_module(f"bench.{name}").run(fleet)
            timings[name] = round(time.monotonic() - t, 1)
            print(f"== {name}: {timings[name]:.0f}s", flush=True)
        starts = {s.name: round(s.ready_after_s, 1) for s in fleet.retired + fleet.started}
    total = round(time.monotonic() - start, 1)
    print(f"== total: {total:.0f}s", flush=True)
    if args.only:
        return 0  # a partial run: the record of the last whole run stays
    write("run", {"quick": args.quick, "suites": suites, "engine": engine,
                  "seconds": {"total": total, "per_suite": timings,
                              "server_start_to_ready": starts}},
          f"Benchmark run ({'quick' if args.quick else 'full'}): {total:.0f} s in all; "
          + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()) + " (suite times "
          "include the servers each one started first).")
    if not args.quick:
        update_readme()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
