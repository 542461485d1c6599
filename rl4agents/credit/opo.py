"""OPO: the length-weighted group baseline (docs/methods.md, `opo`).

The worked example of `docs/extending.md`: one function, one `@register` line; the config
section `config.credit.opo` comes from the keyword-only defaults.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from rl4agents.credit import common
from rl4agents.credit.registry import CreditOutput, register
from rl4agents.types import Trajectory

_LENGTHS = ("tokens", "turns")
_SINGLETON_POLICIES = ("raw", "zero")


@register("opo", needs_groups=True)
def opo(
    traj: Trajectory,
    values: jax.Array | None = None,
    *,
    length: str = "tokens",
    singleton_policy: str = "raw",
) -> CreditOutput:
    """OPO advantage: the score minus the length-weighted mean score of the group.

    `b_g = sum_{j in g} L_j s_j / sum_{j in g} L_j`, `A_i = s_i - b_{g(i)}`, then
    `A_{i,t} = A_i * action_mask_{i,t}`. No std scaling. On-Policy RL with Optimal Reward
    Baseline, https://arxiv.org/abs/2505.23585; verl `compute_opo_outcome_advantage`.

    verl's conventions, followed here: `L_i` is the response length `response_mask.sum(-1)`,
    here all action tokens of the row (every turn; observation, prompt and padding slots do not
    count); `s_i` is the sum of the token rewards (`common.episode_scores`: the outcome minus
    any `token_penalty`); a group of one episode gets baseline 0, so it keeps its raw score;
    no epsilon (verl's `epsilon` argument is unused). Where verl divides 0 by 0 (a group whose
    episodes have no action tokens) the baseline is 0; those episodes have no action tokens,
    so their token advantages are 0 either way. Such episodes do not count as members either:
    a real episode whose only sibling has no action token is a group of one
    (`common.trainable_episodes`).

    Args:
      traj: Trajectory; uses `outcome_reward f32[B]` (minus `token_penalty f32[B, T]` if
        present), `group_ids int32[B]`, `action_mask bool[B, T]` and, for `length="turns"`,
        `num_turns int32[B]`.
      values: unused (critic-free); accepted for the common CreditFn signature.
      length: `L_i`: "tokens" (action tokens of the row, verl's response length) or "turns"
        (valid turns; one weight per step, for turn-level actions of similar size).
      singleton_policy: a group of one: "raw" (verl: baseline 0, A = the score) or "zero"
        (TRL's convention for GRPO: baseline = the score, A = 0).

    Returns:
      CreditOutput(advantages f32[B, T], returns None, metrics: `score_mean`, `baseline_mean`,
      `adv_abs_mean`, `frac_singleton`, all f32[]).

    Raises:
      ValueError: an unknown `length` or `singleton_policy` (lists the allowed values).
    """
    del values
    for field, value, allowed in (
        ("length", length, _LENGTHS),
        ("singleton_policy", singleton_policy, _SINGLETON_POLICIES),
    ):
        if value not in allowed:
            raise ValueError(f"unknown {field} {value!r}; allowed: {list(allowed)}")
    batch = traj.batch_size
    chex.assert_shape([traj.outcome_reward, traj.group_ids, traj.num_turns], (batch,))
    chex.assert_shape(traj.action_mask, (batch, None))

    score = common.episode_scores(traj)  # f32[B]
    if length == "tokens":
        lengths = jnp.sum(traj.action_mask, axis=1).astype(jnp.float32)
    else:
        lengths = jnp.maximum(traj.num_turns, 0).astype(jnp.float32)
    ids = common.dense_group_ids(traj.group_ids)
    baseline, _, _ = common.weighted_group_stats(score, ids, lengths)  # sum L s / sum L
    trainable = common.trainable_episodes(traj)
    _, _, count = common.weighted_group_stats(score, ids, trainable.astype(jnp.float32))
    singleton = count <= 1
    raw = score if singleton_policy == "raw" else jnp.zeros_like(score)
    adv = jnp.where(singleton, raw, score - baseline)  # f32[B]
    adv = jnp.where(trainable, adv, 0.0)

    metrics = {
        "score_mean": jnp.mean(score),
        "baseline_mean": jnp.mean(jnp.where(singleton, 0.0, baseline)),
        "adv_abs_mean": jnp.mean(jnp.abs(adv)),
        "frac_singleton": jnp.mean(singleton),
    }
    return CreditOutput(common.broadcast_to_tokens(adv, traj.action_mask), None, metrics)
