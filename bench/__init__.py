"""Weir's benchmarks against its peers (`python -m bench`; see bench/__main__.py)."""

# The suites of a run, in the order they run; each is the module `bench.<name>` with a
# `run(fleet)`, and each is its own tenant in the fleet's Weir servers (bench/fleet.py).
SUITES = ("table", "serving", "cache", "surge", "sanitizer", "overhead", "real_model")
