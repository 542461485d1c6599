"""Critic-based token-level estimators (methods.md section 3)."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from rl4agents.credit import common
from rl4agents.credit.registry import CreditOutput, register
from rl4agents.types import Trajectory


def gae_skip(
    rewards: jax.Array, values: jax.Array, mask: jax.Array, gamma: float, lam: float
) -> jax.Array:
    """GAE over the masked slots of each row, carrying across unmasked slots.

    Right-to-left over t (verl `compute_gae_advantage_return`):
    `delta = r_t + gamma * next_v - V_t`, `gae' = delta + gamma * lam * gae`, then on masked
    slots `next_v = V_t, gae = gae'`; unmasked slots leave both unchanged. `A_t = gae`, so an
    unmasked slot holds the carried value (callers mask it).

    Args:
      rewards: f32[B, T] token rewards.
      values: f32[B, T] critic values (ignored off `mask`).
      mask: bool[B, T] slots that form the token MDP (action tokens).
      gamma: discount.
      lam: GAE lambda.

    Returns:
      f32[B, T] advantages before whitening.
    """
    chex.assert_equal_shape([rewards, values, mask])
    m = mask.astype(jnp.float32)

    def _gae_step(carry, xs):
        next_v, gae = carry
        r_t, v_t, m_t = xs
        delta = r_t + gamma * next_v - v_t
        gae_new = delta + gamma * lam * gae
        next_v = m_t * v_t + (1.0 - m_t) * next_v
        gae = m_t * gae_new + (1.0 - m_t) * gae
        return (next_v, gae), gae

    zeros = jnp.zeros(rewards.shape[0], jnp.float32)
    xs = (rewards.T.astype(jnp.float32), values.T.astype(jnp.float32), m.T)
    _, adv_tb = jax.lax.scan(_gae_step, (zeros, zeros), xs, reverse=True)
    return adv_tb.T


@register("ppo_gae", needs_values=True)
def ppo_gae(
    traj: Trajectory,
    values: jax.Array | None,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = True,
    reward_placement: str = "turn",
) -> CreditOutput:
    """PPO token-level GAE over action tokens, skipping observation/padding slots.

    Multi-turn trajectories form one token MDP over action tokens only: the first action token
    of turn k+1 bootstraps the last action token of turn k (methods.md 3.1). `returns = A + V`
    before whitening; with `whiten`, `A = masked_whiten(A, action_mask)` over the whole batch.
    PPO https://arxiv.org/abs/1707.06347, GAE https://arxiv.org/abs/1506.02438.

    Args:
      traj: Trajectory; uses `action_mask bool[B, T]` and the reward fields.
      values: f32[B, T] critic values per slot (required).
      gamma: discount (verl default 1.0).
      lam: GAE lambda (verl default 1.0).
      whiten: batch-global masked whitening of the advantages (verl always whitens).
      reward_placement: "turn" (each turn's reward at its last action token) or "outcome"
        (outcome reward at the last action token of the last turn); see
        `common.token_rewards`.

    Returns:
      CreditOutput(advantages f32[B, T], returns f32[B, T], metrics); both arrays are zero
      off `action_mask`.
    """
    if values is None:
        raise ValueError("ppo_gae needs critic values; got values=None")
    chex.assert_shape(values, traj.tokens.shape)
    mask = traj.action_mask
    rewards = common.token_rewards(traj, reward_placement)
    adv = gae_skip(rewards, values, mask, gamma, lam)
    m = mask.astype(jnp.float32)
    returns = (adv + values) * m
    metrics = {
        "adv_mean_raw": common.masked_mean(adv, mask),
        "returns_mean": common.masked_mean(returns, mask),
        "values_mean": common.masked_mean(values.astype(jnp.float32), mask),
    }
    if whiten:
        adv = common.masked_whiten(adv, mask)
    return CreditOutput(adv * m, returns, metrics)
