"""`python -m bench [--quick] [--only NAME ...]`: run the benchmarks, write bench/results/."""

from __future__ import annotations

import argparse
import importlib
import time

SUITES = ["table", "serving", "cache", "surge", "sanitizer"]


def main() -> int:
    parser = argparse.ArgumentParser(prog="bench")
    parser.add_argument("--quick", action="store_true", help="smaller, faster run")
    parser.add_argument("--only", nargs="*", choices=SUITES, help="suites to run")
    args = parser.parse_args()
    for name in args.only or SUITES:
        start = time.monotonic()
        print(f"== {name}", flush=True)
        importlib.import_module(f"bench.{name}").run(quick=args.quick)
        print(f"== {name}: {time.monotonic() - start:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
