"""Critic-based token-level estimators (docs/methods.md, "Critic-based estimators")."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from rl4agents.checks import check_range
from rl4agents.credit import common
from rl4agents.credit.registry import CreditOutput, register
from rl4agents.types import Trajectory


def gae_skip(
    rewards: jax.Array,
    values: jax.Array,
    mask: jax.Array,
    gamma: float,
    lam: float,
    tail: jax.Array | None = None,
) -> jax.Array:
    """GAE over the masked slots of each row, carrying across unmasked slots.

    Right-to-left over t (verl `compute_gae_advantage_return`):
    `delta = r_t + gamma * next_v - V_t`, `gae' = delta + gamma * lam * gae`, then on masked
    slots `next_v = V_t, gae = gae'`; unmasked slots leave both unchanged. `A_t = gae`, so an
    unmasked slot holds the carried value (callers mask it). `next_v` starts at `tail` (the
    value after the row's last masked slot), 0 by default (terminal rows).

    Args:
      rewards: f32[B, T] token rewards (ignored off `mask`).
      values: f32[B, T] critic values (ignored off `mask`, even NaN).
      mask: bool[B, T] slots that form the token MDP (action tokens).
      gamma: discount.
      lam: GAE lambda.
      tail: optional f32[B] value of the state after each row's last masked slot.

    Returns:
      f32[B, T] advantages before whitening.
    """
    chex.assert_equal_shape([rewards, values, mask])

    def _gae_step(carry, xs):
        next_v, gae = carry
        r_t, v_t, m_t = xs
        delta = r_t + gamma * next_v - v_t
        gae_new = delta + gamma * lam * gae
        # A select, not m * x + (1 - m) * y: whatever lies off the mask (NaN included)
        # never reaches the carry.
        next_v = jnp.where(m_t, v_t, next_v)
        gae = jnp.where(m_t, gae_new, gae)
        return (next_v, gae), gae

    zeros = jnp.zeros(rewards.shape[0], jnp.float32)
    start = zeros if tail is None else tail.astype(jnp.float32)
    xs = (rewards.T.astype(jnp.float32), values.T.astype(jnp.float32), mask.T.astype(bool))
    _, adv_tb = jax.lax.scan(_gae_step, (start, zeros), xs, reverse=True)
    return adv_tb.T


def truncation_tail(traj: Trajectory, values: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The bootstrap value of each row cut by the turn or context limit.

    A row is bootstrapped when `traj.truncated` and not `traj.done` (the environment did not
    end it), it has an action token, and a slot follows its last valid slot. Its tail value
    is `values` at that slot: the value of the state after the final observation, as
    `rollout.score` gives every slot the value read at its previous valid slot (padding
    slots included). The train step scores one extra padding slot so that every row has one
    (`with_tail_slot`); a row that fills all T slots here has no tail and stays terminal.

    Args:
      traj: Trajectory with T slots.
      values: f32[B, T] critic values per slot.

    Returns:
      (tail f32[B], 0 where not bootstrapped; bootstrapped bool[B]).
    """
    slots = traj.tokens.shape[1]
    idx = jnp.arange(slots, dtype=jnp.int32)[None, :]
    last = jnp.max(jnp.where(traj.valid_mask, idx, -1), axis=1)
    after = last + 1
    boot = (
        traj.truncated
        & ~traj.done
        & common.trainable_episodes(traj)
        & (after < slots)
        & (last >= 0)
    )
    at = jnp.take_along_axis(values.astype(jnp.float32), jnp.minimum(after, slots - 1)[:, None], 1)
    return jnp.where(boot, at[:, 0], 0.0), boot


def with_tail_slot(traj: Trajectory) -> Trajectory:
    """`traj` with one padding slot appended to every [B, T] field (T + 1 slots), so that
    every row has a slot after its last valid one for `truncation_tail`."""

    def pad(x, fill=0):
        return None if x is None else jnp.pad(x, ((0, 0), (0, 1)), constant_values=fill)

    return traj.replace(
        tokens=pad(traj.tokens),
        valid_mask=pad(traj.valid_mask),
        action_mask=pad(traj.action_mask),
        obs_mask=pad(traj.obs_mask),
        turn_ids=pad(traj.turn_ids, -1),
        logp_behavior=pad(traj.logp_behavior),
        entropy_behavior=pad(traj.entropy_behavior),
        token_penalty=pad(traj.token_penalty),
    )


def bootstraps_truncated(credit_fn) -> bool:
    """Whether a resolved credit function (a `functools.partial` of a registered one) bootstraps
    truncated rows (`bootstrap_truncated=True`), and so needs `with_tail_slot` values."""
    return bool(getattr(credit_fn, "keywords", {}).get("bootstrap_truncated", False))


def _check_discounts(**discounts: float) -> None:
    for name, value in discounts.items():
        check_range(name, value, 0.0, 1.0)


@register("ppo_gae", needs_values=True)
def ppo_gae(
    traj: Trajectory,
    values: jax.Array | None,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = True,
    reward_placement: str = "turn",
    bootstrap_truncated: bool = False,
) -> CreditOutput:
    """PPO token-level GAE over action tokens, skipping observation/padding slots.

    Multi-turn trajectories form one token MDP over action tokens only: the first action token
    of turn k+1 bootstraps the last action token of turn k (docs/methods.md, `ppo_gae`).
    `returns = A + V` before whitening; with `whiten`, `A = masked_whiten(A, action_mask)` over
    the whole batch.
    PPO https://arxiv.org/abs/1707.06347, GAE https://arxiv.org/abs/1506.02438.

    `bootstrap_truncated`: a row the turn or context limit cut (`truncated`, not `done`) is
    not terminal: its last action token `t_L` gets `delta = r + gamma V_tail - V(t_L)` with
    `V_tail` the value after the final observation (`truncation_tail`), the value the next
    turn's first action token would have had (partial-episode bootstrapping, Pardo et al.,
    Time Limits in Reinforcement Learning, https://arxiv.org/abs/1712.00378). Off (the
    default, verl's convention) every row ends with `next_v = 0`.

    Args:
      traj: Trajectory; uses `action_mask bool[B, T]` and the reward fields.
      values: f32[B, T] critic values per slot (required).
      gamma: discount (verl default 1.0).
      lam: GAE lambda (verl default 1.0).
      whiten: batch-global masked whitening of the advantages (verl always whitens).
      reward_placement: "turn" (each turn's reward at its last action token) or "outcome"
        (outcome reward at the last action token of the last turn); see
        `common.token_rewards`. A `token_penalty` (KL in the reward) is subtracted per token.
      bootstrap_truncated: bootstrap truncated rows from the value after their final
        observation (reads `traj.truncated`, `traj.done`, `traj.valid_mask`).

    Returns:
      CreditOutput(advantages f32[B, T], returns f32[B, T], metrics); both arrays are zero
      off `action_mask`.
    """
    _check_discounts(gamma=gamma, lam=lam)
    if values is None:
        raise ValueError("ppo_gae needs critic values; got values=None")
    chex.assert_shape(values, traj.tokens.shape)
    mask = traj.action_mask
    rewards = common.penalised_token_rewards(traj, reward_placement)
    tail, boot = truncation_tail(traj, values) if bootstrap_truncated else (None, None)
    adv = gae_skip(rewards, values, mask, gamma, lam, tail)
    m = mask.astype(jnp.float32)
    returns = (adv + values) * m
    metrics = {
        "adv_mean_raw": common.masked_mean(adv, mask),
        "returns_mean": common.masked_mean(returns, mask),
        "values_mean": common.masked_mean(values.astype(jnp.float32), mask),
    }
    if boot is not None:
        metrics["frac_bootstrapped"] = jnp.mean(boot)
    if whiten:
        adv = common.masked_whiten(adv, mask)
    return CreditOutput(adv * m, returns, metrics)


def _turn_values(values: jax.Array, slots: jax.Array, valid: jax.Array) -> jax.Array:
    """`values[b, slots[b, k]]` where `valid`, else 0. f32[B, K]."""
    idx = jnp.clip(slots, 0, values.shape[1] - 1)
    return jnp.where(valid, jnp.take_along_axis(values.astype(jnp.float32), idx, axis=1), 0.0)


def _turn_gae(
    rewards: jax.Array,
    values: jax.Array,
    valid: jax.Array,
    gamma: float,
    lam: float,
    tail: jax.Array | None = None,
) -> jax.Array:
    """GAE over turns: `delta_k = r_k + gamma V_{k+1} - V_k` (V of an invalid next turn = 0,
    but `tail` f32[B] after the row's last valid turn when given),
    `A_k = delta_k + gamma lam A_{k+1}`. All f32[B, K]; 0 on invalid turns."""
    r = jnp.where(valid, rewards, 0.0).astype(jnp.float32)
    v = values.astype(jnp.float32)
    valid_next = jnp.concatenate([valid[:, 1:], jnp.zeros_like(valid[:, :1])], axis=1)
    v_next = jnp.concatenate([v[:, 1:], jnp.zeros_like(v[:, :1])], axis=1)
    v_next = jnp.where(valid_next, v_next, 0.0)
    if tail is not None:
        k = jnp.arange(valid.shape[1], dtype=jnp.int32)[None, :]
        last = valid & (k == jnp.max(jnp.where(valid, k, -1), axis=1, keepdims=True))
        v_next = jnp.where(last, tail.astype(jnp.float32)[:, None], v_next)
    delta = jnp.where(valid, r + gamma * v_next - v, 0.0)

    def _step(gae, xs):
        d_k, ok = xs
        gae = jnp.where(ok, d_k + gamma * lam * gae, 0.0)
        return gae, gae

    zeros = jnp.zeros(rewards.shape[0], jnp.float32)
    _, out = jax.lax.scan(_step, zeros, (delta.T, valid.T), reverse=True)
    return out.T


@register("turn_gae", needs_values=True)
def turn_gae(
    traj: Trajectory,
    values: jax.Array | None,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
    turn_gamma: float = 0.95,
    whiten: bool = True,
    bootstrap_truncated: bool = False,
) -> CreditOutput:
    """Bi-level (turn-level) GAE, RAGEN `compute_bi_level_gae_advantage_return`.

    High level, over the turn ends `e_k = traj.turn_end[:, k]` (explicit, so a turn with zero
    reward is never merged into the next one, unlike RAGEN's `reward != 0` detection):
    `delta_k = r_k + turn_gamma V(e_{k+1}) - V(e_k)`, `A_k = delta_k + turn_gamma lam A_{k+1}`,
    and the reward at `e_k` becomes `R_k = A_k + V(e_k)`. Low level, right to left over
    action tokens with token discount `gamma`: at a turn end `next_v = 0` and the running GAE
    restarts; otherwise `next_v` is the value of the next action token of the same turn.
    `returns = A + V`; with `whiten`, `A = masked_whiten(A, action_mask)`. RAGEN / StarPO,
    https://arxiv.org/abs/2504.20073 (RAGEN's default `high_level_gamma` 0.95). A
    `token_penalty` (KL in the reward) is added to the low-level token rewards.

    `bootstrap_truncated`: for a row the turn or context limit cut (`truncated`, not `done`),
    the last turn L gets `delta_L = r_L + turn_gamma V_tail - V(e_L)` instead of the terminal
    `r_L - V(e_L)`, with `V_tail` the value after the final observation
    (`truncation_tail`), standing in for the next turn's `V(e_{L+1})`; the bootstrapped
    return reaches the tokens through `R_L`. Off by default (RAGEN treats every row as
    terminal). Pardo et al., https://arxiv.org/abs/1712.00378.

    Args:
      traj: Trajectory; uses `turn_rewards f32[B, K]`, `turn_end int32[B, K]`,
        `turn_valid bool[B, K]`, `action_mask bool[B, T]`.
      values: f32[B, T] critic values (value of the state before each slot's token).
      gamma: token-level discount (RAGEN `gamma` 1.0).
      lam: GAE lambda at both levels (RAGEN `lam` 1.0).
      turn_gamma: turn-level discount (RAGEN `high_level_gamma` 0.95).
      whiten: batch-global masked whitening of the advantages.
      bootstrap_truncated: bootstrap truncated rows from the value after their final
        observation (reads `traj.truncated`, `traj.done`, `traj.valid_mask`).

    Returns:
      CreditOutput(advantages f32[B, T], returns f32[B, T], metrics), zero off action_mask.
    """
    _check_discounts(gamma=gamma, lam=lam, turn_gamma=turn_gamma)
    if values is None:
        raise ValueError("turn_gae needs critic values; got values=None")
    chex.assert_shape(values, traj.tokens.shape)
    batch, slots = traj.tokens.shape
    mask = traj.action_mask
    ends_ok = traj.turn_valid & (traj.turn_end >= 0)
    v_end = _turn_values(values, traj.turn_end, ends_ok)
    tail, boot = truncation_tail(traj, values) if bootstrap_truncated else (None, None)
    turn_adv = _turn_gae(
        traj.turn_rewards.astype(jnp.float32), v_end, ends_ok, turn_gamma, lam, tail
    )
    turn_return = turn_adv + v_end
    end_slot = jnp.where(ends_ok, traj.turn_end, slots)
    is_end = common.scatter_rows(end_slot, True, slots, add=False, dtype=bool)
    rewards = common.scatter_rows(end_slot, jnp.where(ends_ok, turn_return, 0.0), slots)
    if traj.token_penalty is not None:
        rewards = rewards - jnp.where(mask, traj.token_penalty, 0.0)
    m = mask.astype(jnp.float32)

    def _step(carry, xs):
        next_v, gae = carry
        r_t, v_t, m_t, end_t = xs
        next_v = jnp.where(end_t, 0.0, next_v)
        gae = jnp.where(end_t, 0.0, gae)
        gae_new = r_t + gamma * next_v - v_t + gamma * lam * gae
        return (m_t * v_t + (1.0 - m_t) * next_v, m_t * gae_new + (1.0 - m_t) * gae), gae_new

    zeros = jnp.zeros(batch, jnp.float32)
    xs = (rewards.T, values.T.astype(jnp.float32), m.T, is_end.T & mask.T)
    _, adv = jax.lax.scan(_step, (zeros, zeros), xs, reverse=True)
    adv = adv.T * m
    returns = (adv + values) * m
    metrics = {
        "turn_adv_mean": common.masked_mean(turn_adv, ends_ok),
        "returns_mean": common.masked_mean(returns, mask),
        "values_mean": common.masked_mean(values.astype(jnp.float32), mask),
    }
    if boot is not None:
        metrics["frac_bootstrapped"] = jnp.mean(boot)
    if whiten:
        adv = common.masked_whiten(adv, mask)
    return CreditOutput(adv * m, returns, metrics)


@register("step_gae", needs_values=True)
def step_gae(
    traj: Trajectory,
    values: jax.Array | None,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = True,
    bootstrap_truncated: bool = False,
) -> CreditOutput:
    """Step-level GAE (StepPO `arft/core_algos.py::compute_gae_advantage_return`).

    One agent step = one turn. `V_k` is the critic value at the turn's first action slot (the
    state before the response), `r_k` the turn's reward (minus its tokens' `token_penalty`);
    `delta_k = r_k + gamma V_{k+1} - V_k`, `A_k = delta_k + gamma lam A_{k+1}`,
    `returns_k = A_k + V_k`; with `whiten`, `A <- (A - mean) / (std + 1e-8)` over the valid
    steps of the batch (unbiased std); `A_k` and `returns_k` are broadcast to the turn's action
    tokens. StepPO, https://arxiv.org/abs/2604.18401.

    `bootstrap_truncated`: for a row the turn or context limit cut (`truncated`, not `done`),
    the last step L gets `delta_L = r_L + gamma V_tail - V_L` instead of `r_L - V_L`, with
    `V_tail` the value after the final observation (`truncation_tail`): exactly the `V_{L+1}`
    the next step would have had, the value at its first action slot. Off by default (every
    row terminal, as StepPO). Pardo et al., https://arxiv.org/abs/1712.00378.

    Args:
      traj: Trajectory; uses `turn_rewards`, `turn_valid`, `turn_ids`, `action_mask`.
      values: f32[B, T] critic values.
      gamma: step discount (verl default 1.0).
      lam: GAE lambda (verl default 1.0).
      whiten: whiten over steps.
      bootstrap_truncated: bootstrap truncated rows from the value after their final
        observation (reads `traj.truncated`, `traj.done`, `traj.valid_mask`).

    Returns:
      CreditOutput(advantages f32[B, T], returns f32[B, T], metrics), zero off action_mask.
    """
    _check_discounts(gamma=gamma, lam=lam)
    if values is None:
        raise ValueError("step_gae needs critic values; got values=None")
    chex.assert_shape(values, traj.tokens.shape)
    penalty = (
        jnp.zeros(values.shape, jnp.float32)
        if traj.token_penalty is None
        else traj.token_penalty.astype(jnp.float32)
    )
    pen_sum, count, first = common.turn_token_stats(penalty, traj)
    valid = traj.turn_valid & (count > 0)
    v_step = _turn_values(values, first, valid)
    rewards = jnp.where(valid, traj.turn_rewards.astype(jnp.float32) - pen_sum, 0.0)
    tail, boot = truncation_tail(traj, values) if bootstrap_truncated else (None, None)
    adv = _turn_gae(rewards, v_step, valid, gamma, lam, tail)
    returns = adv + v_step
    metrics = {
        "adv_mean_raw": common.masked_mean(adv, valid),
        "returns_mean": common.masked_mean(returns, valid),
        "values_mean": common.masked_mean(v_step, valid),
    }
    if boot is not None:
        metrics["frac_bootstrapped"] = jnp.mean(boot)
    if whiten:
        n = jnp.sum(valid)
        mean = common.masked_mean(adv, valid)
        var = jnp.sum(jnp.where(valid, jnp.square(adv - mean), 0.0)) / jnp.maximum(n - 1, 1)
        adv = (adv - mean) / (common.safe_sqrt(var) + common.WHITEN_EPS)
    return CreditOutput(
        common.turns_to_tokens(jnp.where(valid, adv, 0.0), traj),
        common.turns_to_tokens(jnp.where(valid, returns, 0.0), traj),
        metrics,
    )
