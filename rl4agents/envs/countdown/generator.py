"""Countdown task generation in JAX: random starting numbers combined by random calcs, so
every task is solvable; the first candidate of the split's class is kept."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np

from rl4agents.envs import base
from rl4agents.envs.countdown.solver import reachable
from rl4agents.envs.countdown.world import EMPTY, canonical, task_hash

_MAX_ROUNDS = 16


def bits_per_candidate(num_numbers: int) -> int:
    """Random uint32 words `candidate` consumes."""
    n = num_numbers
    return n + 3 * (n - 1)


def candidate(bits: jax.Array, config) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One random task by combining all starting numbers (may not qualify).

    Args:
      bits: uint32[bits_per_candidate(N)] random bits.
      config: the env's `CountdownConfig`.

    Returns:
      (start int32[N] canonical starting numbers, target int32[], in_range bool[] every
      intermediate result was at most max_value).
    """
    n, c = config.num_numbers, config
    numbers = (1 + bits[:n] % c.max_start).astype(jnp.int32)
    start = numbers
    slots = jnp.arange(n)
    in_range = jnp.ones((), bool)
    # Selects and masked sums instead of gathers and scatters: the same values, and it
    # compiles several times faster inside the vmapped while_loop.
    for k in range(n - 1):
        live = n - k  # live numbers occupy slots [0, live)
        pick = bits[n + 3 * k : n + 3 * k + 3]
        i = (pick[0] % live).astype(jnp.int32)
        j = (pick[1] % (live - 1)).astype(jnp.int32)
        j = j + (j >= i)
        x = jnp.sum(jnp.where(slots == i, numbers, 0))
        y = jnp.sum(jnp.where(slots == j, numbers, 0))
        op = pick[2] % 3
        result = jnp.where(op == 0, x + y, jnp.where(op == 1, jnp.abs(x - y), x * y))
        in_range = in_range & (result <= c.max_value)
        # lo <- result, hi <- the last live number, the last live slot <- EMPTY (lo < hi).
        lo, hi = jnp.minimum(i, j), jnp.maximum(i, j)
        moved = jnp.where(slots == hi, numbers[live - 1], numbers)
        moved = jnp.where(slots == live - 1, EMPTY, moved)
        numbers = jnp.where(slots == lo, result, moved)
    return canonical(start), numbers[0], in_range


def generate(
    key: jax.Array, split: jax.Array, config, in_split, fallback: tuple[np.ndarray, int]
) -> tuple[jax.Array, jax.Array]:
    """(int32[N] starting numbers, int32[] target) of the split's class (`_MAX_ROUNDS`
    rounds of `num_candidates` candidates; `fallback` if none qualifies).

    `config` is the env's `CountdownConfig`, `in_split(task_hash, split)` its split predicate.
    """
    c = config

    def _qualifies(start, target, in_range):
        fits = in_range & (target >= c.min_target) & (target <= c.max_value)
        in_class = in_split(task_hash(start, target), split)
        return fits & ~jnp.any(start == target) & in_class

    def _candidates(bits):
        start, target, in_range = jax.vmap(lambda b: candidate(b, c))(bits)
        return (start, target), jax.vmap(_qualifies)(start, target, in_range)

    fallback_numbers, fallback_target = fallback
    return base.first_qualifying(
        key,
        _candidates,
        (jnp.asarray(fallback_numbers, jnp.int32), jnp.asarray(fallback_target, jnp.int32)),
        num_candidates=c.num_candidates,
        bits_per_candidate=bits_per_candidate(c.num_numbers),
        max_rounds=_MAX_ROUNDS,
    )


def find_fallback(config) -> tuple[np.ndarray, int]:
    """A fixed solvable task for the astronomically rare exhausted generation (host side);
    raises ValueError when no target in range is reachable."""
    c = config
    n = c.num_numbers
    tries = itertools.islice(
        itertools.combinations_with_replacement(range(c.max_start, 0, -1), n), 200
    )
    for numbers in tries:
        targets = [
            v
            for v in reachable(numbers, c.max_value)
            if c.min_target <= v <= c.max_value and v not in numbers
        ]
        if targets:
            return np.array(sorted(numbers), np.int32), max(targets)
    raise ValueError(
        f"no task with a target in [min_target={c.min_target}, max_value="
        f"{c.max_value}] is reachable from {n} numbers in 1..{c.max_start}; "
        "lower min_target or raise max_value / max_start"
    )
