"""Policy and value losses, and truncated importance-sampling weights.

Formulas, defaults and the tests that pin them: docs/methods.md, "Policy losses", "Value loss"
and "TIS (truncated importance sampling)".

Every registered policy loss has the signature

    fn(logp, logp_old, advantages, mask, weights=None, *, <hparams>) -> (loss f32[], metrics)

with `logp`, `logp_old`, `advantages` f32[B, T], `mask` bool[B, T] (action tokens) and
`weights` an optional f32[B, T] non-negative per-token multiplier of the per-token loss, treated
as a constant (stop-gradient), e.g. `tis_weights(...)` for a sampler/learner mismatch. Weights
scale the numerator of the aggregation only (verl `rollout_is_weights`); denominators still count
masked tokens. "gspo" also takes `segment_ids` after `weights` (registry attribute
`takes_segment_ids`).

Tokens off `mask` contribute exactly zero to the loss, its gradient and the metrics, even when
their inputs are NaN or inf: inputs are replaced by zeros off the mask with `jnp.where` before
any arithmetic, so no `0 * inf` reaches the forward or backward pass.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from rl4agents.checks import check_range
from rl4agents.losses.aggregate import aggregate
from rl4agents.losses.registry import POLICY_LOSSES, register

Metrics = dict[str, jax.Array]


def _masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean of `x` over `mask` (0 for an empty mask); values off the mask are never read."""
    m = mask.astype(jnp.float32)
    total = jnp.sum(jnp.where(mask, x.astype(jnp.float32), 0.0))
    return total / jnp.maximum(jnp.sum(m), 1.0)


def _prepare(
    logp: jax.Array,
    logp_old: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    weights: jax.Array | None,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array | None]:
    """Shape checks; every input in f32 (bf16 log-probs too: the ratio is exp of their
    difference), zeros off the mask; stop-gradient on `weights`."""
    chex.assert_rank(logp, 2)
    chex.assert_equal_shape([logp, logp_old, advantages, mask])
    mask = mask.astype(bool)
    if weights is not None:
        chex.assert_equal_shape([logp, weights])
        weights = jax.lax.stop_gradient(jnp.where(mask, weights.astype(jnp.float32), 0.0))
    logp, logp_old, advantages = (
        jnp.where(mask, x.astype(jnp.float32), 0.0) for x in (logp, logp_old, advantages)
    )
    return logp, logp_old, advantages, mask, weights


def _check_clip(clip_low: float, clip_high: float) -> None:
    """The ratio is clipped to `[1 - clip_low, 1 + clip_high]`, which must hold 1 and stay >= 0."""
    check_range("clip_low", clip_low, 0.0, 1.0)
    check_range("clip_high", clip_high, 0.0)


def _reduce(
    loss_tok: jax.Array,
    mask: jax.Array,
    weights: jax.Array | None,
    agg: str,
    agg_scale: float | None,
) -> jax.Array:
    """`aggregate(w * l, m)` with `l` set to exactly 0 off the mask."""
    if weights is not None:
        loss_tok = loss_tok * weights
    return aggregate(jnp.where(mask, loss_tok, 0.0), mask, agg, agg_scale)


@register("ppo_clip")
def ppo_clip(
    logp: jax.Array,
    logp_old: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    weights: jax.Array | None = None,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip_c: float | None = 3.0,
    agg: str = "token-mean",
    agg_scale: float | None = None,
    log_ratio_clamp: float = 20.0,
) -> tuple[jax.Array, Metrics]:
    """PPO clipped surrogate with dual clip (verl `compute_policy_loss_vanilla`).

    See docs/methods.md, `ppo_clip`.

    `rho = exp(clip(logp - logp_old, -c_r, c_r))`, `l1 = -A rho`,
    `l2 = -A clip(rho, 1 - clip_low, 1 + clip_high)`, `l_clip = max(l1, l2)`; for `A < 0`
    dual clip gives `l = min(l_clip, -A c)`. The per-token loss is `w l`, aggregated with `agg`
    over `mask`. PPO https://arxiv.org/abs/1707.06347; clip-higher (DAPO, `clip_high=0.28`)
    https://arxiv.org/abs/2503.14476; dual clip https://arxiv.org/abs/1912.09729.

    Args:
      logp: f32[B, T] current policy log-probs of the sampled tokens.
      logp_old: f32[B, T] behaviour log-probs.
      advantages: f32[B, T] token advantages.
      mask: bool[B, T] action tokens.
      weights: optional f32[B, T] non-negative per-token loss multipliers (stop-gradient).
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
    _check_clip(clip_low, clip_high)
    check_range(
        "dual_clip_c", dual_clip_c, 1.0, low_open=True, allow_none=True, note="(None = off)"
    )
    check_range("log_ratio_clamp", log_ratio_clamp, 0.0, low_open=True)
    logp, logp_old, advantages, mask, weights = _prepare(logp, logp_old, advantages, mask, weights)
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
    loss = _reduce(loss_tok, mask, weights, agg, agg_scale)
    metrics = {
        "pg_clipfrac": _masked_mean(loss2 > loss1, mask),
        "pg_clipfrac_lower": _masked_mean(lower, mask),
        "ppo_kl": _masked_mean(-log_ratio, mask),
        "ratio_mean": _masked_mean(ratio, mask),
    }
    return loss, jax.lax.stop_gradient(metrics)


def _segment_mean(x: jax.Array, mask: jax.Array, segment_ids: jax.Array | None) -> jax.Array:
    """Masked mean of `x` per row (`segment_ids` None) or per (row, segment id), per token.

    Args:
      x: f32[B, T], already 0 off `mask`.
      mask: bool[B, T].
      segment_ids: int32[B, T] with values in [0, T) on `mask` (others are clipped into that
        range), or None for one segment per row.

    Returns:
      f32[B, T] (or f32[B, 1] when `segment_ids` is None): the mean over the masked tokens of
      the token's segment; 0 for a segment without masked tokens.
    """
    m = mask.astype(x.dtype)
    if segment_ids is None:
        sums = jnp.sum(x, axis=1, keepdims=True)
        return sums / jnp.maximum(jnp.sum(m, axis=1, keepdims=True), 1.0)
    chex.assert_equal_shape([x, segment_ids])
    b, t = x.shape
    # One segment per (row, id): a row holds at most T distinct ids, so B * T segments suffice.
    flat = (jnp.clip(segment_ids, 0, t - 1) + t * jnp.arange(b)[:, None]).reshape(-1)
    sums = jax.ops.segment_sum(x.reshape(-1), flat, num_segments=b * t)
    counts = jax.ops.segment_sum(m.reshape(-1), flat, num_segments=b * t)
    return (sums / jnp.maximum(counts, 1.0))[flat].reshape(b, t)


GSPO_SEQUENCES = ("trajectory", "turn")


@POLICY_LOSSES.register("gspo", takes_segment_ids=True)
def gspo(
    logp: jax.Array,
    logp_old: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    weights: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    sequence: str = "trajectory",
    agg: str = "seq-mean-token-mean",
    agg_scale: float | None = None,
    log_ratio_max: float = 10.0,
) -> tuple[jax.Array, Metrics]:
    """GSPO-token: clipped surrogate on a length-normalised sequence ratio.

    See docs/methods.md, `gspo`. verl `compute_policy_loss_gspo`; GSPO
    https://arxiv.org/abs/2507.18071. For each sequence `S` (a set of masked tokens),
      `log s_S = sum_{t in S} (logp_t - logp_old_t) / max(|S|, 1)`,
      `log s_t = min(sg(log s_S) + logp_t - sg(logp_t), log_ratio_max)` for `t in S`,
      `l_t = max(-A_t s_t, -A_t clip(s_t, 1 - clip_low, 1 + clip_high))`,
    and the per-token loss `w_t l_t` is aggregated with `agg`. The value of `s_t` is `s_S` on
    every token of `S`; its gradient is `s_S grad logp_t`, so with a constant advantage over
    `S` the gradient equals that of the sequence objective `max(-A s_S, -A clip(s_S, ...))`.
    No dual clip. verl forces `agg = "seq-mean-token-mean"`, which is the default here.

    A sequence is, with `sequence="trajectory"`, all action tokens of a row (the whole
    multi-turn trajectory in the slot layout; in the step-row layout, one step's response);
    with `sequence="turn"`, the action tokens of a row sharing one `segment_ids` value (one
    turn when `segment_ids = Trajectory.turn_ids`).

    Args:
      logp: f32[B, T] current policy log-probs of the sampled tokens.
      logp_old: f32[B, T] behaviour log-probs.
      advantages: f32[B, T] token advantages.
      mask: bool[B, T] action tokens.
      weights: optional f32[B, T] non-negative per-token loss multipliers (stop-gradient).
      segment_ids: int32[B, T] sequence id of each token within its row, values in [0, T) on
        `mask` (turn indices qualify; off-mask values are ignored). Required for
        `sequence="turn"`, ignored for "trajectory".
      clip_low: lower clip range (GSPO paper v2 section 5.1: 3e-4).
      clip_high: upper clip range (4e-4).
      sequence: "trajectory" or "turn", see above.
      agg: aggregation mode (`losses.aggregate`).
      agg_scale: constant for "seq-mean-token-sum-norm".
      log_ratio_max: upper clamp on `log s_t` (verl 10).

    Returns:
      (loss f32[], metrics) with masked token means `pg_clipfrac` (`l2 > l1`), `ppo_kl`
      (`logp_old - logp`, per token, unclamped as in verl) and `ratio_mean` (`s_t`).
    """
    if sequence not in GSPO_SEQUENCES:
        raise ValueError(f"unknown GSPO sequence {sequence!r}; allowed: {list(GSPO_SEQUENCES)}")
    if sequence == "turn" and segment_ids is None:
        raise ValueError('gspo with sequence="turn" needs segment_ids (e.g. traj.turn_ids)')
    _check_clip(clip_low, clip_high)
    check_range("log_ratio_max", log_ratio_max, 0.0, low_open=True)
    logp, logp_old, advantages, mask, weights = _prepare(logp, logp_old, advantages, mask, weights)
    log_ratio = logp - logp_old
    seq_log_ratio = _segment_mean(log_ratio, mask, segment_ids if sequence == "turn" else None)
    log_s = jax.lax.stop_gradient(seq_log_ratio) + logp - jax.lax.stop_gradient(logp)
    s = jnp.exp(jnp.minimum(log_s, log_ratio_max))
    loss1 = -advantages * s
    loss2 = -advantages * jnp.clip(s, 1.0 - clip_low, 1.0 + clip_high)
    loss_tok = jnp.maximum(loss1, loss2)
    loss = _reduce(loss_tok, mask, weights, agg, agg_scale)
    metrics = {
        "pg_clipfrac": _masked_mean(loss2 > loss1, mask),
        "ppo_kl": _masked_mean(-log_ratio, mask),
        "ratio_mean": _masked_mean(s, mask),
    }
    return loss, jax.lax.stop_gradient(metrics)


@register("cispo")
def cispo(
    logp: jax.Array,
    logp_old: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    weights: jax.Array | None = None,
    *,
    ratio_low: float | None = None,
    ratio_high: float | None = 5.0,
    agg: str = "token-mean",
    agg_scale: float | None = None,
    log_ratio_clamp: float = 20.0,
) -> tuple[jax.Array, Metrics]:
    """CISPO: REINFORCE weighted by a clipped, stop-gradient IS ratio (docs/methods.md, `cispo`).

    MiniMax-M1 https://arxiv.org/abs/2506.13585. With
    `rho = exp(clip(logp - logp_old, -c_r, c_r))`,
      `l = -sg(clip(rho, ratio_low, ratio_high)) A logp`,
    so the gradient is `-sg(clip(rho)) A grad logp` on every token (no token is dropped, unlike
    PPO clipping). The per-token loss `w l` is aggregated with `agg` (default "token-mean", the
    paper's token-level normalisation).

    The bounds are absolute ratios: verl `compute_policy_loss_cispo` uses
    `(1 - clip_ratio_low, 1 + clip_ratio_high)`; TRL (`loss_type="cispo"`) uses only an upper
    cap `epsilon_high`. The defaults follow TRL and the MiniMax paper, which tunes only the
    upper bound: no lower bound, `ratio_high = 5.0` (TRL's recommended `epsilon_high` for
    CISPO, the `eps_max` of ScaleRL https://arxiv.org/abs/2510.13786).

    Args:
      logp: f32[B, T] current policy log-probs of the sampled tokens.
      logp_old: f32[B, T] behaviour log-probs.
      advantages: f32[B, T] token advantages.
      mask: bool[B, T] action tokens.
      weights: optional f32[B, T] non-negative per-token loss multipliers (stop-gradient).
      ratio_low: lower bound on the IS weight, None for none.
      ratio_high: upper bound on the IS weight, None for none.
      agg: aggregation mode (`losses.aggregate`).
      agg_scale: constant for "seq-mean-token-sum-norm".
      log_ratio_clamp: bound on `|logp - logp_old|` before `exp` (verl 20).

    Returns:
      (loss f32[], metrics) with masked means `pg_clipfrac` (the IS weight was clipped),
      `ppo_kl` (`logp_old - logp`, clamped) and `ratio_mean` (`rho`, before clipping).
    """
    check_range("ratio_low", ratio_low, 0.0, allow_none=True, note="(None = no bound)")
    check_range(
        "ratio_high", ratio_high, 0.0, low_open=True, allow_none=True, note="(None = no bound)"
    )
    check_range("log_ratio_clamp", log_ratio_clamp, 0.0, low_open=True)
    if ratio_low is not None and ratio_high is not None and ratio_low > ratio_high:
        raise ValueError(f"cispo needs ratio_low <= ratio_high, got {ratio_low} > {ratio_high}")
    logp, logp_old, advantages, mask, weights = _prepare(logp, logp_old, advantages, mask, weights)
    log_ratio = jnp.clip(logp - logp_old, -log_ratio_clamp, log_ratio_clamp)
    ratio = jnp.exp(log_ratio)
    clipped = ratio
    if ratio_low is not None:
        clipped = jnp.maximum(clipped, ratio_low)
    if ratio_high is not None:
        clipped = jnp.minimum(clipped, ratio_high)
    loss_tok = -jax.lax.stop_gradient(clipped) * advantages * logp
    loss = _reduce(loss_tok, mask, weights, agg, agg_scale)
    metrics = {
        "pg_clipfrac": _masked_mean(clipped != ratio, mask),
        "ppo_kl": _masked_mean(-log_ratio, mask),
        "ratio_mean": _masked_mean(ratio, mask),
    }
    return loss, jax.lax.stop_gradient(metrics)


@register("sapo")
def sapo(
    logp: jax.Array,
    logp_old: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    weights: jax.Array | None = None,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    agg: str = "seq-mean-token-mean",
    agg_scale: float | None = None,
    log_ratio_clamp: float = 20.0,
) -> tuple[jax.Array, Metrics]:
    """SAPO: a smooth, temperature-controlled gate on the ratio instead of a hard clip.

    See docs/methods.md, `sapo`. Soft Adaptive Policy Optimization (Gao et al.),
    https://arxiv.org/abs/2511.20347. With `rho = exp(clip(logp - logp_old, -c_r, c_r))` and
    `tau = tau_pos` where `A > 0`, else `tau_neg`,
      `f(rho) = (4 / tau) sigmoid(tau (rho - 1))`,  `l = -A f(rho)`,
    so `dl/dlogp = -A g rho` with the gate `g = 4 s (1 - s)`, `s = sigmoid(tau (rho - 1))`:
    `g = 1` on-policy (`rho = 1`, the plain policy gradient), and it decays smoothly as `rho`
    leaves 1, faster for a larger `tau` (no token is cut off at a fixed band, unlike PPO's
    clip). The paper's temperatures are `tau_pos = 1.0`, `tau_neg = 1.05` (negative
    advantages are damped a little harder) and its objective averages tokens within a
    sequence, then sequences: `agg = "seq-mean-token-mean"`.

    Args:
      logp: f32[B, T] current policy log-probs of the sampled tokens.
      logp_old: f32[B, T] behaviour log-probs.
      advantages: f32[B, T] token advantages.
      mask: bool[B, T] action tokens.
      weights: optional f32[B, T] non-negative per-token loss multipliers (stop-gradient).
      tau_pos: gate temperature for tokens with `A > 0` (> 0).
      tau_neg: gate temperature for tokens with `A <= 0` (> 0).
      agg: aggregation mode (`losses.aggregate`).
      agg_scale: constant for "seq-mean-token-sum-norm".
      log_ratio_clamp: bound on `|logp - logp_old|` before `exp` (as `ppo_clip`).

    Returns:
      (loss f32[], metrics) with masked means `sapo_gate` (`g`, 1 on-policy), `ppo_kl`
      (`logp_old - logp`, clamped) and `ratio_mean`.
    """
    check_range("tau_pos", tau_pos, 0.0, low_open=True)
    check_range("tau_neg", tau_neg, 0.0, low_open=True)
    check_range("log_ratio_clamp", log_ratio_clamp, 0.0, low_open=True)
    logp, logp_old, advantages, mask, weights = _prepare(logp, logp_old, advantages, mask, weights)
    log_ratio = jnp.clip(logp - logp_old, -log_ratio_clamp, log_ratio_clamp)
    ratio = jnp.exp(log_ratio)
    tau = jnp.where(advantages > 0, tau_pos, tau_neg)
    s = jax.nn.sigmoid(tau * (ratio - 1.0))
    loss_tok = -advantages * (4.0 / tau) * s
    loss = _reduce(loss_tok, mask, weights, agg, agg_scale)
    metrics = {
        "sapo_gate": _masked_mean(4.0 * s * (1.0 - s), mask),
        "ppo_kl": _masked_mean(-log_ratio, mask),
        "ratio_mean": _masked_mean(ratio, mask),
    }
    return loss, jax.lax.stop_gradient(metrics)


@register("reinforce")
def reinforce(
    logp: jax.Array,
    logp_old: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    weights: jax.Array | None = None,
    *,
    agg: str = "seq-mean-token-sum",
    agg_scale: float | None = None,
) -> tuple[jax.Array, Metrics]:
    """Plain REINFORCE loss `l = -A logp` (verl `compute_policy_loss_reinforce`).

    See docs/methods.md, `reinforce`.

    The per-token loss `w l` (with `w` e.g. truncated IS weights for a sampler/learner
    mismatch) is aggregated with `agg`, default "seq-mean-token-sum" (verl). No ratio, no
    clipping: `logp_old` only feeds the `ppo_kl` metric.
    Williams 1992 https://doi.org/10.1007/BF00992696.

    Args:
      logp: f32[B, T] current policy log-probs of the sampled tokens.
      logp_old: f32[B, T] behaviour log-probs (metrics only).
      advantages: f32[B, T] token advantages.
      mask: bool[B, T] action tokens.
      weights: optional f32[B, T] non-negative per-token loss multipliers (stop-gradient).
      agg: aggregation mode (`losses.aggregate`).
      agg_scale: constant for "seq-mean-token-sum-norm".

    Returns:
      (loss f32[], metrics) with `ppo_kl`, the masked mean of `logp_old - logp`.
    """
    logp, logp_old, advantages, mask, weights = _prepare(logp, logp_old, advantages, mask, weights)
    loss = _reduce(-advantages * logp, mask, weights, agg, agg_scale)
    metrics = {"ppo_kl": _masked_mean(logp_old - logp, mask)}
    return loss, jax.lax.stop_gradient(metrics)


def takes_segment_ids(name: str) -> bool:
    """Whether policy loss `name` accepts `segment_ids` (int32[B, T]) after `weights`."""
    return bool(POLICY_LOSSES.attr(name, "takes_segment_ids", False))


TIS_MODES = ("token", "sequence")


def tis_weights(
    logp_learner: jax.Array,
    logp_sampler: jax.Array,
    mask: jax.Array,
    *,
    cap: float = 2.0,
    mode: str = "token",
) -> jax.Array:
    """Truncated importance-sampling weights for a sampler/learner mismatch.

    The sampler (inference engine) and the learner can assign different log-probs to the same
    tokens (kernels, precision, stale weights), which makes on-policy RL silently off-policy.
    TIS reweights the per-token loss by the truncated ratio (Yao et al., "Your efficient RL
    framework secretly brings you off-policy RL training", https://fengyao.notion.site/off-policy-rl;
    verl rollout correction `compute_rollout_correction_weights`, `rollout_is_threshold` 2.0):
      * "token": `w_t = min(exp(clip(d_t, -20, 20)), cap)`, `d_t = logp_learner_t - logp_sampler_t`;
      * "sequence": `w_t = min(exp(clip(sum_{s: m_s} d_s, -20, 20)), cap)` on every token of the
        row (product of the row's token ratios).
    Weights are 0 off `mask` and carry no gradient. Pass them as `weights` to a policy loss;
    verl computes them from the learner's log-probs at rollout time (`old_log_prob`).

    Args:
      logp_learner: f32[B, T] learner log-probs of the sampled tokens.
      logp_sampler: f32[B, T] sampler log-probs of the same tokens.
      mask: bool[B, T] action tokens.
      cap: truncation threshold `C > 0`.
      mode: "token" or "sequence".

    Returns:
      f32[B, T] weights in [0, cap], 0 off `mask`.
    """
    if mode not in TIS_MODES:
        raise ValueError(f"unknown TIS mode {mode!r}; allowed: {list(TIS_MODES)}")
    if cap <= 0:
        raise ValueError(f"TIS cap must be > 0, got {cap}")
    chex.assert_rank(logp_learner, 2)
    chex.assert_equal_shape([logp_learner, logp_sampler, mask])
    mask = mask.astype(bool)
    log_ratio = jnp.where(mask, logp_learner - logp_sampler, 0.0)
    if mode == "sequence":
        log_ratio = jnp.sum(log_ratio, axis=1, keepdims=True)
    w = jnp.minimum(jnp.exp(jnp.clip(log_ratio, -20.0, 20.0)), cap)
    return jax.lax.stop_gradient(jnp.where(mask, w, 0.0))


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
    values, values_old, returns = (x.astype(jnp.float32) for x in (values, values_old, returns))
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
