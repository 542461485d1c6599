"""Step-level (per-turn) credit: GiGPO, MT-GRPO, discounted turn returns, EMPG.

A "step" is a valid turn `(b, k)` of the slot layout: its action tokens are
`action_mask & (turn_ids == k)` (docs/methods.md, "The slot layout and step rows"). Every
estimator computes one advantage per step, `f32[B, K]`, and broadcasts it to the step's action
tokens with `common.turns_to_tokens`. Groupings over steps flatten `[B, K]` to `N = B * K` rows
and use `common.dense_pair_ids`; invalid turns get weight 0 in every statistic.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rl4agents.checks import check_range
from rl4agents.credit import common
from rl4agents.credit.outcome import _check_choice, grpo_episode_advantages
from rl4agents.credit.registry import CreditOutput, register
from rl4agents.types import Trajectory


def _flat_ids(traj: Trajectory, second: jax.Array) -> jax.Array:
    """Dense ids of `(group_id, second[b, k])` over the flattened [B*K] steps."""
    gid = jnp.broadcast_to(traj.group_ids[:, None], second.shape)
    return common.dense_pair_ids(gid.reshape(-1), second.reshape(-1))


def _step_zscore(x, ids, valid, eps, with_std=True) -> jax.Array:
    """`common.zscore` of f32[B, K] steps within dense groups `ids` (int32[B*K])."""
    out = common.zscore(x.reshape(-1), ids, valid.reshape(-1).astype(jnp.float32), eps, with_std)
    return out.reshape(x.shape)


@register("gigpo", needs_groups=True)
def gigpo(
    traj: Trajectory,
    values: jax.Array | None = None,
    *,
    gamma: float = 0.95,
    omega: float = 1.0,
    mode: str = "mean_norm",
    stats_over: str = "steps",
    invalid_penalty: float = 0.1,
    eps: float = 1e-6,
) -> CreditOutput:
    """GiGPO: episode-group plus anchor-state step-group advantages.

    verl-agent `gigpo/core_gigpo.py::compute_gigpo_outcome_advantage`; Group-in-Group Policy
    Optimization, https://arxiv.org/abs/2505.10978. With `c = invalid_penalty` and
    `v_{b,k} = turn_action_valid[b, k]`:

    1. Step returns `R_{b,k} = sum_{j >= k} gamma^(j-k) r_{b,j} - c (1 - v_{b,k})`.
    2. Step scores `s_{b,k} = outcome_b - c (1 - v_{b,k})` (the invalid-action penalty on the
       step row's score, as verl-agent's `apply_invalid_action_penalty`).
    3. Episode advantage `A^E = s - mean_g` ("mean_norm") or `(s - mean_g) / (std_g + eps)`
       ("mean_std_norm"); statistics over all valid steps of the task group ("steps",
       verl-agent's `compute_mean_std_cross_steps=True`) or one sample per episode, its first
       step's score ("trajectories", the paper's Eq. 3); a group of one gets mean 0, std 1.
    4. Step groups: valid steps of the same task group whose anchors (the env's exact hash of
       the state the step acted from) are equal; `A^S = R - mean` or `(R - mean)/(std + eps)`
       with the same `mode`; a step group of one gives 0.
    5. `A = A^E + omega A^S` on the step's action tokens.

    Turn rewards `r` are `turn_rewards` minus each turn's summed `token_penalty` (KL in the
    reward) and the score is `common.episode_scores`. Standard deviations are unbiased
    (ddof=1). If no state repeats, `A^S = 0` and GiGPO
    reduces to GRPO over step rows.

    Args:
      traj: Trajectory; uses `turn_rewards`, `turn_valid`, `turn_action_valid`, `anchors`
        (all [B, K]), `outcome_reward`, `group_ids`, `turn_ids`, `action_mask`.
      values: unused (critic-free).
      gamma: step discount (verl-agent examples 0.95).
      omega: step-advantage weight (`step_advantage_w`, 1.0).
      mode: "mean_norm" (config default) | "mean_std_norm" (the example scripts).
      stats_over: "steps" | "trajectories".
      invalid_penalty: `invalid_action_penalty_coef` (0.1). verl-agent's trainer applies it to
        every estimator; the built-in environments already charge an invalid action in their
        reward (FrozenLake `invalid_penalty` 0.05, Sokoban 0.1), for every estimator, so set 0
        there to compare GiGPO with other estimators under one penalty (`configs/ablation.py`).
      eps: added to the std.

    Returns:
      CreditOutput(advantages f32[B, T], returns None, metrics).
    """
    del values
    check_range("gamma", gamma, 0.0, 1.0)
    check_range("omega", omega, 0.0)
    check_range("invalid_penalty", invalid_penalty, 0.0)
    if mode == "mean_std_norm":  # eps is read only where the std divides
        check_range("eps", eps, 0.0, low_open=True)
    _check_choice("mode", mode, ("mean_norm", "mean_std_norm"))
    _check_choice("stats_over", stats_over, ("steps", "trajectories"))
    with_std = mode == "mean_std_norm"
    valid = traj.turn_valid
    penalty = invalid_penalty * (1.0 - traj.turn_action_valid.astype(jnp.float32))
    rewards = common.penalised_turn_rewards(traj)
    returns = common.discounted_turn_returns(rewards, valid, gamma) - penalty
    scores = common.episode_scores(traj)[:, None] - penalty  # [B, K]

    # Episode-level advantage.
    ids = common.dense_group_ids(traj.group_ids)
    if stats_over == "steps":
        batch, turns = valid.shape
        flat_ids = jnp.broadcast_to(ids[:, None], (batch, turns)).reshape(-1)
        w = valid.reshape(-1).astype(jnp.float32)
        mean, std, total = common.weighted_group_stats(scores.reshape(-1), flat_ids, w)
        mean, std, total = (x.reshape(batch, turns) for x in (mean, std, total))
    else:
        first = scores[:, 0]
        w = valid[:, 0].astype(jnp.float32)
        mean, std, total = (x[:, None] for x in common.weighted_group_stats(first, ids, w))
    singleton = total <= 1
    mean = jnp.where(singleton, 0.0, mean)
    std = jnp.where(singleton, 1.0, std)
    adv_episode = scores - mean
    if with_std:
        adv_episode = adv_episode / (std + eps)
    adv_episode = jnp.where(valid, adv_episode, 0.0)

    # Anchor-state step groups.
    step_ids = _flat_ids(traj, traj.anchors)
    adv_step = _step_zscore(returns, step_ids, valid, eps, with_std)
    _, _, size = common.weighted_group_stats(
        returns.reshape(-1), step_ids, valid.reshape(-1).astype(jnp.float32)
    )
    size = size.reshape(valid.shape)
    adv = jnp.where(valid, adv_episode + omega * adv_step, 0.0)
    metrics = {
        "adv_episode_abs": common.masked_mean(jnp.abs(adv_episode), valid),
        "adv_step_abs": common.masked_mean(jnp.abs(adv_step), valid),
        "step_group_size": common.masked_mean(size, valid),
        "frac_steps_grouped": common.masked_mean((size > 1).astype(jnp.float32), valid),
        # The share of anchor groups (not steps) with one step: a group of k steps holds k
        # valid steps of size k, so the groups number sum(1 / size) over valid steps.
        "frac_groups_singleton": jnp.sum(jnp.where(valid, (size == 1).astype(jnp.float32), 0.0))
        / jnp.maximum(jnp.sum(jnp.where(valid, 1.0 / jnp.maximum(size, 1.0), 0.0)), 1.0),
    }
    return CreditOutput(common.turns_to_tokens(adv, traj), None, metrics)


@register("mt_grpo", needs_groups=True)
def mt_grpo(
    traj: Trajectory,
    values: jax.Array | None = None,
    *,
    turn_coef: float = 1.0,
    eps: float = 1e-4,
    last_turn_outcome_only: bool = True,
    outcome: str = "last_turn",
) -> CreditOutput:
    """MT-GRPO turn-level advantage, generalised from two turns to K.

    MT-GRPO (`verifiers/trainers/mt_grpo_env_trainer.py`; https://arxiv.org/abs/2505.11821)
    z-scores an outcome reward `R^O` and a turn reward `R^T` separately within the task group;
    tokens of the tool-call turn get `A^O + lambda A^T`, tokens of the final answer turn `A^O`.
    Here `r_{b,k}` is the reward of turn k (minus the turn's summed `token_penalty`) and, for
    every valid turn k of episode b with last valid turn `L_b`:

    - `R^O_b = r_{b, L_b}` when `outcome="last_turn"` (the reward the final turn earned: the
      reference's split, as a trajectory's `outcome_reward` is the sum of all its turn
      rewards), or the episode's score `outcome_reward_b - sum token_penalty` when
      `outcome="episode"` (the turn rewards are then counted in both terms, GRPO-MR's merged
      scalar plus the turn term). `A^O_b = z_g(R^O_b)` over the episodes of the task group.
    - `A^T_{b,k} = z_{g,k}(r_{b,k})` over the turns k of the same task that receive a turn
      term: every valid turn, but the last turn of an episode when `last_turn_outcome_only`.
    - Turn k's tokens get `A^O_b + turn_coef * A^T_{b,k}`; the last turn `A^O_b` alone when
      `last_turn_outcome_only`.

    With two turns per episode this is the reference exactly (its turn reward on turn 0, its
    outcome reward on turn 1). The reference's fallback for rollouts without a tool result (the
    z-scored combined reward) has no separate form: a one-turn episode gets `A^O`, its only
    turn's reward z-scored. z-scores use the unbiased std plus `eps` (the reference's 1e-4); a
    group of one gives 0. Episodes without an action token are left out of the `A^O`
    statistics (`common.trainable_episodes`); turns that did not happen are left out of the
    `A^T` statistics of their turn index, so episodes of different lengths do not bias them.

    Args:
      traj: Trajectory; uses `turn_rewards`, `turn_valid`, `group_ids`, `num_turns` (and
        `outcome_reward` for `outcome="episode"`).
      values: unused.
      turn_coef: weight of the turn advantage (`turn_advantage_coef`, 1.0).
      eps: added to the std.
      last_turn_outcome_only: the last turn of an episode gets the outcome advantage only.
      outcome: "last_turn" | "episode", what `R^O` is (above).

    Returns:
      CreditOutput(advantages f32[B, T], returns None, metrics).
    """
    del values
    check_range("turn_coef", turn_coef, 0.0)
    check_range("eps", eps, 0.0, low_open=True)
    _check_choice("outcome", outcome, ("last_turn", "episode"))
    valid = traj.turn_valid
    ids = common.dense_group_ids(traj.group_ids)
    rewards = common.penalised_turn_rewards(traj)
    turn_idx = jnp.broadcast_to(jnp.arange(valid.shape[1], dtype=jnp.int32), valid.shape)
    last = valid & (turn_idx == (traj.num_turns[:, None] - 1))
    if outcome == "last_turn":
        r_outcome = jnp.sum(jnp.where(last, rewards, 0.0), axis=1)
    else:
        r_outcome = common.episode_scores(traj)
    trainable = common.trainable_episodes(traj).astype(jnp.float32)
    adv_outcome = common.zscore(r_outcome, ids, trainable, eps)
    gets_turn = valid & ~last if last_turn_outcome_only else valid
    adv_turn = _step_zscore(rewards, _flat_ids(traj, turn_idx), gets_turn, eps)
    adv = jnp.where(valid, adv_outcome[:, None] + turn_coef * adv_turn, 0.0)
    metrics = {
        "adv_outcome_abs": jnp.mean(jnp.abs(adv_outcome)),
        "adv_turn_abs": common.masked_mean(jnp.abs(adv_turn), gets_turn),
    }
    return CreditOutput(common.turns_to_tokens(adv, traj), None, metrics)


@register("turn_return")
def turn_return(
    traj: Trajectory,
    values: jax.Array | None = None,
    *,
    gamma: float = 1.0,
    norm: str = "group",
    eps: float = 1e-6,
) -> CreditOutput:
    """Discounted per-turn process-reward returns with a choice of normalisation.

    `G_{b,k} = sum_{j >= k} gamma^(j-k) r_{b,j}` over valid turns, `r` the turn rewards minus
    each turn's summed `token_penalty` (docs/methods.md, `turn_return`; GTPO,
    https://arxiv.org/abs/2511.14846, is an instance), normalised as:
    "none" (G itself), "batch" (z-score over all valid turns of the batch), "group" (over the
    episodes of the same task at the same turn index k) or "anchor" (over the steps of the
    same task that acted from the same exact state, GiGPO's step groups). z-scores use the
    unbiased std plus `eps`; a group of one gives 0. Turns that did not happen are in no
    statistic: under "group" the turn index k of an episode that ended earlier is no padded
    zero among the returns of the episodes still running at k.

    Args:
      traj: Trajectory; uses `turn_rewards`, `turn_valid`, `anchors`, `group_ids`.
      values: unused.
      gamma: turn discount.
      norm: "none" | "batch" | "group" | "anchor".
      eps: added to the std.

    Returns:
      CreditOutput(advantages f32[B, T], returns None, metrics).
    """
    del values
    check_range("gamma", gamma, 0.0, 1.0)
    if norm != "none":  # eps is read only where the std divides
        check_range("eps", eps, 0.0, low_open=True)
    _check_choice("norm", norm, ("none", "batch", "group", "anchor"))
    valid = traj.turn_valid
    returns = common.discounted_turn_returns(common.penalised_turn_rewards(traj), valid, gamma)
    if norm == "none":
        adv = returns
    elif norm == "batch":
        ids = jnp.zeros(valid.size, jnp.int32)
        adv = _step_zscore(returns, ids, valid, eps)
    elif norm == "group":
        turn_idx = jnp.broadcast_to(jnp.arange(valid.shape[1], dtype=jnp.int32), valid.shape)
        adv = _step_zscore(returns, _flat_ids(traj, turn_idx), valid, eps)
    else:
        adv = _step_zscore(returns, _flat_ids(traj, traj.anchors), valid, eps)
    adv = jnp.where(valid, adv, 0.0)
    metrics = {"turn_return_mean": common.masked_mean(returns, valid)}
    return CreditOutput(common.turns_to_tokens(adv, traj), None, metrics)


@register("empg", needs_groups=True)
def empg(
    traj: Trajectory,
    values: jax.Array | None = None,
    *,
    k: float = 1.0,
    k_future: float = 1.0,
    zeta: float = 0.05,
    eps: float = 1e-6,
) -> CreditOutput:
    """EMPG: entropy-modulated GRPO advantages with a future-clarity bonus.

    Entropy-Modulated Policy Gradients, https://arxiv.org/abs/2509.09265, as re-implemented in
    the third-party WillDreamer/ARLArena (docs/methods.md, `empg`). With the GRPO advantage
    `A_b` (group scale, unbiased std, `eps`), the step entropy `H_{b,k}` = mean sampling
    entropy over turn k's action tokens (`traj.entropy_behavior`):
    `Hn = (H - min H) / (max H - min H + 1e-8)` over the batch's valid steps,
    `g = exp(-k Hn) / mean exp(-k Hn)`, `f = exp(-k_future Hn)`,
    `A_mod_{b,k} = g_{b,k} A_b + zeta f_{b,k+1}` (bonus only if turn k+1 happened), and
    `A = A_mod - mean A_mod` over valid steps.

    Args:
      traj: Trajectory with `entropy_behavior f32[B, T]`.
      values: unused.
      k: confidence scaling exponent.
      k_future: future-clarity exponent.
      zeta: future-clarity bonus weight (0.05; another version uses 0.1).
      eps: GRPO's std epsilon.

    Returns:
      CreditOutput(advantages f32[B, T], returns None, metrics).

    Raises:
      ValueError: `traj.entropy_behavior` is None.
    """
    del values
    check_range("zeta", zeta, 0.0)
    for name, x in (("k", k), ("k_future", k_future)):
        check_range(name, x, 0.0)
    check_range("eps", eps, 0.0, low_open=True)
    if traj.entropy_behavior is None:
        raise ValueError("empg needs traj.entropy_behavior (sampling entropies); got None")
    adv_episode, _ = grpo_episode_advantages(traj, eps, "group", "raw", "trajectories")
    total, count, _ = common.turn_token_stats(traj.entropy_behavior, traj)
    valid = traj.turn_valid & (count > 0)
    entropy = jnp.where(valid, total / jnp.maximum(count, 1.0), 0.0)
    h_min = jnp.min(jnp.where(valid, entropy, jnp.inf))
    h_max = jnp.max(jnp.where(valid, entropy, -jnp.inf))
    h_norm = jnp.where(valid, (entropy - h_min) / (h_max - h_min + common.WHITEN_EPS), 0.0)
    scale = jnp.exp(-k * h_norm)
    scale = scale / jnp.maximum(common.masked_mean(scale, valid), 1e-30)
    clarity = jnp.exp(-k_future * h_norm)
    next_clarity = jnp.concatenate([clarity[:, 1:], jnp.zeros_like(clarity[:, :1])], axis=1)
    next_valid = jnp.concatenate([valid[:, 1:], jnp.zeros_like(valid[:, :1])], axis=1)
    adv = scale * adv_episode[:, None] + zeta * jnp.where(next_valid, next_clarity, 0.0)
    adv = jnp.where(valid, adv - common.masked_mean(adv, valid), 0.0)
    metrics = {
        "step_entropy_mean": common.masked_mean(entropy, valid),
        "entropy_scale_min": jnp.min(jnp.where(valid, scale, jnp.inf)),
        "entropy_scale_max": jnp.max(jnp.where(valid, scale, -jnp.inf)),
    }
    return CreditOutput(common.turns_to_tokens(adv, traj), None, metrics)
