"""Outcome-level, critic-free group baselines.

Formulas and defaults: docs/methods.md, "Outcome-level, critic-free estimators".

Each estimator turns one score per episode (`traj.outcome_reward`) into one advantage per
episode and broadcasts it over the episode's action tokens. Returns are None (no critic).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from rl4agents.checks import check_range
from rl4agents.credit import common
from rl4agents.credit.registry import CreditOutput, register
from rl4agents.types import Trajectory

_SCALES = ("group", "batch", "none")
_SINGLETON_POLICIES = ("raw", "zero")
_STATS_OVER = ("trajectories", "steps")
_PLACEMENTS = ("outcome", "turn")


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"unknown {name} {value!r}; allowed: {list(allowed)}")


def _group_centre(
    traj: Trajectory, singleton_policy: str, stats_over: str
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Scores, their group mean and unbiased std, and the singleton flag.

    `stats_over="steps"` weights each episode by its number of turns (verl-agent's
    `compute_mean_std_cross_steps=True`: every step row of a group is a sample); a group is a
    singleton when its total weight is <= 1. Under `singleton_policy="raw"` a singleton gets
    mean 0 and std 1 (verl). Episodes without an action token weigh 0
    (`common.trainable_episodes`).
    """
    _check_choice("singleton_policy", singleton_policy, _SINGLETON_POLICIES)
    _check_choice("stats_over", stats_over, _STATS_OVER)
    batch = traj.batch_size
    chex.assert_shape([traj.outcome_reward, traj.group_ids], (batch,))
    score = common.episode_scores(traj)
    ids = common.dense_group_ids(traj.group_ids)
    weights = common.trainable_episodes(traj).astype(jnp.float32)
    if stats_over == "steps":
        weights = weights * jnp.maximum(traj.num_turns, 0).astype(jnp.float32)
    mean, std, total = common.weighted_group_stats(score, ids, weights, ddof=1)
    singleton = total <= 1
    if singleton_policy == "raw":
        mean = jnp.where(singleton, 0.0, mean)
        std = jnp.where(singleton, 1.0, std)
    return score, mean, std, singleton


def _outcome_metrics(score, adv, std, singleton) -> dict[str, jax.Array]:
    return {
        "score_mean": jnp.mean(score),
        "adv_abs_mean": jnp.mean(jnp.abs(adv)),
        "frac_zero_std": jnp.mean((std == 0.0) & ~singleton),
        "frac_singleton": jnp.mean(singleton),
    }


def grpo_episode_advantages(
    traj: Trajectory, eps: float, scale: str, singleton_policy: str, stats_over: str
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The per-episode GRPO advantage f32[B] and its metrics (see `grpo`)."""
    _check_choice("scale", scale, _SCALES)
    score, mean, group_std, singleton = _group_centre(traj, singleton_policy, stats_over)
    centered = score - mean
    if scale == "group":
        adv = centered / (group_std + eps)
    elif scale == "batch":
        trainable = common.trainable_episodes(traj).astype(jnp.float32)
        batch_ids = jnp.zeros(score.shape, jnp.int32)
        _, batch_std, _ = common.weighted_group_stats(score, batch_ids, trainable, ddof=1)
        # A singleton keeps its own (verl) statistics: a batch whose scores are all equal
        # would otherwise turn its raw score into score / eps.
        adv = jnp.where(singleton, centered / (group_std + eps), centered / (batch_std + eps))
    else:
        adv = centered
    if singleton_policy == "zero":
        adv = jnp.where(singleton, 0.0, adv)
    adv = jnp.where(common.trainable_episodes(traj), adv, 0.0)
    metrics = _outcome_metrics(score, adv, group_std, singleton)
    return adv, metrics


@register("grpo", needs_groups=True)
def grpo(
    traj: Trajectory,
    values: jax.Array | None = None,
    *,
    eps: float = 1e-6,
    scale: str = "group",
    singleton_policy: str = "raw",
    stats_over: str = "trajectories",
) -> CreditOutput:
    """GRPO group-normalised outcome advantage (verl `compute_grpo_outcome_advantage`).

    `A_i = (s_i - mean_{g(i)} s) / (std_{g(i)} s + eps)` with the unbiased std (ddof=1), then
    `A_{i,t} = A_i * action_mask_{i,t}`. DeepSeekMath, https://arxiv.org/abs/2402.03300.

    `scale` (TRL `scale_rewards`): "group" divides by the group std (verl
    `norm_adv_by_std_in_grpo=True`); "batch" divides by the unbiased std of all B scores
    while still subtracting the group mean; "none" does not divide (Dr. GRPO advantage,
    https://arxiv.org/abs/2503.20783). `singleton_policy` for groups of size 1: "raw" (verl:
    mean 0, std 1, so A = s / (1 + eps), under "batch" too: TRL, whose batch scale this is,
    has no singletons, and a batch std of 0 would make it s / eps) or "zero" (TRL: mean =
    the score, so A = 0). All-equal groups give `0 / (0 + eps) = 0`.
    `stats_over`: "trajectories" (one sample per episode, the paper) or "steps" (each episode
    counted once per turn, verl-agent's default for step rows). The default is "trajectories"
    rather than verl-agent's "steps": here a row is a whole episode, and one sample per
    episode is what verl's `compute_grpo_outcome_advantage` and the GRPO paper compute on such
    rows; "steps" reproduces verl-agent's statistics, where longer episodes weigh more in
    their group's mean and std. An episode without an action token is no member of its group
    (nor of the batch under "batch"): it has nothing to train on, so its score must not move
    its siblings' baseline or scale (`common.trainable_episodes`); its advantage is 0.

    Args:
      traj: Trajectory; uses `outcome_reward f32[B]` (minus `token_penalty` if present),
        `group_ids int32[B]`, `num_turns int32[B]`, `action_mask bool[B, T]`.
      values: unused (critic-free); accepted for the common CreditFn signature.
      eps: added to the std (verl 1e-6; TRL/MT-GRPO 1e-4).
      scale: "group" | "batch" | "none".
      singleton_policy: "raw" | "zero".
      stats_over: "trajectories" | "steps".

    Returns:
      CreditOutput(advantages f32[B, T], returns None, metrics).
    """
    del values
    if scale != "none":  # eps is read only where the std divides
        check_range("eps", eps, 0.0, low_open=True)
    adv, metrics = grpo_episode_advantages(traj, eps, scale, singleton_policy, stats_over)
    return CreditOutput(common.broadcast_to_tokens(adv, traj.action_mask), None, metrics)


@register("dr_grpo", needs_groups=True)
def dr_grpo(
    traj: Trajectory,
    values: jax.Array | None = None,
    *,
    singleton_policy: str = "raw",
    stats_over: str = "trajectories",
) -> CreditOutput:
    """Dr. GRPO advantage: `A_i = s_i - mean_{g(i)} s`, no std scaling.

    verl `norm_adv_by_std_in_grpo=False`. The paper's other half, no per-sequence length
    normalisation, is the loss aggregation "seq-mean-token-sum-norm" with a constant scale
    (set `loss.<policy>.agg`). Understanding R1-Zero-Like Training,
    https://arxiv.org/abs/2503.20783.

    Args:
      traj: Trajectory (as `grpo`).
      values: unused.
      singleton_policy: "raw" (verl: a group of one keeps its raw score) | "zero" (TRL).
      stats_over: "trajectories" | "steps" (see `grpo`).

    Returns:
      CreditOutput(advantages f32[B, T], returns None, metrics).
    """
    return grpo(
        traj, values, scale="none", singleton_policy=singleton_policy, stats_over=stats_over
    )


@register("rloo", needs_groups=True)
def rloo(traj: Trajectory, values: jax.Array | None = None) -> CreditOutput:
    """RLOO leave-one-out baseline (verl `compute_rloo_outcome_advantage`).

    `A_i = s_i - mean_{j in g(i), j != i} s_j = k / (k - 1) * (s_i - mean_{g(i)} s)` with
    `k = |g(i)|`; a group of one keeps its raw score. No std scaling. Back to Basics,
    https://arxiv.org/abs/2402.14740. Episodes without an action token are no members of
    their group (`common.trainable_episodes`) and get 0.

    Args:
      traj: Trajectory (as `grpo`).
      values: unused.

    Returns:
      CreditOutput(advantages f32[B, T], returns None, metrics).
    """
    del values
    score = common.episode_scores(traj)
    trainable = common.trainable_episodes(traj)
    ids = common.dense_group_ids(traj.group_ids)
    mean, _, k = common.weighted_group_stats(score, ids, trainable.astype(jnp.float32))
    adv = jnp.where(k > 1, k / jnp.maximum(k - 1.0, 1.0) * (score - mean), score)
    adv = jnp.where(trainable, adv, 0.0)
    metrics = {"score_mean": jnp.mean(score), "adv_abs_mean": jnp.mean(jnp.abs(adv))}
    return CreditOutput(common.broadcast_to_tokens(adv, traj.action_mask), None, metrics)


def _token_returns(rewards: jax.Array, mask: jax.Array, gamma: float, reset_on: str):
    """Right-to-left discounted token returns (REINFORCE++).

    "mask" is verl's loop over all slots: `running = r_t + gamma * running; G_t = running;
    running *= m_t`, so the return is cut at every non-action slot (each observation span in a
    multi-turn row). "seq_end" carries the return across non-action slots unchanged, so the
    discount counts action tokens only and earlier turns see later rewards.
    """
    m = mask.astype(jnp.float32)

    def _step(running, xs):
        r_t, m_t = xs
        if reset_on == "mask":
            g = r_t + gamma * running
            return g * m_t, g
        g = r_t + gamma * running
        new = m_t * g + (1.0 - m_t) * (running + r_t)
        return new, new

    zeros = jnp.zeros(rewards.shape[0], jnp.float32)
    _, out = jax.lax.scan(_step, zeros, (rewards.T.astype(jnp.float32), m.T), reverse=True)
    return out.T


@register("reinforce_pp")
def reinforce_pp(
    traj: Trajectory,
    values: jax.Array | None = None,
    *,
    gamma: float = 1.0,
    reset_on: str = "seq_end",
    reward_placement: str = "outcome",
) -> CreditOutput:
    """REINFORCE++: token-level discounted returns, whitened over the batch's action tokens.

    `G_{i,t} = r_{i,t} + gamma * G_{i,next}`, then `A = masked_whiten(G, action_mask)` (one
    mean/variance over all action tokens of the batch). verl
    `compute_reinforce_plus_plus_outcome_advantage`; https://arxiv.org/abs/2501.03262.
    `reset_on="mask"` is verl's loop, which cuts the return at every observation span
    (earlier turns never see later rewards); "seq_end" (default, multi-turn-safe) resets only
    at the end of the row. Token rewards include `-token_penalty` (KL in the reward).

    Args:
      traj: Trajectory.
      values: unused.
      gamma: token discount (verl `algorithm.gamma`, 1.0).
      reset_on: "seq_end" | "mask".
      reward_placement: "outcome" (the outcome reward on the last action token, verl) or
        "turn" (each turn's reward on its last action token).

    Returns:
      CreditOutput(advantages f32[B, T], returns None, metrics).
    """
    del values
    check_range("gamma", gamma, 0.0, 1.0)
    _check_choice("reset_on", reset_on, ("seq_end", "mask"))
    _check_choice("reward_placement", reward_placement, _PLACEMENTS)
    mask = traj.action_mask
    rewards = common.penalised_token_rewards(traj, reward_placement)
    returns = _token_returns(rewards, mask, gamma, reset_on)
    adv = common.masked_whiten(returns, mask) * mask
    metrics = {"returns_mean": common.masked_mean(returns, mask)}
    return CreditOutput(adv, None, metrics)


@register("reinforce_pp_baseline", needs_groups=True)
def reinforce_pp_baseline(
    traj: Trajectory, values: jax.Array | None = None, *, singleton_policy: str = "raw"
) -> CreditOutput:
    """REINFORCE++-baseline: group-mean baseline, then batch whitening over action tokens.

    `a_i = s_i - mean_{g(i)} s` (a group of one keeps its raw score under "raw"), broadcast
    to the action tokens, then `masked_whiten` over all action tokens of the batch. verl
    `compute_reinforce_plus_plus_baseline_outcome_advantage`.

    Args:
      traj: Trajectory (as `grpo`).
      values: unused.
      singleton_policy: "raw" | "zero".

    Returns:
      CreditOutput(advantages f32[B, T], returns None, metrics).
    """
    del values
    score, mean, std, singleton = _group_centre(traj, singleton_policy, "trajectories")
    centred = score - mean
    if singleton_policy == "zero":
        centred = jnp.where(singleton, 0.0, centred)
    mask = traj.action_mask
    adv = common.masked_whiten(common.broadcast_to_tokens(centred, mask), mask) * mask
    return CreditOutput(adv, None, _outcome_metrics(score, centred, std, singleton))


@register("remax", needs_greedy=True)
def remax(
    traj: Trajectory, values: jax.Array | None = None, *, reward_placement: str = "outcome"
) -> CreditOutput:
    """ReMax: greedy-rollout baseline (verl `compute_remax_outcome_advantage`).

    `returns_{i,t} = sum_{t' >= t} r_{i,t'} m_{i,t'}`, `A_{i,t} = returns_{i,t} - b_i m_{i,t}`
    where `b_i = traj.baseline_reward[i]` is the score of one greedy episode on the same task
    (the train step adds it when the credit function is registered with `needs_greedy`). No
    normalisation. https://arxiv.org/abs/2310.10505.

    Args:
      traj: Trajectory with `baseline_reward f32[B]`.
      values: unused.
      reward_placement: "outcome" | "turn" (see `common.token_rewards`).

    Returns:
      CreditOutput(advantages f32[B, T], returns None, metrics).

    Raises:
      ValueError: `traj.baseline_reward` is None.
    """
    del values
    _check_choice("reward_placement", reward_placement, _PLACEMENTS)
    if traj.baseline_reward is None:
        raise ValueError(
            "remax needs traj.baseline_reward (the greedy episode's score per task); got None"
        )
    chex.assert_shape(traj.baseline_reward, (traj.batch_size,))
    mask = traj.action_mask
    m = mask.astype(jnp.float32)
    rewards = common.penalised_token_rewards(traj, reward_placement) * m
    returns = jnp.flip(jnp.cumsum(jnp.flip(rewards, axis=1), axis=1), axis=1)
    adv = (returns - traj.baseline_reward[:, None]) * m
    metrics = {
        "baseline_mean": jnp.mean(traj.baseline_reward),
        "score_mean": jnp.mean(common.episode_scores(traj)),
    }
    return CreditOutput(adv, None, metrics)
