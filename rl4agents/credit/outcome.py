"""Outcome-level, critic-free group baselines (methods.md section 2).

Each estimator turns one score per episode (`traj.outcome_reward`) into one advantage per
episode and broadcasts it over the episode's action tokens. Returns are None (no critic).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from rl4agents.credit import common
from rl4agents.credit.registry import CreditOutput, register
from rl4agents.types import Trajectory

_SCALES = ("group", "batch", "none")
_SINGLETON_POLICIES = ("raw", "zero")


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"unknown {name} {value!r}; allowed: {list(allowed)}")


@register("grpo")
def grpo(
    traj: Trajectory,
    values: jax.Array | None = None,
    *,
    eps: float = 1e-6,
    scale: str = "group",
    singleton_policy: str = "raw",
) -> CreditOutput:
    """GRPO group-normalised outcome advantage (verl `compute_grpo_outcome_advantage`).

    `A_i = (s_i - mean_{g(i)} s) / (std_{g(i)} s + eps)` with the unbiased std (ddof=1), then
    `A_{i,t} = A_i * action_mask_{i,t}`. DeepSeekMath, https://arxiv.org/abs/2402.03300.

    `scale` (TRL `scale_rewards`): "group" divides by the group std (verl
    `norm_adv_by_std_in_grpo=True`); "batch" divides by the unbiased std of all B scores
    while still subtracting the group mean; "none" does not divide (Dr. GRPO advantage,
    https://arxiv.org/abs/2503.20783). `singleton_policy` for groups of size 1: "raw" (verl:
    mean 0, std 1, so A = the raw score, divided by the batch std under "batch") or "zero"
    (TRL: mean = the score, so A = 0). All-equal groups give `0 / (0 + eps) = 0`.

    Args:
      traj: Trajectory; uses `outcome_reward f32[B]`, `group_ids int32[B]`,
        `action_mask bool[B, T]`.
      values: unused (critic-free); accepted for the common CreditFn signature.
      eps: added to the std (verl 1e-6; TRL/MT-GRPO 1e-4).
      scale: "group" | "batch" | "none".
      singleton_policy: "raw" | "zero".

    Returns:
      CreditOutput(advantages f32[B, T], returns None, metrics).
    """
    del values
    _check_choice("scale", scale, _SCALES)
    _check_choice("singleton_policy", singleton_policy, _SINGLETON_POLICIES)
    batch = traj.batch_size
    chex.assert_shape([traj.outcome_reward, traj.group_ids], (batch,))
    score = traj.outcome_reward.astype(jnp.float32)
    mean, group_std, count = common.group_stats(score, traj.group_ids, ddof=1)
    singleton = count <= 1
    if singleton_policy == "raw":
        mean = jnp.where(singleton, 0.0, mean)
        group_std = jnp.where(singleton, 1.0, group_std)
    centered = score - mean
    if scale == "group":
        adv = centered / (group_std + eps)
    elif scale == "batch":
        batch_std = common.safe_sqrt(jnp.var(score, ddof=1)) if batch > 1 else 0.0
        adv = centered / (batch_std + eps)
    else:
        adv = centered
    if singleton_policy == "zero":
        adv = jnp.where(singleton, 0.0, adv)
    metrics = {
        "score_mean": jnp.mean(score),
        "adv_abs_mean": jnp.mean(jnp.abs(adv)),
        "frac_zero_std": jnp.mean((group_std == 0.0) & ~singleton),
        "frac_singleton": jnp.mean(singleton),
    }
    return CreditOutput(common.broadcast_to_tokens(adv, traj.action_mask), None, metrics)
