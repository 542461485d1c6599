"""Policy and value losses (methods.md sections 3.2 and 6)."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from rl4agents.losses.aggregate import aggregate
from rl4agents.losses.registry import register


def _masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    m = mask.astype(jnp.float32)
    return jnp.sum(x.astype(jnp.float32) * m) / jnp.maximum(jnp.sum(m), 1.0)


@register("ppo_clip")
def ppo_clip(
    logp: jax.Array,
    logp_old: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip_c: float | None = 3.0,
    agg: str = "token-mean",
    agg_scale: float | None = None,
    log_ratio_clamp: float = 20.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """PPO clipped surrogate with dual clip (verl `compute_policy_loss_vanilla`).

    `rho = exp(clip(logp - logp_old, -c_r, c_r))`, `l1 = -A rho`,
    `l2 = -A clip(rho, 1 - clip_low, 1 + clip_high)`, `l_clip = max(l1, l2)`; for `A < 0`
    dual clip gives `l = min(l_clip, -A c)`. Aggregated with `agg` over `mask`.
    PPO https://arxiv.org/abs/1707.06347; clip-higher (DAPO, `clip_high=0.28`)
    https://arxiv.org/abs/2503.14476; dual clip https://arxiv.org/abs/1912.09729.

    Args:
      logp: f32[B, T] current policy log-probs of the sampled tokens.
      logp_old: f32[B, T] behaviour log-probs.
      advantages: f32[B, T] token advantages.
      mask: bool[B, T] action tokens.
      clip_low: lower clip range `eps_low`.
      clip_high: upper clip range `eps_high`.
      dual_clip_c: dual-clip constant `c > 1` (verl `clip_ratio_c`); None disables it.
      agg: aggregation mode (`losses.aggregate`).
      agg_scale: constant for "seq-mean-token-sum-norm".
      log_ratio_clamp: bound on `|logp - logp_old|` before `exp` (verl 20).

    Returns:
      (loss f32[], metrics) with masked means `pg_clipfrac` (`l2 > l1`),
      `pg_clipfrac_lower` (dual clip active), `ppo_kl` (`logp_old - logp`, clamped) and
      `ratio_mean`.
    """
    chex.assert_rank(logp, 2)
    chex.assert_equal_shape([logp, logp_old, advantages, mask])
    if dual_clip_c is not None and dual_clip_c <= 1.0:
        raise ValueError(f"dual_clip_c must be > 1 (or None), got {dual_clip_c}")
    log_ratio = jnp.clip(logp - logp_old, -log_ratio_clamp, log_ratio_clamp)
    ratio = jnp.exp(log_ratio)
    loss1 = -advantages * ratio
    loss2 = -advantages * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss_clip = jnp.maximum(loss1, loss2)
    if dual_clip_c is None:
        loss_tok = loss_clip
        lower = jnp.zeros_like(loss_clip, dtype=bool)
    else:
        loss3 = -advantages * dual_clip_c
        loss_tok = jnp.where(advantages < 0, jnp.minimum(loss_clip, loss3), loss_clip)
        lower = (loss_clip > loss3) & (advantages < 0)
    loss = aggregate(loss_tok, mask, agg, agg_scale)
    metrics = {
        "pg_clipfrac": _masked_mean(loss2 > loss1, mask),
        "pg_clipfrac_lower": _masked_mean(lower, mask),
        "ppo_kl": _masked_mean(-log_ratio, mask),
        "ratio_mean": _masked_mean(ratio, mask),
    }
    return loss, jax.lax.stop_gradient(metrics)


def value_loss(
    values: jax.Array,
    values_old: jax.Array,
    returns: jax.Array,
    mask: jax.Array,
    *,
    clip: float | None = 0.5,
    agg: str = "token-mean",
    agg_scale: float | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Clipped value loss (verl `compute_value_loss`).

    `V_clip = clip(V, V_old - clip, V_old + clip)`,
    `L = 0.5 * agg(max((V - R)^2, (V_clip - R)^2), m)`. PPO https://arxiv.org/abs/1707.06347.

    Args:
      values: f32[B, T] current critic values.
      values_old: f32[B, T] critic values at rollout time.
      returns: f32[B, T] value targets (e.g. `CreditOutput.returns`).
      mask: bool[B, T] action tokens.
      clip: value clip range (verl `cliprange_value` 0.5); None disables clipping.
      agg: aggregation mode (the critic's `loss_agg_mode`, verl default: the actor's).
      agg_scale: constant for "seq-mean-token-sum-norm".

    Returns:
      (loss f32[], metrics) with `vf_clipfrac` (masked mean of `(V_clip-R)^2 > (V-R)^2`) and
      `vpred_mean`.
    """
    chex.assert_rank(values, 2)
    chex.assert_equal_shape([values, values_old, returns, mask])
    loss1 = jnp.square(values - returns)
    if clip is None:
        loss2 = loss1
    else:
        values_clipped = jnp.clip(values, values_old - clip, values_old + clip)
        loss2 = jnp.square(values_clipped - returns)
    loss = 0.5 * aggregate(jnp.maximum(loss1, loss2), mask, agg, agg_scale)
    metrics = {
        "vf_clipfrac": _masked_mean(loss2 > loss1, mask),
        "vpred_mean": _masked_mean(values, mask),
    }
    return loss, jax.lax.stop_gradient(metrics)
