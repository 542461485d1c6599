"""Reward shaping applied before credit assignment (docs/methods.md, "DAPO overlong shaping")."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def overlong_penalty(length: jax.Array, max_len: int, buffer: int, factor: float) -> jax.Array:
    """DAPO soft overlong punishment (verl `DAPORewardManager`).

    See docs/methods.md, "DAPO overlong shaping".

    With `L_exp = max_len - buffer`,
      `r_overlong(L) = min(-(L - L_exp) / buffer * factor, 0)`:
    zero up to `L_exp`, then linear down to `-factor` at `L = max_len`. Lengths beyond
    `max_len` (possible when a whole multi-turn trajectory is measured) keep decreasing
    linearly; clip `length` to `max_len` first for a floor of `-factor`. Add the result to the
    outcome reward. DAPO https://arxiv.org/abs/2503.14476 (defaults `max_len = 20480`,
    `buffer = 4096`, `factor = 1.0`).

    Args:
      length: int[...] response (or trajectory) lengths in tokens, any shape.
      max_len: `L_max`, the maximum response length.
      buffer: `L_buf`, the punishment interval, `0 < buffer <= max_len`.
      factor: penalty at `L = max_len` (verl `penalty_factor`).

    Returns:
      f32[...] non-positive penalty, same shape as `length`.

    Raises:
      ValueError: `buffer <= 0` or `buffer > max_len`.
    """
    if buffer <= 0 or buffer > max_len:
        raise ValueError(
            f"overlong buffer must satisfy 0 < buffer <= max_len, got {buffer=}, {max_len=}"
        )
    expected = max_len - buffer
    excess = jnp.asarray(length).astype(jnp.float32) - expected
    return jnp.minimum(-excess / buffer * factor, 0.0)
