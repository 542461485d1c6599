"""Shared helpers for credit assignment (methods.md section 1.2).

All functions are pure and jit/vmap-able. Group statistics use `jax.ops.segment_sum` with the
static `num_segments = B`; group ids are first remapped to dense ids in `[0, B)` so that any
int32 task id works.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from rl4agents.types import Trajectory

WHITEN_EPS = 1e-8  # verl masked_mean / masked_whiten constant


def dense_group_ids(group_ids: jax.Array) -> jax.Array:
    """Remap arbitrary int ids to dense ids in `[0, B)` (rank of the id among distinct ids).

    Args:
      group_ids: int32[B] group (task) ids.

    Returns:
      int32[B] ids, equal exactly where the inputs are equal, all in `[0, B)`.
    """
    chex.assert_rank(group_ids, 1)
    order = jnp.argsort(group_ids)
    sorted_ids = group_ids[order]
    is_new = jnp.concatenate([jnp.zeros(1, jnp.int32), (sorted_ids[1:] != sorted_ids[:-1])])
    return jnp.zeros_like(order).at[order].set(jnp.cumsum(is_new)).astype(jnp.int32)


def group_stats(
    x: jax.Array, group_ids: jax.Array, ddof: int = 1
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Mean, std and size of each element's group, gathered back per element.

    `mean_g = sum_{j in g} x_j / |g|`, `std_g = sqrt(sum_{j in g}(x_j - mean_g)^2 / (|g| - ddof))`.
    Groups with `|g| <= ddof` (torch returns NaN) get std 0; callers apply the singleton policy.

    Args:
      x: f32[B] per-episode scalars.
      group_ids: int32[B] group ids (any values; remapped with `dense_group_ids`).
      ddof: delta degrees of freedom; 1 = Bessel correction as in verl and TRL.

    Returns:
      (mean f32[B], std f32[B], count f32[B]).
    """
    chex.assert_rank(x, 1)
    chex.assert_equal_shape([x, group_ids])
    ids = dense_group_ids(group_ids)
    size = ids.shape[0]
    counts = jax.ops.segment_sum(jnp.ones_like(x), ids, num_segments=size)
    means = jax.ops.segment_sum(x, ids, num_segments=size) / jnp.maximum(counts, 1.0)
    sq = jax.ops.segment_sum(jnp.square(x - means[ids]), ids, num_segments=size)
    dof = counts - ddof
    var = jnp.where(dof > 0, sq / jnp.where(dof > 0, dof, 1.0), 0.0)
    return means[ids], safe_sqrt(var)[ids], counts[ids]


def group_mean(x: jax.Array, group_ids: jax.Array) -> jax.Array:
    """f32[B] mean of `x f32[B]` over each element's group (see `group_stats`)."""
    return group_stats(x, group_ids)[0]


def group_std(x: jax.Array, group_ids: jax.Array, ddof: int = 1) -> jax.Array:
    """f32[B] std (unbiased by default) of `x f32[B]` over each element's group.

    Groups with `|g| <= ddof` get 0 (see `group_stats`).
    """
    return group_stats(x, group_ids, ddof)[1]


def safe_sqrt(x: jax.Array) -> jax.Array:
    """sqrt with a zero (not NaN/inf) gradient at 0."""
    positive = x > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, x, 1.0)), 0.0)


def masked_mean(x: jax.Array, mask: jax.Array, axis=None) -> jax.Array:
    """Mean of `x` over `mask`; 0 where the mask is empty.

    Args:
      x: f32[...] values.
      mask: bool[...] (same shape) entries to average.
      axis: axes to reduce (None = all).

    Returns:
      `sum(x * m) / max(sum(m), 1)` reduced over `axis`.
    """
    chex.assert_equal_shape([x, mask])
    m = mask.astype(x.dtype)
    return jnp.sum(x * m, axis=axis) / jnp.maximum(jnp.sum(m, axis=axis), 1.0)


def masked_whiten(x: jax.Array, mask: jax.Array, shift_mean: bool = True) -> jax.Array:
    """Whiten `x` with the mean/unbiased variance of its masked entries (verl `masked_whiten`).

    `mu = sum(m x) / (sum m + 1e-8)`, `var = sum(m (x - mu)^2) / (sum m + 1e-8) * n / (n - 1)`
    with `n = sum m`, result `(x - mu) * rsqrt(var + 1e-8)` (`+ mu` if not `shift_mean`).
    Statistics are one scalar over all masked entries of the whole array. verl raises when
    `n <= 1`; under jit we cannot, so the Bessel factor is taken as 1 there (a single masked
    entry whitens to 0). Entries off the mask are transformed too; callers mask the result.

    Args:
      x: f32[...] values, e.g. f32[B, T] advantages.
      mask: bool[...] (same shape) entries that define the statistics.
      shift_mean: if False, add the mean back after scaling (verl flag).

    Returns:
      f32[...] whitened values, same shape as `x`.
    """
    chex.assert_equal_shape([x, mask])
    m = mask.astype(x.dtype)
    n = jnp.sum(m)
    mean = jnp.sum(x * m) / (n + WHITEN_EPS)
    var = jnp.sum(jnp.square(x - mean) * m) / (n + WHITEN_EPS)
    var = var * jnp.where(n > 1, n / jnp.where(n > 1, n - 1.0, 1.0), 1.0)
    out = (x - mean) * jax.lax.rsqrt(var + WHITEN_EPS)
    return out if shift_mean else out + mean


def broadcast_to_tokens(per_episode: jax.Array, action_mask: jax.Array) -> jax.Array:
    """Broadcast a per-episode scalar to its action tokens: `A[:, None] * action_mask`.

    Args:
      per_episode: f32[B] one value per episode.
      action_mask: bool[B, T] tokens sampled by the policy.

    Returns:
      f32[B, T] the episode's value on its action tokens, 0 elsewhere.
    """
    chex.assert_rank([per_episode, action_mask], [1, 2])
    chex.assert_equal_shape_prefix([per_episode, action_mask], 1)
    return per_episode[:, None] * action_mask.astype(per_episode.dtype)


def token_rewards(traj: Trajectory, placement: str = "turn") -> jax.Array:
    """Place rewards on the action-token slots of a trajectory.

    `"turn"`: each valid turn's `turn_rewards[b, k]` at slot `turn_end[b, k]` (the last action
    token of the turn). `"outcome"`: `outcome_reward[b]` at the last valid `turn_end`. Turns
    with `turn_valid = False` or `turn_end = -1` place nothing.

    Args:
      traj: Trajectory with B episodes, T slots, K turns.
      placement: "turn" or "outcome".

    Returns:
      f32[B, T] token rewards, nonzero only on turn-end slots.
    """
    batch, slots = traj.tokens.shape
    chex.assert_shape([traj.turn_end, traj.turn_rewards, traj.turn_valid], (batch, None))
    valid = traj.turn_valid & (traj.turn_end >= 0)
    if placement == "turn":
        slot = jnp.where(valid, traj.turn_end, slots)  # out-of-range slots are dropped
        vals = jnp.where(valid, traj.turn_rewards, 0.0).astype(jnp.float32)
    elif placement == "outcome":
        last = jnp.max(jnp.where(valid, traj.turn_end, -1), axis=1)
        slot = jnp.where(last >= 0, last, slots)[:, None]
        vals = traj.outcome_reward.astype(jnp.float32)[:, None]
    else:
        raise ValueError(f"unknown reward placement {placement!r}; allowed: ['turn', 'outcome']")
    rows = jnp.broadcast_to(jnp.arange(batch)[:, None], slot.shape)
    return jnp.zeros((batch, slots), jnp.float32).at[rows, slot].add(vals, mode="drop")
