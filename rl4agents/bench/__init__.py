"""Benchmark jobs: the peers' tokenizers and environments in rl4agents terms (scripts/bench.py).

Nothing here is registered in the global environment registry.
"""
