"""Corrections for a sampler/learner mismatch that mask tokens or sequences out of the loss.

docs/methods.md, "Mismatch corrections (MIS, IcePop)" and "M2PO". TIS (`policy.tis_weights`,
`loss.tis_cap`) keeps every token and truncates its importance weight; the corrections here
keep the weight `r = pi_learner / pi_sampler` where it lies in a band `[low, high]` and drop
the token (or the whole sequence) where it does not. A dropped token leaves the loss
altogether: it is removed from the action mask, so it leaves every term's denominator too,
not only the numerator. M2PO (`m2po`) drops tokens by a batch statistic instead of a band:
the largest squared log ratios, until the rest's mean is at most `tau`.

Every registered correction has the signature

    fn(logp_learner, logp_sampler, mask, *, <hparams>) -> (weights f32[B, T], keep bool[B, T])

with `logp_learner`, `logp_sampler` f32[B, T] log-probs of the sampled tokens under the
learner and the sampler and `mask` bool[B, T] the action tokens. `keep` is the part of `mask`
that stays in the loss; `weights` are the stop-gradient importance weights on `keep` and 0
elsewhere. The train step uses them as TIS's weights are used: `weights` multiply the
per-token policy loss, the learner's log-probs become the PPO anchor (`logp_old`), and the
action mask of the update becomes `keep` (config `mismatch.name`, `mismatch.<name>.*`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import chex
import jax
import jax.numpy as jnp

from rl4agents.checks import check_range
from rl4agents.registry import Registry

MISMATCH_CORRECTIONS = Registry("mismatch correction", section="mismatch")

# The bound on |log ratio| before `exp`, as TIS: a token whose ratio is beyond e^20 is masked
# by any finite band.
_LOG_RATIO_CLAMP = 20.0


def _check_band(low: float, high: float) -> None:
    """The band `[low, high]` must hold ratio 1 (an on-policy token is always kept)."""
    check_range("low", low, 0.0, 1.0)
    check_range("high", high, 1.0)


def _log_ratio(
    logp_learner: jax.Array, logp_sampler: jax.Array, mask: jax.Array
) -> tuple[jax.Array, jax.Array]:
    chex.assert_rank(logp_learner, 2)
    chex.assert_equal_shape([logp_learner, logp_sampler, mask])
    mask = mask.astype(bool)
    d = jnp.where(mask, logp_learner.astype(jnp.float32) - logp_sampler.astype(jnp.float32), 0.0)
    return d, mask


def _band(ratio: jax.Array, mask: jax.Array, low: float, high: float):
    keep = mask & (ratio >= low) & (ratio <= high)
    weights = jnp.where(keep, ratio, 0.0)
    return jax.lax.stop_gradient(weights), jax.lax.stop_gradient(keep)


@MISMATCH_CORRECTIONS.register("mis_token")
def mis_token(
    logp_learner: jax.Array,
    logp_sampler: jax.Array,
    mask: jax.Array,
    *,
    low: float = 0.0,
    high: float = 2.0,
) -> tuple[jax.Array, jax.Array]:
    """Token-level masked importance sampling (token MIS).

    `r_t = exp(clip(logp_learner_t - logp_sampler_t, -20, 20))`; token t stays iff
    `low <= r_t <= high`, with weight `w_t = r_t`; otherwise it leaves the loss (`keep_t`
    False, `w_t = 0`). Yao et al., "Your efficient RL framework secretly brings you off-policy
    RL training" (MIS: `r 1[r <= C]`, C = 2), https://fengyao.notion.site/off-policy-rl.

    Args:
      logp_learner: f32[B, T] learner log-probs of the sampled tokens.
      logp_sampler: f32[B, T] sampler log-probs of the same tokens.
      mask: bool[B, T] action tokens.
      low: lower end of the band, in [0, 1] (0: no lower bound).
      high: upper end of the band, >= 1.

    Returns:
      (weights f32[B, T], keep bool[B, T]), both stop-gradient and off `mask` 0 / False.
    """
    _check_band(low, high)
    d, mask = _log_ratio(logp_learner, logp_sampler, mask)
    ratio = jnp.exp(jnp.clip(d, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
    return _band(ratio, mask, low, high)


@MISMATCH_CORRECTIONS.register("mis_sequence")
def mis_sequence(
    logp_learner: jax.Array,
    logp_sampler: jax.Array,
    mask: jax.Array,
    *,
    low: float = 0.0,
    high: float = 2.0,
) -> tuple[jax.Array, jax.Array]:
    """Sequence-level masked importance sampling (sequence MIS).

    `R_b = exp(clip(sum_{t: m_bt} (logp_learner_bt - logp_sampler_bt), -20, 20))`, the product
    of row b's token ratios; row b stays iff `low <= R_b <= high`, with weight `R_b` on each
    of its action tokens; otherwise the whole row leaves the loss. A row is one episode in the
    slot layout (one step under context="window"). Yao et al. (see `mis_token`).

    Args:
      logp_learner: f32[B, T] learner log-probs of the sampled tokens.
      logp_sampler: f32[B, T] sampler log-probs of the same tokens.
      mask: bool[B, T] action tokens.
      low: lower end of the band, in [0, 1].
      high: upper end of the band, >= 1.

    Returns:
      (weights f32[B, T], keep bool[B, T]): a row is kept or dropped as a whole.
    """
    _check_band(low, high)
    d, mask = _log_ratio(logp_learner, logp_sampler, mask)
    seq = jnp.sum(d, axis=1, keepdims=True)
    ratio = jnp.broadcast_to(jnp.exp(jnp.clip(seq, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)), d.shape)
    return _band(ratio, mask, low, high)


@MISMATCH_CORRECTIONS.register("icepop")
def icepop(
    logp_learner: jax.Array,
    logp_sampler: jax.Array,
    mask: jax.Array,
    *,
    low: float = 0.5,
    high: float = 5.0,
) -> tuple[jax.Array, jax.Array]:
    """IcePop: two-sided band masking of the token ratio (Ring-1T, arXiv 2510.18855).

    The per-token factor `M(r_t) = r_t` if `alpha <= r_t <= beta`, else 0 (the token leaves
    the loss), with `alpha = low = 0.5`, `beta = high = 5.0` (the paper's band). The same rule
    as `mis_token` with a two-sided default band.

    Args:
      logp_learner: f32[B, T] learner log-probs of the sampled tokens.
      logp_sampler: f32[B, T] sampler log-probs of the same tokens.
      mask: bool[B, T] action tokens.
      low: `alpha`, in [0, 1].
      high: `beta`, >= 1.

    Returns:
      (weights f32[B, T], keep bool[B, T]), as `mis_token`.
    """
    return mis_token(logp_learner, logp_sampler, mask, low=low, high=high)


@MISMATCH_CORRECTIONS.register("m2po")
def m2po(
    logp_learner: jax.Array,
    logp_sampler: jax.Array,
    mask: jax.Array,
    *,
    tau: float = 0.04,
) -> tuple[jax.Array, jax.Array]:
    """M2PO's second-moment trust region (arXiv 2510.01161, Zheng et al., "Prosperity before
    Collapse: How Far Can Off-Policy RL Reach with Stale Data on LLMs?").

    With `d_n = logp_learner_n - logp_sampler_n` the log ratio of action token n of the whole
    batch (N tokens on `mask`), the batch's second moment is `M2 = (1/N) sum_n d_n^2`. While
    the mean of `d^2` over the tokens still kept exceeds `tau`, the kept token with the largest
    `d^2` is dropped: sorting the tokens by decreasing `d^2` (ties in row-major order),
    `s_(1) >= ... >= s_(N)`, and with `m_j = sum_{i > j} s_(i) / (N - j)` the mean after
    dropping the first j (`m_N = 0`), the first `j* = min {j : m_j <= tau}` tokens leave the
    loss. `m_j` does not increase with j, so the kept tokens are the `N - j*` of smallest
    `d^2`, and none is dropped when `M2 <= tau`. A kept token has weight `r_n = exp(d_n)`
    (clamped at |d| <= 20 before `exp`), as the paper's objective
    `J = (1/N) sum_n M_n r_n A_n`: paired with a policy loss without clipping that is M2PO
    itself; with `ppo_clip` the clip applies on top, around the learner's log-probs.

    The statistic is over the whole batch the step trains on (one mask per step, computed
    before its updates), so it is a trust region on the batch, not on each row: a few outlier
    tokens leave while the many near-on-policy ones stay. With `train.staleness` > 0 the
    sampler is the policy of several updates ago (the paper's setting).

    Args:
      logp_learner: f32[B, T] learner log-probs of the sampled tokens.
      logp_sampler: f32[B, T] sampler log-probs of the same tokens.
      mask: bool[B, T] action tokens.
      tau: the bound on the kept tokens' mean squared log ratio, >= 0 (the paper's 0.04).

    Returns:
      (weights f32[B, T], keep bool[B, T]), both stop-gradient and off `mask` 0 / False.
    """
    check_range("tau", tau, 0.0)
    d, mask = _log_ratio(logp_learner, logp_sampler, mask)
    sq = jnp.where(mask, jnp.square(d), -1.0).reshape(-1)  # off-mask tokens sort last
    n = jnp.sum(mask)
    order = jnp.argsort(-sq, stable=True)
    ranked = jnp.maximum(sq[order], 0.0)
    # Position i (0-based) of the ranking is dropped iff m_i > tau, the mean over positions
    # i.. (the tokens kept if the first i are dropped). Suffix sums add the small values
    # first, and a tail of exact zeros sums to exactly 0.
    suffix = jnp.cumsum(ranked[::-1])[::-1]
    position = jnp.arange(sq.shape[0])
    mean_from = suffix / jnp.maximum(n - position, 1).astype(jnp.float32)
    drop_ranked = (mean_from > tau) & (position < n)
    drop = jnp.zeros_like(drop_ranked).at[order].set(drop_ranked).reshape(d.shape)
    keep = mask & ~drop
    ratio = jnp.exp(jnp.clip(d, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
    weights = jnp.where(keep, ratio, 0.0)
    return jax.lax.stop_gradient(weights), jax.lax.stop_gradient(keep)


def names() -> list[str]:
    """Sorted names of the registered mismatch corrections."""
    return MISMATCH_CORRECTIONS.names()


def get(name: str) -> Callable[..., Any]:
    """The correction registered as `name`; unknown names raise KeyError listing names()."""
    return MISMATCH_CORRECTIONS.get(name)


def defaults(name: str) -> dict[str, Any]:
    """Reference defaults of correction `name` (its config section `mismatch.<name>`)."""
    return MISMATCH_CORRECTIONS.defaults(name)


def validate(name: str, hparams: dict[str, Any] | None = None) -> dict[str, Any]:
    """Check `hparams` for correction `name`; return them merged with the defaults.

    Raises:
      KeyError: unknown `name`.
      ValueError: unknown field, or a band that does not hold 1 ("mismatch.icepop: low=1.5;
        allowed: in [0, 1]").
    """
    bound = MISMATCH_CORRECTIONS.validate(name, hparams)
    f32 = jax.ShapeDtypeStruct((2, 8), jnp.float32)
    mask = jax.ShapeDtypeStruct((2, 8), jnp.bool_)
    try:
        jax.eval_shape(lambda *a: get(name)(*a, **bound), f32, f32, mask)
    except ValueError as e:
        raise ValueError(f"mismatch.{name}: {e}") from e
    return bound


def kept_metrics(keep: jax.Array, mask: jax.Array) -> dict[str, jax.Array]:
    """f32[] `mismatch/kept_frac`: the share of action tokens a correction keeps (1 for an
    empty mask)."""
    n = jnp.sum(mask.astype(jnp.float32))
    kept = jnp.sum((keep & mask).astype(jnp.float32))
    return {"mismatch/kept_frac": jnp.where(n > 0, kept / jnp.maximum(n, 1.0), 1.0)}
