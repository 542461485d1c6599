"""Shared helpers for credit assignment.

The conventions they implement: docs/methods.md, "Conventions shared by all credit estimators".

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
    A group whose values are all equal gets exactly that value as its mean and std 0 (see
    `weighted_group_stats`).

    Args:
      x: f32[B] per-episode scalars.
      group_ids: int32[B] group ids (any values; remapped with `dense_group_ids`).
      ddof: delta degrees of freedom; 1 = Bessel correction as in verl and TRL.

    Returns:
      (mean f32[B], std f32[B], count f32[B]).
    """
    chex.assert_rank(x, 1)
    chex.assert_equal_shape([x, group_ids])
    return weighted_group_stats(x, dense_group_ids(group_ids), jnp.ones_like(x), ddof)


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


def trainable_episodes(traj: Trajectory) -> jax.Array:
    """bool[B]: the episode has at least one action token, i.e. something to train on.

    An episode without one (a slot dynamic sampling left empty, an episode cut before its
    first action) is not a sample of the policy: group and batch statistics give it weight 0,
    so it cannot shift its siblings' baseline or scale (OpenRLHF counted such fully masked
    samples in the group's mean and std).
    """
    return jnp.any(traj.action_mask, axis=1)


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


def scatter_rows(
    index: jax.Array, values: jax.Array, length: int, add: bool = True, dtype=jnp.float32
) -> jax.Array:
    """`out[b, index[b, j]] (+)= values[b, j]` into zeros of [B, length]; indices >= length
    are dropped (negative ones in [-length, -1] wrap, as NumPy indexing).

    Args:
      index: int32[B, J] slots per row.
      values: [B, J] (or broadcastable) values.
      length: slots per row of the output.
      add: add the values (repeated slots sum) or set them.
      dtype: dtype of the output.

    Returns:
      [B, length] of `dtype`. One scatter per row (vmapped): a scatter indexed by (row, slot)
      pairs makes a batch-sharded program gather the whole batch on every device.
    """
    values = jnp.broadcast_to(values, index.shape).astype(dtype)

    def one(i, v):
        z = jnp.zeros((length,), dtype)
        return z.at[i].add(v, mode="drop") if add else z.at[i].set(v, mode="drop")

    return jax.vmap(one)(index, values)


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
    return scatter_rows(slot, vals, slots)


# ---- step-level helpers (a "step" is a valid turn (b, k) of the slot layout) ----------------


def episode_scores(traj: Trajectory) -> jax.Array:
    """Per-episode score `s_i = outcome_reward_i - sum_t token_penalty_{i,t}`.

    The token penalty (e.g. KL in the reward: docs/methods.md, "KL in the loss vs in the
    reward") is only subtracted when the trajectory carries one; verl's outcome estimators sum
    the token-level rewards likewise.

    Returns:
      f32[B] scores.
    """
    score = traj.outcome_reward.astype(jnp.float32)
    if traj.token_penalty is not None:
        penalty = jnp.where(traj.action_mask, traj.token_penalty, 0.0)
        score = score - jnp.sum(penalty, axis=1)
    return score


def penalised_token_rewards(traj: Trajectory, placement: str) -> jax.Array:
    """`token_rewards(traj, placement)` minus `traj.token_penalty` on action slots. f32[B, T]."""
    rewards = token_rewards(traj, placement)
    if traj.token_penalty is not None:
        rewards = rewards - jnp.where(traj.action_mask, traj.token_penalty, 0.0)
    return rewards


def penalised_turn_rewards(traj: Trajectory) -> jax.Array:
    """`turn_rewards` minus each turn's summed `token_penalty` (KL in the reward). f32[B, K]."""
    rewards = traj.turn_rewards.astype(jnp.float32)
    if traj.token_penalty is None:
        return rewards
    penalty, _, _ = turn_token_stats(traj.token_penalty, traj)
    return rewards - penalty


def weighted_group_stats(
    x: jax.Array, ids: jax.Array, weights: jax.Array, ddof: int = 1
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Weighted mean, std and total weight of each element's group, gathered per element.

    `W_g = sum_{j in g} w_j`, `mean_g = sum w x / W_g`,
    `std_g = sqrt(sum w (x - mean_g)^2 / (W_g - ddof))`; 0 where `W_g <= ddof`. Integer
    weights reproduce statistics over repeated rows (e.g. verl-agent's step rows), and weight 0
    removes an element from the statistics (its own outputs are still defined).

    Args:
      x: f32[N] values.
      ids: int32[N] dense group ids in `[0, N)` (see `dense_group_ids`, `dense_pair_ids`).
      weights: f32[N] non-negative weights.
      ddof: delta degrees of freedom.

    Returns:
      (mean f32[N], std f32[N], total weight f32[N]).
    """
    chex.assert_rank([x, ids, weights], 1)
    chex.assert_equal_shape([x, ids, weights])
    n = x.shape[0]
    w = weights.astype(jnp.float32)
    x = x.astype(jnp.float32)
    total = jax.ops.segment_sum(w, ids, num_segments=n)
    mean = jax.ops.segment_sum(w * x, ids, num_segments=n) / jnp.where(total > 0, total, 1.0)
    # A tie must centre to exactly 0: a float32 mean of equal values such as 0.9 can be off by
    # an ulp, which a std of ~1e-7 plus eps 1e-6 would blow up to a same-sign advantage.
    present = w > 0
    hi = jax.ops.segment_max(jnp.where(present, x, -jnp.inf), ids, num_segments=n)
    lo = jax.ops.segment_min(jnp.where(present, x, jnp.inf), ids, num_segments=n)
    mean = jnp.where(hi == lo, lo, mean)
    sq = jax.ops.segment_sum(w * jnp.square(x - mean[ids]), ids, num_segments=n)
    dof = total - ddof
    var = jnp.where(dof > 0, sq / jnp.where(dof > 0, dof, 1.0), 0.0)
    return mean[ids], safe_sqrt(var)[ids], total[ids]


def dense_pair_ids(a: jax.Array, b: jax.Array) -> jax.Array:
    """Dense ids in `[0, N)` for pairs `(a_n, b_n)`: equal exactly where both entries are equal.

    Args:
      a: int[N] first key (e.g. group ids).
      b: int/uint[N] second key (e.g. anchors or turn indices).

    Returns:
      int32[N] dense ids.
    """
    chex.assert_rank([a, b], 1)
    chex.assert_equal_shape([a, b])
    order = jnp.lexsort((b, a))
    sa, sb = a[order], b[order]
    is_new = jnp.concatenate([jnp.zeros(1, bool), (sa[1:] != sa[:-1]) | (sb[1:] != sb[:-1])])
    return jnp.zeros(a.shape, jnp.int32).at[order].set(jnp.cumsum(is_new).astype(jnp.int32))


def turns_to_tokens(per_turn: jax.Array, traj: Trajectory) -> jax.Array:
    """Broadcast per-turn values to the turn's action tokens.

    Args:
      per_turn: f32[B, K] one value per (episode, turn).
      traj: Trajectory whose `turn_ids` / `action_mask` locate each turn's action tokens.

    Returns:
      f32[B, T]: `per_turn[b, turn_ids[b, t]]` on action slots, 0 elsewhere.
    """
    chex.assert_rank(per_turn, 2)
    chex.assert_equal_shape_prefix([per_turn, traj.tokens], 1)
    idx = jnp.clip(traj.turn_ids, 0, per_turn.shape[1] - 1)
    vals = jnp.take_along_axis(per_turn, idx, axis=1)
    return jnp.where(traj.action_mask & (traj.turn_ids >= 0), vals, 0.0)


def turn_token_stats(x: jax.Array, traj: Trajectory) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per-turn sum, count and first slot of `x` over each turn's action tokens.

    Args:
      x: f32[B, T] per-slot values.
      traj: Trajectory with K turns.

    Returns:
      (sum f32[B, K], count f32[B, K], first action slot int32[B, K], T where the turn has no
      action token).
    """
    turns = traj.max_turns
    onehot = (traj.turn_ids[:, :, None] == jnp.arange(turns)[None, None, :]) & (
        traj.action_mask[:, :, None]
    )  # [B, T, K]
    total = jnp.einsum("bt,btk->bk", x.astype(jnp.float32), onehot.astype(jnp.float32))
    count = jnp.sum(onehot, axis=1).astype(jnp.float32)
    slots = jnp.arange(x.shape[1], dtype=jnp.int32)[None, :, None]
    first = jnp.min(jnp.where(onehot, slots, x.shape[1]), axis=1).astype(jnp.int32)
    return total, count, first


def discounted_turn_returns(rewards: jax.Array, valid: jax.Array, gamma: float) -> jax.Array:
    """`G_{b,k} = sum_{j >= k} gamma^(j-k) r_{b,j}` over valid turns (reverse scan over K).

    Invalid turns contribute no reward and are skipped by the discount (valid turns of an
    episode are a prefix, so this only matters for hand-built inputs); their G is 0.

    Args:
      rewards: f32[B, K] per-turn rewards.
      valid: bool[B, K] turns that happened.
      gamma: turn-level discount.

    Returns:
      f32[B, K] discounted returns, 0 on invalid turns.
    """
    chex.assert_equal_shape([rewards, valid])
    r = jnp.where(valid, rewards, 0.0).astype(jnp.float32)

    def _step(carry, xs):
        r_k, v_k = xs
        g = r_k + gamma * carry
        return jnp.where(v_k, g, carry), jnp.where(v_k, g, 0.0)

    _, out = jax.lax.scan(_step, jnp.zeros(r.shape[0]), (r.T, valid.T), reverse=True)
    return out.T


def zscore(
    x: jax.Array, ids: jax.Array, weights: jax.Array, eps: float, with_std: bool = True
) -> jax.Array:
    """`(x - mean_g) / (std_g + eps)` (or `x - mean_g`) within weighted groups; groups whose
    total weight is <= 1 give 0 (TRL convention: the mean of one value is that value).

    Args:
      x: f32[N] values; ids: int32[N] dense group ids; weights: f32[N] (0 = excluded).
      eps: added to the unbiased std.
      with_std: divide by the std.

    Returns:
      f32[N], 0 where the weight is 0.
    """
    mean, std, total = weighted_group_stats(x, ids, weights, ddof=1)
    out = x - mean
    if with_std:
        out = out / (std + eps)
    return jnp.where((total > 1) & (weights > 0), out, 0.0)
