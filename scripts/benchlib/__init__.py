"""Benchmark jobs: the peers' tokenizers and environments in rl4agents terms (scripts/bench.py).

Benchmark harness code, kept out of the `rl4agents` package: the scripts in `scripts/` import it
as `benchlib` (their own folder is on `sys.path`). Nothing here is registered in the global
environment registry.
"""
