"""Countdown's world: constants, the episode state, the task hash and the calc distance the
dynamics' process reward uses."""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from rl4agents import text
from rl4agents.envs import base

SPLITS = base.SPLITS
OPS = ("+", "-", "*")
EMPTY = -1  # a used slot of `CountdownState.numbers`
_MAX_NUMBERS = 5  # d(s) enumerates every calc sequence; 5 numbers is ~20k leaf multisets
_LINE = 6  # fragment slots of an observation's first line ("a op b = r\n")


CountdownParams = base.SplitParams


@flax.struct.dataclass
class CountdownState:
    """One episode's state."""

    numbers: jax.Array  # int32[N] numbers held, ascending, then EMPTY for used slots
    target: jax.Array  # int32[] the number to build
    done: jax.Array  # bool[] answered


def canonical(numbers: jax.Array) -> jax.Array:
    """Sort the numbers held ascending with EMPTY slots last.

    Args:
      numbers: int32[..., N] numbers, EMPTY (-1) for used slots, in any order.

    Returns:
      int32[..., N] the same multiset, ascending, EMPTY slots at the end.
    """
    big = jnp.iinfo(jnp.int32).max
    ordered = jnp.sort(jnp.where(numbers < 0, big, numbers), axis=-1)
    return jnp.where(ordered == big, EMPTY, ordered).astype(jnp.int32)


def task_hash(numbers: jax.Array, target: jax.Array) -> jax.Array:
    """uint32[] hash of a task: canonical starting numbers int32[N] and target int32[]."""
    return text.hash_u32(jnp.concatenate([canonical(numbers), jnp.reshape(target, (1,))]))


def _children(
    states: jax.Array, valid: jax.Array, slots: int, max_value: int
) -> tuple[jax.Array, jax.Array]:
    """Every multiset one calc away.

    Args:
      states: int32[S, N] canonical multisets whose numbers all lie in the first `slots` slots.
      valid: bool[S] which rows are real states.
      slots: static number of leading slots to pair up.
      max_value: largest allowed result.

    Returns:
      children int32[S * P * 3, N] (canonical; P = slots choose 2 pairs, 3 operations each)
      and bool[S * P * 3] which children are real (live parent, both operands held, in range).
    """
    n = states.shape[1]
    pairs = np.array([(i, j) for i in range(slots) for j in range(i + 1, slots)], np.int32)
    a, b = states[:, pairs[:, 0]], states[:, pairs[:, 1]]  # [S, P], a <= b (canonical)
    results = jnp.stack([a + b, jnp.abs(a - b), a * b], axis=-1)  # [S, P, 3]
    ok = valid[:, None, None] & ((a >= 0) & (b >= 0))[..., None] & (results <= max_value)
    cols = np.arange(n)
    first = (cols[None, :] == pairs[:, :1])[None, :, None, :]  # [1, P, 1, N]
    second = (cols[None, :] == pairs[:, 1:])[None, :, None, :]
    child = jnp.where(first, results[..., None], jnp.where(second, EMPTY, states[:, None, None]))
    return canonical(child).reshape(-1, n), ok.reshape(-1)


def calc_distance(numbers: jax.Array, target: jax.Array, max_value: int) -> jax.Array:
    """Fewest calcs after which the target is among the numbers held.

    Enumerates every calc sequence (fixed shapes; about 20k multisets for 5 numbers).

    Args:
      numbers: int32[N] canonical numbers held (EMPTY for used slots).
      target: int32[] target.
      max_value: largest allowed result (static).

    Returns:
      int32[] 0 if the target is held, k if k calcs can make it, N if no sequence can.
    """
    n = numbers.shape[0]
    hits = [jnp.any(numbers == target)]
    frontier, valid = numbers[None], jnp.ones((1,), bool)
    for level in range(n - 1):
        frontier, valid = _children(frontier, valid, n - level, max_value)
        hits.append(jnp.any(valid & jnp.any(frontier == target, axis=1)))
    hits = jnp.stack(hits)
    return jnp.where(hits.any(), jnp.argmax(hits), n).astype(jnp.int32)
